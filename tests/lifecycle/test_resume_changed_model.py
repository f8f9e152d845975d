"""`runner resume RUN --set training.model=OTHER`: a resume whose overrides change what the run's checkpoints mean
(the model, the data) is refused (exit 2) naming the override and --fresh; with --fresh training starts over and
every old checkpoint is kept, moved aside in the run directory, never deleted."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from runner import contract
from runner.cli import app
from runner.lifecycle.resume import meaning_changes
from runner.spec.loader import load_spec_text
from runner.watch import runs
from tests.waiting import wait_for

SPEC = """\
name: changed
image: trainer:test
training: {model: mnist_mlp, epochs: 40, batch_size: 128, max_train_examples: 512, max_test_examples: 256}
storage: STORE
"""


def test_only_the_model_and_the_data_change_what_a_checkpoint_means() -> None:
    spec = load_spec_text(SPEC.replace("STORE", "/tmp/x"), "job.yaml", [])
    assert (
        meaning_changes(spec, load_spec_text(SPEC.replace("STORE", "/tmp/x"), "job.yaml", ["training.epochs=3"])) == []
    )
    changed = load_spec_text(SPEC.replace("STORE", "/tmp/x"), "job.yaml", ["training.model=mnist_cnn"])
    assert meaning_changes(spec, changed) == ["training.model: mnist_mlp -> mnist_cnn"]
    data = load_spec_text(SPEC.replace("STORE", "/tmp/x"), "job.yaml", ["training.data=other.npz"])
    assert meaning_changes(spec, data) == ["training.data: None -> other.npz"]


def _digests(directory: Path) -> dict[str, str]:
    return {
        p.relative_to(directory).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file() and not p.name.startswith(".")
    }


@pytest.mark.slow
def test_a_resume_with_another_model_is_refused_then_starts_over_keeping_every_checkpoint(
    tmp_path: Path, runner_home: Path, mnist_npz: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two trainers (the stopped attempt, the fresh one): about 30 s."""
    monkeypatch.setenv("RUNNER_DATA_DIR", str(mnist_npz.parent))
    spec = tmp_path / "job.yaml"
    spec.write_text(textwrap.dedent(SPEC.replace("STORE", str(tmp_path / "store"))))
    submitter = subprocess.Popen(
        [sys.executable, "-m", "runner.cli", "submit", str(spec), "--local"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    wait_for(lambda: runs.list_records(), "the run recorded", timeout=120)
    run_id = runs.list_records()[0].run_id
    run_dir = Path(runs.load(run_id).run_dir)
    checkpoints = run_dir / contract.CHECKPOINTS
    wait_for(lambda: (checkpoints / contract.checkpoint_name(1)).is_file(), "the first checkpoint", timeout=240)
    down = CliRunner().invoke(app, ["down", run_id], catch_exceptions=False)
    assert down.exit_code == 0, down.output
    out = submitter.communicate(timeout=240)[0]
    assert submitter.returncode == 130, out[-3000:]
    before = _digests(checkpoints) | {contract.METRICS: _digests(run_dir)[contract.METRICS]}
    assert any(k.startswith("ckpt-") for k in before), before

    refused = CliRunner().invoke(app, ["resume", run_id, "--set", "training.model=mnist_cnn"], catch_exceptions=False)
    assert refused.exit_code == 2, refused.output
    assert "training.model: mnist_mlp -> mnist_cnn" in refused.output and "--fresh" in refused.output
    assert _digests(checkpoints) | {contract.METRICS: _digests(run_dir)[contract.METRICS]} == before  # untouched
    assert len(runs.load(run_id).attempts) == 0  # nothing started

    fresh = CliRunner().invoke(
        app,
        ["resume", run_id, "--fresh", "--set", "training.model=mnist_cnn", "--set", "training.epochs=1"],
        catch_exceptions=False,
    )
    assert fresh.exit_code == 0, fresh.output
    aside = run_dir / "set-aside" / "before-attempt-2"
    assert f"kept in {run_dir}/set-aside/before-attempt-2/" in fresh.output
    kept = _digests(aside / contract.CHECKPOINTS) | {contract.METRICS: _digests(aside)[contract.METRICS]}
    assert kept == before  # 0 checkpoints lost: every one byte for byte
    assert "[trainer] started over from step 0" in fresh.output  # from epoch 1 of the new model
    assert "[trainer] resumed from" not in fresh.output
    assert sorted(p.name for p in checkpoints.glob("ckpt-*.keras")) == [contract.checkpoint_name(1)]
    record = runs.load(run_id)
    assert record.state == "succeeded" and len(record.attempts) == 1
