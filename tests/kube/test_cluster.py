"""The control plane's own start and stop, outside the session's cluster: ready on /readyz, and nothing left
running after stop or after the process that started it dies (the processes are checked by pid, not by name)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.environ import child_env
from tests.kubecluster import GROUP, unavailable
from tests.waiting import wait_for
from tpu_emulator.kube import binaries
from tpu_emulator.kube.cluster import ClusterError, KubeCluster

pytestmark = GROUP


def _alive(pid: int) -> bool:
    """Running, not a zombie; False once it is gone, which can happen between any two looks here (its reaper is
    not this process), so a look that finds nothing means gone."""
    try:
        os.kill(pid, 0)
        return "\nState:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except (ProcessLookupError, FileNotFoundError):
        return False


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


# A process with threads (as the test session is) starts a component, counting the times Python's fork handlers ran
# (a preexec_fn runs them, and JAX warns through them), then waits to be killed.
STARTER = """
import os, sys, threading
from pathlib import Path
from tpu_emulator.kube.cluster import Component
handlers = []
os.register_at_fork(before=lambda: handlers.append("fork"))
threading.Thread(target=threading.Event().wait, daemon=True).start()
component = Component("sleeper", ["sleep", "600"], Path(sys.argv[1]))
component.start()
print(component.popen.pid, len(handlers), flush=True)
threading.Event().wait()
"""


def test_a_component_runs_no_python_between_fork_and_exec_and_dies_with_its_starter(tmp_path: Path) -> None:
    starter = subprocess.Popen(
        [sys.executable, "-c", STARTER, str(tmp_path / "sleeper.log")],
        env=child_env() | {"PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        pid, handlers = map(int, starter.stdout.readline().split())  # type: ignore[union-attr]
        assert handlers == 0  # no Python code ran in the forked child
        wait_for(lambda: Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"sleep\0"), "the component's exec")
    finally:
        starter.kill()
        starter.wait()
    wait_for(lambda: not _alive(pid), "the component to end with the process that started it")
