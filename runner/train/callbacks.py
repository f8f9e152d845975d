"""Keras callbacks that write the run-directory contract: metrics, checkpoints, progress, and the stop on SIGTERM.

The trainer calls fit once per epoch (or once for the rest of one, after a mid-epoch resume), so Keras' batch
indices count from where that fit started; the Cursor turns them into the position in the run (epoch, step of the
epoch, global step) that the other callbacks read. It must come first in the list.

Every file is made to appear atomically (write a hidden temp file, then rename), because the supervisor mirrors
the directory to Cloud Storage while training runs and must never upload half a file.

Both engines use them: the base class is the Callback of the Keras the trainer chose before importing this module
(tf_keras when TF_USE_LEGACY_KERAS says so, on TensorFlow only; else Keras 3 on the backend KERAS_BACKEND names). No
TensorFlow import here: under Keras 3, tf.keras.callbacks.Callback is keras.callbacks.Callback.
"""

from __future__ import annotations

import contextlib
import json
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from runner.metrics import PROGRESS_EVERY_S, Every, chosen_keras, metrics_row, write_progress
from runner.storage.local import write_atomic
from runner.train.agreement import Agreement
from runner.train.checkpoints import (
    Checkpoint,
    CheckpointPolicy,
    CheckpointStore,
    DataOrder,
    Position,
    checkpoint_name,
    describe,
)
from runner.train.tbevents import EventFile
from runner.watch import rundir

keras = chosen_keras()  # the trainer sets the variables that choose it before importing this module
# The base class, as Any: mypy cannot see which Keras was chosen at import.
_Callback: Any = keras.callbacks.Callback

PRINT_EVERY_S = 5.0  # progress lines in the log (progress.json: metrics.PROGRESS_EVERY_S)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue  # a torn line from a crashed writer
    return out


def _floats(logs: dict[str, Any] | None) -> dict[str, float]:
    """Keras' logs as plain floats. The weighted test cross-entropy (val_xent) replaces Keras' val_loss, which
    counts the zero-weight padding of the last test batch; the training xent duplicates loss."""
    out = {k: round(float(v), 6) for k, v in (logs or {}).items() if isinstance(v, int | float) or hasattr(v, "item")}
    if "val_xent" in out:
        out["val_loss"] = out.pop("val_xent")
    out.pop("xent", None)
    return out


class TrainingInterrupted(SystemExit):
    """Raised out of fit after a stop signal, once the exact checkpoint is saved: a SystemExit with the code a shell
    reports for the signal (128 + its number), so that a user's script ends there (its code after fit does not run,
    and the run is recorded as stopped, not failed) without a traceback. Keras does not catch it, so nothing of the
    epoch's end (validation, metrics row, epoch checkpoint) runs for a cut epoch."""

    def __init__(self, signum: int) -> None:
        super().__init__(128 + signum)
        self.signum = signum

    def __str__(self) -> str:
        return signal.Signals(self.signum).name


class StopRequested(BaseException):
    """A stop came during work the run can do without (StopSignal.interruptible). A BaseException, so that no
    `except Exception` on its way (a calibration keeps going on a failed timing) holds it up."""


class StopSignal:
    """SIGTERM (docker stop, a preemption notice, the supervisor, `runner down`) and SIGINT (Ctrl-C reaches the
    whole process group, the trainer too) are only noted here; the Checkpointer acts on them at the next step end.
    Once training has finished (`finished`), one that comes is let be: the job's last work (an evaluation, a
    summary, a user's own code after fit) goes on within the grace the stop gives, and its exit code says how the
    run ended."""

    def __init__(self, signums: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT)) -> None:
        self.signum: int | None = None
        self.finished = False
        self._interruptible = False
        self._previous = {s: signal.signal(s, self._handle) for s in signums}

    @contextlib.contextmanager
    def interruptible(self) -> Iterator[None]:
        """Work inside may be abandoned: a stop that came before raises StopRequested on entering, one that comes
        inside raises it at once (in the main thread, between two Python bytecodes), instead of waiting for a step
        end that is seconds away while the stop's grace runs out."""
        if self.signum is not None:
            raise StopRequested(self.name)
        self._interruptible = True
        try:
            yield
        finally:
            self._interruptible = False

    def _handle(self, signum: int, _frame: object) -> None:
        if self.finished:
            if signum == signal.SIGINT and self.signum == signal.SIGINT:
                raise KeyboardInterrupt
            self.signum = signum
            name = signal.Signals(signum).name
            print(f"[trainer] {name} after training finished: the job goes on to its end", file=sys.stderr, flush=True)
        elif self.signum is None:
            self.signum = signum
            if self._interruptible:
                raise StopRequested(self.name)
            print(f"[trainer] {self.name}: saving a checkpoint at the next step end", file=sys.stderr, flush=True)
        elif signum == signal.SIGINT:
            raise KeyboardInterrupt  # Ctrl-C twice: the user does not want to wait for the save

    def adopt(self, signum: int) -> None:
        """Another process of the run got `signum` (runner.train.agreement): stop with it, as if it came here."""
        if self.signum is None:
            self.signum = signum
            print(
                f"[trainer] another worker got {self.name}: stopping with it, saving a checkpoint here",
                file=sys.stderr,
                flush=True,
            )

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum is not None else "no signal"

    @property
    def exit_code(self) -> int:
        return 128 + (self.signum or 0)  # what a shell reports for a process ended by that signal

    def uninstall(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)


class Cursor(_Callback):
    """Where training stands: `epoch` (0-based) in progress, `step` steps of it done, `global_step` in all.

    Keras numbers an epoch's batches from 0, whatever the run did before. `shift` turns that number into the step of
    the epoch: the built-in trainer's feed leaves a resumed epoch's done steps out (shift = those steps); a user's
    fit, resumed through Keras itself (runner.train.seams), counts them again, as steps that train nothing, so its
    numbers are the steps already (shift 0) and the ends of those steps do not move the cursor (`advanced` False)."""

    def __init__(
        self, steps_per_epoch: int, epochs: int, start: Position, global_step: int, feed_skips: bool = True
    ) -> None:
        super().__init__()
        self.steps, self.epochs = steps_per_epoch, epochs
        self.epoch, self.step = start
        self.resume = start  # the position this process began at: its epoch starts at that step
        self.start = self.step  # steps of the current epoch trained before this process (a mid-epoch resume)
        self.shift = self.step if feed_skips else 0
        self.feed_skips = feed_skips
        self.global_step = global_step
        self.advanced = False  # the last batch end moved the position (a real step, not a skipped one)

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        step = self.resume[1] if epoch == self.resume[0] else 0
        self.epoch, self.step, self.start = epoch, step, step
        self.shift = step if self.feed_skips else 0

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        # With steps_per_execution > 1 the index is the chunk's last step; Keras 3 reports a whole chunk even when
        # the epoch ends inside it, hence the clamp.
        step = min(self.shift + batch + 1, self.steps)
        self.advanced = step > self.step
        if self.advanced:
            self.global_step += step - self.step
            self.step = step

    @property
    def position(self) -> Position:
        """(epochs done, steps of the next): an epoch whose steps are all done counts as done."""
        return (self.epoch + 1, 0) if self.step >= self.steps else (self.epoch, self.step)

    @property
    def in_epoch_training(self) -> bool:
        return 0 < self.step < self.steps


class EpochMetrics(_Callback):
    """One JSON line per epoch in metrics.jsonl (runner.metrics' line: Keras' logs, epoch time and examples/s). An
    interrupted epoch writes none; the resumed rest of one writes its line at its real end, with "resumed_at_step".
    The file is rewritten whole, not appended to: a run resumed from an older checkpoint drops the lines of the
    epochs it trains again."""

    def __init__(self, path: Path, cursor: Cursor, global_batch: int | None) -> None:
        super().__init__()
        self.path, self.cursor, self.batch = path, cursor, global_batch
        # Rows past the resume point describe epochs this run will train again (it resumed from an older one).
        rows = read_jsonl(path)
        self.rows = [r for r in rows if r.get("epoch", 0) <= cursor.position[0]]
        if len(self.rows) != len(rows):
            self._write()
        self._t0 = 0.0

    def _write(self) -> None:
        write_atomic(self.path, "".join(json.dumps(r) + "\n" for r in self.rows).encode())

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._t0 = time.perf_counter()

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        seconds = time.perf_counter() - self._t0
        trained = self.cursor.steps - self.cursor.start
        row: dict[str, Any] = {"epoch": epoch + 1, **_floats(logs), "epoch_time_s": round(seconds, 3)}
        if self.batch:  # unknown for a user's dataset of its own batching
            row["examples_per_s"] = round(trained * self.batch / seconds, 1)
        row["global_step"] = self.cursor.global_step
        if self.cursor.start:
            row["resumed_at_step"] = self.cursor.start
        row = metrics_row(**row)
        self.rows = [r for r in self.rows if r.get("epoch") != epoch + 1] + [row]
        self._write()


class Progress(_Callback):
    """Keras-style progress lines at most every PRINT_EVERY_S (a log file is not a terminal, so the usual
    carriage-return bar would arrive as one unreadable line), and progress.json for hang detection: rewritten every
    PROGRESS_EVERY_S while training, at each epoch's first step (training moved on after validation) and end, and
    during validation with "phase": "validate" and its own "validation_step", so a long test set shows life too."""

    def __init__(
        self,
        cursor: Cursor,
        global_batch: int | None,
        progress_file: Path | None,
        clock: Callable[[], float] = time.monotonic,
        printing: bool = True,
    ) -> None:
        super().__init__()
        self.cursor, self.batch, self.file, self.clock = cursor, global_batch, progress_file, clock
        self.printing = printing and global_batch is not None  # a user's fit prints Keras' own lines
        self._t0 = 0.0
        self._first = False
        self._progress, self._print = Every(PROGRESS_EVERY_S, clock), Every(PRINT_EVERY_S, clock)

    def write(self, validation_step: int | None = None, phase: str | None = None) -> None:
        if self.file is None:
            return
        c = self.cursor
        state = rundir.Progress(
            epoch=c.epoch + 1,
            epochs=c.epochs,
            step=c.step,
            steps_per_epoch=c.steps,
            global_step=c.global_step,
            phase=phase or ("train" if validation_step is None else "validate"),
            validation_step=validation_step,
        )
        write_progress(self.file, **state.to_json())
        self._progress.start()

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        self.write()

    def done(self) -> None:
        """Training has run to its end: "phase": "done", which tells the supervisor that an exit 0 after a stop
        request is the job's own success, its work complete (a plain SIGTERM handler's exit 0 is a cancel)."""
        self.write(phase=rundir.TRAINING_DONE)

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._t0 = self.clock()
        self._print.start()
        self._first = True

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if not self.cursor.advanced:
            return  # a step skipped to reach a resumed position: nothing trained
        if self._first or self._progress.due():
            self._first = False
            self.write()
        if not self.printing or not self._print.due():
            return
        t = self.clock()
        c = self.cursor
        filled = int(30 * c.step / c.steps)
        bar = "=" * max(filled - 1, 0) + (">" if filled < 30 else "=") + "." * (30 - filled)
        rate = (c.step - c.start) * (self.batch or 0) / max(t - self._t0, 1e-9)
        print(f"Epoch {c.epoch + 1}/{c.epochs} {c.step}/{c.steps} [{bar}] {_fmt(logs)} - {rate:.0f} ex/s", flush=True)

    def on_test_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if self._progress.due():
            self.write(validation_step=batch + 1)

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self.write()
        if not self.printing:
            return
        c = self.cursor
        seconds = self.clock() - self._t0
        rate = (c.steps - c.start) * (self.batch or 0) / max(seconds, 1e-9)
        resumed = f" - resumed at step {c.start}" if c.start else ""
        print(
            f"Epoch {epoch + 1}/{c.epochs} {c.steps}/{c.steps} - {seconds:.1f}s - {_fmt(logs)} - {rate:.0f} ex/s"
            f"{resumed}",
            flush=True,
        )


class Checkpointer(_Callback):
    """Saves model + optimizer state when the policy says so (epoch ends, or wall-clock time mid-epoch) and when a
    stop signal arrives: at the next step end mid-epoch, exactly there, then TrainingInterrupted; during an
    epoch's last step or its validation, at that epoch's end, which then runs normally, and fit stops after it.

    Every worker of the trainer saves (saving is collective on both engines): those other than the chief to a
    scratch store (checkpoints.scratch_dir). With an `agreement` (several processes), stop and save are decided at
    its points, alike on every process."""

    def __init__(
        self,
        store: CheckpointStore,
        cursor: Cursor,
        policy: CheckpointPolicy,
        stop: StopSignal,
        keras_impl: str,
        data: DataOrder,
        saved_at: Checkpoint | None = None,
        framework: str = "tensorflow",
        agreement: Agreement | None = None,
        on_stop: Callable[[], None] = lambda: None,
        on_saved: Callable[[Checkpoint, float], None] = lambda entry, seconds: None,
    ) -> None:
        super().__init__()
        self.store, self.cursor, self.policy, self.stop = store, cursor, policy, stop
        self.on_saved = on_saved  # each save published, with the seconds it took (the run's goodput)
        self.keras_impl, self.data, self.framework = keras_impl, data, framework
        self.agreement = agreement
        self.on_stop = on_stop  # before TrainingInterrupted leaves fit: what on_train_end would have closed
        self.stopped = False  # stop_here ran: the stop was decided (agreed, with several processes)
        self.newest = saved_at  # the checkpoint holding the newest saved position (the resume point at first)

    def save(self) -> Checkpoint:
        t0 = time.monotonic()
        epochs_done, step = self.cursor.position
        name = checkpoint_name(epochs_done, step)
        tmp = self.store.temp_path(name)
        self.model.save(tmp)
        entry = Checkpoint(
            file=name,
            epochs_done=epochs_done,
            step=step,
            global_step=self.cursor.global_step,
            keras=self.keras_impl,
            data=self.data,
            framework=self.framework,
        )
        self.newest = self.store.publish(tmp, entry)
        self.policy.saved()
        self.on_saved(self.newest, time.monotonic() - t0)
        return self.newest

    def _saved_here(self) -> bool:
        return self.newest is not None and self.newest.position == self.cursor.position

    def stop_here(self) -> None:
        """Make sure a checkpoint holds the current position, and say where the job stopped."""
        self.stopped = True
        where = describe(self.cursor.position, self.cursor.steps)
        signame = self.stop.name
        if self._saved_here():
            assert self.newest is not None
            print(
                f"[trainer] {signame}: {self.newest.file} already holds {where} "
                f"(global step {self.newest.global_step})",
                flush=True,
            )
        elif self.cursor.position == (0, 0):
            print(f"[trainer] {signame}: stopped before the first step; nothing to save", flush=True)
        else:
            entry = self.save()
            print(f"[trainer] {signame}: saved {entry.file} at {where} (global step {entry.global_step})", flush=True)

    def decide(self, save_due: bool, mid_epoch: bool = False) -> tuple[bool, bool]:
        """(stop, save) now: this process's own view, or with several processes, what all of them agree on."""
        if self.agreement is None:
            return self.stop.signum is not None, save_due
        return self.agreement.decide(self.stop, save_due, mid_epoch)

    def stopping(self) -> bool:
        """Between two epochs' fits: whether to stop here (agreed, with several processes)."""
        return self.decide(False)[0]

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if not self.cursor.advanced or not self.cursor.in_epoch_training:
            return  # a skipped step, or the epoch's steps are all done: its end (after validation) decides
        if self.agreement is not None and not self.agreement.step():
            return  # not a point where the processes compare notes: every one of them goes on alike
        stop, save = self.decide(self.policy.due_mid_epoch(), mid_epoch=True)
        if stop:
            self.stop_here()
            self.on_stop()
            raise TrainingInterrupted(self.stop.signum or signal.SIGTERM)
        if save:
            self.save()

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        stop, save = self.decide(self.policy.due_at_epoch_end(epoch + 1))
        if stop:
            self.stop_here()
            self.model.stop_training = True
        elif save and not self._saved_here():
            self.save()


class ScalarBoard(_Callback):
    """Epoch scalars for TensorBoard without TensorFlow (runner.train.tbevents), with keras.callbacks.TensorBoard's
    layout and tags: train/ and validation/, epoch_loss, epoch_accuracy, ... at step = the 0-based epoch. One file
    each per process, not one per fit call (the trainer fits each epoch on its own)."""

    def __init__(self, directory: Path) -> None:
        super().__init__()
        self.train, self.validation = EventFile(directory / "train"), EventFile(directory / "validation")

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        values = _floats(logs)
        self.train.write(epoch, {f"epoch_{k}": v for k, v in values.items() if not k.startswith("val_")})
        validation = {f"epoch_{k[4:]}": v for k, v in values.items() if k.startswith("val_")}
        if validation:
            self.validation.write(epoch, validation)

    def close(self) -> None:
        """Every record is flushed as it is written; this only lets go of the files."""
        self.train.close()
        self.validation.close()


def epoch_board(directory: Path) -> Any:
    """Keras' own TensorBoard callback, writing epoch scalars only (train/ and validation/, epoch_loss, ...).

    Its batch hooks are Keras' no-op ones: Keras 3's write a tf.summary.scalar of every log after every batch even
    with update_freq="epoch" (nothing reaches a file without a batch writer, but the tensor conversions measured
    0.3-0.5 ms a step, a sixth of the Dense guide's 3 ms step), and a callback with batch hooks of its own keeps
    Keras from dispatching batch ends off the training thread."""

    board: Any = keras.callbacks.TensorBoard

    class EpochBoard(board):
        on_train_batch_begin = _Callback.on_train_batch_begin
        on_train_batch_end = _Callback.on_train_batch_end
        on_test_batch_begin = _Callback.on_test_batch_begin
        on_test_batch_end = _Callback.on_test_batch_end

    return EpochBoard(str(directory), update_freq="epoch", profile_batch=0, write_graph=False)


def implementing(callbacks: list[Any], hook: str) -> list[Any]:
    """The callbacks whose `hook` does something (is not Keras' base no-op): the ones worth calling per batch."""
    return [c for c in callbacks if getattr(type(c), hook, None) is not getattr(_Callback, hook)]


def _fmt(logs: dict[str, Any] | None) -> str:
    return " - ".join(f"{k}: {v:.4f}" for k, v in _floats(logs).items())
