"""Artifact storage behind one small interface: a local directory or a gs:// prefix.

Keys are '/'-separated paths relative to the storage root. A write replaces the whole object; `append` adds to the
end of one (on Cloud Storage, by composing the new bytes onto it), so that a growing log travels once. The
run-directory contract (runner.contract) gives each object a single writer.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

# gs://BUCKET[/PREFIX], as Cloud Storage names buckets (cloud.google.com/storage/docs/buckets#naming). Here, not in
# the spec, which imports it: the in-container supervisor reads storage without loading the spec's pydantic models.
GCS_RE = re.compile(r"^gs://(?P<bucket>[a-z0-9][a-z0-9._-]{1,61}[a-z0-9])(?:/(?P<prefix>.*))?$")


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int
    updated: float | None = None  # when it was last written, by the storage's own clock (not the writer's)
    # Which write it is: changes with every write (read_versioned, write_if; a local listing's from the file's inode,
    # mtime and size): a reader that kept what it read knows from a listing alone whether to read it again.
    generation: int | None = None


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

    def append(self, key: str, data: bytes, *, at: int) -> None:
        """Add `data` to the end of the object, which holds `at` bytes now; StorageError when it does not."""
        ...

    def upload_file(self, path: Path, key: str) -> None:
        """Copy the file at `path` to the object; FileNotFoundError when it is gone (a job renamed or deleted it since
        it was listed: the caller takes that as it is)."""
        ...

    def download_file(self, key: str, path: Path) -> bool:
        """Copy the object to `path`; False if it does not exist."""
        ...

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        """Objects whose key starts with `prefix`, sorted by key: one request (a page per 1,000 objects) however
        many there are, which is why readers of many objects list before they read. What is there while the listing
        is read (a job may be writing the run directory meanwhile; an object listed may be gone by the time it is
        read, which then reads as missing)."""
        ...

    def delete(self, key: str) -> None:
        """Remove the object; no error if it does not exist."""
        ...

    def read_versioned(self, key: str) -> tuple[bytes, ObjectInfo] | None:
        """The object's bytes and the generation (and storage time) of exactly those bytes; None if it does not
        exist."""
        ...

    def write_if(self, key: str, data: bytes, *, generation: int) -> ObjectInfo:
        """Write the object only if it is still at `generation` (0: only if it does not exist), as one step that
        no other conditional writer can come between: its new generation and storage time. PreconditionFailed when
        it is not (someone else wrote it since it was read). A write whose answer was lost and that landed is not
        taken for someone else's: the object holding exactly `data` is this write."""
        ...


def open_storage(url: str, *, gcs_client: object | None = None, patience_s: float | None = None) -> Storage:
    """Storage for gs://bucket/prefix (google-cloud-storage, client injectable) or a local path. `patience_s`: how
    long one Cloud Storage call may retry (runner.storage.gcs) before it fails."""
    if url.startswith("gs://"):
        match = GCS_RE.match(url.rstrip("/"))
        if not match:
            from runner.errors import StorageError

            raise StorageError(f"{url!r} is not gs://BUCKET[/PREFIX]")
        from runner.storage.gcs import DEFAULT_PATIENCE_S, GCSStorage

        patience = DEFAULT_PATIENCE_S if patience_s is None else patience_s
        return GCSStorage(match["bucket"], match["prefix"] or "", client=gcs_client, patience_s=patience)
    from runner.storage.local import LocalStorage

    return LocalStorage(Path(url))
