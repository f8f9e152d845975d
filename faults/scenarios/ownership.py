"""One run, one owner: `runner down` while the submitter waits for its machine to be created (a TPU node; a Compute
Engine slice's group), and two `runner resume RUN` at once, made to race by construction (the storage emulator
holds both resumers' writes of the run's lease until both are in flight)."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from faults import actions
from faults.scenario import Command, Hook, Scenario, Train

if TYPE_CHECKING:
    from faults.context import Ctx
    from faults.result import RunResult

SLICE_ZONE = "us-central1-c"  # TPU7x's zone in the compute-engine backend's catalog slice


def down_when(what: str, ready: Callable[[Ctx], bool]) -> Hook:
    """During: `runner down RUN` from another shell once `ready`, the submitter still alive and waiting."""

    def during(ctx: Ctx) -> None:
        if ctx.wait_for(lambda: ready(ctx) or None, timeout=ctx.case.timeout_s) is None:
            ctx.problem(f"never saw {what}: `runner down` was not run")
            return
        ctx.note(f"`runner down` with the submitter alive, {what}")
        actions.runner_down(ctx)

    return during


def stopped_by_down(ctx: Ctx, result: RunResult) -> None:
    """The submitter ended at once, the run `cancelled` for the reason its record gives, never blamed on the API."""
    said = (ctx.home.parent / "runner.out").read_text(errors="replace")
    reason = ctx.run_record().get("reason")
    if reason != "stopped by runner down":
        result.problems.append(f"the run's reason is {reason!r}, not 'stopped by runner down'")
    if "through every retry" in said:
        result.problems.append("the submitter blamed the API for a machine `runner down` deleted")
    if ctx.case.accelerator == "v2-8" and ctx.accepted_creates() != 1:  # a TPU node (the Cloud TPU API)
        result.problems.append(f"{ctx.accepted_creates()} node creates: a deleted create was made again")


def resume_twice_at_once(ctx: Ctx) -> None:
    """After: two `runner resume RUN` at once. Both read the run resumable and its lease free; the storage emulator
    holds their writes of the lease until both are in flight, then one wins: the other is refused (exit 2) with
    who holds the run. The winner's exit and output are the case's numbers."""
    if ctx.run_id is None or ctx.storage_server is None:
        ctx.problem("no run, or no storage emulator to hold the lease's writes: the race was not run")
        return
    hold = ctx.storage_server.hold_writes(rf"runs/{re.escape(ctx.run_id)}/owner\.json$", parties=2)
    creates = ctx.accepted_creates()
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "runner.cli", "resume", ctx.run_id],
            env=ctx.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=ctx.case.timeout_s)[0] for p in procs]
    ctx.numbers["resume_exits"] = [p.returncode for p in procs]
    ctx.numbers["resume_pids"] = [p.pid for p in procs]
    ctx.numbers["resume_outputs"] = [out.strip().splitlines()[-3:] for out in outs]
    ctx.numbers["lease_writes_held"] = hold.arrived
    ctx.numbers["resume_creates"] = ctx.accepted_creates() - creates
    refused = [out for out, p in zip(outs, procs, strict=True) if p.returncode == 2]
    said = refused[0][-200:] if refused else "-"
    ctx.note(f"two resumes at once: exits {[p.returncode for p in procs]}; refused: {said}")


def one_owner(ctx: Ctx, result: RunResult) -> None:
    exits, pids = ctx.numbers.get("resume_exits") or [], ctx.numbers.get("resume_pids") or []
    if ctx.numbers.get("lease_writes_held") != 2:
        result.problems.append("the two resumers were not both in flight when the lease was taken: no race")
    if sorted(exits) != [0, 2]:
        result.problems.append(f"the two resumes exited {exits}: expected one to run (0) and one refused (2)")
        return
    winner = pids[exits.index(0)]
    refused = " ".join(ctx.numbers["resume_outputs"][exits.index(2)])
    if f"(pid {winner})" not in refused:
        result.problems.append(f"the refused resume did not name the one that holds the run: {refused}")
    if ctx.numbers.get("resume_creates") != 1:
        result.problems.append(f"the resumes created {ctx.numbers.get('resume_creates')} nodes, not 1")


CASES = (
    # The node stays CREATING; `runner down` deletes it while the submitter waits for it.
    Scenario(
        "down-while-creating",
        "`runner down` while the node is CREATING, submitter alive",
        "cancelled",
        130,
        setup=(lambda ctx: ctx.emulator.slow_create(300, count=1),),
        during=(down_when("the node CREATING", actions.node_creating),),
        checks=(stopped_by_down,),
        fast=True,
        timeout_s=120,  # done in seconds; the old wait took the API's retries, then blamed it
    ),
    # The slice's VMs stay PROVISIONING; `runner down` deletes the group, its template and policy.
    Scenario(
        "ce-down-while-creating-slice",
        "Compute Engine: `runner down` while the 2x2x2 slice's group is created, submitter alive",
        "cancelled",
        130,
        job=Command(),
        accelerator="tpu7x-16",
        zones=(SLICE_ZONE,),
        setup=(lambda ctx: ctx.emulator.compute.slow_create(300),),
        during=(down_when("the slice's VMs PROVISIONING", actions.ce_creating),),
        checks=(stopped_by_down,),
        fast=True,
        timeout_s=120,  # the old wait for the group's VMs lasted until max_runtime (24 h)
    ),
    # A training run stopped by `runner down` after its first checkpoint, then resumed twice at once.
    Scenario(
        "resume-race",
        "two `runner resume` at once after `runner down`",
        "succeeded",
        130,
        job=Train(epochs=4, examples=8192, batch_size=16),  # epochs of 512 steps: `runner down` comes mid-training
        during=(down_when("the first checkpoint in the bucket", actions.first_checkpoint),),
        after=(resume_twice_at_once,),
        checks=(one_owner,),
    ),
)
