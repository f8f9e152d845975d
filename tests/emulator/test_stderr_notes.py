"""The emulators' own threads write their messages to the process's real standard error: never into the output of a
command a test runs meanwhile through typer's CliRunner (which swaps sys.stdout and sys.stderr), where a line
from a controller once ended a `runner status --json` and broke its JSON."""

from __future__ import annotations

import json
import threading

import pytest
import typer
from typer.testing import CliRunner

from tpu_emulator.stderr import note


def test_a_note_from_an_emulator_thread_stays_out_of_a_command_s_output(capfd: pytest.CaptureFixture[str]) -> None:
    def status() -> None:
        thread = threading.Thread(target=note, args=("[kube] jobset controller, ns/js: KeyError('x')",))
        thread.start()
        thread.join()
        print(json.dumps({"state": "succeeded"}))

    app = typer.Typer()
    app.command()(status)
    result = CliRunner().invoke(app)
    assert result.exit_code == 0 and json.loads(result.output) == {"state": "succeeded"}
    assert "[kube] jobset controller, ns/js: KeyError('x')" in capfd.readouterr().err  # said, where a person sees it
