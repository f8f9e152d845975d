"""Keras callbacks that write the run-directory contract: metrics, checkpoints, progress, graceful stop.

Every file is made to appear atomically (write a hidden temp file, then rename), because the supervisor mirrors
the directory to Cloud Storage while training runs and must never upload half a file.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

import tensorflow as tf

from runner.storage.local import write_atomic
from runner.train.checkpoints import save_checkpoint

# tf.keras is Keras 3 or tf_keras depending on TF_USE_LEGACY_KERAS, which the trainer sets before this import.
keras = tf.keras


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue  # a torn line from a crashed writer
    return out


def _floats(logs: dict[str, Any] | None) -> dict[str, float]:
    """Keras' logs as plain floats. The weighted test cross-entropy (val_xent) replaces Keras' val_loss, which
    counts the zero-weight padding of the last test batch; the training xent duplicates loss."""
    out = {k: round(float(v), 6) for k, v in (logs or {}).items() if isinstance(v, int | float) or hasattr(v, "item")}
    if "val_xent" in out:
        out["val_loss"] = out.pop("val_xent")
    out.pop("xent", None)
    return out


class EpochMetrics(keras.callbacks.Callback):  # type: ignore[misc, name-defined]
    """One JSON line per epoch in metrics.jsonl: Keras' logs, epoch time and examples/s."""

    def __init__(self, path: Path, examples_per_epoch: int) -> None:
        super().__init__()
        self.path = path
        self.examples = examples_per_epoch
        self.rows = read_jsonl(path)
        self._t0 = 0.0

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._t0 = time.perf_counter()

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        seconds = time.perf_counter() - self._t0
        row = {
            "epoch": epoch + 1,
            **_floats(logs),
            "epoch_time_s": round(seconds, 3),
            "examples_per_s": round(self.examples / seconds, 1),
            "time": round(time.time(), 3),
        }
        self.rows = [r for r in self.rows if r.get("epoch") != epoch + 1] + [row]
        write_atomic(self.path, "".join(json.dumps(r) + "\n" for r in self.rows).encode())


class Checkpointer(keras.callbacks.Callback):  # type: ignore[misc, name-defined]
    """Saves model + optimizer state every `every` epochs and at the last one; latest.json names the newest.
    Keeps the newest `keep`, so a torn upload of the newest still leaves one to resume from."""

    def __init__(self, directory: Path, every: int, last_epoch: int, keras_impl: str, keep: int = 2) -> None:
        super().__init__()
        self.directory, self.every, self.last_epoch, self.keep = directory, every, last_epoch, keep
        self.keras_impl = keras_impl

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        done = epoch + 1
        if done % self.every == 0 or done == self.last_epoch:
            save_checkpoint(self.model, self.directory, done, self.keras_impl, self.keep)


class Progress(keras.callbacks.Callback):  # type: ignore[misc, name-defined]
    """Keras-style progress lines at most every `interval` seconds: a log file is not a terminal, so the
    usual carriage-return bar would arrive as one unreadable line."""

    def __init__(self, epochs: int, steps: int, global_batch: int, interval: float = 5.0) -> None:
        super().__init__()
        self.epochs, self.steps, self.batch, self.interval = epochs, steps, global_batch, interval
        self._epoch = 0
        self._t0 = self._last = 0.0

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._epoch = epoch + 1
        self._t0 = self._last = time.perf_counter()

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        t = time.perf_counter()
        if t - self._last < self.interval:
            return
        self._last = t
        step = batch + 1
        filled = int(30 * step / self.steps)
        bar = "=" * max(filled - 1, 0) + (">" if filled < 30 else "=") + "." * (30 - filled)
        rate = step * self.batch / (t - self._t0)
        print(
            f"Epoch {self._epoch}/{self.epochs} {step}/{self.steps} [{bar}] {_fmt(logs)} - {rate:.0f} ex/s",
            flush=True,
        )

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        seconds = time.perf_counter() - self._t0
        rate = self.steps * self.batch / seconds
        print(
            f"Epoch {epoch + 1}/{self.epochs} {self.steps}/{self.steps} - {seconds:.1f}s - {_fmt(logs)} - "
            f"{rate:.0f} ex/s",
            flush=True,
        )


class GracefulStop(keras.callbacks.Callback):  # type: ignore[misc, name-defined]
    """SIGTERM (docker stop, a preemption notice, the supervisor) ends training after the current step."""

    def __init__(self) -> None:
        super().__init__()
        self.signum: int | None = None
        signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum: int, _frame: object) -> None:
        self.signum = signum
        print(f"[trainer] {signal.Signals(signum).name}: stopping after this step", file=sys.stderr, flush=True)

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if self.signum is not None:
            self.model.stop_training = True


def _fmt(logs: dict[str, Any] | None) -> str:
    return " - ".join(f"{k}: {v:.4f}" for k, v in _floats(logs).items())
