"""The local backend as users drive it: the real `runner` command in a terminal-like subprocess, signals and all."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from runner import contract
from runner.backends import container
from runner.watch import runs
from runner.watch.runs import RunRecord
from runner.worker import processes
from tests.cli.test_cli import command_job
from tests.waiting import wait_for

RUNNER = [sys.executable, "-m", "runner.cli"]
LONG_JOB = "import time; print('started', flush=True); time.sleep(120)"


def only_record(home: Path) -> RunRecord:
    (path,) = list((home / "runs").glob("*.json"))
    return RunRecord.model_validate_json(path.read_text())


def log_of(record: RunRecord) -> str:
    path = Path(record.run_dir) / contract.log_key(0)
    return path.read_text() if path.exists() else ""


def log_so_far() -> str:
    """The newest run's job log as far as it goes, "" before the run has a record: `runs/` appears before the
    record in it (the record's lock file is made first), so a waiting test must not take the directory for the
    record. The runner's own reader of $RUNNER_HOME (the test's runner_home)."""
    found = runs.list_records()
    return log_of(found[0]) if found else ""


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_signal_stops_the_job_leaves_no_process_and_records_cancelled(
    tmp_path: Path, runner_home: Path, signum: int
) -> None:
    proc = subprocess.Popen(
        [*RUNNER, "submit", str(command_job(tmp_path, LONG_JOB)), "--local"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    wait_for(lambda: "started" in log_so_far(), what="the job to start")
    record = only_record(runner_home)
    job_pgid = record.handle["pgid"]
    assert processes.group_alive(job_pgid)
    proc.send_signal(signum)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, out
    assert "stopping the run" in out and "cancelled" in out
    assert "Traceback" not in out
    assert not processes.group_alive(job_pgid), "the job's processes outlived the runner"
    final = only_record(runner_home)
    assert final.state == "cancelled" and final.finished_at
    exit_record = json.loads((Path(final.run_dir) / contract.exit_key(0)).read_text())
    assert exit_record["state"] == "cancelled"
    events = [
        json.loads(line)["event"] for line in (Path(final.run_dir) / "events" / "runner.jsonl").read_text().splitlines()
    ]
    assert events[-4:] == ["cancel_requested", "teardown_requested", "teardown_done", "finished"]


def test_runner_killed_the_job_lives_on_and_status_logs_follow_it(tmp_path: Path, runner_home: Path) -> None:
    script = "import time\nfor i in range(6):\n    print('tick', i, flush=True); time.sleep(0.5)\n"
    proc = subprocess.Popen(
        [*RUNNER, "submit", str(command_job(tmp_path, script)), "--local"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_for(lambda: "tick 0" in log_so_far(), what="the first tick")
    proc.kill()  # SIGKILL: no cleanup at all
    proc.wait()
    record = only_record(runner_home)
    status = subprocess.run([*RUNNER, "status", record.run_id, "--json"], capture_output=True, text=True, check=True)
    assert json.loads(status.stdout)["state"] in ("running", "succeeded")
    logs = subprocess.run(
        [*RUNNER, "logs", record.run_id, "--follow"], capture_output=True, text=True, timeout=60, check=True
    )
    assert "tick 5" in logs.stdout  # followed to the end, from another process
    final = subprocess.run([*RUNNER, "status", record.run_id, "--json"], capture_output=True, text=True, check=True)
    assert json.loads(final.stdout)["state"] == "succeeded"


def test_detach_returns_at_once(tmp_path: Path, runner_home: Path) -> None:
    t0 = time.monotonic()
    out = subprocess.run(
        [*RUNNER, "submit", str(command_job(tmp_path, LONG_JOB)), "--local", "--detach"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert time.monotonic() - t0 < 30
    assert "runner logs" in out.stdout
    record = only_record(runner_home)
    try:
        wait_for(lambda: "started" in log_of(record), what="the detached job to start")
        status = subprocess.run(
            [*RUNNER, "status", record.run_id, "--json"], capture_output=True, text=True, check=True
        )
        assert json.loads(status.stdout)["state"] == "running"
    finally:
        processes.stop_group(record.handle["pgid"], grace_s=5)


def test_docker_command_line_keeps_values_off_argv() -> None:
    argv = container.docker_argv(
        "img:1",
        "runner-x",
        {"RUNNER_RUN_ID": "x", "SECRET": "hunter2"},
        [("/data", "/data", True), ("/runs", "/runs", False)],
        gpus=True,
    )
    assert argv[:5] == ["docker", "run", "--rm", "--name", "runner-x"]
    assert "hunter2" not in " ".join(argv)
    assert argv[argv.index("SECRET") - 1 : argv.index("SECRET") + 1] == ["-e", "SECRET"]
    assert argv[argv.index("--gpus") : argv.index("--gpus") + 2] == ["--gpus", "all"]
    assert "/data:/data:ro" in argv and "/runs:/runs" in argv
    assert argv[-1] == "img:1"


def test_without_docker_the_entrypoint_runs_as_a_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no docker or podman client on PATH
    launch = container.plan_launch("img:1", {"A": "1"}, name="n", data_dir=tmp_path, storage_root=None)
    assert launch.mode == "process"
    assert launch.argv == [sys.executable, "-m", "runner.worker"]
    assert "no container engine answers" in launch.reason
    assert launch.env["RUNNER_DATA_DIR"] == str(tmp_path)
    assert os.environ["PATH"] == str(tmp_path)


def test_a_command_runs_with_the_runners_interpreter(tmp_path: Path, runner_home: Path) -> None:
    """`python my_train.py` finds the interpreter the runner runs in (with TensorFlow), not the system's, whatever
    the user's PATH says: as in the image, where the job's python is the image's."""
    spec = tmp_path / "job.yaml"
    spec.write_text(
        textwrap.dedent(f"""\
        name: which
        image: trainer:test
        command: "python -c 'import sys; print(\\"interpreter:\\", sys.executable)'"
        storage: {tmp_path / "store"}
        """)
    )
    env = {**os.environ, "PATH": "/usr/bin:/bin"}  # as a shell without the venv activated
    done = subprocess.run(
        [*RUNNER, "submit", str(spec), "--local", "--process"], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    line = next(ln for ln in done.stdout.splitlines() if ln.startswith("interpreter:"))
    assert Path(line.split()[1]).parent == Path(sys.executable).parent
    assert f"commands run with {Path(sys.executable).parent} first on PATH" in done.stdout


def test_the_job_environment_is_the_same_contract_on_every_backend(tmp_path: Path) -> None:
    """Every documented RUNNER_ variable is set for a job on this machine and on a TPU VM alike."""
    from runner.backends import plan_cloud, plan_local
    from runner.spec.loader import load_spec_text

    text = "name: j\nimage: us-docker.pkg.dev/p-123456/r/t:1\ncommand: [python, x.py]\nstorage: STORAGE\n"
    text += "accelerator: {type: v5litepod-8, zone: us-central1-a, project: my-project}\n"
    local = plan_local(load_spec_text(text.replace("STORAGE", str(tmp_path))), None)
    cloud = plan_cloud(load_spec_text(text.replace("STORAGE", "gs://my-bucket/p")), None, environ={})
    # Which TPU the resolver connects to, and where this machine's data cache was copied for the VM: a TPU VM's alone.
    backend_only = {contract.TPU_NAME, contract.DATA_URL}
    assert {k for k in local.env if k.startswith("RUNNER_")} == {k for k in cloud.env if k.startswith("RUNNER_")} - (
        backend_only
    )
    assert contract.DATA_DIR in cloud.env


def test_a_marked_process_that_keeps_forking_leaves_no_child_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    """A listing then a signal misses what forks in between; the stop freezes what it finds before it signals."""
    marker = f"test-fork-{os.getpid()}"
    forker = (
        "import os, time\n"
        "while True:\n"
        "    if os.fork() == 0:\n"
        "        os.setsid(); time.sleep(600); os._exit(0)\n"
        "    time.sleep(0.002)\n"
    )
    env = {**os.environ, container.SESSION: marker}
    parent = subprocess.Popen([sys.executable, "-c", forker], env=env, start_new_session=True)
    try:
        wait_for(lambda: len(container.marked_pids(container.SESSION, marker)) >= 5, "the forker's children", 30)
        stopped = container.stop_marked(container.SESSION, marker, grace_s=5.0)
        assert len(stopped) >= 5
        assert container.marked_pids(container.SESSION, marker) == []
    finally:
        for pid in container.marked_pids(container.SESSION, marker):
            os.kill(pid, signal.SIGKILL)
        parent.kill()
        parent.wait()


def test_a_daemon_the_job_started_outside_its_process_group_is_stopped_with_the_run(
    tmp_path: Path, runner_home: Path
) -> None:
    """setsid (a new session, a new process group) is how a job's daemon escapes a process-group kill; the session
    marker every process of the run inherits still finds it, and the runner says what it stopped."""
    job = "import subprocess\nsubprocess.Popen(['setsid', 'sleep', '600'], start_new_session=True)\nprint('started')\n"
    done = subprocess.run(
        [*RUNNER, "submit", str(command_job(tmp_path, job)), "--local", "--process"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    # setsid(1) forks before it runs sleep: the runner finds the sleep, or setsid itself when it comes first
    pids = [int(p) for p in re.findall(r"(\d+): (?:setsid )?sleep 600", done.stdout)]
    assert pids, done.stdout
    assert f"stopped {len(pids)} process(es) the job left running outside its process group" in done.stdout
    assert not [pid for pid in pids if processes.process_alive(pid)], "the job's daemon outlived the run"
    # This run's session only: other tests' runs of a job named cmd may be alive at this moment.
    assert not container.marked_pids(container.SESSION, f"{only_record(runner_home).run_id}:")
