"""The multi-worker rehearsal: `runner submit --local --workers N` runs N worker processes on this machine through the
run-directory contract, as the hosts of a pod slice (TensorFlow's MultiWorkerMirroredStrategy, jax.distributed)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from runner import contract
from runner.backends.local.backend import LocalHandle, free_ports, worker_envs
from runner.cli import app
from runner.watch.runs import RunRecord
from runner.worker import processes
from tests.backends.test_jax_on_slices import PSUM_SCRIPT
from tests.cli.test_cli import command_job
from tests.waiting import wait_for

RUNNER = [sys.executable, "-m", "runner.cli"]


def test_one_worker_adds_nothing_to_the_environment() -> None:
    assert worker_envs(1) == [{}]


def test_each_worker_gets_its_id_and_the_same_cluster() -> None:
    envs = worker_envs(3)
    assert [e[contract.WORKER_ID] for e in envs] == ["0", "1", "2"]
    configs = [json.loads(e["TF_CONFIG"]) for e in envs]
    hosts = configs[0]["cluster"]["worker"]
    assert len(set(hosts)) == 3 and all(c["cluster"]["worker"] == hosts for c in configs)
    assert [c["task"] for c in configs] == [{"type": "worker", "index": i} for i in range(3)]
    coordinator = {e["KERAS_DISTRIBUTION_JOB_ADDRESSES"] for e in envs}
    assert len(coordinator) == 1 and coordinator.pop() not in hosts
    assert [e["KERAS_DISTRIBUTION_PROCESS_ID"] for e in envs] == ["0", "1", "2"]
    assert {e["KERAS_DISTRIBUTION_NUM_PROCESSES"] for e in envs} == {"3"}


def test_free_ports_are_distinct() -> None:
    ports = free_ports(16)
    assert len(set(ports)) == 16 and all(p > 0 for p in ports)


def test_an_old_handle_without_other_workers_still_reads() -> None:
    handle = LocalHandle("process", 10, 10, None, "runner-x", "/tmp/x.out")
    assert handle.processes() == [(10, None)]
    again = LocalHandle(**json.loads(json.dumps(handle.to_dict() | {"others": [[11, 5]]})))
    assert again.processes() == [(10, None), (11, 5)]


@pytest.mark.parametrize(
    ("args", "message"),
    [(["--workers", "2"], "--workers is for --local"), (["--local", "--workers", "0"], "give 1 or more")],
)
def test_workers_is_a_usage_error_off_the_local_backend_or_below_one(
    tmp_path: Path, runner_home: Path, args: list[str], message: str
) -> None:
    job = command_job(tmp_path, "print('hi')")
    result = CliRunner().invoke(app, ["submit", str(job), *args])
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_checkpoints_by_wall_clock_plan_for_several_workers(tmp_path: Path, runner_home: Path) -> None:
    """The workers agree when a wall-clock checkpoint is due (runner.train.agreement): no longer refused."""
    job = training_job(tmp_path, "tensorflow")
    result = CliRunner().invoke(
        app, ["submit", str(job), "--local", "--workers", "2", "--set", "training.checkpoint_every=5m", "--dry-run"]
    )
    assert result.exit_code == 0, result.output


def training_job(tmp_path: Path, framework: str, epochs: int = 3, train: int = 12000) -> Path:
    path = tmp_path / "train.yaml"
    path.write_text(
        textwrap.dedent(f"""\
        name: mw
        image: trainer:test
        training:
          framework: {framework}
          model: mnist_mlp
          epochs: {epochs}
          batch_size: 256
          learning_rate: 0.003
          max_train_examples: {train}
          max_test_examples: 2000
          checkpoint_every: 1
          checkpoint_keep: 5
        storage: {tmp_path / "store"}
        """)
    )
    return path


def records(home: Path) -> list[RunRecord]:
    paths = sorted((home / "runs").glob("*.json"), key=lambda p: p.stat().st_mtime)
    return [RunRecord.model_validate_json(p.read_text()) for p in paths]


def submit(job: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*RUNNER, "submit", str(job), "--local", *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def start(job: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*RUNNER, "submit", str(job), "--local", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def finish(proc: subprocess.Popen[str], timeout: float = 180) -> subprocess.CompletedProcess[str]:
    out, err = proc.communicate(timeout=timeout)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def summary_of(run_dir: str) -> dict[str, object]:
    summary: dict[str, object] = json.loads((Path(run_dir) / contract.SUMMARY).read_text())
    return summary


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["tensorflow", "jax"])
def test_two_workers_train_to_the_same_accuracy_as_one(
    tmp_path: Path, runner_home: Path, mnist_npz: Path, framework: str
) -> None:
    # 2 epochs of 12000 examples reached 0.90 alone and in a pair, on both engines (3 epochs: 0.915).
    job = training_job(tmp_path, framework, epochs=2)
    keras = "training.keras=tf_keras" if framework == "tensorflow" else "training.keras=auto"
    # The single worker and the pair are independent runs: started together, their engine imports overlap.
    alone_proc = start(job, "--set", keras)
    pair_proc = start(job, "--workers", "2")
    one, two = finish(alone_proc), finish(pair_proc)
    assert one.returncode == 0, one.stdout + one.stderr
    assert two.returncode == 0, two.stdout + two.stderr
    first, second = sorted(records(runner_home), key=lambda r: r.num_workers)
    assert (first.num_workers, second.num_workers) == (1, 2)
    alone, pair = summary_of(first.run_dir), summary_of(second.run_dir)
    assert pair["strategy"]["replicas"] == 2  # type: ignore[index]
    assert float(alone["test_accuracy"]) > 0.85  # type: ignore[arg-type]
    assert abs(float(pair["test_accuracy"]) - float(alone["test_accuracy"])) < 0.02  # type: ignore[arg-type]
    run_dir = Path(second.run_dir)
    for worker in (0, 1):
        assert "[trainer] done: test accuracy" in (run_dir / contract.log_key(worker)).read_text()
        assert json.loads((run_dir / contract.exit_key(worker)).read_text())["state"] == "succeeded"
        assert json.loads((run_dir / contract.heartbeat_key(worker)).read_text())["worker"] == worker
    # The chief alone wrote the run directory: one row per epoch, one checkpoint per epoch.
    assert len((run_dir / contract.METRICS).read_text().splitlines()) == 2
    names = sorted(p.name for p in (run_dir / contract.CHECKPOINTS).glob("ckpt-*.keras"))
    assert names == ["ckpt-000001.keras", "ckpt-000002.keras"]
    assert "[worker 1]" in two.stdout  # every worker's log, prefixed


@pytest.mark.slow
@pytest.mark.parametrize("flags", ["+avx512_bf16,+amx_bf16", "-avx512_bf16,-amx_bf16,-bf16"])
def test_every_worker_trains_in_the_precision_the_chief_chose(
    tmp_path: Path, runner_home: Path, mnist_npz: Path, monkeypatch: pytest.MonkeyPatch, flags: str
) -> None:
    """Both ways of a CPU (with native bfloat16, where the chief calibrates, and without): one choice per run, the
    chief's, taken by every worker whatever its own timing would have said; the all-reduces then agree on dtypes.
    The flags as this machine has them are the test above."""
    monkeypatch.setenv("RUNNER_CPU_FLAGS", flags)
    monkeypatch.setenv("RUNNER_DATA_DIR", str(mnist_npz.parent))
    job = training_job(tmp_path, "tensorflow", epochs=1, train=6144)
    result = submit(job, "--workers", "2", timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    run_dir = Path(records(runner_home)[-1].run_dir)
    perf_lines = [_log(run_dir, w).split("[trainer] perf: ", 1)[1].splitlines()[0] for w in (0, 1)]
    chief, other = perf_lines
    assert "worker 0's choice for the run" in other, perf_lines
    assert chief.split(" (")[0] == other.split(" (")[0]  # the same precision policy
    if flags.startswith("+"):
        assert "calibrated" in chief or "cached" in chief, chief  # native bfloat16: the chief measured
    summary = summary_of(str(run_dir))
    assert summary["perf"]["precision"] == chief.split(" (")[0]  # type: ignore[index]


def children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def started(home: Path, worker: int, text: str) -> bool:
    found = (home / "runs").is_dir() and records(home)
    return bool(found) and text in _log(Path(records(home)[-1].run_dir), worker)


def _log(run_dir: Path, worker: int) -> str:
    path = run_dir / contract.log_key(worker)
    return path.read_text() if path.exists() else ""


@pytest.mark.slow
def test_a_trainer_killed_fails_the_run_naming_its_worker_and_stops_the_other(
    tmp_path: Path, runner_home: Path, mnist_npz: Path
) -> None:
    # 30 epochs of 12000 examples outlast the kill many times over; all 60000 only took longer to load.
    job = training_job(tmp_path, "tensorflow", epochs=30, train=12000)
    proc = subprocess.Popen(
        [*RUNNER, "submit", str(job), "--local", "--workers", "2"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    wait_for(lambda: started(runner_home, 1, "Epoch 1/30"), what="worker 1's first epoch")
    record = records(runner_home)[-1]
    (supervisor_1, _ticks), *_ = record.handle["others"]
    (trainer_1,) = children(supervisor_1)
    os.kill(trainer_1, signal.SIGKILL)
    out, _ = proc.communicate(timeout=90)
    text = out.decode()
    assert proc.returncode != 0, text
    assert "worker 1 failed first (exit code 137)" in text
    final = records(runner_home)[-1]
    assert final.state == "failed"
    assert not processes.group_alive(record.handle["pgid"]), "worker 0 outlived the run"
    run_dir = Path(final.run_dir)
    assert json.loads((run_dir / contract.exit_key(1)).read_text())["exit_code"] == 137  # 128 + SIGKILL
    assert json.loads((run_dir / contract.exit_key(0)).read_text())["state"] in ("cancelled", "failed")


@pytest.mark.slow
def test_a_worker_killed_whole_is_lost_and_ends_the_run(
    tmp_path: Path, runner_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGKILL to a worker's supervisor (a host gone): no exit record; its heartbeat stops, and the run ends."""
    # Heartbeats every 0.5 s: a worker is lost once its heartbeat stood still for 5 (ten of them).
    monkeypatch.setenv("RUNNER_TIMINGS", "job_heartbeat_s=0.5,worker_stale_s=5,machine_status_every_s=0.5")
    job = command_job(tmp_path, "import time; print('started', flush=True); time.sleep(120)")
    proc = subprocess.Popen(
        [*RUNNER, "submit", str(job), "--local", "--workers", "2"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    wait_for(lambda: started(runner_home, 1, "started"), what="worker 1's job")
    record = records(runner_home)[-1]
    (supervisor_1, _ticks), *_ = record.handle["others"]
    os.kill(supervisor_1, signal.SIGKILL)
    out, _ = proc.communicate(timeout=60)
    text = out.decode()
    assert proc.returncode != 0, text
    assert "worker 1's heartbeat stopped" in text
    assert not processes.group_alive(record.handle["pgid"]), "worker 0 outlived the run"
    assert not processes.group_alive(supervisor_1)
    assert not (Path(record.run_dir) / contract.exit_key(1)).exists()


# A user's own script on several workers: TensorFlow's MultiWorkerMirroredStrategy (tf_keras) or JAX processes, each
# through the runner's resolution, with the runner's one callbacks= line.
WORKERS_SCRIPT = {
    "tensorflow": """\
import os
import re
os.environ["TF_USE_LEGACY_KERAS"] = "1"
import tensorflow as tf
from runner.datasets import mnist
from runner.train import keras_callbacks, resolve_strategy

strategy = resolve_strategy().strategy
(x, y), _ = mnist.load_data()
x, y = x[:4096].reshape(-1, 784) / 255.0, y[:4096]
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.Input((784,)), tf.keras.layers.Dense(64, activation="relu"),
                                 tf.keras.layers.Dense(10, activation="softmax")])
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
model.fit(x, y, epochs=3, batch_size=32, callbacks=keras_callbacks(), verbose=2)
""",
    "jax": """\
import os
import re
os.environ["KERAS_BACKEND"] = "jax"
import keras
from runner.datasets import mnist
from runner.train import keras_callbacks, resolve_distribution

resolve_distribution()
(x, y), _ = mnist.load_data()
x, y = x[:4096].reshape(-1, 784) / 255.0, y[:4096]
model = keras.Sequential([keras.Input((784,)), keras.layers.Dense(64, activation="relu"),
                          keras.layers.Dense(10, activation="softmax")])
model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
model.fit(x, y, epochs=3, batch_size=32, callbacks=keras_callbacks(), verbose=2)
""",
}


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["tensorflow", "jax"])
def test_a_user_script_on_two_workers_stops_at_one_step_and_resumes_exactly(
    tmp_path: Path, runner_home: Path, mnist_npz: Path, monkeypatch: pytest.MonkeyPatch, framework: str
) -> None:
    """keras_callbacks() on several workers: Ctrl-C reaches both, they agree on one step, worker 0 saves it (the
    other saves to its scratch directory: saving is collective), and `runner resume` runs both on from there; worker
    0 alone wrote the metrics, one line per epoch, and together the attempts trained every step once."""
    from tests.stops import FAST_PROGRESS
    from tests.test_examples import interrupt_mid_epoch

    monkeypatch.setenv("RUNNER_DATA_DIR", str(mnist_npz.parent))
    monkeypatch.setenv("RUNNER_TIMINGS", FAST_PROGRESS)  # where interrupt_mid_epoch reads the job's step
    (tmp_path / "train.py").write_text(WORKERS_SCRIPT[framework])
    job = tmp_path / "job.yaml"
    job.write_text(
        f"name: mine\nimage: trainer:test\ncommand: [python, {tmp_path / 'train.py'}]\nstorage: {tmp_path}\n"
    )
    proc = start(job, "--workers", "2")
    run_dir = interrupt_mid_epoch(proc, runner_home, f"{framework} on two workers")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, out + err
    worker_logs = [_log(run_dir, w) for w in (0, 1)]
    saved = re.search(r"SIGTERM: saved (ckpt-\d{6}-s\d{6}\.keras) at epoch \d+ step \d+", worker_logs[0])
    assert saved, worker_logs[0][-3000:]
    assert "stopping with it" in worker_logs[1] or "SIGTERM: saving" in worker_logs[1], worker_logs[1][-3000:]
    resumed = subprocess.run(
        [*RUNNER, "resume", run_dir.name], capture_output=True, text=True, timeout=300, check=False
    )
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    metrics = [json.loads(line) for line in (run_dir / contract.METRICS).read_text().splitlines()]
    assert [m["epoch"] for m in metrics] == [1, 2, 3]
    assert metrics[-1]["global_step"] == 3 * 128  # 4096 / 32 steps an epoch on every worker: none lost, none twice
    for worker in (0, 1):
        assert f"[runner] resumed from {saved.group(1)}" in _log(run_dir, worker)
        assert json.loads((run_dir / contract.exit_key(worker)).read_text())["state"] == "succeeded"


# Plain JAX with JAX's own preemption sync: SIGTERM reaches JAX's preemption notifier in one process, the
# processes agree on a step (reached_preemption_sync_point), save collectively (process 0 writes the step to
# RUNNER_CHECKPOINT_DIR) and exit 143. The first attempt runs until it is stopped; a resumed one runs to TOTAL.
SYNC_SCRIPT = """\
import json, os, sys, time
from pathlib import Path
import jax, jax.numpy as jnp
from jax.experimental import multihost_utils

TOTAL = 200
jax.distributed.initialize()
me = jax.process_index()
ckpt = Path(os.environ["RUNNER_CHECKPOINT_DIR"]) / "step.json"
resumed = ckpt.exists()
step = json.loads(ckpt.read_text())["step"] if resumed else 0
print(f"process {me}: starting at step {step}", flush=True)
while step < TOTAL or not resumed:
    multihost_utils.process_allgather(jnp.array(step))  # a collective every step
    step += 1
    if multihost_utils.reached_preemption_sync_point(step):
        multihost_utils.sync_global_devices("save")
        if me == 0:
            ckpt.parent.mkdir(parents=True, exist_ok=True)
            ckpt.write_text(json.dumps({"step": step}))
        print(f"process {me}: stopped at step {step}, saved", flush=True)
        sys.exit(143)
    if not resumed:
        time.sleep(0.02)
print(f"process {me}: done at step {step}", flush=True)
"""


def script_job(tmp_path: Path, script: str) -> Path:
    (tmp_path / "job.py").write_text(script)
    job = tmp_path / "job.yaml"
    job.write_text(
        f"name: plainjax\nimage: trainer:test\ncommand: [python, {tmp_path / 'job.py'}]\nstorage: {tmp_path}\n"
    )
    return job


@pytest.mark.slow
def test_a_bare_jax_distributed_initialize_connects_the_workers(tmp_path: Path, runner_home: Path) -> None:
    """No arguments, no KERAS_DISTRIBUTION_* read by the job: JAX finds the runner's cluster, fresh for the run."""
    result = submit(script_job(tmp_path, PSUM_SCRIPT), "--workers", "2", timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    run_dir = Path(records(runner_home)[-1].run_dir)
    for worker in (0, 1):
        assert f"process {worker} of 2: psum 3.0" in _log(run_dir, worker)


def _events(run_dir: Path, source: str) -> list[str]:
    path = run_dir / contract.events_key(source)
    return [json.loads(line)["event"] for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.slow
@pytest.mark.parametrize("stop", ["runner down", "a signal to worker 0"])
def test_a_stop_is_one_event_for_every_worker_and_the_run_resumes_where_they_agreed(
    tmp_path: Path, runner_home: Path, stop: str
) -> None:
    """`runner down` reaches both workers at once (a preemption reaches every host at once); a signal to worker 0
    alone reaches worker 1 through JAX's preemption sync, whose job exits 143 before its own supervisor hears of a
    stop. Either way the workers stop at one step, the run is cancelled with no worker failed, and `runner resume`
    goes on from the step they saved."""
    proc = start(script_job(tmp_path, SYNC_SCRIPT), "--workers", "2")
    wait_for(lambda: all(started(runner_home, w, "starting at step 0") for w in (0, 1)), "both workers to start")
    record = records(runner_home)[-1]
    if stop == "runner down":
        down = subprocess.run([*RUNNER, "down", record.run_id], capture_output=True, text=True, timeout=120)
        assert down.returncode == 0, down.stdout + down.stderr
    else:
        os.kill(record.handle["pid"], signal.SIGTERM)  # worker 0's supervisor
    out = finish(proc)
    text = out.stdout + out.stderr
    assert "failed" not in text.lower(), text[-3000:]
    final = records(runner_home)[-1]
    assert final.state == "cancelled", text[-3000:]
    run_dir = Path(final.run_dir)
    saved = [re.search(r"stopped at step (\d+), saved", _log(run_dir, w)) for w in (0, 1)]
    assert all(saved) and saved[0].group(1) == saved[1].group(1), [_log(run_dir, w)[-2000:] for w in (0, 1)]  # type: ignore[union-attr]
    exits = [json.loads((run_dir / contract.exit_key(w)).read_text()) for w in (0, 1)]
    assert [e["state"] for e in exits] == ["cancelled", "cancelled"]
    if stop == "runner down":  # both supervisors were told, at the same moment
        assert not any(e["peer_stop"] for e in exits)
        assert all("stopping" in _events(run_dir, f"worker-{w}") for w in (0, 1))
    else:  # worker 1's supervisor never was: its job's 143 is the stop its peer agreed on
        assert (exits[1]["peer_stop"], exits[1]["exit_code"]) == (True, 143)
        assert "stopping" not in _events(run_dir, "worker-1")
    step = saved[0].group(1)  # type: ignore[union-attr]
    resumed = subprocess.run([*RUNNER, "resume", final.run_id], capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    for worker in (0, 1):
        log = _log(run_dir, worker)
        assert f"process {worker}: starting at step {step}" in log and f"process {worker}: done at step" in log
