"""Read a job spec file: safe YAML with positions, then pydantic, reporting every problem at once.

Each problem carries its field path, its YAML line and, for an unknown key, the closest known key. YAML features
that a job spec never needs and that make loading unsafe are rejected before anything is constructed: explicit
tags (`!!python/object`, custom `!Tag`), anchors and aliases (the "billion laughs" expansion), duplicate keys
(YAML keeps the last one silently), non-string keys, nesting deeper than a job spec ever goes (PyYAML's composer
recurses once per level) and files over 1 MiB. A path that is not a regular file (a FIFO, a device, a socket) is
refused before it is opened for reading, and no read takes more than MAX_SPEC_BYTES + 1 bytes.
"""

from __future__ import annotations

import difflib
import os
import stat
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from runner.errors import SpecError
from runner.spec import PATTERN_MEANINGS, JobSpec

MAX_SPEC_BYTES = 1 << 20
# The deepest a valid spec goes is 3 (accelerator.zones[0]); 32 leaves room for wrong but honest input and stops
# `[[[[...` long before PyYAML's composer, our _positions walk or pydantic reach Python's recursion limit.
MAX_DEPTH = 32
Loc = tuple[str | int, ...]


@dataclass(frozen=True)
class _Pos:
    key_line: int | None  # line of the mapping key, when the value is a mapping entry
    value_line: int


class _Rejected(Exception):
    def __init__(self, message: str, line: int) -> None:
        super().__init__(message)
        self.line = line


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses what a job spec never needs, before it is constructed."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        line = event.start_mark.line + 1
        if isinstance(event, yaml.AliasEvent):
            raise _Rejected("YAML aliases (*name) are not allowed in a job spec", line)
        anchor = getattr(event, "anchor", None)
        if anchor is not None:
            raise _Rejected(f"YAML anchors (&{anchor}) are not allowed in a job spec", line)
        tag = getattr(event, "tag", None)
        implicit = getattr(event, "implicit", True)  # (plain, quoted) for scalars, a bool for collections
        explicit = not any(implicit) if isinstance(implicit, tuple) else not implicit
        if tag is not None and explicit:
            raise _Rejected(f"YAML tags ({tag}) are not allowed in a job spec", line)
        if self._depth >= MAX_DEPTH:
            raise _Rejected(f"nested more than {MAX_DEPTH} levels deep; a job spec never is", line)
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _positions(node: yaml.Node, loc: Loc = ()) -> dict[Loc, _Pos]:
    """Map each field path in the document to its line numbers; reject duplicate and non-string keys."""
    out: dict[Loc, _Pos] = {loc: _Pos(None, node.start_mark.line + 1)}
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for key_node, value_node in node.value:
            key_line = key_node.start_mark.line + 1
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag != "tag:yaml.org,2002:str":
                raise _Rejected(f"keys must be plain strings, not {key_node.value!r}", key_line)
            key = key_node.value
            if key in seen:
                raise _Rejected(f"key {key!r} appears twice (first on line {seen[key]})", key_line)
            seen[key] = key_line
            here = (*loc, key)
            child = _positions(value_node, here)
            child[here] = _Pos(key_line, value_node.start_mark.line + 1)
            out.update(child)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            out.update(_positions(item, (*loc, i)))
    return out


def parse_yaml(text: str, source: str) -> tuple[Any, dict[Loc, _Pos]]:
    """Parse YAML text into plain data and a map of field path -> lines. Raises SpecError."""
    if len(text.encode()) > MAX_SPEC_BYTES:
        raise SpecError(f"{source}: the file is larger than {MAX_SPEC_BYTES // 1024} KiB; a job spec never is")
    loader: _StrictLoader | None = None
    try:
        loader = _StrictLoader(text)  # the reader rejects control characters already here
        node = loader.get_single_node()
        if node is None:
            raise SpecError(f"{source}: the file is empty", hint="see `runner schema` for the fields of a job spec")
        positions = _positions(node)
        data = loader.construct_document(node)
    except _Rejected as exc:
        raise SpecError(f"{source}: unsafe or ambiguous YAML", [f"line {exc.line}: {exc}"]) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        what = ", ".join(p for p in (exc.context, exc.problem) if p)
        raise SpecError(f"{source}: not valid YAML", [f"{where}{what}"]) from None
    except yaml.reader.ReaderError as exc:
        line = text.count("\n", 0, exc.position) + 1
        char = f"U+{exc.character:04X}" if isinstance(exc.character, int) else repr(exc.character)
        raise SpecError(
            f"{source}: not valid YAML", [f"line {line}: the control character {char} is not allowed"]
        ) from None
    except yaml.YAMLError as exc:
        raise SpecError(f"{source}: not valid YAML", [" ".join(str(exc).split())]) from None
    except RecursionError:  # MAX_DEPTH stops this first; kept for a caller already deep in its own stack
        raise SpecError(f"{source}: nested too deeply to read; a job spec is a few levels deep") from None
    finally:
        if loader is not None:
            loader.dispose()
    if not isinstance(data, dict):
        raise SpecError(
            f"{source}: a job spec is a mapping of fields (name:, image:, training: ...), not a {type(data).__name__}"
        )
    return data, positions


def _model_at(loc: Loc) -> type[BaseModel] | None:
    """The pydantic model that describes the mapping at `loc`, walking JobSpec's field annotations."""
    model: Any = JobSpec
    for part in loc:
        if typing.get_origin(model) is dict:  # a map of models (secrets): any key holds its value type
            model = typing.get_args(model)[1]
            continue
        if not (isinstance(model, type) and issubclass(model, BaseModel)) or not isinstance(part, str):
            return None
        field = next((f for name, f in model.model_fields.items() if (f.alias or name) == part), None)
        if field is None:
            return None
        model = _unwrap(field.annotation)
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def _unwrap(annotation: Any) -> Any:
    """Optional[Model] -> Model; other annotations unchanged."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return args[0] if len(args) == 1 else annotation
    return annotation


def _clean_loc(loc: Loc, data: Any) -> Loc:
    """Drop pydantic's union/validator labels ('str', 'function-after[...]') that are not in the document."""
    out: list[str | int] = []
    node = data
    for part in loc:
        if isinstance(node, dict) and part in node:
            node = node[part]
            out.append(part)
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            node = node[int(part)]
            out.append(part)
        elif isinstance(node, dict) and isinstance(part, str) and _model_at(tuple(out)) is not None:
            out.append(part)  # a missing field of a model: keep it, it names what is missing
            node = None
    return tuple(out)


def format_loc(loc: Loc) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text or "(top level)"


def _describe(error: Any, loc: Loc) -> str:
    kind = error["type"]
    if kind == "extra_forbidden":
        model = _model_at(loc[:-1])
        known = [f.alias or name for name, f in model.model_fields.items()] if model else []
        key = str(loc[-1])
        # 'lr' -> learning_rate: an abbreviation by initials is as likely a typo as a misspelling.
        initials = [k for k in known if "_" in k and "".join(w[0] for w in k.split("_")) == key.lower()]
        close = initials or difflib.get_close_matches(key, known, n=1, cutoff=0.6)
        suggestion = f"; did you mean {close[0]!r}?" if close else f"; known fields: {', '.join(known)}"
        return f"unknown field{suggestion}"
    if kind == "missing":
        return "required field is missing"
    value = error.get("input")
    if kind == "value_error":
        return error["msg"].removeprefix("Value error, ")
    if kind == "string_pattern_mismatch":
        pattern = (error.get("ctx") or {}).get("pattern")
        meaning = PATTERN_MEANINGS.get(pattern) if isinstance(pattern, str) else None
        return f"{value!r} {meaning or 'has the wrong form: ' + str(pattern)}"
    message = error["msg"]
    if not isinstance(value, dict | list):
        message += f" (got {value!r})"
    return message


def validate_data(
    data: dict[str, Any], positions: dict[Loc, _Pos], source: str, labels: dict[Loc, str] | None = None
) -> JobSpec:
    """Validate parsed data; every problem located by its line, or by `labels` (a --set override) for the paths
    that came from elsewhere."""
    labels = labels or {}
    try:
        return JobSpec.model_validate(data)
    except RecursionError:  # data built by a caller, not by parse_yaml (which bounds the depth)
        raise SpecError(f"{source}: nested too deeply to validate; a job spec is a few levels deep") from None
    except ValidationError as exc:
        problems: list[tuple[int, str]] = []
        for error in exc.errors():
            loc = _clean_loc(tuple(error["loc"]), data)
            pos = positions.get(loc)
            if pos is None:  # a missing field: point at the mapping that lacks it
                parent = loc[:-1]
                while parent not in positions and parent:
                    parent = parent[:-1]
                pos = positions.get(parent, _Pos(None, 1))
            line = pos.key_line or pos.value_line
            label = next((labels[loc[:n]] for n in range(len(loc), 0, -1) if loc[:n] in labels), None)
            where = label or f"line {line}"
            problems.append((0 if label else line, f"{where}: {format_loc(loc)}: {_describe(error, loc)}"))
        problems.sort(key=lambda p: p[0])
        count = len(problems)
        raise SpecError(
            f"{source}: {count} problem{'s' if count != 1 else ''} in the job spec",
            [text for _, text in problems],
            hint="`runner schema` prints every field with its type and description",
        ) from None


def load_spec_text(text: str, source: str = "<spec>", overrides: list[str] | None = None) -> JobSpec:
    data, positions = parse_yaml(text, source)
    labels = apply_overrides(data, overrides or [], source)
    return validate_data(data, positions, source, labels)


def apply_overrides(data: dict[str, Any], overrides: list[str], source: str) -> dict[Loc, str]:
    """`--set training.epochs=1`-style overrides applied to parsed spec data (the value is a YAML scalar or flow
    collection, read by the same strict loader), before validation, so they are validated exactly like the file.
    Returns the label of each overridden path, for the problems that name it."""
    labels: dict[Loc, str] = {}
    for item in overrides:
        path, eq, raw = item.partition("=")
        keys = [k for k in path.strip().split(".")]
        if not eq or not all(keys) or not all(k.replace("_", "").isalnum() for k in keys):
            raise SpecError(f"--set {item!r}: write it as FIELD.PATH=VALUE, e.g. training.epochs=1")
        value, _ = parse_yaml(f"v: {raw}" if raw.strip() else 'v: ""', f"--set {path}")
        node: Any = data
        for key in keys[:-1]:
            child = node.get(key)
            if child is None:
                child = node[key] = {}
            if not isinstance(child, dict):
                raise SpecError(f"--set {item!r}: {key} is not a section of the spec ({source})")
            node = child
        node[keys[-1]] = value["v"]
        labels[tuple(keys)] = f"--set {path}={raw}"
    return labels


def shown(path: str | Path) -> str:
    """A path as a message shows it: quoted when it holds a newline, another control character or an undecodable
    byte, which would break the one-line error (or make the terminal refuse to print it)."""
    text = str(path)
    return text if text.isprintable() else ascii(text)


_NOT_REGULAR = [
    (stat.S_ISFIFO, "a named pipe (FIFO)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
]


def _refuse_unless_regular(mode: int, name: str) -> None:
    if stat.S_ISDIR(mode):
        raise SpecError(f"{name}: is a directory, not a job spec file")
    if not stat.S_ISREG(mode):
        kind = next((what for test, what in _NOT_REGULAR if test(mode)), "not a regular file")
        raise SpecError(f"{name}: is {kind}, not a job spec file", hint="a job spec is a YAML file")


def read_spec_bytes(path: str | Path) -> bytes:
    """The file's bytes; SpecError if it is not a regular file or is over MAX_SPEC_BYTES.

    The path is checked with stat() before it is opened, because opening has effects of its own on some special
    files (a FIFO blocks until a writer comes, a device may act on open). It is then opened non-blocking and
    checked again on the open descriptor, so that a file swapped for a FIFO in between is refused all the same.
    At most MAX_SPEC_BYTES + 1 bytes are read, whatever its size says: /proc files say 0, a file may grow."""
    name = shown(path)
    too_large = SpecError(f"{name}: the file is larger than {MAX_SPEC_BYTES // 1024} KiB; a job spec never is")
    try:
        _refuse_unless_regular(os.stat(path).st_mode, name)
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    except (FileNotFoundError, NotADirectoryError):
        raise SpecError(f"{name}: no such file") from None
    except OSError as exc:
        raise SpecError(f"{name}: cannot be read ({exc.strerror})") from None
    except ValueError:  # a NUL byte in the path (an API caller: argv cannot hold one)
        raise SpecError(f"{name}: not a valid file name") from None
    with os.fdopen(fd, "rb") as f:
        try:
            info = os.fstat(f.fileno())
            _refuse_unless_regular(info.st_mode, name)
            if info.st_size > MAX_SPEC_BYTES:
                raise too_large
            raw = f.read(MAX_SPEC_BYTES + 1)
        except OSError as exc:
            raise SpecError(f"{name}: cannot be read ({exc.strerror})") from None
    if len(raw) > MAX_SPEC_BYTES:
        raise too_large
    return raw


def load_spec(path: str | Path, overrides: list[str] | None = None) -> JobSpec:
    """Load and validate a job spec file, with `--set` overrides. Raises SpecError (exit 2) listing every problem."""
    name = shown(path)
    raw = read_spec_bytes(path)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(f"{name}: not UTF-8 text (byte {exc.start})", hint="a job spec is a YAML text file") from None
    return load_spec_text(text, name, overrides)


def dump_spec(spec: JobSpec) -> str:
    """The resolved spec as YAML (every default filled in), as written to the run directory."""
    return yaml.safe_dump(spec.model_dump(mode="json", by_alias=True), sort_keys=False)
