"""What cases do to a run: hooks for Scenario.setup (before submit), .during (a thread while the runner lives) and
.after (once it has exited). Each returns a Hook, so a case reads as a sentence: during=(preempt_mid_epoch(),)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any, Literal, TypeVar

from faults.context import Ctx
from faults.scenario import PROJECT, STARTED, ZONES, Hook, Train
from runner.train.checkpoints import Position

T = TypeVar("T")

# -- preemption -------------------------------------------------------------------------------------------------


def preempt_at_checkpoints(*epochs: int) -> Hook:
    """Preempt the node once the newest checkpoint in the bucket reaches each of `epochs` in turn (and, after a
    preemption, only once the recreated VM has trained and checkpointed further)."""

    def during(ctx: Ctx) -> None:
        job = ctx.case.job
        assert isinstance(job, Train)
        floor = 0
        for epoch in epochs:
            target = max(epoch, floor + 1)

            def ready(target: int = target) -> str | None:
                at = ctx.manifest_epoch() or 0
                return ctx.ready_node() if target <= at < job.epochs else None

            node = ctx.wait_for(ready, timeout=ctx.case.timeout_s)
            if node is None:
                ctx.problem(f"never reached checkpoint epoch {target} on a READY node: no preemption")
                return
            at = ctx.manifest_epoch() or 0
            ctx.preempt(node, at_checkpoint=at, bucket=sorted(ctx.checkpoints()))
            floor = at
            # The next preemption is for the next VM: wait until this node is gone.
            ctx.wait_for(lambda: not any(n.state == "PREEMPTED" for n in ctx.own_nodes()), timeout=120)

    return during


def preempt_when_ready(ctx: Ctx) -> None:
    """Preempt the node the moment it is READY, before the runner's next poll sees it (a spot VM can go any time)."""
    node = ctx.wait_for(
        lambda: next((n.node_id for n in ctx.emulator.nodes() if n.state == "READY"), None),
        timeout=ctx.case.timeout_s,
        interval=0.02,
    )
    if node is None:
        ctx.problem("no node became READY: no preemption")
        return
    ctx.preempt(node, at_checkpoint=0, bucket=[])


def preempt_one_slice(ctx: Ctx) -> None:
    """Preempt the last slice of a multislice once every worker of every slice has a heartbeat and the job has marked
    its first attempt (faults.scenario.UNTIL_PREEMPTED): the service deletes every slice of the queued resource, and
    all restart."""

    def running_slice() -> str | None:
        store = ctx.storage()
        nodes = sorted((n for n in ctx.own_nodes() if n.state == "READY"), key=lambda n: n.node_id)
        if store is None or len(nodes) < 2 or store.list("exit/"):
            return None
        running = len(store.list("heartbeats/")) >= 2 * len(nodes) and store.read_bytes(STARTED) is not None
        return str(nodes[-1].node_id) if running else None

    node = ctx.wait_for(running_slice, timeout=ctx.case.timeout_s, interval=0.2)
    if node is None:
        ctx.problem("the slices never all ran: no preemption")
        return
    ctx.preempt(node, at_checkpoint=0, bucket=[])


def at_mid_epoch(ctx: Ctx, locate: Callable[[], T | None]) -> tuple[T, dict[str, Any]] | None:
    """What `locate` finds (the job's node, instance or pod) and the bucket's progress.json, while that shows the
    first half of an epoch before the last, past its first step: the bucket's copy is up to a sync interval (5 s)
    behind the trainer, which is then still inside that epoch."""
    progress = ctx.read_json("progress.json")
    if not isinstance(progress, dict):
        return None
    step, steps = int(progress.get("step") or 0), int(progress.get("steps_per_epoch") or 0)
    if not 0 < step < steps / 2 or int(progress.get("epoch") or 0) >= int(progress.get("epochs") or 0):
        return None
    found = locate()
    return None if found is None else (found, progress)


def preempt_mid_epoch(ctx: Ctx) -> None:
    """Preempt once the bucket's progress.json shows the job in the middle of an epoch (0 < step < steps/epoch)."""
    found = ctx.wait_for(lambda: at_mid_epoch(ctx, ctx.ready_node), timeout=ctx.case.timeout_s, interval=0.2)
    if found is None:
        ctx.problem("never saw progress.json in the middle of an epoch on a READY node: no preemption")
        return
    node, progress = found
    ctx.preempt(node, at_checkpoint=ctx.manifest_epoch() or 0, bucket=sorted(ctx.checkpoints()), progress=progress)
    ctx.note(
        f"preempted at progress.json epoch {progress['epoch']} step {progress['step']}/{progress['steps_per_epoch']} "
        f"(global step {progress['global_step']}; the bucket's copy is up to a sync interval behind)"
    )


def _training_with_checkpoints(ctx: Ctx, count: int) -> str | None:
    """A READY node whose job, in an epoch before the last, has `count` checkpoints in the bucket."""
    progress = ctx.read_json("progress.json")
    if not isinstance(progress, dict) or int(progress.get("epoch") or 0) >= int(progress.get("epochs") or 0):
        return None
    return ctx.ready_node() if len(ctx.checkpoints()) >= count else None


def preempt_then_while_recreating(damage: Callable[[Ctx], object], *, min_checkpoints: int = 2) -> Hook:
    """Preempt once the bucket holds `min_checkpoints` checkpoints (keep: 2, so one older than the newest survives
    whatever the stop saves); make the recreated node's CREATING last 15 s, and `damage` the bucket in that window:
    the old VM is gone (the runner deleted it before creating anew), the new one has not pulled anything yet."""

    def during(ctx: Ctx) -> None:
        node = ctx.wait_for(lambda: _training_with_checkpoints(ctx, min_checkpoints), timeout=ctx.case.timeout_s)
        if node is None:
            ctx.problem(f"never saw {min_checkpoints} checkpoints while the job trained: no preemption")
            return
        creates = ctx.accepted_creates()
        ctx.emulator.slow_create(15, count=1)
        ctx.preempt(node, at_checkpoint=ctx.manifest_epoch() or 0, bucket=sorted(ctx.checkpoints()))
        creating = ctx.wait_for(
            lambda: ctx.accepted_creates() > creates and any(n.state == "CREATING" for n in ctx.own_nodes()),
            timeout=120,
            interval=0.1,
        )
        if not creating:
            ctx.problem("the preempted node was not recreated: nothing damaged")
            return
        damage(ctx)

    return during


def tear_newest_checkpoint(ctx: Ctx) -> None:
    """Overwrite the bucket's newest checkpoint with its first half: a torn upload."""
    found = ctx.checkpoints()
    if len(found) < 2:
        ctx.problem(f"only {len(found)} checkpoint(s) in the bucket: nothing older to resume from")
        return
    newest: Position = max(found)
    store = ctx.storage()
    assert store is not None
    whole = store.read_bytes(found[newest]) or b""
    store.write_bytes(found[newest], whole[: len(whole) // 2])
    ctx.destroyed.add(newest)
    ctx.numbers["torn"] = found[newest].rsplit("/", 1)[-1]
    ctx.numbers["older"] = sorted(found)[-2]
    ctx.note(f"tore {ctx.numbers['torn']} ({len(whole)} -> {len(whole) // 2} bytes) while the node was CREATING")


def break_manifest(ctx: Ctx) -> None:
    """Replace checkpoints/latest.json with bytes that are not JSON."""
    store = ctx.storage()
    assert store is not None
    ctx.numbers["newest_before"] = max(ctx.checkpoints(), default=None)
    store.write_bytes("checkpoints/latest.json", b'{"format": 2, "checkpoints": [{"file": "ckpt-0\x00\xff garbage')
    ctx.note(f"replaced checkpoints/latest.json with garbage; newest checkpoint file {ctx.numbers['newest_before']}")


# -- the runner's death -----------------------------------------------------------------------------------------


def kill_runner_after(what: str, ready: Callable[[Ctx], bool]) -> Hook:
    def during(ctx: Ctx) -> None:
        if ctx.wait_for(lambda: ready(ctx) or None, timeout=ctx.case.timeout_s) is None:
            ctx.problem(f"never saw {what}: the runner was not killed")
            return
        ctx.kill_runner(f"after {what}")

    return during


def job_running(ctx: Ctx) -> bool:
    store = ctx.storage()
    return store is not None and bool(store.read_bytes("heartbeat"))


def first_checkpoint(ctx: Ctx) -> bool:
    return bool(ctx.checkpoints())


def node_creating(ctx: Ctx) -> bool:
    return any(n.state == "CREATING" for n in ctx.own_nodes())


def vm_finishes_alone(ctx: Ctx) -> None:
    """After: the runner is dead; the VM must finish the job, record it and delete its own node."""

    def finished() -> bool:
        store = ctx.storage()
        return bool(store and store.list("exit/")) and not ctx.own_nodes()

    if ctx.wait_for(finished, timeout=ctx.case.timeout_s, interval=1.0) is None:
        ctx.problem("the VM did not finish and delete its node on its own")


def runner_down(ctx: Ctx, expect_exit: int = 0) -> None:
    """After: `runner down RUN` from another shell, as a user whose runner died would. Notes how long it took, its
    exit code (a problem unless `expect_exit`) and how soon its DELETE came."""
    if ctx.run_id is None:
        ctx.problem("no run record: nothing to bring down")
        return
    states = sorted({n.state for n in ctx.own_nodes()} | {i.status for i in ctx.own_instances()})
    t0 = time.time()
    done = ctx.cli("down", ctx.run_id)
    ctx.numbers["down_s"] = round(time.time() - t0, 2)
    ctx.numbers["down_exit"] = done.returncode
    deletes = [r.time - t0 for r in ctx.emulator.requests if r.method == "DELETE" and r.status < 300 and r.time >= t0]
    ctx.numbers["down_delete_after_s"] = round(deletes[0], 2) if deletes else None
    said = (done.stdout + done.stderr).strip().splitlines()
    ctx.numbers["down_output"] = said
    ctx.note(f"`runner down` found the machine {', '.join(states) or 'gone'}; exit {done.returncode} after "
             f"{ctx.numbers['down_s']}s, its DELETE {'never sent' if not deletes else f'after {deletes[0]:.1f}s'}: "
             f"{said[-2:]}")  # fmt: skip
    if done.returncode != expect_exit:
        ctx.problem(f"`runner down` exited {done.returncode}, expected {expect_exit}: {' | '.join(said[-3:])}")


def down_with_storage(trouble: Literal["reset", "blackhole", "bucket gone"]) -> Hook:
    """After: Cloud Storage out of reach (every connection reset, or black-holed, through the case's proxy; or the
    run directory's bucket deleted), then `runner down RUN`: it must delete from the run record alone, then say
    that the run directory could not be updated (exit 4)."""

    def after(ctx: Ctx) -> None:
        if trouble == "bucket gone":
            delete_bucket(ctx)
        else:
            assert ctx.proxy is not None
            ctx.proxy.outage(trouble)
        try:
            runner_down(ctx, expect_exit=4)
        finally:
            if ctx.proxy is not None:
                ctx.proxy.heal()

    return after


# -- Cloud Storage out of reach ---------------------------------------------------------------------------------


def outage_after(what: str, ready: Callable[[Ctx], bool], mode: Literal["reset", "blackhole"], seconds: float) -> Hook:
    """During: once `ready`, nothing that goes through the case's proxy (the VM and the runner) reaches Cloud
    Storage for `seconds`."""

    def during(ctx: Ctx) -> None:
        assert ctx.proxy is not None
        if ctx.wait_for(lambda: ready(ctx) or None, timeout=ctx.case.timeout_s) is None:
            ctx.problem(f"never saw {what}: no outage")
            return
        ctx.proxy.outage(mode, seconds=seconds)
        ctx.numbers["outage"] = {"mode": mode, "at": time.time(), "seconds": seconds}
        ctx.note(f"Cloud Storage {'black-holed' if mode == 'blackhole' else 'resetting'} for {seconds:.0f}s, from "
                 f"{what}")  # fmt: skip

    return during


def delete_bucket(ctx: Ctx) -> None:
    """The run directory's bucket, deleted with everything in it (Scenario.own_bucket: never the shared one)."""
    from google.cloud import storage  # type: ignore[attr-defined]

    assert ctx.case.own_bucket and ctx.run_dir is not None
    name = ctx.run_dir.removeprefix("gs://").split("/", 1)[0]
    bucket = storage.Client().bucket(name)
    for blob in list(bucket.list_blobs()):
        blob.delete()
    bucket.delete()
    ctx.numbers["bucket_deleted_at"] = time.time()
    ctx.note(f"deleted bucket {name} (the run directory's)")


def delete_bucket_while_creating(ctx: Ctx) -> None:
    """During: the run directory's bucket is deleted while the node is CREATING."""
    if ctx.wait_for(lambda: node_creating(ctx) or None, timeout=ctx.case.timeout_s, interval=0.1) is None:
        ctx.problem("the node was never CREATING: the bucket was not deleted")
        return
    delete_bucket(ctx)


# -- runner gc ----------------------------------------------------------------------------------------------------

ORPHAN_LABELS = {"managed-by": "tpu-runner", "tpu-runner-deadline": "1000000000"}  # a deadline long past


def plant_orphans(count: int, zone: str = ZONES[0]) -> Hook:
    """Setup: runner-labelled nodes of runs long over (past their deadline), as killed runners leave them."""

    def setup(ctx: Ctx) -> None:
        names = []
        for i in range(count):
            node = ctx.emulator.create_node_direct(
                PROJECT, zone, f"orphan-{i}", labels={**ORPHAN_LABELS, "tpu-runner-run": f"old-run-{i}"}
            )
            names.append(node.node_id)
        ctx.numbers["orphans"] = names

    return setup


def gc_with_one_denied_delete(ctx: Ctx, zone: str = ZONES[0]) -> None:
    """After: the first node deletion is denied (403), then `runner gc` sweeps the zone."""
    ctx.emulator.deny("tpu.nodes.delete", count=1)
    swept = ctx.cli("gc", "--project", PROJECT, "--zone", zone)
    ctx.numbers["gc_exit"] = swept.returncode
    ctx.numbers["gc_output"] = (swept.stdout + swept.stderr).strip().splitlines()


def plant_orphan_per_zone(zones: tuple[str, ...]) -> Hook:
    """Setup: one runner-labelled node of a run long over in each of `zones`."""

    def setup(ctx: Ctx) -> None:
        names = {}
        for i, zone in enumerate(zones):
            node = ctx.emulator.create_node_direct(
                PROJECT, zone, f"orphan-{i}", labels={**ORPHAN_LABELS, "tpu-runner-run": f"old-run-{i}"}
            )
            names[node.node_id] = zone
        ctx.numbers["orphans"] = names

    return setup


def gc_with_zone_refused(zones: tuple[str, ...], refused: str, status: int = 403) -> Hook:
    """After: every listing in `refused` is answered `status` (a zone the project may not use), then `runner gc`
    sweeps `zones`."""

    def after(ctx: Ctx) -> None:
        message = (
            f"Permission 'tpu.nodes.list' denied on 'projects/{PROJECT}/locations/{refused}' (or it may not exist)"
        )
        fault = ctx.emulator.http_errors(status, None, method="GET", path=rf"/locations/{refused}/", message=message)
        try:
            swept = ctx.cli("gc", "--project", PROJECT, *(arg for zone in zones for arg in ("--zone", zone)))
        finally:
            ctx.emulator.faults.remove(fault.id)
        ctx.numbers["gc_exit"] = swept.returncode
        ctx.numbers["gc_output"] = (swept.stdout + swept.stderr).strip().splitlines()

    return after


# -- a node that cannot be deleted ------------------------------------------------------------------------------


def billing_shown_then_down(ctx: Ctx) -> None:
    """After: every delete was refused, so the node still bills. `runner status` (text and JSON) and `runner list`
    must say so, naming the node and the command to retry; then the refusal is lifted and `runner down RUN`
    deletes it. The three reads run at once: the node bills while they do."""
    if ctx.run_id is None:
        ctx.problem("no run record")
        return
    run_id = ctx.run_id
    said: dict[str, Any] = {}

    def read(key: str, *args: str) -> None:
        said[key] = ctx.cli(*args)

    reads = [
        threading.Thread(target=read, args=("json", "status", run_id, "--json")),
        threading.Thread(target=read, args=("text", "status", run_id)),
        threading.Thread(target=read, args=("list", "list", "--json")),
    ]
    for t in reads:
        t.start()
    for t in reads:
        t.join(120)
    ctx.emulator.clear_faults("delete_fails")
    runner_down(ctx)
    try:
        cost = json.loads(said["json"].stdout).get("cost") or {}
        listed = next(r for r in json.loads(said["list"].stdout)["runs"] if r["run_id"] == run_id)
    except (KeyError, ValueError, StopIteration) as exc:
        ctx.problem(f"status or list could not be read: {exc!r}")
        return
    ctx.numbers["billing"] = {
        "status_cost_open": cost.get("open"),
        "list_cost_cell": listed.get("cost_cell"),
        "status_text": said["text"].stdout.splitlines(),
    }


# -- Compute Engine (the compute-engine backend: instances, and a slice's managed instance group) ---------------


def ce_preempt_mid_epoch(ctx: Ctx) -> None:
    """Preempt the run's Spot instance once the bucket's progress.json shows its job in the first half of an epoch
    before the last (as preempt_mid_epoch does for a TPU node)."""
    hit = ctx.wait_for(lambda: at_mid_epoch(ctx, ctx.running_instance), timeout=ctx.case.timeout_s, interval=0.2)
    if hit is None:
        ctx.problem("never saw progress.json in the middle of an epoch on a RUNNING instance: no preemption")
        return
    name, progress = hit
    ctx.emulator.compute.preempt(name)
    ctx.preemptions.append({"time": time.time(), "at_checkpoint": ctx.manifest_epoch() or 0, "progress": progress})
    ctx.note(
        f"preempted instance {name} at progress.json epoch {progress['epoch']} step {progress['step']}/"
        f"{progress['steps_per_epoch']} (global step {progress['global_step']})"
    )


def ce_creating(ctx: Ctx) -> bool:
    """The run's instance (or a VM of its slice) is being created: PROVISIONING or STAGING."""
    return any(i.status in ("PROVISIONING", "STAGING") for i in ctx.own_instances())


def ce_gc(zones: tuple[str, ...], startup_grace_s: float = 3.0) -> Hook:
    """After: `runner gc` over `zones`, as the user whose runner was killed runs it later. Later is rehearsed by a
    short startup grace (sweep_startup_grace_s, 20 min by default): a machine that old with no job on it is an
    orphan. Waits for that age first (by the API's clock the creation is a moment ago)."""

    def after(ctx: Ctx) -> None:
        held = ctx.own_compute_resources()
        ctx.numbers["before_gc"] = held
        time.sleep(startup_grace_s + 1)
        env = dict(ctx.env)
        timings = ",".join(filter(None, (env.get("RUNNER_TIMINGS"), f"sweep_startup_grace_s={startup_grace_s}")))
        env["RUNNER_TIMINGS"] = timings
        saved, ctx.env = ctx.env, env
        try:
            swept = ctx.cli("gc", "--project", PROJECT, *(arg for zone in zones for arg in ("--zone", zone)))
        finally:
            ctx.env = saved
        ctx.numbers["gc_exit"] = swept.returncode
        ctx.numbers["gc_output"] = (swept.stdout + swept.stderr).strip().splitlines()
        ctx.note(f"before `runner gc`: {', '.join(held) or 'nothing'}; gc exit {swept.returncode}")

    return after


def ce_delete_refused_then_down(ctx: Ctx) -> None:
    """After: every delete failed, so the instance bills on; what the run said is kept for the check, then the
    refusal is lifted and `runner down RUN` (the command the run named) deletes it."""
    ctx.numbers["left_after_run"] = ctx.own_compute_resources()
    ctx.emulator.compute.faults.clear()
    runner_down(ctx)
