"""The start-up cache: what a trainer's start makes that the next start on this machine can reuse, instead of making
it again on every run (the CPU calibration of perf.py, JAX's compiled programs).

It lives under the runner's cache directory ($RUNNER_CACHE_DIR, else ~/.cache/tpu-runner/startup; a local run's
container gets it mounted read-write). An entry is one JSON file per key, named by the key's digest and holding the
key itself: the key is everything the value depends on, so a change of any part is another file, and the value is
made again. Files appear by rename (two runs starting at once each write a whole file, the last one stays), and a
file that cannot be read, is not JSON, or holds another key is ignored and written over: the cache can make a start
faster, never fail one.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from runner import contract
from runner.storage.local import write_atomic

Key = Mapping[str, Any]  # JSON values only: it is written beside the value and compared on reading


def cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """$RUNNER_CACHE_DIR, else $XDG_CACHE_HOME/tpu-runner/startup, else ~/.cache/tpu-runner/startup."""
    env = os.environ if environ is None else environ
    if env.get(contract.CACHE_DIR):
        return Path(env[contract.CACHE_DIR])
    from runner.datasets import cache_root

    return cache_root() / "startup"


def _normal(key: Key) -> Any:
    return json.loads(json.dumps(key, sort_keys=True))


def entry_path(kind: str, key: Key, root: Path | None = None) -> Path:
    digest = hashlib.sha256(json.dumps(_normal(key), sort_keys=True).encode()).hexdigest()[:32]
    return (root or cache_dir()) / kind / f"{digest}.json"


def read(kind: str, key: Key, root: Path | None = None) -> dict[str, Any] | None:
    """The value stored under `key`, or None: none yet, unreadable, damaged, or written for another key."""
    try:
        data = json.loads(entry_path(kind, key, root).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("key") != _normal(key) or not isinstance(data.get("value"), dict):
        return None
    value: dict[str, Any] = data["value"]
    return value


def write(kind: str, key: Key, value: Mapping[str, Any], root: Path | None = None) -> bool:
    """Store `value` under `key`; False when it cannot be written (a read-only directory): the run goes on."""
    try:
        data = json.dumps({"key": _normal(key), "value": value}, indent=1, sort_keys=True).encode()
        write_atomic(entry_path(kind, key, root), data)  # a temporary file of its own, then a rename
    except (OSError, TypeError, ValueError):
        return False
    return True
