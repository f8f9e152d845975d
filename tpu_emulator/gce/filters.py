"""The `filter` query parameter of Compute Engine's list methods, as far as the emulator understands it.

Supported (the forms the docs show, cloud.google.com/compute/docs/reference/rest/v1/instances/list): one or more
comparisons `FIELD = VALUE` or `FIELD != VALUE`, each optionally in parentheses, joined by whitespace or AND;
FIELD is a dotted path into the resource's JSON (labels.managed-by, scheduling.provisioningModel, operationType);
VALUE is bare or double-quoted, `*` matching any characters. A missing field matches nothing with `=` and
everything with `!=`. OR, `:`, `<`, `>` and regular expressions (`eq`, `ne`) are refused with 400, so that a
client never gets a silently wrong list.
"""

from __future__ import annotations

import fnmatch
import re
from typing import Any

from tpu_emulator.gce.errors import ComputeError, invalid

_TERM = re.compile(r'\s*\(?\s*([A-Za-z][\w.-]*)\s*(!=|=)\s*("(?:[^"\\]|\\.)*"|[^\s()"]+)\s*\)?\s*')
_AND = re.compile(r"\s*AND\s*", re.IGNORECASE)


def parse(text: str) -> list[tuple[str, str, str]]:
    """(field, operator, value) terms, all of which must hold."""
    terms: list[tuple[str, str, str]] = []
    rest = text.strip()
    while rest:
        match = _TERM.match(rest)
        if match is None:
            raise _refuse(text)
        field, op, value = match.groups()
        if value.startswith('"'):
            value = value[1:-1].replace('\\"', '"')
        terms.append((field, op, value))
        rest = rest[match.end() :]
        joined = _AND.match(rest)
        if joined is not None and joined.group(0).strip():
            rest = rest[joined.end() :]
    if any(re.fullmatch(r"OR|or", v) for _, _, v in terms):
        raise _refuse(text)
    return terms


def _refuse(text: str) -> ComputeError:
    return invalid(
        f"Invalid list filter expression '{text}'. The emulator supports FIELD = VALUE and FIELD != VALUE terms "
        "joined by AND (or whitespace)."
    )


def _lookup(data: Any, field: str) -> Any:
    value = data
    for part in field.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def matches(data: dict[str, Any], terms: list[tuple[str, str, str]]) -> bool:
    for field, op, pattern in terms:
        value = _lookup(data, field)
        if isinstance(value, bool):
            value = "true" if value else "false"
        found = value is not None and not isinstance(value, dict | list) and fnmatch.fnmatchcase(str(value), pattern)
        if found != (op == "="):
            return False
    return True
