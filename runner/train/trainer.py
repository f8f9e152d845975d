"""The built-in trainer: `python -m runner.train`, started by the supervisor inside the container.

It reads the spec's training section from $RUNNER_TRAINING, resolves the strategy, builds the model under its scope
(or restores it from the newest checkpoint that verifies, optimizer state and position included), trains with
tf.data, and writes metrics.jsonl, progress.json, checkpoints/, tensorboard/ and summary.json.

Two engines, chosen by training.framework: TensorFlow (this module's `prepare`: tf.distribute, tf.data, tf_keras or
Keras 3) and Keras 3 on JAX (jax_engine.py: keras.distribution, numpy). Only the preparation differs; the
callbacks, the fit loop, the checkpoints and the summary below are the same for both.

Each epoch is its own fit call over that epoch's data (runner.train.data: the order is a pure function of seed and
epoch), so a job stopped mid-epoch resumes at the exact step: one fit over the rest of that epoch, then the next
epochs. Keras keeps the compiled train function across fit calls (checked for Keras 3.15 and tf_keras 2.20: no
retrace; about 25 ms of Keras setup per call, beside epochs of seconds).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from runner import contract
from runner.spec import TrainingSpec
from runner.train import perf
from runner.train.checkpoints import Candidate, CheckpointStore, DataOrder, ResumeChooser, scratch_dir
from runner.train.milestones import DEVICE_FOUND, FRAMEWORK_IMPORTED, Milestones
from runner.train.restore import TrainerError, restore
from runner.train.strategy import multi_worker, tpu_present
from runner.watch.rundir import Summary

log = logging.getLogger("runner.train")
__all__ = ["Prepared", "TrainerError", "finish", "fit", "make_callbacks", "prepare", "train"]


def select_keras(choice: str, checkpoint_keras: str | None) -> str:
    """Choose Keras 3 or tf_keras before TensorFlow is imported (TF reads TF_USE_LEGACY_KERAS once, at import).

    auto: the implementation that wrote the checkpoint being resumed (the two cannot read each other's files);
    else $TF_USE_LEGACY_KERAS if set; else tf_keras on TPU, where Keras 3 under TPUStrategy has an open bug
    (keras-team/keras#19448) and Google's own TPU CI uses tf_keras; else Keras 3. On CPU, tf_keras measured 0.94x
    the examples/s of Keras 3 with oneDNN on (14 interleaved epoch pairs, within noise): no reason to switch."""
    if choice == "auto":
        if checkpoint_keras:
            impl = checkpoint_keras
        elif "TF_USE_LEGACY_KERAS" in os.environ:
            impl = "tf_keras" if os.environ["TF_USE_LEGACY_KERAS"].lower() in ("1", "true") else "keras3"
        else:
            impl = "tf_keras" if tpu_present() or multi_worker() else "keras3"
    else:
        impl = choice
    if impl == "keras3" and multi_worker():
        raise TrainerError(
            "Keras 3 cannot train under MultiWorkerMirroredStrategy (keras 3.15: fit fails converting the "
            "distributed batches, PerReplica values); set training.keras to tf_keras or auto"
        )
    if checkpoint_keras and impl != checkpoint_keras:
        raise TrainerError(
            f"the checkpoint to resume from was written by {checkpoint_keras}, which {impl} cannot "
            f"read; set training.keras to {checkpoint_keras} or auto"
        )
    os.environ["TF_USE_LEGACY_KERAS"] = "1" if impl == "tf_keras" else "0"
    os.environ["KERAS_BACKEND"] = "tensorflow"  # Keras 3 under tf.keras: not JAX, whatever the environment says
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # TensorFlow's C++ INFO lines drown the job's own output
    return impl


def keras_version() -> str:
    """The Keras that tf.keras is in this process (TensorFlow reads TF_USE_LEGACY_KERAS as 1, true or True)."""
    if os.environ.get("TF_USE_LEGACY_KERAS") in ("1", "true", "True"):
        import tf_keras

        return f"tf_keras {tf_keras.__version__}"
    import keras as keras3

    return f"keras {keras3.__version__}"


@dataclass
class Prepared:
    """A run ready to fit: strategy, data, datasets, and the compiled (or restored) model. `runner bench` drives the
    same object epoch by epoch, so what it measures is what the trainer runs. Either engine's: `resolved` is a
    strategy.ResolvedStrategy or a distribution.ResolvedDistribution, `perf` a perf.PerfPlan or a
    jaxperf.JaxPerfPlan, the data tf.data's or npdata's."""

    cfg: TrainingSpec
    ctx: contract.JobContext
    keras_impl: str
    keras: Any
    resolved: Any  # ResolvedStrategy
    perf: Any  # PerfPlan
    source: str
    train_examples: int
    test_examples: int
    steps: int
    train_data: Any  # runner.train.data.TrainData
    test_ds: Any
    model: Any
    store: CheckpointStore
    data_order: DataOrder
    resumed: Candidate | None  # the checkpoint the model was restored from
    initial_epoch: int  # epochs done when this process started
    initial_step: int  # steps of the next epoch done when this process started
    initial_global_step: int
    cursor: Any  # runner.train.callbacks.Cursor: where training stands, kept up to date by fit
    t_start: float
    framework: str = "tensorflow"
    versions: dict[str, str] = field(default_factory=dict)  # summary.json's "versions"
    chief: bool = True  # writes the run directory (False: a process other than 0 of a multi-worker run)


def position(resumed: Candidate | None, model: Any, steps: int, order: DataOrder) -> tuple[int, int, int]:
    """(epochs done, steps of the next epoch, global step) to go on from, said in the log."""
    if resumed is None:
        return 0, 0, 0
    ckpt = resumed.checkpoint
    # Training steps taken, from the manifest when it says. The optimizer's own count can be lower: Keras 3's
    # LossScaleOptimizer (mixed_float16) does not count the steps it skips for non-finite gradients.
    global_step = int(model.optimizer.iterations.numpy()) if ckpt.global_step is None else ckpt.global_step
    epochs_done, step = ckpt.position
    if step == 0:
        _say(f"[trainer] resumed from {resumed.name}: epoch {epochs_done} done, optimizer step {global_step}")
        return epochs_done, step, global_step
    _say(
        f"[trainer] resumed from {resumed.name}: epoch {epochs_done + 1} step {step} of {steps} "
        f"(global step {global_step})"
    )
    if step >= steps or (ckpt.data is not None and ckpt.data != order):
        # The rest of that epoch would not be the batches its first part left out: start the epoch over instead.
        _say(
            f"[trainer] {resumed.name} was saved mid-epoch with another data order ({ckpt.data}, now {order}); "
            f"epoch {epochs_done + 1} starts over from step 0"
        )
        step = 0
    return epochs_done, step, global_step


def one_choice(plan: Any, framework: str, resolved: Any, chief: bool) -> Any:
    """The chief's perf choices on every process of a multi-process run (each would otherwise decide for itself,
    from its own timing on a shared machine, and the collectives would fail on mixed dtypes); `plan` unchanged for
    one process."""
    from runner.train import agreement

    shared = agreement.collective(framework, resolved)
    if shared is None:
        return plan
    reduce_sum, _processes, copies = shared
    chosen = agreement.broadcast(perf.run_choices(plan), reduce_sum, chief, copies)
    return plan if chief else perf.adopt_choices(plan, chosen)


def prepare(
    cfg: TrainingSpec, ctx: contract.JobContext, jit_compile: bool | None = None, milestones: Milestones | None = None
) -> Prepared:
    """Everything before the first epoch, on the engine cfg.framework names. `jit_compile` overrides the device's
    choice (perf.py), for `runner bench` to measure the alternative on the device at hand (TensorFlow only: JAX
    always compiles). `milestones` records the start-up's (the trainer's own run)."""
    if cfg.framework == "jax":
        if jit_compile is False:
            raise TrainerError("the JAX engine always compiles with XLA: jit_compile cannot be turned off")
        from runner.train import jax_engine

        prepared: Prepared = jax_engine.prepare(cfg, ctx, milestones)
        return prepared
    t_start = time.time()
    # Which checkpoint to resume from decides which Keras to import: choose before TensorFlow is imported.
    chooser = ResumeChooser.open(ctx.checkpoint_dir, _say)
    first = chooser.next_verified()
    keras_impl = select_keras(cfg.keras, first.keras if first else None)
    env = perf.process_environment()
    import tensorflow as tf

    if milestones is not None:
        milestones.emit(FRAMEWORK_IMPORTED, framework="tensorflow", version=tf.__version__)
    threads = perf.configure_threads(tf)
    from runner.train.callbacks import Cursor
    from runner.train.data import TrainData, eval_dataset, find_mnist, limit
    from runner.train.fused_dropout import fuse_dropout
    from runner.train.models import build_model, make_optimizer
    from runner.train.strategy import is_chief, resolve_strategy

    keras = tf.keras
    resolved = resolve_strategy(ctx.strategy_hint, ctx.tpu_name)
    if milestones is not None:
        milestones.emit(DEVICE_FOUND, strategy=resolved.describe())
    _say(f"[trainer] strategy: {resolved.describe()}; TensorFlow {tf.__version__}, {keras_version()}")
    replicas = resolved.replicas
    if cfg.batch_size % replicas:
        raise TrainerError(f"batch_size {cfg.batch_size} is not divisible by the {replicas} replicas")
    data, source = find_mnist(cfg.data)
    data = limit(data, cfg.max_train_examples, cfg.max_test_examples)
    steps = len(data.x_train) // cfg.batch_size
    if steps == 0:
        raise TrainerError(f"batch_size {cfg.batch_size} is larger than the {len(data.x_train)} training examples")
    _say(
        f"[trainer] data: {source}: {len(data.x_train)} train, {len(data.x_test)} test; global batch "
        f"{cfg.batch_size} = {cfg.batch_size // replicas} per replica x {replicas}; {steps} steps/epoch"
    )
    chief = is_chief(resolved)
    try:
        plan = perf.plan_for(
            resolved.kind,
            steps,
            tf=tf,
            requested_precision=cfg.precision,
            requested_steps=cfg.steps_per_execution,
            requested_jit=jit_compile,
            env=env,
            threads=threads,
            # Only the chief times the variants: the run's choice is one, and every worker takes it (below).
            model=cfg.model if chief else None,
            batch_size=cfg.batch_size,
        )
    except ValueError as exc:
        raise TrainerError(str(exc)) from exc
    plan = one_choice(plan, "tensorflow", resolved, chief)
    _say(f"[trainer] perf: {plan.describe()}")
    keras.utils.set_random_seed(cfg.seed)
    train_data = TrainData(data.x_train, data.y_train, cfg.batch_size, cfg.seed)
    test_ds = eval_dataset(data.x_test, data.y_test, cfg.batch_size)
    order = DataOrder(cfg.seed, len(data.x_train), cfg.batch_size, steps)

    # Layers built from here on compute in this dtype; a restored model keeps the policy it was saved with.
    keras.mixed_precision.set_global_policy(plan.precision)
    with resolved.strategy.scope():
        model, resumed = restore(chooser, first, keras, keras_impl, "tensorflow", _say)
        if resumed is not None and plan.jit_compile is not None:
            model.jit_compile = plan.jit_compile  # the plan decides, not the checkpoint (a JAX one says XLA on)
        if model is None:
            if chooser.found_any:
                _say(f"[trainer] no checkpoint verifies ({len(chooser.skipped)} skipped): starting over from epoch 1")
            model = build_model(cfg.model, keras)
            xla = {} if plan.jit_compile is None else {"jit_compile": plan.jit_compile}
            model.compile(
                # Keras wraps the optimizer in a LossScaleOptimizer itself under mixed_float16.
                optimizer=make_optimizer(cfg.optimizer, cfg.learning_rate, keras),
                loss="sparse_categorical_crossentropy",
                # Weighted, so the zero-weight padding of the last test batch does not count.
                weighted_metrics=["accuracy", keras.metrics.SparseCategoricalCrossentropy(name="xent")],
                steps_per_execution=plan.steps_per_execution,
                **xla,
            )
        if plan.dropout == "xla":  # on the model built or restored: the choice is this run's, not the checkpoint's
            fuse_dropout(model, tf)
    epochs_done, step, global_step = position(resumed, model, steps, order)
    store = CheckpointStore(ctx.checkpoint_dir if chief else scratch_dir() / contract.CHECKPOINTS, cfg.checkpoint_keep)
    store.history = chooser.history_for(resumed) if chief else []
    return Prepared(
        cfg=cfg,
        ctx=ctx,
        keras_impl=keras_impl,
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
        versions={"tensorflow": tf.__version__, "keras": keras_version()},
        chief=chief,
    )


def make_callbacks(run: Prepared, clock: Callable[[], float] = time.monotonic) -> tuple[list[Any], Any]:
    """The contract's callbacks (position, metrics, progress, TensorBoard, checkpoints) and the StopSignal, which
    notes SIGTERM and SIGINT from here on. `clock` times checkpoint_every durations and progress (tests inject it).
    A process that does not write the run directory (not run.chief) keeps the position, prints progress and stops
    on a signal where the others do, and saves its checkpoints where the chief does, but to a scratch directory
    (its run.store: checkpoints.scratch_dir)."""
    from runner.train import agreement
    from runner.train import callbacks as cb
    from runner.train.checkpoints import CheckpointPolicy

    cfg, keras = run.cfg, run.keras
    stop = cb.StopSignal()
    cursor = run.cursor
    policy = CheckpointPolicy(cfg.checkpoint_epochs, cfg.checkpoint_seconds, cfg.epochs, clock)
    checkpointer = cb.Checkpointer(
        run.store,
        cursor,
        policy,
        stop,
        run.keras_impl,
        run.data_order,
        run.resumed.checkpoint if run.resumed else None,
        framework=run.framework,
        agreement=agreement.for_run(run.framework, run.resolved),
    )
    checkpointer.set_model(run.model)  # a stop between two fits saves before any fit has set it
    if not run.chief:
        return [cursor, cb.Progress(cursor, cfg.batch_size, None, clock), checkpointer], stop
    if run.framework == "jax":
        board: Any = cb.ScalarBoard(run.ctx.tensorboard_dir)  # keras' TensorBoard writes through TensorFlow
    else:
        board = keras.callbacks.TensorBoard(
            str(run.ctx.tensorboard_dir), update_freq="epoch", profile_batch=0, write_graph=False
        )
    callbacks = [
        cursor,  # first: the others read the position it keeps
        cb.EpochMetrics(run.ctx.metrics_file, cursor, cfg.batch_size),
        cb.Progress(cursor, cfg.batch_size, run.ctx.progress_file, clock),
        board,
        checkpointer,  # last: an epoch's checkpoint follows its metrics row
    ]
    return callbacks, stop


def _find(callbacks: list[Any], kind: type) -> Any:
    return next(c for c in callbacks if isinstance(c, kind))


def fit(run: Prepared, callbacks: list[Any], until_epoch: int, from_epoch: int | None = None) -> None:
    """Train up to epoch until_epoch (1-based), one Keras fit per epoch, validating on the test set after each:
    from where the run stands (a resume may start mid-epoch), or from the start of epoch from_epoch+1.
    Raises TrainingInterrupted when a stop signal cut an epoch; returns early when one came at an epoch end."""
    from runner.train import callbacks as cb

    cursor, checkpointer = _find(callbacks, cb.Cursor), _find(callbacks, cb.Checkpointer)
    epoch, skip = cursor.position if from_epoch is None else (from_epoch, 0)
    for index in range(epoch, until_epoch):
        if checkpointer.stopping():  # came between two fits
            checkpointer.stop_here()
            return
        cursor.begin(index, skip)
        try:
            run.model.fit(
                run.train_data.epoch(index, skip),
                epochs=index + 1,
                initial_epoch=index,
                validation_data=run.test_ds,
                callbacks=callbacks,
                verbose=0,
                shuffle=False,  # the epoch's order is fixed by TrainData
            )
        except cb.TrainingInterrupted:
            # fit ended without on_train_end: close TensorBoard's writers so the event files are complete.
            for callback in callbacks:
                if isinstance(callback, run.keras.callbacks.TensorBoard):
                    callback.on_train_end()
                elif isinstance(callback, cb.ScalarBoard):
                    callback.close()
            _find(callbacks, cb.Progress).write()
            raise
        skip = 0
        if checkpointer.stopped:  # decided at the epoch's end (a signal during its last step or validation)
            return


def finish(run: Prepared) -> dict[str, Any]:
    """Final evaluation and summary.json (written by the chief only; every process evaluates)."""
    from runner.train import callbacks as cb

    cfg, ctx = run.cfg, run.ctx
    results = run.model.evaluate(run.test_ds, verbose=0, return_dict=True)
    rows = cb.read_jsonl(ctx.metrics_file)
    epoch_times = [r["epoch_time_s"] for r in rows]
    # The first epoch of a process compiles the step function; like the notebook, report the others.
    ran = [r for r in rows if r["epoch"] > run.initial_epoch]
    steady = [r["examples_per_s"] for r in ran[1:]] or [r["examples_per_s"] for r in ran or rows]
    newest = run.store.history[0].file if run.store.history else None
    global_step = run.cursor.global_step
    resumed = run.resumed.checkpoint if run.resumed else None
    values = {
        "run_id": ctx.run_id,
        "state": "succeeded",
        "model": cfg.model,
        "dataset": cfg.dataset,
        "data_source": run.source,
        "epochs": cfg.epochs,
        "steps_per_epoch": run.steps,
        "global_step": global_step,
        "steps_this_attempt": global_step - run.initial_global_step,
        "optimizer_iterations": int(run.model.optimizer.iterations.numpy()),
        "resumed_from": {"checkpoint": resumed.file, "epoch": resumed.epochs_done, "step": resumed.step}
        if resumed
        else None,
        "resumed_from_epoch": run.initial_epoch or None,
        "test_accuracy": round(float(results["accuracy"]), 6),
        "test_loss": round(float(results["xent"]), 6),
        "train_examples": run.train_examples,
        "test_examples": run.test_examples,
        "global_batch_size": cfg.batch_size,
        "per_replica_batch_size": cfg.batch_size // run.resolved.replicas,
        "learning_rate": cfg.learning_rate,
        "epoch_times_s": epoch_times,
        "examples_per_s": round(sum(steady) / len(steady), 1) if steady else None,
        "strategy": run.resolved.as_dict(),
        "framework": run.framework,
        "keras": run.keras_impl,
        "perf": run.perf.as_dict(),
        "versions": run.versions,
        "checkpoint": f"{contract.CHECKPOINTS}/{newest}" if newest else None,
        "wall_time_s": round(time.time() - run.t_start, 1),
    }
    summary = Summary.of(**values).to_json()
    if run.chief:
        cb.write_atomic(ctx.output_dir / contract.SUMMARY, json.dumps(summary, indent=1).encode())
    _say(f"[trainer] done: test accuracy {summary['test_accuracy']:.4f}, {summary['examples_per_s']} examples/s")
    return summary


def train(cfg: TrainingSpec, ctx: contract.JobContext) -> dict[str, Any]:
    if cfg.framework == "jax":
        from runner.train.jax_engine import keep_tensorflow_out

        keep_tensorflow_out()  # the trainer's own process only: prepare() may be driven by code that wants TF
    milestones = Milestones(ctx)
    run = prepare(cfg, ctx, milestones=milestones)
    # Only now: the callbacks' base class is the Keras that prepare() chose (tf_keras, or Keras 3 on an engine).
    from runner.train.callbacks import Checkpointer, TrainingInterrupted

    callbacks, stop = make_callbacks(run)
    callbacks.append(milestones.first_step_callback(run.keras))
    with contextlib.suppress(TrainingInterrupted):  # the stop is reported below, like one at an epoch end
        fit(run, callbacks, cfg.epochs)
    checkpointer = _find(callbacks, Checkpointer)
    # With several processes only an agreed stop ends here: one that came after the last agreement point finishes
    # with the others (the final evaluation is collective too).
    if checkpointer.stopped or (checkpointer.agreement is None and stop.signum is not None):
        _say("[trainer] stopped before the end; the newest checkpoint is kept for a resume")
        raise SystemExit(stop.exit_code)
    return finish(run)


def _say(line: str) -> None:
    print(line, flush=True)


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="[trainer] %(levelname)s %(message)s")
    raw = os.environ.get(contract.TRAINING)
    try:
        cfg = TrainingSpec.model_validate_json(raw) if raw else TrainingSpec()
    except ValueError as exc:
        print(f"[trainer] error: {contract.TRAINING} is not a valid training section: {exc}", file=sys.stderr)
        return 2
    ctx = contract.JobContext.from_env()
    from runner.datasets import DatasetError
    from runner.train.strategy import StrategyError

    try:
        train(cfg, ctx)
    except (TrainerError, DatasetError, StrategyError) as exc:
        print(f"[trainer] error: {exc}", file=sys.stderr, flush=True)
        return 2
    return 0
