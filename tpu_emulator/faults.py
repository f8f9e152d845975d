"""Injected faults: what goes wrong next, and how many times.

Each fault has a kind, a filter (zone and node id, permission pattern, method, path regex, image pattern) and a
count: the number of times it still fires, or None for "until cleared". Taking a fault that matches uses one count
up; a fault whose count reaches zero is gone. All of it is thread-safe: request threads, the scheduler and the
admin API share one registry.
"""

from __future__ import annotations

import fnmatch
import itertools
import re
import threading
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal, get_args

from tpu_emulator.errors import GRPC_CODE

Kind = Literal[
    "stockout",
    "quota",
    "permission",
    "http",
    "rate_limit",
    "slow_create",
    "missing_image",
    "delete_fails",
    "slow_delete",
    "collision",
    "boot_hang",
    "drop_env",
    "queued_fails",
    "clock_skew",
    "late_operation",
]
KINDS: tuple[str, ...] = get_args(Kind)
_FIELDS = (
    "zone",
    "count",
    "message",
    "quota",
    "limit",
    "permission",
    "status",
    "method",
    "path",
    "seconds",
    "image",
    "reason",
    "in_operation",
    "node",
    "labels",
    "env",
)
# Kinds filtered by zone (None: every zone) and node id (an fnmatch pattern).
_ZONED = (
    "stockout",
    "quota",
    "slow_create",
    "delete_fails",
    "slow_delete",
    "collision",
    "boot_hang",
    "queued_fails",
    "clock_skew",
    "late_operation",
)
# The labels a collision's node carries by default: another run's, as the runner labels its nodes.
OTHER_RUN_LABELS = {"managed-by": "tpu-runner", "tpu-runner-run": "another-run"}


@dataclass(frozen=True)
class Fault:
    kind: Kind
    id: int = 0
    count: int | None = None  # times it still fires; None: until cleared
    zone: str | None = None  # zoned kinds: None matches every zone
    node: str = "*"  # zoned kinds: node ids (fnmatch pattern) it applies to
    message: str | None = None  # overrides the default message (any kind that answers an error)
    reason: str | None = None  # stockout, quota, delete_fails: the ErrorInfo reason to add (see errors.py)
    quota: str | None = None  # quota: the quota's name; derived from the accelerator type when None
    limit: int = 0  # quota: the limit the message reports
    in_operation: bool = False  # quota: accept the create, then fail its operation (code 8), not a 429 at once
    permission: str = "tpu.nodes.create"  # permission: the denied permission (fnmatch pattern, e.g. tpu.*)
    status: int | str | None = None  # http: the HTTP status (503); delete_fails, queued_fails: a status name or code
    method: str | None = None  # http, rate_limit: only requests with this method
    path: str | None = None  # http, rate_limit: only requests whose path matches this regular expression
    seconds: float | None = None  # slow_create, slow_delete: how long CREATING/DELETING last; delete_fails: too;
    # late_operation: how long after the machine is up its create operation ends;
    # clock_skew: how far the VMs' clocks are ahead (negative: behind), in whole seconds
    image: str = "*"  # missing_image, drop_env: image names (fnmatch pattern) it applies to
    labels: dict[str, str] | None = None  # collision: labels of the node that is there first
    env: tuple[str, ...] | None = None  # drop_env: names (fnmatch patterns) `docker run` leaves out of the container

    def matches(self, **ctx: Any) -> bool:
        if self.kind in _ZONED:
            if self.zone is not None and self.zone != ctx.get("zone"):
                return False
            return "node" not in ctx or fnmatch.fnmatchcase(ctx["node"], self.node)
        if self.kind == "permission":
            return fnmatch.fnmatchcase(ctx.get("permission", ""), self.permission)
        if self.kind in ("http", "rate_limit"):
            if self.method and self.method.upper() != ctx.get("method", "").upper():
                return False
            return self.path is None or re.search(self.path, ctx.get("path", "")) is not None
        if self.kind == "drop_env":
            image = ctx.get("image", "")
            return fnmatch.fnmatchcase(image, self.image) or fnmatch.fnmatchcase(image, self.image + ":*")
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


def _check(fault: Fault) -> None:
    """Raise ValueError for fields this kind cannot use."""
    if fault.count is not None and (not isinstance(fault.count, int) or fault.count < 1):
        raise ValueError("count must be a positive integer (or absent: until cleared)")
    if fault.kind == "http" and not (isinstance(fault.status, int) and 400 <= fault.status <= 599):
        raise ValueError("status must be an HTTP error status, 400-599")
    if fault.kind in ("delete_fails", "queued_fails"):
        status = fault.status
        if isinstance(status, int) and not 1 <= status <= 16:
            raise ValueError("status must be a gRPC code 1-16 or a canonical name such as INTERNAL")
        if isinstance(status, str) and status not in GRPC_CODE:
            raise ValueError(f"status must be a gRPC code 1-16 or one of {', '.join(GRPC_CODE)}")
    elif fault.status is not None and fault.kind != "http":
        raise ValueError(f"status is for http, delete_fails and queued_fails faults, not {fault.kind}")
    if fault.kind in ("slow_create", "slow_delete", "clock_skew", "late_operation") and fault.seconds is None:
        raise ValueError(f"a {fault.kind} fault needs seconds")
    if fault.kind == "clock_skew":
        if isinstance(fault.seconds, bool) or not isinstance(fault.seconds, int | float) or fault.seconds % 1:
            raise ValueError("a clock_skew fault's seconds must be a whole number (negative: the clock is behind)")
    elif fault.seconds is not None and not (isinstance(fault.seconds, int | float) and fault.seconds >= 0):
        raise ValueError("seconds must be a number >= 0")
    if fault.labels is not None and not (
        isinstance(fault.labels, dict) and all(isinstance(v, str) for v in fault.labels.values())
    ):
        raise ValueError("labels must be an object of strings")
    if fault.kind == "drop_env" and not (
        isinstance(fault.env, tuple) and fault.env and all(isinstance(n, str) and n for n in fault.env)
    ):
        raise ValueError("a drop_env fault needs env: a non-empty list of variable names (fnmatch patterns)")
    if fault.env is not None and fault.kind != "drop_env":
        raise ValueError(f"env is for drop_env faults, not {fault.kind}")
    if fault.path is not None:
        re.compile(fault.path)


def fault_from_json(kind: str, data: dict[str, Any]) -> Fault:
    """A fault from the admin API's JSON body; raises ValueError for an unknown kind or field."""
    if kind not in KINDS:
        raise ValueError(f"unknown fault kind {kind!r}; known: {', '.join(KINDS)}")
    unknown = sorted(set(data) - set(_FIELDS))
    if unknown:
        raise ValueError(f"unknown field(s) for a {kind} fault: {', '.join(unknown)}; known: {', '.join(_FIELDS)}")
    all_defaults: dict[str, dict[str, Any]] = {
        "http": {"status": 503},
        "delete_fails": {"status": "INTERNAL"},
        "queued_fails": {"status": "INTERNAL"},
    }
    defaults = all_defaults.get(kind, {})
    if isinstance(data.get("env"), list):  # JSON has lists; the fault is frozen
        data = {**data, "env": tuple(data["env"])}
    fault = Fault(kind, **{**defaults, **data})  # type: ignore[arg-type]
    _check(fault)
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
