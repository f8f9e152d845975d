"""Where a run stands, for `runner status`: epoch N of M, steps, an ETA, the last metrics.

Read from progress.json (the trainer rewrites it every few seconds; user code may write any part of it) and
metrics.jsonl (one line per epoch, the trainer's or a command's RUNNER_METRICS_FILE). The ETA is the time the
epochs done so far took per epoch (after the first, which compiles, when there are more) times what is left;
none before an epoch has ended, since the first steps of a run say little about its speed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from runner.collect.summary import rounded
from runner.watch.logtext import one_line
from runner.watch.rundir import Progress, number

# Keys of a metrics line shown first, in this order; other numbers follow.
_FIRST = ("loss", "accuracy", "val_loss", "val_accuracy")
_NOT_METRICS = {"epoch", "time", "step", "global_step", "epoch_time_s", "examples_per_s", "resumed_at_step"}


def duration(seconds: float) -> str:
    """1h 02m, 3m 20s, 45s."""
    seconds = max(0, round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h {minutes:02d}m"
    return f"{minutes}m {secs:02d}s" if minutes else f"{secs}s"


def _epoch_seconds(metrics: list[dict[str, Any]]) -> float | None:
    times = [t for line in metrics if (t := number(line.get("epoch_time_s"))) is not None and t > 0]
    if not times:
        return None
    later = times[1:] or times
    return sum(later) / len(later)


@dataclass(frozen=True)
class Standing:
    """What progress.json and metrics.jsonl say of a run's position, speed and latest results."""

    progress: Progress | None
    metrics: list[dict[str, Any]]
    now: float

    @property
    def epoch_s(self) -> float | None:
        return _epoch_seconds(self.metrics)

    def eta_s(self) -> float | None:
        p, per_epoch = self.progress, self.epoch_s
        if p is None or p.epoch is None or p.epochs is None:
            return None
        fraction = 0.0
        if p.step is not None and p.steps_per_epoch:
            fraction = min(1.0, p.step / p.steps_per_epoch)
        epochs_left = max(0.0, (p.epochs - p.epoch) + (1.0 - fraction))
        if not epochs_left:
            return 0.0  # every step done: nothing is left, though epochs too short for Keras' "0s" leave no speed
        if per_epoch is None:
            return None
        left = epochs_left * per_epoch
        if p.time is not None:  # progress.json is a few seconds old: that time has passed already
            left -= max(0.0, self.now - p.time)
        return max(0.0, left)

    def progress_text(self) -> str | None:
        p = self.progress
        if p is None:
            return None
        parts = []
        if p.epoch is not None:
            parts.append(f"epoch {p.epoch}" + (f" of {p.epochs}" if p.epochs is not None else ""))
        if p.step is not None:
            parts.append(f"step {p.step}" + (f" of {p.steps_per_epoch}" if p.steps_per_epoch else ""))
        if p.global_step is not None:
            total = p.epochs * p.steps_per_epoch if p.epochs and p.steps_per_epoch else None
            parts.append(f"{p.global_step}" + (f" of {total}" if total else "") + " steps in all")
        if p.phase == "validate":
            parts.append("validating" + (f" (step {p.validation_step})" if p.validation_step is not None else ""))
        return ", ".join(parts) or None

    def eta_text(self) -> str | None:
        eta = self.eta_s()
        if eta is None:
            return None
        speed = f"  ({self.epoch_s:.1f}s per epoch)" if self.epoch_s is not None else ""
        return f"about {duration(eta)} left{speed}"

    def last_metrics_text(self) -> str | None:
        return metrics_text(self.metrics[-1]) if self.metrics else None

    def rows(self) -> list[tuple[str, str]]:
        rows = [
            (label, text)
            for label, text in (
                ("progress", self.progress_text()),
                ("eta", self.eta_text()),
                ("last metrics", self.last_metrics_text()),
            )
            if text
        ]
        return rows

    def to_json(self) -> dict[str, Any]:
        return {
            "progress": self.progress.to_json() if self.progress else None,
            "eta_s": None if (eta := self.eta_s()) is None else round(eta, 1),
            "last_metrics": self.metrics[-1] if self.metrics else None,
        }


def metrics_text(line: dict[str, Any], limit: int = 8, *, say_more: bool = True) -> str:
    """One metrics line: 'epoch 2: loss 0.0712, accuracy 0.9781, val_loss 0.0601, val_accuracy 0.9810'."""
    keys = [k for k in _FIRST if k in line] + [k for k in line if k not in _FIRST and k not in _NOT_METRICS]
    parts = []
    for key in keys:
        value = number(line.get(key))
        if value is not None:
            parts.append(f"{one_line(key, 40)} {rounded(value)}")
    text = ", ".join(parts[:limit])
    if len(parts) > limit and say_more:
        text += f", … ({len(parts) - limit} more)"
    label = "epoch" if line.get("epoch") is not None else "step"
    position = line.get(label)
    if position is None:
        return text or "-"
    return f"{label} {one_line(position, 20)}" + (f": {text}" if text else "")


def standing(progress: Progress | None, metrics: list[dict[str, Any]], now: float | None = None) -> Standing:
    return Standing(progress, metrics, time.time() if now is None else now)
