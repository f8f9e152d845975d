"""`python -m runner.bench`: the bench as a job's command (it writes into $RUNNER_OUTPUT_DIR) or by hand."""

from __future__ import annotations

import sys

import typer

from runner.bench.command import bench
from runner.errors import RunnerError


def main() -> int:
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    app.command()(bench)
    try:
        app()
    except RunnerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        if exc.hint:
            print(f"hint: {exc.hint}", file=sys.stderr)
        return exc.exit_code
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 0
    return 0


if __name__ == "__main__":  # not when a spawned worker process re-imports this module
    sys.exit(main())
