"""The JAX engine's numpy feed (runner.train.npdata) and what a checkpoint says about the engine that wrote it.
No JAX or TensorFlow here: a stand-in for keras.utils.PyDataset is enough to read the batches."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from runner import datasets
from runner.train import npdata
from runner.train.checkpoints import NUMPY_SHUFFLE, TF_SHUFFLE, Candidate, Checkpoint, DataOrder


class _PyDataset:
    def __init__(self, **_: Any) -> None:
        pass


KERAS = SimpleNamespace(utils=SimpleNamespace(PyDataset=_PyDataset))


@pytest.fixture(scope="module")
def mnist(mnist_npz: Path) -> datasets.Mnist:
    return datasets.load_npz(mnist_npz)


def batches(ds: Any) -> list[Any]:
    return [ds[i] for i in range(len(ds))]


def test_an_epoch_is_a_pure_function_of_seed_and_epoch(mnist: datasets.Mnist) -> None:
    x, y = mnist.x_train[:1000], mnist.y_train[:1000]
    a = npdata.epoch_order(7, 3, len(x), 64)
    assert a.shape == (1000 // 64, 64) and len(set(a.ravel())) == a.size  # no example twice, remainder dropped
    assert np.array_equal(a, npdata.epoch_order(7, 3, len(x), 64))
    assert not np.array_equal(a, npdata.epoch_order(7, 4, len(x), 64))
    assert not np.array_equal(a, npdata.epoch_order(8, 3, len(x), 64))
    # A seed of any size, as TrainingSpec allows.
    assert npdata.epoch_order(2**40 + 1, 0, 10, 5).shape == (2, 5)

    data = npdata.TrainData(KERAS, x, y, 64, seed=7)
    whole, rest = batches(data.epoch(3)), batches(data.epoch(3, skip=5))
    assert len(whole) == 15 and len(rest) == 10
    for (xa, ya), (xb, yb) in zip(whole[5:], rest, strict=True):  # a resume at step 5 sees exactly the rest
        assert np.array_equal(xa, xb) and np.array_equal(ya, yb)
    images, labels = whole[0]
    assert images.shape == (64, 28, 28, 1) and images.dtype == np.float32 and labels.dtype == np.int32
    rows = a[0]
    assert np.allclose(images[..., 0], x[rows] / 255.0) and np.array_equal(labels, y[rows])
    with pytest.raises(ValueError, match="outside an epoch"):
        data.epoch(0, skip=15)


def test_each_process_feeds_its_share_of_the_same_global_batch(mnist: datasets.Mnist) -> None:
    x, y = mnist.x_train[:512], mnist.y_train[:512]
    whole = batches(npdata.TrainData(KERAS, x, y, 64, seed=0).epoch(1))
    shares = [batches(npdata.TrainData(KERAS, x, y, 64, seed=0, process=p, processes=4).epoch(1)) for p in range(4)]
    for step, (images, labels) in enumerate(whole):
        assert np.array_equal(np.concatenate([s[step][0] for s in shares]), images)
        assert np.array_equal(np.concatenate([s[step][1] for s in shares]), labels)
    with pytest.raises(ValueError, match="does not split evenly"):
        npdata.TrainData(KERAS, x, y, 64, seed=0, process=0, processes=3)


def test_the_test_set_is_padded_with_weightless_examples(mnist: datasets.Mnist) -> None:
    x, y = mnist.x_test[:100], mnist.y_test[:100]
    got = batches(npdata.eval_data(KERAS, x, y, 32))
    assert [b[0].shape[0] for b in got] == [32, 32, 32, 32]
    weights = np.concatenate([b[2] for b in got])
    assert weights.sum() == 100 and not weights[100:].any()
    assert np.array_equal(np.concatenate([b[1] for b in got])[:100], y)


def test_manifest_entries_say_which_engine_and_order_wrote_them() -> None:
    order = DataOrder(0, 512, 64, 8, shuffle=NUMPY_SHUFFLE)
    entry = Checkpoint("ckpt-000001-s000003.keras", 1, 3, global_step=11, keras="keras3", data=order, framework="jax")
    assert Checkpoint.from_json(entry.to_json()) == entry
    # An entry from before the JAX engine: TensorFlow wrote it, with TensorFlow's shuffle.
    old = entry.to_json()
    del old["framework"], old["data"]["shuffle"]
    parsed = Checkpoint.from_json(old)
    assert parsed.framework == "tensorflow" and parsed.data == DataOrder(0, 512, 64, 8, shuffle=TF_SHUFFLE)
    # Listed with no engine: unknown, as is a checkpoint found by a directory scan.
    assert Checkpoint.from_json({**entry.to_json(), "framework": None}).framework is None
    assert Candidate(entry, Path("/x"), listed=False).framework is None


def test_a_mid_epoch_checkpoint_of_the_other_engine_restarts_that_epoch(capsys: pytest.CaptureFixture[str]) -> None:
    from runner.train.resume import start_from

    tf_order = DataOrder(0, 512, 64, 8)
    saved = Checkpoint("ckpt-000001-s000003.keras", 1, 3, global_step=11, keras="keras3", data=tf_order)
    candidate = Candidate(saved, Path("/x"), listed=True)
    jax_order = DataOrder(0, 512, 64, 8, shuffle=NUMPY_SHUFFLE)

    def start(order: DataOrder) -> tuple[int, int, int]:
        begun = start_from(
            candidate, steps=8, order=order, optimizer_step=lambda: 0, found_any=True, skipped=0, say=print, prefix=""
        )
        return (*begun.position, begun.global_step)

    assert start(tf_order) == (1, 3, 11)
    assert start(jax_order) == (1, 0, 11)
    assert "epoch 2 starts over from step 0" in capsys.readouterr().out
