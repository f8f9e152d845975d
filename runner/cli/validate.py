"""`runner validate FILE...`: every problem of every file, with its field path and line; exit 2 if any is invalid.

Typer-free (the CLI's fast path calls validate_paths directly; the typer command calls it too): only PyYAML,
pydantic and the spec models are imported.
"""

from __future__ import annotations

from pathlib import Path

from runner.cli.output import echo, report, style


def validate_paths(paths: list[str] | list[Path]) -> int:
    """Validate each file, print `ok FILE: ...` or every problem; the exit code (0, or 2 if any failed)."""
    from runner.errors import SpecError
    from runner.spec.loader import load_spec, shown

    failed = 0
    for path in paths:
        try:
            spec = load_spec(path)
        except SpecError as exc:
            report(exc)
            failed += 1
            continue
        what = f"{spec.training.model}, {spec.training.epochs} epochs" if spec.training else f"`{spec.command_line}`"
        echo(style("ok", fg="green") + f" {shown(path)}: job {spec.name!r} ({what})")
    return SpecError.exit_code if failed else 0
