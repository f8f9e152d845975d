"""Messages from the emulators' own threads (a VM that could not boot, a controller's failed reconcile): written to
the process's real standard error, never to whatever sys.stdout or sys.stderr a caller has swapped in meanwhile.
click's CliRunner captures a command's output by swapping them, so a line from a thread printed the usual way lands
in the middle of that command's output (a full run saw a controller's line end a `runner status --json`)."""

from __future__ import annotations

import sys


def note(text: str) -> None:
    stream = sys.__stderr__
    if stream is not None:
        print(text, file=stream, flush=True)
