"""Metrics and progress from your own training code, in the format `runner status`, `runner list` and the report
read: what the built-in trainer writes, for a `command:` job.

RUNNER_METRICS_FILE (the run directory's metrics.jsonl) holds one JSON object per line, appended as training goes:

    {"epoch": 1, "loss": 0.41, "accuracy": 0.88, "val_loss": 0.12, "val_accuracy": 0.963, "epoch_time_s": 31.2}

Each line is one point: `epoch` (1-based) or `step` says where, every other number is a metric (the report plots
loss, accuracy, val_loss and val_accuracy per epoch; `epoch_time_s` gives status its ETA). A line that is not a
JSON object is skipped with a warning. RUNNER_PROGRESS_FILE (progress.json) is rewritten with where training is
now: {"epoch": 2, "epochs": 5, "step": 40, "steps_per_epoch": 59} (status: "epoch 2 of 5, step 40 of 59").

    from runner.metrics import KerasMetrics, log_metrics

    model.fit(x, y, epochs=5, callbacks=[KerasMetrics()])   # both files, from Keras' own logs
    log_metrics(step=100, loss=0.3)                         # or one line by hand (JAX, PyTorch, ...)

Only worker 0 writes (on a pod slice every worker runs the command; the run has one metrics file). Outside a run
(no RUNNER_* variables) nothing is written, so the same script runs in a notebook. Importing this module imports
neither TensorFlow nor Keras: KerasMetrics does, when called, and subclasses the Keras the job uses (tf_keras when
TF_USE_LEGACY_KERAS says so, as on a TPU VM, else Keras 3).

The built-in trainer and keras_callbacks() write both files through the same functions (runner.train.callbacks),
on the same time budget (PROGRESS_EVERY_S, checked by an Every at each step).
"""

from __future__ import annotations

import json
import math
import numbers
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from runner import contract
from runner.storage.local import write_atomic

PROGRESS_EVERY_S = contract.cadence(contract.PROGRESS_S)  # progress.json, which hang detection reads


class Every:
    """A time budget checked at every step for the price of a clock read: due() is true once `seconds` have passed
    since it last was (or since start())."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.seconds, self.clock = seconds, clock
        self.next = 0.0

    def start(self) -> None:
        self.next = self.clock() + self.seconds

    def due(self) -> bool:
        now = self.clock()
        if now < self.next:
            return False
        self.next = now + self.seconds
        return True


def _path(variable: str, given: str | Path | None) -> Path | None:
    if given is not None:
        return Path(given)
    if os.environ.get(contract.WORKER_ID, "0") != "0":
        return None
    value = os.environ.get(variable)
    return Path(value) if value else None


def _numbers(values: dict[str, Any]) -> dict[str, Any]:
    """JSON-safe values: whole numbers as ints, other numbers as floats (numpy and tensor scalars too), NaN and
    infinities left out, None too."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, bool | str):
            out[key] = value
            continue
        if isinstance(value, numbers.Integral):
            out[key] = int(value)
            continue
        try:
            number = float(value)
        except (TypeError, ValueError):
            continue
        if math.isfinite(number):
            out[key] = int(number) if key in ("epoch", "step") else number
    return out


def metrics_row(**values: Any) -> dict[str, Any]:
    """One metrics.jsonl line: the values made JSON-safe, and the time it was written."""
    return {**_numbers(values), "time": round(time.time(), 3)}


def log_metrics(path: str | Path | None = None, /, **values: Any) -> dict[str, Any] | None:
    """Append one line to RUNNER_METRICS_FILE (or `path`): log_metrics(epoch=1, loss=0.4, accuracy=0.88). Returns
    the line written, or None when there is nowhere to write (not in a run, or not worker 0)."""
    target = _path(contract.METRICS_FILE, path)
    if target is None:
        return None
    line = metrics_row(**values)
    target.parent.mkdir(parents=True, exist_ok=True)
    with target.open("a") as out:
        out.write(json.dumps(line) + "\n")
    return line


def write_progress(path: str | Path | None = None, /, **where: Any) -> None:
    """Rewrite RUNNER_PROGRESS_FILE (or `path`) atomically: write_progress(epoch=2, epochs=5, step=40,
    steps_per_epoch=59). The supervisor also counts a change as progress (teardown.hang_timeout)."""
    target = _path(contract.PROGRESS_FILE, path)
    if target is None:
        return
    write_atomic(target, json.dumps({**_numbers(where), "time": round(time.time(), 3)}).encode())


def chosen_keras() -> Any:
    """The Keras the job uses: tf_keras where TensorFlow would take it (contract.legacy_keras) and Keras does not run
    on JAX, else Keras 3."""
    if contract.legacy_keras() and os.environ.get("KERAS_BACKEND") != "jax":
        import tf_keras

        return tf_keras
    import keras

    return keras


def KerasMetrics(  # used like a class: callbacks=[KerasMetrics()]
    metrics_file: str | Path | None = None, progress_file: str | Path | None = None
) -> Any:
    """A Keras callback: one metrics line per epoch (Keras' logs, epoch_time_s), and progress every few seconds."""

    class _KerasMetrics(chosen_keras().callbacks.Callback):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self._epoch = 0
            self._t0 = 0.0
            self._every = Every(PROGRESS_EVERY_S)

        def _progress(self, step: int | None) -> None:
            params = getattr(self, "params", None) or {}
            write_progress(
                progress_file,
                epoch=self._epoch + 1,
                epochs=params.get("epochs"),
                step=step,
                steps_per_epoch=params.get("steps"),
            )
            self._every.start()

        def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
            self._epoch, self._t0 = epoch, time.monotonic()
            self._progress(0)

        def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
            if self._every.due():
                self._progress(batch + 1)

        def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
            seconds = time.monotonic() - self._t0
            log_metrics(metrics_file, epoch=epoch + 1, **(logs or {}), epoch_time_s=round(seconds, 3))
            params = getattr(self, "params", None) or {}
            self._progress(params.get("steps"))

    return _KerasMetrics()
