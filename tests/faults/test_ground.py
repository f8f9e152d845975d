"""What the fault suite says of a pod that outlived its run (faults.cluster.Ground.pods_described)."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from kubernetes import client

from faults.cluster import Ground
from tpu_emulator.kube.jobset import RESTARTS


def _pod(name: str, *, node: str | None, deleting: bool, owner: str | None) -> client.V1Pod:
    made = datetime(2026, 12, 6, 6, 35, 41, tzinfo=timezone.utc)
    owners = [client.V1OwnerReference(api_version="batch/v1", kind="Job", name=owner, uid="u")] if owner else None
    meta = client.V1ObjectMeta(
        name=name,
        labels={RESTARTS: "1"} if owner else None,
        owner_references=owners,
        creation_timestamp=made,
        deletion_timestamp=made.replace(second=50) if deleting else None,
    )
    return client.V1Pod(
        metadata=meta, spec=client.V1PodSpec(containers=[], node_name=node), status=client.V1PodStatus(phase="Running")
    )


def test_a_pod_left_is_described_by_who_made_it_and_what_holds_it(monkeypatch: Any) -> None:
    ground = Ground(kube=None, gke=None)
    pods = [
        _pod("run-slice-0-mlzzf", node="gke-node-1", deleting=True, owner="run-slice-0"),
        _pod("stray", node=None, deleting=False, owner=None),
    ]
    monkeypatch.setattr(ground, "pods", lambda namespace: pods)
    assert ground.pods_described("ns") == [
        "pod run-slice-0-mlzzf: Running, node gke-node-1, owned by Job run-slice-0, restart attempt 1, made 06:35:41, "
        "deletion asked 06:35:50",
        "pod stray: Running, node none, owned by no owner, restart attempt ?, made 06:35:41",
    ]
