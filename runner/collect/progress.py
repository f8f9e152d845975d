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

from runner.collect.figures import metrics_text
from runner.plan.budget import duration
from runner.watch.rundir import Progress, number


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


def standing(progress: Progress | None, metrics: list[dict[str, Any]], now: float | None = None) -> Standing:
    return Standing(progress, metrics, time.time() if now is None else now)
