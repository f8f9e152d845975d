"""The control plane's own start and stop, outside the session's cluster: ready on /readyz, and nothing left
running after stop (the processes are checked by pid, not by name)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.kubecluster import GROUP, unavailable
from tpu_emulator.kube import binaries
from tpu_emulator.kube.cluster import ClusterError, KubeCluster

pytestmark = GROUP


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/status")
    return not (status.exists() and "\nState:\tZ" in status.read_text())


def test_etcd_and_the_api_server_start_and_leave_nothing_behind(tmp_path: Path) -> None:
    if isinstance(found := binaries.find(), str):
        unavailable(found)
    cluster = KubeCluster(tmp_path, scheduler=False, controllers=(), crds=())
    with cluster:
        pids = cluster.pids()
        assert len(pids) == 2  # etcd, kube-apiserver
        assert cluster.get("/version")["gitVersion"] == "v1.20.2"
        assert cluster.kubeconfig.is_file()
    assert not [pid for pid in pids if _alive(pid)]


def test_a_missing_build_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(binaries.CACHE_ENV, str(tmp_path / "empty"))
    with pytest.raises(ClusterError, match="make kube"):
        KubeCluster(tmp_path)
