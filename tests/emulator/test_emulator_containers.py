"""The emulator's VMs running the real container: the rendered startup script's `docker pull` and `docker run` reach
the engine (tpu_emulator.vm_engine), the image comes from a real registry on loopback (tpu_emulator.registry), and
the job's code sits at /workspace of the image `runner build --context` made (its requirements in the layer under
it). Where no engine can run this skips (fails with CI=true): tests/containers.py."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from runner import contract
from runner.collect.facts import gather
from runner.launch.engine import Engine
from runner.storage import open_storage
from runner.watch.runs import RunRecord
from tests.cloudjobs import events, submit
from tests.conftest import FAST_TIMINGS
from tests.containers import GROUP
from tpu_emulator import TpuEmulator
from tpu_emulator.registry import LocalRegistry, trainer_image

pytestmark = [pytest.mark.slow, GROUP]


@pytest.fixture
def container_cloud(
    tmp_path: Path,
    gcs_server: str,
    gcs: str,
    container_engine: Engine,
    image_registry: LocalRegistry,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[TpuEmulator]:
    """The TPU API emulator whose VMs pull from `image_registry` and run containers under the engine; the runner
    pointed at both, its pre-flight image check asking the real registry."""
    emulator = TpuEmulator(workdir=tmp_path / "vms", gcs_endpoint=gcs_server, engine=container_engine, vm_grace_s=10)
    emulator.start()
    monkeypatch.setenv("RUNNER_TPU_ENDPOINT", emulator.endpoint)
    monkeypatch.setenv("RUNNER_COMPUTE_ENDPOINT", emulator.endpoint)
    monkeypatch.setenv("RUNNER_REGISTRY_ENDPOINT", image_registry.endpoint)
    monkeypatch.setenv("CLOUDSDK_CONFIG", "/nonexistent")
    monkeypatch.setenv("RUNNER_TIMINGS", FAST_TIMINGS)
    try:
        yield emulator
    finally:
        emulator.stop()


def test_a_vm_pulls_the_image_and_runs_the_code_in_it(
    container_cloud: TpuEmulator,
    container_engine: Engine,
    image_registry: LocalRegistry,
    tmp_path: Path,
    runner_home: Path,
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text(
        "import json, os, pathlib, runner, tabulate\n"
        "out = pathlib.Path(os.environ['RUNNER_OUTPUT_DIR'])\n"
        "(out / 'seen.json').write_text(json.dumps({'cwd': os.getcwd(), 'files': sorted(os.listdir('.')),\n"
        "    'runner': runner.__file__, 'uid': os.getuid(), 'worker': os.environ['RUNNER_WORKER_ID'],\n"
        "    'tabulate': tabulate.__version__}))\n"
        "print('hello from the image', flush=True)\n"
    )
    (project / "requirements.txt").write_text("tabulate==0.9.0\n")  # the job's own: a layer of the image
    image = trainer_image(image_registry, container_engine, context=project)
    assert image.startswith(f"{image_registry.host}/tpu-runner/trainer:") and "-code-" in image
    spec = tmp_path / "job.yaml"
    spec.write_text(
        f"name: real-container\nimage: {image}\ncommand: python train.py\n"
        f"accelerator: {{type: v2-8, zones: [us-central1-b], project: test-project}}\n"
        f"storage: gs://runner-test/{uuid.uuid4().hex[:10]}\n"
    )
    result = submit(str(spec))
    assert result.exit_code == 0, result.output
    (path,) = list((runner_home / "runs").glob("*.json"))
    record = RunRecord.model_validate_json(path.read_text())
    store = open_storage(record.run_dir)
    seen = json.loads(store.read_bytes("seen.json") or b"{}")
    # The image's code, runner and user (1000 in the cpu image; the tpu image runs as root), as on a TPU VM.
    assert seen == {"cwd": "/workspace", "files": ["requirements.txt", "train.py"],
                    "runner": "/opt/app/runner/__init__.py", "uid": 1000, "worker": "0",
                    "tabulate": "0.9.0"}  # fmt: skip
    assert "hello from the image" in (store.read_bytes(contract.log_key(0)) or b"").decode()
    assert json.loads(store.read_bytes(contract.exit_key(0)) or b"{}")["state"] == "succeeded"
    # The VM really pulled it: the image-pull phase of the startup breakdown is the pull's own time.
    names = [e["event"] for e in events(record.run_dir) if e["source"] == "bootstrap-0"]
    # container_exited follows, unless the runner's delete (sent on the job's exit record) stopped the VM before its
    # bootstrap could store the event: on a loaded machine it does.
    assert names[:2] == ["bootstrap_started", "container_started"]
    pulls = [p for p in gather(record, store).timeline.phases if p.name == "image pull"]
    assert len(pulls) == 1 and pulls[0].seconds > 0.5, pulls
    print(f"image pull on the emulated VM: {pulls[0].seconds:.1f} s")
    # The node deleted itself; its VM's image store and containers go with it.
    engine_dir = tmp_path / "vms" / ".emulator" / "engine"
    deadline = time.monotonic() + 60
    while engine_dir.exists() and any(engine_dir.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not engine_dir.exists() or not any(engine_dir.iterdir())
