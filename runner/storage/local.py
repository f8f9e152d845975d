"""Run directories on the local file system (local runs, tests, a mounted disk)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from runner.errors import StorageError
from runner.storage import ObjectInfo


def write_atomic(path: Path, data: bytes) -> None:
    """Write then rename, so a reader (or the mirror uploading to Cloud Storage) never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class LocalStorage:
    def __init__(self, root: Path) -> None:
        self.root = root.expanduser().absolute()

    @property
    def url(self) -> str:
        return str(self.root)

    @property
    def is_local(self) -> bool:
        return True

    def _path(self, key: str) -> Path:
        path = (self.root / key).absolute()
        if key.startswith("/") or ".." in Path(key).parts:
            raise StorageError(f"storage key {key!r} leaves the run directory")
        return path

    def read_bytes(self, key: str, start: int = 0) -> bytes | None:
        try:
            with self._path(key).open("rb") as f:
                f.seek(start)
                return f.read()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None
        except OSError as exc:
            raise StorageError(f"cannot read {self._path(key)}: {exc.strerror}") from exc

    def write_bytes(self, key: str, data: bytes) -> None:
        path = self._path(key)
        try:
            write_atomic(path, data)
        except OSError as exc:
            raise StorageError(f"cannot write {path}: {exc.strerror}") from exc

    def append(self, key: str, data: bytes, *, at: int) -> None:
        path = self._path(key)
        try:
            size = path.stat().st_size if path.exists() else 0
            if size != at:
                raise StorageError(f"{path} is {size} bytes, not {at}")
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("ab") as f:
                f.write(data)
        except OSError as exc:
            raise StorageError(f"cannot append to {path}: {exc.strerror}") from exc

    def upload_file(self, path: Path, key: str) -> None:
        dest = self._path(key)
        if dest == path.absolute():
            return
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, dest)
        except OSError as exc:
            raise StorageError(f"cannot copy {path} to {dest}: {exc.strerror}") from exc

    def download_file(self, key: str, path: Path) -> bool:
        src = self._path(key)
        if not src.is_file():
            return False
        if src != path.absolute():
            path.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, path)
        return True

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        # Only the directory the prefix names is walked (logs/ is not the whole run directory's checkpoints).
        top = self.root / prefix.rpartition("/")[0] if "/" in prefix else self.root
        if ".." in Path(prefix).parts or not top.is_dir():
            return []
        out = []
        for path in top.rglob("*"):
            if path.is_file() and not path.name.startswith("."):
                key = path.relative_to(self.root).as_posix()
                if key.startswith(prefix):
                    try:
                        st = path.stat()
                    except FileNotFoundError:  # replaced or removed while listing
                        continue
                    # A write replaces the file (a new inode), an append moves its mtime: either changes this.
                    generation = hash((st.st_ino, st.st_mtime_ns, st.st_size)) & 0x7FFF_FFFF_FFFF_FFFF
                    out.append(ObjectInfo(key, st.st_size, st.st_mtime, generation))
        return sorted(out, key=lambda o: o.key)

    def delete(self, key: str) -> None:
        try:
            self._path(key).unlink(missing_ok=True)
        except OSError as exc:
            raise StorageError(f"cannot delete {self._path(key)}: {exc.strerror}") from exc
