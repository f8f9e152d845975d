"""A JAX/Orbax job on a pod slice (examples/flax_mnist on a Spot v4-16, 2 hosts): its checkpoints in the one location
both hosts write (RUNNER_SHARED_CHECKPOINT_DIR, in the bucket), preempted once a step is committed there. Both hosts
stop at the step they agree on (jax_loop) and save it, and the recreated slice goes on from it: the attempts
together train the uninterrupted run's optimizer steps."""

from __future__ import annotations

import re
from pathlib import Path

from faults import checks
from faults.context import Ctx
from faults.result import RunResult
from faults.scenario import MULTI_HOST_ZONE, Command, Scenario
from runner import contract
from runner.checkpoints import Listing, survey

TRAIN = Path(__file__).resolve().parents[2] / "examples" / "flax_mnist" / "train.py"
STEPS = 400  # a step committed every 20: the preemption lands with most of the run still to train
# Orbax saves the first step whatever its interval; the step at 40 comes once the train and eval steps are compiled,
# so the preemption finds the loop in its stride, not in start-up.
PREEMPT_FROM = 40
SPOT_NOTICE_S = 30.0  # a Spot VM's time from the preemption's SIGTERM to power-off (runner.launch.bootstrap)


def spot_notice(ctx: Ctx) -> None:
    """The emulated VMs get a Spot VM's 30 s between SIGTERM and SIGKILL (the suite's default is 10 s): the agreed
    step's save is written and committed within it, as on Cloud TPU."""
    ctx.emulator.vm_grace_s = SPOT_NOTICE_S


def preempt_at_a_shared_step(ctx: Ctx) -> None:
    """Preempt the slice once the bucket's shared location holds a committed Orbax step from PREEMPT_FROM on."""

    def committed() -> str | None:
        store = ctx.storage()
        if store is None:
            return None
        shared = Listing.of_storage(store, contract.SHARED_CHECKPOINTS + "/", root=contract.CHECKPOINTS + "/")
        steps = [s.step for s in survey(shared).committed() if s.step is not None]
        return ctx.ready_node() if steps and max(steps) >= PREEMPT_FROM else None

    node = ctx.wait_for(committed, timeout=ctx.case.timeout_s, interval=0.2)
    if node is None:
        ctx.problem(f"never saw a committed step {PREEMPT_FROM} or later in checkpoints/shared on a READY slice")
        return
    ctx.preempt(node, at_checkpoint=0, bucket=[])


def agreed_step_kept(ctx: Ctx, result: RunResult) -> None:
    """The next attempt went on from the step the hosts agreed on, redoing none ('0 steps redone': the step the job
    reached, by its progress.json, is the one saved), the hosts' own word of that stop agrees where their logs
    reached the bucket before the VMs went, and both ended at STEPS optimizer steps (the optimizer's own count,
    restored with the model)."""
    store = ctx.storage()
    logs = [(store.read_bytes(contract.log_key(w)) or b"").decode() if store else "" for w in (0, 1)]
    resumed = re.search(r"\[runner\] resumed from step (\d+) \(Orbax, checkpoints/shared/\1\); 0 steps redone", logs[0])
    if resumed is None:
        said = [line for line in logs[0].splitlines() if "[runner]" in line][-6:]
        result.problems.append(f"worker 0's log does not say the run resumed from the agreed step: {said}")
        return
    step = resumed.group(1)
    stopped = {m.group(1) for log in logs if (m := re.search(r"agreed to stop: stopped at step (\d+)", log))}
    if stopped - {step}:
        result.problems.append(f"the hosts stopped at step(s) {sorted(stopped)}, the run resumed from {step}")
    if not all(f"done: {STEPS} optimizer steps" in log for log in logs):
        result.problems.append(f"not every host ended at {STEPS} optimizer steps")
    result.notes.append(f"resumed from step {step}, none redone; {STEPS} optimizer steps in all")


CASES = (
    Scenario(
        "preempt-jax-orbax-pod",
        "spot preemption of a JAX/Orbax job on a pod slice",
        "succeeded",
        0,
        job=Command(("python", str(TRAIN), "--train-steps", str(STEPS), "--eval-every", "20")),
        spot=True,
        accelerator="v4-16",
        zones=(MULTI_HOST_ZONE,),
        setup=(spot_notice,),
        during=(preempt_at_a_shared_step,),
        checks=(checks.preemptions(1), agreed_step_kept),
    ),
)
