"""Lifecycle: one run, start to end, as explicit phases (run), and the runner's own deadlines while it follows a
machine (watchdog). `submit` is the entry point the CLI calls."""

from runner.lifecycle.run import Outcome, submit

__all__ = ["Outcome", "submit"]
