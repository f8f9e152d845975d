"""The built-in trainer's data and code, checked offline (runner.plan.datacheck): what `runner validate` says before
anything runs, and the same shape rules the trainer applies before it builds a model (tests/train: a real one)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from runner.cli import app
from runner.plan import datacheck


def npz(path: Path, **arrays: np.ndarray) -> Path:
    np.savez_compressed(path, **arrays)
    return path


def four(x_train: tuple[int, ...], y_train: tuple[int, ...], x_test: tuple[int, ...], y_test: tuple[int, ...]) -> dict:  # type: ignore[type-arg]
    return {
        "x_train": np.zeros(x_train, np.uint8),
        "y_train": np.zeros(y_train, np.uint8),
        "x_test": np.zeros(x_test, np.uint8),
        "y_test": np.zeros(y_test, np.uint8),
    }


def test_shapes_come_from_the_headers(tmp_path: Path) -> None:
    path = npz(tmp_path / "d.npz", **four((6, 784), (6,), (2, 784), (2, 10)))
    assert datacheck.npz_shapes(path) == {"x_train": (6, 784), "y_train": (6,), "x_test": (2, 784), "y_test": (2, 10)}


@pytest.mark.parametrize(
    ("shapes", "model", "expected"),
    [
        (((6, 784), (6,), (2, 784), (2,)), "mnist_mlp", []),
        (((6, 28, 28), (6, 10), (2, 28, 28), (2, 10)), "mnist_cnn", []),  # one-hot labels
        (((6, 784), (6,), (2, 784), (2,)), "mnist_cnn", ["but mnist_cnn takes images"]),  # the Dense guide's input
        (((6, 784), (5,), (2, 784), (2,)), "mnist_mlp", ["x_train has 6 examples and y_train 5"]),
        (((6, 784), (6,), (2, 28, 28), (2,)), "mnist_mlp", ["x_train's examples are (784,) and x_test's (28, 28)"]),
        (((6, 784), (6, 2, 5), (2, 784), (2,)), "mnist_mlp", ["y_train has shape (6, 2, 5)"]),
        (((6, 3, 3), (6,), (2, 3, 3), (2,)), "mnist_cnn", ["at least 4 x 4"]),
    ],
)
def test_the_shape_rules(shapes: tuple, model: str, expected: list[str]) -> None:  # type: ignore[type-arg]
    found = datacheck.shape_problems(dict(zip(datacheck.ARRAYS, shapes, strict=True)), model, "d.npz")
    assert len(found) == len(expected) and all(e in f for e, f in zip(expected, found, strict=True)), found


def job(tmp_path: Path, training: str) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(f"name: j\nimage: trainer:test\ntraining: {{{training}}}\n")
    return path


def test_validate_says_what_the_data_and_code_will_fail_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    npz(tmp_path / "flat.npz", **four((6, 784), (6,), (2, 784), (2,)))
    (tmp_path / "mine.py").write_text("def build(keras):\n    raise SystemExit('not imported by validate')\n")
    cases = {
        "model: mnist_cnn, data: flat.npz": "but mnist_cnn takes images",
        "model: mnist_mlp, data: missing.npz": "training.data 'missing.npz': no such file",
        "model: nowhere:build": "training.model 'nowhere:build': no module 'nowhere'",
        "model: mnist_mlp, data: loader:load": "training.data 'loader:load': no module 'loader'",
    }
    for training, message in cases.items():
        result = CliRunner().invoke(app, ["validate", str(job(tmp_path, training))])
        assert result.exit_code == 2, result.output
        assert message in result.output
    for training in ("model: mnist_mlp, data: flat.npz", "model: mine:build, data: flat.npz"):
        result = CliRunner().invoke(app, ["validate", str(job(tmp_path, training))])
        assert result.exit_code == 0, result.output  # found, never imported (mine.py would exit)
