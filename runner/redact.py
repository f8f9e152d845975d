"""The one redaction of a job's secrets: their values replaced in whatever text passes, a stream included.

The runner never writes a secret's value anywhere (the spec, the plan, the run record, the VM's metadata hold
references only), but a job may print what it was given. Whatever the job prints passes through one `Redactor` (in
the supervisor, before the job's output reaches the terminal, the log file, the exit record's tail and so the
run directory), which replaces each value with `[redacted NAME]`. A value split across two reads of the stream is
still found: the end of a read that could be the start of a value is held back until the next read says.

Values shorter than MIN_LENGTH are not replaced: replacing every "1" of a log would destroy it and hide nothing.
A multi-line value (a key file) is replaced whole, and each of its lines of MIN_LENGTH or more on its own. Standard
library only: the supervisor imports it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

from runner import contract

MIN_LENGTH = 4


def forms(value: bytes) -> list[bytes]:
    """What of `value` a job may print: the value, without its final line break, and each long enough line."""
    found = {value, value.rstrip(b"\r\n")}
    found.update(line.strip(b"\r") for line in value.split(b"\n"))
    return [f for f in found if len(f) >= MIN_LENGTH]


class Redactor:
    """Replaces known values in a byte stream: feed each read, then flush at its end."""

    def __init__(self, values: dict[str, bytes]) -> None:
        pairs = {form: f"[redacted {name}]".encode() for name, value in values.items() for form in forms(value)}
        # Longest first: a value that contains another is replaced whole.
        self._pairs = sorted(pairs.items(), key=lambda p: -len(p[0]))
        self._held = b""

    def _replace(self, data: bytes) -> bytes:
        for value, mark in self._pairs:
            data = data.replace(value, mark)
        return data

    def _held_back(self, data: bytes) -> int:
        """How many bytes at the end of `data` could begin a value (and must wait for the next read)."""
        longest = 0
        for value, _ in self._pairs:
            for size in range(min(len(value) - 1, len(data)), longest, -1):
                if data.endswith(value[:size]):
                    longest = size
                    break
        return longest

    def feed(self, chunk: bytes) -> bytes:
        """The redacted bytes that can be passed on now; the rest waits for the next feed or flush."""
        if not self._pairs:
            return chunk
        data = self._replace(self._held + chunk)
        keep = self._held_back(data)
        self._held = data[len(data) - keep :] if keep else b""
        return data[: len(data) - keep]

    def flush(self) -> bytes:
        """What was held back, at the end of the stream (it turned out not to be a value)."""
        data, self._held = self._held, b""
        return data


def job_secrets(environ: Mapping[str, str]) -> dict[str, bytes]:
    """The values of the job's secrets, found where the job finds them: contract.SECRETS names each variable and
    how it holds its secret (the value, or the path of a file with it). What cannot be read is left out."""
    try:
        modes = json.loads(environ.get(contract.SECRETS) or "{}")
    except ValueError:
        return {}
    values: dict[str, bytes] = {}
    for name, mode in modes.items() if isinstance(modes, dict) else ():
        held = environ.get(str(name))
        if not held:
            continue
        if mode == "file":
            try:
                values[name] = Path(held).read_bytes()
            except OSError:
                continue
        else:
            values[name] = os.fsencode(held)
    return values
