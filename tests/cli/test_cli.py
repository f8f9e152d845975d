"""The CLI end to end through typer's CliRunner: validate, schema, submit --local, status, logs, list."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner

from runner import contract
from runner.cli import app
from tests.conftest import REPO

cli = CliRunner()


def invoke(*args: str) -> object:
    return cli.invoke(app, list(args), catch_exceptions=False)


def write_job(tmp_path: Path, body: str, name: str = "job.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


def command_job(tmp_path: Path, script: str, **extra: str) -> Path:
    storage = extra.pop("storage", str(tmp_path / "store"))
    return write_job(
        tmp_path,
        f"""\
        name: cmd
        image: trainer:test
        command: [{json.dumps(sys.executable)}, "-c", {json.dumps(script)}]
        storage: {storage}
        """,
    )


def run_id_from(output: str) -> str:
    for line in output.splitlines():
        if line.startswith("Run "):
            return line.split()[1]
    raise AssertionError(f"no run id in:\n{output}")


def test_help_and_validate_import_neither_tensorflow_nor_google_sdks_nor_rich() -> None:
    probe = textwrap.dedent(f"""
        import json, sys
        from typer.testing import CliRunner
        from runner.cli import app
        r1 = CliRunner().invoke(app, ["--help"])
        r2 = CliRunner().invoke(app, ["validate", {str(REPO / "jobs" / "mnist.yaml")!r}])
        heavy = sorted(m for m in sys.modules
                       if m.split(".")[0] in ("tensorflow", "keras", "tf_keras", "numpy", "grpc", "rich", "matplotlib")
                       or m.startswith(("google.cloud", "google.api_core", "google.auth")))
        print(json.dumps([r1.exit_code, r2.exit_code, heavy]))
    """)
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=REPO)
    codes_and_modules = json.loads(out.stdout.strip().splitlines()[-1])
    assert codes_and_modules == [0, 0, []]


def test_validate_from_the_command_line_needs_no_typer(tmp_path: Path) -> None:
    """`runner validate FILE...` skips typer (its import and command tree cost more than the validation), and says
    what the typer command says, with the same exit code."""
    bad = write_job(tmp_path, "name: x\nimage: i\ntraining:\n  epoch: 3\n")
    probe = textwrap.dedent(f"""
        import json, sys
        sys.argv = ["runner", "validate", {str(REPO / "jobs" / "mnist.yaml")!r}, {str(bad)!r}]
        from runner.cli import main
        try:
            main()
        except SystemExit as exc:
            code = exc.code
        typer = sorted(m for m in sys.modules if m.split(".")[0] in ("typer", "click", "rich"))
        print(json.dumps([code, typer]), file=sys.stderr)
    """)
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=REPO)
    assert json.loads(out.stderr.strip().splitlines()[-1]) == [2, []]
    assert "ok " in out.stdout and "training.epoch: unknown field; did you mean 'epochs'?" in out.stderr
    through_typer = invoke("validate", str(REPO / "jobs" / "mnist.yaml"), str(bad))
    assert through_typer.exit_code == 2 and "did you mean 'epochs'?" in through_typer.output


def test_validate_good_and_bad(tmp_path: Path) -> None:
    ok = invoke("validate", str(REPO / "jobs" / "mnist.yaml"), str(REPO / "jobs" / "mnist_mlp.yaml"))
    assert ok.exit_code == 0
    assert "ok " in ok.output and "'mnist'" in ok.output and "'mnist-mlp'" in ok.output
    bad = write_job(tmp_path, "name: x\nimage: i\ntraining:\n  epoch: 3\n")
    result = invoke("validate", str(bad))
    assert result.exit_code == 2
    assert "line 4: training.epoch: unknown field; did you mean 'epochs'?" in result.output
    assert "Traceback" not in result.output


def test_validate_reports_every_bad_file(tmp_path: Path) -> None:
    a = write_job(tmp_path, "name: A\nimage: i\ntraining: {}\n", "a.yaml")
    b = write_job(tmp_path, "name: b\nimage: i\n", "b.yaml")
    result = invoke("validate", str(a), str(REPO / "jobs" / "mnist.yaml"), str(b))
    assert result.exit_code == 2
    assert "a.yaml: 1 problem" in result.output and "b.yaml: 1 problem" in result.output
    assert "ok " in result.output


def test_schema_is_json_schema_and_the_committed_copy_is_current() -> None:
    result = invoke("schema")
    assert result.exit_code == 0
    schema = json.loads(result.output)
    assert {"name", "image", "accelerator", "training", "command", "storage", "teardown"} <= set(schema["properties"])
    assert schema["additionalProperties"] is False
    committed = json.loads((REPO / "runner.schema.json").read_text())
    assert committed == schema, "runner.schema.json is stale: run `make schema`"


def test_bad_spec_on_submit_exits_2_and_creates_nothing(tmp_path: Path, runner_home: Path) -> None:
    bad = write_job(tmp_path, "name: x\nimage: i\ntraining: {epochs: -1}\nstorage: " + str(tmp_path / "s") + "\n")
    result = invoke("submit", str(bad), "--local")
    assert result.exit_code == 2
    assert "training.epochs" in result.output
    assert not (tmp_path / "s").exists() and not (runner_home / "runs").exists()


def test_dry_run_shows_the_plan_and_starts_nothing(tmp_path: Path, runner_home: Path) -> None:
    job = command_job(tmp_path, "print(1)")
    result = invoke("submit", str(job), "--local", "--dry-run")
    assert result.exit_code == 0, result.output
    assert "dry run" in result.output and "runner.worker" in result.output
    assert contract.RUN_DIR in result.output and contract.COMMAND in result.output
    assert not (tmp_path / "store").exists() and not (runner_home / "runs").exists()


def test_submit_to_a_tpu_vm_with_local_storage_says_what_to_do(tmp_path: Path) -> None:
    result = invoke("submit", str(command_job(tmp_path, "print(1)")), "--project", "my-project")
    assert result.exit_code == 2
    assert "can only write its run directory to Cloud Storage" in result.output and "--local" in result.output


def test_submit_local_custom_command_then_status_logs_list(tmp_path: Path) -> None:
    job = command_job(tmp_path, "import os; print('hello from', os.environ['RUNNER_RUN_ID'])")
    result = invoke("submit", str(job), "--local")
    assert result.exit_code == 0, result.output
    run_id = run_id_from(result.output)
    assert f"hello from {run_id}" in result.output
    assert "succeeded" in result.output

    status = invoke("status", run_id)
    assert status.exit_code == 0 and "succeeded" in status.output
    assert json.loads(invoke("status", run_id, "--json").output)["state"] == "succeeded"
    assert f"hello from {run_id}" in invoke("logs", run_id).output
    assert f"hello from {run_id}" in invoke("logs", run_id[:-2], "--follow").output  # a unique prefix will do
    listing = invoke("list")
    assert run_id in listing.output and "succeeded" in listing.output
    run_dir = tmp_path / "store" / "runs" / run_id
    assert invoke("status", str(run_dir)).exit_code == 0  # a run directory works without a record


def test_failed_command_exits_6_and_shows_its_traceback_once(tmp_path: Path) -> None:
    job = command_job(tmp_path, "print('loading')\ndef load():\n    raise ValueError('bad things')\nload()")
    result = invoke("submit", str(job), "--local")
    assert result.exit_code == 6
    assert result.output.count("Traceback (most recent call last)") == 1, result.output
    assert "last output:" not in result.output  # it scrolled by as the job wrote it
    assert re.search(r"^error +ValueError: bad things  \(its output is above\)$", result.output, re.M), result.output
    assert "ended failed" in result.output
    run_id = run_id_from(result.output)
    status = invoke("status", run_id)  # status shows no log: the tail, once
    assert status.output.count("Traceback (most recent call last)") == 1
    follow = invoke("logs", run_id, "-f")
    assert follow.output.count("Traceback (most recent call last)") == 1
    assert f"run {run_id} failed: exit code 1" in follow.output.splitlines()[-1]


def test_unknown_run(tmp_path: Path) -> None:
    result = invoke("status", "nope-123")
    assert result.exit_code == 3
    assert "no run 'nope-123'" in result.output


@pytest.mark.slow
def test_submit_local_trains_real_mnist(tmp_path: Path, mnist_npz: Path) -> None:
    job = write_job(
        tmp_path,
        f"""\
        name: tiny
        image: trainer:test
        training:
          model: mnist_cnn
          epochs: 2
          batch_size: 128
          max_train_examples: 512
          max_test_examples: 256
        storage: {tmp_path / "store"}
        """,
    )
    result = invoke("submit", str(job), "--local")
    assert result.exit_code == 0, result.output
    run_id = run_id_from(result.output)
    for text in [
        "Epoch 2/2",
        "test accuracy",
        "epoch times",
        "examples/s",
        "DefaultStrategy on CPU, 1 replica",
        "metrics.jsonl",
        "ckpt-000002.keras",
        "tensorboard --logdir",
    ]:
        assert text in result.output, text
    run_dir = tmp_path / "store" / "runs" / run_id
    assert json.loads((run_dir / contract.SUMMARY).read_text())["epochs"] == 2
    assert "test acc." in invoke("list").output


@pytest.mark.slow
def test_submit_local_trains_on_jax(tmp_path: Path, mnist_npz: Path) -> None:
    job = write_job(
        tmp_path,
        f"""\
        name: tiny-jax
        image: trainer:test
        training:
          framework: jax
          model: mnist_mlp
          epochs: 2
          batch_size: 128
          max_train_examples: 512
          max_test_examples: 256
        storage: {tmp_path / "store"}
        """,
    )
    result = invoke("submit", str(job), "--local")
    assert result.exit_code == 0, result.output
    for text in ["Epoch 2/2", "test accuracy", "DataParallel on CPU, 1 replica (cpu:0)", "ckpt-000002.keras"]:
        assert text in result.output, text
    summary = json.loads((tmp_path / "store" / "runs" / run_id_from(result.output) / contract.SUMMARY).read_text())
    assert (summary["framework"], summary["global_step"], summary["strategy"]["devices"]) == ("jax", 8, ["cpu:0"])


@pytest.mark.slow
def test_submit_local_with_cloud_storage(tmp_path: Path, mnist_npz: Path, gcs: str) -> None:
    bucket_url = f"gs://runner-test/{uuid.uuid4().hex}"
    job = write_job(
        tmp_path,
        f"""\
        name: tiny-gcs
        image: trainer:test
        training: {{model: mnist_mlp, epochs: 1, batch_size: 128, max_train_examples: 512, max_test_examples: 256}}
        storage: {bucket_url}
        """,
    )
    result = invoke("submit", str(job), "--local")
    assert result.exit_code == 0, result.output
    run_id = run_id_from(result.output)
    from runner.storage import open_storage

    keys = {o.key for o in open_storage(f"{bucket_url}/runs/{run_id}").list()}
    assert {
        "spec.yaml",
        "run.json",
        "metrics.jsonl",
        "summary.json",
        "checkpoints/latest.json",
        "checkpoints/ckpt-000001.keras",
        "logs/worker-0.log",
        "exit/worker-0.json",
    } <= keys
    assert any(k.startswith("tensorboard/") for k in keys)
    status = invoke("status", f"{bucket_url}/runs/{run_id}")
    assert status.exit_code == 0 and "succeeded" in status.output


def test_set_overrides_are_validated_like_the_file(tmp_path: Path) -> None:
    mnist = str(REPO / "jobs" / "mnist.yaml")
    dry = invoke("submit", mnist, "--local", "--dry-run", "--set", "training.epochs=1", "--set", "env.MODE=fast")
    assert dry.exit_code == 0, dry.output
    assert '"epochs":1' in dry.output and re.search(r"^ +MODE +fast$", dry.output, re.M)
    bad = invoke("validate", mnist, "--set", "training.epoch=1")
    assert bad.exit_code == 2 and "--set training.epoch=1: training.epoch: unknown field; did you mean 'epochs'?" in (
        bad.output
    )
    assert invoke("validate", mnist, "--set", "no-equals-sign").exit_code == 2


def test_validate_json_and_version() -> None:
    result = invoke("validate", str(REPO / "jobs" / "mnist.yaml"), "--json")
    assert result.exit_code == 0
    document = json.loads(result.output)
    assert document["ok"] is True and document["files"][0]["job"] == "mnist"
    version = invoke("--version")
    assert version.exit_code == 0 and version.output.startswith("runner ")
