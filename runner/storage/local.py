"""Run directories on the local file system (local runs, tests, a mounted disk)."""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from runner.errors import PreconditionFailed, StorageError
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
        except FileNotFoundError:
            if not path.exists():
                raise  # renamed or deleted since it was listed (the Storage protocol)
            raise StorageError(f"cannot copy {path} to {dest}: its directory went away") from None
        except OSError as exc:
            raise StorageError(f"cannot copy {path} to {dest}: {exc.strerror}") from exc

    def download_file(self, key: str, path: Path) -> bool:
        src = self._path(key)
        if not src.is_file():
            return False
        if src != path.absolute():
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.part")
            try:
                shutil.copyfile(src, tmp)
            except FileNotFoundError:  # gone since it was listed: missing, like one never there
                tmp.unlink(missing_ok=True)
                return False
            except OSError as exc:
                tmp.unlink(missing_ok=True)
                raise StorageError(f"cannot copy {src} to {path}: {exc.strerror}") from exc
            tmp.replace(path)
        return True

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        """Only the prefix's own directory is read (`logs/` never walks checkpoints/), and it is read as it is while
        a job writes it: a file or directory that vanishes (renamed, rotated away) or appears mid-listing is left
        out or listed, never an error."""
        directory, _, start = prefix.rpartition("/")
        found = _files(self._path(directory) if directory else self.root, f"{directory}/" if directory else "", start)
        return sorted(found, key=lambda o: o.key)

    def delete(self, key: str) -> None:
        try:
            self._path(key).unlink(missing_ok=True)
        except OSError as exc:
            raise StorageError(f"cannot delete {self._path(key)}: {exc.strerror}") from exc

    # Conditional writes: Cloud Storage's generations, on a local disk. An object written through write_if has its
    # generation in a hidden file beside it (a counter, so that two writes within one tick of the file system's
    # clock still differ), and every conditional read and write of it holds an exclusive lock (flock) on a third:
    # among conditional writers, reading the generation and writing the next one is one step.

    @contextmanager
    def _locked(self, path: Path) -> Iterator[None]:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path.parent / f".{path.name}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise StorageError(f"cannot lock {path}: {exc.strerror}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the lock

    @staticmethod
    def _generation(path: Path) -> int | None:
        if not path.is_file():
            return None
        try:
            return int((path.parent / f".{path.name}.generation").read_text())
        except (OSError, ValueError):
            return 1  # written by a plain write: its first generation

    def read_versioned(self, key: str) -> tuple[bytes, ObjectInfo] | None:
        path = self._path(key)
        with self._locked(path):
            generation = self._generation(path)
            data = self.read_bytes(key)
            if generation is None or data is None:
                return None
            return data, ObjectInfo(key, len(data), path.stat().st_mtime, generation)

    def write_if(self, key: str, data: bytes, *, generation: int) -> ObjectInfo:
        path = self._path(key)
        with self._locked(path):
            current = self._generation(path)
            if (current or 0) != generation:
                if current is not None and self.read_bytes(key) == data:
                    return ObjectInfo(key, len(data), path.stat().st_mtime, current)
                raise PreconditionFailed(
                    f"{path} is not at generation {generation} any more: someone else wrote it since it was read"
                )
            try:  # the counter first: a write cut short between the two leaves a newer generation, never an older
                write_atomic(path.parent / f".{path.name}.generation", str(generation + 1).encode())
                write_atomic(path, data)
            except OSError as exc:
                raise StorageError(f"cannot write {path}: {exc.strerror}") from exc
            return ObjectInfo(key, len(data), path.stat().st_mtime, generation + 1)


def _files(directory: Path, base: str, start: str = "") -> list[ObjectInfo]:
    """Every visible file under `directory` whose name (at its top level) starts with `start`, keyed `base` + its
    relative path. What another process renames or deletes meanwhile is taken as it is: a directory gone before it
    is read lists nothing, a file gone before its stat is left out (an atomic write's rename never leaves its key
    absent: the old or the new file is there). Links to directories are not followed (no loops); hidden files (an
    atomic write's temporaries) are never listed."""
    try:
        with os.scandir(directory) as entries:
            found = [entry for entry in entries if entry.name.startswith(start)]
    except (FileNotFoundError, NotADirectoryError):
        return []
    except OSError as exc:
        if base and not start and isinstance(exc, PermissionError):
            return []  # a subdirectory this user cannot read: the rest is still worth listing (as rglob did)
        raise StorageError(f"cannot list {directory}: {exc.strerror}") from exc
    out: list[ObjectInfo] = []
    for entry in found:
        key = base + entry.name
        if entry.is_dir(follow_symlinks=False):  # False, not an error, for an entry gone since the scan
            out += _files(Path(entry.path), key + "/")
        elif not entry.name.startswith(".") and entry.is_file():
            try:
                st = entry.stat()
            except FileNotFoundError:  # replaced or removed since the scan
                continue
            # A write replaces the file (a new inode), an append moves its mtime: either changes this.
            generation = hash((st.st_ino, st.st_mtime_ns, st.st_size)) & 0x7FFF_FFFF_FFFF_FFFF
            out.append(ObjectInfo(key, st.st_size, st.st_mtime, generation))
    return out
