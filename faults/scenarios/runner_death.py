"""The runner SIGKILLed: the VM carries on alone, or `runner down` from another shell cleans up."""

from __future__ import annotations

from faults import actions, checks
from faults.scenario import LONG_COMMAND, Command, Scenario, Train

CASES = (
    Scenario(
        "runner-sigkill",
        "runner SIGKILL mid-training",
        "succeeded",
        -9,
        job=Train(epochs=6, examples=16384),
        during=(actions.kill_runner_after("the first checkpoint in the bucket", actions.first_checkpoint),),
        after=(actions.vm_finishes_alone,),
        checks=(checks.status_after_kill,),
    ),
    Scenario(
        "lost-heartbeat",
        "runner lost (heartbeat timeout 60s)",
        "cancelled",
        -9,
        job=Command(LONG_COMMAND),
        teardown={"runner_heartbeat_timeout": "60s"},
        during=(actions.kill_runner_after("the job's heartbeat", actions.job_running),),
        after=(actions.vm_finishes_alone,),
        checks=(checks.status_after_kill, checks.safety_stop),
    ),
    # The node stays CREATING for 30 s; the runner dies in it; `runner down RUN` deletes the node before it boots.
    Scenario(
        "runner-kill-creating",
        "runner SIGKILL while CREATING, then `runner down`",
        "cancelled",
        -9,
        setup=(lambda ctx: ctx.emulator.slow_create(30, count=1),),
        during=(actions.kill_runner_after("the node CREATING", actions.node_creating),),
        after=(actions.runner_down,),
        checks=(checks.deleted_while_creating,),
        fast=True,
    ),
)
