"""The summary a command run gets when it wrote none (runner.watch.results): from metrics.jsonl, else from Keras'
lines in its log, with the test metrics of its evaluate(); and what the supervisor writes (or leaves) at its end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from runner import contract
from runner.watch.keraslog import parse_keras_log
from runner.watch.results import derive_summary, write_derived_summary
from runner.watch.rundir import Summary

LOGS = Path(__file__).parent / "keras_logs"


def test_from_keras_lines_in_the_log() -> None:
    text = (LOGS / "tf_keras-verbose2.log").read_text()
    parsed = parse_keras_log(text)
    summary = derive_summary([], text)
    assert summary is not None
    assert summary["derived_from"] == [contract.log_key(0)] and summary["epochs"] == 3
    assert summary["last_metrics"] == parsed.epochs[-1]
    assert summary["test"] == parsed.test
    assert summary["test_accuracy"] == parsed.test["accuracy"] and summary["test_loss"] == parsed.test["loss"]
    assert summary["epoch_times_s"] == [row["epoch_time_s"] for row in parsed.epochs]
    read = Summary.from_json(summary)  # as every reader takes it: derived, not the trainer's
    assert read.is_derived and not read.is_trainers and read.evaluated
    assert read.test_accuracy == summary["test_accuracy"]


def test_metrics_jsonl_rows_win_over_the_log_and_test_numbers_count() -> None:
    rows = [
        {"epoch": 1, "loss": 0.9, "time": 1.0, "epoch_time_s": 2.0},
        {"epoch": 2, "loss": 0.4, "accuracy": 0.93, "time": 3.0, "epoch_time_s": 2.5},
        {"test_accuracy": 0.95, "test_top5": 0.99},
    ]
    text = (LOGS / "keras3-verbose1.log").read_text()
    summary = derive_summary(rows, text)
    assert summary is not None
    assert summary["derived_from"] == [contract.METRICS, contract.log_key(0)]  # epochs from one, test from both
    assert summary["last_metrics"] == {"epoch": 2, "loss": 0.4, "accuracy": 0.93, "epoch_time_s": 2.5}
    assert summary["epoch_times_s"] == [2.0, 2.5]
    # the job's own test_* numbers over the log's evaluate() line
    assert summary["test"] == {**parse_keras_log(text).test, "accuracy": 0.95, "top5": 0.99}
    assert summary["test_accuracy"] == 0.95


def test_step_rows_nothing_at_all_and_an_odd_accuracy_name() -> None:
    steps = derive_summary([{"step": 100, "loss": 0.3}, {"step": 200, "loss": 0.2, "time": 9.0}], None)
    assert steps == {"derived_from": [contract.METRICS], "steps": 200, "last_metrics": {"step": 200, "loss": 0.2}}
    assert derive_summary([], "no keras here\n") is None and derive_summary([{"loss": "x"}], None) is None
    named = derive_summary([{"test_sparse_categorical_accuracy": 0.9}], None)
    assert named is not None and named["test_accuracy"] == 0.9
    two = derive_summary([{"test_top1_accuracy": 0.9, "test_top5_accuracy": 0.99}], None)
    assert two is not None and "test_accuracy" not in two  # which one would be a guess


def test_written_at_the_end_unless_the_job_wrote_its_own(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    (tmp_path / contract.log_key(0)).write_bytes((LOGS / "keras3-verbose2.log").read_bytes())
    written = write_derived_summary(tmp_path)
    assert written is not None and json.loads((tmp_path / contract.SUMMARY).read_text()) == written
    # A later attempt appended another epoch: a derived summary is derived again.
    with (tmp_path / contract.log_key(0)).open("a") as out:
        out.write("Epoch 4/4\n29/29 - 0s - 9ms/step - accuracy: 0.9000 - loss: 0.4000\n")
    assert (write_derived_summary(tmp_path) or {})["epochs"] == 4
    # The job's own summary (any shape), or one it left torn, is never replaced.
    for own in (b'{"score": 1}', b'{"score": '):
        (tmp_path / contract.SUMMARY).write_bytes(own)
        assert write_derived_summary(tmp_path) is None
        assert (tmp_path / contract.SUMMARY).read_bytes() == own


def test_the_module_imports_nothing_heavy() -> None:
    """The in-container supervisor calls it as the job ends: no pydantic, no TensorFlow, no numpy."""
    probe = (
        "import sys; import runner.watch.results; "
        "print(sorted(m for m in ('pydantic', 'tensorflow', 'keras', 'numpy', 'yaml') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
