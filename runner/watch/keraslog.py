"""Keras' own epoch lines in a job's log, read back: what a `command` job that writes no metrics file still tells.

model.fit prints "Epoch 3/5", then a progress bar that it redraws in place and ends with the epoch's results;
evaluate() prints one more bar with the test metrics. What logs/worker-N.log holds of them (the supervisor's
LogCleaner keeps a redrawn line's state every 30 s and its last state when it ends; runner.watch.logtext):

    Keras 3, verbose=1   422/422 ━━━━━━━━━━━━━━━━━━━━ 3s 6ms/step - accuracy: 0.8705 - loss: 0.4782 - val_accuracy: ...
                         235/422 ━━━━━━━━━━━━━━━━━━━━ 0s 4ms/step - accuracy: 0.8371 - loss: 0.6158  (mid-epoch: an ETA)
    Keras 3, verbose=2   29/29 - 3s - 95ms/step - accuracy: 0.5458 - loss: 1.6688 - val_accuracy: ...
    tf_keras, verbose=1  422/422 [==============================] - 3s 5ms/step - loss: 0.4782 - accuracy: 0.8705 - ...
                         252/422 [================>.............] - ETA: 0s - loss: 0.5965 - accuracy: 0.8416
    tf_keras, verbose=2  29/29 - 2s - loss: 1.6688 - accuracy: 0.5458 - val_loss: ... - 2s/epoch - 57ms/step
    a first epoch over data of unknown size:   469/Unknown 3s 6ms/step - loss: ...

One bar is a run of step lines with the same target and steps that never go down; its last line is where it
ended. The first bar after an "Epoch k/K" line is that epoch's training (Keras prints no bar for validation); one
that reached its target is the epoch's result. A later bar after the last epoch, with metrics, is an evaluate():
the test metrics. A job's own print of "Test accuracy: 0.97" (as the TensorFlow guides end) counts too, when no
evaluate() bar says it. Standard library only: the in-container supervisor imports it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

_EPOCH = re.compile(r"^Epoch (\d+)/(\d+)\s*$")
# "N/M" (or "N/Unknown"), then Keras 3's bar, tf_keras' bar or nothing (verbose=2), then what follows it.
_STEP = re.compile(r"^\s*(\d+)/(\d+|Unknown)(?:\s+━+|\s+\[[=>.]*\])?((?:\s+-\s|\s+\d).*)$")
_NUMBER = r"[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|nan|inf)"
_METRIC = re.compile(rf"^([A-Za-z_][\w.\-/]*): ({_NUMBER})$")
_SECONDS = re.compile(r"^(\d+(?:\.\d+)?)(s|ms|us)(/epoch)?$")
_TEST_PRINT = re.compile(rf"^\s*test[ _](accuracy|acc|loss)\s*[:=]\s*({_NUMBER})\s*$", re.IGNORECASE)
_UNIT_S = {"s": 1.0, "ms": 1e-3, "us": 1e-6}


@dataclass(frozen=True)
class StepLine:
    step: int
    target: int | None  # None: "Unknown" (a first epoch over data of unknown size)
    metrics: dict[str, float]
    seconds: float | None  # the bar's time when it ended: "3s" (Keras rounds it), or tf_keras' "266ms/epoch"

    @property
    def complete(self) -> bool:
        return self.target is None or self.step >= self.target


def parse_step_line(line: str) -> StepLine | None:
    """One progress-bar line, or None when the line is not one."""
    match = _STEP.match(line)
    if match is None:
        return None
    step, target = int(match[1]), None if match[2] == "Unknown" else int(match[2])
    if target is not None and (target == 0 or step > target):
        return None
    metrics: dict[str, float] = {}
    elapsed: float | None = None
    per_epoch: float | None = None
    eta = False
    for part in match[3].split(" - "):
        part = part.strip()
        if found := _METRIC.match(part):
            value = float(found[2])
            if math.isfinite(value):
                metrics[found[1]] = value
            continue
        if part.startswith("ETA:"):
            eta = True
            continue
        for word in part.split():
            if (time := _SECONDS.match(word)) is not None:
                taken = float(time[1]) * _UNIT_S[time[2]]
                if time[3]:
                    per_epoch = taken
                elif elapsed is None:
                    elapsed = taken
    if not metrics and elapsed is None and per_epoch is None and not eta:
        return None  # "3/4 of the files" and the like: no time, no metric
    done = target is None or step >= target
    # Mid-epoch, Keras 3 shows the time left where the finished bar shows the time taken.
    seconds = per_epoch if per_epoch is not None else (elapsed if done and not eta else None)
    return StepLine(step, target, metrics, seconds)


@dataclass(frozen=True)
class KerasLog:
    """What a log's Keras lines say: one row per epoch that ended (metrics.jsonl's shape: epoch, each metric,
    epoch_time_s), the test metrics, and where an epoch still running stands."""

    epochs: list[dict[str, Any]] = field(default_factory=list)
    test: dict[str, float] = field(default_factory=dict)
    epoch: int | None = None  # the newest "Epoch k/K" line
    epochs_total: int | None = None
    step: int | None = None  # steps done of that epoch (None before its first bar line)
    steps: int | None = None  # of how many (None: data of unknown size, until the epoch ends)

    def progress(self) -> dict[str, int] | None:
        """progress.json's shape (epoch, epochs, step, steps_per_epoch), or None without an "Epoch" line."""
        if self.epoch is None:
            return None
        out = {"epoch": self.epoch}
        for key, value in (("epochs", self.epochs_total), ("step", self.step), ("steps_per_epoch", self.steps)):
            if value is not None:
                out[key] = value
        return out


def _bars(lines: list[StepLine]) -> list[list[StepLine]]:
    """Step lines grouped into bars: a new bar when the target changes or the step goes down."""
    bars: list[list[StepLine]] = []
    for line in lines:
        last = bars[-1][-1] if bars else None
        open_bar = last is not None and (last.target is None or last.step < last.target)
        if last is not None and open_bar and last.target == line.target and line.step >= last.step:
            bars[-1].append(line)
        else:
            bars.append([line])
    return bars


def _row(epoch: int, line: StepLine) -> dict[str, Any]:
    row: dict[str, Any] = {"epoch": epoch, **line.metrics}
    if line.seconds is not None:
        row["epoch_time_s"] = line.seconds
    return row


def parse_keras_log(text: str) -> KerasLog:
    """Every epoch Keras printed in `text` (a cleaned log), newest wins for an epoch printed twice (a run that
    resumed), in epoch order; the test metrics of the evaluate() after the last epoch; the running epoch."""
    rows: dict[int, dict[str, Any]] = {}
    printed: dict[str, float] = {}
    blocks: list[tuple[int, int, list[StepLine]]] = []  # (epoch, of epochs, its step lines)
    for raw in text.splitlines():
        if (header := _EPOCH.match(raw)) is not None:
            blocks.append((int(header[1]), int(header[2]), []))
        elif (line := parse_step_line(raw)) is not None:
            if blocks:
                blocks[-1][2].append(line)
        elif (said := _TEST_PRINT.match(raw)) is not None:
            value = float(said[2])
            if math.isfinite(value):
                printed["accuracy" if said[1].lower() in ("accuracy", "acc") else "loss"] = value
    running: tuple[int | None, int | None] = (None, None)
    test: dict[str, float] = {}
    for n, (epoch, _total, lines) in enumerate(blocks):
        bars = _bars(lines)
        if not bars:
            continue
        training = bars[0][-1]
        last_block = n == len(blocks) - 1
        # A bar over data of unknown size never says it ended: the next epoch, an evaluate() or the validation
        # metrics (printed only at its end) do.
        ended = training.target is not None or not last_block or len(bars) > 1 or "val_loss" in training.metrics
        if training.complete and ended:
            rows[epoch] = _row(epoch, training)
        if last_block:
            running = (training.step, training.target if training.target is not None or not ended else training.step)
        if last_block:
            evaluations = [bar[-1] for bar in bars[1:] if bar[-1].complete and bar[-1].metrics]
            test = dict(evaluations[-1].metrics) if evaluations else {}
    last = blocks[-1] if blocks else None
    return KerasLog(
        epochs=[rows[k] for k in sorted(rows)],
        test={**printed, **test},
        epoch=last[0] if last else None,
        epochs_total=last[1] if last else None,
        step=running[0],
        steps=running[1],
    )
