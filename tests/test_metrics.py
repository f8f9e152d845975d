"""runner.metrics: what a custom command writes to RUNNER_METRICS_FILE and RUNNER_PROGRESS_FILE, read back by
status and list; the Keras callback in a real command job."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from runner import contract
from runner.cli import app
from runner.collect.progress import standing
from runner.metrics import log_metrics, write_progress
from runner.watch.rundir import Progress
from tests.cli.test_cli import command_job, run_id_from


def test_lines_and_progress_in_the_documented_format(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(contract.METRICS_FILE, str(tmp_path / "metrics.jsonl"))
    monkeypatch.setenv(contract.PROGRESS_FILE, str(tmp_path / "progress.json"))
    np_like = type("Scalar", (), {"__float__": lambda self: 0.25})()  # numpy and tensor scalars convert
    log_metrics(epoch=1.0, loss=np_like, accuracy=0.9, bad=float("nan"), note="x", shape=[1, 2])
    log_metrics(epoch=2, loss=0.125, epoch_time_s=3.0)
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [{k: v for k, v in line.items() if k != "time"} for line in lines] == [
        {"epoch": 1, "loss": 0.25, "accuracy": 0.9, "note": "x"},
        {"epoch": 2, "loss": 0.125, "epoch_time_s": 3.0},
    ]
    write_progress(epoch=3, epochs=4, step=5, steps_per_epoch=10)
    progress = Progress.from_json(json.loads((tmp_path / "progress.json").read_text()))
    assert standing(progress, lines).progress_text() == "epoch 3 of 4, step 5 of 10"
    assert not list(tmp_path.glob(".progress*"))  # rewritten atomically


def test_nothing_is_written_outside_a_run_or_on_other_workers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(contract.METRICS_FILE, raising=False)
    assert log_metrics(loss=1.0) is None
    monkeypatch.setenv(contract.METRICS_FILE, str(tmp_path / "m.jsonl"))
    monkeypatch.setenv(contract.WORKER_ID, "1")
    assert log_metrics(loss=1.0) is None and not (tmp_path / "m.jsonl").exists()


def test_importing_it_imports_no_framework() -> None:
    code = "import sys, runner.metrics; print(any(m in sys.modules for m in ('tensorflow', 'keras', 'tf_keras')))"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "False\n"


@pytest.mark.slow
def test_a_keras_command_job_shows_its_metrics_and_only_its_artifacts(tmp_path: Path) -> None:
    script = textwrap.dedent("""\
        import numpy as np, keras
        from runner.metrics import KerasMetrics
        x = np.random.default_rng(0).random((256, 4)).astype("float32"); y = (x.sum(1) > 2).astype("int32")
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, activation="softmax")])
        model.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
        model.fit(x, y, epochs=2, batch_size=64, validation_split=0.25, verbose=1, callbacks=[KerasMetrics()])
    """)
    result = CliRunner().invoke(app, ["submit", str(command_job(tmp_path, script)), "--local"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    run_id = run_id_from(result.output)
    labels = [line.split()[0] for line in result.output[result.output.index(f"Run {run_id}") :].splitlines()[1:]]
    assert "metrics" in labels and "logs" in labels
    assert "checkpoints" not in labels and "tensorboard" not in labels  # the job wrote none
    status = CliRunner().invoke(app, ["status", run_id], catch_exceptions=False).output
    assert any(
        line.startswith("last metrics") and "epoch 2: loss" in line and "val_accuracy" in line
        for line in status.splitlines()
    ), status
    as_json = json.loads(CliRunner().invoke(app, ["status", run_id, "--json"]).output)
    assert set(as_json["artifacts"]) == {contract.METRICS, contract.LOGS_DIR}
    assert as_json["progress"]["epoch"] == 2 and as_json["progress"]["epochs"] == 2
    listing = CliRunner().invoke(app, ["list"], catch_exceptions=False).output
    last = json.loads((tmp_path / "store" / "runs" / run_id / contract.METRICS).read_text().splitlines()[-1])
    row = next(line for line in listing.splitlines() if line.startswith(run_id))
    assert f"loss {last['loss']:.4f}" in row and f"accuracy {last['accuracy']:.4f}" in row, (row, last)
    log = (tmp_path / "store" / "runs" / run_id / contract.log_key(0)).read_bytes()
    assert b"Epoch 2/2" in log and b"\x08" not in log and b"\x1b" not in log
    # It evaluates nothing: the time after its last epoch is no "final evaluation".
    report = json.loads(CliRunner().invoke(app, ["report", run_id, "--json"]).output)
    phases = [p["name"] for p in report["timeline"]["phases"]]
    assert "training" in phases and "after training" in phases and "final evaluation" not in phases
