"""How a run's state is derived from its exit records, the runner's record and the heartbeat (pure logic)."""

from __future__ import annotations

import time

import pytest

from runner.status import RunState, Snapshot, WorkerExit, derive_state


def snap(*states: str, heartbeat_age: float | None = None, phase: str = "running") -> Snapshot:
    exits = [WorkerExit(i, RunState(s), 0 if s == "succeeded" else 1, time.time()) for i, s in enumerate(states)]
    beat = None if heartbeat_age is None else {"time": time.time() - heartbeat_age, "phase": phase}
    return Snapshot(exits, beat, [], None)


def state(s: Snapshot, workers: int = 1, recorded: RunState = RunState.STARTING, alive: bool | None = None) -> RunState:
    return derive_state(s, workers, recorded, machine_alive=alive, heartbeat_timeout_s=30)


def test_exit_records_decide() -> None:
    assert state(snap("succeeded")) == RunState.SUCCEEDED
    assert state(snap("failed")) == RunState.FAILED


def test_worst_worker_names_the_run() -> None:
    assert state(snap("succeeded", "failed"), workers=2) == RunState.FAILED
    assert state(snap("succeeded", "cancelled", "timed_out"), workers=3) == RunState.CANCELLED


def test_one_failed_worker_ends_a_multi_worker_run_early() -> None:
    assert state(snap("failed", heartbeat_age=1), workers=4) == RunState.FAILED
    assert state(snap("succeeded", heartbeat_age=1), workers=4) == RunState.RUNNING


def test_recorded_terminal_state_without_exit_records() -> None:
    assert state(snap(), recorded=RunState.CANCELLED) == RunState.CANCELLED


def test_the_runners_verdict_stands_but_lost_can_be_overturned() -> None:
    # Given up after its last preemption: the workers recorded `cancelled` as the VM shut down.
    assert state(snap("cancelled"), recorded=RunState.FAILED) == RunState.FAILED
    assert state(snap("failed"), recorded=RunState.CANCELLED) == RunState.CANCELLED
    # Declared lost, then the machine's records arrived after all.
    assert state(snap("succeeded"), recorded=RunState.LOST) == RunState.SUCCEEDED


@pytest.mark.parametrize(
    ("age", "alive", "expected"),
    [
        (1, None, RunState.RUNNING),
        (300, None, RunState.STARTING),
        (None, True, RunState.STARTING),
        (300, True, RunState.RUNNING),
        (300, False, RunState.LOST),
        (None, False, RunState.LOST),
    ],
)
def test_heartbeat_and_machine(age: float | None, alive: bool | None, expected: RunState) -> None:
    assert state(snap(heartbeat_age=age), alive=alive) == expected


def test_exited_heartbeat_is_not_alive() -> None:
    assert state(snap(heartbeat_age=1, phase="exited"), alive=False) == RunState.LOST


def test_terminal_states() -> None:
    assert {s for s in RunState if s.is_terminal()} == {
        RunState.SUCCEEDED,
        RunState.FAILED,
        RunState.CANCELLED,
        RunState.TIMED_OUT,
        RunState.LOST,
    }
