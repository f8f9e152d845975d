"""How the CLI prints: plain aligned rows, `runner:` messages, warnings, errors. Colour only on a terminal (and
not with $NO_COLOR), so logs, pipes and golden files read the same as a terminal. No typer here: the typer-free
`runner validate` path prints through this module too."""

from __future__ import annotations

import os
import sys
import time
from typing import IO, TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

    from runner.errors import RunnerError

_CODES = {"red": "31", "green": "32", "yellow": "33", "cyan": "36"}


def _stream(err: bool) -> IO[str]:
    return sys.stderr if err else sys.stdout


def style(text: str, *, fg: str | None = None, bold: bool = False, dim: bool = False, err: bool = False) -> str:
    """`text` in colour when it goes to a terminal; as it is otherwise."""
    if os.environ.get("NO_COLOR") or not _stream(err).isatty():
        return text
    codes = [c for c in ("1" if bold else "", "2" if dim else "", _CODES.get(fg or "", "")) if c]
    return f"\x1b[{';'.join(codes)}m{text}\x1b[0m" if codes else text


def echo(text: str = "", *, err: bool = False) -> None:
    stream = _stream(err)
    stream.write(text + "\n")
    stream.flush()


def say(text: str) -> None:
    echo(style("runner", fg="cyan", bold=True) + f": {text}")


def warn(text: str) -> None:
    """A problem that does not stop the command (one corrupt file among many): one line on stderr."""
    echo(style("warning", fg="yellow", bold=True, err=True) + f": {text}", err=True)


def report(exc: RunnerError) -> None:
    first, _, rest = str(exc).partition("\n")
    echo(style("error", fg="red", bold=True, err=True) + f": {first}", err=True)
    if rest:
        echo(rest, err=True)
    if exc.hint:
        echo(style(f"hint: {exc.hint}", dim=True, err=True), err=True)


def write_output(chunk: bytes) -> None:
    sys.stdout.buffer.write(chunk)
    sys.stdout.flush()


def rows_text(rows: list[tuple[str, str]], title: str | None = None) -> str:
    """Aligned `label  value` lines."""
    width = max((len(k) for k, _ in rows), default=0)
    lines = [title] if title else []
    lines += [f"{key:<{width}}  {value}" for key, value in rows]
    return "\n".join(lines)


def print_rows(rows: list[tuple[str, str]], title: str | None = None) -> None:
    echo(rows_text(rows, title))


def when(timestamp: float, fmt: str) -> str:
    """A time read from a file as local time; '?' for one no clock can show (NaN, 1e300: a corrupt file)."""
    try:
        return time.strftime(fmt, time.localtime(timestamp))
    except (OverflowError, ValueError, OSError):
        return "?"


def console() -> Console:
    """rich, for the one table (`runner list`); everything else is plain text through typer, so the commands a user
    runs most (validate, status, submit's messages) do not pay rich's import, and no message is read as markup."""
    from rich.console import Console

    out = Console(highlight=False, soft_wrap=True)
    if not out.is_terminal and "COLUMNS" not in os.environ:
        out.width = 120  # logs and pipes: rich would assume 80 columns and fold every table row
    return out


def version_text() -> str:
    """`runner --version`: the installed distribution's version (importlib.metadata costs ~15 ms: asked only here)."""
    from importlib import metadata

    try:
        return f"runner {metadata.version('tpu-runner')}"
    except metadata.PackageNotFoundError:
        return "runner (not installed: run from a checkout)"
