"""Cloud Storage trouble: 503s on uploads and reads, a bucket damaged while a preempted node is recreated, Cloud
Storage out of reach (reset, black-holed, the bucket deleted) while the run needs it, and a job's output that grows."""

from __future__ import annotations

import hashlib

from faults import actions, checks
from faults.context import Ctx
from faults.scenario import LONG_COMMAND, Command, Scenario, Train


def _fail_exit_check(ctx: Ctx) -> None:
    """One 503 to the VM's check of its exit record. The runner's listings of exit/ are answered 3 s late, so that
    the VM makes its check before the runner, having seen the record, deletes the node under it."""
    assert ctx.proxy is not None
    ctx.proxy.fail_requests(r"/o/.+/exit/worker-0\.json$", 1, method="GET")
    ctx.proxy.slow_answers(r"[?&]prefix=[^&]*/exit/", 3.0, method="GET")


# 6 epochs of 1024 steps (a few seconds each): two checkpoints reach the bucket while epochs are left to train.
_RESUMABLE = Train(epochs=6, examples=16384, batch_size=16)

# Prints for 200 s: longer than a 150 s outage that starts once its heartbeat is in the bucket.
_RUNS_200S = ("python", "-c", "import time\nfor i in range(200):\n    print('working', i, flush=True); time.sleep(1)")
# 20 MB of output over about 40 s: 200 blocks of 1000 numbered 100-byte lines, one block every 0.2 s.
_LOG_LINES, _LINE = 200_000, "{:08d} " + "x" * 90 + "\n"
_LOG_20MB = (
    "python",
    "-c",
    "import sys, time\n"
    "for b in range(200):\n"
    f"    sys.stdout.write(''.join({_LINE!r}.format(b * 1000 + i) for i in range(1000)))\n"
    "    sys.stdout.flush(); time.sleep(0.2)",
)
_LOG_TEXT = "".join(_LINE.format(i) for i in range(_LOG_LINES))

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
        checks=(checks.preemptions(1), checks.resumed_past_torn_checkpoint, checks.lost_work),
    ),
    Scenario(
        "broken-manifest",
        "latest.json garbage while the node is recreated",
        "succeeded",
        0,
        job=_RESUMABLE,
        spot=True,
        during=(actions.preempt_then_while_recreating(actions.break_manifest),),
        checks=(checks.preemptions(1), checks.resumed_by_scan, checks.lost_work),
    ),
    # The runner and the VM lose Cloud Storage (no answer at all) for 150 s while the job runs: longer than the
    # runner's read retries (120 s) and the heartbeat window. Nothing is judged from silence.
    Scenario(
        "gcs-blackhole",
        "Cloud Storage black-holed for 150 s mid-run",
        "succeeded",
        0,
        job=Command(_RUNS_200S),
        proxy=True,
        runner_via_proxy=True,
        during=(actions.outage_after("the job's heartbeat", actions.job_running, "blackhole", 150),),
        checks=(checks.nothing_deleted_early,),
        timeout_s=480,
    ),
    # The runner is gone; Cloud Storage refuses every connection; `runner down` must still delete the node.
    Scenario(
        "down-gcs-unreachable",
        "`runner down` while Cloud Storage is unreachable",
        "cancelled",
        -9,
        job=Command(LONG_COMMAND),
        proxy=True,
        runner_via_proxy=True,
        during=(actions.kill_runner_after("the job's heartbeat", actions.job_running),),
        after=(actions.down_with_storage("reset"),),
        checks=(checks.down_deleted_first,),
    ),
    Scenario(
        "down-bucket-gone",
        "`runner down` after the run's bucket was deleted",
        "cancelled",
        -9,
        job=Command(LONG_COMMAND),
        own_bucket=True,
        during=(actions.kill_runner_after("the job's heartbeat", actions.job_running),),
        after=(actions.down_with_storage("bucket gone"),),
        checks=(checks.down_deleted_first,),
    ),
    # The bucket goes while the node is CREATING (15 s): the runner deletes the node and fails the run (exit 4).
    Scenario(
        "bucket-gone-booting",
        "the run's bucket deleted while the node is CREATING",
        "failed",
        4,
        own_bucket=True,
        setup=(lambda ctx: ctx.emulator.slow_create(15, count=1),),
        during=(actions.delete_bucket_while_creating,),
        timeout_s=120,
    ),
    Scenario(
        "log-20mb",
        "20 MB of job output in 40 s",
        "succeeded",
        0,
        job=Command(_LOG_20MB),
        proxy=True,
        checks=(checks.log_upload_volume(len(_LOG_TEXT), hashlib.sha256(_LOG_TEXT.encode()).hexdigest()),),
    ),
)
