"""What the Compute Engine emulator's test modules share: real google-cloud-compute clients (REST transport) pointed
at the emulator, the requests a TPU VM runner sends, and waiting on operations the way a client must: through
zoneOperations.wait, in a loop, since a wait may return before the operation is DONE."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from google.auth.credentials import AnonymousCredentials
from google.cloud import compute_v1

from tpu_emulator import TpuEmulator

PROJECT = "rehearsal"
ZONE = "us-central1-c"  # TPU7x
REGION = "us-central1"
IMAGE = "projects/ubuntu-os-accelerator-images/global/images/family/ubuntu-accelerator-2404-amd64"  # unconfirmed
CLOUD_PLATFORM = "https://www.googleapis.com/auth/cloud-platform"


@contextmanager
def quick_emulator(tmp_path: Path, **options: Any) -> Iterator[TpuEmulator]:
    settings = {"create_delay_s": 0.4, "delete_delay_s": 0.2, "vm_grace_s": 0.5, "compute_wait_s": 0.3, **options}
    with TpuEmulator(workdir=tmp_path / "emu", **settings) as emulator:
        yield emulator


class Clients:
    """The google-cloud-compute clients a Compute Engine backend uses, on the emulator's endpoint."""

    def __init__(self, endpoint: str) -> None:
        options = {
            "transport": "rest",
            "credentials": AnonymousCredentials(),
            "client_options": {"api_endpoint": endpoint},
        }
        self.instances = compute_v1.InstancesClient(**options)
        self.zone_ops = compute_v1.ZoneOperationsClient(**options)
        self.region_ops = compute_v1.RegionOperationsClient(**options)
        self.global_ops = compute_v1.GlobalOperationsClient(**options)
        self.templates = compute_v1.InstanceTemplatesClient(**options)
        self.policies = compute_v1.ResourcePoliciesClient(**options)
        self.groups = compute_v1.InstanceGroupManagersClient(**options)
        self.resize_requests = compute_v1.InstanceGroupManagerResizeRequestsClient(**options)
        self.machine_types = compute_v1.MachineTypesClient(**options)

    def wait(self, operation: Any, *, zone: str = ZONE, timeout_s: float = 30.0) -> compute_v1.Operation:
        """Until the operation is DONE (zonal, regional or global by its own links), looping over wait calls."""
        name = operation.name
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if operation.zone:
                op = self.zone_ops.wait(project=PROJECT, zone=operation.zone.rsplit("/", 1)[-1], operation=name)
            elif operation.region:
                op = self.region_ops.wait(project=PROJECT, region=operation.region.rsplit("/", 1)[-1], operation=name)
            else:
                op = self.global_ops.wait(project=PROJECT, operation=name)
            if op.status == compute_v1.Operation.Status.DONE:
                return op
        raise AssertionError(f"operation {name} not DONE in {timeout_s}s")


def scheduling(model: str = "STANDARD", **fields: Any) -> compute_v1.Scheduling:
    return compute_v1.Scheduling(provisioning_model=model, on_host_maintenance="TERMINATE", **fields)


def properties(
    machine: str = "tpu7x-standard-4t",
    *,
    sched: compute_v1.Scheduling | None = None,
    script: str | None = None,
    labels: dict[str, str] | None = None,
    zone: str | None = ZONE,
) -> dict[str, Any]:
    """An instance's (zone given) or a template's (zone None) properties, as a TPU VM runner would send them."""
    items = [compute_v1.Items(key="startup-script", value=script)] if script is not None else []
    return {
        "machine_type": f"zones/{zone}/machineTypes/{machine}" if zone else machine,
        "disks": [
            compute_v1.AttachedDisk(
                boot=True,
                auto_delete=True,
                initialize_params=compute_v1.AttachedDiskInitializeParams(
                    source_image=IMAGE, disk_size_gb=100, disk_type="hyperdisk-balanced"
                ),
            )
        ],
        "network_interfaces": [
            compute_v1.NetworkInterface(access_configs=[compute_v1.AccessConfig(name="External NAT")])
        ],
        "scheduling": sched or scheduling(),
        "metadata": compute_v1.Metadata(items=items),
        "labels": labels or {"managed-by": "tpu-runner", "tpu-runner-run": "rehearsal-run"},
        "service_accounts": [compute_v1.ServiceAccount(email="default", scopes=[CLOUD_PLATFORM])],
    }


def instance(name: str, **kwargs: Any) -> compute_v1.Instance:
    return compute_v1.Instance(name=name, **properties(**kwargs))


def spot(**fields: Any) -> compute_v1.Scheduling:
    return scheduling("SPOT", automatic_restart=False, **fields)
