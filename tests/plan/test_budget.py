"""`budget:` (and --budget): a max_runtime that could cost more is refused at plan time (exit 2, both figures
named); a default max_runtime is cut to what the budget buys, and that is the deadline everywhere."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from runner import contract
from runner.backends import plan_cloud, plan_local
from runner.cli import app
from runner.errors import PlanError, SpecError
from runner.plan import catalog
from runner.plan.budget import plan_rows
from runner.spec import JobSpec
from runner.spec.loader import load_spec_text

NO_GCLOUD = {"CLOUDSDK_CONFIG": "/nonexistent"}
IMAGE = "us-central1-docker.pkg.dev/my-project/tpu-runner/trainer:v1"
PER_HOUR = catalog.accelerator("v5litepod-8").price_per_hour(spot=False)


def spec(**extra: object) -> JobSpec:
    return JobSpec.model_validate(
        {
            "name": "job",
            "image": IMAGE,
            "training": {"epochs": 1},
            "storage": "gs://my-bucket/p",
            "accelerator": {"type": "v5litepod-8", "zone": "us-west4-a", "project": "my-project"},
            **extra,
        }
    )


def test_budget_reads_dollars_and_refuses_anything_else() -> None:
    assert spec(budget="$1,200.50").budget == 1200.5
    assert spec(budget=50).budget == 50.0
    for bad in ("fifty", True, -3, 0):
        with pytest.raises(ValueError, match="budget"):
            spec(budget=bad)
    with pytest.raises(SpecError, match="budget"):
        load_spec_text(f"name: j\nimage: {IMAGE}\ncommand: echo\nbudget: lots\n")


def test_a_max_runtime_that_could_cost_more_than_the_budget_is_refused() -> None:
    s = spec(budget=5, teardown={"max_runtime": "2h"})
    with pytest.raises(PlanError) as caught:
        plan_cloud(s, None, environ=NO_GCLOUD)
    message = caught.value.message
    assert "budget $5.00" in message and "max_runtime 2h" in message and f"${PER_HOUR * 2:.2f}" in message
    assert "lower teardown.max_runtime to 31m15s" in (caught.value.hint or "")  # $5 / $9.60 an hour = 1875 s


def test_a_budget_under_the_default_max_runtime_becomes_the_deadline() -> None:
    plan = plan_cloud(spec(budget=20), None, environ=NO_GCLOUD, now=1_800_000_000.0)
    seconds = int(20 / PER_HOUR * 3600)
    assert plan.limit is not None and plan.limit.by == "budget" and plan.limit.seconds == seconds
    assert plan.spec.teardown.max_runtime == seconds  # spec.yaml in the run directory says what is enforced
    assert plan.deadline == 1_800_000_000.0 + seconds
    assert plan.env[contract.MAX_RUNTIME_S] == str(seconds) and plan.env[contract.DEADLINE] == str(
        1_800_000_000 + seconds
    )
    assert plan.limit.max_cost <= 20
    (row,) = plan_rows(plan.limit, local=False)
    assert row[0] == "budget" and "stopped after 2h05m" in row[1]


def test_a_queued_resource_never_waits_past_what_the_budget_buys() -> None:
    accelerator = {"type": "v5litepod-8", "zone": "us-west4-a", "project": "my-project", "provisioning": "queued"}
    plan = plan_cloud(spec(budget=20, accelerator=accelerator), None, environ=NO_GCLOUD)
    assert plan.cloud is not None and plan.limit is not None
    assert plan.cloud.provisioning == "queued" and plan.cloud.max_wait_s == plan.limit.seconds


def test_the_plan_says_the_default_24h_cap_in_dollars() -> None:
    plan = plan_cloud(spec(), None, environ=NO_GCLOUD)
    (row,) = plan_rows(plan.limit, local=False)
    assert row == (
        "max cost",
        f"${PER_HOUR * 24:,.2f} if it runs for the whole default max_runtime of 24h at ${PER_HOUR:.2f}/hour; "
        "cap it with `budget:` (--budget) or teardown.max_runtime",
    )
    fits = plan_cloud(spec(budget=100, teardown={"max_runtime": "1h"}), None, environ=NO_GCLOUD)
    assert fits.spec.teardown.max_runtime == 3600 and fits.limit is not None and fits.limit.by == "max_runtime"


def test_a_local_run_applies_no_budget(tmp_path: Path) -> None:
    s = JobSpec.model_validate(
        {"name": "j", "image": "trainer:test", "command": "echo", "storage": str(tmp_path), "budget": 0.01}
    )
    plan = plan_local(s, None)
    assert plan.spec.teardown.max_runtime == 86_400
    assert plan_rows(plan.limit, local=True) == [("budget", "$0.01: not applied (a local run pays for no TPU)")]


def test_submit_with_a_budget_too_small_exits_2_before_anything_is_created(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, runner_home: Path
) -> None:
    monkeypatch.setenv("CLOUDSDK_CONFIG", "/nonexistent")
    job = tmp_path / "job.yaml"
    job.write_text(
        textwrap.dedent(f"""\
        name: job
        image: {IMAGE}
        training: {{epochs: 1}}
        storage: gs://my-bucket/p
        accelerator: {{type: v5litepod-8, zone: us-west4-a, project: my-project}}
        teardown: {{max_runtime: 2h}}
        """)
    )
    result = CliRunner().invoke(app, ["submit", str(job), "--budget", "5"])
    assert result.exit_code == 2, result.output
    assert "budget $5.00 is less than max_runtime 2h can cost" in result.output
    assert not (runner_home / "runs").exists()
    ok = CliRunner().invoke(app, ["submit", str(job), "--budget", "$50", "--dry-run"])
    assert ok.exit_code == 0, ok.output
    assert "$50.00: max_runtime 2h costs at most" in ok.output
