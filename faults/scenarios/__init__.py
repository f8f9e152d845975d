"""Every fault case, by theme. A new case is a Scenario in the module of its theme (or a new module listed here)."""

from __future__ import annotations

from faults.scenario import Scenario
from faults.scenarios import (
    api_errors,
    capacity,
    clocks,
    compute_engine,
    deadlines,
    gke,
    jax_pod,
    ownership,
    preemption,
    runner_death,
    storage,
    teardown,
)

CASES: tuple[Scenario, ...] = (
    *preemption.CASES,
    *jax_pod.CASES,
    *capacity.CASES,
    *api_errors.CASES,
    *runner_death.CASES,
    *storage.CASES,
    *deadlines.CASES,
    *teardown.CASES,
    *clocks.CASES,
    *compute_engine.CASES,
    *gke.CASES,
    *ownership.CASES,
)


def case_named(name: str) -> Scenario:
    for case in CASES:
        if case.name == name:
            return case
    raise KeyError(f"no case {name!r}; known: {', '.join(c.name for c in CASES)}")
