"""A user's own Keras script as a `command` job, end to end: `runner submit --local` of a small model trained on a
slice of real MNIST with no runner callback (tests/watch/keras_logs/mnist_fit.py: Keras' ModelCheckpoint, fit,
evaluate). All the runner gets is the job's log and its files; status, list, the summary and the report still
show its epochs, its metrics, its test accuracy, its checkpoints, and only the phases that happened."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from runner import contract
from runner.cli import app
from tests.browser import Browser, chromium_or_skip
from tests.cli import json_schemas as schemas
from tests.cli.test_cli import run_id_from, write_job

SCRIPT = Path(__file__).parent.parent / "watch" / "keras_logs" / "mnist_fit.py"
EPOCHS = 3


def invoke(*args: str):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(app, list(args), catch_exceptions=False)


def as_json(*args: str) -> dict:  # type: ignore[type-arg]
    result = invoke(*args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def keras_lines(log: str) -> tuple[list[str], str]:
    """Each epoch's finished bar line, and evaluate()'s, straight from the log (the test's own reading of it)."""
    lines = log.splitlines()
    finished = re.compile(r"\s*(\d+)/\1\b")  # "29/29 ...": a bar at its end
    epochs = [
        next(b for b in lines[i + 1 :] if finished.match(b))
        for i, line in enumerate(lines)
        if re.fullmatch(r"Epoch \d+/\d+", line)
    ]
    assert len(epochs) == EPOCHS
    return epochs, [b for b in lines if finished.match(b)][-1]


def metric(line: str, name: str) -> float:
    found = re.search(rf"(?:^| - ){name}: ([0-9.e+-]+)", line)
    assert found, (name, line)
    return float(found[1])


@pytest.mark.slow
@pytest.mark.parametrize(
    ("engine", "env"),
    [("keras3", {"FIT_VERBOSE": "1"}), ("tf_keras", {"FIT_VERBOSE": "2", "TF_USE_LEGACY_KERAS": "1"})],
)
def test_a_keras_script_with_no_runner_callback(
    engine: str, env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mnist_npz: Path
) -> None:
    work = tmp_path / "code"
    work.mkdir()
    shutil.copy(SCRIPT, work / "train.py")
    monkeypatch.chdir(work)  # a --local process run: the command runs where `runner submit` does
    settings = "".join(f"\n          {k}: '{v}'" for k, v in {**env, "TRAIN_EXAMPLES": "2048"}.items())
    job = write_job(
        tmp_path,
        f"""\
        name: own-keras
        image: trainer:test
        command: python train.py
        env:{settings}
        storage: {tmp_path / "store"}
        """,
    )
    result = invoke("submit", str(job), "--local", "--process")
    assert result.exit_code == 0, result.output
    assert "warning" not in result.output.split("runner: following")[0]  # train.py is where it runs
    run_id = run_id_from(result.output)
    run_dir = tmp_path / "store" / "runs" / run_id
    log = (run_dir / contract.log_key(0)).read_text()
    epoch_lines, evaluation = keras_lines(log)
    assert not (run_dir / contract.METRICS).exists() and not (run_dir / contract.PROGRESS).exists()

    # The end of submit: the test accuracy, the last epoch, the checkpoints the job wrote.
    end = result.output[result.output.index(f"Run {run_id}") :]
    rows = {line[:15].strip(): line[15:] for line in end.splitlines()[1:] if line[14:15] == " "}
    accuracy = metric(evaluation, "accuracy")
    assert rows["test accuracy"] == f"{accuracy:.4f}  (loss {metric(evaluation, 'loss'):.4f})"
    assert rows["last epoch"].startswith(f"epoch {EPOCHS}: loss {metric(epoch_lines[-1], 'loss'):.4f}, accuracy ")
    assert rows["results from"].startswith("Keras' lines in logs/worker-0.log")
    assert re.search(rf"\({EPOCHS} files, [0-9.]+ [KM]B; newest model-0{EPOCHS}.keras\)$", rows["checkpoints"])

    # summary.json, written by the supervisor as the job ended: the numbers whole, where they came from.
    summary = json.loads((run_dir / contract.SUMMARY).read_text())
    assert summary["derived_from"] == [contract.log_key(0)] and summary["epochs"] == EPOCHS
    assert summary["test_accuracy"] == accuracy and summary["test"]["loss"] == metric(evaluation, "loss")

    status = as_json("status", run_id)
    assert schemas.problems(status, schemas.STATUS) == []
    assert status["metrics_from"] == contract.log_key(0)
    assert [row["epoch"] for row in status["metrics"]] == list(range(1, EPOCHS + 1))
    for row, line in zip(status["metrics"], epoch_lines, strict=True):
        for name in ("loss", "accuracy", "val_loss", "val_accuracy"):
            assert row[name] == metric(line, name), (name, line)
    assert status["summary"] == summary and status["progress"]["epoch"] == EPOCHS and status["eta_s"] == 0
    assert [c["file"] for c in status["checkpoints"]] == [f"model-0{n}.keras" for n in range(EPOCHS, 0, -1)]
    shown = invoke("status", run_id).output
    assert f"last metrics  epoch {EPOCHS}: loss {metric(epoch_lines[-1], 'loss'):.4f}" in shown

    listing = as_json("list")
    assert schemas.problems(listing, schemas.LIST) == []
    (entry,) = listing["runs"]
    assert entry["test_accuracy"] == accuracy and entry["last_metrics"] == status["metrics"][-1]
    assert entry["metrics_from"] == contract.log_key(0)
    assert f"test acc. {accuracy:.4f}" in invoke("list").output

    report = as_json("report", run_id)
    assert schemas.problems(report, schemas.REPORT) == []
    phases = [p["name"] for p in report["timeline"]["phases"]]
    assert "final evaluation" not in phases and "job" in phases  # no epoch times in a log: one job phase
    charts = {c["id"]: c["points"] for c in report["charts"]}
    assert charts["loss"] == {"loss": EPOCHS, "val_loss": EPOCHS}
    assert charts["accuracy"] == {"accuracy": EPOCHS, "val_accuracy": EPOCHS}
    if engine != "keras3":
        return
    chromium = chromium_or_skip()
    page = run_dir / "report" / "index.html"
    with Browser(chromium) as browser:
        browser.open(page.as_uri())
        text = browser.evaluate("document.body.innerText")
        drawn = browser.evaluate("JSON.parse(document.getElementById('chart-timeline').dataset.points)")
    assert "final evaluation" not in text and "Final metrics" in text
    assert f"test accuracy\t{accuracy:.4f}" in text and f"model-0{EPOCHS}.keras" in text
    assert f"{EPOCHS} files" in text and "from Keras' epoch lines in logs/worker-0.log" in text
    assert drawn["phases"] == len(phases)
