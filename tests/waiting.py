"""Waiting for what another process, thread or server does: the suite's one poll loop."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import pytest

T = TypeVar("T")


def wait_for(predicate: Callable[[], T], what: str = "a condition", timeout: float = 120.0, poll_s: float = 0.05) -> T:
    """The predicate's first truthy answer, asked every `poll_s`; the test fails, naming `what`, after `timeout`.
    The interval is short beside every window a test waits to see (an epoch lasts 0.6 s or more on the fastest CPU
    the suite meets), and long enough that a predicate calling an emulator does not become its load."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(poll_s)
    pytest.fail(f"timed out after {timeout:g} s waiting for {what}")
