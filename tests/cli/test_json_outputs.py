"""`--json` on validate, status, list and report: each output checked against its schema (tests/cli/json_schemas.py)
after a real local run; and shell completion, which typer provides, through the console script's fast path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from runner.cli import app
from tests.cli import json_schemas as schemas
from tests.cli.test_cli import command_job, run_id_from
from tests.conftest import REPO


def as_json(*args: str) -> object:
    result = CliRunner().invoke(app, [*args, "--json"], catch_exceptions=False)
    return json.loads(result.output)


def test_the_validator_finds_what_breaks_a_schema() -> None:
    assert schemas.problems({"ok": True, "files": []}, schemas.VALIDATE) == []
    assert schemas.problems({"ok": 1, "files": [{"file": "x"}], "more": 2}, schemas.VALIDATE) == [
        "$.ok: int 1 is not boolean",
        "$.files[0]: 'ok' is missing",
        "$.files[0]: 'job' is missing",
        "$.files[0]: 'problems' is missing",
        "$.files[0]: 'warnings' is missing",
        "$: unexpected key 'more'",
    ]
    # anyOf: null, or the object; what fits neither names the closest miss
    assert schemas.problems(None, schemas.GOODPUT) == []
    assert schemas.problems({"billed_s": "1"}, schemas.GOODPUT)[0].startswith("$: none of anyOf fits")


def test_every_json_output_matches_its_schema(tmp_path: Path) -> None:
    line = "json.dumps({'step': 1, 'loss': 0.5}) + '\\n'"
    script = f"import json, os\nopen(os.environ['RUNNER_METRICS_FILE'], 'a').write({line})"
    result = CliRunner().invoke(app, ["submit", str(command_job(tmp_path, script)), "--local"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    run_id = run_id_from(result.output)

    status = as_json("status", run_id)
    assert schemas.problems(status, schemas.STATUS) == []
    assert status["state"] == "succeeded" and status["last_metrics"] == {"step": 1, "loss": 0.5}
    listing = as_json("list")
    assert schemas.problems(listing, schemas.LIST) == []
    assert [run["run_id"] for run in listing["runs"]] == [run_id]
    report = as_json("report", run_id)
    assert schemas.problems(report, schemas.REPORT) == []
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: Bad Name\n")
    validate = CliRunner().invoke(
        app, ["validate", *sorted(map(str, (REPO / "jobs").glob("*.yaml"))), str(bad), "--json"]
    )
    assert validate.exit_code == 2
    verdicts = json.loads(validate.output)
    assert schemas.problems(verdicts, schemas.VALIDATE) == []
    assert [v["ok"] for v in verdicts["files"]][-1] is False and verdicts["ok"] is False


def test_shell_completion_through_the_console_script() -> None:
    """What bash's completion function asks the console script (`runner --install-completion` installs it)."""
    env = {**os.environ, "_RUNNER_COMPLETE": "complete_bash", "COMP_WORDS": "runner sta", "COMP_CWORD": "1"}
    code = "import sys; sys.argv[0] = 'runner'; from runner.cli import main; main()"
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0 and done.stdout.split() == ["status"], done
    env |= {"COMP_WORDS": "runner submit job.yaml --dr", "COMP_CWORD": "3"}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.stdout.split() == ["--dry-run"], done
    shown = CliRunner().invoke(app, ["--help"]).output
    assert "--install-completion" in shown and "--show-completion" in shown
