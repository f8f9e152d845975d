"""The `runner` command line: parse, call the core, print.

    runner.cli.typer_app  the typer application (the only place that knows typer), and the error root's exit
    runner.cli.specs      validate, schema
    runner.cli.submit     submit (and the dry run)
    runner.cli.runs       status, logs, list
    runner.cli.report     report
    runner.cli.teardown   down, gc
    runner.cli.tools      build, bench
    runner.cli.output     how everything is printed (no typer)

Every command is a thin call into the lifecycle packages. Nothing heavy is imported at module level (no
TensorFlow, no Google SDK): `runner --help` stays fast. `runner validate FILE...`, the command run most often (editors,
pre-commit hooks), skips typer altogether (runner.cli.validate): typer's import and command-tree building cost more
than validating the spec.
"""

from __future__ import annotations

import sys
from typing import Any


def main() -> None:
    """Console-script entry point."""
    argv = sys.argv[1:]
    if argv == ["--version"]:
        from runner.cli.output import echo, version_text

        echo(version_text())
        return
    if len(argv) > 1 and argv[0] == "validate" and not any(a.startswith("-") for a in argv[1:]):
        from runner.cli.validate import validate_paths

        sys.exit(validate_paths(argv[1:]))
    from runner.cli.typer_app import app

    app()


def __getattr__(name: str) -> Any:
    if name == "app":  # `from runner.cli import app` (tests, `python -m runner.bench`) builds the command tree
        from runner.cli.typer_app import app

        return app
    raise AttributeError(f"module 'runner.cli' has no attribute {name!r}")
