"""The environment a test gives the processes it starts: this one's, without the runner's settings."""

from __future__ import annotations

import os

from runner import contract


def child_env(*drop: str) -> dict[str, str]:
    """os.environ without RUNNER_* (and the prefixes in `drop`), keeping RUNNER_CACHE_DIR: the suite's start-up cache
    (tests/conftest.py), so that no test writes to the user's own, nor calibrates the user's machine under the suite's
    load."""
    return {k: v for k, v in os.environ.items() if k == contract.CACHE_DIR or not k.startswith(("RUNNER_", *drop))}
