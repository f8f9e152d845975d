"""A command job that keeps its own Orbax checkpoints (a hand-written loop with a CheckpointManager in
RUNNER_CHECKPOINT_DIR), ended short and continued with `runner resume`: the runner reads its steps, and the second
attempt's log, `runner status` (and --json), summary.json and the report all say where it went on from and how many
steps it trained again."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from runner import contract
from runner.cli import app
from tests.cli import json_schemas as schemas
from tests.cli.test_cli import run_id_from, write_job

# Saves every 5 steps (the manager keeps 2); its first attempt fails at step 23, three steps past its last save.
LOOP = """\
import os, sys
import numpy as np
import orbax.checkpoint as ocp
from runner.metrics import log_metrics, write_progress

TOTAL = 30
manager = ocp.CheckpointManager(
    os.environ["RUNNER_CHECKPOINT_DIR"], options=ocp.CheckpointManagerOptions(max_to_keep=2, save_interval_steps=5)
)
start = manager.latest_step()
state = {"w": np.zeros(4)}
if start is not None:
    state = manager.restore(start, args=ocp.args.StandardRestore(state))
print(f"loop starts at step {start or 0}", flush=True)
for step in range((start or 0) + 1, TOTAL + 1):
    state = {"w": state["w"] + 1.0}
    log_metrics(step=step, loss=1.0 / step)
    write_progress(step=step)
    manager.save(step, args=ocp.args.StandardSave(state))
    if start is None and step == 23:
        manager.wait_until_finished()
        sys.exit("lost the device at step 23")
manager.wait_until_finished()
assert state["w"][0] == TOTAL, state
print("trained", TOTAL, "steps", flush=True)
"""


def invoke(*args: str):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(app, list(args), catch_exceptions=False)


@pytest.mark.slow
def test_an_orbax_job_resumed_says_its_step_and_the_steps_redone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "loop.py").write_text(LOOP)
    monkeypatch.chdir(tmp_path)
    job = write_job(
        tmp_path,
        f"""\
        name: orbax-loop
        image: trainer:test
        command: [{json.dumps(sys.executable)}, loop.py]
        storage: {tmp_path / "store"}
        """,
    )
    first = invoke("submit", str(job), "--local", "--process")
    assert first.exit_code != 0 and "lost the device at step 23" in first.output
    assert "resumed from" not in first.output  # a first attempt says nothing of the sort
    run_id = run_id_from(first.output)
    run_dir = tmp_path / "store" / "runs" / run_id

    second = invoke("resume", run_id)
    assert second.exit_code == 0, second.output
    said = "resumed from step 20 (Orbax, checkpoints/20); 3 steps redone"
    assert f"[runner] {said}: the newest committed checkpoint in RUNNER_CHECKPOINT_DIR" in second.output
    assert "loop starts at step 20" in second.output
    end = second.output[second.output.index(f"Run {run_id}") :]
    row = said.removeprefix("resumed ")
    assert re.search(rf"^resumed\s+{re.escape(row)}$", end, re.M), end
    assert re.search(r"\(2 checkpoints \(Orbax\), [0-9.]+ KB; newest step 30 \(Orbax\)\)$", end, re.M), end

    summary = json.loads((run_dir / contract.SUMMARY).read_text())
    assert summary["resumed"]["text"] == said and summary["resumed"]["step"] == 20
    status = invoke("status", run_id, "--json")
    data = json.loads(status.stdout)
    assert schemas.problems(data, schemas.STATUS) == []
    assert data["resumed"] == {
        "checkpoint": "checkpoints/20",
        "step": 20,
        "redone": 3,
        "format": "Orbax",
        "epoch": None,
        "text": said,
    }
    assert [(c["file"], c["format"], c["global_step"]) for c in data["checkpoints"]] == [
        ("30", "Orbax", 30),
        ("25", "Orbax", 25),
    ]
    assert re.search(rf"^resumed\s+{re.escape(row)}$", invoke("status", run_id).output, re.M)
    report = json.loads(invoke("report", run_id, "--json").stdout)
    assert schemas.problems(report, schemas.REPORT) == [] and report["resumed"]["text"] == said
    page = (run_dir / "report" / "index.html").read_text()
    assert f"<tr><th>resumed</th><td>{row}</td></tr>" in page
