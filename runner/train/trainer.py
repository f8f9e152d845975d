"""The built-in trainer: `python -m runner.train`, started by the supervisor inside the container.

It reads the spec's training section from $RUNNER_TRAINING, resolves the strategy, builds the model under its scope
(or restores it from the newest checkpoint in the output directory, optimizer state and epoch included), trains
with tf.data, and writes metrics.jsonl, checkpoints/, tensorboard/ and summary.json.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

from runner import contract
from runner.spec import TrainingSpec
from runner.train import perf
from runner.train.checkpoints import latest_checkpoint, read_manifest
from runner.train.strategy import tpu_present

log = logging.getLogger("runner.train")

EXIT_STOPPED = 143  # 128 + SIGTERM, what a shell reports for a job stopped by SIGTERM


class TrainerError(Exception):
    """A problem with the job's configuration or data that a traceback would only obscure."""


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
            impl = "tf_keras" if tpu_present() else "keras3"
    else:
        impl = choice
    if checkpoint_keras and impl != checkpoint_keras:
        raise TrainerError(
            f"the checkpoint to resume from was written by {checkpoint_keras}, which {impl} cannot "
            f"read; set training.keras to {checkpoint_keras} or auto"
        )
    os.environ["TF_USE_LEGACY_KERAS"] = "1" if impl == "tf_keras" else "0"
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
    same object epoch by epoch, so what it measures is what the trainer runs."""

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
    train_ds: Any
    test_ds: Any
    model: Any
    initial_epoch: int
    t_start: float


def prepare(cfg: TrainingSpec, ctx: contract.JobContext, jit_compile: bool | None = None) -> Prepared:
    """Everything before the first epoch. `jit_compile` overrides the device's choice (perf.py), for `runner bench`
    to measure the alternative on the device at hand."""
    t_start = time.time()
    manifest = read_manifest(ctx.checkpoint_dir)
    keras_impl = select_keras(cfg.keras, manifest.get("keras") if manifest else None)
    env = perf.process_environment()
    import tensorflow as tf

    threads = perf.configure_threads(tf)
    from runner.train.data import eval_dataset, find_mnist, limit, train_dataset
    from runner.train.models import build_model, make_optimizer
    from runner.train.strategy import resolve_strategy

    keras = tf.keras
    resolved = resolve_strategy(ctx.strategy_hint, ctx.tpu_name)
    print(f"[trainer] strategy: {resolved.describe()}; TensorFlow {tf.__version__}, {keras_version()}", flush=True)
    replicas = resolved.replicas
    if cfg.batch_size % replicas:
        raise TrainerError(f"batch_size {cfg.batch_size} is not divisible by the {replicas} replicas")
    data, source = find_mnist(cfg.data)
    data = limit(data, cfg.max_train_examples, cfg.max_test_examples)
    steps = len(data.x_train) // cfg.batch_size
    if steps == 0:
        raise TrainerError(f"batch_size {cfg.batch_size} is larger than the {len(data.x_train)} training examples")
    print(
        f"[trainer] data: {source}: {len(data.x_train)} train, {len(data.x_test)} test; global batch "
        f"{cfg.batch_size} = {cfg.batch_size // replicas} per replica x {replicas}; {steps} steps/epoch",
        flush=True,
    )
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
        )
    except ValueError as exc:
        raise TrainerError(str(exc)) from exc
    print(f"[trainer] perf: {plan.describe()}", flush=True)
    keras.utils.set_random_seed(cfg.seed)
    train_ds = train_dataset(data.x_train, data.y_train, cfg.batch_size, cfg.seed)
    test_ds = eval_dataset(data.x_test, data.y_test, cfg.batch_size)

    resume = latest_checkpoint(ctx.checkpoint_dir)
    # Layers built from here on compute in this dtype; a restored model keeps the policy it was saved with.
    keras.mixed_precision.set_global_policy(plan.precision)
    with resolved.strategy.scope():
        if resume:
            initial_epoch, path = resume
            model = keras.models.load_model(path)
            print(
                f"[trainer] resumed from {path.name}: epoch {initial_epoch} done, optimizer step "
                f"{int(model.optimizer.iterations.numpy())}",
                flush=True,
            )
        else:
            initial_epoch = 0
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
        train_ds=train_ds,
        test_ds=test_ds,
        model=model,
        initial_epoch=initial_epoch,
        t_start=t_start,
    )


def make_callbacks(run: Prepared) -> tuple[list[Any], Any]:
    """The contract's callbacks (metrics, checkpoints, progress, TensorBoard) and the SIGTERM handler among them."""
    from runner.train import callbacks as cb

    cfg, keras = run.cfg, run.keras
    stop = cb.GracefulStop()
    callbacks = [
        cb.EpochMetrics(run.ctx.metrics_file, run.steps * cfg.batch_size),
        cb.Checkpointer(run.ctx.checkpoint_dir, cfg.checkpoint_every, cfg.epochs, run.keras_impl),
        cb.Progress(cfg.epochs, run.steps, cfg.batch_size),
        keras.callbacks.TensorBoard(
            str(run.ctx.tensorboard_dir), update_freq="epoch", profile_batch=0, write_graph=False
        ),
        stop,
    ]
    return callbacks, stop


def fit(run: Prepared, callbacks: list[Any], until_epoch: int, from_epoch: int | None = None) -> None:
    """Train epochs from_epoch+1 .. until_epoch (1-based), validating on the test set after each."""
    run.model.fit(
        run.train_ds,
        epochs=until_epoch,
        initial_epoch=run.initial_epoch if from_epoch is None else from_epoch,
        validation_data=run.test_ds,
        callbacks=callbacks,
        verbose=0,
        shuffle=False,  # train_ds shuffles itself
    )


def finish(run: Prepared) -> dict[str, Any]:
    """Final evaluation and summary.json."""
    import tensorflow as tf

    from runner.train import callbacks as cb

    cfg, ctx = run.cfg, run.ctx
    results = run.model.evaluate(run.test_ds, verbose=0, return_dict=True)
    rows = cb.read_jsonl(ctx.metrics_file)
    epoch_times = [r["epoch_time_s"] for r in rows]
    # The first epoch of a process compiles the step function; like the notebook, report the others.
    ran = [r for r in rows if r["epoch"] > run.initial_epoch]
    steady = [r["examples_per_s"] for r in ran[1:]] or [r["examples_per_s"] for r in ran or rows]
    latest = latest_checkpoint(ctx.checkpoint_dir)
    summary = {
        "run_id": ctx.run_id,
        "state": "succeeded",
        "model": cfg.model,
        "dataset": cfg.dataset,
        "data_source": run.source,
        "epochs": cfg.epochs,
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
        "keras": run.keras_impl,
        "perf": run.perf.as_dict(),
        "versions": {"tensorflow": tf.__version__, "keras": keras_version()},
        "checkpoint": f"{contract.CHECKPOINTS}/{latest[1].name}" if latest else None,
        "wall_time_s": round(time.time() - run.t_start, 1),
    }
    cb.write_atomic(ctx.output_dir / contract.SUMMARY, json.dumps(summary, indent=1).encode())
    print(
        f"[trainer] done: test accuracy {summary['test_accuracy']:.4f}, {summary['examples_per_s']} examples/s",
        flush=True,
    )
    return summary


def train(cfg: TrainingSpec, ctx: contract.JobContext) -> dict[str, Any]:
    run = prepare(cfg, ctx)
    callbacks, stop = make_callbacks(run)
    if run.initial_epoch < cfg.epochs:
        fit(run, callbacks, cfg.epochs)
    if stop.signum is not None:
        print("[trainer] stopped before the end; the newest checkpoint is kept for a resume", flush=True)
        raise SystemExit(EXIT_STOPPED)
    return finish(run)


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
