"""The runner's training machinery for your own Keras code: one line in your fit.

    from runner.train import keras_callbacks

    model.fit(x, y, epochs=5, batch_size=64, callbacks=keras_callbacks())

In a run (RUNNER_* variables set, as in every job the runner starts) that gives your fit what the built-in trainer
has, through the same code (runner.train.callbacks, checkpoints, restore, agreement):

  * resume: at the start of fit, the newest checkpoint in RUNNER_CHECKPOINT_DIR that verifies (size and crc32c
    against latest.json; a directory scan when the manifest is bad) is loaded into your model, weights and
    optimizer state, and fit continues at its epoch and step (runner.train.seams: numpy arrays replay the
    interrupted run's batches exactly; a tf.data.Dataset when it is deterministic; anything else restarts the
    interrupted epoch, and says so);
  * checkpoints: every `checkpoint_every` epochs or that much wall-clock time, mid-epoch if need be, and an exact
    one when SIGTERM comes (a preemption notice, `runner down`, Ctrl-C); the newest `keep` are kept; then the
    process ends with 128 + the signal's number, so the run reads as stopped, not failed;
  * metrics.jsonl (one line per epoch, Keras' logs), progress.json, TensorBoard event files;
  * on several workers (MultiWorkerMirroredStrategy, or JAX processes): the workers agree on when to stop and save,
    and worker 0 alone writes the run directory.

Outside a run it returns an empty list: the same script runs in a notebook. The defaults come from the job spec
(its `checkpoints:` section, through RUNNER_CHECKPOINT_EVERY and RUNNER_CHECKPOINT_KEEP); the arguments override
them. The callback subclasses the Keras your code uses: Keras 3, or tf_keras when TF_USE_LEGACY_KERAS=1 (as
tf.keras is then).
"""

from __future__ import annotations

import hashlib
import itertools
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from runner import contract
from runner.train.checkpoints import (
    DEFAULT_KEEP,
    CheckpointPolicy,
    CheckpointStore,
    DataOrder,
    ResumeChooser,
    scratch_dir,
)

DEFAULT_EVERY = 1  # epochs
# The fits of this process that used keras_callbacks(), in order: each is its own resume point (a head, then
# fine-tuning), with its own checkpoint series (runner.checkpoints.keras.fit_prefix).
_FITS = itertools.count()


def in_run(environ: dict[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    return bool(env.get(contract.RUN_DIR))


def parse_every(value: int | str | None) -> tuple[int | None, float | None]:
    """(epochs, seconds) from checkpoint_every: a number of epochs, or a duration ('10m', '90s', '1h')."""
    if value is None or value == "":
        return DEFAULT_EVERY, None
    if isinstance(value, int) or str(value).strip().isdigit():
        return int(value), None
    from runner.spec import parse_duration

    return None, float(parse_duration(str(value)))


@dataclass(frozen=True)
class Settings:
    """What a run's training takes from its environment (the spec, through the planner) or from the caller."""

    ctx: contract.JobContext
    every_epochs: int | None
    every_seconds: float | None
    keep: int
    seed: int

    @classmethod
    def from_env(
        cls,
        checkpoint_every: int | str | None = None,
        keep: int | None = None,
        seed: int | None = None,
        environ: dict[str, str] | None = None,
    ) -> Settings:
        env = dict(os.environ if environ is None else environ)
        ctx = contract.JobContext.from_env(env)
        every = checkpoint_every if checkpoint_every is not None else env.get(contract.CHECKPOINT_EVERY)
        epochs, seconds = parse_every(every)
        kept = keep if keep is not None else int(env.get(contract.CHECKPOINT_KEEP) or DEFAULT_KEEP)
        if seed is None:
            # A run's own, the same for every attempt of it (a resume replays its shuffles), other for another run.
            seed = int(env[contract.SEED]) if env.get(contract.SEED) else run_seed(ctx.run_id)
        return cls(ctx, epochs, seconds, kept, seed)


def run_seed(run_id: str) -> int:
    return int.from_bytes(hashlib.sha256(run_id.encode()).digest()[:4], "big")


def contract_callbacks(
    *,
    keras: Any,
    ctx: contract.JobContext,
    cursor: Any,
    store: CheckpointStore,
    policy: CheckpointPolicy,
    stop: Any,
    keras_impl: str,
    data_order: DataOrder,
    saved_at: Any,
    framework: str,
    agreement: Any,
    chief: bool,
    global_batch: int | None,
    clock: Callable[[], float],
    tensorboard: bool = True,
    printing: bool = True,
    milestones: Any = None,
    series: str = "",
) -> list[Any]:
    """The callbacks of the run-directory contract, for both doors (the built-in trainer and keras_callbacks):
    position, metrics, progress, TensorBoard, checkpoints (each save, with what it took, among `milestones`' events:
    runner.train.milestones). A process that does not write the run directory (not the chief) keeps the position,
    stops where the others do and saves where the chief does, to a scratch directory (its store); it writes no files
    of the run."""
    from runner.checkpoints.resumed import SAVED
    from runner.train import callbacks as cb

    boards: list[Any] = []

    def close_boards() -> None:
        for board in boards:
            if isinstance(board, cb.ScalarBoard):
                board.close()
            else:
                board.on_train_end()

    progress = cb.Progress(cursor, global_batch, ctx.progress_file if chief else None, clock, printing)

    def on_stop() -> None:
        close_boards()
        progress.write()

    checkpointer = cb.Checkpointer(
        store,
        cursor,
        policy,
        stop,
        keras_impl,
        data_order,
        saved_at,
        framework=framework,
        agreement=agreement,
        on_stop=on_stop,
    )
    if chief and milestones is not None:

        def saved(entry: Any, seconds: float) -> None:
            where = f"{contract.CHECKPOINTS}/{series}{entry.file}"
            milestones.emit(SAVED, seconds=round(seconds, 3), step=entry.global_step, checkpoint=where)

        checkpointer.on_saved = saved
    if not chief:
        return [cursor, progress, checkpointer]
    if tensorboard:
        if framework == "tensorflow":
            boards.append(cb.epoch_board(ctx.tensorboard_dir))
        else:  # keras' TensorBoard writes through TensorFlow, which a JAX process does not import
            boards.append(cb.ScalarBoard(ctx.tensorboard_dir))
    return [
        cursor,  # first: the others read the position it keeps
        cb.EpochMetrics(ctx.metrics_file, cursor, global_batch),
        progress,
        *boards,
        checkpointer,  # last: an epoch's checkpoint follows its metrics row
    ]


def keras_callbacks(
    *,
    checkpoint_every: int | str | None = None,
    keep: int | None = None,
    seed: int | None = None,
    tensorboard: bool = True,
) -> list[Any]:
    """The runner's callbacks for your own model.fit (module docstring); [] outside a run. `checkpoint_every`:
    epochs (a number) or wall-clock time ('10m'); `keep`: how many checkpoints to keep; `seed`: the shuffle's (by
    default one per run, the same for every attempt of it)."""
    if not in_run():
        return []
    settings = Settings.from_env(checkpoint_every, keep, seed)
    from runner.train import callbacks as cb
    from runner.train import seams

    # Before fit builds its input from the arrays: the shuffle it draws is then the run's, every attempt alike.
    seams.seed_shuffle(cb.keras, settings.seed)
    return [_run_callback(cb, settings, tensorboard)]


def _run_callback(cb: Any, settings: Settings, tensorboard: bool) -> Any:
    """One Keras callback that, at on_train_begin, resumes the fit and then hands every hook to the contract's
    callbacks, which need what fit knows only then (steps per epoch, the model's strategy)."""
    from runner.checkpoints.keras import fit_prefix
    from runner.checkpoints.resumed import EVENT as RESUMED
    from runner.checkpoints.resumed import RESTORED, furthest_step
    from runner.train import seams
    from runner.train.milestones import Milestones
    from runner.train.restore import TrainerError, restore_into
    from runner.train.resume import start_from

    keras = cb.keras
    ctx = settings.ctx

    class RunCallback(cb._Callback):
        def __init__(self) -> None:
            super().__init__()
            self.stop = cb.StopSignal()
            self.inner: list[Any] = []
            self.batch_end: list[Any] = []
            self.test_batch_end: list[Any] = []
            self.undo: Callable[[], None] = lambda: None
            self.checkpointer: Any = None

        def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
            model, params = self.model, self.params or {}
            steps, epochs = int(params.get("steps") or 0), int(params.get("epochs") or 1)
            if steps <= 0:
                _fail("keras_callbacks() needs a fit whose steps per epoch are known: give fit steps_per_epoch")
            impl, framework = seams.flavour(keras), seams.backend(keras)
            agreement, chief = _processes(model, framework)
            data = seams.fit_data(model)
            order = DataOrder(
                settings.seed, 0, data.batch_size or 0, steps, shuffle=f"{impl}/{framework}: {data.describe()}"
            )
            milestones = Milestones(ctx) if chief else None
            # This fit's own series: a second fit (fine-tuning after a head) never goes on from the first's.
            series = fit_prefix(next(_FITS))
            if series:
                _say(
                    f"[runner] fit {series[4:-1]} of this process: its checkpoints are {contract.CHECKPOINTS}/{series}"
                )
            t0 = time.monotonic()
            chooser = ResumeChooser.open(ctx.checkpoint_dir / series, _say)
            try:
                with _scope(model):
                    resumed = restore_into(model, chooser, chooser.next_verified(), impl, framework, _say)
            except TrainerError as exc:  # a checkpoint that must not be skipped and cannot be loaded: stop here
                _fail(str(exc))
            if milestones is not None and chooser.found_any:
                loaded = f"{contract.CHECKPOINTS}/{series}{resumed.name}" if resumed else None
                milestones.took(RESTORED, t0, stage="verify and load", checkpoint=loaded)
            start = start_from(
                resumed,
                steps=steps,
                order=order,
                optimizer_step=lambda: int(model.optimizer.iterations.numpy()),
                found_any=chooser.found_any,
                skipped=len(chooser.skipped),
                say=_say,
                prefix="[runner]",
                series=series,
            )
            position, global_step = start.position, start.global_step
            replay = seams.plan_replay(keras, data, position, steps)
            if not replay.exact and replay.start[1]:
                _say(f"[runner] {replay.why}: epoch {position[0] + 1} goes on from step {position[1]} on other batches")
            elif not replay.exact:
                start = start.restart_epoch(_say, f"[runner] {replay.why}")
            if (
                milestones is not None
                and (said := start.announce(furthest_step(ctx.output_dir), _say, "[runner]")) is not None
            ):
                milestones.emit(RESUMED, **said.to_json())
            chunk = getattr(model, "steps_per_execution", 1) or 1  # tf_keras: a variable
            chunk = int(chunk.numpy()) if hasattr(chunk, "numpy") else int(chunk)
            self.undo = seams.continue_at(model, keras, replay, chunk)
            where = (ctx.checkpoint_dir if chief else scratch_dir() / contract.CHECKPOINTS) / series
            store = CheckpointStore(where, settings.keep)
            store.history = chooser.history_for(resumed) if chief else []
            cursor = cb.Cursor(steps, epochs, replay.start, global_step, feed_skips=False)
            policy = CheckpointPolicy(settings.every_epochs, settings.every_seconds, epochs)
            self.inner = contract_callbacks(
                keras=keras,
                ctx=ctx,
                cursor=cursor,
                store=store,
                policy=policy,
                stop=self.stop,
                keras_impl=impl,
                data_order=order,
                saved_at=resumed.checkpoint if resumed else None,
                framework=framework,
                agreement=agreement,
                chief=chief,
                global_batch=data.batch_size,
                clock=time.monotonic,
                tensorboard=tensorboard,
                printing=False,
                milestones=milestones,
                series=series,
            )
            self.checkpointer = self.inner[-1]
            if milestones is not None:  # the start-up is the job's own: the first step that trains ends it
                self.inner.append(milestones.first_step_callback(keras, cursor))
            # Per batch, only the callbacks that do something then: a step of the guide's Dense model takes 3 ms.
            self.batch_end = cb.implementing(self.inner, "on_train_batch_end")
            self.test_batch_end = cb.implementing(self.inner, "on_test_batch_end")
            for callback in self.inner:
                callback.set_model(model)
                callback.set_params(params)
                callback.on_train_begin(logs)

        def _each(self, hook: str, *args: Any) -> None:
            for callback in self.inner:
                getattr(callback, hook)(*args)

        def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
            seams.epoch_seed(keras, settings.seed, epoch)
            self._each("on_epoch_begin", epoch, logs)

        def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
            self._each("on_epoch_end", epoch, logs)

        def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
            for callback in self.batch_end:
                callback.on_train_batch_end(batch, logs)

        def on_test_begin(self, logs: dict[str, Any] | None = None) -> None:
            self._each("on_test_begin", logs)

        def on_test_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
            for callback in self.test_batch_end:
                callback.on_test_batch_end(batch, logs)

        def on_test_end(self, logs: dict[str, Any] | None = None) -> None:
            self._each("on_test_end", logs)

        def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
            self._each("on_train_end", logs)
            self.undo()
            cursor = self.inner[0]
            if cursor.position[0] < cursor.epochs:
                if self.checkpointer.stopped:  # at an epoch's end (saved): the job ends, as a stop mid-epoch does
                    raise cb.TrainingInterrupted(self.stop.signum or signal.SIGTERM)
                return  # ended early by the job's own callbacks (EarlyStopping): not the runner's to judge
            self.stop.finished = True
            next(c for c in self.inner if isinstance(c, cb.Progress)).done()

    return RunCallback()


def _say(line: str) -> None:
    print(line, flush=True)


def _fail(message: str) -> None:
    """End the job with the message and exit code 2, as the built-in trainer does on a bad job, not a traceback
    from inside Keras."""
    print(f"[runner] error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(2)


def _scope(model: Any) -> Any:
    """The model's tf.distribute strategy scope, where its optimizer's variables must be made; none on JAX."""
    import contextlib

    strategy = getattr(model, "distribute_strategy", None)
    return strategy.scope() if strategy is not None and hasattr(strategy, "scope") else contextlib.nullcontext()


def _processes(model: Any, framework: str) -> tuple[Any, bool]:
    """(the workers' Agreement or None, whether this process is the chief) for the fit that is starting."""
    from runner.train import agreement

    if framework == "jax" and "jax" in sys.modules:
        import jax

        count, index = jax.process_count(), jax.process_index()
        return (agreement.Agreement(agreement.jax_sum, count) if count > 1 else None), index == 0
    strategy = getattr(model, "distribute_strategy", None)
    resolver = getattr(strategy, "cluster_resolver", None)
    tf = sys.modules.get("tensorflow")
    if tf is not None and isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        chief = resolver is None or resolver.task_type != "worker" or int(resolver.task_id or 0) == 0
        replicas = int(strategy.num_replicas_in_sync)
        return agreement.Agreement(agreement.tensorflow_sum(strategy), replicas), chief
    return None, int(os.environ.get(contract.WORKER_ID) or 0) == 0
