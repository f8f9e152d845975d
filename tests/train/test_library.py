"""keras_callbacks() in a user's own fit, in a process of its own (Keras is chosen at its first import): what it
does at every step is only what needs a step (the position, the progress budget, the stop and mid-epoch save
checks), so a small model's fit pays little for it (`make bench-callbacks` measures how little)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from runner import contract
from tests.environ import child_env

pytestmark = pytest.mark.slow

FIT = """
import json, sys
import numpy as np
import keras
from runner.datasets import load_npz
from runner.train import keras_callbacks
from runner.train import callbacks as cb

data = load_npz(sys.argv[1])
x, y = data.x_train[:512].reshape(-1, 784) / 255.0, data.y_train[:512]
model = keras.Sequential([keras.Input((784,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(10)])
model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
(run,) = keras_callbacks()
model.fit(x, y, epochs=2, batch_size=64, validation_split=0.25, callbacks=[run], verbose=0)
board = next(c for c in run.inner if isinstance(c, keras.callbacks.TensorBoard))
base = keras.callbacks.Callback
print("HOOKS", json.dumps({
    "inner": [type(c).__name__ for c in run.inner],
    "batch_end": [type(c).__name__ for c in run.batch_end],
    "test_batch_end": [type(c).__name__ for c in run.test_batch_end],
    "board_batch_hooks_are_keras_defaults": all(
        getattr(type(board), hook) is getattr(base, hook)
        for hook in ("on_train_batch_begin", "on_train_batch_end", "on_test_batch_begin", "on_test_batch_end")
    ),
    "implementing_skips_defaults": (
        cb.implementing([base(), board, run.inner[0]], "on_train_batch_end") == [run.inner[0]]
    ),
}))
"""


def test_a_step_calls_only_the_callbacks_that_need_one(tmp_path: Path, mnist_npz: Path) -> None:
    run_dir = tmp_path / "run"
    env = child_env("TF_USE_LEGACY_KERAS", "KERAS_")
    env.update({contract.RUN_ID: "lib", contract.RUN_DIR: str(run_dir), contract.OUTPUT_DIR: str(run_dir)})
    env.update(contract.JobContext.from_env(env).env())
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(FIT), str(mnist_npz)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    hooks = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("HOOKS "))[6:])
    assert hooks["inner"] == ["Cursor", "EpochMetrics", "Progress", "EpochBoard", "Checkpointer", "FirstStep"]
    # FirstStep records the first step that trained (the start-up milestone), then costs a flag check a step.
    assert hooks["batch_end"] == ["Cursor", "Progress", "Checkpointer", "FirstStep"]
    assert hooks["test_batch_end"] == ["Progress"]
    assert hooks["board_batch_hooks_are_keras_defaults"] and hooks["implementing_skips_defaults"]
    # What the callbacks are for is all there: a metrics line per epoch (with Keras' validation), the progress,
    # the epoch scalars for TensorBoard, the checkpoints.
    rows = [json.loads(line) for line in (run_dir / contract.METRICS).read_text().splitlines()]
    assert [r["epoch"] for r in rows] == [1, 2] and all("val_accuracy" in r and "time" in r for r in rows)
    progress = json.loads((run_dir / contract.PROGRESS).read_text())
    assert (progress["epoch"], progress["epochs"], progress["phase"]) == (2, 2, "done")
    assert isinstance(progress["global_step"], int) and progress["global_step"] == 12
    boards = {p.parent.name for p in (run_dir / contract.TENSORBOARD).rglob("events.out.tfevents.*")}
    assert boards == {"train", "validation"}
    assert sorted(p.name for p in (run_dir / contract.CHECKPOINTS).glob("*.keras")) == [
        "ckpt-000001.keras",
        "ckpt-000002.keras",
    ]


TWO_FITS = """
import os, signal, sys
import keras
from runner.datasets import load_npz
from runner.train import keras_callbacks

data = load_npz(sys.argv[1])
x, y = data.x_train[:512].reshape(-1, 784) / 255.0, data.y_train[:512]


class Say(keras.callbacks.Callback):
    def __init__(self, fit):
        super().__init__()
        self.fit = fit

    def on_epoch_end(self, epoch, logs=None):
        print(f"TRAINED fit {self.fit} epoch {epoch + 1}", flush=True)
        if self.fit == 2 and epoch == 0 and sys.argv[2] == "stop":
            os.kill(os.getpid(), signal.SIGTERM)  # what a preemption sends, in the second fit


base = keras.Sequential([keras.Input((784,)), keras.layers.Dense(32, activation="relu")])
model = keras.Sequential([base, keras.layers.Dense(10)])
loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
base.trainable = False  # the head first
model.compile("adam", loss)
model.fit(x, y, epochs=2, batch_size=64, callbacks=[*keras_callbacks(), Say(1)], verbose=0)
base.trainable = True  # then fine-tuning, a fit of its own
model.compile(keras.optimizers.Adam(1e-4), loss)
model.fit(x, y, epochs=3, batch_size=64, callbacks=[*keras_callbacks(), Say(2)], verbose=0)
print("DONE", flush=True)
"""


def test_each_fit_in_a_process_is_its_own_resume_point(tmp_path: Path, mnist_npz: Path) -> None:
    """A head, then fine-tuning: the second fit trains its own 3 epochs (it never goes on from the first fit's
    checkpoint), and stopped in its first epoch it resumes its own series while the first fit, done, trains nothing
    again. Two processes (the stopped attempt and the resumed one) are what a resume is: about 20 s."""
    run_dir = tmp_path / "run"
    env = child_env("TF_USE_LEGACY_KERAS", "KERAS_")
    env.update({contract.RUN_ID: "fits", contract.RUN_DIR: str(run_dir), contract.OUTPUT_DIR: str(run_dir)})
    env.update(contract.JobContext.from_env(env).env())

    def attempt(how: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", textwrap.dedent(TWO_FITS), str(mnist_npz), how],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )

    def trained(out: str) -> list[str]:
        return [line.removeprefix("TRAINED ") for line in out.splitlines() if line.startswith("TRAINED ")]

    first = attempt("stop")
    assert first.returncode != 0 and "DONE" not in first.stdout, first.stdout + first.stderr[-3000:]
    assert trained(first.stdout) == ["fit 1 epoch 1", "fit 1 epoch 2", "fit 2 epoch 1"], first.stdout
    checkpoints = run_dir / contract.CHECKPOINTS
    head = sorted(p.name for p in checkpoints.glob("ckpt-*.keras"))
    assert head == ["ckpt-000001.keras", "ckpt-000002.keras"]
    second = attempt("run")
    said = second.stdout + second.stderr
    assert second.returncode == 0 and "DONE" in second.stdout, said[-3000:]
    assert trained(second.stdout) == ["fit 2 epoch 2", "fit 2 epoch 3"], said[-3000:]
    assert "[runner] resumed from ckpt-000002.keras" in said  # the head's own, done
    assert "[runner] resumed from fit-2/ckpt-000001" in said  # fine-tuning's own, not the head's
    assert sorted(p.name for p in checkpoints.glob("ckpt-*.keras")) == head  # the head's series untouched
    assert sorted(p.name for p in (checkpoints / "fit-2").glob("ckpt-*.keras")) == [
        "ckpt-000002.keras",
        "ckpt-000003.keras",
    ]
