"""The submitting runner's own heartbeat in the run directory (`runner-heartbeat`)."""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time

from runner import contract
from runner.errors import RunnerError
from runner.storage import Storage

log = logging.getLogger(__name__)


class RunnerHeartbeat:
    """While the runner watches, `runner-heartbeat` in the run directory says so (every `every_s`). A run that set
    teardown.runner_heartbeat_timeout stops itself, and its VM goes, when this stops for longer than that."""

    def __init__(self, storage: Storage, every_s: float = 30.0) -> None:
        self.storage, self.every_s = storage, every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._failing = False

    @staticmethod
    def write(storage: Storage) -> None:
        beat = {"time": round(time.time(), 3), "pid": os.getpid(), "host": socket.gethostname()}
        storage.write_bytes(contract.RUNNER_HEARTBEAT, json.dumps(beat).encode())

    def _beat(self) -> None:
        try:
            self.write(self.storage)
            self._failing = False
        except RunnerError as exc:
            if not self._failing:  # once per outage: the follower says the rest
                log.warning("could not write the runner heartbeat: %s", exc)
            self._failing = True

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self._beat()

    def __enter__(self) -> RunnerHeartbeat:
        self._beat()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
