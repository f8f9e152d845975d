"""A VM whose clock is wrong: what it writes carries its clock, and the run's cost must still be the truth, with
the runner following the run to its end, and with the runner gone (the VM finishes alone: only its own events say
when its node went)."""

from __future__ import annotations

from faults import actions, checks
from faults.context import Ctx
from faults.scenario import Command, Hook, Scenario

# About 6 s of work, as in the run that was once charged for an hour.
_SIX_SECONDS = ("python", "-c", "import time\nfor i in range(6):\n    print('working', i, flush=True); time.sleep(1)")


def skew(seconds: int) -> Hook:
    def setup(ctx: Ctx) -> None:
        ctx.emulator.clock_skew(seconds)
        ctx.clock_skew_s = seconds

    return setup


CASES = (
    Scenario(
        "clock-ahead",
        "the VM's clock 1 h ahead",
        "succeeded",
        0,
        job=Command(_SIX_SECONDS),
        setup=(skew(3600),),
        checks=(checks.cost_within(1.0),),
        fast=True,
    ),
    Scenario(
        "clock-behind",
        "the VM's clock 10 min behind",
        "succeeded",
        0,
        job=Command(_SIX_SECONDS),
        setup=(skew(-600),),
        checks=(checks.cost_within(1.0),),
        fast=True,
    ),
    Scenario(
        "clock-ahead-alone",
        "the VM's clock 1 h ahead, the runner gone",
        "succeeded",
        -9,
        job=Command(_SIX_SECONDS),
        setup=(skew(3600),),
        during=(actions.kill_runner_after("the job's heartbeat", actions.job_running),),
        after=(actions.vm_finishes_alone,),
        checks=(checks.cost_within(1.0),),
        fast=True,
    ),
    Scenario(
        "clock-behind-alone",
        "the VM's clock 10 min behind, the runner gone",
        "succeeded",
        -9,
        job=Command(_SIX_SECONDS),
        setup=(skew(-600),),
        during=(actions.kill_runner_after("the job's heartbeat", actions.job_running),),
        after=(actions.vm_finishes_alone,),
        checks=(checks.cost_within(1.0),),
        fast=True,
    ),
)
