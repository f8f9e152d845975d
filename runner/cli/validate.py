"""`runner validate FILE...`: every problem of every file, with its field path and line; exit 2 if any is invalid.

Besides the spec itself, where it would run is checked against the catalog offline (runner.backends.findings:
type, backend, zones, runtime, framework), and so are the job's own requirements (runner.launch.deps: the file,
each line against the image variant's lock and this Python's packages). Typer-free (the CLI's fast path calls
validate_paths directly; the typer command calls it too): PyYAML, pydantic, the spec models and the catalog are
imported.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runner.cli.output import echo, report, style

if TYPE_CHECKING:
    from runner.spec import JobSpec


def validate_paths(paths: list[str] | list[Path], overrides: list[str] | None = None, *, as_json: bool = False) -> int:
    """Validate each file (with `--set` overrides), print `ok FILE: ...` or every problem, or with `as_json` one
    JSON document; the exit code (0, or 2 if any failed)."""
    from runner import backends
    from runner.errors import SpecError
    from runner.plan import datacheck, limits
    from runner.spec.loader import load_spec, shown
    from runner.spec.secrets import env_warnings

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
        errors += dependency_problems(spec, Path.cwd())
        verdict |= {"job": spec.name, "problems": errors}
        verdict["warnings"] = [f.message + (f" ({f.hint})" if f.hint else "") for f in findings if not f.error]
        verdict["warnings"] += env_warnings(spec)
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


def dependency_problems(spec: JobSpec, cwd: Path) -> list[str]:
    """The requirements of a job's code in `cwd` (runner.launch.deps), offline: each line that cannot be read, or that
    conflicts with a package of the image's variant (its lock) or of this Python (what a --local process run has)."""
    from runner.errors import SpecError
    from runner.launch import code, deps, variants
    from runner.plan.planner import own_code

    if not own_code(spec):
        return []
    try:
        requirements = deps.find(cwd)
        if requirements is None:
            return []
        image = code.variant_pins(variants.variant_of(spec.image))
        here = deps.installed_pins("this Python (a --local process run's)")
        return [problem for pins in (image, here) if pins for problem in deps.conflicts(requirements, pins)]
    except SpecError as exc:
        return exc.problems or [exc.message]
