"""The fused dropout kernel: Keras' dropout semantics (rate, scale, gradient, inference), and a model that saves and
loads as plain Keras whichever kernel ran it."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from runner.train.fused_dropout import WORD, _threshold, fuse_dropout, fused_layers, make_dropout
from runner.train.models import DROPOUT_MODELS, MODELS, build_model


@pytest.fixture(scope="module")
def tf() -> Any:
    return pytest.importorskip("tensorflow")


def test_the_threshold_keeps_a_unit_with_probability_one_minus_the_rate() -> None:
    assert _threshold(0.5) == 2**31
    assert _threshold(0.3) / WORD == pytest.approx(0.3, abs=2**-32)
    assert _threshold(1 - 1e-12) == WORD - 1  # a 32-bit draw can still reach it


@pytest.mark.parametrize(("rate", "dtype"), [(0.3, "float32"), (0.5, "bfloat16"), (0.05, "float32")])
def test_the_kernel_drops_at_the_rate_and_scales_what_it_keeps(tf: Any, rate: float, dtype: str) -> None:
    n = 1 << 20
    x = tf.cast(tf.reshape(tf.range(1, n + 1) % 7 + 1, (256, 64, 64)), dtype)  # no zeros: a zero out is a drop
    dropout = make_dropout(tf, rate)
    y = dropout(x, tf.constant([3, 4], tf.int32))
    assert y.dtype == x.dtype and y.shape == x.shape
    kept = tf.not_equal(y, 0)
    fraction = float(tf.reduce_mean(tf.cast(kept, tf.float64)))
    assert abs(fraction - (1 - rate)) < 5 * math.sqrt(rate * (1 - rate) / n)  # five standard deviations
    scale = tf.cast(1 / (1 - rate), dtype)  # in the input's dtype, as Keras scales
    np.testing.assert_array_equal(tf.boolean_mask(y, kept).numpy(), tf.boolean_mask(x * scale, kept).numpy())
    again = dropout(x, tf.constant([3, 4], tf.int32))
    other = dropout(x, tf.constant([3, 5], tf.int32))
    np.testing.assert_array_equal(again.numpy(), y.numpy())  # the seed decides the mask
    agreement = float(tf.reduce_mean(tf.cast(tf.equal(tf.not_equal(other, 0), kept), tf.float64)))
    assert agreement == pytest.approx(rate**2 + (1 - rate) ** 2, abs=0.01)  # another seed: an independent mask


def test_the_gradient_is_the_same_mask_scaled(tf: Any) -> None:
    x = tf.Variable(tf.ones((64, 128)))
    dropout = make_dropout(tf, 0.3)
    seed = tf.constant([1, 2], tf.int32)
    with tf.GradientTape() as tape:
        y = dropout(x, seed)
        loss = tf.reduce_sum(y * tf.range(128, dtype=tf.float32))
    grad = tape.gradient(loss, x)
    expected = tf.where(tf.not_equal(y, 0), tf.range(128, dtype=tf.float32) / 0.7, 0.0)
    np.testing.assert_allclose(grad.numpy(), expected.numpy(), rtol=1e-6)


def test_a_fused_model_trains_at_each_seed_step_and_saves_as_plain_keras(tf: Any, tmp_path: Path) -> None:
    keras = tf.keras
    model = build_model("mnist_cnn", keras)
    assert fuse_dropout(model, tf) == 3 and fused_layers(model, tf) == 3
    x = tf.ones((4, 28, 28, 1))
    drop = model.layers[2]
    assert isinstance(drop, keras.layers.Dropout)
    np.testing.assert_array_equal(drop(x, training=False).numpy(), x.numpy())  # inference: the identity
    first, second = drop(x, training=True), drop(x, training=True)
    assert not np.array_equal(first.numpy(), second.numpy())  # the layer's seed stream advances, as in Keras
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    losses = [float(model.train_on_batch(tf.ones((8, 28, 28, 1)), tf.zeros((8,), tf.int32))) for _ in range(5)]
    assert losses[-1] < losses[0]
    path = tmp_path / "m.keras"
    model.save(path)
    loaded = keras.models.load_model(path)
    assert [type(layer) for layer in loaded.layers] == [type(layer) for layer in model.layers]
    assert fused_layers(loaded, tf) == 0  # the choice is the run's: a checkpoint holds nothing of it
    for saved, again in zip(model.weights, loaded.weights, strict=True):
        np.testing.assert_array_equal(saved.numpy(), again.numpy())


def test_the_models_with_dropout_are_the_ones_perf_times(tf: Any) -> None:
    keras = tf.keras
    with_dropout = {
        name for name in MODELS if any(isinstance(la, keras.layers.Dropout) for la in build_model(name, keras).layers)
    }
    assert with_dropout == DROPOUT_MODELS
    mlp = build_model("mnist_mlp", keras)
    assert fuse_dropout(mlp, tf) == 0
    shared = keras.Sequential([keras.Input((4, 4)), keras.layers.Dropout(0.5, noise_shape=(None, 1, 4))])
    assert fuse_dropout(shared, tf) == 0  # a noise_shape stays with Keras' kernel
