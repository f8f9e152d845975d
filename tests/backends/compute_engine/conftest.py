"""The compute-engine backend against the Compute Engine emulator (a real local server) through the real
google-cloud-compute client, pointed at it by $RUNNER_COMPUTE_ENDPOINT as a user would point it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from runner.backends.compute_engine.api import ENDPOINT_ENV
from runner.backends.compute_engine.backend import ComputeEngineBackend
from runner.timings import Timings
from tests.emulator.compute import Clients, quick_emulator
from tpu_emulator import TpuEmulator

QUICK = Timings(api_poll_s=0.1, api_backoff_s=0.1, api_retry_initial_s=0.05, api_retry_deadline_s=5.0)


@pytest.fixture
def emulator(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[TpuEmulator]:
    with quick_emulator(tmp_path) as emu:
        monkeypatch.setenv(ENDPOINT_ENV, emu.endpoint)
        yield emu


@pytest.fixture
def said() -> list[str]:
    return []


@pytest.fixture
def backend(emulator: TpuEmulator, said: list[str]) -> ComputeEngineBackend:
    return ComputeEngineBackend(say=said.append, timings=QUICK, delete_timeout_s=30.0)


@pytest.fixture
def gce(emulator: TpuEmulator) -> Clients:
    return Clients(emulator.endpoint)
