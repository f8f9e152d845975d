"""The built-in trainer on a slice of real MNIST, started the way the container starts it (python -m runner.worker)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from runner import contract
from runner.spec import TrainingSpec
from runner.train.checkpoints import latest_checkpoint

pytestmark = pytest.mark.slow


def train(run_dir: Path, mnist_npz: Path, **training: object) -> subprocess.CompletedProcess[str]:
    cfg = TrainingSpec.model_validate(
        {"batch_size": 128, "max_train_examples": 512, "max_test_examples": 256, **training}
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RUNNER_", "TF_USE_LEGACY_KERAS"))}
    env.update(
        {
            contract.RUN_DIR: str(run_dir),
            contract.RUN_ID: "t",
            contract.TRAINING: cfg.model_dump_json(),
            contract.DATA_DIR: str(mnist_npz.parent),
        }
    )
    return subprocess.run(
        [sys.executable, "-m", "runner.worker"], env=env, capture_output=True, text=True, timeout=300, check=False
    )


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_trains_writes_the_contract_and_resumes(tmp_path: Path, mnist_npz: Path) -> None:
    run = tmp_path / "run"
    first = train(run, mnist_npz, epochs=1)
    assert first.returncode == 0, first.stdout[-3000:]
    assert "strategy: DefaultStrategy on CPU, 1 replica" in first.stdout
    (m1,) = rows(run / contract.METRICS)
    assert m1["epoch"] == 1 and m1["examples_per_s"] > 0 and 0 <= m1["val_accuracy"] <= 1
    assert latest_checkpoint(run / contract.CHECKPOINTS) == (1, run / "checkpoints" / "ckpt-000001.keras")
    assert list((run / contract.TENSORBOARD).rglob("events.out.tfevents.*"))
    summary = json.loads((run / contract.SUMMARY).read_text())
    assert summary["strategy"]["replicas"] == 1 and summary["train_examples"] == 512

    # Same run directory, more epochs: continues from the checkpoint (epoch and optimizer state).
    second = train(run, mnist_npz, epochs=3)
    assert second.returncode == 0, second.stdout[-3000:]
    assert "resumed from ckpt-000001.keras: epoch 1 done, optimizer step 4" in second.stdout
    assert "Epoch 1/3" not in second.stdout
    assert [r["epoch"] for r in rows(run / contract.METRICS)] == [1, 2, 3]
    summary = json.loads((run / contract.SUMMARY).read_text())
    assert summary["resumed_from_epoch"] == 1
    assert len(summary["epoch_times_s"]) == 3
    # Real data, real learning: three short epochs on 512 images are far above chance (0.1).
    assert summary["test_accuracy"] > 0.5
    assert sorted(p.name for p in (run / contract.CHECKPOINTS).glob("*.keras")) == [
        "ckpt-000002.keras",
        "ckpt-000003.keras",
    ]  # the two newest are kept


def test_tf_keras_checkpoint_cannot_be_resumed_by_keras3(tmp_path: Path, mnist_npz: Path) -> None:
    run = tmp_path / "run"
    first = train(run, mnist_npz, model="mnist_mlp", epochs=1, keras="tf_keras")
    assert first.returncode == 0, first.stdout[-3000:]
    assert "tf_keras 2." in first.stdout
    assert json.loads((run / "checkpoints" / "latest.json").read_text())["keras"] == "tf_keras"
    clash = train(run, mnist_npz, model="mnist_mlp", epochs=2, keras="keras3")
    assert clash.returncode == 2
    assert "written by tf_keras, which keras3 cannot read" in clash.stdout
    assert "Traceback" not in clash.stdout
    # auto follows the checkpoint instead of failing.
    resumed = train(run, mnist_npz, model="mnist_mlp", epochs=2, keras="auto")
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    assert "resumed from ckpt-000001.keras" in resumed.stdout


def test_bad_data_file_is_a_clear_error(tmp_path: Path, mnist_npz: Path) -> None:
    bogus = tmp_path / "bogus.npz"
    bogus.write_bytes(b"not a zip")
    result = train(tmp_path / "run", mnist_npz, data=str(bogus))
    assert result.returncode == 2
    assert "not an MNIST .npz" in result.stdout
    assert json.loads((tmp_path / "run" / "exit" / "worker-0.json").read_text())["state"] == "failed"
