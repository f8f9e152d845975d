"""A Cloud TPU API v2 emulator: a real local HTTP server for the real google-cloud-tpu client, whose VMs are local
processes running the node's startup-script; the same server emulates Compute Engine's API v1 for TPU VM instances
and managed instance groups (tpu_emulator.gce, the real google-cloud-compute client; `TpuEmulator.compute`). Both
check requests and answers against Google's discovery documents when google-api-python-client is installed
(tpu_emulator.discovery). See docs/emulator.md.

    with TpuEmulator(workdir=Path("emu")) as emulator:
        client = tpu_v2.TpuClient(transport="rest", credentials=AnonymousCredentials(),
                                  client_options={"api_endpoint": emulator.endpoint})

Importing this package is cheap; the server (and google-cloud-tpu's types) load on first use of TpuEmulator,
so the docker shim (tpu_emulator.docker_shim) starts fast inside the VMs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tpu_emulator.emulator import NodeInfo, TpuEmulator
    from tpu_emulator.faults import Fault
    from tpu_emulator.server import RecordedRequest
    from tpu_emulator.vm import VmInfo

__all__ = ["Fault", "NodeInfo", "RecordedRequest", "TpuEmulator", "VmInfo"]


def __getattr__(name: str) -> Any:
    if name in ("TpuEmulator", "NodeInfo"):
        from tpu_emulator import emulator

        return getattr(emulator, name)
    if name == "Fault":
        from tpu_emulator.faults import Fault

        return Fault
    if name == "RecordedRequest":
        from tpu_emulator.server import RecordedRequest

        return RecordedRequest
    if name == "VmInfo":
        from tpu_emulator.vm import VmInfo

        return VmInfo
    raise AttributeError(f"module 'tpu_emulator' has no attribute {name!r}")
