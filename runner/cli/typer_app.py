"""The typer application: the command tree, and the one place RunnerError (runner.errors) becomes one message with
its hint and exit code. The commands (runner.cli.specs, submit, runs, report, teardown, tools) register on `app`;
their modules import only typer and the standard library at module level."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from runner.cli.output import report as report_error


class _RunnerGroup(TyperGroup):
    """Catches the one error root once, for every command: message, hint, exit code; no traceback."""

    def invoke(self, ctx: Any) -> object:  # typer's vendored click Context, which typer does not export
        from runner.errors import RunnerError

        try:
            return super().invoke(ctx)
        except RunnerError as exc:
            report_error(exc)
            if os.environ.get("RUNNER_DEBUG"):
                raise
            ctx.exit(exc.exit_code)
        except KeyboardInterrupt:
            ctx.exit(130)
        except OSError as exc:
            # This machine's disk refused a write (run records, reports, logs in $RUNNER_HOME): one message, no
            # traceback. Anything else an OSError means is a bug, and keeps its traceback.
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EROFS):
                raise
            from runner.errors import StorageError

            error = StorageError(
                f"cannot write {exc.filename or 'a file'}: {exc.strerror}",
                hint="free some space on that disk, or point $RUNNER_HOME (run records, reports) at another one",
            )
            report_error(error)
            if os.environ.get("RUNNER_DEBUG"):
                raise
            ctx.exit(error.exit_code)
        return None  # not reached: ctx.exit raises


SpecArg = Annotated[Path, typer.Argument(help="Job spec file (YAML).", show_default=False)]
RunArg = Annotated[str, typer.Argument(help="Run id (or a unique prefix), or a run directory (path or gs://).")]
SetOpt = Annotated[
    list[str],
    typer.Option(
        "--set", help="Override a field of the spec, validated like the file: --set training.epochs=1 (repeatable)."
    ),
]

app = typer.Typer(
    name="runner",
    cls=_RunnerGroup,
    help="Run containerized training jobs on Cloud TPU VMs, or the same job locally, and never pay for an idle TPU.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    # Plain help: rich's help renderer imports markdown-it and ~150 ms of modules; `runner --help` must be instant.
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _print_version(value: bool) -> None:
    if value:
        from runner.cli.output import echo, version_text

        echo(version_text())
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", help="Print the runner's version and exit.", is_eager=True, callback=_print_version),
    ] = False,
) -> None:
    """Run containerized training jobs on Cloud TPU VMs, or the same job locally, and never pay for an idle TPU."""


# The commands register themselves on `app` (typer and the standard library only at their module level), in the
# order `runner --help` lists them.
# isort: off
from runner.cli import specs, submit, runs, report, teardown, tools  # noqa: E402, F401
# isort: on
