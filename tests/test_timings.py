"""The runner's timings ($RUNNER_TIMINGS), and the job cadences they hand to the job's container through the plan."""

from __future__ import annotations

import subprocess
import sys

import pytest

from runner import contract
from runner.backends import plan_local
from runner.errors import UsageError
from runner.spec.loader import load_spec_text
from runner.timings import Timings
from tests.environ import child_env

SPEC = "name: t\nimage: trainer:test\ncommand: [python, -c, 'print(1)']\nstorage: /tmp/timings-test\n"


def test_timings_from_the_environment_and_a_bad_one_is_a_usage_error() -> None:
    timings = Timings.from_env({"RUNNER_TIMINGS": "api_poll_s=0.2, job_sync_s=0.5,job_progress_s=0.25"})
    assert (timings.api_poll_s, timings.job_sync_s, timings.job_progress_s) == (0.2, 0.5, 0.25)
    assert timings.job_heartbeat_s == contract.CADENCES[contract.HEARTBEAT_S]
    for bad in ("job_sync_s=0", "job_sync_s=fast", "job_sink_s=1"):
        with pytest.raises(UsageError) as caught:
            Timings.from_env({"RUNNER_TIMINGS": bad})
        assert caught.value.exit_code == 2 and "job_sync_s" in (caught.value.hint or "")


def test_the_plan_gives_the_job_the_cadences_that_are_not_its_defaults() -> None:
    spec = load_spec_text(SPEC)
    assert not {contract.SYNC_S, contract.HEARTBEAT_S, contract.PROGRESS_S} & set(plan_local(spec, None).env)
    fast = Timings(job_sync_s=0.5, job_heartbeat_s=0.5, job_progress_s=0.25)
    env = plan_local(spec, None, timings=fast).env
    assert (env[contract.SYNC_S], env[contract.HEARTBEAT_S], env[contract.PROGRESS_S]) == ("0.5", "0.5", "0.25")
    assert {k for k in Timings(job_sync_s=1).job_env()} == {contract.SYNC_S}


def test_the_container_reads_its_cadences_and_falls_back_on_a_malformed_one() -> None:
    assert contract.cadence(contract.SYNC_S, {contract.SYNC_S: "0.5"}) == 0.5
    for bad in ("", "soon", "-1", "0", "inf", "nan"):
        assert contract.cadence(contract.SYNC_S, {contract.SYNC_S: bad}) == contract.CADENCES[contract.SYNC_S]
    # keras_callbacks' and runner.metrics' progress writers read it as the job starts
    shown = subprocess.run(
        [sys.executable, "-c", "from runner import metrics; print(metrics.PROGRESS_EVERY_S)"],
        env={**child_env(), contract.PROGRESS_S: "0.25"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert shown.stdout.strip() == "0.25"
