"""teardown.policy at a run's end: whether its machine is deleted (always, on_success, never)."""

from __future__ import annotations

from runner.watch.state import RunState


def should_delete(policy: str, state: RunState, attached: bool) -> bool:
    """on_success keeps a failed machine for debugging; a safety stop (timed out, hung) never keeps one."""
    if attached or policy == "never":
        return False
    if policy == "on_success":
        return state not in (RunState.FAILED, RunState.LOST)
    return True
