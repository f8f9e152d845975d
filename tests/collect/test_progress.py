"""`runner status` while a run trains: epoch N of M, steps, the ETA and the last metrics, from progress.json and
metrics.jsonl (pure logic, then the command on a run directory)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from typer.testing import CliRunner

from runner import contract
from runner.cli import app
from runner.collect.figures import metrics_text
from runner.collect.progress import standing
from runner.plan.budget import duration
from runner.watch.rundir import Progress

EPOCHS = [
    {"epoch": 1, "loss": 0.41, "accuracy": 0.88, "val_loss": 0.12, "val_accuracy": 0.963, "epoch_time_s": 40.0},
    {"epoch": 2, "loss": 0.09, "accuracy": 0.972, "val_loss": 0.07, "val_accuracy": 0.978, "epoch_time_s": 30.0},
]


def test_epoch_steps_eta_and_last_metrics() -> None:
    progress = Progress(time=100.0, epoch=3, epochs=5, step=15, steps_per_epoch=60, global_step=135)
    where = standing(progress, EPOCHS, now=104.0)
    # 2.75 epochs left at 30 s (the first epoch compiles and is left out), less the 4 s since progress.json
    assert where.eta_s() == 2.75 * 30 - 4
    assert where.rows() == [
        ("progress", "epoch 3 of 5, step 15 of 60, 135 of 300 steps in all"),
        ("eta", "about 1m18s left  (30.0s per epoch)"),  # runner.plan.budget.duration, as the plan says it
        ("last metrics", "epoch 2: loss 0.0900, accuracy 0.9720, val_loss 0.0700, val_accuracy 0.9780"),
    ]


def test_a_finished_run_has_nothing_left_even_when_its_epochs_were_too_short_to_time() -> None:
    """Keras prints "0s" for an epoch under half a second: such epochs give no speed, yet the last step of the last
    epoch leaves nothing to wait for (a fast machine made `runner status` say the ETA was unknown)."""
    quick = [{"epoch": n, "loss": 0.5, "epoch_time_s": 0.0} for n in (1, 2, 3)]
    done = standing(Progress(time=100.0, epoch=3, epochs=3, step=29, steps_per_epoch=29), quick, now=104.0)
    assert done.eta_s() == 0.0 and ("eta", "about 0s left") in done.rows()
    going = standing(Progress(time=100.0, epoch=3, epochs=3, step=10, steps_per_epoch=29), quick, now=104.0)
    assert going.eta_s() is None and not any(label == "eta" for label, _ in going.rows())


def test_no_eta_before_an_epoch_ended_and_whatever_user_code_wrote() -> None:
    assert standing(Progress(step=7), []).rows() == [("progress", "step 7")]
    assert standing(Progress(epoch=1, epochs=3, step=5, steps_per_epoch=0), []).eta_s() is None
    assert standing(None, [{"step": 40, "loss": 1.5, "lr": 0.001, "note": "x"}]).rows() == [
        ("last metrics", "step 40: loss 1.5000, lr 0.0010")
    ]
    assert metrics_text({"epoch": "\x1b[2J1", "loss": True, "acc": float("nan")}) == "epoch ?[2J1"
    assert [duration(s) for s in (0.4, 59, 61, 3600 * 2 + 125)] == ["0.4s", "59s", "1m01s", "2h02m"]


def test_status_of_a_training_run(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "train-1"
    (run_dir / "exit").mkdir(parents=True)
    info = {"run_id": "train-1", "job": "mnist", "backend": "local", "run_dir": str(run_dir), "created_at": time.time()}
    (run_dir / contract.RUN_INFO).write_text(json.dumps({**info, "state": "running"}))
    (run_dir / contract.METRICS).write_text("".join(json.dumps(line) + "\n" for line in EPOCHS))
    progress = Progress(time=time.time(), epoch=3, epochs=3, step=30, steps_per_epoch=60, global_step=150)
    (run_dir / contract.PROGRESS).write_text(json.dumps(progress.to_json()))
    (run_dir / contract.HEARTBEAT).write_text(json.dumps({"time": time.time(), "phase": "running"}))
    result = CliRunner().invoke(app, ["status", str(run_dir)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    expected = "progress epoch 3 of 3, step 30 of 60, 150 of 180 steps in all"
    assert any(" ".join(line.split()) == expected for line in lines), result.output
    assert any(line.startswith("eta") and "about 15s left" in line for line in lines), result.output
    as_json = json.loads(CliRunner().invoke(app, ["status", str(run_dir), "--json"]).output)
    assert as_json["progress"]["epoch"] == 3 and 10 < as_json["eta_s"] <= 15
    assert as_json["last_metrics"]["val_accuracy"] == 0.978
