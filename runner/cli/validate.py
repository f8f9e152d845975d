"""`runner validate FILE...`: every problem of every file, with its field path and line; exit 2 if any is invalid.

Besides the spec itself, where it would run is checked against the catalog offline (runner.backends.findings:
type, backend, zones, runtime, framework). Typer-free (the CLI's fast path calls validate_paths directly; the typer
command calls it too): PyYAML, pydantic, the spec models and the catalog are imported.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from runner.cli.output import echo, report, style


def validate_paths(paths: list[str] | list[Path], overrides: list[str] | None = None, *, as_json: bool = False) -> int:
    """Validate each file (with `--set` overrides), print `ok FILE: ...` or every problem, or with `as_json` one
    JSON document; the exit code (0, or 2 if any failed)."""
    from runner import backends
    from runner.errors import SpecError
    from runner.plan import datacheck, limits
    from runner.spec.loader import load_spec, shown

    verdicts: list[dict[str, Any]] = []
    for path in paths:
        verdict: dict[str, Any] = {"file": str(path), "ok": False, "job": None, "problems": [], "warnings": []}
        verdicts.append(verdict)
        try:
            spec = load_spec(path, overrides)
        except SpecError as exc:
            verdict["problems"] = exc.problems or [exc.message]
            if not as_json:
                report(exc)
            continue
        _, findings = backends.findings(spec)
        errors = [f.message + (f" ({f.hint})" if f.hint else "") for f in findings if f.error]
        errors += datacheck.problems(spec, Path.cwd())
        errors += limits.env_in_metadata_problems(spec.env)  # what a TPU VM's startup script could not carry
        verdict |= {"job": spec.name, "problems": errors}
        verdict["warnings"] = [f.message + (f" ({f.hint})" if f.hint else "") for f in findings if not f.error]
        if errors:
            if not as_json:
                count = f"{len(errors)} problem{'s' if len(errors) > 1 else ''}"
                report(SpecError(f"{shown(path)}: {count} (the catalog, the training data and code)", errors))
            continue
        verdict["ok"] = True
        if as_json:
            continue
        what = f"{spec.training.model}, {spec.training.epochs} epochs" if spec.training else f"`{spec.command_line}`"
        echo(style("ok", fg="green") + f" {shown(path)}: job {spec.name!r} ({what})")
        for warning in verdict["warnings"]:
            echo(style("warning", fg="yellow") + f": {warning}")
    if as_json:
        echo(json.dumps({"ok": all(v["ok"] for v in verdicts), "files": verdicts}, indent=1))
    return 0 if all(v["ok"] for v in verdicts) else SpecError.exit_code
