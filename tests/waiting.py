"""Waiting for what another process, thread or server does: the suite's one poll loop."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import pytest

T = TypeVar("T")


def wait_for(predicate: Callable[[], T], what: str = "a condition", timeout: float = 120.0, poll_s: float = 0.05) -> T:
    """The predicate's first truthy answer, asked every `poll_s`; the test fails, naming `what`, after `timeout`.
    The default interval keeps a predicate that calls an emulator from becoming its load; a test that must catch a
    short window by reading a file (a step mid-epoch) asks more often."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(poll_s)
    pytest.fail(f"timed out after {timeout:g} s waiting for {what}")
