"""The gke backend's quick rows of `make faults` (faults/scenarios/gke.py), end to end through the real `runner
submit` on the session's Kubernetes rehearsal: each ends as its row expects and leaves nothing of its run on the
cluster. The slow rows (a node taken mid-epoch, a pod killed) run in `make faults` only; the suite holds the same
promises in test_rehearsal.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from faults.scenarios import CASES, case_named
from faults.suite import Suite
from tests.conftest import FAST_TIMINGS
from tests.faults.test_faults import run_quick_case
from tests.kubecluster import GROUP

pytestmark = GROUP


@pytest.fixture(scope="module")
def suite(
    kube: Any, forker: Any, storage_emulator: Any, mnist_npz: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Suite]:
    from faults.cluster import Ground

    ground = Ground.beside(kube, forker)
    try:
        with Suite(
            tmp_path_factory.mktemp("gke-faults"),
            gcs_endpoint=storage_emulator.endpoint,
            bucket="runner-test",
            mnist=mnist_npz,
            timings=FAST_TIMINGS,
            storage_server=storage_emulator,
            cluster=ground,
        ) as s:
            yield s
    finally:
        ground.stop()


@pytest.mark.parametrize("name", [c.name for c in CASES if c.fast and c.on_cluster])
def test_quick_gke_row_ends_as_expected_and_leaves_nothing(suite: Suite, name: str) -> None:
    result = run_quick_case(suite, name)
    if case_named(name).idle_goal:
        assert result.idle_s and all(v is not None for v in result.idle_s), "the node pool was never deleted"
