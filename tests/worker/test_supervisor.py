"""The container entrypoint (runner.worker) as a real process: contract, logs, exit records, signals, storage."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from runner import contract
from runner.storage import open_storage
from runner.worker import processes
from tests.environ import child_env
from tests.stops import all_stopped, ended_unreaped, job_pid, sigterm_pending
from tests.waiting import wait_for

SHOW_CONTRACT = (
    "import json, os, pathlib; "
    "env = {k: v for k, v in os.environ.items() if k.startswith('RUNNER_') or k == 'USER_VAR'}; "
    "print(json.dumps(env)); "
    "p = pathlib.Path(os.environ['RUNNER_CHECKPOINT_DIR']); p.mkdir(parents=True, exist_ok=True); "
    "(p / 'mine.bin').write_bytes(b'x' * 1000)"
)


def worker_env(run_dir: str, command: list[str], **extra: str) -> dict[str, str]:
    env = child_env()
    env.update(
        {
            contract.RUN_DIR: run_dir,
            contract.RUN_ID: "r-" + uuid.uuid4().hex[:6],
            contract.COMMAND: json.dumps(command),
            contract.HEARTBEAT_S: "0.5",
            contract.SYNC_S: "0.5",
            contract.GRACE_S: "5",
        }
    )
    env.update(extra)
    return env


def run_worker(env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "runner.worker"], env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def exit_record(run_dir: str) -> dict:
    return json.loads(open_storage(run_dir).read_bytes(contract.exit_key(0)) or b"{}")


def test_custom_command_gets_the_contract_local(tmp_path: Path) -> None:
    run_dir = str(tmp_path / "run")
    result = run_worker(worker_env(run_dir, [sys.executable, "-c", SHOW_CONTRACT], USER_VAR="kept"))
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout.splitlines()[0])
    assert seen[contract.OUTPUT_DIR] == run_dir  # local storage: the job writes straight into the run directory
    assert seen[contract.CHECKPOINT_DIR] == f"{run_dir}/checkpoints"
    assert seen["USER_VAR"] == "kept"
    assert (Path(run_dir) / "checkpoints" / "mine.bin").stat().st_size == 1000
    record = exit_record(run_dir)
    assert (record["state"], record["exit_code"]) == ("succeeded", 0)
    log = (Path(run_dir) / contract.log_key(0)).read_text()
    assert seen[contract.RUN_ID] in log
    beat = json.loads((Path(run_dir) / contract.HEARTBEAT).read_text())
    assert beat["phase"] == "exited"


def test_custom_command_output_reaches_cloud_storage(gcs: str) -> None:
    run_dir = f"gs://runner-test/{uuid.uuid4().hex}/runs/r1"
    script = SHOW_CONTRACT + "; import time; print('working', flush=True); time.sleep(1.5); print('done')"
    env = worker_env(run_dir, [sys.executable, "-c", script])
    result = run_worker(env)
    assert result.returncode == 0, result.stderr
    store = open_storage(run_dir)
    keys = {o.key for o in store.list()}
    assert {
        "checkpoints/mine.bin",
        "logs/worker-0.log",
        "exit/worker-0.json",
        "heartbeat",
        "heartbeats/worker-0.json",  # each worker's own: the runner's readiness and liveness of each host
        "events/worker-0.jsonl",
    } <= keys
    assert b"working\n" in store.read_bytes("logs/worker-0.log")
    seen = json.loads(result.stdout.splitlines()[0])
    assert seen[contract.OUTPUT_DIR] != run_dir  # staged locally, mirrored by the supervisor
    events = [json.loads(line)["event"] for line in store.read_bytes("events/worker-0.jsonl").splitlines()]
    assert events == ["worker_started", "job_started", "worker_exited"]


def test_restarted_worker_appends_to_its_log_and_events(gcs: str, tmp_path: Path) -> None:
    run_dir = f"gs://runner-test/{uuid.uuid4().hex}/runs/r2"
    for i, staging in enumerate(["a", "b"]):  # two "VMs": nothing local survives between them
        env = worker_env(
            run_dir, [sys.executable, "-c", f"print('attempt {i}')"], **{contract.OUTPUT_DIR: str(tmp_path / staging)}
        )
        assert run_worker(env).returncode == 0
    store = open_storage(run_dir)
    assert store.read_bytes("logs/worker-0.log") == (
        b"attempt 0\n"  # a first attempt says nothing of where it starts; a later one does
        b"[runner] nothing in RUNNER_CHECKPOINT_DIR or RUNNER_SHARED_CHECKPOINT_DIR to go on from: the job starts "
        b"over, unless it keeps its checkpoints elsewhere\nattempt 1\n"
    )
    events = [json.loads(line) for line in store.read_bytes("events/worker-0.jsonl").splitlines()]
    assert [e["event"] for e in events].count("worker_started") == 2
    assert "logs/worker-0.log" in events[3]["restored"]


def test_failing_command_records_failure_and_its_last_lines(tmp_path: Path) -> None:
    run_dir = str(tmp_path / "run")
    script = "import sys; print('step 1'); print('Traceback: boom', file=sys.stderr); sys.exit(3)"
    result = run_worker(worker_env(run_dir, [sys.executable, "-c", script]))
    assert result.returncode == 3
    record = exit_record(run_dir)
    assert (record["state"], record["exit_code"]) == ("failed", 3)
    assert record["tail"] == ["step 1", "Traceback: boom"]


def test_missing_program_is_a_failure_not_a_crash(tmp_path: Path) -> None:
    run_dir = str(tmp_path / "run")
    result = run_worker(worker_env(run_dir, ["/no/such/program"]))
    assert result.returncode == 127
    record = exit_record(run_dir)
    assert record["state"] == "failed"
    assert "cannot start /no/such/program" in record["error"]


def test_max_runtime_stops_the_job(tmp_path: Path) -> None:
    run_dir = str(tmp_path / "run")
    env = worker_env(run_dir, [sys.executable, "-c", "import time; time.sleep(60)"], **{contract.MAX_RUNTIME_S: "1"})
    t0 = time.monotonic()
    result = run_worker(env)
    assert time.monotonic() - t0 < 30
    assert result.returncode == 124  # a safety stop, like timeout(1): the VM is deleted even under on_success
    record = exit_record(run_dir)
    assert record["state"] == "timed_out" and "max_runtime" in record["error"]


def test_the_runs_deadline_holds_across_restarts(tmp_path: Path) -> None:
    run_dir = str(tmp_path / "run")
    env = worker_env(
        run_dir,
        [sys.executable, "-c", "import time; time.sleep(60)"],
        **{contract.MAX_RUNTIME_S: "3600", contract.DEADLINE: str(int(time.time()) + 1)},
    )
    assert run_worker(env).returncode == 124
    assert exit_record(run_dir)["state"] == "timed_out"


def test_a_lost_submitter_stops_a_run_that_asked_for_it(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / contract.RUNNER_HEARTBEAT).write_text(json.dumps({"time": time.time() - 3600}))
    env = worker_env(
        str(run_dir), [sys.executable, "-c", "import time; time.sleep(60)"], **{contract.SUBMITTER_TIMEOUT_S: "60"}
    )
    t0 = time.monotonic()
    assert run_worker(env).returncode == 124
    assert time.monotonic() - t0 < 30
    record = exit_record(str(run_dir))
    assert record["state"] == "cancelled" and "has not been heard from" in record["error"]


def test_a_pod_slices_default_hang_limit_ends_a_job_that_reported_progress_and_stopped(tmp_path: Path) -> None:
    run_dir = str(tmp_path / "run")
    stalls = "import json, os, time; open(os.environ['RUNNER_PROGRESS_FILE'], 'w').write(json.dumps({'step': 7})); "
    env = worker_env(run_dir, [sys.executable, "-c", stalls + "time.sleep(120)"], **{contract.HANG_DEFAULT_S: "1"})
    assert run_worker(env).returncode == 124  # a safety stop
    record = exit_record(run_dir)
    assert record["state"] == "hung" and "(step 7): a pod slice's default hang limit passed" in record["error"]


def test_the_default_hang_limit_leaves_a_job_that_reports_no_progress_alone(tmp_path: Path) -> None:
    """Its silence says nothing: only hang_timeout in the spec ends such a job for standing still."""
    run_dir = str(tmp_path / "run")
    quiet = [sys.executable, "-c", "import time; time.sleep(3)"]  # three times the limit, writing nothing
    assert run_worker(worker_env(run_dir, quiet, **{contract.HANG_DEFAULT_S: "1"})).returncode == 0
    assert exit_record(run_dir)["state"] == "succeeded"


def test_sigterm_cancels_and_the_job_gets_it(tmp_path: Path) -> None:
    run_dir = str(tmp_path / "run")
    marker = tmp_path / "got-sigterm"
    script = (
        "import signal, sys, time, pathlib\n"
        f"signal.signal(signal.SIGTERM, lambda *a: (pathlib.Path({str(marker)!r}).write_text('1'), sys.exit(0)))\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "runner.worker"],
        env=worker_env(run_dir, [sys.executable, "-c", script]),
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    assert marker.read_text() == "1"
    assert exit_record(run_dir)["state"] == "cancelled"


def test_a_shell_form_commands_program_gets_the_sigterm_and_is_waited_for(tmp_path: Path) -> None:
    """`command: python train.py` runs as /bin/sh -c, whose program is the shell's child (dash does not exec it).
    A stop (here the supervisor's own SIGTERM, as `docker stop` and a Spot VM's shutdown deliver it) reaches the
    program, not only the shell, and the supervisor waits for the program's save before it records the end."""
    run_dir = str(tmp_path / "run")
    marker = tmp_path / "saved"
    program = (
        "import pathlib, signal, sys, time\n"
        "def save(*_):\n"
        f"    time.sleep(1); pathlib.Path({str(marker)!r}).write_text('1'); print('saved', flush=True); sys.exit(143)\n"
        "signal.signal(signal.SIGTERM, save)\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    script = tmp_path / "train.py"
    script.write_text(program)
    proc = subprocess.Popen(
        [sys.executable, "-m", "runner.worker"],
        env=worker_env(run_dir, ["/bin/sh", "-c", f"cd {tmp_path} && {sys.executable} train.py"]),
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 143
    assert marker.read_text() == "1", "the program never got the SIGTERM, or the supervisor did not wait for it"
    assert "saved" in exit_record(run_dir)["tail"]
    events = [json.loads(line) for line in (Path(run_dir) / "events" / "worker-0.jsonl").read_text().splitlines()]
    job = next(e["pid"] for e in events if e["event"] == "job_started")
    assert not processes.group_alive(job), "a process of the job outlived it"


def test_a_job_that_ignores_sigterm_still_leaves_an_exit_record_before_the_group_is_killed(tmp_path: Path) -> None:
    """As the runner, `docker stop` and a Spot preemption do: SIGTERM to the whole group, SIGKILL when the same grace
    ends. A job stuck past it (in a collective with a dead peer, say) is killed by the supervisor first, and the
    supervisor records the stop before its own end."""
    run_dir = str(tmp_path / "run")
    script = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); "
    script += "time.sleep(60)"
    grace = 6.0
    proc = subprocess.Popen(
        [sys.executable, "-m", "runner.worker"],
        env=worker_env(run_dir, [sys.executable, "-c", script], **{contract.GRACE_S: str(grace)}),
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as each worker has
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)
    record = exit_record(run_dir)
    assert record["state"] == "cancelled" and record["exit_code"] == 137  # the job was killed, and that is recorded


def test_entrypoint_without_contract_explains_itself() -> None:
    env = child_env()
    result = subprocess.run(
        [sys.executable, "-m", "runner.worker"], env=env, capture_output=True, text=True, timeout=30, check=False
    )
    assert result.returncode == 2
    assert "RUNNER_RUN_DIR is not set" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("storage_kind", ["local", "gcs"])
def test_heartbeat_is_fresh_while_the_job_runs(
    storage_kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if storage_kind == "gcs":
        request.getfixturevalue("gcs")
        run_dir = f"gs://runner-test/{uuid.uuid4().hex}/runs/hb"
    else:
        run_dir = str(tmp_path / "run")
    done = tmp_path / "done"  # the job runs until the test has seen what it waits for
    job = f"import os, time\nwhile not os.path.exists({str(done)!r}): time.sleep(0.05)"
    proc = subprocess.Popen(
        [sys.executable, "-m", "runner.worker"],
        env=worker_env(run_dir, [sys.executable, "-c", job]),
        stdout=subprocess.DEVNULL,
    )
    store = open_storage(run_dir)
    beats: set[float] = set()

    def refreshed() -> bool:
        raw = store.read_bytes(contract.HEARTBEAT)
        beat = json.loads(raw) if raw else {}
        if beat.get("phase") == "running":
            beats.add(beat["time"])
        assert proc.poll() is None, "the worker ended"
        return len(beats) >= 2  # refreshed, not written once

    try:
        wait_for(refreshed, "two heartbeats of the running job", timeout=60, poll_s=0.2)
    finally:
        done.touch()
    assert proc.wait(30) == 0


def test_a_stop_that_comes_once_the_job_has_ended_is_not_what_ended_it(tmp_path: Path) -> None:
    """Worker 1 of 2: its job ends with 143 on its own (the stop its peers agreed on), and only then does a stop
    reach its supervisor (the runner stopping every worker once one has ended). The exit record says the truth: a
    stop it did not send (peer_stop), not its own. The supervisor is held (SIGSTOP) while its job ends and the
    signal comes, so the signal is there before it can see the job's end, in whichever order it then takes them."""
    run_dir = str(tmp_path / "run")
    go = tmp_path / "go"
    job = f"import os, sys, time\nwhile not os.path.exists({str(go)!r}): time.sleep(0.02)\nsys.exit(143)"
    env = worker_env(run_dir, [sys.executable, "-c", job], **{contract.NUM_WORKERS: "2", contract.WORKER_ID: "1"})
    proc = subprocess.Popen([sys.executable, "-m", "runner.worker"], env=env, stdout=subprocess.DEVNULL)
    try:
        pid = wait_for(lambda: job_pid(Path(run_dir), 1), "the job to start")
        os.kill(proc.pid, signal.SIGSTOP)
        wait_for(lambda: all_stopped(proc.pid), "the supervisor to be held")
        go.touch()
        wait_for(lambda: ended_unreaped(pid), "the job to end (unreaped: its supervisor is held)")
        os.kill(proc.pid, signal.SIGTERM)
        wait_for(lambda: sigterm_pending(proc.pid), "the stop to wait for the supervisor")
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    assert proc.wait(60) == 143
    record = json.loads(open_storage(run_dir).read_bytes(contract.exit_key(1)) or b"{}")
    assert (record["state"], record["exit_code"], record["peer_stop"]) == ("cancelled", 143, True), record


def test_the_log_is_stored_clean_and_the_live_output_keeps_the_redraws(tmp_path: Path) -> None:
    """Keras' progress bar redraws one line with backspaces and \\r, in colour: the terminal (the supervisor's
    stdout) gets it as it is, logs/worker-0.log and the exit record's tail get what a terminal ends up showing."""
    script = (
        "import sys\n"
        "for i in range(1, 4):\n"
        "    sys.stdout.write('\\b' * 20 + '\\r\\x1b[1m' + f'{i}/3\\x1b[0m - loss: 0.{9 - i}'); sys.stdout.flush()\n"
        "print()\n"
        "print('\\x1b[32mdone\\x1b[0m')\n"
    )
    run_dir = str(tmp_path / "run")
    result = subprocess.run(
        [sys.executable, "-m", "runner.worker"],
        env=worker_env(run_dir, [sys.executable, "-c", script]),
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert b"\r\x1b[1m2/3\x1b[0m" in result.stdout
    assert (Path(run_dir) / contract.log_key(0)).read_text() == "3/3 - loss: 0.6\ndone\n"
    record = json.loads((Path(run_dir) / contract.exit_key(0)).read_text())
    assert record["tail"] == ["3/3 - loss: 0.6", "done"]


# A user's own JAX code, untouched: it compiles one program and says how many were loaded from JAX's persistent
# cache instead of compiled (JAX's own monitoring event).
JAX_JOB = (
    "import jax, jax.numpy as jnp, os\n"
    "hits = []\n"
    "jax.monitoring.register_event_listener(lambda e, **_: hits.append(e) if e.endswith('/cache_hits') else None)\n"
    "jax.jit(lambda x: jnp.tanh(x @ x.T).sum())(jnp.ones((256, 256))).block_until_ready()\n"
    "print('cache', os.environ.get('JAX_COMPILATION_CACHE_DIR'), 'hits', len(hits))\n"
)


def test_a_users_jax_job_loads_what_an_earlier_run_here_compiled(tmp_path: Path) -> None:
    """Every job's JAX keeps its compiled programs in the start-up cache (RUNNER_CACHE_DIR), not only the built-in
    engine's, the small ones too (this one compiles in a few hundredths of a second): the second run of the same
    code loads the program instead of compiling it; a cache the user named for JAX is theirs and left as it is."""
    cache = tmp_path / "startup"
    command = [sys.executable, "-c", JAX_JOB]
    extra = {contract.CACHE_DIR: str(cache)}
    said = []
    for attempt in ("first", "second"):
        result = run_worker(worker_env(str(tmp_path / attempt), command, **extra))
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
        said.append(next(line.split() for line in result.stdout.splitlines() if line.startswith("cache ")))
    assert [(where, hits == "0") for _, where, _, hits in said] == [
        (str(cache / "jax"), True),
        (str(cache / "jax"), False),
    ]
    kept = sorted((cache / "jax").iterdir())
    assert kept
    mine = tmp_path / "mine"  # the user's cache, and their minimum compile time (JAX's own is 1 s)
    theirs = {"JAX_COMPILATION_CACHE_DIR": str(mine), "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
    result = run_worker(worker_env(str(tmp_path / "third"), command, **extra, **theirs))
    assert f"cache {mine} hits 0" in result.stdout, result.stdout[-2000:]
    assert list(mine.iterdir()) and sorted((cache / "jax").iterdir()) == kept
