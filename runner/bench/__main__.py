"""`python -m runner.bench`: the bench as a job's command (it writes into $RUNNER_OUTPUT_DIR) or by hand; the same
command as `runner bench`, with the CLI's error reporting and exit codes."""

from __future__ import annotations

import sys


def main() -> None:
    from runner.cli import app

    app(["bench", *sys.argv[1:]], prog_name="runner")


if __name__ == "__main__":  # not when a spawned worker process re-imports this module
    main()
