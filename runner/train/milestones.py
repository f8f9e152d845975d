"""The trainer's start-up milestones as run-directory events, for the startup breakdown (`runner status`, the
report): when the framework was imported, the devices found, and the first training step done; and what took time
beside the steps, for the run's goodput (runner.collect.goodput): its data loaded, each checkpoint saved and restored
(events with the `seconds` they took, said as they end).

They go to events/trainer-<worker>.jsonl in the job's output directory (the mirror uploads it like any file, and
brings it back onto a recreated machine, so that every attempt's events stay; the timeline places them by time).
Writing one can fail (a full disk): training goes on, and the breakdown says the milestone is missing.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from runner import contract

log = logging.getLogger(__name__)

FRAMEWORK_IMPORTED = "framework_imported"
DEVICE_FOUND = "device_found"
FIRST_STEP = "first_step"
DATA_LOADED = "data_loaded"


class Milestones:
    def __init__(self, ctx: contract.JobContext) -> None:
        self.ctx = ctx
        self.source = f"trainer-{ctx.worker_id}"
        self._log: Any = None
        self._lock = threading.Lock()  # the first step's event is written from a thread of its own

    def emit(self, kind: str, **fields: Any) -> None:
        from runner.errors import RunnerError

        try:
            with self._lock:
                if self._log is None:
                    from runner.storage import open_storage
                    from runner.watch.events import EventLog

                    self._log = EventLog(open_storage(str(self.ctx.output_dir)), self.source)
                self._log.emit(kind, **fields)
        except (OSError, RunnerError) as exc:
            log.warning("could not record the %s event: %s", kind, exc)

    def took(self, kind: str, since: float, **fields: Any) -> None:
        """An event said as something ends, with the `seconds` it took since `since` (time.monotonic())."""
        self.emit(kind, seconds=round(time.monotonic() - since, 3), **fields)

    def first_step_callback(self, keras: Any, cursor: Any = None) -> Any:
        """A Keras callback that records the end of the first training step (compilation included), once. With a
        `cursor` (runner.train.callbacks.Cursor), the first step that trained: a user's fit resumed mid-epoch goes
        through the steps it skips first (runner.train.seams)."""
        milestones = self

        class FirstStep(keras.callbacks.Callback):
            done = False

            def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
                if not self.done and (cursor is None or cursor.advanced):
                    self.done = True
                    # Written beside the training loop: a file write in a batch hook is what Keras warns about
                    # ("on_train_batch_end is slow compared to the batch time"). The thread starts at once, so the
                    # event's time is the step's end to within a millisecond.
                    threading.Thread(target=milestones.emit, args=(FIRST_STEP,), daemon=True).start()

        return FirstStep()
