"""A worker's log to Cloud Storage by its new bytes only, up to a cap.

The supervisor appends the job's output to logs/worker-N.log as it comes, and the mirror pushes every few seconds.
Uploading the whole file each time made the bytes sent grow with the square of a run's length (20 MB of output in
40 s sent 101 MB). Here each push sends only what is new, added to the object in place (Storage.append: on Cloud
Storage a compose of the object and a part holding the new bytes), so readers (`runner logs`, status, the report)
read one object, exactly as before.

A worker's log in the run directory stops at LOG_CAP_BYTES: the last line uploaded then says so, and the rest of
the job's output stays on the machine (the container's own log, `docker logs`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from runner import contract
from runner.errors import StorageError, StorageUnreachable
from runner.storage import Storage

LOG_CAP_BYTES = 256 * 2**20


def cap_note(cap: int) -> bytes:
    return (
        f"[runner] this log has reached {cap / 2**20:g} MiB, the most the run directory keeps per worker: the "
        "rest of the job's output is not uploaded (it stays in the container's own log on the machine)\n"
    ).encode()


def _stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


class LogSync:
    """Pushes the logs/ files of one worker's output directory. One writer per object (the contract): what this
    object holds is what this LogSync (or the download it started from) put there."""

    def __init__(self, storage: Storage, cap: int = LOG_CAP_BYTES, say: Callable[[str], None] = _stderr) -> None:
        self.storage, self.cap, self.say = storage, cap, say
        self._sent: dict[str, int] = {}  # key -> bytes of the local file the object holds
        self._capped: set[str] = set()

    @staticmethod
    def handles(key: str) -> bool:
        return key.startswith(f"{contract.LOGS_DIR}/")

    def push(self, path: Path, key: str, *, known: int = 0) -> None:
        """Send what `path` gained since the last push. `known`: the object's size when this process has not pushed
        it yet (downloaded when the worker started, to append to). Raises StorageError; the next push retries."""
        if key in self._capped:
            return
        sent = self._sent.get(key, known)
        size = path.stat().st_size
        if size < sent:  # rewritten shorter: not a log that grows; start it over
            sent = 0
        if sent >= self.cap:  # downloaded with its cap reached
            self._capped.add(key)
            return
        end = min(size, self.cap)
        with path.open("rb") as f:
            f.seek(sent)
            data = f.read(end - sent)
        capped = size > self.cap
        if capped:
            note = cap_note(self.cap)
            data += note if not data or data.endswith(b"\n") else b"\n" + note
        if not data:
            return
        try:
            self.storage.append(key, data, at=sent)
        except StorageUnreachable:
            raise
        except StorageError:
            # The object is not what this writer left (someone else wrote it, or an append half-happened): the
            # whole file, once, makes it right again.
            with path.open("rb") as f:
                whole = f.read(end)
            self.storage.write_bytes(key, whole + data[end - sent :] if capped else whole)
        self._sent[key] = end
        if capped:
            self._capped.add(key)
            self.say(cap_note(self.cap).decode().rstrip())
