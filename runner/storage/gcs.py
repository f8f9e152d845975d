"""Run directories on Cloud Storage through google-cloud-storage.

TensorFlow's own gs:// file system cannot be pointed at an emulator, so everything that crosses to Cloud Storage
(metrics, logs, checkpoints) goes through this module. The client is injectable; by default it is built from
Application Default Credentials, or anonymously for the emulator when $STORAGE_EMULATOR_HOST is set (the
library's own convention).

Errors are told apart by what they mean for a reader: StorageUnreachable (no answer, or only answers that pass:
what the run directory holds is unknown for now), BucketMissing (the bucket does not exist: nothing more will land
there), and StorageError for the rest (a permission, a bad request). `patience_s` bounds how long one call retries,
and each request waits at most half of it for an answer, so that a black-holed Cloud Storage costs a caller that
long, not the library's default minutes.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from runner.errors import BucketMissing, PreconditionFailed, StorageError, StorageUnreachable
from runner.storage import ObjectInfo

# Every write here replaces a whole object with the same bytes on a retry, so retrying is always safe; the
# library only retries uploads by default when a generation precondition is given.
DEFAULT_PATIENCE_S = 120.0
_REQUEST_TIMEOUT_S = 60.0  # the library's own default, per request
# Where an append's new bytes wait to be composed onto the object (a name no reader lists: see append()).
_PART_SUFFIX = ".append-part-"
# What a listing asks of each object: all that ObjectInfo holds, and no more (a full object resource is about 700
# bytes; a pod slice's run directory lists a thousand of them every few seconds). Every field read below is named.
_LISTED = "items(name,size,updated,generation),nextPageToken"


def _is_transient(exc: BaseException) -> bool:
    """No answer, or an answer that passes: a reader learns nothing from it about the run directory."""
    import requests
    from google.api_core import exceptions as gexc
    from google.auth.exceptions import TransportError

    if isinstance(exc, gexc.RetryError):
        return exc.cause is None or _is_transient(exc.cause)
    transient = (
        requests.ConnectionError,
        requests.Timeout,
        TransportError,
        ConnectionError,
        TimeoutError,
        gexc.TooManyRequests,
        gexc.InternalServerError,
        gexc.BadGateway,
        gexc.ServiceUnavailable,
        gexc.GatewayTimeout,
    )
    return isinstance(exc, transient)


def _errors() -> tuple[type[BaseException], ...]:
    """What a call into the library raises for a failed request (not a bug of ours)."""
    import requests
    from google.api_core import exceptions as gexc
    from google.auth.exceptions import TransportError
    from google.resumable_media import common

    return (gexc.GoogleAPIError, requests.RequestException, TransportError, common.InvalidResponse, ConnectionError)


class GCSStorage:
    def __init__(
        self, bucket: str, prefix: str = "", *, client: Any | None = None, patience_s: float = DEFAULT_PATIENCE_S
    ) -> None:
        self.bucket_name = bucket
        self.prefix = prefix.strip("/")
        self._client = client
        self._bucket: Any | None = None
        self._lock = threading.Lock()
        self.patience_s = patience_s
        self.timeout_s = min(_REQUEST_TIMEOUT_S, max(2.0, patience_s / 2))

    @property
    def url(self) -> str:
        return f"gs://{self.bucket_name}/{self.prefix}" if self.prefix else f"gs://{self.bucket_name}"

    @property
    def is_local(self) -> bool:
        return False

    def _name(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def _get_bucket(self) -> Any:
        with self._lock:  # readers in parallel (runner.storage.parallel) share one client
            return self._bucket_once()

    def _bucket_once(self) -> Any:
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

        return DEFAULT_RETRY.with_deadline(self.patience_s)

    def _wrap(self, exc: BaseException, action: str, key: str) -> StorageError:
        from google.api_core import exceptions as gexc

        where = f"gs://{self.bucket_name}/{self._name(key)}"
        if _is_transient(exc):
            cause = exc.cause if isinstance(exc, gexc.RetryError) and exc.cause is not None else exc
            return StorageUnreachable(
                f"cannot reach Cloud Storage to {action} {where} (for {self.patience_s:.0f}s): "
                f"{type(cause).__name__}: {str(cause)[:200]}",
                hint="check the network and status.cloud.google.com; the run itself is not affected by this",
            )
        if isinstance(exc, gexc.Forbidden):
            return StorageError(
                f"permission denied to {action} {where}",
                hint="the account needs roles/storage.objectUser (or objectAdmin) on the bucket",
            )
        if isinstance(exc, gexc.NotFound):
            return BucketMissing(
                f"cannot {action} {where}: bucket {self.bucket_name!r} does not exist",
                hint="create it (see infra/) or fix `storage:` in the job spec",
            )
        return StorageError(f"cannot {action} {where}: {exc}")

    def read_bytes(self, key: str, start: int = 0) -> bytes | None:
        from google.api_core import exceptions as gexc

        blob = self._get_bucket().blob(self._name(key))
        try:
            return blob.download_as_bytes(start=start or None, retry=self._retry(), timeout=self.timeout_s)
        except gexc.NotFound:
            return None
        except gexc.RequestRangeNotSatisfiable:
            return b""  # start is at (or past) the end: nothing new yet
        except _errors() as exc:
            raise self._wrap(exc, "read", key) from exc

    def write_bytes(self, key: str, data: bytes) -> None:
        blob = self._get_bucket().blob(self._name(key))
        try:
            blob.upload_from_string(data, retry=self._retry(), timeout=self.timeout_s)
        except _errors() as exc:
            raise self._wrap(exc, "write", key) from exc

    def append(self, key: str, data: bytes, *, at: int) -> None:
        """Add `data` to the end of the object `key`, which holds `at` bytes (what its one writer has written so far):
        only the new bytes travel. They are uploaded as a part object, composed onto the object in place (one
        compose of two sources: Cloud Storage allows 32), and the part deleted. A compose whose answer was lost is
        not repeated blindly: the object's size says whether it happened. StorageError when the object is not the
        `at` bytes expected (the caller then uploads it whole)."""
        if at == 0:
            self.write_bytes(key, data)
            return
        bucket = self._get_bucket()
        target = bucket.blob(self._name(key))
        part = bucket.blob(self._name(f"{key}{_PART_SUFFIX}{at}"))
        try:
            part.upload_from_string(data, retry=self._retry(), timeout=self.timeout_s)
            try:
                target.compose([target, part], retry=None, timeout=self.timeout_s)
                size = int(target.size or 0)  # the composed object, as the answer describes it
            except _errors():
                size = self._size(key) or 0
                if size == at:  # not composed: once more, now that the part is known to be there
                    target.compose([target, part], retry=None, timeout=self.timeout_s)
                    size = int(target.size or 0)
            if size != at + len(data):  # it did not hold the `at` bytes its writer thought: to be uploaded whole
                raise StorageError(
                    f"gs://{self.bucket_name}/{self._name(key)} was not the {at} bytes written to it ({size} after "
                    f"appending {len(data)})"
                )
        except StorageError:
            raise
        except _errors() as exc:
            raise self._wrap(exc, "append to", key) from exc
        finally:
            try:
                part.delete(retry=self._retry(), timeout=self.timeout_s)
            except _errors():
                pass  # a part left behind is a few bytes under a name nothing reads; the object is what counts

    def _size(self, key: str) -> int | None:
        blob = self._get_bucket().get_blob(self._name(key), retry=self._retry(), timeout=self.timeout_s)
        return None if blob is None else int(blob.size or 0)

    def upload_file(self, path: Path, key: str) -> None:
        blob = self._get_bucket().blob(self._name(key))
        try:
            blob.upload_from_filename(str(path), retry=self._retry(), timeout=self.timeout_s)
        except FileNotFoundError:
            raise  # renamed or deleted since it was listed (the Storage protocol)
        except OSError as exc:
            if isinstance(exc, ConnectionError | TimeoutError):
                raise self._wrap(exc, "write", key) from exc
            raise StorageError(f"cannot read {path} to upload it: {exc.strerror}") from exc
        except _errors() as exc:
            raise self._wrap(exc, "write", key) from exc

    def download_file(self, key: str, path: Path) -> bool:
        from google.api_core import exceptions as gexc

        blob = self._get_bucket().blob(self._name(key))
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.part")
        try:
            blob.download_to_filename(str(tmp), retry=self._retry(), timeout=self.timeout_s)
        except gexc.NotFound:
            tmp.unlink(missing_ok=True)
            return False
        except _errors() as exc:
            tmp.unlink(missing_ok=True)
            raise self._wrap(exc, "read", key) from exc
        tmp.replace(path)
        return True

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        base = f"{self.prefix}/" if self.prefix else ""
        try:
            blobs = self._get_bucket().list_blobs(prefix=base + prefix, retry=self._retry(), timeout=self.timeout_s)
            out = [_info(b, b.name[len(base) :]) for b in blobs if _PART_SUFFIX not in b.name]
        except _errors() as exc:
            raise self._wrap(exc, "list", prefix) from exc
        return sorted(out, key=lambda o: o.key)

    def read_versioned(self, key: str) -> tuple[bytes, ObjectInfo] | None:
        """The object's metadata, then the bytes of that generation (a rewrite in between: read again)."""
        from google.api_core import exceptions as gexc

        bucket = self._get_bucket()
        try:
            while True:
                blob = bucket.get_blob(self._name(key), retry=self._retry(), timeout=self.timeout_s)
                if blob is None:
                    return None
                info = _info(blob, key)  # before the download, which sets the blob's fields from its headers
                try:
                    data = blob.download_as_bytes(
                        if_generation_match=info.generation, retry=self._retry(), timeout=self.timeout_s
                    )
                except (gexc.PreconditionFailed, gexc.NotFound):
                    continue  # rewritten or deleted since its metadata was read
                return data, info
        except _errors() as exc:
            raise self._wrap(exc, "read", key) from exc

    def write_if(self, key: str, data: bytes, *, generation: int) -> ObjectInfo:
        from google.api_core import exceptions as gexc

        blob = self._get_bucket().blob(self._name(key))
        try:
            # Retried like any write: a retry of a write that landed finds its own bytes (below), not a rival's.
            blob.upload_from_string(data, if_generation_match=generation, retry=self._retry(), timeout=self.timeout_s)
        except gexc.PreconditionFailed:
            found = self.read_versioned(key)
            if found is not None and found[0] == data:
                return found[1]
            raise PreconditionFailed(
                f"gs://{self.bucket_name}/{self._name(key)} is not at generation {generation} any more: "
                "someone else wrote it since it was read"
            ) from None
        except _errors() as exc:
            raise self._wrap(exc, "write", key) from exc
        return _info(blob, key)

    def delete(self, key: str) -> None:
        from google.api_core import exceptions as gexc

        try:
            self._get_bucket().blob(self._name(key)).delete(retry=self._retry(), timeout=self.timeout_s)
        except gexc.NotFound:
            return
        except _errors() as exc:
            raise self._wrap(exc, "delete", key) from exc


def _info(blob: Any, key: str) -> ObjectInfo:
    """An object's size, storage time and generation, as the answer that listed, read or wrote it said them."""
    updated = blob.updated.timestamp() if blob.updated else None
    return ObjectInfo(key, int(blob.size or 0), updated, int(blob.generation) if blob.generation else None)
