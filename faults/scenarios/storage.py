"""Cloud Storage trouble: 503s on uploads and reads, and a bucket damaged while a preempted node is recreated."""

from __future__ import annotations

from faults import actions, checks
from faults.context import Ctx
from faults.scenario import Scenario, Train


def _fail_exit_check(ctx: Ctx) -> None:
    """One 503 to the VM's check of its exit record. The runner's listings of exit/ are answered 3 s late, so that
    the VM makes its check before the runner, having seen the record, deletes the node under it."""
    assert ctx.proxy is not None
    ctx.proxy.fail_requests(r"/o/.+/exit/worker-0\.json$", 1, method="GET")
    ctx.proxy.slow_answers(r"[?&]prefix=[^&]*/exit/", 3.0, method="GET")


# 6 epochs of 1024 steps (a few seconds each): two checkpoints reach the bucket while epochs are left to train.
_RESUMABLE = Train(epochs=6, examples=16384, batch_size=16)

CASES = (
    Scenario(
        "gcs-5xx-checkpoint",
        "GCS 503 x2 on every checkpoint upload",
        "succeeded",
        0,
        job=Train(epochs=4, examples=8192),
        gcs_faults=2,
        checks=(checks.gcs_faults,),
    ),
    Scenario(
        "gcs-5xx-exit-check",
        "GCS 503 on the VM's exit-record check (1)",
        "succeeded",
        0,
        proxy=True,
        runner_via_proxy=True,
        setup=(_fail_exit_check,),
        checks=(checks.exit_record,),
        fast=True,
    ),
    Scenario(
        "torn-checkpoint",
        "newest checkpoint torn while the node is recreated",
        "succeeded",
        0,
        job=_RESUMABLE,
        spot=True,
        during=(actions.preempt_then_while_recreating(actions.tear_newest_checkpoint),),
        checks=(checks.preemptions(1), checks.resumed_past_torn_checkpoint),
    ),
    Scenario(
        "broken-manifest",
        "latest.json garbage while the node is recreated",
        "succeeded",
        0,
        job=_RESUMABLE,
        spot=True,
        during=(actions.preempt_then_while_recreating(actions.break_manifest),),
        checks=(checks.preemptions(1), checks.resumed_by_scan),
    ),
)
