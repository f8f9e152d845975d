"""How a user's own fit is continued at a checkpoint's position (runner.train.seams): which batches are skipped, for
each way Keras iterates the data, and which inputs can be replayed at all. Real Keras fits are in test_library.py."""

from __future__ import annotations

import types
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from runner.train import seams

KERAS3_TF = types.SimpleNamespace(__version__="3.15.1", backend=types.SimpleNamespace(backend=lambda: "tensorflow"))
KERAS3_JAX = types.SimpleNamespace(__version__="3.15.1", backend=types.SimpleNamespace(backend=lambda: "jax"))
TF_KERAS = types.SimpleNamespace(__version__="2.20.1")


def arrays(examples: int = 1000, batch: int = 100, steps_per_epoch: int | None = None) -> seams.FitData:
    x = np.zeros((examples, 4))
    return seams.classify(x, True, steps_per_epoch, batch)


@pytest.mark.parametrize(
    ("keras", "steps_per_epoch", "position", "skip"),
    [
        # Keras 3 draws a new order each epoch, seeded: only the epoch's done steps are skipped.
        (KERAS3_TF, None, (2, 4), 4),
        (KERAS3_JAX, None, (2, 4), 4),
        (KERAS3_TF, 10, (2, 4), 4),  # steps_per_epoch equal to a pass over the arrays: the same as none
        # tf_keras reads every epoch from one stream: the epochs done are drawn again, untrained.
        (TF_KERAS, None, (2, 4), 24),
        (TF_KERAS, None, (2, 0), 20),
        (TF_KERAS, 6, (2, 4), 16),
        (KERAS3_TF, None, (3, 0), 0),
    ],
)
def test_the_batches_taken_untrained_are_those_the_interrupted_fit_had_drawn(
    keras: object, steps_per_epoch: int | None, position: tuple[int, int], skip: int
) -> None:
    steps = steps_per_epoch or 10
    replay = seams.plan_replay(keras, arrays(steps_per_epoch=steps_per_epoch), position, steps)
    assert (replay.start, replay.skip, replay.exact) == (position, skip, True)


def test_what_cannot_be_replayed_restarts_the_interrupted_epoch() -> None:
    # Keras 3 reading arrays across epochs (steps_per_epoch 6 of 10 batches) starts its iterator again on its own
    # count of steps: the steps go on exactly, on batches drawn anew.
    for keras in (KERAS3_TF, KERAS3_JAX):
        replay = seams.plan_replay(keras, arrays(steps_per_epoch=6), (2, 4), 6)
        assert (replay.start, replay.skip, replay.exact) == ((2, 4), 4, False)
        assert "arrays read across epochs" in replay.why
    generator = seams.classify(iter(range(3)), True, 5)
    assert generator.kind == seams.OTHER
    assert not seams.plan_replay(KERAS3_TF, generator, (1, 3), 5).exact
    # At an epoch's start there is nothing to replay.
    assert seams.plan_replay(KERAS3_TF, generator, (1, 0), 5) == seams.Replay((1, 0), 0, True, "")


def test_arrays_in_any_container_count_as_arrays() -> None:
    for x in (np.zeros((5, 2)), [np.zeros(5), np.zeros(5)], {"a": np.zeros((5, 1)), "b": np.zeros(5)}):
        data = seams.classify(x, True, None, 2)
        assert (data.kind, data.examples, data.batches) == (seams.ARRAYS, 5, 3)


@pytest.fixture
def tf_seedless() -> Iterator[Any]:
    """TensorFlow with no global seed, as a run whose code sets none starts (an earlier test in this process may have
    set one: Keras' set_random_seed does), and the global seed put back afterwards."""
    tf = pytest.importorskip("tensorflow")
    from tensorflow.python.eager import context

    before = context.global_seed()
    tf.random.set_seed(None)
    yield tf
    tf.random.set_seed(before)


def test_datasets_are_read_for_what_makes_them_differ_between_iterations(tf_seedless: Any) -> None:
    tf = tf_seedless
    base = tf.data.Dataset.range(100)
    cases = {
        "plain": (base.batch(10), True),
        "seeded, reshuffle off": (base.shuffle(100, seed=3, reshuffle_each_iteration=False).batch(10), True),
        "stateless map": (base.map(lambda i: tf.random.stateless_uniform([], seed=[1, i])).batch(10), True),
        "reshuffles": (base.shuffle(100, seed=3).batch(10), False),
        "unseeded": (base.shuffle(100, reshuffle_each_iteration=False).batch(10), False),
        "random map": (base.map(lambda i: tf.random.uniform([])).batch(10), False),
        "sloppy": (base.map(lambda i: i * 2, num_parallel_calls=2, deterministic=False).batch(10), False),
    }
    for name, (dataset, expected) in cases.items():
        deterministic, why = seams.dataset_determinism(dataset)
        assert deterministic is expected, (name, why)
        assert bool(why) is not expected, name
        data = seams.classify(dataset, True, None)
        assert (data.kind, data.deterministic) == (seams.DATASET, expected)
        replay = seams.plan_replay(KERAS3_TF, data, (1, 3), 10)
        assert replay.exact is expected and replay.start == ((1, 3) if expected else (1, 0)), name
    tf.random.set_seed(7)  # a global seed gives a shuffle without its own a fixed one: the same order every time
    assert seams.dataset_determinism(base.shuffle(100, reshuffle_each_iteration=False).batch(10)) == (True, "")
