"""Mirror a local output directory to the run directory in storage.

The job writes plain files locally (the trainer, or a user's command that knows nothing of Cloud Storage); the
mirror uploads what changed. Files are uploaded oldest first, so a checkpoint reaches storage before the
latest.json that names it: a reader never sees a manifest pointing at a checkpoint not yet uploaded. Writers make
files appear atomically (write, then rename), so a file is never uploaded half-written.

Checkpoints the trainer rotated away locally are deleted from storage too, after the uploads of the same pass (so
the manifest that stopped naming them is already there), and only those this mirror uploaded or downloaded itself:
a bucket keeps `keep` checkpoints, not every one a long run wrote, and never loses objects someone else put there.

Logs (logs/worker-N.log) only grow: they travel by their new bytes, up to a cap (runner.worker.logsync).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path

from runner import contract
from runner.errors import StorageError
from runner.storage import Storage
from runner.train.checkpoints import DEFAULT_KEEP, ManifestError, parse_manifest, parse_name
from runner.worker.logsync import LOG_CAP_BYTES, LogSync

log = logging.getLogger(__name__)

Change = tuple[int, str, Path, tuple[int, int]]  # (mtime_ns, key, path, (size, mtime_ns))


def checkpoint_keep(environ: Mapping[str, str]) -> int:
    """training.checkpoint_keep from the job's environment ($RUNNER_TRAINING), else the default; without pydantic,
    so the supervisor stays light."""
    try:
        keep = json.loads(environ.get(contract.TRAINING) or "{}").get("checkpoint_keep")
        return int(keep) if keep else DEFAULT_KEEP
    except (ValueError, TypeError, AttributeError):
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

    def _scan(self) -> tuple[list[Change], set[str]]:
        """Files new or changed since their last upload (oldest first), and every key present now."""
        changed, present = [], set()
        for root, _dirs, files in os.walk(self.local):
            for name in files:
                if name.startswith("."):  # temporary files of atomic writes
                    continue
                path = Path(root) / name
                key = path.relative_to(self.local).as_posix()
                present.add(key)  # even if it vanishes before stat: a replaced file is never absent
                try:
                    st = path.stat()
                except FileNotFoundError:
                    continue
                stamp = (st.st_size, st.st_mtime_ns)
                if self._pushed.get(key) != stamp:
                    changed.append((st.st_mtime_ns, key, path, stamp))
        return sorted(changed), present

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
            except FileNotFoundError:
                continue
            self._pushed[key] = stamp
            count += 1
        # Absent at the scan, so the manifest uploaded above (written before the trainer deleted them) no longer
        # names them.
        gone = sorted(k for k in self._pushed if k.startswith(f"{contract.CHECKPOINTS}/") and k not in present)
        for key in gone:
            self.storage.delete(key)
            del self._pushed[key]
        return count

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
        """Bring back what a restarted job continues from: the checkpoint manifest and every checkpoint it lists
        (the trainer resumes from the newest that verifies), the metrics so far, and this worker's own log and
        events (their writers append to them). When the manifest is missing, unreadable or names missing objects,
        the newest keep+1 checkpoints found by listing are fetched as well, for the trainer's directory scan."""
        own = (contract.METRICS, contract.log_key(worker), contract.events_key(f"worker-{worker}"))
        pulled = [key for key in own if self._pull(key)]
        problem: str | None = None
        try:
            raw = self.storage.read_bytes(contract.LATEST_CHECKPOINT)
        except StorageError as exc:
            raw, problem = None, f"cannot be read: {exc}"
        wanted: list[str] = []
        if raw is None:
            problem = problem or "is missing"
        else:
            try:
                wanted = [f"{contract.CHECKPOINTS}/{c.file}" for c in parse_manifest(raw)]
            except ManifestError as exc:
                problem = f"is unreadable: {exc}"
        for key in wanted:
            if self._pull(key):
                pulled.append(key)
            else:
                problem = problem or f"names {key}, which could not be downloaded"
        # After the checkpoints it names; even when unreadable, so that the trainer says so and scans instead.
        if raw is not None and self._pull(contract.LATEST_CHECKPOINT):
            pulled.append(contract.LATEST_CHECKPOINT)
        if problem:
            pulled += self._pull_newest(problem, exclude=set(pulled))
        return pulled

    def _pull_newest(self, problem: str, exclude: set[str]) -> list[str]:
        try:
            listed = self.storage.list(f"{contract.CHECKPOINTS}/")
        except StorageError as exc:
            log.warning("%s %s, and listing the checkpoints failed: %s", contract.LATEST_CHECKPOINT, problem, exc)
            return []
        found = []
        for obj in listed:
            name = obj.key.rpartition("/")[2]
            position = parse_name(name)
            if position is not None and obj.key == f"{contract.CHECKPOINTS}/{name}":
                found.append((position, obj.key))
        newest = [key for _position, key in sorted(found, reverse=True)[: self.keep + 1] if key not in exclude]
        if newest:
            log.warning("%s %s; fetching the newest checkpoints: %s", contract.LATEST_CHECKPOINT, problem, newest)
        return [key for key in newest if self._pull(key)]
