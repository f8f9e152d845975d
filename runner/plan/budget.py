"""The most a run may cost, decided before anything is created: max_runtime x the catalog's price, and `budget:`.

A TPU bills while it is READY, so a run's worst case is its whole max_runtime on the machine. A budget caps that:

    max_runtime set in the spec    its worst case must fit the budget, or the plan is refused (PlanError naming both)
    max_runtime left at its default (24 h)
                                   the budget sets the deadline instead: budget / price per hour, when that is earlier

The deadline is the earlier of max_runtime and budget / price, counted from the submit: time spent waiting for
capacity counts against it though it bills nothing, so a run never bills more than its budget (the teardown's own
seconds aside). A local run pays for no TPU: its budget is not applied.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from runner.errors import PlanError
from runner.spec import JobSpec

MIN_RUNTIME_S = 60  # teardown.max_runtime's own floor


def money(usd: float) -> str:
    """$1,234.56; a figure under a cent keeps four decimals (an emulator run, a one-minute job), never "$0.00"."""
    if usd != 0 and abs(usd) < 0.01:
        return f"${usd:.4f}"
    return f"${usd:,.2f}"


def duration(seconds: float) -> str:
    """45s, 12m30s, 3h05m, 24h, 3d04h: short, and exact enough for a plan row or a table."""
    if seconds <= 0:
        return "0s"
    if seconds < 10:
        return f"{max(seconds, 0.0):.1f}s"
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s" if s % 60 else f"{s // 60}m"
    if s <= 2 * 86400:  # "24h", the default max_runtime, reads plainer than "1d"
        return f"{s // 3600}h{s % 3600 // 60:02d}m" if s % 3600 // 60 else f"{s // 3600}h"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h" if s % 86400 // 3600 else f"{s // 86400}d"


def seconds_for(budget: float, price_per_hour: float) -> int:
    """The whole seconds `budget` buys at `price_per_hour` (never a second more)."""
    return math.floor(budget / price_per_hour * 3600) if price_per_hour > 0 else 0


@dataclass(frozen=True)
class RuntimeLimit:
    """How long a run may take, and why: what the plan says and the deadline it sets."""

    seconds: int  # the effective max_runtime
    by: str  # "max_runtime" | "budget"
    price_per_hour: float  # USD; 0 for a machine that costs nothing here (local)
    budget: float | None
    max_runtime: int  # as the spec has it
    default_max_runtime: bool  # the spec left max_runtime at its default

    @property
    def max_cost(self) -> float:
        return self.price_per_hour * self.seconds / 3600


def runtime_limit(spec: JobSpec, price_per_hour: float) -> RuntimeLimit:
    """The run's limit at `price_per_hour`. Raises PlanError when a max_runtime set in the spec can cost more than
    the budget, or when the budget buys less than a minute."""
    max_runtime = spec.teardown.max_runtime
    default = "max_runtime" not in spec.teardown.model_fields_set
    budget = spec.budget
    limit = RuntimeLimit(max_runtime, "max_runtime", price_per_hour, budget, max_runtime, default)
    if budget is None or price_per_hour <= 0:
        return limit
    affordable = seconds_for(budget, price_per_hour)
    if affordable >= max_runtime:
        return limit
    if affordable < MIN_RUNTIME_S:
        raise PlanError(
            f"budget {money(budget)} buys only {duration(affordable)} at {money(price_per_hour)}/hour: a run needs at "
            "least a minute",
            hint="raise `budget` (or --budget)",
        )
    if not default:
        raise PlanError(
            f"budget {money(budget)} is less than max_runtime {duration(max_runtime)} can cost: "
            f"{money(price_per_hour * max_runtime / 3600)} at {money(price_per_hour)}/hour",
            hint=f"raise `budget`, or lower teardown.max_runtime to {duration(affordable)} or less (or leave "
            "max_runtime out: the budget then sets the deadline)",
        )
    return RuntimeLimit(affordable, "budget", price_per_hour, budget, max_runtime, default)


def limited(spec: JobSpec, limit: RuntimeLimit) -> JobSpec:
    """The spec with the limit's max_runtime: the deadline, the VM's own watchdog and the job's safety net all read
    it from there, and spec.yaml in the run directory says what was enforced."""
    if limit.seconds == spec.teardown.max_runtime:
        return spec
    teardown = spec.teardown.model_copy(update={"max_runtime": limit.seconds})
    return spec.model_copy(update={"teardown": teardown})


def plan_rows(limit: RuntimeLimit | None, *, local: bool, attached: bool = False) -> list[tuple[str, str]]:
    """What the plan says of the money, plainly: the most this run can cost, and what caps it."""
    if limit is None:
        return []
    if local or limit.price_per_hour <= 0:
        if limit.budget is None:
            return []
        return [("budget", f"{money(limit.budget)}: not applied (a local run pays for no TPU)")]
    price = f"{money(limit.price_per_hour)}/hour"
    whose = "  (an attached node bills whether or not a run uses it)" if attached else ""
    if limit.by == "budget":
        assert limit.budget is not None
        text = (
            f"{money(limit.budget)}: the run is stopped after {duration(limit.seconds)} (budget / {price}), before "
            f"the default max_runtime of {duration(limit.max_runtime)}"
        )
        return [("budget", text + whose)]
    cost = money(limit.max_cost)
    if limit.budget is not None:
        return [("budget", f"{money(limit.budget)}: max_runtime {duration(limit.seconds)} costs at most {cost}{whose}")]
    if limit.default_max_runtime:
        text = (
            f"{cost} if it runs for the whole default max_runtime of {duration(limit.seconds)} at {price}; "
            "cap it with `budget:` (--budget) or teardown.max_runtime"
        )
        return [("max cost", text + whose)]
    return [("max cost", f"{cost}: max_runtime {duration(limit.seconds)} at {price}; no budget set{whose}")]
