"""Artifact storage behind one small interface: a local directory or a gs:// prefix.

Keys are '/'-separated paths relative to the storage root. Every write replaces the whole object, because Cloud
Storage has no append; the run-directory contract (runner.contract) gives each object a single writer.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from runner.spec import GCS_RE


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int
    updated: float | None = None  # when it was last written (unix time): a file's mtime, an object's upload


class Storage(Protocol):
    """A place to read and write run-directory objects. Missing objects read as None, never as an error."""

    @property
    def url(self) -> str:
        """The root, as a user would write it: gs://bucket/prefix or an absolute path."""
        ...

    @property
    def is_local(self) -> bool: ...

    def read_bytes(self, key: str, start: int = 0) -> bytes | None:
        """The object's bytes from offset `start`, or None if it does not exist."""
        ...

    def write_bytes(self, key: str, data: bytes) -> None: ...

    def upload_file(self, path: Path, key: str) -> None: ...

    def download_file(self, key: str, path: Path) -> bool:
        """Copy the object to `path`; False if it does not exist."""
        ...

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        """Objects whose key starts with `prefix`, sorted by key."""
        ...

    def delete(self, key: str) -> None:
        """Remove the object; no error if it does not exist."""
        ...


def open_storage(url: str, *, gcs_client: object | None = None) -> Storage:
    """Storage for gs://bucket/prefix (google-cloud-storage, client injectable) or a local path."""
    if url.startswith("gs://"):
        match = GCS_RE.match(url.rstrip("/"))
        if not match:
            from runner.errors import StorageError

            raise StorageError(f"{url!r} is not gs://BUCKET[/PREFIX]")
        from runner.storage.gcs import GCSStorage

        return GCSStorage(match["bucket"], match["prefix"] or "", client=gcs_client)
    from runner.storage.local import LocalStorage

    return LocalStorage(Path(url))
