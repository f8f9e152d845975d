"""What the compute-engine backend decides without a server: its state map covers every Instance.status Compute
Engine's schema names, and its handles round-trip through a run record by kind."""

from __future__ import annotations

import pytest

from runner.backends.base import MachineState
from runner.backends.compute_engine.handles import GroupHandle, InstanceHandle, handle_of
from runner.backends.compute_engine.instances import STATES
from runner.errors import StorageError
from tpu_emulator import discovery


def test_every_instance_status_of_compute_v1_json_is_mapped() -> None:
    compute = discovery.load("compute.v1.json")
    if compute is None:
        pytest.skip("google-api-python-client (a dev dependency) is not installed")
    statuses = set(compute.schemas["Instance"]["properties"]["status"]["enum"])
    assert statuses == set(STATES), statuses ^ set(STATES)
    assert STATES["RUNNING"] == MachineState.RUNNING
    assert {s for s, m in STATES.items() if m == MachineState.CREATING} == {
        "PROVISIONING",
        "STAGING",
        "PENDING",
        "REPAIRING",
    }


def test_handles_round_trip_by_kind() -> None:
    single = InstanceHandle("p", "us-central1-c", "vm", nonce="n")
    group = GroupHandle("p", "us-central1-c", "g", "g-tpl", "g-policy", "g-flex", nonce="n")
    assert handle_of(single.to_dict()) == single
    assert handle_of(group.to_dict()) == group and group.region == "us-central1"
    assert handle_of({**group.to_dict(), "added_later": 1}) == group  # a newer runner's field is ignored
    with pytest.raises(StorageError):
        handle_of({"kind": "node", "project": "p", "zone": "z", "node_id": "n"})  # a TPU VM's
    with pytest.raises(StorageError):
        handle_of({"kind": "instance group", "project": "p"})  # what a delete needs is missing
