"""The calibration a run on one process does after its first epoch (runner.train.trainer.calibrate_between_epochs):
the run goes on in the variant picked, its model built again in that variant (precision policy, dropout kernel)
with every variable and the optimizer's state, unrounded (carry_state); a stop that comes during the timing ends it
at once. The whole path, calibration included, runs in tests/train/test_trainer.py."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from runner.train.callbacks import StopRequested, StopSignal
from runner.train.fused_dropout import fuse_dropout, fused_layers
from runner.train.models import build_model
from runner.train.perf import PerfPlan
from runner.train.trainer import calibrate_between_epochs, carry_state


@pytest.fixture(scope="module")
def tf() -> Any:
    return pytest.importorskip("tensorflow")


def compiled(tf: Any, model: str, policy: str) -> Any:
    keras = tf.keras
    keras.mixed_precision.set_global_policy(policy)
    try:
        built = build_model(model, keras, (28, 28, 1), 10)
        built.compile(optimizer=keras.optimizers.Adam(3e-3), loss="sparse_categorical_crossentropy")
    finally:
        keras.mixed_precision.set_global_policy("float32")
    return built


def values(variables: list[Any]) -> list[np.ndarray]:
    return [np.array(v.numpy()) for v in variables]


def test_a_model_rebuilt_in_another_variant_goes_on_from_the_state_it_had(tf: Any, mnist_npz: Path) -> None:
    with np.load(mnist_npz) as data:
        x = (data["x_train"][:64, :, :, None] / 255.0).astype("float32")
        y = data["y_train"][:64].astype("int32")
    old = compiled(tf, "mnist_cnn", "float32")
    for _ in range(3):
        old.train_on_batch(x, y)
    tf.keras.backend.clear_session()  # as the calibration leaves it: the rebuilt model's layers have the old names
    new = compiled(tf, "mnist_cnn", "mixed_bfloat16")
    assert fuse_dropout(new, tf) == fused_layers(new, tf) > 0
    assert carry_state(old, new) is None
    # Weights, the dropout layers' seed states, Adam's step count, learning rate and moments: all of them, equal.
    assert len(new.variables) > len(new.trainable_variables)  # the seed generators' states are among them
    for before, after in zip(values(old.variables), values(new.variables), strict=True):
        np.testing.assert_array_equal(before, after)
    for before, after in zip(values(old.optimizer.variables), values(new.optimizer.variables), strict=True):
        np.testing.assert_array_equal(before, after)
    assert int(new.optimizer.iterations.numpy()) == 3
    new.train_on_batch(x, y)  # goes on, in bfloat16, from step 3
    assert int(new.optimizer.iterations.numpy()) == 4
    assert new.layers[0].compute_dtype == "bfloat16" and new.layers[0].kernel.dtype == "float32"


@pytest.mark.parametrize("impl", ["keras3", "tf_keras"])
def test_a_model_that_is_not_the_same_is_left_as_it_was(tf: Any, impl: str) -> None:
    keras = tf.keras if impl == "keras3" else pytest.importorskip("tf_keras")

    def built(model: str, shape: tuple[int, ...]) -> Any:
        made = build_model(model, keras, shape, 10)
        made.compile(optimizer=keras.optimizers.Adam(), loss="sparse_categorical_crossentropy")
        made.optimizer.build(made.trainable_variables)
        return made

    old = built("mnist_cnn", (28, 28, 1))
    for other, shape, said in (("mnist_mlp", (28, 28, 1), "differ in number"), ("mnist_cnn", (28, 28, 3), " is (")):
        new = built(other, shape)
        before = values(new.variables)
        problem = carry_state(old, new)
        assert problem is not None and said in problem, problem
        for was, now in zip(before, values(new.variables), strict=True):
            np.testing.assert_array_equal(was, now)


def signalled_meanwhile() -> None:
    """SIGTERM to this process, then work that only the signal's handler can end (the test fails after 30 s)."""
    os.kill(os.getpid(), signal.SIGTERM)
    for _ in range(3000):
        time.sleep(0.01)
    pytest.fail("the stop did not end the work")


def test_a_stop_ends_work_that_can_be_left_at_once_and_is_only_noted_elsewhere() -> None:
    stop = StopSignal()
    try:
        with pytest.raises(StopRequested, match="SIGTERM"), stop.interruptible():
            signalled_meanwhile()
        assert stop.signum == signal.SIGTERM
        with pytest.raises(StopRequested), stop.interruptible():  # one that came before: not even begun
            pytest.fail("entered after a stop")
    finally:
        stop.uninstall()
    noted = StopSignal()
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(3000):  # the handler runs in this thread soon; it notes, and raises nothing
            if noted.signum is not None:
                break
            time.sleep(0.01)
        assert noted.signum == signal.SIGTERM
    finally:
        noted.uninstall()


def test_a_stop_during_the_calibration_after_the_first_epoch_leaves_it_off(capsys: pytest.CaptureFixture[str]) -> None:
    class Timing:  # the engine's plan, timing its variants when the stop comes
        def plan(self, *args: Any, **kwargs: Any) -> Any:
            signalled_meanwhile()

    deferred = PerfPlan("cpu", "float32", False, 1, precision_source="deferred")
    run = SimpleNamespace(
        perf=deferred,
        cursor=SimpleNamespace(position=(1, 0)),
        engine=Timing(),
        resolved=None,
        steps=4,
        cfg=SimpleNamespace(model="mnist_cnn"),
        inputs=None,
        model=None,
    )
    stop = StopSignal()
    try:
        calibrate_between_epochs(run, [], stop)  # type: ignore[arg-type]
    finally:
        stop.uninstall()
    # The run goes on as it was, plain and still to be calibrated, and the stop is there for fit to act on.
    assert run.perf is deferred and stop.signum == signal.SIGTERM
    assert "SIGTERM: the variants' timing after epoch 1 is left off; saving a checkpoint" in capsys.readouterr().out
