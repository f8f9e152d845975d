"""Mirror a local output directory to the run directory in storage.

The job writes plain files locally (the trainer, or a user's command that knows nothing of Cloud Storage); the
mirror uploads what changed. Files are uploaded oldest first, so a checkpoint reaches storage before the
latest.json that names it: a reader never sees a manifest pointing at a checkpoint not yet uploaded. Writers make
files appear atomically (write, then rename), so a file is never uploaded half-written.

Checkpoints go through their formats (runner.checkpoints): one still being written (an Orbax step's temporary
directory, a TensorFlow save whose index is not there yet) is not uploaded until it is committed, and what makes
one count (Orbax's commit_success.txt) travels after its data. A checkpoint the job rotated away locally, even
partly, is deleted from storage whole, its commit file first, after the uploads of the same pass (so the manifest
that stopped naming it is already there), and only what this mirror uploaded or downloaded itself: a bucket keeps
`keep` checkpoints, not every one a long run wrote, never holds half a rotated step that reads as committed, and
never loses objects someone else put there.

The shared location (checkpoints/shared/: RUNNER_SHARED_CHECKPOINT_DIR) is in storage already, written there by
every host together: a local file under that name is never uploaded over it, and nothing of it is restored.

Logs (logs/worker-N.log) only grow: they travel by their new bytes, up to a cap (runner.worker.logsync).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path

from runner import contract
from runner.checkpoints import SHARED, Listing, survey
from runner.checkpoints.keras import DEFAULT_KEEP
from runner.errors import StorageError
from runner.storage import ObjectInfo, Storage
from runner.worker.logsync import LOG_CAP_BYTES, LogSync

log = logging.getLogger(__name__)

Change = tuple[int, str, Path, tuple[int, int]]  # (mtime_ns, key, path, (size, mtime_ns))


def checkpoint_keep(environ: Mapping[str, str]) -> int:
    """How many checkpoints the run keeps ($RUNNER_CHECKPOINT_KEEP; from runs planned before it,
    training.checkpoint_keep in $RUNNER_TRAINING), else the default; without pydantic, so the supervisor stays
    light."""
    keep = environ.get(contract.CHECKPOINT_KEEP) or contract.training_section(environ).get("checkpoint_keep")
    try:
        return int(keep) if keep else DEFAULT_KEEP
    except (ValueError, TypeError):
        return DEFAULT_KEEP


class Mirror:
    def __init__(self, local: Path, storage: Storage, keep: int = DEFAULT_KEEP, log_cap: int = LOG_CAP_BYTES) -> None:
        self.local = local
        self.storage = storage
        self.keep = keep
        self.logs = LogSync(storage, log_cap)
        # Every key this mirror uploaded or downloaded, with the (size, mtime) it had then: what changed since, and
        # what it may delete.
        self._pushed: dict[str, tuple[int, int]] = {}
        self._unfinished: set[str] = set()  # keys of checkpoints being written, at the last scan

    def _scan(self) -> tuple[list[Change], set[str]]:
        """Files new or changed since their last upload (oldest first, a checkpoint's commit file after its data;
        none of a checkpoint still being written), and every key present now."""
        changed, present = [], set()
        found: dict[str, ObjectInfo] = {}
        for root, _dirs, files in os.walk(self.local):  # a directory gone mid-walk is skipped (onerror: None)
            for name in files:
                if name.startswith("."):  # temporary files of atomic writes
                    continue
                path = Path(root) / name
                key = path.relative_to(self.local).as_posix()
                if key.startswith(_SHARED):  # the hosts' own location in storage: never overwritten from here
                    continue
                present.add(key)  # even if it vanishes before stat: a replaced file is never absent
                try:
                    st = path.stat()
                except FileNotFoundError:
                    continue
                stamp = (st.st_size, st.st_mtime_ns)
                if key.startswith(_CHECKPOINTS):
                    found[key.removeprefix(_CHECKPOINTS)] = ObjectInfo(key, st.st_size, st.st_mtime)
                if self._pushed.get(key) != stamp:
                    changed.append((st.st_mtime_ns, key, path, stamp))
        checkpoints = survey(Listing(found, lambda k: _read(self.local / _CHECKPOINTS / k), local=True))
        self._unfinished = {_CHECKPOINTS + k for k in checkpoints.unfinished()}
        last = {_CHECKPOINTS + k for k in checkpoints.markers()}
        ready = [c for c in changed if c[1] not in self._unfinished]
        return sorted(ready, key=lambda c: (c[1] in last, c)), present

    def _changed(self) -> list[Change]:
        return self._scan()[0]

    def push(self) -> int:
        """Upload every new or changed file, then delete the checkpoints rotated away since; returns how many files
        were uploaded. Raises StorageError; the next push retries."""
        changed, present = self._scan()
        count = 0
        for _mtime, key, path, stamp in changed:
            try:
                self._upload(path, key)
            except FileNotFoundError:  # renamed or deleted since the scan: the next scan sees what is there
                continue
            self._pushed[key] = stamp
            count += 1
        # Absent at the scan, so the manifest uploaded above (written before the trainer deleted them) no longer
        # names them.
        for key in self.rotated(present):
            self.storage.delete(key)
            del self._pushed[key]
        return count

    def rotated(self, present: set[str]) -> list[str]:
        """What this mirror put in storage of the checkpoints the job deleted (or is deleting) since: every object
        of each, its commit file first, then the rest of what is gone."""
        pushed = [k.removeprefix(_CHECKPOINTS) for k in self._pushed if k.startswith(_CHECKPOINTS)]
        gone: list[str] = []
        for saved in survey(Listing.of_keys(pushed)).saved:
            keys = [_CHECKPOINTS + k for k in (*saved.markers, *saved.keys) if _CHECKPOINTS + k in self._pushed]
            if any(k not in present or k in self._unfinished for k in keys):
                gone += [k for k in dict.fromkeys(keys) if k not in gone]
        return gone + sorted(k for k in self._pushed if k.startswith(_CHECKPOINTS) and k not in present | set(gone))

    def _upload(self, path: Path, key: str) -> None:
        if self.logs.handles(key):  # what it holds in storage: what was pushed or pulled of it before
            self.logs.push(path, key, known=self._pushed.get(key, (0, 0))[0])
        else:
            self.storage.upload_file(path, key)

    def _pull(self, key: str) -> bool:
        """Download one object; False when it is missing or cannot be read (logged: one bad object must not stop
        the worker from starting)."""
        try:
            if not self.storage.download_file(key, self.local / key):
                return False
        except (StorageError, OSError) as exc:
            log.warning("could not download %s: %s", key, exc)
            return False
        st = (self.local / key).stat()
        self._pushed[key] = (st.st_size, st.st_mtime_ns)
        return True

    def pull_resume_state(self, worker: int) -> list[str]:
        """Bring back what a restarted job continues from, on a new machine as on the old one: the metrics so far,
        this worker's own log and events and its trainer's (their writers append to them), worker 0's progress (how
        far the earlier attempts got: runner.checkpoints.resumed), and the newest checkpoints in
        RUNNER_CHECKPOINT_DIR, whoever wrote them (restore_checkpoints)."""
        events = [contract.events_key(f"{writer}-{worker}") for writer in ("worker", "trainer")]
        own = [contract.METRICS, contract.log_key(worker), *events]
        own += [contract.PROGRESS] if worker == 0 else []
        pulled = [key for key in own if self._pull(key)]
        return pulled + self.restore_checkpoints()

    def restore_checkpoints(self) -> list[str]:
        """The newest checkpoints in the run directory's checkpoints/, whoever wrote them, not its whole history
        (runner.checkpoints: each format's restore): the runner's latest.json and every checkpoint it names (when
        it is missing, unreadable or names missing objects, the newest keep+1 ckpt-* files too, for the trainer's
        directory scan); of Orbax steps, TensorFlow saves and any other numbered series the `keep` newest committed,
        their commit files last; a BackupAndRestore backup and files rewritten in place, whole."""
        try:
            listing = Listing.of_storage(self.storage, _CHECKPOINTS).without(SHARED)
        except StorageError as exc:
            log.warning("could not list %s: %s", _CHECKPOINTS, exc)
            return []
        found = survey(listing)
        wanted = [_CHECKPOINTS + key for key in found.restore(self.keep)]
        if problem := found.problem("Keras"):
            named = [k for k in wanted if k.rpartition("/")[2].startswith("ckpt-")]
            log.warning("%s %s; fetching the newest checkpoints: %s", contract.LATEST_CHECKPOINT, problem, named)
        return [key for key in wanted if self._pull(key)]


_CHECKPOINTS = f"{contract.CHECKPOINTS}/"
_SHARED = f"{contract.SHARED_CHECKPOINTS}/"


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None
