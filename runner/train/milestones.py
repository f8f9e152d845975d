"""The trainer's start-up milestones as run-directory events, for the startup breakdown (`runner status`, the
report): when the framework was imported, the devices found, and the first training step done.

They go to events/trainer-<worker>.jsonl in the job's output directory (the mirror uploads it like any file). A
trainer resumed on the same machine appends to it; one on a fresh machine (after a preemption) starts it anew, so the
file then holds the newest machine's milestones (the timeline places them by time). Writing one can fail (a full
disk): training goes on, and the breakdown says the milestone is missing.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from runner import contract

log = logging.getLogger(__name__)

FRAMEWORK_IMPORTED = "framework_imported"
DEVICE_FOUND = "device_found"
FIRST_STEP = "first_step"


class Milestones:
    def __init__(self, ctx: contract.JobContext) -> None:
        self.ctx = ctx
        self.source = f"trainer-{ctx.worker_id}"
        self._log: Any = None

    def emit(self, kind: str, **fields: Any) -> None:
        from runner.errors import RunnerError

        try:
            if self._log is None:
                from runner.storage import open_storage
                from runner.watch.events import EventLog

                self._log = EventLog(open_storage(str(self.ctx.output_dir)), self.source)
            self._log.emit(kind, **fields)
        except (OSError, RunnerError) as exc:
            log.warning("could not record the %s event: %s", kind, exc)

    def first_step_callback(self, keras: Any) -> Any:
        """A Keras callback that records the end of the first training step (compilation included), once."""
        milestones = self

        class FirstStep(keras.callbacks.Callback):
            done = False

            def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
                if not self.done:
                    self.done = True
                    # Written beside the training loop: a file write in a batch hook is what Keras warns about
                    # ("on_train_batch_end is slow compared to the batch time"). The thread starts at once, so the
                    # event's time is the step's end to within a millisecond.
                    threading.Thread(target=milestones.emit, args=(FIRST_STEP,), daemon=True).start()

        return FirstStep()
