"""Each case's own expectations, checked on the measured result: a check appends problems (the run is then not as
expected) and notes (what the table's notes say about the run). Factories take the case's numbers."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from faults.context import Ctx
from faults.measure import billed_spans, node_deletes, node_lifetimes
from faults.result import RunResult
from faults.scenario import Check, Train
from runner import contract

# Two runs of the same job, one of them resumed mid-epoch: how far their test accuracies may be apart. Same seed,
# same batches in the same order, so only floating point (and a resumed optimizer state) can differ.
ACCURACY_NOISE = 0.01


def _runner_events(ctx: Ctx, name: str) -> list[dict[str, object]]:
    return [e for e in ctx.events if str(e.get("source", "")).startswith("runner") and e.get("event") == name]


# -- preemption -------------------------------------------------------------------------------------------------


def preemptions(n: int) -> Check:
    def check(ctx: Ctx, result: RunResult) -> None:
        if len(ctx.preemptions) != n:
            result.problems.append(f"{len(ctx.preemptions)} preemption(s) injected, {n} planned")
        seen = _runner_events(ctx, "preempted")
        if len(seen) != len(ctx.preemptions):
            result.problems.append(f"the runner recorded {len(seen)} preemption(s), {len(ctx.preemptions)} happened")
        if ctx.case.trains:
            at = ", ".join(str(p["at_checkpoint"]) for p in ctx.preemptions)
            done = "; ".join(",".join(map(str, a.completed)) or "-" for a in ctx.attempts)
            result.notes.append(f"preempted with checkpoint epoch {at} in the bucket; epochs per attempt: {done}")

    return check


def lost_work(ctx: Ctx, result: RunResult) -> None:
    """`runner status --json`'s goodput against what the case staged: its causes add up to the billed time, and for
    each preemption of a training job the step it had reached is at least what the bucket showed when the case
    preempted it and at most the step its trainer's stop saved at (exactly that when the next attempt resumed from
    it), the step it resumed from is the one the next attempt's log says, the steps redone are the difference, and
    its dollars are its seconds at the run's price."""
    goodput = (ctx.status or {}).get("goodput")
    if not isinstance(goodput, dict):
        result.problems.append("`runner status --json` has no goodput")
        return
    billed = float(goodput["billed_s"])
    causes = sum(float(c["billed_s"] or 0) for c in goodput["causes"])
    if abs(causes - billed) > 0.01 + 0.001 * len(goodput["causes"]):
        result.problems.append(f"goodput's causes add up to {causes:.3f}s, the billed time is {billed:.3f}s")
    rows = [d for d in goodput["disruptions"] if d["kind"] == "preemption"]
    if len(rows) != len(ctx.preemptions):
        result.problems.append(f"{len(rows)} preemption row(s) in the goodput, {len(ctx.preemptions)} staged")
    job = ctx.case.job
    rate = goodput["billed_usd"] / billed if goodput.get("billed_usd") is not None and billed else None
    said = []
    for i, (row, staged) in enumerate(zip(rows, ctx.preemptions, strict=False)):
        said.append(
            f"preemption {i + 1}: step {row['reached_step']} reached, resumed from {row['resumed_step']}, "
            f"{row['redone_steps']} redone ({row['redone_s']}s), {row['lost_s']}s lost"
        )
        if rate is not None and row["lost_s"] is not None and abs(row["usd"] - row["lost_s"] * rate) > 1e-5:
            result.problems.append(f"preemption {i + 1}: ${row['usd']} for {row['lost_s']}s at ${rate}/s")
        if not isinstance(job, Train) or i + 1 >= len(ctx.attempts):
            continue
        before, after = ctx.attempts[i], ctx.attempts[i + 1]
        reached, resumed = row["reached_step"], row["resumed_step"]
        progress = staged.get("progress") or {}
        seen = progress.get("global_step", int(staged.get("at_checkpoint") or 0) * job.steps_per_epoch)
        if resumed != after.start_step:
            result.problems.append(f"preemption {i + 1}: resumed from step {resumed}, the log says {after.start_step}")
        if reached is None or reached < seen:
            result.problems.append(f"preemption {i + 1}: step {reached} reached, the bucket showed {seen} at staging")
        elif before.stop_step is not None and (
            reached > before.stop_step or (resumed == before.stop_step and reached != before.stop_step)
        ):
            result.problems.append(f"preemption {i + 1}: step {reached} reached, the stop saved at {before.stop_step}")
        if reached is not None and resumed is not None and row["redone_steps"] != reached - resumed:
            result.problems.append(f"preemption {i + 1}: {row['redone_steps']} steps redone, {reached} - {resumed}")
        if (row["redone_s"] or 0) > 0 and not row["redone_steps"]:
            result.problems.append(f"preemption {i + 1}: {row['redone_s']}s redone for no step")
    percent = goodput.get("percent")
    share = "not measured" if percent is None else f"{percent:.0f}%"
    result.notes.append(f"goodput {share} of {billed:.1f}s billed; " + "; ".join(said or ["no preemption row"]))


def boot_preemption(ctx: Ctx, result: RunResult) -> None:
    """A node taken back while it boots is a preemption (retries.preemptions), not a stockout."""
    preemptions(1)(ctx, result)
    zones = [name.split("/")[3] for _, name in node_lifetimes(ctx.requests)]
    result.notes.append(
        f"the runner recorded {len(_runner_events(ctx, 'preempted'))} preemption(s); creates accepted in: "
        f"{', '.join(zones) or 'none'}"
    )


def summary_steps(ctx: Ctx, result: RunResult) -> dict[str, object]:
    """summary.json's step counts against epochs x steps/epoch; a problem for each that differs."""
    job = ctx.case.job
    assert isinstance(job, Train)
    summary = ctx.read_json("summary.json") or {}
    planned = job.epochs * int(summary.get("steps_per_epoch") or job.steps_per_epoch)
    for key in ("global_step", "optimizer_iterations"):
        if summary.get(key) != planned:
            result.problems.append(
                f"summary.json {key} {summary.get(key)}, expected {job.epochs} x steps/epoch = {planned}"
            )
    return summary


def same_training_as_uninterrupted(ctx: Ctx, result: RunResult) -> None:
    """The resumed run took exactly the optimizer steps of an uninterrupted one, resumed mid-epoch, lost no step,
    and ends within noise of the uninterrupted run's accuracy (ctx.reference: the same job run first)."""
    summary = summary_steps(ctx, result)
    resumed: Any = summary.get("resumed_from") or {}
    if not isinstance(resumed, dict) or not resumed.get("step"):
        result.problems.append(f"the resume was not mid-epoch: summary.json resumed_from {resumed}")
    lost = [s for s in result.steps_lost or [] if s.steps or not s.exact]
    if lost:
        result.problems.append(f"steps trained twice (or unknown) after the preemption: {', '.join(map(str, lost))}")
    ref = ctx.reference or {}
    acc, ref_acc = summary.get("test_accuracy"), ref.get("test_accuracy")
    ctx.numbers.update(
        global_step=summary.get("global_step"),
        reference_global_step=ref.get("global_step"),
        accuracy=acc,
        reference_accuracy=ref_acc,
        steps_this_attempt=summary.get("steps_this_attempt"),
    )
    if ref.get("global_step") != summary.get("global_step"):
        result.problems.append(f"global step {summary.get('global_step')}, uninterrupted {ref.get('global_step')}")
    if not isinstance(acc, float) or not isinstance(ref_acc, float) or abs(acc - ref_acc) > ACCURACY_NOISE:
        result.problems.append(f"test accuracy {acc} vs {ref_acc} uninterrupted (noise allowed {ACCURACY_NOISE})")
    result.notes.append(
        f"optimizer steps: {summary.get('global_step')} (uninterrupted {ref.get('global_step')}; the resumed attempt "
        f"trained {summary.get('steps_this_attempt')} from {resumed.get('checkpoint')}); test accuracy {acc} "
        f"(uninterrupted {ref_acc})"
    )


def resumed_past_torn_checkpoint(ctx: Ctx, result: RunResult) -> None:
    """The resumed attempt skipped the torn checkpoint, said why, and went on from the older one."""
    torn, older = ctx.numbers.get("torn"), ctx.numbers.get("older")
    last = ctx.attempts[-1] if len(ctx.attempts) > 1 else None
    if torn is None or last is None:
        result.problems.append("no resume after a torn checkpoint")
        return
    if torn not in [name for name, _ in last.skipped]:
        result.problems.append(f"the resumed trainer did not say it skipped {torn}; its resume: {result.recovered}")
    if last.position != older:
        result.problems.append(f"resumed from {last.resumed_from}, expected the older checkpoint at {older}")
    summary_steps(ctx, result)


def resumed_by_scan(ctx: Ctx, result: RunResult) -> None:
    """With latest.json garbage, the resumed attempt said so, scanned, and went on from the newest file."""
    last = ctx.attempts[-1] if len(ctx.attempts) > 1 else None
    if last is None:
        result.problems.append("no resume after the manifest was broken")
        return
    if last.scanned != "unreadable":
        result.problems.append(f"the resumed trainer did not say latest.json is unreadable ({last.scanned})")
    newest = ctx.numbers.get("newest_before")
    if last.position != newest:
        result.problems.append(f"resumed from {last.resumed_from}, the newest checkpoint file was {newest}")
    summary_steps(ctx, result)


# -- the runner's death -----------------------------------------------------------------------------------------


def status_after_kill(ctx: Ctx, result: RunResult) -> None:
    if ctx.killed_at is None:
        result.problems.append("the runner was never killed")
        return
    ended = [e for e in ctx.exit_records if e.get("finished_at")]
    what = ", ".join(
        f"{e.get('state')} (exit {e.get('exit_code')}) {float(e['finished_at']) - ctx.killed_at:.0f}s after the kill"
        for e in ended
    )
    result.notes.append(f"the VM alone recorded {what or 'nothing'}; `runner status` then says {result.got}")


def deleted_while_creating(ctx: Ctx, result: RunResult) -> None:
    """`runner down` deleted the node before it ever booted: no VM started, the delete was the runner's."""
    if ctx.killed_at is None:
        result.problems.append("the runner was never killed")
    booted = [e for e in ctx.events if e.get("event") == "bootstrap_started"]
    if booted:
        result.problems.append(f"{len(booted)} VM(s) booted: the node was not deleted while CREATING")
    deletes = node_deletes(ctx.requests)
    if not deletes or any(who != "runner" for _, _, who in deletes):
        result.problems.append(f"accepted deletes: {deletes}; expected `runner down`'s")
    elif ctx.killed_at:
        result.notes.append(
            f"runner killed while CREATING; `runner down` took {ctx.numbers.get('down_s')}s, its DELETE came "
            f"{deletes[0][0] - ctx.killed_at:.1f}s after the kill"
        )


# -- safety stops -----------------------------------------------------------------------------------------------


def safety_stop(ctx: Ctx, result: RunResult) -> None:
    """The job itself stopped with 124 (a safety net on the VM), and said why."""
    for e in ctx.exit_records:
        if e.get("exit_code") != 124:
            result.problems.append(f"worker exit code {e.get('exit_code')}, expected 124 (safety stop)")
        if e.get("started_at") and e.get("finished_at"):
            took = float(e["finished_at"]) - float(e["started_at"])
            result.notes.append(f"job stopped {took:.0f}s after it started: {e.get('error')}")
    if not ctx.exit_records:
        result.problems.append("no exit record")


def runner_deleted_at_deadline(ctx: Ctx, result: RunResult) -> None:
    """The VM did not know the deadline (drop-env): the runner must delete at it, within seconds."""
    deadline = float(ctx.run_record().get("deadline") or 0)
    deletes = [(t, who) for t, _, who in node_deletes(ctx.requests)]
    if not deletes:
        result.problems.append("the node was never deleted")
        return
    t, who = deletes[0]
    ctx.numbers["delete_after_deadline_s"] = round(t - deadline, 2)
    result.notes.append(f"node deleted {t - deadline:.1f}s after the deadline, by the {who}")
    if who != "runner":
        result.problems.append(f"the first delete was the {who}'s, not the runner's")
    if not -1.0 <= t - deadline <= 10.0:
        result.problems.append(f"deleted {t - deadline:.1f}s after the deadline; goal: within 10s")
    if any(e.get("exit_code") == 124 for e in ctx.exit_records):
        result.problems.append("the job stopped itself (124): the drop-env fault did not keep the deadline from it")
    store = ctx.storage()
    log = (store.read_bytes("logs/worker-0.log") or b"").decode(errors="replace") if store else ""
    if f"{contract.DEADLINE}: None" not in log:  # the job's own first line (scenarios/deadlines.py)
        result.problems.append(f"the job did not say it was without {contract.DEADLINE}: the drop-env fault failed")


def boot_timeouts(count: int) -> Check:
    """The runner gave up on `count` silent VMs (boot_timeout), each deleted by the runner, never by the VM."""

    def check(ctx: Ctx, result: RunResult) -> None:
        seen = _runner_events(ctx, "boot_timeout")
        if len(seen) != count:
            result.problems.append(f"{len(seen)} boot_timeout event(s), expected {count}")
        creates = node_lifetimes(ctx.requests)
        deletes = node_deletes(ctx.requests)
        gaps = []
        for created, name in creates[:count]:
            gone = next((t for t, n, _ in deletes if n == name and t >= created), None)
            gaps.append("never" if gone is None else f"{gone - created:.1f}s")
        result.notes.append(f"{len(creates)} create(s); silent node(s) deleted after: {', '.join(gaps)} (incl. boot)")
        if any(who != "runner" for _, _, who in deletes[:count]):
            result.problems.append("a silent node was deleted by someone other than the runner")
        if result.expected == "failed":
            reason = str(ctx.run_record().get("reason") or "")
            result.notes.append(f"reason: {reason}")
            if "boot_timeout" not in reason:
                result.problems.append(f"the run's reason does not name boot_timeout: {reason!r}")

    return check


# -- the API and Cloud Storage ----------------------------------------------------------------------------------


def nothing_created(ctx: Ctx, result: RunResult) -> None:
    creates = [r for r in ctx.requests if r.method == "POST" and r.path.endswith("/nodes")]
    if creates:
        result.problems.append(f"{len(creates)} create request(s) sent")
    result.notes.append(f"{len(creates)} create requests; refused before anything was paid for")


def image_pulled(ctx: Ctx, result: RunResult) -> None:
    """Each VM that started the job pulled the real image first: the seconds from its bootstrap's start to its
    container's (the startup breakdown's "image pull"), in the notes and numbers."""
    boots = sorted(
        (float(str(e["time"])), str(e.get("event")))
        for e in ctx.events
        if str(e.get("source", "")).startswith("bootstrap-")
        and e.get("event") in ("bootstrap_started", "container_started")
    )
    pulls, started = [], None
    for when, event in boots:
        if event == "bootstrap_started":
            started = when
        elif started is not None:
            pulls.append(round(when - started, 1))
            started = None
    result.numbers["image_pull_s"] = pulls
    if not pulls:
        result.problems.append("no VM started its container: no image pull to measure")
    result.notes.append(f"image pulled from the registry by each VM in {', '.join(f'{s:.1f}s' for s in pulls)}")


def vm_recorded_pull_failure(ctx: Ctx, result: RunResult) -> None:
    if not any(e.get("event") == "image_pull_failed" for e in ctx.events):
        result.problems.append("no image_pull_failed event from the VM")
    codes = sorted({e.get("exit_code") for e in ctx.exit_records}, key=str)
    result.notes.append(f"VM recorded image_pull_failed; exit record codes {codes}")


def ran_in(zone: str) -> Check:
    def check(ctx: Ctx, result: RunResult) -> None:
        ran = [name.split("/")[3] for _, name in node_lifetimes(ctx.requests)]
        result.notes.append(f"creates accepted in: {', '.join(ran)}")
        ended = [i.node.split("/")[3] for i in ctx.idle]
        if ended and ended[-1] != zone:
            result.problems.append(f"the job ran in {ended[-1]}, expected {zone}")

    return check


def queued_ran_in(zone: str) -> Check:
    """Queued resources: one created per zone up to `zone`, where the job ran; each deleted once, with force (its
    node with it), and none left."""

    def check(ctx: Ctx, result: RunResult) -> None:
        accepted = [r for r in ctx.emulator.requests if r.status < 300 and "/queuedResources" in r.path]
        created = [r.path.split("/")[5] for r in accepted if r.method == "POST"]
        deleted = [r for r in accepted if r.method == "DELETE"]
        result.notes.append(f"queued in: {', '.join(created)}")
        if not created or created[-1] != zone:
            result.problems.append(
                f"the last queued resource was in {created[-1] if created else 'no zone'}, not {zone}"
            )
        if sorted(r.path.split("/")[5] for r in deleted) != sorted(created):
            result.problems.append(f"{len(deleted)} queued-resource deletes for {len(created)} created")
        if any(r.query.get("force") != "true" for r in deleted):
            result.problems.append("a queued resource was deleted without force")
        if any(r.method == "POST" and r.path.endswith("/nodes") for r in ctx.emulator.requests):
            result.problems.append("a node was created directly, not through its queued resource")
        left = ctx.emulator.queued_resources()
        if left:
            result.problems.append(f"{len(left)} queued resource(s) left: {', '.join(q['name'] for q in left)}")

    return check


def http_burst(status: int, count: int) -> Check:
    def check(ctx: Ctx, result: RunResult) -> None:
        hits = [r for r in ctx.requests if r.status == status]
        if len(hits) != count:
            result.problems.append(f"{len(hits)} requests answered {status}, {count} injected")
        where = Counter(f"{r.method} {'nodes/*' if r.path.count('/') > 6 else r.path.rsplit('/', 1)[-1]}" for r in hits)
        result.notes.append(f"{status}s answered to: " + ", ".join(f"{k} x{v}" for k, v in where.items()))

    return check


def delete_answers(ctx: Ctx, result: RunResult) -> None:
    deletes = [r for r in ctx.requests if r.method == "DELETE"]
    result.notes.append("DELETE answers in order: " + ", ".join(f"{r.status} ({r.caller})" for r in deletes))


def failed_delete_retried(ctx: Ctx, result: RunResult) -> None:
    """A delete operation failed; someone read it and asked again, and the node went."""
    failed = ctx.numbers.get("failed_deletes") or []
    if len(failed) != 1:
        result.problems.append(f"{len(failed)} delete operation(s) failed, 1 injected")
    delete_answers(ctx, result)
    ok = node_deletes(ctx.requests)
    result.notes.append("accepted DELETEs: " + ", ".join(f"{who} at +{t - ok[0][0]:.1f}s" for t, _, who in ok))
    if len(ok) < 2:
        result.problems.append("the failed deletion was never asked again")


def collision_left_alone(ctx: Ctx, result: RunResult) -> None:
    """The runner named its node anew and never touched the other run's node, which is still READY."""
    taken = [r for r in ctx.requests if r.method == "POST" and r.status == 409]
    created = [name.rsplit("/", 1)[-1] for _, name in node_lifetimes(ctx.requests)]
    others = ctx.others_nodes()
    touched = [
        r for r in ctx.requests if r.method == "DELETE" and any(r.path.endswith(f"/{n.node_id}") for n in others)
    ]
    result.notes.append(
        f"409 on {[r.node_id for r in taken]}; created {created}; the other run's node: "
        + ", ".join(f"{n.node_id} {n.state}" for n in others)
    )
    if len(taken) != 1 or not created or created[0] in [r.node_id for r in taken]:
        result.problems.append("the runner did not create its node under a new name after the 409")
    if touched:
        result.problems.append(f"the runner sent DELETE for the other run's node: {[r.path for r in touched]}")
    if [n.state for n in others] != ["READY"]:
        result.problems.append(f"the other run's node should still be READY: {[(n.node_id, n.state) for n in others]}")


def gc_reported_each(ctx: Ctx, result: RunResult) -> None:
    """gc tried every orphan, reported each, exited 5, and the denied one is the only node left."""
    orphans: list[str] = ctx.numbers.get("orphans") or []
    said: list[str] = ctx.numbers.get("gc_output") or []
    if ctx.numbers.get("gc_exit") != 5:
        result.problems.append(f"`runner gc` exited {ctx.numbers.get('gc_exit')}, expected 5")
    outcomes = {}
    for name in orphans:
        lines = [s for s in said if f" {name} " in f"{s} " and ("deleted" in s or "could not delete" in s)]
        outcomes[name] = "denied" if any("could not delete" in s for s in lines) else "deleted" if lines else "?"
    left = [n.node_id for n in ctx.others_nodes()]
    result.notes.append(f"gc: {outcomes}; exit {ctx.numbers.get('gc_exit')}; nodes left: {left}")
    if sorted(outcomes.values()) != ["deleted"] * (len(orphans) - 1) + ["denied"]:
        result.problems.append(f"gc should report each orphan, one denied: {outcomes}")
    if left != [n for n, o in outcomes.items() if o == "denied"]:
        result.problems.append(f"nodes left {left}; expected only the denied orphan")


def gcs_faults(ctx: Ctx, result: RunResult) -> None:
    assert ctx.proxy is not None
    names = Counter(Path(r.object_name or "?").name for r in ctx.proxy.injected)
    if not names or any(n != ctx.case.gcs_faults for n in names.values()):
        result.problems.append(f"uploads failed by the proxy: {dict(names)}; planned {ctx.case.gcs_faults} each")
    result.notes.append("503 to uploads of " + ", ".join(f"{k} x{v}" for k, v in sorted(names.items())))
    manifest = ctx.final_manifest or {}
    result.notes.append(f"bucket checkpoints: {sorted(ctx.checkpoints())}; manifest names {manifest.get('path')}")


def exit_record(ctx: Ctx, result: RunResult) -> None:
    assert ctx.proxy is not None
    if len(ctx.proxy.injected) != 1:
        result.problems.append(f"{len(ctx.proxy.injected)} exit-record checks failed by the proxy, 1 planned")
    for e in ctx.exit_records:
        result.notes.append(
            f"exit/worker-{e.get('worker')}.json in the end: {e.get('state')}, exit {e.get('exit_code')}"
            + (f", {e.get('error')!r}" if e.get("error") else "")
        )


# -- Cloud Storage out of reach, deletes refused, clocks off ----------------------------------------------------


def nothing_deleted_early(ctx: Ctx, result: RunResult) -> None:
    """Storage was out of reach while the job ran: no DELETE before the job's own end, the job's own exit record
    (exit 0, not a SIGTERM's 143), and the runner said that it could not tell rather than judging."""
    outage = ctx.numbers.get("outage")
    if not outage:
        result.problems.append("no outage was injected")
        return
    ends = [float(e["time"]) for e in ctx.events if e.get("event") == "container_exited"]
    deletes = node_deletes(ctx.requests)
    if not ends:
        result.problems.append("the container never exited")
    elif deletes and deletes[0][0] < ends[0]:
        result.problems.append(f"DELETE by the {deletes[0][2]} {ends[0] - deletes[0][0]:.0f}s before the job ended")
    codes = [e.get("exit_code") for e in ctx.exit_records]
    if codes != [0]:
        result.problems.append(f"exit records' codes {codes}, expected [0]: the job was stopped")
    said = (ctx.home.parent / "runner.out").read_text(errors="replace")
    lost = [line for line in said.splitlines() if "state is unknown" in line]
    back = [line for line in said.splitlines() if "can be read again" in line]
    if not lost or not back:
        result.problems.append("the runner did not say that it lost sight of the run directory and found it again")
    ended = f"{ends[0] - outage['at'] - outage['seconds']:.0f}s after the outage" if ends else "never"
    result.notes.append(
        f"{outage['mode']} {outage['seconds']:.0f}s; the job ended {ended}; the runner said: "
        f"{lost[0].strip() if lost else '-'} / {back[0].strip() if back else '-'}"
    )


def down_deleted_first(ctx: Ctx, result: RunResult) -> None:
    """`runner down` with the run directory out of reach: its DELETE within seconds, then the storage failure said."""
    after = ctx.numbers.get("down_delete_after_s")
    if after is None:
        result.problems.append("`runner down` sent no DELETE")
    elif after > 10.0:
        result.problems.append(f"`runner down` sent its DELETE only {after:.1f}s after it started")
    said = " ".join(ctx.numbers.get("down_output") or [])
    if "gone" not in said:
        result.problems.append("`runner down` did not confirm the node gone")
    if "run directory" not in said:
        result.problems.append("`runner down` did not say that the run directory could not be updated")


def gc_swept_around_refused_zone(ctx: Ctx, result: RunResult) -> None:
    """gc reported the zone it could not list (with the API's reason), swept the others, and exited 5."""
    orphans: dict[str, str] = ctx.numbers.get("orphans") or {}
    said: list[str] = ctx.numbers.get("gc_output") or []
    refused = [line for line in said if "could not list" in line]
    deleted = sorted(name for name in orphans if any(f"deleted node {name} " in f"{line} " for line in said))
    left = sorted(n.node_id for n in ctx.others_nodes())
    result.notes.append(f"gc exit {ctx.numbers.get('gc_exit')}; deleted {deleted}; left {left}; said {refused}")
    if ctx.numbers.get("gc_exit") != 5:
        result.problems.append(f"`runner gc` exited {ctx.numbers.get('gc_exit')}, expected 5")
    if not refused or "denied" not in refused[0]:
        result.problems.append("gc did not report the refused zone with the API's reason")
    kept = sorted(name for name, zone in orphans.items() if any(zone in line for line in refused))
    if deleted != sorted(set(orphans) - set(kept)) or left != kept:
        result.problems.append(f"expected every orphan deleted but the refused zone's ({kept}); deleted {deleted}")


def still_billing_shown(ctx: Ctx, result: RunResult) -> None:
    """Every delete was refused: status and list say the node still bills, with the node and the retry command."""
    billing = ctx.numbers.get("billing") or {}
    text = "\n".join(billing.get("status_text") or [])
    node = ctx.run_id or "?"
    result.notes.append(
        f"status cost open: {billing.get('status_cost_open')}; list cost: {billing.get('list_cost_cell')}; "
        + "; ".join(line.strip() for line in billing.get("status_text") or [] if "bill" in line)
    )
    if billing.get("status_cost_open") is not True:
        result.problems.append("`runner status --json` says the cost is closed while the node bills")
    if not str(billing.get("list_cost_cell", "")).endswith("+"):
        result.problems.append(f"`runner list` shows {billing.get('list_cost_cell')!r}, not a cost marked '+'")
    if node not in text or "runner down" not in text:
        result.problems.append("`runner status` does not name the node and `runner down` to retry")


def cost_within(tolerance_s: float) -> Check:
    """The READY seconds the run was charged for against the API's own timestamps (the truth), within tolerance."""

    def check(ctx: Ctx, result: RunResult) -> None:
        status = ctx.cli("status", ctx.run_id or "?", "--json")
        try:
            cost = json.loads(status.stdout)["cost"]
            charged = float(cost["ready_seconds"])
        except (KeyError, TypeError, ValueError):
            result.problems.append(f"no cost in `runner status --json`: {status.stdout[-200:]}")
            return
        spans = [
            (r, d)
            for node in {n for _, n in node_lifetimes(ctx.requests)}
            for r, d in billed_spans(ctx.operations, node)
        ]
        truth = sum((d - r) for r, d in spans if d is not None)
        ctx.numbers["cost_seconds"] = {"charged": charged, "truth": round(truth, 3), "usd": cost.get("usd")}
        result.notes.append(
            f"charged {charged:.2f}s READY (${cost.get('usd', 0):.4f}); the API's timestamps say {truth:.2f}s"
            + ("; still open" if cost.get("open") else "")
        )
        if any(d is None for _, d in spans) or not spans:
            result.problems.append(f"the node's READY spans by the API: {spans}")
        if abs(charged - truth) > tolerance_s or cost.get("open"):
            result.problems.append(f"charged {charged:.2f}s, the truth is {truth:.2f}s (tolerance {tolerance_s}s)")

    return check


def log_upload_volume(expected_bytes: int, digest: str) -> Check:
    """What the VM uploaded for its log, against the bytes the job wrote; `runner logs` gives back those bytes."""

    def check(ctx: Ctx, result: RunResult) -> None:
        import hashlib

        assert ctx.proxy is not None
        uploads = [
            r
            for r in ctx.proxy.requests
            if r.method in ("POST", "PUT") and "logs/worker-0.log" in (r.object_name or r.path)
        ]
        sent = sum(r.size for r in uploads)
        ctx.numbers["log_bytes_uploaded"] = sent
        shown = ctx.cli("logs", ctx.run_id or "?")
        got = hashlib.sha256(shown.stdout.encode()).hexdigest()
        result.notes.append(
            f"{sent / 1e6:.1f} MB uploaded for {expected_bytes / 1e6:.1f} MB of output, in {len(uploads)} requests; "
            f"`runner logs` {'gives back the same bytes' if got == digest else 'DIFFERS'} ({len(shown.stdout)} bytes)"
        )
        if not expected_bytes <= sent <= 1.25 * expected_bytes:
            result.problems.append(f"{sent} bytes uploaded for {expected_bytes} bytes of output")
        if got != digest:
            result.problems.append(f"`runner logs` printed {len(shown.stdout)} bytes that differ from the job's output")

    return check


# -- Compute Engine ---------------------------------------------------------------------------------------------


def ce_created_in(zone: str) -> Check:
    """The instance the job ran on was created in `zone` (accepted inserts, zone by zone, as the emulator saw them)."""

    def check(ctx: Ctx, result: RunResult) -> None:
        inserts = [
            (r.path.split("/")[6], r.status)
            for r in ctx.emulator.requests
            if r.method == "POST" and r.path.startswith("/compute/v1/projects/") and r.path.endswith("/instances")
        ]
        result.notes.append(f"instance inserts (zone, HTTP status): {inserts}")
        runner_out = (ctx.home.parent / "runner.out").read_text(errors="replace")
        if f"in {zone}" not in runner_out or not inserts or inserts[-1][0] != zone:
            result.problems.append(f"the instance was not created in {zone}: {inserts}")

    return check


def ce_gc_swept(*kinds: str) -> Check:
    """`runner gc` found each of `kinds` of the run (instance, instance group, ...) orphaned and deleted it."""

    def check(ctx: Ctx, result: RunResult) -> None:
        said = ctx.numbers.get("gc_output") or []
        result.notes.append("runner gc: " + " | ".join(line for line in said if "deleted" in line or "ORPHAN" in line))
        if ctx.numbers.get("gc_exit") != 0:
            result.problems.append(f"`runner gc` exited {ctx.numbers.get('gc_exit')}: {said[-3:]}")
        for kind in kinds:
            if not any(line.startswith(f"runner: deleted {kind} ") for line in said):
                result.problems.append(f"`runner gc` did not delete the run's {kind}")

    return check


def ce_left_and_how_to_delete(ctx: Ctx, result: RunResult) -> None:
    """Every delete failed: the run must name the instance still billing and say how to delete it."""
    said = (ctx.home.parent / "runner.out").read_text(errors="replace")
    name = ctx.run_id or "?"
    lines = [line for line in said.splitlines() if name in line and ("bill" in line or "delete" in line)]
    result.notes.append("the run said: " + " | ".join(lines[-2:]))
    if not ctx.numbers.get("left_after_run"):
        result.problems.append("nothing was left after the run: the deletes did not fail")
    if not any("runner down" in line or "gcloud compute" in line for line in said.splitlines()):
        result.problems.append("the run did not say how to delete what is left")
