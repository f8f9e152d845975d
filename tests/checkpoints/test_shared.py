"""The shared checkpoint location (RUNNER_SHARED_CHECKPOINT_DIR: checkpoints/shared in the run directory): a real
Orbax CheckpointManager saving into it on Cloud Storage (the storage emulator, with the settings an emulated VM
gives its jobs), read where it is by the runner's machinery and never mirrored or restored per host; and a pod
slice's default hang limit."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

from runner import contract
from runner.checkpoints import SHARED, Listing, resume_point, survey
from runner.plan.planner import SLICE_HANG_DEFAULT_S, HangLimit, job_env
from runner.spec import JobSpec
from runner.storage import open_storage
from runner.worker.mirror import Mirror
from tpu_emulator.vm import storage_emulator_env

SAVE = """\
import sys
import numpy as np
import orbax.checkpoint as ocp
with ocp.CheckpointManager(sys.argv[1], options=ocp.CheckpointManagerOptions(max_to_keep=2)) as mngr:
    for step in (10, 20, 30):
        mngr.save(step, args=ocp.args.StandardSave({"w": np.full(3, float(step))}))
    mngr.wait_until_finished()
    print(mngr.latest_step(), list(mngr.all_steps()))
"""


def test_a_multi_host_orbax_location_in_the_bucket_is_read_where_it_is_and_never_mirrored(
    gcs: str, tmp_path: Path
) -> None:
    run_dir = f"gs://runner-test/{uuid.uuid4().hex}/runs/r1"
    ctx = contract.JobContext("r1", run_dir, tmp_path / "out", 0, 2, "auto", "node")
    assert ctx.shared_checkpoint_dir == f"{run_dir}/{contract.SHARED_CHECKPOINTS}"
    env = {**os.environ, **storage_emulator_env(gcs)}
    saved = subprocess.run(
        [sys.executable, "-c", SAVE, ctx.shared_checkpoint_dir], env=env, capture_output=True, text=True, timeout=300
    )
    assert saved.returncode == 0, saved.stderr[-3000:]
    assert saved.stdout.split()[0] == "30"  # Orbax's own latest step, on Cloud Storage

    store = open_storage(run_dir)
    shared = survey(Listing.of_storage(store, contract.SHARED_CHECKPOINTS + "/", root=contract.CHECKPOINTS + "/"))
    assert [(s.path, s.step) for s in shared.committed()] == [(SHARED + "30", 30), (SHARED + "20", 20)]
    assert store.read_bytes(f"{contract.SHARED_CHECKPOINTS}/30/commit_success.txt") is not None
    newest = resume_point([survey(Listing.of_directory(tmp_path / "empty")), shared])
    assert newest is not None and (newest.step, newest.title) == (30, "step 30 (Orbax, shared)")

    # A host's own file under that name never overwrites the hosts' location; a new machine gets none of it back.
    local = tmp_path / "out"
    (local / contract.SHARED_CHECKPOINTS / "30").mkdir(parents=True)
    (local / contract.SHARED_CHECKPOINTS / "30" / "commit_success.txt").write_text("a host's own")
    (local / contract.CHECKPOINTS / "mine.txt").write_text("mine")
    mirror = Mirror(local, store, keep=2)
    mirror.push()
    assert store.read_bytes(f"{contract.SHARED_CHECKPOINTS}/30/commit_success.txt") != b"a host's own"
    assert store.read_bytes(f"{contract.CHECKPOINTS}/mine.txt") == b"mine"
    fresh = tmp_path / "vm2"
    pulled = Mirror(fresh, store, keep=2).pull_resume_state(worker=0)
    assert "checkpoints/mine.txt" in pulled and not any(key.startswith(contract.SHARED_CHECKPOINTS) for key in pulled)
    assert not (fresh / contract.SHARED_CHECKPOINTS).exists()


def spec(**overrides: object) -> JobSpec:
    return JobSpec.model_validate({"name": "j", "image": "t:x", "command": ["python", "train.py"], **overrides})


def test_a_pod_slice_gets_a_default_hang_limit_a_single_host_none() -> None:
    one = job_env(spec(), "r", "gs://b/runs/r", strategy="auto", deadline=0.0, num_workers=1)
    assert contract.HANG_DEFAULT_S not in one and contract.HANG_TIMEOUT_S not in one
    pod = job_env(spec(), "r", "gs://b/runs/r", strategy="auto", deadline=0.0, num_workers=2)
    assert pod[contract.HANG_DEFAULT_S] == str(SLICE_HANG_DEFAULT_S)
    own = job_env(
        spec(teardown={"hang_timeout": "10m"}), "r", "gs://b/runs/r", strategy="auto", deadline=0.0, num_workers=2
    )
    assert own[contract.HANG_TIMEOUT_S] == "600" and contract.HANG_DEFAULT_S not in own
    assert "once the job reports it" in HangLimit(SLICE_HANG_DEFAULT_S, default=True).row()[1]
    assert HangLimit(600, default=False).why == "teardown.hang_timeout"


def test_the_storage_emulators_downloads_say_the_objects_generation(gcs: str) -> None:
    """As Cloud Storage's do (x-goog-generation): TensorStore conditions its next write of an object it read on
    it, and without it an Orbax save into a database it had read back failed ("Malformed StorageGeneration")."""
    import urllib.parse
    import urllib.request

    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage  # type: ignore[attr-defined]

    client = storage.Client(project="p", credentials=AnonymousCredentials(), client_options={"api_endpoint": gcs})
    blob = client.bucket("runner-test").blob(f"{uuid.uuid4().hex}/manifest.ocdbt")
    blob.upload_from_string(b"m")
    # The JSON API's media read, TensorStore's (the /download/ path says it too).
    url = f"{gcs}/storage/v1/b/runner-test/o/{urllib.parse.quote(blob.name, safe='')}?alt=media"
    with urllib.request.urlopen(url, timeout=60) as answer:
        assert answer.read() == b"m"
        assert answer.headers["x-goog-generation"] == str(blob.generation)
        assert answer.headers["x-goog-metageneration"] == str(blob.metageneration)
