"""One run, one owner: two `runner resume RUN` at once never make two machines, never run two trainers in one run
directory, and never lose a checkpoint; every machine a run asked for stays in its record until it is confirmed
gone, so that `runner down` deletes each of them.

The races are made by construction: on the TPU VM backend the storage emulator holds both resumers' writes of the
run's lease until both are in flight (each has read the run resumable and the lease free); locally the first
resumer's job waits at a gate the test opens only once the second resumer has been refused.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from runner import contract
from runner.cli import app
from runner.storage import open_storage
from runner.watch import runs
from tests.cloudjobs import job
from tests.waiting import wait_for
from tpu_emulator import TpuEmulator
from tpu_emulator.gcs import StorageServer

RUNNER = [sys.executable, "-m", "runner.cli"]


def _waiting_on(path: Path) -> int:
    """How many processes wait for a lock on `path`, as the kernel lists them (/proc/locks, blocked: '->')."""
    inode = path.stat().st_ino
    lines = Path("/proc/locks").read_text().splitlines()
    return sum(1 for line in lines if "->" in line and line.split()[-3].rsplit(":", 1)[-1] == str(inode))


def _resume(run_id: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*RUNNER, "resume", run_id],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**(env or os.environ), "PYTHONUNBUFFERED": "1"},
    )


def test_two_resumes_at_once_on_a_tpu_vm_make_one_node_and_the_other_is_told_who_holds_the_run(
    cloud: TpuEmulator, storage_emulator: StorageServer, bucket_url: str, tmp_path: Path
) -> None:
    spec = job(tmp_path, bucket_url, 'command: [python, -c, "import time; time.sleep(300)"]\n')
    started = CliRunner().invoke(app, ["submit", str(spec), "--detach"], catch_exceptions=False)
    assert started.exit_code == 0, started.output
    run_id = runs.list_records()[0].run_id
    assert CliRunner().invoke(app, ["down", run_id], catch_exceptions=False).exit_code == 0
    run_dir = open_storage(runs.load(run_id).run_dir)
    # The resumed attempt runs a short command (the spec it recorded, as a user's --set would change it).
    run_dir.write_bytes(
        contract.SPEC, (run_dir.read_bytes(contract.SPEC) or b"").replace(b"time.sleep(300)", b"print('resumed')")
    )
    hold = storage_emulator.hold_writes(rf"runs/{run_id}/{re.escape(contract.OWNER)}$", parties=2)
    creates_before = len([r for r in cloud.requests if r.method == "POST" and r.path.endswith("/nodes")])
    first, second = _resume(run_id), _resume(run_id)
    outs = [p.communicate(timeout=300)[0] for p in (first, second)]
    codes = sorted(p.returncode for p in (first, second))
    assert hold.arrived == 2  # both had read the run resumable and its lease free before either took it
    assert codes == [0, 2], outs
    refused = next(out for out, p in zip(outs, (first, second), strict=True) if p.returncode == 2)
    winner = next(p for p in (first, second) if p.returncode == 0)
    assert re.search(rf"`runner resume` on \S+ \(pid {winner.pid}\)", refused), refused
    assert "at the same moment" in refused and "resuming" not in refused  # refused before it said anything
    creates = [r for r in cloud.requests if r.method == "POST" and r.path.endswith("/nodes")]
    assert len(creates) - creates_before == 1  # one node for the one resumed attempt
    record = runs.load(run_id)
    assert record.state == "succeeded" and len(record.attempts) == 1 and record.machines == []
    wait_for(lambda: not cloud.nodes(), "every node gone", timeout=60)
    owner = json.loads(run_dir.read_bytes(contract.OWNER) or b"{}")
    assert owner["released"] and owner["pid"] == winner.pid


GATED_JOB = """\
import os, sys, time
import numpy as np
import keras
from runner.datasets import mnist
from runner.train import keras_callbacks

gate = sys.argv[1]
if not os.path.exists(gate + ".first"):
    open(gate + ".first", "w").close()
    sys.exit(3)  # the first attempt fails at once: the run is resumable


class Gate(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        if epoch == 0:
            print("epoch 1 saved; waiting at the gate", flush=True)
            while not os.path.exists(gate):
                time.sleep(0.05)


(x, y), _ = mnist.load_data()
x, y = x[:2048].reshape(-1, 784) / 255.0, y[:2048]
model = keras.Sequential([keras.Input((784,)), keras.layers.Dense(32, activation="relu"),
                          keras.layers.Dense(10, activation="softmax")])
model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
model.fit(x, y, epochs=3, batch_size=64, callbacks=[*keras_callbacks(), Gate()], verbose=2)
"""


@pytest.mark.slow
def test_two_resumes_at_once_locally_run_one_trainer_and_lose_no_checkpoint(
    tmp_path: Path, runner_home: Path, mnist_npz: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RUNNER_DATA_DIR", str(mnist_npz.parent))
    monkeypatch.setenv("KERAS_BACKEND", "tensorflow")
    script, gate = tmp_path / "train.py", tmp_path / "gate"
    script.write_text(GATED_JOB)
    spec = tmp_path / "job.yaml"
    spec.write_text(
        textwrap.dedent(f"""\
        name: mine
        image: trainer:test
        command: [{json.dumps(sys.executable)}, {json.dumps(str(script))}, {json.dumps(str(gate))}]
        storage: {tmp_path}
        """)
    )
    first_try = subprocess.run([*RUNNER, "submit", str(spec), "--local"], capture_output=True, text=True, timeout=300)
    assert first_try.returncode == 6, first_try.stdout + first_try.stderr
    run_id = runs.list_records()[0].run_id
    run_dir = Path(runs.load(run_id).run_dir)
    # Both resumers read the run failed, and block where they read its lease: the test holds the local disk's lock
    # of the lease (the one its conditional writes take) until the kernel shows both waiting on it.
    lock = run_dir / f".{contract.OWNER}.lock"
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    procs = [_resume(run_id), _resume(run_id)]
    wait_for(lambda: _waiting_on(lock) == 2, "both resumers to wait for the run's lease", timeout=180)
    os.close(fd)
    wait_for(lambda: any(p.poll() is not None for p in procs), "one resumer to be refused", timeout=180)
    second = next(p for p in procs if p.poll() is not None)
    holder = next(p for p in procs if p is not second)
    said = second.communicate()[0]
    assert second.returncode == 2, said
    assert re.search(rf"run {run_id} (is held by|was taken by) `runner resume` on \S+ \(pid {holder.pid}\)", said), said
    assert "resuming" not in said
    assert holder.stdout is not None
    for line in holder.stdout:  # the one resumed attempt trains, past its first checkpoint: held at the gate
        if "waiting at the gate" in line:
            break
    else:
        pytest.fail(f"the resumed attempt ended early (exit {holder.wait()})")
    gate.touch()
    rest = holder.stdout.read()
    assert holder.wait(300) == 0, rest[-3000:]
    record = runs.load(run_id)
    assert record.state == "succeeded" and len(record.attempts) == 1
    assert json.loads((run_dir / contract.exit_key(0)).read_text())["state"] == "succeeded"  # no stop's `cancelled`
    checkpoints = sorted(p.name for p in (run_dir / contract.CHECKPOINTS).glob("ckpt-*.keras"))
    assert checkpoints[-1] == contract.checkpoint_name(3), checkpoints  # the last epoch's model is kept
    metrics = [json.loads(line) for line in (run_dir / contract.METRICS).read_text().splitlines()]
    assert [m["epoch"] for m in metrics] == [1, 2, 3]  # one trainer: each epoch once
    resumed = [
        e
        for e in (json.loads(line) for line in (run_dir / "events" / "runner.jsonl").read_text().splitlines())
        if e["event"] == "resumed"
    ]
    assert len(resumed) == 1


def test_a_409_on_this_runs_own_node_is_never_answered_by_a_second_node(
    cloud: TpuEmulator, bucket_url: str, tmp_path: Path
) -> None:
    """The run's node name is held by a node of this same run that another try made (another nonce): the create
    stops there, saying so, instead of making RUN-xxxx beside it; the node is left as it is."""
    from runner.backends import plan_cloud
    from runner.backends.tpu_vm.backend import TpuVmBackend
    from runner.errors import AlreadyExists
    from runner.spec.loader import load_spec

    plan = plan_cloud(load_spec(job(tmp_path, bucket_url, "command: [python, -c, 'print(1)']\n")), None)
    other_try = {"managed-by": "tpu-runner", "tpu-runner-run": plan.run_id, "tpu-runner-nonce": "another-try"}
    cloud.create_node_direct("test-project", "us-central1-b", plan.run_id, labels=other_try)
    asked: list[object] = []
    with pytest.raises(AlreadyExists) as taken:
        TpuVmBackend().provision(plan, asked.append)
    assert "it is this run's own" in taken.value.message and f"runner down {plan.run_id}" in (taken.value.hint or "")
    assert [n.node_id for n in cloud.nodes()] == [plan.run_id]  # no second node, and the first one untouched
    assert [n.state for n in cloud.nodes()] == ["READY"]


def test_down_deletes_every_machine_the_run_asked_for_and_list_shows_what_still_bills(
    cloud: TpuEmulator, bucket_url: str, tmp_path: Path
) -> None:
    """A run whose record holds two nodes (one from a zone it moved away from, its deletion not confirmed): `runner
    down` deletes both; one whose deletion is refused stays in the record, shown `+` with its name."""
    spec = job(tmp_path, bucket_url, 'command: [python, -c, "import time; time.sleep(300)"]\n')
    assert CliRunner().invoke(app, ["submit", str(spec), "--detach"], catch_exceptions=False).exit_code == 0
    record = runs.list_records()[0]
    earlier = {**record.handle, "zone": "us-central1-c", "node_id": f"{record.run_id}-0a0a"}
    nonce = record.handle["nonce"]  # the same submit's: made by this run
    labels = {"managed-by": "tpu-runner", "tpu-runner-run": record.run_id, "tpu-runner-nonce": nonce}
    cloud.create_node_direct("test-project", "us-central1-c", earlier["node_id"], labels=labels)
    # And a name this run found taken (a 409): recorded before the create, but another run's node.
    theirs = {**record.handle, "zone": "us-central1-c", "node_id": "someone-elses"}
    other = {"managed-by": "tpu-runner", "tpu-runner-run": "another-run", "tpu-runner-nonce": "x"}
    cloud.create_node_direct("test-project", "us-central1-c", "someone-elses", labels=other)
    runs.update(record, machines=[theirs, earlier, record.handle])
    cloud.delete_fails(node=earlier["node_id"], status="PERMISSION_DENIED")
    refused = CliRunner().invoke(app, ["down", record.run_id], catch_exceptions=False)
    assert refused.exit_code == 5, refused.output
    left = sorted(n.node_id for n in cloud.nodes())
    assert left == sorted([earlier["node_id"], "someone-elses"])  # the current node went all the same
    listed = json.loads(CliRunner().invoke(app, ["list", "--json"], catch_exceptions=False).output)["runs"][0]
    assert listed["cost_cell"].endswith("+") and earlier["node_id"] in listed["still_billing"]
    table = CliRunner().invoke(app, ["list"], catch_exceptions=False).output
    assert f"+ {record.run_id}: TPU node {earlier['node_id']} in us-central1-c may still bill" in table, table
    assert runs.load(record.run_id).machines == [earlier]
    cloud.clear_faults("delete_fails")
    again = CliRunner().invoke(app, ["down", record.run_id], catch_exceptions=False)
    assert again.exit_code == 0, again.output
    assert [n.node_id for n in cloud.nodes()] == ["someone-elses"]  # never this run's to delete
    final = runs.load(record.run_id)
    assert final.machines == [] and final.still_billing is None
