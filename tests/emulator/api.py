"""What the emulator's API test modules share: the zone they rehearse in, polling fast enough for an emulator whose
creates and deletes take a fraction of a second, and a real google-cloud-tpu client pointed at it."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from google.api_core.future import polling
from google.auth.credentials import AnonymousCredentials
from google.cloud import tpu_v2

from tpu_emulator import TpuEmulator

PROJECT = "rehearsal"
ZONE = "us-central2-b"  # v4, single and multi host
PARENT = f"projects/{PROJECT}/locations/{ZONE}"
RUNTIME = "tpu-ubuntu2204-base"
FAST = polling.DEFAULT_POLLING.with_delay(initial=0.05, maximum=0.2, multiplier=1.5).with_timeout(30)
OP_NAME = re.compile(r"^projects/[^/]+/locations/[^/]+/operations/[^/]+$")


@contextmanager
def quick_api_emulator(tmp_path: Path) -> Iterator[TpuEmulator]:
    """conftest's emulator, with creates and deletes short enough to keep a module fast."""
    with TpuEmulator(workdir=tmp_path / "emu", create_delay_s=0.2, delete_delay_s=0.1, vm_grace_s=0.5) as emulator:
        yield emulator


def tpu_client(emulator: TpuEmulator) -> tpu_v2.TpuClient:
    return tpu_v2.TpuClient(
        transport="rest", credentials=AnonymousCredentials(), client_options={"api_endpoint": emulator.endpoint}
    )
