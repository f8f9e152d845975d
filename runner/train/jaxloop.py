"""The runner's machinery for a hand-written JAX training loop, as keras_callbacks() is for a Keras fit.

    from runner.train import jax_loop

    loop = jax_loop(steps=total)                           # first: on a pod slice it connects the hosts
    mngr = loop.checkpoint_manager(ckpt_dir, options)      # your Orbax CheckpointManager, set up for the run
    for step in range(mngr.latest_step() or 0, total):     # (restore the latest step as you do)
        ...                                                # train
        mngr.save(step + 1, args=ocp.args.StandardSave(state))
        loop.step(step + 1)                                # progress; at a stop, once its save is done: exit 143
    loop.log(step=step + 1, loss=..., accuracy=...)        # a metrics line, where you print one

In a run (RUNNER_RUN_DIR set, as in every job the runner starts) that gives the loop:

  * the hosts of a pod slice connected before anything touches a device: jax.distributed.initialize() with no
    arguments (the runner's cluster locally and on the emulators, JAX's own on Cloud TPU), unless you called it;
  * the start-up milestones framework_imported, device_found and first_step (runner.train.milestones: the startup
    breakdown of status and the report);
  * progress.json (step() every few seconds: status, the ETA, the hang check) and metrics.jsonl (log()), through
    runner.metrics, from worker 0;
  * the stop: on several processes, the step they agree on once a SIGTERM reached any host, at the agreement
    points every process takes at the same steps, about a second apart (runner.train.agreement, as a Keras fit on
    several workers does: one all-gather of a few ints through jax.distributed); in one process, the step at which
    its SIGTERM arrived. The CheckpointManager saves that step whatever its interval (its reached_preemption()
    answers it), and step() waits for the save and ends the process with 143, so the run reads as stopped, and is
    resumed. (Not JAX's preemption sync: with one host held up, the hosts decided the stop's save differently and
    waited on each other until killed; tests/test_flax_example.py's two-worker stop.)
  * a CheckpointManager (orbax.checkpoint's, subclassed) in the run's checkpoint location: on several hosts the
    one they all write, RUNNER_SHARED_CHECKPOINT_DIR (a multi-host Orbax checkpoint is written by every host into
    one directory, and host 0 commits it); on one host, RUNNER_CHECKPOINT_DIR, which a new machine gets back. It
    keeps RUNNER_CHECKPOINT_KEEP steps (the spec's checkpoints.keep); your other options stay. Its latest_step() on
    a later attempt is the newest committed step, the one the runner says the attempt resumed from.

Outside a run it does nothing: step() and log() return at once, the loop is never stopped, and
checkpoint_manager() is a plain CheckpointManager in your directory, as asked (None without one). Importing this
module imports neither JAX nor Orbax.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
import threading
import time
from typing import Any

from runner import contract
from runner.metrics import PROGRESS_EVERY_S, log_metrics, write_progress
from runner.train.milestones import DEVICE_FOUND, FIRST_STEP, FRAMEWORK_IMPORTED, Milestones
from runner.watch.rundir import TRAINING_DONE

DEFAULT_KEEP = 2  # checkpoints.keep's default (runner.spec), for a run planned without RUNNER_CHECKPOINT_KEEP


class JaxLoop:
    """One hand-written loop's link to its run (module docstring). Make it with jax_loop(), before the model."""

    def __init__(self, steps: int | None = None, environ: dict[str, str] | None = None) -> None:
        env = dict(os.environ if environ is None else environ)
        self.steps = steps
        self.active = bool(env.get(contract.RUN_DIR))
        self.ctx = contract.JobContext.from_env(env)
        self.keep = int(env.get(contract.CHECKPOINT_KEEP) or DEFAULT_KEEP)
        self.manager: Any = None
        self.signum: int | None = None  # the signal that came to this process
        self._agreement: Any = None  # several processes: they agree on the stop's step (runner.train.agreement)
        self._asked = -1  # the newest step asked about
        self._stop_at: int | None = None  # the step the loop stops at, once decided
        self._first_step = False
        self._written = float("-inf")
        if not self.active:
            return
        import jax

        milestones = Milestones(self.ctx)
        milestones.emit(FRAMEWORK_IMPORTED, framework="jax", version=jax.__version__)
        if self.ctx.num_workers > 1 and not jax.distributed.is_initialized():
            jax.distributed.initialize()
        devices = jax.devices()
        where = f"{len(devices)} {devices[0].platform} device(s) in {jax.process_count()} process(es)"
        milestones.emit(DEVICE_FOUND, devices=where)
        self._milestones = milestones
        if jax.process_count() > 1:
            from runner.train.agreement import Agreement, jax_sum

            self._agreement = Agreement(jax_sum, jax.process_count())
        # Ours, not JAX's preemption notifier (which jax.distributed.initialize() set on SIGTERM): see the docstring.
        signal.signal(signal.SIGTERM, self._on_signal)

    def _on_signal(self, signum: int, _frame: object) -> None:
        if self.signum is None:
            self.signum = signum
            where = "at the step the processes agree on" if self.synced else "at the next step"
            print(f"[runner] {signal.Signals(signum).name}: stopping {where}", flush=True)

    def adopt(self, signum: int) -> None:
        """Another process got `signum` (runner.train.agreement): stop with it, as if it came here."""
        if self.signum is None:
            self.signum = signum
            print(f"[runner] another process got {signal.Signals(signum).name}: stopping with it", flush=True)

    @property
    def synced(self) -> bool:
        """The processes agree on the stop's step (several of them)."""
        return self._agreement is not None

    @property
    def multi_host(self) -> bool:
        return self.ctx.num_workers > 1

    @property
    def checkpoint_dir(self) -> str:
        """Where this run's checkpoints go: every host's shared location on several, this host's on one."""
        return self.ctx.shared_checkpoint_dir if self.multi_host else str(self.ctx.checkpoint_dir)

    def stopping(self, step: int) -> bool:
        """Whether the loop stops at `step` (the step every process agreed on, or the one a SIGTERM reached first);
        asked once per step, whoever asks first (the CheckpointManager's save, or step()), so that each process takes
        the agreement's collective at the same steps; asked again about a step, the answer it had."""
        if not self.active:
            return False
        # Only a newer step, from the loop's own thread, counts: Orbax's CheckpointManager also asks about a step it
        # has saved when it finalizes it, on the primary host alone and in a thread of its own, and a collective
        # taken there would leave the hosts' agreement points apart.
        if step <= self._asked or threading.current_thread() is not threading.main_thread():
            return step == self._stop_at
        if self._agreement is not None:  # a collective at each agreement point: every process asks at each step
            stop = self._agreement.step() and self._agreement.decide(self, save_due=False, mid_epoch=True)[0]
        else:
            stop = self.signum is not None
        self._asked = step
        if stop:
            self._stop_at = step
        return stop

    def checkpoint_manager(self, directory: Any = None, options: Any = None, **kwargs: Any) -> Any:
        """An orbax.checkpoint.CheckpointManager: in a run, in the run's checkpoint location (`directory` is where
        it goes outside one), keeping the spec's number of steps, and saving at the stop's step; outside a run, a
        plain one in `directory` (None when no directory is given)."""
        import orbax.checkpoint as ocp

        if not self.active:
            return None if directory is None else ocp.CheckpointManager(directory, options=options, **kwargs)
        loop = self

        class RunCheckpointManager(ocp.CheckpointManager):
            def reached_preemption(self, step: int) -> bool:
                return loop.stopping(step)

        options = dataclasses.replace(options or ocp.CheckpointManagerOptions(), max_to_keep=self.keep)
        self.manager = RunCheckpointManager(self.checkpoint_dir, options=options, **kwargs)
        hosts = f"shared by the {self.ctx.num_workers} hosts" if self.multi_host else "this host's"
        latest = self.manager.latest_step()
        print(
            f"[runner] Orbax checkpoints in {self.checkpoint_dir} ({hosts}), the newest {self.keep} kept"
            + (f"; the newest committed step is {latest}" if latest is not None else ""),
            flush=True,
        )
        return self.manager

    def step(self, step: int, **where: Any) -> None:
        """Training reached `step` (steps done, counted from 0 over the whole run; `where` adds to progress.json,
        e.g. epoch=2): the first step's milestone, progress every few seconds, and at the stop's step (once the
        CheckpointManager has saved it) the process's end, with 128 + the signal's number."""
        if not self.active:
            return
        if not self._first_step:
            self._first_step = True
            self._milestones.emit(FIRST_STEP)
        stop = self.stopping(step)
        done = self.steps is not None and step >= self.steps
        if stop or done or time.monotonic() - self._written >= PROGRESS_EVERY_S:
            phase = {"phase": TRAINING_DONE} if done else {}
            write_progress(step=step, steps_per_epoch=self.steps, **where, **phase)
            self._written = time.monotonic()
        if stop:
            self._stop(step)

    def _stop(self, step: int) -> None:
        saved = None
        if self.manager is not None:
            self.manager.wait_until_finished()  # the stop's save, written and (on several hosts) committed
            saved = self.manager.latest_step()
        why = "the processes agreed to stop" if self.synced else "a stop was asked"
        said = f"saved step {saved}" if saved == step else f"the newest saved step is {saved}" if saved else "no save"
        print(f"[runner] {why}: stopped at step {step}, {said}", flush=True)
        sys.stdout.flush()
        raise SystemExit(128 + (self.signum or signal.SIGTERM))

    def log(self, **values: Any) -> dict[str, Any] | None:
        """One metrics line (step=..., epoch=..., loss=...): RUNNER_METRICS_FILE, from worker 0 (runner.metrics);
        None outside a run."""
        return log_metrics(**values) if self.active else None


def jax_loop(steps: int | None = None) -> JaxLoop:
    """The runner's machinery for your JAX loop (module docstring); `steps`: the loop's total, for status's
    'step 40 of 1200'. Call it before the model is made: on a pod slice it connects the hosts first."""
    return JaxLoop(steps)
