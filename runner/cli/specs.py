"""`runner validate` and `runner schema`: the job spec, checked and described."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from runner.cli.output import echo
from runner.cli.typer_app import SetOpt, app


@app.command()
def validate(
    specs: Annotated[list[Path], typer.Argument(help="Job spec files.", show_default=False)],
    set_values: SetOpt = [],  # noqa: B006  (typer reads the default; it is never mutated)
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document: each file's verdict.")] = False,
) -> None:
    """Check job spec files and report every problem, with its field path and line, and where each would run
    (the TPU catalog, offline). Exit code 2 if any is invalid."""
    from runner.cli.validate import validate_paths

    code = validate_paths(specs, set_values, as_json=as_json)
    if code:
        raise typer.Exit(code)


@app.command()
def schema() -> None:
    """Print the job spec's JSON Schema (for editor completion, e.g. with the YAML language server)."""
    import json

    from runner.spec import JobSpec

    document = JobSpec.model_json_schema()
    document["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    document["title"] = "tpu-runner job spec"
    echo(json.dumps(document, indent=2))
