"""The gke backend's rehearsal: the session's real Kubernetes control plane (tests/kubecluster.py: one API server
for every test of the "kube" xdist group) as the API server of a GKE cluster that the GKE API emulator serves, and
the runner pointed at both the way a user's environment would point it at GKE."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cloudjobs import IMAGE
from tpu_emulator import TpuEmulator
from tpu_emulator.kube.forker import Forker

PROJECT = "test-project"
LOCATION = "us-central1"
CLUSTER = "tpu-cluster"
CLUSTER_PATH = f"projects/{PROJECT}/locations/{LOCATION}/clusters/{CLUSTER}"


@pytest.fixture(scope="module")
def gke_cluster(kube: Any) -> Iterator[Any]:
    """The GKE API emulator whose cluster test-project/us-central1/tpu-cluster is the rehearsal's API server: its
    node pools make and take away real Node objects there."""
    from tpu_emulator.gke.emulator import GkeEmulator

    with GkeEmulator(create_delay_s=0.2, delete_delay_s=0.1) as emulator:
        emulator.add_cluster(PROJECT, LOCATION, CLUSTER, kube)
        yield emulator


@pytest.fixture
def on_gke(cloud: TpuEmulator, gke_cluster: Any, kube: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The runner pointed at the GKE emulator (and the cluster's token), beside the other emulators (`cloud`: the
    image registry, Cloud Storage)."""
    monkeypatch.setenv("RUNNER_GKE_ENDPOINT", gke_cluster.endpoint)
    monkeypatch.setenv("RUNNER_GKE_TOKEN", kube.cluster.token)
    gke_cluster.faults.clear()  # a fault an earlier test left unused
    return gke_cluster


def gke_job(
    tmp_path: Path,
    bucket_url: str,
    namespace: str,
    body: str,
    *,
    name: str = "gke",
    type_: str = "v5p-16",
    zones: str = "[us-central1-a]",
    cluster: str = "",
) -> Path:
    path = tmp_path / f"{name}-{uuid.uuid4().hex[:4]}.yaml"
    path.write_text(
        f"name: {name}\nimage: {IMAGE}\nstorage: {bucket_url}\n"
        f"accelerator:\n  type: {type_}\n  backend: gke\n  project: {PROJECT}\n  zones: {zones}\n"
        f"  cluster: {{location: {LOCATION}, name: {CLUSTER}, namespace: {namespace}{cluster}}}\n" + body
    )
    return path


@pytest.fixture(scope="session")
def forker() -> Forker:
    return Forker()


def wait_file_command(marker: Path) -> str:
    """A job that runs until the test lets it end (the marker file): what a fault is injected under."""
    wait = f'[time.sleep(0.1) for _ in iter(lambda: os.path.exists("{marker}"), True)]'
    return f"command: [python, -c, 'import os, time; {wait}; print(\"released\")']\n"
