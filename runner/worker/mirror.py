"""Mirror a local output directory to the run directory in storage.

The job writes plain files locally (the trainer, or a user's command that knows nothing of Cloud Storage); the
mirror uploads what changed. Files are uploaded oldest first, so a checkpoint reaches storage before the
latest.json that names it: a reader never sees a manifest pointing at a missing checkpoint. Writers make files
appear atomically (write, then rename), so a file is never uploaded half-written.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from runner import contract
from runner.storage import Storage

log = logging.getLogger(__name__)


class Mirror:
    def __init__(self, local: Path, storage: Storage) -> None:
        self.local = local
        self.storage = storage
        self._pushed: dict[str, tuple[int, int]] = {}

    def _changed(self) -> list[tuple[int, str, Path, tuple[int, int]]]:
        out = []
        for root, _dirs, files in os.walk(self.local):
            for name in files:
                if name.startswith("."):  # temporary files of atomic writes
                    continue
                path = Path(root) / name
                try:
                    st = path.stat()
                except FileNotFoundError:  # replaced or removed while walking
                    continue
                key = path.relative_to(self.local).as_posix()
                stamp = (st.st_size, st.st_mtime_ns)
                if self._pushed.get(key) != stamp:
                    out.append((st.st_mtime_ns, key, path, stamp))
        return sorted(out)

    def push(self) -> int:
        """Upload every new or changed file; returns how many. Raises StorageError; the next push retries."""
        count = 0
        for _mtime, key, path, stamp in self._changed():
            try:
                self.storage.upload_file(path, key)
            except FileNotFoundError:
                continue
            self._pushed[key] = stamp
            count += 1
        return count

    def pull_resume_state(self, worker: int) -> list[str]:
        """Bring back what a restarted job continues from: the latest checkpoint and its manifest, the metrics so
        far, and this worker's own log and events (their writers append to them)."""
        keys = [contract.METRICS, contract.log_key(worker), contract.events_key(f"worker-{worker}")]
        latest = self.storage.read_bytes(contract.LATEST_CHECKPOINT)
        if latest:
            import json

            try:
                name = json.loads(latest)["path"]
                keys += [f"{contract.CHECKPOINTS}/{name}", contract.LATEST_CHECKPOINT]
            except (ValueError, KeyError, TypeError):
                log.warning("ignoring unreadable %s", contract.LATEST_CHECKPOINT)
        pulled = []
        for key in keys:
            if self.storage.download_file(key, self.local / key):
                st = (self.local / key).stat()
                self._pushed[key] = (st.st_size, st.st_mtime_ns)
                pulled.append(key)
        return pulled
