"""The TPU VM backend end to end on the two emulators: the real google-cloud-tpu and google-cloud-storage
clients against the Cloud TPU API emulator and gcp-storage-emulator, the real bootstrap on the emulated VMs."""

from __future__ import annotations

import json
import re
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from typer.testing import CliRunner

from faults import measure
from runner.cli import app
from runner.launch.bootstrap import SPOT_GRACE_S
from runner.plan import catalog
from runner.storage import open_storage
from runner.watch import rundir
from tests.cloudjobs import IMAGE, events, job, preempt_when, run_id_of, submit
from tests.waiting import wait_for


@pytest.mark.slow
def test_submit_trains_real_mnist_on_an_emulated_tpu_vm_and_deletes_it(
    cloud, tmp_path: Path, bucket_url: str, gcs_mnist: str
) -> None:  # type: ignore[no-untyped-def]
    spec = job(
        tmp_path,
        bucket_url,
        f"""\
        training: {{model: mnist_mlp, epochs: 2, batch_size: 128, max_train_examples: 1024, max_test_examples: 512,
                   data: {gcs_mnist}}}
        """,
    )
    t0 = time.time()
    result = submit(str(spec))
    assert result.exit_code == 0, result.output
    run_id = run_id_of(result.output)
    run_dir = f"{bucket_url}/runs/{run_id}"
    for text in [
        "creating TPU node",
        "READY",
        "bootstrap-0: container started",
        "Epoch 2/2",
        "test accuracy",
        f"TPU node {run_id} is gone",
    ]:
        assert text in result.output, text
    keys = {o.key for o in open_storage(run_dir).list()}
    assert {
        "metrics.jsonl",
        "summary.json",
        "checkpoints/latest.json",
        "checkpoints/ckpt-000002.keras",
        "logs/worker-0.log",
        "exit/worker-0.json",
        "events/bootstrap-0.jsonl",
        "spec.yaml",
    } <= keys
    summary = json.loads(open_storage(run_dir).read_bytes("summary.json") or b"{}")
    assert summary["keras"] == "tf_keras"  # what a TPU run uses by default (keras-team/keras#19448)
    assert not cloud.nodes(), "the emulator still holds a node"
    # The TPU API calls one job made, in order: create, polls, delete, and the confirmation that it is gone (the
    # registry's /v2/<repository>/manifests/ check of the image comes before, and is not the TPU API).
    calls = [(r.method, r.path) for r in cloud.requests if r.path.startswith("/v2/projects/")]
    print(f"TPU API calls: {len(calls)}:", dict(Counter(m for m, _ in calls)))
    assert calls[0] == ("POST", "/v2/projects/test-project/locations/us-central1-b/nodes")
    assert ("DELETE", f"/v2/projects/test-project/locations/us-central1-b/nodes/{run_id}") in calls
    timeline = {e["event"]: round(e["time"] - t0, 2) for e in events(run_dir)}
    print("timeline (s after submit):", json.dumps(timeline))
    # Whoever asks first (the VM, as soon as its container exits, or the runner once it sees the exit record).
    first_delete = min(t for k, t in timeline.items() if k in ("delete_requested", "teardown_requested"))
    assert timeline["submitted"] < timeline["bootstrap_started"] < timeline["container_started"]
    assert timeline["container_started"] < timeline["worker_exited"] < first_delete


def test_stockout_in_the_first_zone_moves_to_the_next(cloud, tmp_path: Path, bucket_url: str) -> None:  # type: ignore[no-untyped-def]
    cloud.stockout("us-central1-b")
    result = submit(str(job(tmp_path, bucket_url, "command: [python, -c, 'print(\"hi from the vm\")']\n")))
    assert result.exit_code == 0, result.output
    assert "us-central1-b: no capacity" in result.output and "in us-central1-c" in result.output
    assert "hi from the vm" in result.output
    assert not cloud.nodes()


def test_stockout_everywhere_is_exit_5_and_leaves_nothing(cloud, tmp_path: Path, bucket_url: str) -> None:  # type: ignore[no-untyped-def]
    cloud.stockout()
    result = submit(str(job(tmp_path, bucket_url, "command: [python, -c, 'print(1)']\n")))
    assert result.exit_code == 5
    assert "no capacity for v2-8 in us-central1-b, us-central1-c" in result.output
    assert not cloud.nodes()


@pytest.mark.parametrize(
    ("inject", "message", "hint"),
    [
        (lambda e: e.quota_exceeded(), "quota exhausted", "request more TPU quota"),
        (lambda e: e.deny("tpu.nodes.create"), "permission denied", "tpu.nodes.create"),
    ],
)
def test_errors_a_user_can_act_on(cloud, tmp_path: Path, bucket_url: str, inject, message: str, hint: str) -> None:  # type: ignore[no-untyped-def]
    inject(cloud)
    result = submit(str(job(tmp_path, bucket_url, "command: [python, -c, 'print(1)']\n")))
    assert result.exit_code == 5, result.output
    assert message in result.output and hint in result.output
    assert "Traceback" not in result.output
    assert not cloud.nodes()


@pytest.mark.parametrize("status", [429, 503])
def test_transient_errors_are_retried(cloud, tmp_path: Path, bucket_url: str, status: int) -> None:  # type: ignore[no-untyped-def]
    cloud.http_errors(status, count=3)
    result = submit(str(job(tmp_path, bucket_url, "command: [python, -c, 'print(\"ok after retries\")']\n")))
    assert result.exit_code == 0, result.output
    assert "ok after retries" in result.output
    assert sum(r.status == status for r in cloud.requests) == 3


def test_slow_create_is_waited_for(cloud, tmp_path: Path, bucket_url: str) -> None:  # type: ignore[no-untyped-def]
    cloud.slow_create(600)

    def read_creating() -> bool:
        asked = cloud.requests
        created = next((r.time for r in asked if r.method == "POST" and r.path.endswith("/nodes")), None)
        return created is not None and any(
            r.method == "GET" and "/nodes/" in r.path and r.time > created for r in asked
        )

    def a_while_later() -> None:  # once the runner has read the node CREATING, the create's time comes
        wait_for(read_creating, "the runner's read of the node it created")
        cloud.advance(600)

    threading.Thread(target=a_while_later, daemon=True).start()
    result = submit(str(job(tmp_path, bucket_url, "command: [python, -c, 'print(\"patience\")']\n")))
    assert result.exit_code == 0, result.output
    assert "CREATING" in result.output and "patience" in result.output


def test_a_failing_job_is_reported_and_its_node_deleted(cloud, tmp_path: Path, bucket_url: str) -> None:  # type: ignore[no-untyped-def]
    result = submit(str(job(tmp_path, bucket_url, "command: [python, -c, 'import sys; sys.exit(\"boom\")']\n")))
    assert result.exit_code == 6
    assert "boom" in result.output
    assert not cloud.nodes()


def test_missing_image_is_a_preflight_error_and_creates_nothing(cloud, tmp_path: Path, bucket_url: str) -> None:  # type: ignore[no-untyped-def]
    cloud.missing_image(IMAGE)
    result = submit(str(job(tmp_path, bucket_url, "command: [python, -c, 'print(1)']\n")))
    assert result.exit_code == 2
    assert f"image {IMAGE} is not in the registry" in result.output and "make push" in result.output
    assert not any(r.method == "POST" for r in cloud.requests if r.path.startswith("/v2/projects"))


def test_an_image_the_vm_cannot_pull_fails_the_run_and_deletes_the_node(
    cloud, tmp_path: Path, bucket_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    """When the registry cannot be asked beforehand (here: no endpoint, no credentials), the VM finds out."""
    monkeypatch.setenv("RUNNER_REGISTRY_ENDPOINT", "http://127.0.0.1:9")  # nothing listens: cannot tell
    cloud.missing_image(IMAGE)
    result = submit(str(job(tmp_path, bucket_url, "command: [python, -c, 'print(1)']\n")))
    assert result.exit_code == 6
    assert "warning: could not check" in result.output and "docker pull" in result.output
    assert not cloud.nodes()


def test_detach_then_status_and_logs_from_another_shell(cloud, tmp_path: Path, bucket_url: str) -> None:  # type: ignore[no-untyped-def]
    script = "import time\\nfor i in range(4):\\n    print('tick', i, flush=True); time.sleep(0.5)\\n"
    result = submit(str(job(tmp_path, bucket_url, f'command: [python, -c, "{script}"]\n')), "--detach")
    assert result.exit_code == 0, result.output
    run_id = re.search(r"started (\S+) in the background", result.output).group(1)  # type: ignore[union-attr]
    logs = CliRunner().invoke(app, ["logs", run_id, "--follow"], catch_exceptions=False)
    assert "tick 3" in logs.output
    deadline = time.monotonic() + 30
    while cloud.nodes() and time.monotonic() < deadline:  # the VM deletes itself when its job is done
        time.sleep(0.5)
    assert not cloud.nodes()
    status = CliRunner().invoke(app, ["status", run_id, "--json"], catch_exceptions=False)
    assert json.loads(status.output)["state"] == "succeeded"


@pytest.mark.slow
def test_preemptions_recreate_the_node_and_training_resumes_losing_nothing(
    cloud, tmp_path: Path, bucket_url: str, gcs_mnist: str
) -> None:  # type: ignore[no-untyped-def]
    """Spot node preempted after its first checkpoint, and the recreated one again once its trainer is under way:
    each time the runner deletes it and creates a new one, and the trainer continues from the newest checkpoint in
    the bucket (the step its preemption notice saved) instead of starting over. What the fault suite's
    `preemption-x2` case asserts (python -m faults runs it at full size), measured the same way (faults.measure) on
    the same trainer log. The VM's cadences follow the runner's timings (conftest's FAST_TIMINGS: a 0.5 s sync and
    progress write), so the bucket trails the trainer by about a second: 4 epochs of 512 steps (~2 s each here) leave
    the recreated VM's trainer, which resumes in its second epoch, over twice that to be seen under way."""
    spec = job(
        tmp_path,
        bucket_url,
        f"""\
        training: {{model: mnist_mlp, epochs: 4, batch_size: 32, max_train_examples: 16384, max_test_examples: 256,
                   data: {gcs_mnist}}}
        """,
        name="spot",
    )
    text = spec.read_text().replace("project: test-project}", "project: test-project, spot: true}")
    spec.write_text(text)
    # A Spot VM's real time between SIGTERM and power-off, not the fixture's 3 s: on a loaded machine the stop's
    # checkpoint and last log lines took longer than 3 s, then 10 s, to reach the bucket. The emulated VM powers off
    # as soon as its processes are gone, so the notice costs nothing where the stop is quick.
    cloud.vm_grace_s = SPOT_GRACE_S
    preempted: list[int] = []  # the global step the bucket showed at each preemption

    def bucket_json(key: str):  # type: ignore[no-untyped-def]
        """The READY node and the run directory's JSON record `key` as the bucket has it (None: not yet)."""
        node = next((n for n in cloud.nodes() if n.state == "READY" and n.metadata.get("tpu-runner-run-dir")), None)
        raw = open_storage(node.metadata["tpu-runner-run-dir"]).read_bytes(key) if node else None
        return node, json.loads(raw) if raw else None

    def done(progress: dict) -> bool:  # type: ignore[type-arg]
        return progress["global_step"] >= progress["epochs"] * progress["steps_per_epoch"]

    def preempt_twice() -> None:
        # The bucket trails the trainer by up to a sync and a progress write, so each trigger is the earliest sign
        # that training has got somewhere: the first checkpoint; then progress.json written by the recreated VM's
        # trainer (after that VM turned READY). Both leave the trainer mid-run, where a preemption must not cost a
        # step.
        deadline = time.monotonic() + 300  # three trainer starts on a loaded machine take minutes
        recreated_at: float | None = None
        while time.monotonic() < deadline and len(preempted) < 2:
            if not preempted:
                node, manifest = bucket_json("checkpoints/latest.json")
                if node and manifest and manifest["epoch"]:
                    preempted.append(manifest["checkpoints"][0]["global_step"])
                    cloud.preempt(node.node_id)
            else:
                node, progress = bucket_json("progress.json")
                if node and recreated_at is None:
                    recreated_at = time.time()
                elif node and progress and progress["time"] > (recreated_at or time.time()) and not done(progress):
                    preempted.append(progress["global_step"])
                    cloud.preempt(node.node_id)
            time.sleep(0.3)

    thread = threading.Thread(target=preempt_twice, daemon=True)
    thread.start()
    result = submit(str(spec))
    thread.join(5)
    assert len(preempted) == 2, f"preempted at global steps {preempted}, not twice"
    assert result.exit_code == 0, result.output
    assert "preempted: recreating it (1/3)" in result.output and "preempted: recreating it (2/3)" in result.output
    run_id = run_id_of(result.output)
    run_dir = f"{bucket_url}/runs/{run_id}"
    summary = json.loads(open_storage(run_dir).read_bytes("summary.json") or b"{}")
    log = (open_storage(run_dir).read_bytes("logs/worker-0.log") or b"").decode()
    print(log)
    # The trainer log, attempt by attempt, measured as the fault suite measures it.
    attempts = measure.parse_attempts(log)
    assert len(attempts) == 3, log
    assert all(a.resumed_from for a in attempts[1:]), log
    # Where each attempt got to: its stop line's step; where the log has none (a VM can go before its last lines
    # are uploaded), at least what the bucket showed when it was preempted.
    lost = measure.steps_lost(attempts, preempted)
    assert len(lost) == 2 and all(s.steps == 0 for s in lost), (lost, log)  # as preemption-x2 asserted
    assert measure.epochs_redone(attempts) == 0
    # Each resume went on from at least where the bucket stood when its VM was preempted: no checkpoint was lost.
    assert all(a.start_step >= p for a, p in zip(attempts[1:], preempted, strict=True)), (preempted, attempts)
    assert attempts[-1].resumed_from == summary["resumed_from"]["checkpoint"]
    assert summary["global_step"] == 4 * summary["steps_per_epoch"]
    assert [e["event"] for e in events(run_dir)].count("preempted") == 2
    assert not cloud.nodes()


# A user's own Keras script (a `command` job): the Dense guide's network with the runner's one callbacks= line, on
# the first 16384 examples of MNIST from the data cache the runner copies beside the run directory for the VM. Its
# fit is paced to at least EPOCH_FLOOR_S an epoch: the test sees the job only through the bucket, which trails the
# trainer by up to the supervisor's sync plus a progress write (0.5 s each with conftest's FAST_TIMINGS), so an
# epoch outlasts both on any CPU, however fast, and a preemption lands with training still to do.
EPOCH_FLOOR_S = 3.0
TRAIN = 16384
COMMAND_JOB = f"""\
import time
import keras
from runner.datasets import mnist
from runner.train import keras_callbacks

(x_train, y_train), (x_test, y_test) = mnist.load_data()
x_train, y_train = x_train[:{TRAIN}].reshape(-1, 784) / 255.0, y_train[:{TRAIN}]
model = keras.Sequential([keras.Input((784,)), keras.layers.Dense(128, activation="relu"),
                          keras.layers.Dense(10, activation="softmax")])
model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])

class Pace(keras.callbacks.Callback):  # a step that runs ahead of {EPOCH_FLOOR_S} s an epoch waits
    def on_epoch_begin(self, epoch, logs=None):
        self.began = time.monotonic()

    def on_train_batch_end(self, batch, logs=None):
        due = self.began + (batch + 1) * {EPOCH_FLOOR_S} / (len(x_train) // 16)
        time.sleep(max(0.0, due - time.monotonic()))


model.fit(x_train, y_train, epochs=3, batch_size=16, callbacks=[*keras_callbacks(), Pace()], verbose=2)
"""


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["tensorflow", "jax"])
def test_a_preempted_command_job_resumes_on_the_recreated_vm_from_the_restored_directory(
    cloud, tmp_path: Path, bucket_url: str, backend: str
) -> None:  # type: ignore[no-untyped-def]
    """A Spot VM taken back while a user's script trains: the recreated VM's supervisor restores the checkpoints the
    script's keras_callbacks() wrote (the bucket's newest set), and the script goes on from the step the preemption
    notice saved, on Keras 3 over TensorFlow and over JAX: every optimizer step of the three epochs once."""
    script = tmp_path / "train.py"
    script.write_text(COMMAND_JOB)
    spec = job(
        tmp_path,
        bucket_url,
        f"command: [python, {script}]\nenv: {{KERAS_BACKEND: {backend}}}\n",
        name=f"own-{backend}",
    )
    spec.write_text(spec.read_text().replace("project: test-project}", "project: test-project, spot: true}"))
    cloud.vm_grace_s = SPOT_GRACE_S  # a Spot VM's time between the preemption's SIGTERM and power-off

    def training_with_an_epoch_to_go(_node, store) -> bool:  # type: ignore[no-untyped-def]
        # The preemption goes in as soon as the bucket shows a step trained with a whole epoch still to go: later
        # than that, the trainer may have finished before the preemption lands (EPOCH_FLOOR_S).
        raw = store.read_bytes("progress.json")
        p = rundir.Progress.from_json(json.loads(raw)) if raw else rundir.Progress()
        return bool(
            p.phase == "train"
            and p.global_step
            and p.epochs
            and p.steps_per_epoch
            and p.global_step <= (p.epochs - 1) * p.steps_per_epoch
        )

    thread, preempted = preempt_when(cloud, training_with_an_epoch_to_go, timeout_s=300, poll_s=0.2)
    result = submit(str(spec))
    thread.join(5)
    assert preempted, f"the node was never preempted:\n{result.output[-3000:]}"
    assert result.exit_code == 0, result.output
    assert "the job resumes from its newest checkpoint" in result.output, result.output[-3000:]
    run_dir = f"{bucket_url}/runs/{run_id_of(result.output)}"
    store = open_storage(run_dir)
    log = (store.read_bytes("logs/worker-0.log") or b"").decode()
    assert re.search(r"\[runner\] restored \d+ checkpoint file\(s\), [\d.]+ MB, from the run directory", log), log
    assert re.search(r"\[runner\] resumed from ckpt-\d{6}(-s\d{6})?\.keras", log), log
    metrics = [json.loads(line) for line in (store.read_bytes("metrics.jsonl") or b"").splitlines()]
    assert [m["epoch"] for m in metrics] == [1, 2, 3]  # one line per epoch, none twice
    assert metrics[-1]["global_step"] == 3 * TRAIN // 16  # steps of 16: none lost, none trained twice
    assert not cloud.nodes()


@pytest.mark.slow
def test_a_job_without_checkpoints_starts_over_and_a_preemption_past_the_retry_limit_fails_the_run(
    cloud, tmp_path: Path, bucket_url: str
) -> None:  # type: ignore[no-untyped-def]
    """retries.preemptions: 1, and a job that saves nothing: the first preemption recreates the node and says the
    job starts over (read once the old node is gone, so a save in the notice's grace would count); the second is
    past the limit: the runner gives up, and the run is failed (the workers' `cancelled` records, written as the VM
    shut down, do not make it a user's cancel)."""
    spec = job(
        tmp_path,
        bucket_url,
        "command: [python, -c, 'import time; time.sleep(120)']\nretries: {preemptions: 1}\n",
        name="spot-out",
    )
    spec.write_text(spec.read_text().replace("project: test-project}", "project: test-project, spot: true}"))
    # A recreated node's worker heartbeat is its own: the runner clears the old ones before it creates the node.
    thread, preempted = preempt_when(
        cloud, lambda _node, store: bool(store.read_bytes("heartbeats/worker-0.json")), timeout_s=180, times=2
    )
    result = submit(str(spec))
    thread.join(5)
    assert len(preempted) == 2, result.output
    assert result.exit_code == 6, result.output
    assert (
        "the machine was preempted: recreating it (1/1)" in result.output
        and "the job starts over: it wrote no checkpoints to RUNNER_CHECKPOINT_DIR" in result.output
    ), result.output
    assert "(retries.preemptions): giving up" in result.output
    run_id = run_id_of(result.output)
    status = CliRunner().invoke(app, ["status", run_id, "--json"], catch_exceptions=False)
    assert json.loads(status.output)["state"] == "failed"
    assert not cloud.nodes()


@pytest.mark.slow
def test_a_jax_job_on_an_emulated_tpu_vm_and_its_report(cloud, tmp_path: Path, bucket_url: str, gcs_mnist: str) -> None:  # type: ignore[no-untyped-def]
    """training.framework jax through the whole cloud path (the VM's container runs the JAX engine on the CPU: an
    emulated VM has no TPU chips), then `runner report` of that run: the cost from the node's READY time at the
    catalog's price, the startup breakdown, and the page in headless Chromium."""
    from tests.browser import IMAGES_JS, INKED_JS, Browser, chromium_or_skip

    chromium = chromium_or_skip()
    spec = job(
        tmp_path,
        bucket_url,
        f"""\
        training: {{framework: jax, model: mnist_mlp, epochs: 2, batch_size: 128, max_train_examples: 1024,
                   max_test_examples: 256, data: {gcs_mnist}}}
        """,
        name="jaxvm",
    )
    result = submit(str(spec))
    assert result.exit_code == 0, result.output
    run_id = run_id_of(result.output)
    run_dir = f"{bucket_url}/runs/{run_id}"
    assert "DataParallel" in result.output and f"TPU node {run_id} is gone" in result.output
    summary = json.loads(open_storage(run_dir).read_bytes("summary.json") or b"{}")
    assert summary["framework"] == "jax" and summary["train_examples"] == 1024
    assert 0.6 <= summary["test_accuracy"] <= 1.0  # 2 epochs of 1024 examples reach 0.7-0.8
    assert not cloud.nodes()

    data = json.loads(CliRunner().invoke(app, ["report", run_id, "--json"], catch_exceptions=False).output)
    cost = data["cost"]
    assert cost is not None and cost["usd"] > 0 and cost["ready_seconds"] > 0
    assert cost["chip_hours"] == pytest.approx(cost["price"]["chips"] * cost["ready_seconds"] / 3600, rel=0.01)
    v2 = catalog.accelerator("v2-8")
    assert cost["price"]["usd_per_hour"] == pytest.approx(v2.price_per_hour(spot=False), rel=1e-3)
    assert cost["usd"] == pytest.approx(cost["chip_hours"] * cost["price"]["usd_per_chip_hour"], rel=0.01)
    startup = data["startup"]
    assert 0 < startup["ready_s"] <= startup["framework_imported_s"] <= startup["first_step_s"]
    written = CliRunner().invoke(app, ["report", run_id], catch_exceptions=False)
    assert written.exit_code == 0, written.output
    page = next(Path(w) for w in written.output.split() if w.endswith("index.html") and not w.startswith("gs:"))
    with Browser(chromium) as browser:
        browser.open(page.as_uri())
        images = {i["id"]: i for i in browser.evaluate(INKED_JS + IMAGES_JS)}
        text = browser.evaluate("document.body.innerText")
    assert images["chart-loss"]["points"] == {"loss": 2, "val_loss": 2}
    assert all(i["decoded"] and i["inked"] > 0.02 for i in images.values()), images
    assert "DataParallel" in text and "Cost" in text
