"""What status, list, submit's end and the report share of a command run (runner.collect.facts): metrics from
metrics.jsonl or else Keras' lines in the log, the summary derived when the job wrote none, every file under
checkpoints/, the phases that happened, and numbers rounded for people but kept whole in JSON. On run
directories written by hand, as a job leaves them."""

from __future__ import annotations

import json
import os
from pathlib import Path

from runner import contract
from runner.collect.facts import checkpoints_text, gather, list_checkpoints, size_text
from runner.collect.figures import metrics_text, rounded
from runner.collect.summary import summary_rows
from runner.storage import open_storage
from runner.watch.events import Event
from runner.watch.keraslog import parse_keras_log
from runner.watch.rundir import ExitRecord, Summary, read_snapshot
from runner.watch.runs import RunRecord
from runner.watch.state import RunState

LOGS = Path(__file__).parent.parent / "watch" / "keras_logs"
T0 = 1_800_000_000.0


def test_rounded_for_people() -> None:
    assert [rounded(v) for v in (0.97123456, 2.302585, 1777.49, 3, 0.0, 1.234e-05, -0.5)] == [
        "0.9712",
        "2.3026",
        "1777",
        "3",
        "0.0000",
        "1.23e-05",
        "-0.5000",
    ]
    assert rounded(True) == "True" and rounded("x\x1b[2J") == "x?[2J" and rounded(float("nan")) == "nan"
    line = {"epoch": 3, "loss": 0.123456789, "examples": 60000.0}
    assert metrics_text(line) == "epoch 3: loss 0.1235, examples 60000"
    assert size_text(812) == "812 B" and size_text(1_895_256) == "1.9 MB" and size_text(3.4e9) == "3.40 GB"


def run_dir_of_a_command(tmp_path: Path, *, log: str = "keras3-verbose1", ended: bool = True) -> Path:
    """What a Keras script that uses no runner callback leaves: its log, a ModelCheckpoint's files."""
    run_dir = tmp_path / "run"
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / contract.log_key(0)).write_bytes((LOGS / f"{log}.log").read_bytes())
    (run_dir / "checkpoints" / "backup").mkdir(parents=True)
    for n, name in enumerate(["model-01.keras", "model-02.keras", "model-03.keras", "backup/training_metadata.json"]):
        path = run_dir / "checkpoints" / name
        path.write_bytes(b"x" * (1000 * (n + 1)))
        os.utime(path, (T0 + n, T0 + n))
    if ended:
        exit_record = ExitRecord(0, RunState.SUCCEEDED, 0, T0 + 30, T0)
        (run_dir / "exit").mkdir()
        (run_dir / contract.exit_key(0)).write_text(json.dumps(exit_record.to_json()))
    (run_dir / "run.json").write_text(json.dumps({"run_id": "r-1", "job": "j", "backend": "local", "created_at": T0}))
    return run_dir


def record(run_dir: Path) -> RunRecord:
    return RunRecord(
        run_id="r-1", job="j", backend="local", run_dir=str(run_dir), created_at=T0, state=RunState.SUCCEEDED
    )


def test_a_finished_command_run_without_metrics_or_summary(tmp_path: Path) -> None:
    run_dir = run_dir_of_a_command(tmp_path)
    storage = open_storage(str(run_dir))
    snapshot = read_snapshot(storage)
    assert snapshot.metrics == [] and snapshot.summary is None  # the job wrote neither
    facts = gather(record(run_dir), storage, snapshot=snapshot, checkpoints=True)
    keras = parse_keras_log((LOGS / "keras3-verbose1.log").read_text())
    assert facts.metrics == keras.epochs and facts.metrics_from == contract.log_key(0)
    assert facts.summary is not None and facts.summary.is_derived
    assert facts.summary.test_accuracy == keras.test["accuracy"]
    assert [c.file for c in facts.checkpoints] == [
        "backup/training_metadata.json",
        "model-03.keras",
        "model-02.keras",
        "model-01.keras",
    ]
    assert checkpoints_text(facts.checkpoints) == "4 files, 10.0 KB; newest backup/training_metadata.json"

    rows = dict(
        summary_rows(str(run_dir), RunState.SUCCEEDED, snapshot, summary=facts.summary, checkpoints=facts.checkpoints)
    )
    assert rows["test accuracy"] == f"{keras.test['accuracy']:.4f}  (loss {keras.test['loss']:.4f})"
    assert rows["last epoch"] == metrics_text(keras.epochs[-1]) and rows["last epoch"].startswith("epoch 3: loss")
    assert rows["results from"].startswith(f"Keras' lines in {contract.log_key(0)}")
    assert rows["checkpoints"].endswith("(4 files, 10.0 KB; newest backup/training_metadata.json)")


def test_while_it_runs_the_log_says_the_epoch_and_no_summary_is_made_up(tmp_path: Path) -> None:
    text = (LOGS / "keras3-redraws.log").read_text()
    cut = text[: text.index("\n", text.index("Epoch 2/2") + len("Epoch 2/2\n")) + 1]  # epoch 2, mid-way
    run_dir = run_dir_of_a_command(tmp_path, ended=False)
    (run_dir / contract.log_key(0)).write_text(cut)
    facts = gather(record(run_dir), open_storage(str(run_dir)))
    assert [row["epoch"] for row in facts.metrics] == [1] and facts.summary is None
    assert facts.log_progress is not None and (facts.log_progress.epoch, facts.log_progress.epochs) == (2, 2)
    assert facts.log_progress.steps_per_epoch == 422 and 0 < (facts.log_progress.step or 0) < 422


def test_metrics_jsonl_and_summary_json_come_first(tmp_path: Path) -> None:
    run_dir = run_dir_of_a_command(tmp_path)
    (run_dir / contract.METRICS).write_text(json.dumps({"epoch": 1, "loss": 0.123456789}) + "\n")
    (run_dir / contract.SUMMARY).write_text(json.dumps({"score": 0.987654321, "note": "mine"}))
    facts = gather(record(run_dir), open_storage(str(run_dir)))
    assert facts.metrics == [{"epoch": 1, "loss": 0.123456789}] and facts.metrics_from == contract.METRICS
    assert facts.summary is not None and facts.summary.to_json() == {"score": 0.987654321, "note": "mine"}
    rows = summary_rows(str(run_dir), RunState.SUCCEEDED, facts.snapshot, summary=facts.summary)
    assert ("score", "0.9877") in rows  # rounded here, whole in summary.json and --json


def test_the_manifest_says_more_of_the_files_it_names(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    for n in (1, 2):
        (run_dir / "checkpoints" / f"ckpt-00000{n}.keras").write_bytes(b"k" * 10)
    (run_dir / "checkpoints" / "mine.weights.h5").write_bytes(b"w" * 5)
    os.utime(run_dir / "checkpoints" / "mine.weights.h5", (T0 - 100, T0 - 100))
    manifest = {
        "format": 2,
        "checkpoints": [
            {"file": "ckpt-000002.keras", "epochs_done": 2, "step": 0, "global_step": 20, "size": 10, "time": T0 + 2},
            {"file": "ckpt-000001.keras", "epochs_done": 1, "step": 0, "global_step": 10, "size": 10, "time": T0 + 1},
        ],
    }
    (run_dir / contract.LATEST_CHECKPOINT).write_text(json.dumps(manifest))
    found = list_checkpoints(open_storage(str(run_dir)), [])
    assert [(c.file, c.epochs_done, c.global_step) for c in found] == [
        ("ckpt-000002.keras", 2, 20),
        ("ckpt-000001.keras", 1, 10),
        ("mine.weights.h5", None, None),
    ]
    assert list_checkpoints(open_storage(str(tmp_path / "empty")), []) == []


def test_only_a_run_that_reports_a_test_metric_had_a_final_evaluation(tmp_path: Path) -> None:
    from runner.collect.timeline import build_timeline

    events = [
        Event(T0, "runner", "submitted", {}),
        Event(T0 + 1, "worker-0", "job_started", {}),
        Event(T0 + 20, "worker-0", "worker_exited", {"state": "succeeded"}),
    ]
    rows = [{"epoch": 1, "loss": 0.5, "time": T0 + 10, "epoch_time_s": 8.0}]
    plain = [p.name for p in build_timeline(events, rows).phases]
    assert "after training" in plain and "final evaluation" not in plain
    evaluated = [p.name for p in build_timeline(events, rows, evaluated=True).phases]
    assert "final evaluation" in evaluated and "after training" not in evaluated
    assert Summary.from_json({"test_accuracy": 0.9}).evaluated and not Summary.from_json({"epochs": 3}).evaluated
