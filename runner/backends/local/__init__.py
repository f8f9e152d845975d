"""The local backend: the job's container, or its entrypoint as a process, on this machine (`--local`).

The registry's names (runner.backends): INFO and make(); the machinery is in backend.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from runner.backends import BackendInfo
from runner.timings import Timings

if TYPE_CHECKING:
    from runner.backends.base import Backend

INFO = BackendInfo(
    "local", "this machine", bills=False, no_cost="a local run pays for no TPU", ready="started", pulls_image=False
)


def make(say: Callable[[str], None], timings: Timings, *, process: bool = False) -> Backend[Any]:
    """`process`: run the entrypoint as a process even where a container engine is there (--process)."""
    from runner.backends.local.backend import LocalBackend

    return LocalBackend(prefer="process" if process else None, say=say)
