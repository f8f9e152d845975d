"""runner.datasets.load_dataset, the data helper for user code: the cache, a local or gs:// .npz, in a real command
job; and the warning that keeps Keras away from the cache."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from runner import contract, datasets
from runner.cli import app
from runner.datasets import DatasetError, keras_home_problem, load_dataset
from tests.cli.test_cli import run_id_from, write_job


def test_from_the_cache_a_path_and_gs(
    mnist_npz: Path, gcs_mnist: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(contract.DATA_DIR, str(mnist_npz.parent))
    cached = load_dataset("mnist")
    assert cached.x_train.shape == (60000, 28, 28) and cached.y_test.shape == (10000,)
    assert cached.x_train.dtype.name == "uint8"
    assert load_dataset("mnist", mnist_npz).y_train[:5].tolist() == cached.y_train[:5].tolist()
    from_bucket = load_dataset("mnist", gcs_mnist)
    assert len(from_bucket.x_test) == len(cached.x_test)
    with pytest.raises(DatasetError, match="only 'mnist'"):
        load_dataset("cifar10")
    with pytest.raises(DatasetError, match="no such file"):
        load_dataset("mnist", tmp_path / "none.npz")
    monkeypatch.setenv(contract.DATA_DIR, str(tmp_path / "empty"))
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(DatasetError, match=r"python -m runner\.datasets fetch"):
        load_dataset("mnist")


def test_keras_home_over_the_cache_is_named() -> None:
    assert keras_home_problem({"KERAS_HOME": "/data/runner"}, "/data/runner/datasets/")
    assert keras_home_problem({"KERAS_HOME": "/data/keras"}, "/data/runner/datasets") is None
    assert keras_home_problem({}, "/data/runner/datasets") is None


def test_a_command_job_loads_mnist_and_is_warned_off_keras_home(tmp_path: Path, mnist_npz: Path) -> None:
    script = (
        "from runner.datasets import load_dataset\n"
        "d = load_dataset('mnist')\n"
        "print('shapes', d.x_train.shape, d.x_test.shape)"
    )
    job = write_job(
        tmp_path,
        f"""\
        name: data
        image: trainer:test
        command: [{json.dumps(sys.executable)}, "-c", {json.dumps(script)}]
        storage: {tmp_path / "store"}
        env: {{KERAS_HOME: {json.dumps(str(datasets.cache_dir().parent))}}}
        """,
    )
    result = CliRunner().invoke(app, ["submit", str(job), "--local"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "shapes (60000, 28, 28) (10000, 28, 28)" in result.output
    log = (tmp_path / "store" / "runs" / run_id_from(result.output) / contract.log_key(0)).read_text()
    assert log.startswith("[runner] warning: KERAS_HOME=") and "load_dataset('mnist')" in log
