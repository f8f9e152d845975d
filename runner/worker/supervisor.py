"""The container's entrypoint: run the job under the run-directory contract.

One supervisor runs on each worker (each TPU VM host, or the one local process). It

  * starts the job (the built-in trainer, or the spec's custom command) with the contract's environment,
  * tees the job's output to the terminal (docker logs) and, cleaned of progress-bar redraws and escape
    sequences, to logs/worker-N.log,
  * writes the heartbeat while the job lives and mirrors the output directory to storage,
  * stops the job on SIGTERM/SIGINT (docker stop, preemption notice, the runner), when max_runtime passes, or
    when the job's progress has not advanced for teardown.hang_timeout (a wedged collective; on a pod slice a
    default applies once the job reports progress: RUNNER_HANG_DEFAULT_S),
  * records the terminal state in exit/worker-N.json, then pushes everything one last time.

It imports neither TensorFlow nor anything heavy, so it is up in well under a second and can outlive a job
that crashes or hangs.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from pathlib import Path
from typing import BinaryIO

from runner import contract
from runner.checkpoints import SHARED, Listing, Survey, resume_point, survey
from runner.checkpoints.resumed import EVENT as RESUMED
from runner.checkpoints.resumed import RESTORED, Resumed, furthest_step, latest, redone
from runner.errors import StorageError
from runner.redact import Redactor, job_secrets
from runner.storage import Storage, open_storage
from runner.storage.local import LocalStorage
from runner.watch.events import EventLog, now, read_events
from runner.watch.logtext import LogCleaner
from runner.watch.results import write_derived_summary
from runner.watch.rundir import TRAINING_DONE, ExitRecord, Heartbeat, Progress
from runner.watch.state import STOP_EXIT_CODES, RunState
from runner.worker import processes
from runner.worker.mirror import Mirror, checkpoint_keep

TAIL_LINES = 30
# Seconds of the stop grace kept for what follows the job's end: reaping it, the exit record, the last push to storage.
FINISH_RESERVE_S = 5.0
EXIT_SAFETY_STOP = contract.EXIT_SAFETY_STOP
# First on the job's PYTHONPATH where the runner made its cluster: its sitecustomize.py lets a bare
# jax.distributed.initialize() find that cluster (runner.train.jaxcluster).
JOB_PATH = Path(__file__).with_name("jobpath")


def _job_process() -> None:
    """In the job's process, before its command starts: a process group of its own, so that a stop reaches
    everything the command started (a shell form's program is the shell's child: dash does not exec it, and a
    SIGTERM to the shell alone would leave the program training with nothing saved); and, on Linux, death with the
    supervisor, so a killed supervisor leaves no trainer behind."""
    os.setpgid(0, 0)
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class Supervisor:
    def __init__(self, environ: dict[str, str]) -> None:
        self.environ = environ
        self.run_dir = environ[contract.RUN_DIR]
        self.worker = int(environ.get(contract.WORKER_ID, "0"))
        self.heartbeat_s = contract.cadence(contract.HEARTBEAT_S, environ)
        self.sync_s = contract.cadence(contract.SYNC_S, environ)
        self.grace_s = float(environ.get(contract.GRACE_S, "30"))
        # Whoever sent the SIGTERM (the runner, `docker stop`, a Spot VM's preemption) kills the whole group when the
        # same grace ends, so the job gets the grace less what this process needs after it: without the reserve, a
        # job that used all of it (one stuck in a collective with a dead peer) took the exit record down with it.
        self.job_grace_s = max(min(1.0, self.grace_s), self.grace_s - FINISH_RESERVE_S)
        max_runtime = environ.get(contract.MAX_RUNTIME_S)
        self.max_runtime_s = float(max_runtime) if max_runtime else None
        submitter = environ.get(contract.SUBMITTER_TIMEOUT_S)
        self.submitter_timeout_s = float(submitter) if submitter else None
        hang = environ.get(contract.HANG_TIMEOUT_S)
        self.hang_timeout_s = float(hang) if hang else None
        default = environ.get(contract.HANG_DEFAULT_S)
        self.hang_default_s = float(default) if default else None
        self.deadline = float(environ[contract.DEADLINE]) if environ.get(contract.DEADLINE) else None
        self.storage: Storage = open_storage(self.run_dir)
        if self.storage.is_local:
            self.output = Path(self.run_dir).absolute()
            self.mirror: Mirror | None = None
        else:
            run_id = environ.get(contract.RUN_ID, "run")
            self.output = Path(environ.get(contract.OUTPUT_DIR) or Path(tempfile.gettempdir()) / "runner" / run_id)
            self.mirror = Mirror(self.output, self.storage, keep=checkpoint_keep(environ))
        self.output.mkdir(parents=True, exist_ok=True)
        self.local = LocalStorage(self.output)
        self.stop_reason: str | None = None
        self.job_stopped = False  # a stop was sent to the running job (a stop that comes after it ended is not one)
        self.safety_stop: str | None = None  # why a safety net stopped the job (exit code 124 then)
        self._last_submitter_check = 0.0
        self.started = now()
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)
        # The job's secrets, as the job has them: replaced in everything it prints before it goes anywhere.
        self.redactor = Redactor(job_secrets(environ))
        self._lock = threading.Lock()
        self._done = threading.Event()
        # Progress: the trainer's step (progress.json), or for a command that writes none, its output so far.
        self._output_bytes = 0
        self._progress: tuple[object, ...] | None = None
        self.progress_at = time.time()
        self.reported: Progress | None = None
        self.reports_progress = False  # the job writes progress.json or metrics.jsonl
        self.resumed: dict[str, object] | None = None  # where a command job's attempt went on from (goes_on_from)
        self.restored: dict[str, float | int | str] | None = None  # the checkpoints' download onto this machine
        self.restored_at = 0.0

    # -- the job --------------------------------------------------------------------------------------------

    def command(self) -> list[str]:
        raw = self.environ.get(contract.COMMAND)
        return json.loads(raw) if raw else [sys.executable, "-m", "runner.train"]

    def job_env(self) -> dict[str, str]:
        env = dict(self.environ)
        ctx = contract.JobContext.from_env({**env, contract.OUTPUT_DIR: str(self.output)})
        env.update(ctx.env())
        env.setdefault("PYTHONUNBUFFERED", "1")
        # Every job's JAX (the built-in engine's and a user's own) keeps what it compiles in the start-up cache: a
        # later run on this machine loads the programs instead of compiling them again.
        from runner.train.jaxperf import compile_cache_env
        from runner.worker.allocator import allocator_env

        for name, value in compile_cache_env(env).items():
            env.setdefault(name, value)
        # The JAX engine without accelerator chips: XLA's per-step temporaries are host memory, reused, not mapped
        # afresh each step.
        env.update(allocator_env(env))
        if contract.cluster(env) is not None:
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(JOB_PATH), env.get("PYTHONPATH")]))
        return env

    def _pump(self, proc: subprocess.Popen[bytes], log_file: Path) -> None:
        """The job's output, its secrets' values replaced first (runner.redact: a value split across two reads
        too): raw to our stdout (a terminal keeps Keras' live bar), cleaned of redraws and escape sequences into
        the log file and the exit record's tail (runner.watch.logtext)."""
        assert proc.stdout is not None
        cleaner = LogCleaner()
        partial = b""
        redactor = self.redactor

        def store(data: bytes, log: BinaryIO) -> bytes:
            log.write(data)
            log.flush()
            *lines, rest = (partial + data).split(b"\n")
            self.tail.extend(line.decode(errors="replace") for line in lines if line.strip())
            return rest

        def out(data: bytes, log: BinaryIO) -> bytes:
            sys.stdout.buffer.write(data)
            sys.stdout.flush()
            return store(cleaner.feed(data), log)

        with log_file.open("ab") as log:
            while chunk := os.read(proc.stdout.fileno(), 65536):
                self._output_bytes += len(chunk)
                partial = out(redactor.feed(chunk), log)
            partial = out(redactor.flush(), log)
            partial = store(cleaner.flush(), log)

    # -- periodic work ------------------------------------------------------------------------------------------

    def progress(self) -> Progress | None:
        """What the job reports of its progress (progress.json, and metrics.jsonl growing), and when it last
        advanced. A job that reports neither (a custom command) advances while it writes output."""
        try:
            reported: Progress | None = Progress.from_json(json.loads((self.output / contract.PROGRESS).read_bytes()))
        except (OSError, ValueError, TypeError):
            reported = None
        try:
            metrics: int | None = (self.output / contract.METRICS).stat().st_size
        except OSError:
            metrics = None
        self.reported, self.reports_progress = reported, reported is not None or metrics is not None
        # Validation steps count too (in the marker): a long evaluation is progress, not a hang.
        marker = (
            (reported.marker if reported else None, metrics)
            if self.reports_progress
            else ("output", self._output_bytes)
        )
        if marker != self._progress:
            self._progress, self.progress_at = marker, time.time()
        return reported

    def hang_limit(self) -> tuple[float, str] | None:
        """(seconds, what sets them) after which a job whose progress stands still is stopped as hung: the spec's
        hang_timeout, else a pod slice's default once the job reports progress (never for one that reports none,
        whose silence says nothing)."""
        if self.hang_timeout_s:
            return self.hang_timeout_s, "hang_timeout passed"
        if self.hang_default_s and self.reports_progress:
            return self.hang_default_s, "a pod slice's default hang limit passed (teardown.hang_timeout sets another)"
        return None

    def heartbeat(self, phase: str) -> None:
        """Every worker's own (the runner's readiness and liveness of each host); worker 0's is also the run's."""
        beat = Heartbeat(
            time=now(),
            phase=phase,
            worker=self.worker,
            pid=os.getpid(),
            host=socket.gethostname(),
            uptime_s=round(time.time() - self.started, 1),
            progress=self.progress(),
            progress_at=round(self.progress_at, 3),
        )
        data = json.dumps(beat.to_json()).encode()
        self.local.write_bytes(contract.heartbeat_key(self.worker), data)
        if self.worker == 0:
            self.local.write_bytes(contract.HEARTBEAT, data)

    def push(self) -> None:
        if self.mirror is None:
            return
        try:
            with self._lock:
                self.mirror.push()
        except Exception as exc:  # storage trouble must not kill the job; the next push retries
            print(f"[runner] warning: could not sync the run directory: {exc}", file=sys.stderr, flush=True)

    def _ticker(self) -> None:
        last_beat = last_sync = 0.0
        while not self._done.wait(0.5):
            t = time.monotonic()
            if t - last_beat >= self.heartbeat_s:
                self.heartbeat("running")
                last_beat = t
            if t - last_sync >= self.sync_s:
                self.push()
                last_sync = t

    # -- lifecycle --------------------------------------------------------------------------------------------

    def _on_signal(self, signum: int, _frame: object) -> None:
        if self.stop_reason is None:
            self.stop_reason = "cancelled"
            print(f"[runner] {signal.Signals(signum).name}: stopping the job", file=sys.stderr, flush=True)

    def _check_safety_nets(self) -> None:
        """max_runtime (from this start, and the run's absolute deadline across restarts) and, when the run asked
        for them, progress (hang_timeout) and the submitting runner's heartbeat. Each stops the job with exit code
        124; the bootstrap then deletes the VM."""
        now_s = time.time()
        if self.max_runtime_s and now_s > self.started + self.max_runtime_s:
            self.stop_reason = "timed_out"
            self.safety_stop = f"max_runtime ({self.max_runtime_s:.0f}s) passed"
        elif self.deadline and now_s > self.deadline:
            self.stop_reason = "timed_out"
            self.safety_stop = "max_runtime passed, counted from the submit (across restarts)"
        elif self.hang_timeout_s or self.hang_default_s:
            self.progress()
            limit = self.hang_limit()
            if limit is not None and now_s - self.progress_at > limit[0]:
                self.stop_reason = "hung"
                at = self.reported.global_step if self.reported and self.reported.global_step is not None else None
                at = at if at is not None else self.reported.step if self.reported else None
                step = f" (step {at})" if at is not None else ""
                self.safety_stop = f"no progress for {now_s - self.progress_at:.0f}s{step}: {limit[1]}"
        if (
            not self.safety_stop
            and self.submitter_timeout_s
            and now_s - self._last_submitter_check >= min(15.0, self.submitter_timeout_s / 4)
        ):
            self._last_submitter_check = now_s
            try:
                raw = self.storage.read_bytes(contract.RUNNER_HEARTBEAT)
                seen = float(json.loads(raw)["time"]) if raw else self.started
            except Exception:  # unreadable now: the next check retries; never stop a job on a storage hiccup
                return
            if now_s - seen > self.submitter_timeout_s:
                self.stop_reason = "cancelled"
                self.safety_stop = f"the submitting runner has not been heard from for {now_s - seen:.0f}s"
        if self.safety_stop:
            print(f"[runner] {self.safety_stop}: stopping the job", file=sys.stderr, flush=True)

    def restore(self) -> list[str]:
        """What a new machine needs from the run directory before the job starts (Mirror.pull_resume_state: the
        newest checkpoints, whoever wrote them), said in the job's log; a local run directory is the output
        directory already."""
        if self.mirror is None:
            return []
        t0 = time.monotonic()
        pulled = self.mirror.pull_resume_state(self.worker)
        restored = [key for key in pulled if key.startswith(f"{contract.CHECKPOINTS}/")]
        if restored:
            size = sum((self.output / key).stat().st_size for key in restored if (self.output / key).is_file())
            took = time.monotonic() - t0
            self.note(
                f"[runner] restored {len(restored)} checkpoint file(s), {size / 1e6:.1f} MB, from the run directory "
                f"into {contract.CHECKPOINT_DIR} in {took:.1f}s"
            )
            # said once the worker's event file is open (it is among what was pulled): the run's goodput
            self.restored = {"seconds": round(took, 3), "stage": "download", "files": len(restored), "bytes": size}
            self.restored_at = time.time()
        return pulled

    def shared(self) -> list[Survey]:
        """The shared location's checkpoints (RUNNER_SHARED_CHECKPOINT_DIR: checkpoints/shared in the run
        directory), keyed as under checkpoints/, where the run directory is not this host's output directory (a
        local one holds them in its checkpoints/ already)."""
        if self.mirror is None:
            return []
        prefix = contract.SHARED_CHECKPOINTS + "/"
        try:
            return [survey(Listing.of_storage(self.storage, prefix, root=contract.CHECKPOINTS + "/"))]
        except StorageError as exc:
            self.note(f"[runner] warning: {contract.SHARED_CHECKPOINT_DIR} cannot be read now: {exc}")
            return []

    def goes_on_from(self, events: EventLog) -> dict[str, object] | None:
        """A command job's later attempt: where it goes on from, as the runner reads RUNNER_CHECKPOINT_DIR and the
        shared location (the newest committed checkpoint of a format a job resumes from by itself: an Orbax step, a
        TensorFlow save, a BackupAndRestore backup: runner.checkpoints.resume_point), said in its log and as an
        event. keras_callbacks() says it itself, from the checkpoint it loads."""
        found = survey(Listing.of_directory(self.output / contract.CHECKPOINTS))
        if any(s.format == "Keras" for s in found.saved):
            return None
        surveys = [found, *self.shared()]
        newest = resume_point(surveys)
        if newest is None:
            if not any(each.committed() for each in surveys):
                self.note(
                    f"[runner] nothing in {contract.CHECKPOINT_DIR} or {contract.SHARED_CHECKPOINT_DIR} to go on "
                    "from: the job starts over, unless it keeps its checkpoints elsewhere"
                )
            return None
        record = Resumed(
            checkpoint=f"{contract.CHECKPOINTS}/{newest.path}",
            step=newest.step,
            redone=redone(furthest_step(self.output), newest.step),
            format=newest.format,
            epoch=newest.epochs_done,
        )
        where = contract.SHARED_CHECKPOINT_DIR if newest.path.startswith(SHARED) else contract.CHECKPOINT_DIR
        self.note(f"[runner] {record.text()}: the newest committed checkpoint in {where}")
        events.emit(RESUMED, **record.to_json())
        return record.to_json()

    def resumption(self) -> dict[str, object] | None:
        """Where this attempt went on from, for summary.json: the supervisor's word, else keras_callbacks' (its
        event, since this start)."""
        if self.resumed is not None:
            return self.resumed
        try:
            said = latest([e for e in read_events(self.local) if e.time >= self.started])
        except Exception:  # a summary without it is better than none
            return None
        return said.to_json() if said is not None else None

    def note(self, line: str) -> None:
        """A line of the supervisor's own in the job's log (and on its output), where `runner logs` shows it."""
        print(line, flush=True)
        log_file = self.output / contract.log_key(self.worker)
        log_file.parent.mkdir(parents=True, exist_ok=True)
        with log_file.open("a") as log:
            log.write(line + "\n")

    def _stop(self, proc: subprocess.Popen[bytes]) -> None:
        """SIGTERM the job's whole process group and wait for all of it, not only its first process (a shell form's
        shell ends at once while its program saves); SIGKILL what is left when the job's grace ends."""
        if proc.poll() is None:
            self.job_stopped = True
            processes.stop_group(proc.pid, self.job_grace_s)

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        pulled = self.restore()
        source = f"worker-{self.worker}"
        earlier = (self.output / contract.events_key(source)).is_file()  # a later attempt (or a recreated machine)
        events = EventLog(self.local, source)
        cmd = self.command()
        events.emit(
            "worker_started",
            worker=self.worker,
            host=socket.gethostname(),
            pid=os.getpid(),
            command=cmd,
            restored=pulled,
        )
        if self.restored is not None:
            events.emit(RESTORED, happened_at=self.restored_at, **self.restored)
        if earlier and self.worker == 0 and contract.COMMAND in self.environ:
            self.resumed = self.goes_on_from(events)
        self.heartbeat("starting")
        self.push()
        log_file = self.output / contract.log_key(self.worker)
        log_file.parent.mkdir(parents=True, exist_ok=True)
        env = self.job_env()
        try:
            proc = subprocess.Popen(
                cmd,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                preexec_fn=_job_process,
            )
        except OSError as exc:
            return self.finish(events, None, f"cannot start {cmd[0]}: {exc.strerror}")
        events.emit("job_started", pid=proc.pid)
        pump = threading.Thread(target=self._pump, args=(proc, log_file), daemon=True)
        pump.start()
        ticker = threading.Thread(target=self._ticker, daemon=True)
        ticker.start()
        while proc.poll() is None:
            if self.stop_reason is None:
                self._check_safety_nets()
            if self.stop_reason:
                # Said before the job is stopped: on a pod slice, a peer that the stop reaches first through the
                # job itself (JAX's preemption sync) may end before its own supervisor hears of it.
                events.emit("stopping", reason=self.stop_reason)
                self._stop(proc)
                break
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(0.2)
        proc.wait()
        pump.join(5)
        self._done.set()
        ticker.join(5)
        if self.worker == 0:  # a job that wrote no summary.json gets one from its metrics and log (before the exit)
            try:
                write_derived_summary(self.output, resumed=self.resumption())
            except Exception as exc:  # the exit record matters more than a summary
                print(f"[runner] warning: no summary derived: {exc}", file=sys.stderr, flush=True)
        return self.finish(events, proc.returncode, self.safety_stop)

    def finish(self, events: EventLog, returncode: int | None, error: str | None) -> int:
        # A negative return code is the signal that killed the job; report it as a shell would (128 + signal).
        code = 127 if returncode is None else returncode if returncode >= 0 else 128 - returncode
        reported = self.progress()
        if code == 0 and (not self.stop_reason or (reported is not None and reported.phase == TRAINING_DONE)):
            # The job finished its work, whatever asked it to stop meanwhile: a stop that came after its training
            # ran to its end (runner.train says so in progress.json) does not make it cancelled.
            state = RunState.SUCCEEDED
            if self.stop_reason:
                print("[runner] the job had finished its training when it was stopped", file=sys.stderr, flush=True)
        else:
            code = EXIT_SAFETY_STOP if self.safety_stop else code
            state = RunState(self.stop_reason or "failed")
        # A stop's exit code with no stop sent from here: on a pod slice, the stop the job's peers agreed on reached
        # it first. Recorded as such; the run counts it as stopped only while another worker was (worker_states).
        # A stop that came here once the job had ended (the runner stopping every worker when one has ended) played
        # no part in it.
        workers = int(self.environ.get(contract.NUM_WORKERS) or 1)
        peer_stop = not self.job_stopped and code in STOP_EXIT_CODES and workers > 1
        if peer_stop:
            state = RunState.CANCELLED
            error = error or (
                f"the job ended on a stop (exit code {code}) that its supervisor did not send: a stop its peers "
                "agreed on (JAX's preemption sync), or a signal sent to the job itself"
            )
        record = ExitRecord(self.worker, state, code, now(), self.started, error, list(self.tail), peer_stop)
        self.local.write_bytes(contract.exit_key(self.worker), json.dumps(record.to_json(), indent=1).encode())
        events.emit("worker_exited", state=str(state), exit_code=code)
        self.heartbeat("exited")
        self.push()
        return code


def main() -> int:
    if contract.RUN_DIR not in os.environ:
        print(
            f"error: {contract.RUN_DIR} is not set; this is the job container's entrypoint, started by `runner submit`",
            file=sys.stderr,
        )
        return 2
    return Supervisor(dict(os.environ)).run()
