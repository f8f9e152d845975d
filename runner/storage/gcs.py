"""Run directories on Cloud Storage through google-cloud-storage.

TensorFlow's own gs:// file system cannot be pointed at an emulator, so everything that crosses to Cloud Storage
(metrics, logs, checkpoints) goes through this module. The client is injectable; by default it is built from
Application Default Credentials, or anonymously for the emulator when $STORAGE_EMULATOR_HOST is set (the
library's own convention).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from runner.errors import StorageError
from runner.storage import ObjectInfo

# Every write here replaces a whole object with the same bytes on a retry, so retrying is always safe; the
# library only retries uploads by default when a generation precondition is given.
_RETRY_DEADLINE_S = 120.0


class GCSStorage:
    def __init__(self, bucket: str, prefix: str = "", *, client: Any | None = None) -> None:
        self.bucket_name = bucket
        self.prefix = prefix.strip("/")
        self._client = client
        self._bucket: Any | None = None

    @property
    def url(self) -> str:
        return f"gs://{self.bucket_name}/{self.prefix}" if self.prefix else f"gs://{self.bucket_name}"

    @property
    def is_local(self) -> bool:
        return False

    def _name(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def _get_bucket(self) -> Any:
        if self._bucket is None:
            if self._client is None:
                from google.cloud import storage  # type: ignore[attr-defined]

                try:
                    self._client = storage.Client()
                except Exception as exc:  # DefaultCredentialsError, project lookup
                    raise StorageError(
                        f"cannot create a Cloud Storage client: {exc}",
                        hint="run `gcloud auth application-default login`, or set STORAGE_EMULATOR_HOST",
                    ) from exc
            self._bucket = self._client.bucket(self.bucket_name)
        return self._bucket

    def _retry(self) -> Any:
        from google.cloud.storage.retry import DEFAULT_RETRY

        return DEFAULT_RETRY.with_deadline(_RETRY_DEADLINE_S)

    def _wrap(self, exc: Exception, action: str, key: str) -> StorageError:
        from google.api_core import exceptions as gexc

        where = f"gs://{self.bucket_name}/{self._name(key)}"
        if isinstance(exc, gexc.Forbidden):
            return StorageError(
                f"permission denied to {action} {where}",
                hint="the account needs roles/storage.objectUser (or objectAdmin) on the bucket",
            )
        if isinstance(exc, gexc.NotFound):
            return StorageError(
                f"cannot {action} {where}: bucket {self.bucket_name!r} does not exist",
                hint="create it (see infra/) or fix `storage:` in the job spec",
            )
        return StorageError(f"cannot {action} {where}: {exc}")

    def read_bytes(self, key: str, start: int = 0) -> bytes | None:
        from google.api_core import exceptions as gexc

        blob = self._get_bucket().blob(self._name(key))
        try:
            return blob.download_as_bytes(start=start or None, retry=self._retry())
        except gexc.NotFound:
            return None
        except gexc.RequestRangeNotSatisfiable:
            return b""  # start is at (or past) the end: nothing new yet
        except gexc.GoogleAPIError as exc:
            raise self._wrap(exc, "read", key) from exc

    def write_bytes(self, key: str, data: bytes) -> None:
        from google.api_core import exceptions as gexc

        blob = self._get_bucket().blob(self._name(key))
        try:
            blob.upload_from_string(data, retry=self._retry())
        except gexc.GoogleAPIError as exc:
            raise self._wrap(exc, "write", key) from exc

    def upload_file(self, path: Path, key: str) -> None:
        from google.api_core import exceptions as gexc

        blob = self._get_bucket().blob(self._name(key))
        try:
            blob.upload_from_filename(str(path), retry=self._retry())
        except gexc.GoogleAPIError as exc:
            raise self._wrap(exc, "write", key) from exc
        except OSError as exc:
            raise StorageError(f"cannot read {path} to upload it: {exc.strerror}") from exc

    def download_file(self, key: str, path: Path) -> bool:
        from google.api_core import exceptions as gexc

        blob = self._get_bucket().blob(self._name(key))
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.part")
        try:
            blob.download_to_filename(str(tmp), retry=self._retry())
        except gexc.NotFound:
            tmp.unlink(missing_ok=True)
            return False
        except gexc.GoogleAPIError as exc:
            tmp.unlink(missing_ok=True)
            raise self._wrap(exc, "read", key) from exc
        tmp.replace(path)
        return True

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        from google.api_core import exceptions as gexc

        base = f"{self.prefix}/" if self.prefix else ""
        try:
            blobs = self._get_bucket().list_blobs(prefix=base + prefix, retry=self._retry())
            out = [
                ObjectInfo(b.name[len(base) :], int(b.size or 0), b.updated.timestamp() if b.updated else None)
                for b in blobs
            ]
        except gexc.GoogleAPIError as exc:
            raise self._wrap(exc, "list", prefix) from exc
        return sorted(out, key=lambda o: o.key)

    def delete(self, key: str) -> None:
        from google.api_core import exceptions as gexc

        try:
            self._get_bucket().blob(self._name(key)).delete(retry=self._retry())
        except gexc.NotFound:
            return
        except gexc.GoogleAPIError as exc:
            raise self._wrap(exc, "delete", key) from exc
