"""The container's entrypoint: run the job under the run-directory contract.

One supervisor runs on each worker (each TPU VM host, or the one local process). It

  * starts the job (the built-in trainer, or the spec's custom command) with the contract's environment,
  * tees the job's output to the terminal (docker logs) and to logs/worker-N.log,
  * writes the heartbeat while the job lives and mirrors the output directory to storage,
  * stops the job on SIGTERM/SIGINT (docker stop, preemption notice, the runner) or when max_runtime passes,
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

from runner import contract
from runner.events import EventLog, now
from runner.storage import Storage, open_storage
from runner.storage.local import LocalStorage
from runner.worker.mirror import Mirror

TAIL_LINES = 30


def _set_pdeathsig() -> None:
    """Linux: the job dies with its supervisor, so a killed supervisor leaves no trainer behind."""
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
        self.heartbeat_s = float(environ.get(contract.HEARTBEAT_S, "10"))
        self.sync_s = float(environ.get(contract.SYNC_S, "5"))
        self.grace_s = float(environ.get(contract.GRACE_S, "30"))
        max_runtime = environ.get(contract.MAX_RUNTIME_S)
        self.max_runtime_s = float(max_runtime) if max_runtime else None
        self.storage: Storage = open_storage(self.run_dir)
        if self.storage.is_local:
            self.output = Path(self.run_dir).absolute()
            self.mirror: Mirror | None = None
        else:
            run_id = environ.get(contract.RUN_ID, "run")
            self.output = Path(environ.get(contract.OUTPUT_DIR) or Path(tempfile.gettempdir()) / "runner" / run_id)
            self.mirror = Mirror(self.output, self.storage)
        self.output.mkdir(parents=True, exist_ok=True)
        self.local = LocalStorage(self.output)
        self.stop_reason: str | None = None
        self.started = now()
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)
        self._lock = threading.Lock()
        self._done = threading.Event()

    # -- the job --------------------------------------------------------------------------------------------

    def command(self) -> list[str]:
        raw = self.environ.get(contract.COMMAND)
        return json.loads(raw) if raw else [sys.executable, "-m", "runner.train"]

    def job_env(self) -> dict[str, str]:
        env = dict(self.environ)
        ctx = contract.JobContext.from_env({**env, contract.OUTPUT_DIR: str(self.output)})
        env.update(ctx.env())
        env.setdefault("PYTHONUNBUFFERED", "1")
        return env

    def _pump(self, proc: subprocess.Popen[bytes], log_file: Path) -> None:
        assert proc.stdout is not None
        partial = b""
        with log_file.open("ab") as log:
            while chunk := os.read(proc.stdout.fileno(), 65536):
                log.write(chunk)
                log.flush()
                sys.stdout.buffer.write(chunk)
                sys.stdout.flush()
                partial += chunk
                *lines, partial = partial.replace(b"\r", b"\n").split(b"\n")
                self.tail.extend(line.decode(errors="replace") for line in lines if line.strip())
        if partial.strip():
            self.tail.append(partial.decode(errors="replace"))

    # -- periodic work ------------------------------------------------------------------------------------------

    def heartbeat(self, phase: str) -> None:
        if self.worker != 0:
            return
        beat = {
            "time": now(),
            "worker": self.worker,
            "pid": os.getpid(),
            "phase": phase,
            "host": socket.gethostname(),
            "uptime_s": round(time.time() - self.started, 1),
        }
        self.local.write_bytes(contract.HEARTBEAT, json.dumps(beat).encode())

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

    def _stop(self, proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(self.grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        pulled = self.mirror.pull_resume_state(self.worker) if self.mirror else []
        events = EventLog(self.local, f"worker-{self.worker}")
        cmd = self.command()
        events.emit(
            "worker_started",
            worker=self.worker,
            host=socket.gethostname(),
            pid=os.getpid(),
            command=cmd,
            restored=pulled,
        )
        self.heartbeat("starting")
        self.push()
        log_file = self.output / contract.log_key(self.worker)
        log_file.parent.mkdir(parents=True, exist_ok=True)
        try:
            proc = subprocess.Popen(
                cmd,
                env=self.job_env(),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                preexec_fn=_set_pdeathsig,
            )
        except OSError as exc:
            return self.finish(events, None, f"cannot start {cmd[0]}: {exc.strerror}")
        events.emit("job_started", pid=proc.pid)
        pump = threading.Thread(target=self._pump, args=(proc, log_file), daemon=True)
        pump.start()
        ticker = threading.Thread(target=self._ticker, daemon=True)
        ticker.start()
        deadline = self.started + self.max_runtime_s if self.max_runtime_s else None
        while proc.poll() is None:
            if deadline and time.time() > deadline and self.stop_reason is None:
                self.stop_reason = "timed_out"
                print(
                    f"[runner] max_runtime of {self.max_runtime_s:.0f}s passed: stopping the job",
                    file=sys.stderr,
                    flush=True,
                )
            if self.stop_reason:
                self._stop(proc)
                break
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(0.2)
        proc.wait()
        pump.join(5)
        self._done.set()
        ticker.join(5)
        return self.finish(events, proc.returncode, None)

    def finish(self, events: EventLog, returncode: int | None, error: str | None) -> int:
        # A negative return code is the signal that killed the job; report it as a shell would (128 + signal).
        code = 127 if returncode is None else returncode if returncode >= 0 else 128 - returncode
        state = self.stop_reason or ("succeeded" if code == 0 else "failed")
        record = {
            "worker": self.worker,
            "state": state,
            "exit_code": code,
            "started_at": self.started,
            "finished_at": now(),
            "error": error,
            "tail": list(self.tail),
        }
        self.local.write_bytes(contract.exit_key(self.worker), json.dumps(record, indent=1).encode())
        events.emit("worker_exited", state=state, exit_code=code)
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
