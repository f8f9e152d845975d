"""`runner validate FILE...`: every problem of every file, with its field path and line; exit 2 if any is invalid.

Besides the spec itself, where it would run on Cloud TPU is checked against the catalog offline
(runner.plan.compat: type, zones, runtime, framework). Typer-free (the CLI's fast path calls validate_paths
directly; the typer command calls it too): PyYAML, pydantic, the spec models and the catalog are imported.
"""

from __future__ import annotations

from pathlib import Path

from runner.cli.output import echo, report, style


def validate_paths(paths: list[str] | list[Path]) -> int:
    """Validate each file, print `ok FILE: ...` or every problem; the exit code (0, or 2 if any failed)."""
    from runner.errors import SpecError
    from runner.plan import compat
    from runner.spec.loader import load_spec, shown

    failed = 0
    for path in paths:
        try:
            spec = load_spec(path)
        except SpecError as exc:
            report(exc)
            failed += 1
            continue
        _, findings = compat.check(spec)
        errors = [f for f in findings if f.error]
        if errors:
            report(
                SpecError(
                    f"{shown(path)}: {len(errors)} problem{'s' if len(errors) > 1 else ''} for a TPU VM (the catalog)",
                    [f.message + (f" ({f.hint})" if f.hint else "") for f in errors],
                )
            )
            failed += 1
            continue
        what = f"{spec.training.model}, {spec.training.epochs} epochs" if spec.training else f"`{spec.command_line}`"
        echo(style("ok", fg="green") + f" {shown(path)}: job {spec.name!r} ({what})")
        for finding in findings:
            echo(
                style("warning", fg="yellow") + f": {finding.message}" + (f" ({finding.hint})" if finding.hint else "")
            )
    return SpecError.exit_code if failed else 0
