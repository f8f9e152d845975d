"""Goodput of real runs: a user's Keras script (keras_callbacks()) on an emulated Spot TPU VM, preempted once past its
first checkpoint, then resumed on the recreated VM. Its goodput rows add up to the billed time, and its preemption's
row says the step the job had reached and the step it resumed from, as its log says them. (A local run's goodput, its
chart and the page: tests/collect/test_report.py.)"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from runner.cli import app
from runner.storage import open_storage
from tests.cloudjobs import job, preempt_when, run_id_of, submit

STEPS = 128  # an epoch: 4096 examples at batch 32
# The first attempt (an empty checkpoint directory) stops on its own 120 steps into epoch 2, after its epoch-1
# checkpoint, and waits there, deaf to SIGTERM (as a machine that goes without notice): the preemption then finds it
# with exactly one checkpoint, the only one it will ever have, and progress.json well past it, however fast or loaded
# the machine is. Every step takes at least 20 ms, so the trainer's progress.json (written every 2 s) has passed
# step 50 of epoch 2 before it stops; and the steps redone take a time that shows in milliseconds. The attempt on the
# recreated VM has the checkpoint, and trains to the end.
SCRIPT = """\
import os, signal, time
from pathlib import Path
import keras
from runner.datasets import mnist
from runner.train import keras_callbacks

first = not any(Path(os.environ["RUNNER_CHECKPOINT_DIR"]).glob("ckpt-*"))
(x_train, y_train), _ = mnist.load_data()
x_train, y_train = x_train[:4096].reshape(-1, 784) / 255.0, y_train[:4096]
model = keras.Sequential([keras.Input((784,)), keras.layers.Dense(64, activation="relu"),
                          keras.layers.Dense(10, activation="softmax")])
model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])


class PaceAndWait(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        self.began = time.monotonic()

    def on_train_batch_end(self, batch, logs=None):
        time.sleep(max(0.0, self.began + 0.02 - time.monotonic()))
        while first and self.epoch == 1 and batch == 119:
            time.sleep(1)  # until the preemption: this never returns


callbacks = [*keras_callbacks(), PaceAndWait()]
if first:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # after keras_callbacks() took it: no save at the stop
model.fit(x_train, y_train, epochs=3, batch_size=32, callbacks=callbacks, verbose=2)
"""


@pytest.mark.slow
def test_a_preempted_run_s_goodput_adds_up_and_its_redone_steps_are_the_resume_s(
    cloud, tmp_path: Path, bucket_url: str
) -> None:  # type: ignore[no-untyped-def]
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    spec = job(tmp_path, bucket_url, f"command: [python, {script}]\n", name="goodput", accelerator=", spot: true")
    seen: list[int] = []  # the step the bucket's progress.json showed when the node was preempted

    def past_the_checkpoint(_node, store) -> bool:  # type: ignore[no-untyped-def]
        manifest, progress = store.read_bytes("checkpoints/latest.json"), store.read_bytes("progress.json")
        if not manifest or not progress:
            return False
        saved = [c["global_step"] for c in json.loads(manifest)["checkpoints"]]
        step = int(json.loads(progress).get("global_step") or 0)
        if saved == [STEPS] and step > STEPS + 50:
            seen.append(step)
            return True
        return False

    thread, preempted = preempt_when(cloud, past_the_checkpoint, timeout_s=400, poll_s=0.3)
    result = submit(str(spec))
    thread.join(5)
    assert preempted, f"the node was never preempted:\n{result.output[-3000:]}"
    assert result.exit_code == 0, result.output
    run_id = run_id_of(result.output)
    store = open_storage(f"{bucket_url}/runs/{run_id}")
    log = (store.read_bytes("logs/worker-0.log") or b"").decode()
    said = re.search(r"\[runner\] resumed from step (\d+) \(Keras, checkpoints/\S+\); (\d+) steps? redone", log)
    assert said, log
    resumed, redone = int(said.group(1)), int(said.group(2))
    assert resumed == STEPS and redone >= seen[0] - STEPS > 50  # the bucket's progress is a floor of the reach

    status = json.loads(CliRunner().invoke(app, ["status", run_id, "--json"], catch_exceptions=False).output)
    goodput, cost = status["goodput"], status["cost"]
    assert goodput["billed_s"] == pytest.approx(cost["ready_seconds"], abs=0.002)
    causes = {c["cause"]: c for c in goodput["causes"]}
    assert sum(c["billed_s"] or 0 for c in causes.values()) == pytest.approx(goodput["billed_s"], abs=0.01)
    # every cause the emulated VMs and the job's callbacks time, measured; data, which only the built-in trainer
    # times, not measured (None, never 0)
    for key in ("productive", "provisioning", "image_pull", "startup", "checkpoint_save", "checkpoint_restore"):
        assert causes[key]["billed_s"] > 0, (key, causes[key])
    assert causes["data"]["billed_s"] is None and causes["data"]["note"]
    assert causes["redone"]["steps"] == redone and causes["redone"]["billed_s"] > 0
    (row,) = goodput["disruptions"]
    assert (row["kind"], row["attempt"]) == ("preemption", 1)
    assert (row["resumed_step"], row["redone_steps"], row["reached_step"]) == (resumed, redone, resumed + redone)
    assert row["redone_s"] == pytest.approx(causes["redone"]["billed_s"], abs=0.002)
    assert row["redone_s"] >= 0.015 * (redone - 1)  # each step took 20 ms or more (the first one's is start-up's)
    assert row["restart_s"] > 0 and row["back_after_s"] > 0
    per_second = cost["price"]["usd_per_hour"] / 3600
    assert row["usd"] == pytest.approx(row["lost_s"] * per_second, rel=1e-3)
    assert goodput["usd"] == pytest.approx(causes["productive"]["billed_s"] * per_second, rel=1e-3)
    # the end of submit said it, and summary.json (the supervisor's, derived) has it
    assert re.search(r"^disruption 1 +preemption of machine 1 at .*\d+ steps? redone", result.output, re.M)
    assert json.loads(store.read_bytes("summary.json") or b"{}")["goodput"]["disruptions"][0]["redone_steps"] == redone
    assert not cloud.nodes()
