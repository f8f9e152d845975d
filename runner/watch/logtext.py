"""A job's output as a log file stores it: what a terminal would end up showing, line by line.

Keras' progress bar (and tqdm, and colour libraries) draw for a terminal: carriage returns and backspaces redraw
one line in place, ANSI escape sequences colour it. Stored as they are, one epoch becomes a single line of
thousands of characters full of control bytes that `runner logs`, an editor or `grep` shows as noise. The
supervisor tees the raw bytes to its own stdout (a terminal keeps the live bar) and writes logs/worker-N.log
through `LogCleaner`: every line as a terminal would leave it, without escape sequences. A line redrawn in place
is stored when it ends (its newline), and, while it keeps being redrawn, its state at most every `redraw_every_s`
so a long epoch still shows life in `runner logs -f`.
"""

from __future__ import annotations

import codecs
import re
import time
from collections.abc import Callable
from typing import Any

# CSI (colours, cursor moves, erase), OSC (titles, links; ended by BEL or ST), and two-byte escapes.
_ESCAPE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")
_TOKEN = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]|[\x00-\x1f\x7f]")
_MAX_ESCAPE = 256  # an escape sequence longer than this is garbage, not one still arriving
_MAX_LINE = 1 << 20  # a line that never ends is stored in pieces of this many characters


class LogCleaner:
    """Feed raw output chunks; get back the bytes to store. Keeps state across chunks (a line being redrawn, an
    escape sequence or a UTF-8 character split between reads); `flush()` at the end returns what is left."""

    def __init__(self, redraw_every_s: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._pending = ""  # an escape sequence cut by the end of a chunk
        self._line: list[str] = []
        self._cursor = 0
        self._redrawn = False  # the current line was redrawn (\r or \b) since it was last stored
        self._stored_at: float | None = None
        self.redraw_every_s = redraw_every_s
        self.clock = clock

    def feed(self, chunk: bytes) -> bytes:
        text = self._pending + self._decoder.decode(chunk)
        self._pending = ""
        cut = text.rfind("\x1b")
        if cut != -1 and not _ESCAPE.match(text, cut) and len(text) - cut < _MAX_ESCAPE:
            text, self._pending = text[:cut], text[cut:]
        out: list[str] = []
        position = 0
        for match in _TOKEN.finditer(text):
            self._write(text[position : match.start()], out)
            self._control(match.group(), out)
            position = match.end()
        self._write(text[position:], out)
        if self._redrawn and self._line:
            now = self.clock()
            if self._stored_at is None:
                self._stored_at = now
            elif now - self._stored_at >= self.redraw_every_s:
                out.append("".join(self._line).rstrip() + "\n")
                self._stored_at, self._redrawn = now, False
        return "".join(out).encode()

    def flush(self) -> bytes:
        """What is left: the last line when it has no newline."""
        text = self.feed(b"").decode() + self._decoder.decode(b"", final=True)
        if self._line:
            text += "".join(self._line).rstrip() + "\n"
        self._line, self._cursor, self._redrawn = [], 0, False
        return text.encode()

    def _write(self, text: str, out: list[str]) -> None:
        if not text:
            return
        line, at = self._line, self._cursor
        if at == len(line):
            line.extend(text)
        else:
            line[at : at + len(text)] = text  # overwrite, as a terminal does after \r or \b
        self._cursor = at + len(text)
        if len(line) >= _MAX_LINE:
            self._newline(out)

    def _newline(self, out: list[str]) -> None:
        out.append("".join(self._line).rstrip() + "\n")
        self._line, self._cursor, self._redrawn, self._stored_at = [], 0, False, None

    def _control(self, token: str, out: list[str]) -> None:
        if token == "\n":
            self._newline(out)
        elif token == "\r":
            self._cursor, self._redrawn = 0, True
        elif token == "\b":
            self._cursor, self._redrawn = max(0, self._cursor - 1), True
        elif token == "\t":
            self._write("\t", out)
        elif token.startswith("\x1b[") and token.endswith("K"):  # erase in line: what follows the cursor (0, 1, 2)
            mode = token[2:-1] or "0"
            if mode == "0":
                del self._line[self._cursor :]
            elif mode == "2":
                self._line = [" "] * self._cursor
        # anything else (colours, other control characters) is dropped


_CONTROL = re.compile(rb"[\x00-\x08\x0b-\x1f\x7f]")  # anything a terminal would not show as it is (\t, \n are fine)


def clean_log(data: bytes) -> bytes:
    """A whole log as a terminal would have left it (what `LogCleaner` stores, in one go); a log with nothing to
    clean (every log the supervisor stored) is returned as it is, at once."""
    if not _CONTROL.search(data):
        return data
    cleaner = LogCleaner(redraw_every_s=float("inf"))
    return cleaner.feed(data) + cleaner.flush()


def one_line(value: Any, limit: int = 200) -> str:
    """A value from a file someone else wrote, safe for one terminal line: no control characters (escape
    sequences, newlines), and not endless."""
    text = "".join(c if c.isprintable() else "?" for c in str(value))
    return text if len(text) <= limit else text[: limit - 1] + "…"
