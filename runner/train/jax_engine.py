"""The built-in trainer on Keras 3 over JAX (training.framework: jax): what differs from the TensorFlow engine.

Only the preparation differs; trainer.py drives both engines through the same callbacks, fit, checkpoints and
summary (the run-directory contract is one). Here:

  * no TensorFlow in the process: `keep_tensorflow_out()` makes `import tensorflow` fail in the built-in trainer's
    process, so Keras' optional probes (keras.utils.set_random_seed and the saving code ask whether TensorFlow is
    installed, and import it when it is) find none. A TensorFlow TPU build loaded beside JAX could take the TPU.
  * devices: runner.train.distribution (DataParallel over every device; keras.distribution.initialize() first on
    a multi-host slice), which is also the device probe: a RUNNER_STRATEGY of tpu or gpu that JAX cannot see is
    the trainer's exit 2 before any data is read;
  * data: runner.train.npdata (numpy through keras.utils.PyDataset; each process feeds its share of a batch);
  * speed: runner.train.jaxperf;
  * multi-host: every process trains, process 0 alone writes the run directory (the others print progress, which
    is what their supervisors watch).
"""

from __future__ import annotations

import importlib.abc
import logging
import os
import sys
import time
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from runner import contract
from runner.spec import TrainingSpec
from runner.train import jaxperf, npdata
from runner.train.checkpoints import CheckpointStore, DataOrder, ResumeChooser, scratch_dir
from runner.train.milestones import DEVICE_FOUND, FRAMEWORK_IMPORTED, Milestones
from runner.train.restore import TrainerError, restore

KERAS_IMPL = "keras3"
_KEPT_OUT = ("tensorflow", "tf_keras")


class _NoTensorFlow(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None) -> None:
        if fullname.partition(".")[0] in _KEPT_OUT:
            raise ModuleNotFoundError(
                f"No module named {fullname!r} (the JAX engine keeps TensorFlow out)", name=fullname
            )
        return None


def keep_tensorflow_out() -> None:
    """From here on, importing TensorFlow (or tf_keras) in this process fails as if it were not installed, and
    Keras, when first imported, runs on JAX."""
    if any(m in sys.modules for m in _KEPT_OUT):
        raise TrainerError("TensorFlow is already imported in this process; the JAX engine runs without it")
    if not any(isinstance(f, _NoTensorFlow) for f in sys.meta_path):
        sys.meta_path.insert(0, _NoTensorFlow())
    os.environ["KERAS_BACKEND"] = "jax"
    os.environ.pop("TF_USE_LEGACY_KERAS", None)


def _say(line: str) -> None:
    print(line, flush=True)


def prepare(cfg: TrainingSpec, ctx: contract.JobContext, milestones: Milestones | None = None) -> Any:
    """trainer.prepare for the JAX engine: a trainer.Prepared. `milestones` records the start-up's (as trainer's)."""
    from runner.train import trainer
    from runner.train.data import find_mnist, limit
    from runner.train.distribution import expect, keras_on_jax, resolve_distribution
    from runner.train.models import build_model, make_optimizer

    t_start = time.time()
    os.environ.pop("TF_USE_LEGACY_KERAS", None)  # tf_keras is TensorFlow's; the callbacks take Keras 3
    chooser = ResumeChooser.open(ctx.checkpoint_dir, _say)
    first = chooser.next_verified()
    if first is not None and first.keras == "tf_keras":
        raise TrainerError(
            f"the checkpoint to resume from, {first.name}, was written by tf_keras (Keras 2, TensorFlow only), which "
            "Keras 3 on JAX cannot read; set training.framework: tensorflow to continue it"
        )
    hint = expect(ctx.strategy_hint)  # before JAX is imported
    # JAX logs at INFO each platform it cannot start ("Unable to initialize backend 'tpu'"), which the trainer's
    # INFO logging would print on every CPU run; what matters reaches the strategy line (its note) or the error.
    logging.getLogger("jax._src.xla_bridge").setLevel(logging.WARNING)
    keras = keras_on_jax(force=True)
    # Before initialize(): with a seed set, Keras does not agree on one across hosts with a collective.
    keras.utils.set_random_seed(cfg.seed)
    if milestones is not None:
        milestones.emit(FRAMEWORK_IMPORTED, framework="jax", version=keras.__version__)
    resolved = resolve_distribution(hint, num_workers=ctx.num_workers, force_backend=True)
    import jax

    if milestones is not None:
        milestones.emit(DEVICE_FOUND, strategy=resolved.describe())

    _say(f"[trainer] strategy: {resolved.describe()}; JAX {jax.__version__}, keras {keras.__version__}")
    replicas = resolved.replicas
    if cfg.batch_size % replicas:
        raise TrainerError(f"batch_size {cfg.batch_size} is not divisible by the {replicas} replicas")
    data, source = find_mnist(cfg.data, keras)
    data = limit(data, cfg.max_train_examples, cfg.max_test_examples)
    steps = len(data.x_train) // cfg.batch_size
    if steps == 0:
        raise TrainerError(f"batch_size {cfg.batch_size} is larger than the {len(data.x_train)} training examples")
    _say(
        f"[trainer] data: {source}: {len(data.x_train)} train, {len(data.x_test)} test; global batch "
        f"{cfg.batch_size} = {cfg.batch_size // replicas} per replica x {replicas}; {steps} steps/epoch"
    )
    try:
        plan = jaxperf.plan_for(
            resolved.kind,
            steps,
            device=jax.devices()[0],
            requested_precision=cfg.precision,
            requested_steps=cfg.steps_per_execution,
        )
    except ValueError as exc:
        raise TrainerError(str(exc)) from exc
    plan = trainer.one_choice(plan, "jax", resolved, resolved.is_chief)
    _say(f"[trainer] perf: {plan.describe()}")
    share = {"process": resolved.process_index, "processes": resolved.processes}
    train_data = npdata.TrainData(keras, data.x_train, data.y_train, cfg.batch_size, cfg.seed, **share)
    test_ds = npdata.eval_data(keras, data.x_test, data.y_test, cfg.batch_size, **share)
    order = DataOrder(cfg.seed, len(data.x_train), cfg.batch_size, steps, shuffle=npdata.SHUFFLE)

    keras.mixed_precision.set_global_policy(plan.precision)
    model, resumed = restore(chooser, first, keras, KERAS_IMPL, "jax", _say)
    if model is None:
        if chooser.found_any:
            _say(f"[trainer] no checkpoint verifies ({len(chooser.skipped)} skipped): starting over from epoch 1")
        model = build_model(cfg.model, keras)
        model.compile(
            optimizer=make_optimizer(cfg.optimizer, cfg.learning_rate, keras),
            loss="sparse_categorical_crossentropy",
            weighted_metrics=["accuracy", keras.metrics.SparseCategoricalCrossentropy(name="xent")],
            steps_per_execution=plan.steps_per_execution,
        )
    else:
        # The plan, not the checkpoint, decides how this process runs (a TensorFlow CPU checkpoint says no XLA).
        model.jit_compile = True
        model.steps_per_execution = plan.steps_per_execution
    epochs_done, step, global_step = trainer.position(resumed, model, steps, order)
    # Saving reads every process's arrays (a collective): the other processes save too, to a scratch directory.
    chief = resolved.is_chief
    store = CheckpointStore(ctx.checkpoint_dir if chief else scratch_dir() / contract.CHECKPOINTS, cfg.checkpoint_keep)
    store.history = chooser.history_for(resumed) if chief else []
    from runner.train.callbacks import Cursor

    return trainer.Prepared(
        cfg=cfg,
        ctx=ctx,
        keras_impl=KERAS_IMPL,
        keras=keras,
        resolved=resolved,
        perf=plan,
        source=source,
        train_examples=len(data.x_train),
        test_examples=len(data.x_test),
        steps=steps,
        train_data=train_data,
        test_ds=test_ds,
        model=model,
        store=store,
        data_order=order,
        resumed=resumed,
        initial_epoch=epochs_done,
        initial_step=step,
        initial_global_step=global_step,
        cursor=Cursor(steps, cfg.epochs, (epochs_done, step), global_step),
        t_start=t_start,
        framework="jax",
        versions={"jax": jax.__version__, "keras": f"keras {keras.__version__}"},
        chief=chief,
    )
