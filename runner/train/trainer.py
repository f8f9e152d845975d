"""The built-in trainer: `python -m runner.train`, started by the supervisor inside the container.

It reads the spec's training section from $RUNNER_TRAINING, finds and checks the data (runner.train.inputs), builds
the model (built-in, or yours: training.model module:function) under the engine's device scope and the run's
precision, compiles it, fills it from the newest checkpoint that verifies (optimizer state and position included),
trains, and writes metrics.jsonl, progress.json, checkpoints/, tensorboard/ and summary.json.

The engine (runner.train.engines: TensorFlow, or Keras 3 on JAX) answers what differs between the two: the Keras and
framework, the devices, the speed choices, the feed. Everything else is here once. The callbacks are the library
that a user's own fit gets with keras_callbacks() (runner.train.library): one implementation for both.

A CPU calibration (perf.py) the start-up cache cannot answer does not hold up the first step of a run on one
process: the first epoch trains in the plain variant, the variants are timed after it, and the epochs left train in
the one picked (calibrate_between_epochs).

Each epoch is its own fit call over that epoch's data (the feed's order is a pure function of seed and epoch), so
a job stopped mid-epoch resumes at the exact step: one fit over the rest of that epoch, then the next epochs. Keras
keeps the compiled train function across fit calls (checked for Keras 3.15 and tf_keras 2.20: no retrace; about
25 ms of Keras setup per call, beside epochs of seconds).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from runner import contract
from runner.checkpoints.resumed import EVENT as RESUMED
from runner.checkpoints.resumed import RESTORED, Resumed, furthest_step
from runner.spec import TrainingSpec
from runner.train import choices, heap
from runner.train.checkpoints import Candidate, CheckpointStore, DataOrder, ResumeChooser, scratch_dir
from runner.train.engines import Engine, engine_for
from runner.train.milestones import DATA_LOADED, DEVICE_FOUND, FRAMEWORK_IMPORTED, Milestones
from runner.train.restore import TrainerError, restore_into
from runner.train.resume import start_from
from runner.watch.rundir import Summary

log = logging.getLogger("runner.train")
__all__ = ["Prepared", "TrainerError", "finish", "fit", "make_callbacks", "prepare", "train"]


@dataclass
class Prepared:
    """A run ready to fit: engine, devices, data, and the compiled (and restored) model. `runner bench` drives the
    same object epoch by epoch, so what it measures is what the trainer runs."""

    cfg: TrainingSpec
    ctx: contract.JobContext
    engine: Engine
    keras: Any
    resolved: Any  # strategy.ResolvedStrategy or distribution.ResolvedDistribution
    perf: Any  # perf.PerfPlan or jaxperf.JaxPerfPlan
    source: str
    train_examples: int
    test_examples: int
    steps: int
    inputs: Any  # inputs.Inputs: the examples and labels the model is built and checked for (a rebuild too)
    train_data: Any  # the engine's feed: .epoch(index, skip)
    test_ds: Any
    model: Any
    store: CheckpointStore
    data_order: DataOrder
    resumed: Candidate | None  # the checkpoint the model was restored from
    resumption: Resumed | None  # where this attempt went on from, as said (None: a first attempt)
    initial_epoch: int  # epochs done when this process started
    initial_step: int  # steps of the next epoch done when this process started
    initial_global_step: int
    cursor: Any  # runner.train.callbacks.Cursor: where training stands, kept up to date by fit
    t_start: float
    versions: dict[str, str] = field(default_factory=dict)  # summary.json's "versions"
    chief: bool = True  # writes the run directory (False: a process other than 0 of a multi-worker run)

    @property
    def classes(self) -> int:
        return int(self.inputs.classes)

    @property
    def framework(self) -> str:
        return self.engine.framework

    @property
    def keras_impl(self) -> str:
        return self.engine.keras_impl


def one_choice(plan: Any, framework: str, resolved: Any, chief: bool) -> Any:
    """The chief's perf choices on every process of a multi-process run (each would otherwise decide for itself,
    from its own timing on a shared machine, and the collectives would fail on mixed dtypes); `plan` unchanged for
    one process."""
    from runner.train import agreement

    shared = agreement.collective(framework, resolved)
    if shared is None:
        return plan
    reduce_sum, _processes, copies = shared
    chosen = agreement.broadcast(choices.run_choices(plan), reduce_sum, chief, copies)
    return plan if chief else choices.adopt_choices(plan, chosen)


def compile_model(model: Any, cfg: TrainingSpec, keras: Any, plan: Any, labels: str) -> None:
    """Compile for the run: the spec's optimizer (or the one a model of yours came compiled with, and its loss),
    the cross-entropy its labels need, weighted metrics (the zero-weight padding of the last test batch does not
    count) and the plan's steps per execution and XLA."""
    from runner.train.inputs import SPARSE
    from runner.train.models import make_optimizer

    sparse = labels == SPARSE
    optimizer, loss = getattr(model, "optimizer", None), getattr(model, "loss", None)
    if optimizer is None:  # not compiled by its builder
        optimizer = make_optimizer(cfg.optimizer, cfg.learning_rate, keras)
    if not loss:
        loss = "sparse_categorical_crossentropy" if sparse else "categorical_crossentropy"
    metric = keras.metrics.SparseCategoricalCrossentropy if sparse else keras.metrics.CategoricalCrossentropy
    xla = {} if plan.jit_compile is None else {"jit_compile": plan.jit_compile}
    model.compile(
        # Keras wraps the optimizer in a LossScaleOptimizer itself under mixed_float16.
        optimizer=optimizer,
        loss=loss,
        weighted_metrics=["accuracy", metric(name="xent")],
        steps_per_execution=plan.steps_per_execution,
        **xla,
    )


def prepare(
    cfg: TrainingSpec,
    ctx: contract.JobContext,
    jit_compile: bool | None = None,
    milestones: Milestones | None = None,
    defer_calibration: bool = False,
) -> Prepared:
    """Everything before the first epoch, on the engine cfg.framework names. `jit_compile` overrides the device's
    choice (perf.py), for `runner bench` to measure the alternative on the device at hand (TensorFlow only: JAX
    always compiles). `milestones` records the start-up's (the trainer's own run). `defer_calibration`: a CPU
    calibration the start-up cache cannot answer is left for calibrate_between_epochs (one process only)."""
    from runner.datasets import DatasetError
    from runner.train import agreement
    from runner.train import inputs as data_inputs

    t_start = time.time()
    engine = engine_for(cfg.framework)
    # Which checkpoint to resume from decides which Keras to import: choose before the framework is imported.
    t0 = time.monotonic()
    chooser = ResumeChooser.open(ctx.checkpoint_dir, _say)
    first = chooser.next_verified()
    if milestones is not None and ctx.is_chief and chooser.found_any:
        milestones.took(RESTORED, t0, stage="verify", checkpoint=_where(first))
    with heap.framework_import():  # the framework's objects are never garbage: no collection walks them again
        keras = engine.start(cfg, first.keras if first else None)
    versions = engine.versions()
    if milestones is not None:
        milestones.emit(FRAMEWORK_IMPORTED, framework=engine.framework, version=versions[engine.framework])
    resolved = engine.resolve(ctx)
    if milestones is not None:
        milestones.emit(DEVICE_FOUND, strategy=resolved.describe())
    _say(f"[trainer] strategy: {resolved.describe()}; {engine.runtime()}")
    replicas = resolved.replicas
    if cfg.batch_size % replicas:
        raise TrainerError(f"batch_size {cfg.batch_size} is not divisible by the {replicas} replicas")
    t0 = time.monotonic()
    try:
        data = data_inputs.load(cfg.data, cfg.model, cfg.max_train_examples, cfg.max_test_examples, keras)
    except DatasetError as exc:
        raise TrainerError(str(exc)) from exc
    chief = engine.chief(resolved)
    steps = len(data.x_train) // cfg.batch_size if not data.datasets else 0
    if not data.datasets and steps == 0:
        raise TrainerError(f"batch_size {cfg.batch_size} is larger than the {len(data.x_train)} training examples")
    train_data, test_ds = engine.feeds(data, cfg, resolved)
    steps = steps or train_data.steps
    if milestones is not None and chief:
        milestones.took(DATA_LOADED, t0, dataset=data.source, train_examples=data.train_examples)
    _say(f"[trainer] data: {_describe_data(data, cfg, replicas, steps)}")
    # A process on its own starts training at once and times the variants after its first epoch; the processes of a
    # multi-process run would all wait on the chief's timing whenever it came, and switching variants between
    # epochs would rebuild a model in every one of them together, so they time before the first step.
    defer = defer_calibration and agreement.collective(engine.framework, resolved) is None
    try:
        # Only the chief times the variants, for arrays of its model: the run's choice is one (one_choice).
        measured = cfg.model if chief and not data.datasets else None
        plan = engine.plan(resolved, steps, cfg, model=measured, jit_compile=jit_compile, inputs=data, defer=defer)
    except ValueError as exc:
        raise TrainerError(str(exc)) from exc
    plan = one_choice(plan, engine.framework, resolved, chief)
    _say(f"[trainer] perf: {plan.describe()}")
    shuffle = engine.shuffle if not data.datasets else "the job's tf.data.Dataset"
    order = DataOrder(cfg.seed, data.train_examples, cfg.batch_size, steps, shuffle=shuffle)

    model = build_for(plan, cfg, engine, keras, resolved, data)
    with engine.scope(resolved):
        t0 = time.monotonic()
        resumed = restore_into(model, chooser, first, engine.keras_impl, engine.framework, _say)
    if milestones is not None and chief and first is not None:
        milestones.took(RESTORED, t0, stage="load", checkpoint=_where(resumed))
    start = start_from(
        resumed,
        steps=steps,
        order=order,
        optimizer_step=lambda: int(model.optimizer.iterations.numpy()),
        found_any=chooser.found_any,
        skipped=len(chooser.skipped),
        say=_say,
        prefix="[trainer]",
    )
    if data.datasets and not train_data.replayable:
        start = start.restart_epoch(_say, f"[trainer] the training data {train_data.why}")
    resumption = start.announce(furthest_step(ctx.output_dir), _say, "[trainer]") if chief else None
    if resumption is not None and milestones is not None:
        milestones.emit(RESUMED, **resumption.to_json())
    (epochs_done, step), global_step = start.position, start.global_step
    store = CheckpointStore(ctx.checkpoint_dir if chief else scratch_dir() / contract.CHECKPOINTS, cfg.checkpoint_keep)
    store.history = chooser.history_for(resumed) if chief else []
    from runner.train.callbacks import Cursor

    return Prepared(
        cfg=cfg,
        ctx=ctx,
        engine=engine,
        keras=keras,
        resolved=resolved,
        perf=plan,
        source=data.source,
        train_examples=data.train_examples,
        test_examples=data.test_examples,
        steps=steps,
        inputs=data,
        train_data=train_data,
        test_ds=test_ds,
        model=model,
        store=store,
        data_order=order,
        resumed=resumed,
        resumption=resumption,
        initial_epoch=epochs_done,
        initial_step=step,
        initial_global_step=global_step,
        cursor=Cursor(steps, cfg.epochs, (epochs_done, step), global_step),
        t_start=t_start,
        versions=versions,
        chief=chief,
    )


def build_for(plan: Any, cfg: TrainingSpec, engine: Engine, keras: Any, resolved: Any, inputs: Any) -> Any:
    """The run's model (built-in, or yours) under `plan`, in the engine's scope, checked against the data and
    compiled."""
    from runner.train.inputs import check_model
    from runner.train.models import CodeError, build_model

    engine.before_build(keras, cfg.seed)
    # Layers built from here on compute in this dtype, the restored model's too: the plan decides, not a checkpoint.
    keras.mixed_precision.set_global_policy(plan.precision)
    with engine.scope(resolved):
        try:
            model = build_model(cfg.model, keras, inputs.example_shape, inputs.classes or 10)
        except CodeError as exc:
            raise TrainerError(str(exc)) from exc
        check_model(model, cfg.model, inputs)
        compile_model(model, cfg, keras, plan, inputs.labels)
        engine.after_build(model, plan)
    return model


def calibrate_between_epochs(run: Prepared, callbacks: list[Any], stop: Any) -> None:
    """The CPU calibration prepare() deferred (the plan's precision_source "deferred"), done now that an epoch has
    trained: the variants are timed (and the pick cached) as they would have been before the first step, and when
    another than the plain one wins, the rest of the run trains in it: the model is built again in that variant and
    takes the weights, dropout seeds and optimizer state the epochs so far left (variables are float32 under every
    variant, so nothing is rounded; only the computation changes, as with a resume under another cached pick).
    A stop (`stop`: the StopSignal) that comes meanwhile ends the timing at once, unfinished and uncached: the run
    goes on in the plain variant, and the stop is acted on at the next epoch's start, within its grace."""
    from runner.train.callbacks import StopRequested

    if run.perf.precision_source != "deferred":
        return
    epoch = run.cursor.position[0]
    t0 = time.monotonic()
    # Same arguments as prepare()'s, without defer: the cache is read again (a run beside may have filled it).
    jit = run.perf.jit_compile
    try:
        with stop.interruptible():
            plan = run.engine.plan(
                run.resolved, run.steps, run.cfg, model=run.cfg.model, jit_compile=jit, inputs=run.inputs
            )
    except StopRequested as exc:
        _say(f"[trainer] {exc}: the variants' timing after epoch {epoch} is left off; saving a checkpoint")
        return
    plan = replace(plan, calibrated_after_epoch=epoch)
    if (plan.precision, plan.dropout) != (run.perf.precision, run.perf.dropout):
        model = build_for(plan, run.cfg, run.engine, run.keras, run.resolved, run.inputs)
        problem = carry_state(run.model, model)
        if problem:  # the run goes on as it was: the pick is cached for the next start all the same
            why = f"{plan.precision_reason}; not switched, the rebuilt model differs: {problem}"
            plan = replace(plan, precision=run.perf.precision, dropout=run.perf.dropout, precision_reason=why)
        else:
            run.model = model
            for callback in callbacks:
                callback.set_model(model)
    run.perf = plan
    took = time.monotonic() - t0
    _say(f"[trainer] perf from epoch {epoch + 1}: {plan.describe()}; timed after epoch {epoch} in {took:.1f} s")


def carry_state(old: Any, new: Any) -> str | None:
    """Copy `old`'s variables (weights, dropout seeds) and optimizer state into `new`, the same model compiled in
    another variant; what does not match, or None once copied."""
    new.optimizer.build(new.trainable_variables)  # Keras builds it at the first step otherwise
    pairs = []
    for what, mine, theirs in (
        ("variables", old.variables, new.variables),
        ("optimizer's variables", old.optimizer.variables, new.optimizer.variables),
    ):
        if len(mine) != len(theirs):
            return f"its {what} differ in number: {len(mine)}, rebuilt {len(theirs)}"
        pairs += list(zip(mine, theirs, strict=True))
    for a, b in pairs:
        if tuple(a.shape) != tuple(b.shape):
            name = getattr(a, "path", None) or a.name  # Keras 3 variables have a path, tf_keras' a name
            return f"{name} is {tuple(a.shape)}, rebuilt {tuple(b.shape)}"
    for a, b in pairs:
        b.assign(a.numpy())
    return None


def _describe_data(data: Any, cfg: TrainingSpec, replicas: int, steps: int) -> str:
    if data.datasets:
        what = f"{data.source}: tf.data.Datasets"
    else:
        labels = "one-hot" if data.labels == "one_hot" else "class numbers"
        what = (
            f"{data.source}: {data.train_examples} train, {data.test_examples} test, examples "
            f"{tuple(data.x_train.shape[1:])}, {data.classes} classes ({labels})"
        )
    return (
        f"{what}; global batch {cfg.batch_size} = {cfg.batch_size // replicas} per replica x {replicas}; "
        f"{steps} steps/epoch"
    )


def make_callbacks(
    run: Prepared, clock: Callable[[], float] = time.monotonic, milestones: Milestones | None = None
) -> tuple[list[Any], Any]:
    """The contract's callbacks (runner.train.library.contract_callbacks: the same as a user's fit gets) and the
    StopSignal, which notes SIGTERM and SIGINT from here on. `clock` times checkpoint_every durations and progress
    (tests inject it); `milestones` records each save (the trainer's own run)."""
    from runner.train import agreement
    from runner.train import callbacks as cb
    from runner.train.checkpoints import CheckpointPolicy
    from runner.train.library import contract_callbacks

    cfg = run.cfg
    stop = cb.StopSignal()
    callbacks = contract_callbacks(
        keras=run.keras,
        ctx=run.ctx,
        cursor=run.cursor,
        store=run.store,
        policy=CheckpointPolicy(cfg.checkpoint_epochs, cfg.checkpoint_seconds, cfg.epochs, clock),
        stop=stop,
        keras_impl=run.keras_impl,
        data_order=run.data_order,
        saved_at=run.resumed.checkpoint if run.resumed else None,
        framework=run.framework,
        agreement=agreement.for_run(run.framework, run.resolved),
        chief=run.chief,
        global_batch=cfg.batch_size,
        clock=clock,
        milestones=milestones,
    )
    _find(callbacks, cb.Checkpointer).set_model(run.model)  # a stop between two fits saves before any fit set it
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
        run.model.fit(
            run.train_data.epoch(index, skip),
            epochs=index + 1,
            initial_epoch=index,
            validation_data=run.test_ds,
            callbacks=callbacks,
            verbose=0,
            shuffle=False,  # the epoch's order is fixed by the feed
        )
        skip = 0
        if checkpointer.stopped:  # decided at the epoch's end (a signal during its last step or validation)
            return


def finish(run: Prepared) -> dict[str, Any]:
    """Final evaluation and summary.json (written by the chief only; every process evaluates)."""
    from runner.train import callbacks as cb

    cfg, ctx = run.cfg, run.ctx
    results = run.model.evaluate(run.test_ds, verbose=0, return_dict=True)
    rows = cb.read_jsonl(ctx.metrics_file)
    epoch_times = [r["epoch_time_s"] for r in rows if "epoch_time_s" in r]
    # The first epoch of a process compiles the step function; like the notebook, report the others.
    timed = [r for r in rows if "examples_per_s" in r]
    ran = [r for r in timed if r.get("epoch", 0) > run.initial_epoch]
    steady = [r["examples_per_s"] for r in ran[1:]] or [r["examples_per_s"] for r in ran or timed]
    newest = run.store.history[0].file if run.store.history else None
    global_step = run.cursor.global_step
    resumed = run.resumed.checkpoint if run.resumed else None
    values = {
        "run_id": ctx.run_id,
        "state": "succeeded",
        "model": cfg.model,
        "dataset": cfg.dataset if cfg.data is None else run.source,
        "data_source": run.source,
        "classes": run.classes or None,
        "epochs": cfg.epochs,
        "steps_per_epoch": run.steps,
        "global_step": global_step,
        "steps_this_attempt": global_step - run.initial_global_step,
        "optimizer_iterations": int(run.model.optimizer.iterations.numpy()),
        "resumed_from": {"checkpoint": resumed.file, "epoch": resumed.epochs_done, "step": resumed.step}
        if resumed
        else None,
        "resumed_from_epoch": run.initial_epoch or None,
        "resumed": run.resumption.to_json() if run.resumption is not None else None,
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
        from runner.train.engines.jax import keep_tensorflow_out

        keep_tensorflow_out()  # the trainer's own process only: prepare() may be driven by code that wants TF
    milestones = Milestones(ctx)
    run = prepare(cfg, ctx, milestones=milestones, defer_calibration=True)
    # Only now: the callbacks' base class is the Keras that prepare() chose (tf_keras, or Keras 3 on an engine).
    from runner.train.callbacks import Checkpointer, TrainingInterrupted

    callbacks, stop = make_callbacks(run, milestones=milestones)
    callbacks.append(milestones.first_step_callback(run.keras))
    checkpointer = _find(callbacks, Checkpointer)
    with contextlib.suppress(TrainingInterrupted):  # the stop is reported below, like one at an epoch end
        # With a calibration prepare() left for later: one epoch first, then the calibration, then the rest.
        deferred = run.perf.precision_source == "deferred"
        until = min(cfg.epochs, run.cursor.position[0] + 1) if deferred else cfg.epochs
        fit(run, callbacks, until)
        if until < cfg.epochs and not checkpointer.stopped:
            if not checkpointer.stopping():  # a stop that came meanwhile is acted on at once, by fit
                calibrate_between_epochs(run, callbacks, stop)
            fit(run, callbacks, cfg.epochs)
    # A stop after the last epoch's steps (its validation, or after fit) leaves nothing to train: the run ends
    # as it would have, evaluated and summarized, within the stop's grace; with several processes only an agreed
    # stop ends here (the final evaluation is collective too).
    if checkpointer.stopped and run.cursor.position[0] < cfg.epochs:
        _say("[trainer] stopped before the end; the newest checkpoint is kept for a resume")
        raise SystemExit(stop.exit_code)
    stop.finished = True
    from runner.train.callbacks import Progress

    _find(callbacks, Progress).done()
    return finish(run)


def _say(line: str) -> None:
    print(line, flush=True)


def _where(candidate: Candidate | None) -> str | None:
    return f"{contract.CHECKPOINTS}/{candidate.name}" if candidate is not None else None


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
