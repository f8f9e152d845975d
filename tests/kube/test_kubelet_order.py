"""The played kubelet's two watches (nodes, pods) are apart: a pod bound to a node it has not seen yet must still
run once it sees the node, as a kubelet that registers finds the pods already bound to it. (Seen: a pod left
Pending for good when the pods' watch was ahead of the nodes', under load.)"""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from tpu_emulator.kube.kubelet import Kubelet


def _pod(uid: str, node: str | None, phase: str = "Pending") -> Any:
    meta = SimpleNamespace(uid=uid, name=f"pod-{uid}", namespace="ns", deletion_timestamp=None)
    return SimpleNamespace(metadata=meta, spec=SimpleNamespace(node_name=node), status=SimpleNamespace(phase=phase))


def _node(name: str) -> Any:
    return SimpleNamespace(metadata=SimpleNamespace(name=name))


def _kubelet(tmp_path: Path) -> tuple[Kubelet, list[str], threading.Event]:
    from kubernetes import client

    kubelet = Kubelet(client.ApiClient(), tmp_path)  # never started: its handlers are driven by hand
    started: list[str] = []
    done = threading.Event()

    def start(pod: Any) -> None:
        started.append(pod.metadata.uid)
        done.set()

    kubelet._start_pod = start  # type: ignore[method-assign]
    return kubelet, started, done


def test_a_pod_bound_to_a_node_not_seen_yet_starts_when_the_node_is_seen(tmp_path: Path) -> None:
    kubelet, started, done = _kubelet(tmp_path)
    kubelet._on_pod("ADDED", _pod("a", None))  # not bound yet
    kubelet._on_pod("MODIFIED", _pod("a", "tpu-0"))  # bound, before the node's own event
    assert started == []
    kubelet._on_node("ADDED", _node("tpu-0"))
    assert done.wait(10)
    assert started == ["a"]


def test_a_node_list_picks_up_parked_pods_and_a_deleted_pod_is_forgotten(tmp_path: Path) -> None:
    kubelet, started, done = _kubelet(tmp_path)
    kubelet._on_pod("MODIFIED", _pod("gone", "tpu-1"))
    kubelet._on_pod("DELETED", _pod("gone", "tpu-1"))
    kubelet._on_pod("MODIFIED", _pod("b", "tpu-1"))
    kubelet._sync_nodes([_node("tpu-1")])
    assert done.wait(10)
    assert started == ["b"]
