"""The supervisor's summary of a command that wrote none, as a real process on Cloud Storage (the emulator): the
job prints what a real Keras fit printed (tests/watch/keras_logs), and summary.json reaches the bucket with the
results; the checkpoints the job wrote are listed from the bucket, newest first."""

from __future__ import annotations

import json
import sys
import time
import uuid
from pathlib import Path

from runner import contract
from runner.collect.facts import list_checkpoints
from runner.storage import open_storage
from runner.watch.keraslog import parse_keras_log
from tests.worker.test_supervisor import run_worker, worker_env

FIT = Path(__file__).parent.parent / "watch" / "keras_logs" / "tf_keras-verbose1.log"
SCRIPT = (
    "import os, pathlib, sys, time\n"
    "from runner.storage import open_storage\n"
    "ckpt = pathlib.Path(os.environ['RUNNER_CHECKPOINT_DIR']); ckpt.mkdir(parents=True, exist_ok=True)\n"
    "store = open_storage(os.environ['RUNNER_RUN_DIR'])\n"
    "for n in (1, 2):\n"
    "    (ckpt / f'weights-{n}.h5').write_bytes(b'w' * 100 * n)\n"
    "    while store.read_bytes(f'checkpoints/weights-{n}.h5') is None:\n"  # in the run directory before the next
    "        time.sleep(0.05)\n"
    "sys.stdout.write(open(sys.argv[1]).read())\n"
)


def test_the_summary_of_a_keras_command_reaches_cloud_storage(gcs: str) -> None:
    run_dir = f"gs://runner-test/{uuid.uuid4().hex}/runs/r1"
    result = run_worker(worker_env(run_dir, [sys.executable, "-c", SCRIPT, str(FIT)]))
    assert result.returncode == 0, result.stderr
    store = open_storage(run_dir)
    summary = json.loads(store.read_bytes(contract.SUMMARY) or b"{}")
    keras = parse_keras_log(FIT.read_text())
    assert summary["derived_from"] == [contract.log_key(0)]
    assert summary["last_metrics"] == keras.epochs[-1] and summary["test_accuracy"] == keras.test["accuracy"]
    found = list_checkpoints(store, [])
    assert [(c.file, c.size) for c in found] == [("weights-2.h5", 200), ("weights-1.h5", 100)]
    assert all(c.time is not None and abs(c.time - time.time()) < 600 for c in found)  # the objects' upload times


def test_only_worker_0_writes_it_and_never_over_the_jobs_own(tmp_path: Path) -> None:
    other = str(tmp_path / "w1")
    assert run_worker(worker_env(other, [sys.executable, "-c", SCRIPT, str(FIT)], RUNNER_WORKER_ID="1")).returncode == 0
    assert not (Path(other) / contract.SUMMARY).exists()
    own = str(tmp_path / "own")
    script = SCRIPT + f"open(os.path.join(os.environ['RUNNER_OUTPUT_DIR'], {contract.SUMMARY!r}), 'w').write('{{}}')\n"
    assert run_worker(worker_env(own, [sys.executable, "-c", script, str(FIT)])).returncode == 0
    assert (Path(own) / contract.SUMMARY).read_text() == "{}"
