"""Numbers as a person reads them in `runner status`, `list`, the end of `submit` and the report: a metric rounded
for a table, a metrics line in one line. Durations and money are the planner's (runner.plan.budget: duration,
money), which collect shares. `--json` and the run directory keep every number whole.
"""

from __future__ import annotations

import math
from typing import Any

from runner.watch.logtext import one_line
from runner.watch.rundir import number

# Keys of a metrics line shown first, in this order; other numbers follow.
_FIRST = ("loss", "accuracy", "val_loss", "val_accuracy")
_NOT_METRICS = {"epoch", "time", "step", "global_step", "epoch_time_s", "examples_per_s", "resumed_at_step"}


def rounded(value: Any) -> str:
    """A number as a table shows it: integers whole, floats to 4 decimals (0.9712, 2.3026), whole from 1000 on
    (1777), 3 significant digits below 0.001 (1.23e-05). Anything else as one line."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return one_line(value, 100)
    if isinstance(value, int) or not math.isfinite(value):
        return str(value)
    size = abs(value)
    if size >= 1000:
        return f"{value:.0f}"
    if size >= 1e-3 or value == 0:
        return f"{value:.4f}"
    return f"{value:.3g}"


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
