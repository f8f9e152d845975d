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
TF_USE_LEGACY_KERAS=1, as on a TPU VM, else Keras 3).
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

from runner import contract

PROGRESS_EVERY_S = contract.cadence(contract.PROGRESS_S)  # progress.json, which hang detection reads


def _path(variable: str, given: str | Path | None) -> Path | None:
    if given is not None:
        return Path(given)
    if os.environ.get(contract.WORKER_ID, "0") != "0":
        return None
    value = os.environ.get(variable)
    return Path(value) if value else None


def _numbers(values: dict[str, Any]) -> dict[str, Any]:
    """JSON-safe values: numbers as floats (numpy and tensor scalars too), NaN and infinities left out."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, bool | str) or value is None:
            out[key] = value
            continue
        try:
            number = float(value)
        except (TypeError, ValueError):
            continue
        if math.isfinite(number):
            out[key] = int(number) if key in ("epoch", "step") else number
    return out


def log_metrics(path: str | Path | None = None, /, **values: Any) -> dict[str, Any] | None:
    """Append one line to RUNNER_METRICS_FILE (or `path`): log_metrics(epoch=1, loss=0.4, accuracy=0.88). Returns
    the line written, or None when there is nowhere to write (not in a run, or not worker 0)."""
    target = _path(contract.METRICS_FILE, path)
    if target is None:
        return None
    line = {**_numbers(values), "time": round(time.time(), 3)}
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
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = target.with_name(f".{target.name}.{os.getpid()}")
    temporary.write_text(json.dumps({**_numbers(where), "time": round(time.time(), 3)}))
    temporary.replace(target)


def _callback_base() -> type:
    if os.environ.get("TF_USE_LEGACY_KERAS") == "1":
        import tf_keras

        return tf_keras.callbacks.Callback
    import keras

    return keras.callbacks.Callback


def KerasMetrics(  # used like a class: callbacks=[KerasMetrics()]
    metrics_file: str | Path | None = None, progress_file: str | Path | None = None
) -> Any:
    """A Keras callback: one metrics line per epoch (Keras' logs, epoch_time_s), and progress every few seconds."""

    class _KerasMetrics(_callback_base()):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self._epoch = 0
            self._t0 = self._written = 0.0

        def _progress(self, step: int | None) -> None:
            params = getattr(self, "params", None) or {}
            write_progress(
                progress_file,
                epoch=self._epoch + 1,
                epochs=params.get("epochs"),
                step=step,
                steps_per_epoch=params.get("steps"),
            )
            self._written = time.monotonic()

        def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
            self._epoch, self._t0 = epoch, time.monotonic()
            self._progress(0)

        def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
            if time.monotonic() - self._written >= PROGRESS_EVERY_S:
                self._progress(batch + 1)

        def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
            seconds = time.monotonic() - self._t0
            log_metrics(metrics_file, epoch=epoch + 1, **(logs or {}), epoch_time_s=round(seconds, 3))
            params = getattr(self, "params", None) or {}
            self._progress(params.get("steps"))

    return _KerasMetrics()
