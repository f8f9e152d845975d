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
import re
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
    """How many checkpoints the run keeps ($RUNNER_CHECKPOINT_KEEP; from runs planned before it,
    training.checkpoint_keep in $RUNNER_TRAINING), else the default; without pydantic, so the supervisor stays
    light."""
    try:
        keep = environ.get(contract.CHECKPOINT_KEEP) or json.loads(environ.get(contract.TRAINING) or "{}").get(
            "checkpoint_keep"
        )
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
        """Bring back what a restarted job continues from, on a new machine as on the old one: the metrics so far,
        this worker's own log and events (their writers append to them), and the newest checkpoints in
        RUNNER_CHECKPOINT_DIR, whoever wrote them (restore_checkpoints)."""
        own = (contract.METRICS, contract.log_key(worker), contract.events_key(f"worker-{worker}"))
        pulled = [key for key in own if self._pull(key)]
        return pulled + self.restore_checkpoints()

    def restore_checkpoints(self) -> list[str]:
        """The newest set of checkpoints in the run directory's checkpoints/, not its whole history:

        * the runner's own (runner.train: the built-in trainer, keras_callbacks()): latest.json and every
          checkpoint it lists (the trainer resumes from the newest that verifies); when it is missing,
          unreadable or names missing objects, the newest keep+1 ckpt-* files found by listing, for the
          trainer's directory scan;
        * a job's own files (Keras' BackupAndRestore and ModelCheckpoint, a TensorFlow checkpoint manager, any
          other): every file whose name holds no number (a backup rewritten in place, TensorFlow's `checkpoint`
          index), and of each series of names that differ only in their numbers (model-03.keras,
          ckpt-5.index + ckpt-5.data-00000-of-00001), the `keep` with the highest numbers (in each directory,
          the numbers a series shares: a TensorFlow checkpoint's index and data files come back together)."""
        prefix = f"{contract.CHECKPOINTS}/"
        try:
            listed = [o.key for o in self.storage.list(prefix)]
        except StorageError as exc:
            log.warning("could not list %s: %s", prefix, exc)
            listed = []
        runner_keys = [
            k for k in listed if parse_name(k.rpartition("/")[2]) is not None or k == contract.LATEST_CHECKPOINT
        ]
        pulled = self._restore_runner_checkpoints(set(listed))
        others = [k for k in listed if k not in runner_keys and not k.rpartition("/")[2].startswith(".")]
        return pulled + [key for key in newest_sets(others, self.keep) if self._pull(key)]

    def _restore_runner_checkpoints(self, listed: set[str]) -> list[str]:
        pulled: list[str] = []
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
        if problem and (raw is not None or listed):
            pulled += self._pull_newest(problem, exclude=set(pulled), listed=listed)
        return pulled

    def _pull_newest(self, problem: str, exclude: set[str], listed: set[str]) -> list[str]:
        found = []
        for key in listed:
            position = parse_name(key.rpartition("/")[2])
            if position is not None:
                found.append((position, key))
        newest = [key for _position, key in sorted(found, reverse=True)[: self.keep + 1] if key not in exclude]
        if newest:
            log.warning("%s %s; fetching the newest checkpoints: %s", contract.LATEST_CHECKPOINT, problem, newest)
        return [key for key in newest if self._pull(key)]


_NUMBER = re.compile(r"\d+")


def _runner_checkpoint(key: str) -> bool:
    """The manifest, or a checkpoint the runner's trainer names (ckpt-EEEEEE[-sSSSSSS].keras) at the top level."""
    name = key.rpartition("/")[2]
    return key == contract.LATEST_CHECKPOINT or (
        key == f"{contract.CHECKPOINTS}/{name}" and parse_name(name) is not None
    )


def newest_sets(keys: list[str], keep: int) -> list[str]:
    """Of a job's own checkpoint files, those a restart needs (Mirror.restore_checkpoints): names without numbers,
    and per directory the files carrying one of the `keep` highest number tuples of their series."""
    by_dir: dict[str, list[str]] = {}
    for key in keys:
        by_dir.setdefault(key.rpartition("/")[0], []).append(key)
    chosen: list[str] = []
    for directory_keys in by_dir.values():
        series: dict[str, list[tuple[tuple[int, ...], str]]] = {}
        for key in directory_keys:
            name = key.rpartition("/")[2]
            numbers = tuple(int(n) for n in _NUMBER.findall(name))
            if not numbers:
                chosen.append(key)
                continue
            series.setdefault(_NUMBER.sub("#", name), []).append((numbers, key))
        # The first number orders a series (an epoch, a step, a save count); a set is what shares it.
        for members in series.values():
            firsts = sorted({numbers[0] for numbers, _ in members}, reverse=True)[:keep]
            chosen += [key for numbers, key in members if numbers[0] in firsts]
    return sorted(chosen)
