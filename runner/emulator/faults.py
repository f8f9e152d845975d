"""Injected faults: what goes wrong next, and how many times.

Each fault has a kind, a filter (zone, permission pattern, method, path regex, image pattern) and a count: the
number of times it still fires, or None for "until cleared". Taking a fault that matches uses one count up;
a fault whose count reaches zero is gone. All of it is thread-safe: request threads, the scheduler and the
admin API share one registry.
"""

from __future__ import annotations

import fnmatch
import itertools
import re
import threading
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal, get_args

Kind = Literal["stockout", "quota", "permission", "http", "slow_create", "missing_image"]
KINDS: tuple[str, ...] = get_args(Kind)
_FIELDS = ("zone", "count", "message", "quota", "limit", "permission", "status", "method", "path", "seconds", "image")


@dataclass(frozen=True)
class Fault:
    kind: Kind
    id: int = 0
    count: int | None = None  # times it still fires; None: until cleared
    zone: str | None = None  # stockout, quota, slow_create: None matches every zone
    message: str | None = None  # overrides the default message (stockout, quota, http)
    quota: str | None = None  # quota: the quota's name; derived from the accelerator type when None
    limit: int = 0  # quota: the limit the message reports
    permission: str = "tpu.nodes.create"  # permission: the denied permission (fnmatch pattern, e.g. tpu.*)
    status: int = 503  # http: the status to answer with
    method: str | None = None  # http: only requests with this method
    path: str | None = None  # http: only requests whose path matches this regular expression
    seconds: float = 0.0  # slow_create: how long CREATING lasts
    image: str = "*"  # missing_image: image names (fnmatch pattern) that `docker pull` cannot find

    def matches(self, **ctx: Any) -> bool:
        if self.kind in ("stockout", "quota", "slow_create"):
            return self.zone is None or self.zone == ctx.get("zone")
        if self.kind == "permission":
            return fnmatch.fnmatchcase(ctx.get("permission", ""), self.permission)
        if self.kind == "http":
            if self.method and self.method.upper() != ctx.get("method", "").upper():
                return False
            return self.path is None or re.search(self.path, ctx.get("path", "")) is not None
        if self.kind == "missing_image":
            image, pattern = ctx.get("image", ""), self.image
            if ctx.get("registry"):
                # The registry sees REPO/IMAGE:TAG; a fault names the full reference, with its registry host.
                host, _, rest = pattern.partition("/")
                pattern = rest if rest and ("." in host or ":" in host) else pattern
            return fnmatch.fnmatchcase(image, pattern) or fnmatch.fnmatchcase(image, pattern + ":*")
        return False

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}


def fault_from_json(kind: str, data: dict[str, Any]) -> Fault:
    """A fault from the admin API's JSON body; raises ValueError for an unknown kind or field."""
    if kind not in KINDS:
        raise ValueError(f"unknown fault kind {kind!r}; known: {', '.join(KINDS)}")
    unknown = sorted(set(data) - set(_FIELDS))
    if unknown:
        raise ValueError(f"unknown field(s) for a {kind} fault: {', '.join(unknown)}; known: {', '.join(_FIELDS)}")
    fault = Fault(kind, **data)  # type: ignore[arg-type]
    if fault.count is not None and (not isinstance(fault.count, int) or fault.count < 1):
        raise ValueError("count must be a positive integer (or absent: until cleared)")
    if kind == "http" and not (isinstance(fault.status, int) and 400 <= fault.status <= 599):
        raise ValueError("status must be an HTTP error status, 400-599")
    if kind == "slow_create" and not (isinstance(fault.seconds, int | float) and fault.seconds >= 0):
        raise ValueError("seconds must be a number >= 0")
    if fault.path is not None:
        re.compile(fault.path)
    return fault


class Faults:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._faults: list[Fault] = []
        self._ids = itertools.count(1)

    def add(self, fault: Fault) -> Fault:
        with self._lock:
            fault = replace(fault, id=next(self._ids))
            self._faults.append(fault)
            return fault

    def take(self, kind: Kind, **ctx: Any) -> Fault | None:
        """The first fault of `kind` matching `ctx`, one count used up; None if there is none."""
        with self._lock:
            for i, fault in enumerate(self._faults):
                if fault.kind == kind and fault.matches(**ctx):
                    if fault.count is not None:
                        if fault.count <= 1:
                            del self._faults[i]
                        else:
                            self._faults[i] = replace(fault, count=fault.count - 1)
                    return fault
            return None

    def peek(self, kind: Kind, **ctx: Any) -> Fault | None:
        """Like take, without using a count up."""
        with self._lock:
            return next((f for f in self._faults if f.kind == kind and f.matches(**ctx)), None)

    def remove(self, fault_id: int) -> bool:
        with self._lock:
            before = len(self._faults)
            self._faults = [f for f in self._faults if f.id != fault_id]
            return len(self._faults) < before

    def clear(self, kind: str | None = None) -> None:
        with self._lock:
            self._faults = [f for f in self._faults if kind is not None and f.kind != kind]

    def list(self) -> list[Fault]:
        with self._lock:
            return list(self._faults)
