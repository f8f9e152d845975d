"""RunResult: one run of one case, measured. The suite fills it, checks add to it, the table prints it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from faults.measure import StepsLost


@dataclass
class RunResult:
    case: str
    fault: str
    expected: str  # the expected terminal state, or "rejected"
    got: str
    exit_code: int | None
    expected_exit: int
    as_expected: bool
    nodes_leaked: int
    checkpoints_lost: int | None  # None: the case trains nothing
    epochs_redone: int | None
    partial_epochs: int | None
    idle_s: list[float | None] = field(default_factory=list)  # one per VM that ran the job
    idle_preempted_s: list[float | None] = field(default_factory=list)  # VMs stopped by a preemption
    steps_lost: list[StepsLost] | None = None  # one per restart of the trainer; None: the case trains nothing
    recovered: list[str] = field(default_factory=list)  # what each restart resumed from (and what it skipped)
    others_nodes: int = 0  # nodes left that are not this run's (another run's, planted by the case): never leaked
    idle_goal: bool = True  # held to the idle goal (Scenario.idle_goal): the longest idle time counts only these
    numbers: dict[str, Any] = field(default_factory=dict)  # the case's own measurements (accuracies, delays ...)
    wall_s: float = 0.0
    run_id: str | None = None
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def idle_max(self) -> float | None:
        values = [v for v in self.idle_s + self.idle_preempted_s if v is not None]
        return max(values) if values else None

    @property
    def idle_undeleted(self) -> int:
        return sum(1 for v in self.idle_s + self.idle_preempted_s if v is None)

    @property
    def ok(self) -> bool:
        """What makes the suite's exit status 1 when false."""
        return self.as_expected and not self.nodes_leaked and not self.checkpoints_lost
