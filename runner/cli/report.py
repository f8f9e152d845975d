"""`runner report RUN`: one self-contained HTML page of a run (runner.collect.report), or its data as JSON."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from runner.cli.output import echo, say, warn
from runner.cli.typer_app import RunArg, app


@app.command()
def report(
    run: RunArg,
    open_page: Annotated[bool, typer.Option("--open", help="Open the page in a web browser.")] = False,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            help="Write the page to this directory (default: <run dir>/report, or for a gs:// run directory "
            "$RUNNER_HOME/reports/<run id>, with a copy uploaded to <run dir>/report).",
            file_okay=False,
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report's data as JSON; write nothing.")] = False,
) -> None:
    """Write a run's report: one HTML page with the timeline of its phases, loss and accuracy curves, speed,
    strategy and devices, checkpoints, the startup breakdown and the cost; it opens with no network."""
    import json

    from runner.backends import run_state
    from runner.collect.report import build, write
    from runner.storage import open_storage
    from runner.watch.lookup import resolve
    from runner.watch.rundir import read_snapshot

    record = resolve(run)
    snapshot = read_snapshot(open_storage(record.run_dir))
    warnings = list(snapshot.problems)
    state = run_state(record, snapshot, warnings)
    data, facts = build(record, state, snapshot=snapshot)
    if as_json:
        echo(json.dumps(data, default=str, indent=1))
        return
    page = write(data, facts, out_dir=out)
    say(f"report: {page.path}")
    if page.uploaded:
        say(f"uploaded to {page.uploaded}")
    for warning in [*warnings, *page.warnings]:
        warn(warning)
    if open_page:
        import webbrowser

        if not webbrowser.open(page.path.as_uri()):
            warn(f"no web browser to open it with; open {page.path.as_uri()}")
