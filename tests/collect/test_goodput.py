"""Goodput from hand-made events: where each billed second went, what each disruption cost, and what was not measured.
Every expected figure is worked out here by hand from the fixture's times (written beside it), never taken from the
code's own formulas."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from runner.collect.cost import node_spans, price_for
from runner.collect.facts import gather
from runner.collect.goodput import Cause, Goodput, compute, record_in_summary
from runner.collect.timeline import build_timeline, startup
from runner.plan import catalog
from runner.storage import open_storage
from runner.watch.events import Event
from runner.watch.runs import RunRecord
from runner.watch.state import RunState

T0 = 1_800_000_000.0
NODE = {"node_id": "job-1", "created": True}
END = T0 + 10_000  # `now`: after every fixture's end


def ev(t: float, kind: str, source: str = "runner", **fields: object) -> Event:
    return Event(T0 + t, source, kind, dict(fields))


def row(epoch: int, ended: float, took: float, step: int) -> dict[str, object]:
    return {"epoch": epoch, "loss": 1.0 / epoch, "time": T0 + ended, "epoch_time_s": took, "global_step": step}


def goodput(events: list[Event], rows: list[dict[str, object]], price_of: str | None, **kw: object) -> Goodput:
    timeline = build_timeline(events, rows)
    price = price_for(price_of, spot=bool(kw.pop("spot", False)), slices=int(kw.pop("slices", 1))) if price_of else None
    spans = node_spans(events, now=END)
    return compute(timeline, rows, spans, price, billable=bool(kw.pop("billable", True)), **kw)  # type: ignore[arg-type]


def billed(g: Goodput) -> dict[str, float | None]:
    return {c.key: None if c.billed_s is None else round(c.billed_s, 3) for c in g.causes}


def test_a_run_s_billed_time_split_by_cause_adds_up_to_the_billed_time() -> None:
    """One v5litepod-8 (8 chips, on demand) that trains 3 epochs with the built-in trainer and deletes itself."""
    events = [
        ev(0, "submitted"),
        ev(1, "provisioning", handle=NODE),
        ev(61, "provisioned", handle=NODE, ready_at=T0 + 60),  # READY at 60 by the API: billing starts
        ev(70, "bootstrap_started", "bootstrap-0"),
        ev(100, "container_started", "bootstrap-0"),
        ev(102, "worker_started", "worker-0"),
        ev(103, "job_started", "worker-0"),
        ev(120, "framework_imported", "trainer-0"),
        ev(125, "device_found", "trainer-0"),
        ev(135, "data_loaded", "trainer-0", seconds=8.0),  # 127 -> 135
        ev(160, "first_step", "trainer-0"),
        ev(410, "checkpoint_saved", "trainer-0", seconds=10.0, step=100),  # after epoch 1's row
        ev(660, "checkpoint_saved", "trainer-0", seconds=10.0, step=200),
        ev(910, "checkpoint_saved", "trainer-0", seconds=10.0, step=300),  # after the last row: in the evaluation
        ev(950, "worker_exited", "worker-0", state="succeeded", exit_code=0),
        ev(960, "container_exited", "bootstrap-0"),
        ev(965, "delete_requested", "bootstrap-0"),  # billing ends
        ev(990, "teardown_done", confirmed=True),
    ]
    rows = [row(1, 400, 250, 100), row(2, 650, 240, 200), row(3, 900, 240, 300)]
    g = goodput(events, rows, "v5litepod-8", no_price=None)
    assert g.billed_s == pytest.approx(905)  # 60 -> 965
    assert billed(g) == {
        "productive": 720.0,  # first step 160 -> last epoch 900, less two saves of 10
        "capacity": 0.0,
        "provisioning": 10.0,  # READY 60 -> the provisioned event 61, boot 61 -> 70
        "image_pull": 30.0,  # 70 -> 100
        "startup": 52.0,  # container start 3, import 17, device 5, to the first step 35 less the data's 8
        "data": 8.0,
        "checkpoint_restore": 0.0,  # a first attempt restores nothing: measured
        "checkpoint_save": 30.0,
        "redone": 0.0,
        "evaluation": 40.0,  # 900 -> 950, less the last save
        "idle": 15.0,  # the job's end 950 -> the delete request 965
        "job": 0.0,
        "unmeasured": 0.0,
    }
    assert sum(c.billed_s or 0 for c in g.causes) == pytest.approx(g.billed_s)
    per_second = 8 * catalog.generations()["v5litepod"].on_demand_price / 3600
    assert g.percent == pytest.approx(100 * 720 / 905)
    assert g.usd == pytest.approx(720 * per_second) and g.billed_usd == pytest.approx(905 * per_second)
    assert g.cause("checkpoint_save").usd == pytest.approx(30 * per_second)
    # what did not bill: the create to READY (1 -> 60, the submit's second before it too), the delete to confirmed
    assert g.cause("provisioning").waited_s == pytest.approx(60)
    assert g.cause("idle").waited_s == pytest.approx(25)
    rows_text = dict(g.rows())
    assert rows_text["goodput"].startswith("80% of 15m05s billed: 12m of productive steps, $")
    assert rows_text["badput"].startswith("start-up and compile 52s, final evaluation 40s, image pull 30s, checkpoint")
    assert "create to READY 1m" in rows_text["not billed"]
    assert g.cell() == "80%" and g.disruptions == ()
    data = g.to_json()
    assert data["percent"] == pytest.approx(79.56, abs=0.01) and data["productive_s"] == 720.0


def two_preemptions() -> tuple[list[Event], list[dict[str, object]]]:
    """A Spot v4-8 (4 chips) preempted twice; each recreated machine resumes (100 steps an epoch)."""
    events = [
        ev(0, "submitted"),
        ev(1, "provisioning", handle=NODE),
        ev(20, "provisioned", handle=NODE),
        ev(25, "job_started", "worker-0"),
        ev(30, "framework_imported", "trainer-0"),
        ev(32, "device_found", "trainer-0"),
        ev(40, "first_step", "trainer-0"),
        ev(145, "checkpoint_saved", "trainer-0", seconds=5.0, step=100),  # after epoch 1's row (140)
        ev(195, "checkpoint_saved", "trainer-0", seconds=5.0, step=150),  # the preemption notice's save
        ev(197, "worker_exited", "worker-0", state="cancelled", exit_code=143),
        ev(200, "preempted", attempt=1, retry=True),
        ev(205, "teardown_requested", state="replacing"),
        ev(210, "teardown_done", confirmed=True),
        # machine 2: its supervisor restores (252 -> 254), its trainer loads (269 -> 272) and resumes at 140
        ev(220, "provisioning", handle={"node_id": "job-2"}),
        ev(250, "provisioned", handle={"node_id": "job-2"}),
        ev(254, "checkpoint_restored", "worker-0", seconds=2.0, stage="download"),
        ev(255, "worker_started", "worker-0"),
        ev(256, "job_started", "worker-0"),
        ev(262, "framework_imported", "trainer-0"),
        ev(264, "device_found", "trainer-0"),
        ev(272, "checkpoint_restored", "trainer-0", seconds=3.0, stage="load"),
        ev(273, "resumed_from_checkpoint", "trainer-0", checkpoint="checkpoints/a", step=140, redone=10),
        ev(280, "first_step", "trainer-0"),
        ev(335, "checkpoint_saved", "trainer-0", seconds=5.0, step=200),
        ev(360, "preempted", attempt=2, retry=True),  # killed outright: no exit, nothing after the save
        ev(365, "teardown_requested", state="replacing"),
        ev(370, "teardown_done", confirmed=True),
        # machine 3 resumes at 200, 30 steps before where machine 2 had got
        ev(380, "provisioning", handle={"node_id": "job-3"}),
        ev(400, "provisioned", handle={"node_id": "job-3"}),
        ev(405, "job_started", "worker-0"),
        ev(410, "framework_imported", "trainer-0"),
        ev(412, "device_found", "trainer-0"),
        ev(415, "resumed_from_checkpoint", "trainer-0", checkpoint="checkpoints/b", step=200, redone=30),
        ev(420, "first_step", "trainer-0"),
        ev(485, "checkpoint_saved", "trainer-0", seconds=5.0, step=300),
        ev(500, "worker_exited", "worker-0", state="succeeded", exit_code=0),
        ev(505, "delete_requested", "bootstrap-0"),
    ]
    rows = [row(1, 140, 105, 100), row(2, 330, 55, 200), row(3, 480, 62, 300)]
    return events, rows


def test_two_preemptions_each_with_its_steps_redone_and_what_it_cost() -> None:
    events, rows = two_preemptions()
    g = goodput(events, rows, "v4-8", spot=True)
    # Machine 2's training 280 -> 330 goes from step 141 (its first step done) to 200: step 150 at 280 + 9/59 x 50.
    # Machine 3's 420 -> 480 goes 201 -> 300: step 230 at 420 + 29/99 x 60.
    redo_2, redo_3 = 50 * 9 / 59, 60 * 29 / 99
    assert g.billed_s == pytest.approx(180 + 110 + 105)
    assert billed(g) == {
        "productive": round(147 + (50 - redo_2) + (60 - redo_3), 3),
        "capacity": 0.0,
        "provisioning": 0.0,
        "image_pull": 0.0,
        "startup": 20.0 + 25.0 + 20.0,  # machine 2's worker start less the download, first step less the load
        "data": None,  # no data_loaded: not measured, never 0
        "checkpoint_restore": 5.0,
        "checkpoint_save": 20.0,
        "redone": round(redo_2 + redo_3, 3),
        "evaluation": 15.0,
        "idle": 8.0,  # machine 1: its exit 197 -> the preemption 200; machine 3: 500 -> 505
        "job": 0.0,
        "unmeasured": 25.0,  # machine 2 after its last save: nothing says what it did until it went
    }
    assert sum(c.billed_s or 0 for c in g.causes) == pytest.approx(g.billed_s)
    assert g.cause("redone").steps == 40
    first, second = g.disruptions
    assert (first.kind, first.attempt, first.reached_step, first.resumed_step, first.redone_steps) == (
        "preemption",
        1,
        150,
        140,
        10,
    )
    assert first.redone_s == pytest.approx(redo_2)
    assert first.restart_s == pytest.approx(3 + 30)  # machine 1 after its training (197 -> 200), machine 2 to 280
    assert first.back_after_s == pytest.approx(80)
    assert (second.reached_step, second.resumed_step, second.redone_steps) == (230, 200, 30)
    assert second.redone_s == pytest.approx(redo_3)
    assert second.restart_s == pytest.approx(30 + 20)  # machine 2 after 330, machine 3 from 400 to 420
    per_second = 4 * catalog.generations()["v4"].spot_price / 3600
    assert second.usd == pytest.approx((50 + redo_3) * per_second)
    assert second.lost_s == pytest.approx(50 + redo_3)
    said = dict(g.rows())["disruption 1"]
    assert said.startswith("preemption of machine 1 at 3m20s: step 150 reached, resumed from step 140, 10 steps")
    assert [d["reached_step"] for d in g.to_json()["disruptions"]] == [150, 230]


def test_a_job_the_platform_restarted_on_the_same_machines_is_a_second_attempt() -> None:
    """A JobSet's node taken away mid-epoch: the JobSet restarts itself on its pool (no new provisioning), and the
    runner records `restarted`. The restart begins attempt 2: the resume it says is the disruption's."""
    events = [
        ev(0, "submitted"),
        ev(1, "provisioning", handle=NODE),
        ev(20, "provisioned", handle=NODE),
        ev(25, "job_started", "worker-0"),
        ev(30, "framework_imported", "trainer-0"),
        ev(32, "device_found", "trainer-0"),
        ev(40, "first_step", "trainer-0"),
        ev(145, "checkpoint_saved", "trainer-0", seconds=5.0, step=100),
        ev(195, "checkpoint_saved", "trainer-0", seconds=5.0, step=150),  # the node's grace: an exact save
        ev(197, "worker_exited", "worker-0", state="cancelled", exit_code=143),
        ev(200, "preempted", attempt=1, retry=True),
        ev(210, "restarted", handle=NODE),  # the same pool: nothing deleted, nothing provisioned
        ev(230, "worker_started", "worker-0"),
        ev(231, "job_started", "worker-0"),
        ev(236, "framework_imported", "trainer-0"),
        ev(238, "device_found", "trainer-0"),
        ev(245, "resumed_from_checkpoint", "trainer-0", checkpoint="checkpoints/a", step=150, redone=0),
        ev(250, "first_step", "trainer-0"),
        ev(350, "checkpoint_saved", "trainer-0", seconds=5.0, step=300),
        ev(360, "worker_exited", "worker-0", state="succeeded", exit_code=0),
        ev(365, "teardown_requested", state="succeeded"),
    ]
    rows = [row(1, 140, 100, 100), row(2, 240 + 60, 50, 200), row(3, 345, 45, 300)]
    timeline = build_timeline(events, rows)
    assert timeline.attempts == 2
    assert [(a, said.step, said.redone) for a, _, said in timeline.resumes] == [(2, 150, 0)]
    g = goodput(events, rows, "v5p-8", spot=True)
    (disruption,) = g.disruptions
    assert (disruption.kind, disruption.attempt, disruption.reached_step, disruption.resumed_step) == (
        "preemption",
        1,
        150,
        150,
    )
    assert disruption.redone_steps == 0 and disruption.back_after_s == pytest.approx(50)  # 200 -> first step 250
    assert g.billed_s == pytest.approx(365 - 20)  # the pool bills through the restart: provisioned -> teardown
    assert startup(events, rows).first_step_s == pytest.approx(40)  # the first attempt's, not the restart's


def test_a_multislice_bills_every_slice_and_its_queue_s_wait_is_not_told_apart() -> None:
    """Two v4-16 slices (4 hosts) through one queued resource: its wait for capacity has no event of its end."""
    qr = {"node_id": "ms", "queued_resource": "ms"}
    events = [
        ev(0, "submitted"),
        ev(1, "provisioning", handle=qr),
        ev(300, "provisioned", handle=qr, ready_at=T0 + 295),
    ]
    for w in range(4):
        events += [
            ev(310 + w, "bootstrap_started", f"bootstrap-{w}"),
            ev(340 + w, "container_started", f"bootstrap-{w}"),
            ev(350 + w, "job_started", f"worker-{w}"),
            ev(600 + w, "worker_exited", f"worker-{w}", state="succeeded"),
            ev(605 + w, "container_exited", f"bootstrap-{w}"),
        ]
    events += [
        ev(360, "framework_imported", "trainer-0"),
        ev(365, "device_found", "trainer-0"),
        ev(380, "first_step", "trainer-0"),
        ev(610, "delete_requested", "bootstrap-0"),
    ]
    rows = [row(1, 480, 105, 50), row(2, 580, 100, 100)]
    g = goodput(events, rows, "v4-16", spot=True, slices=2)
    assert g.billed_s == pytest.approx(315)  # 295 -> 610
    assert billed(g)["provisioning"] == 15.0 and billed(g)["image_pull"] == 30.0 and billed(g)["startup"] == 40.0
    assert billed(g)["productive"] == 200.0 and billed(g)["evaluation"] == 20.0 and billed(g)["idle"] == 10.0
    capacity = g.cause("capacity")
    assert capacity.billed_s == 0.0 and capacity.waited_s is None and "queued" in capacity.note
    assert g.cause("provisioning").waited_s == pytest.approx(295)  # from the submit: the queue's wait is in there
    per_second = 16 * catalog.generations()["v4"].spot_price / 3600  # every chip of both slices
    assert g.usd == pytest.approx(200 * per_second)
    assert "not measured: data" in dict(g.rows())["badput"]


def test_a_command_that_reports_no_steps_has_its_goodput_not_measured_never_zero() -> None:
    events = [
        ev(0, "submitted"),
        ev(1, "provisioning", handle=NODE),
        ev(30, "provisioned", handle=NODE),
        ev(40, "bootstrap_started", "bootstrap-0"),
        ev(45, "container_started", "bootstrap-0"),
        ev(50, "job_started", "worker-0"),
        ev(150, "worker_exited", "worker-0", state="succeeded"),
        ev(155, "container_exited", "bootstrap-0"),
        ev(160, "delete_requested", "bootstrap-0"),
    ]
    g = goodput(events, [], "v2-8")
    assert g.productive_s is None and g.percent is None and g.usd is None and g.cell() == "-"
    assert billed(g)["job"] == 100.0
    assert g.cause("checkpoint_restore").billed_s == 0  # one attempt: nothing to restore, measured
    for key in ("data", "checkpoint_save"):
        assert g.cause(key).billed_s is None and g.cause(key).note, key  # not measured, and where its time is
    assert sum(c.billed_s or 0 for c in g.causes) == pytest.approx(130)
    head = dict(g.rows())["goodput"]
    assert head.startswith("not measured (the job reports no steps) of 2m10s billed") and "$0.00" not in head
    assert g.to_json()["productive_s"] is None


def test_zones_without_capacity_are_waiting_for_capacity_on_the_same_machine() -> None:
    events = [
        ev(0, "submitted"),
        ev(1, "provisioning", handle={"node_id": "job-1", "zone": "us-central1-b"}),  # stocked out
        ev(31, "provisioning", handle={"node_id": "job-1", "zone": "us-central1-c"}),
        ev(60, "provisioned", handle=NODE),
        ev(70, "job_started", "worker-0"),
        ev(90, "worker_exited", "worker-0", state="succeeded"),
        ev(95, "teardown_requested", state="succeeded"),
    ]
    timeline = build_timeline(events, [])
    assert timeline.attempts == 1 and [m.label for m in timeline.markers] == []  # one machine, not two
    names = [(p.name, round(p.start - T0), round(p.end - T0)) for p in timeline.phases]
    assert ("waiting for capacity", 0, 31) in names and ("queue/provision", 31, 60) in names
    assert startup(events, []).ready_s == 60  # the machine that came, not cut at the second zone's request
    g = goodput(events, [], "v2-8")
    assert g.cause("capacity").waited_s == pytest.approx(31) and g.cause("capacity").billed_s == 0
    assert g.cause("provisioning").waited_s == pytest.approx(29)
    assert "waiting for capacity 31s, create to READY 29s" in dict(g.rows())["not billed"]


def test_a_local_run_s_machine_time_is_split_but_bills_nothing() -> None:
    events = [
        ev(0, "submitted"),
        ev(0.1, "provisioning", handle={"pid": 1}),
        ev(0.2, "provisioned", handle={"pid": 1}),
        ev(1.2, "job_started", "worker-0"),
        ev(5.2, "first_step", "trainer-0"),
        ev(9.2, "worker_exited", "worker-0", state="succeeded"),
        ev(9.4, "teardown_requested", state="succeeded"),
    ]
    g = goodput(events, [], None, billable=False, no_price="$0: a local run pays for no TPU")
    assert not g.billable and g.price is None and g.usd is None
    assert billed(g)["startup"] == 5.0 and billed(g)["productive"] == 4.0 and billed(g)["idle"] == 0.2
    head = dict(g.rows())["goodput"]
    assert head == "43% of 9.2s machine time (bills nothing): 4.0s of productive steps"


def run_dir_with(tmp_path: Path, spec: dict[str, object], events: list[Event], summary: object = None) -> Path:
    run_dir = tmp_path / "run"
    (run_dir / "events").mkdir(parents=True)
    (run_dir / "spec.yaml").write_text(yaml.safe_dump(spec))
    by_source: dict[str, list[Event]] = {}
    for e in events:
        by_source.setdefault(e.source, []).append(e)
    for source, written in by_source.items():
        lines = [json.dumps({"time": e.time, "source": e.source, "event": e.event, **e.fields}) for e in written]
        path = run_dir / "events" / f"{source}.jsonl"
        path.write_text("\n".join(lines) + "\n")
        import os

        os.utime(path, (written[-1].time, written[-1].time))  # uploaded as its last event was added
    if summary is not None:
        (run_dir / "summary.json").write_text(json.dumps(summary))
    return run_dir


def test_an_unpriced_type_s_goodput_has_no_dollars_never_zero(tmp_path: Path) -> None:
    events, _ = two_preemptions()
    run_dir = run_dir_with(tmp_path, {"accelerator": {"type": "tpu7x-8", "spot": True}}, events)
    record = RunRecord(
        run_id="r-1", job="j", backend="tpu-vm", run_dir=str(run_dir), created_at=T0, state=RunState.SUCCEEDED
    )
    facts = gather(record, open_storage(str(run_dir)), now=END)
    assert facts.cost is None and facts.goodput is not None
    g = facts.goodput
    assert g.usd is None and g.billed_usd is None and all(c.usd is None for c in g.causes)
    rows = dict(facts.rows())
    assert "dollars not estimated: no list price of" in rows["goodput"] and "$0.00" not in rows["goodput"]
    assert all(d.usd is None for d in g.disruptions) and "$" not in rows["disruption 1"]
    assert facts.to_json()["goodput"]["no_price"].startswith("not estimated")


def test_the_goodput_goes_into_summary_json_once_the_run_is_over(tmp_path: Path) -> None:
    events, rows = two_preemptions()
    g = goodput(events, rows, "v4-8", spot=True)
    run_dir = run_dir_with(tmp_path, {}, events, summary={"test_accuracy": 0.9, "epochs": 3})
    assert record_in_summary(str(run_dir), g) is None
    written = json.loads((run_dir / "summary.json").read_text())
    assert written["test_accuracy"] == 0.9 and written["goodput"] == json.loads(json.dumps(g.to_json()))
    # a job's own `goodput`, a summary that is not an object, no summary at all: left as they are
    (run_dir / "summary.json").write_text(json.dumps({"goodput": 0.7}))
    record_in_summary(str(run_dir), g)
    assert json.loads((run_dir / "summary.json").read_text()) == {"goodput": 0.7}
    (run_dir / "summary.json").write_text("[1, 2]")
    record_in_summary(str(run_dir), g)
    assert (run_dir / "summary.json").read_text() == "[1, 2]"
    (run_dir / "summary.json").unlink()
    assert record_in_summary(str(run_dir), g) is None and not (run_dir / "summary.json").exists()


def test_the_chart_stacks_every_cause_with_billed_time() -> None:
    from runner.collect.plots import _CAUSE_COLOURS, goodput_chart, planned
    from tests.collect.test_svg import NS, drawn, parse, texts

    events, rows = two_preemptions()
    g = goodput(events, rows, "v4-8", spot=True)
    chart = goodput_chart(g)
    assert chart is not None
    with_time = [c for c in g.causes if c.billed_s]
    assert chart.points == {"causes": len(with_time)} == {"causes": 8} == drawn(chart.svg)
    # one segment per cause, in order, left to right, each as wide as its share of the billed time
    bars = [e for e in parse(chart.svg).iter(f"{NS}rect") if e.get("data-series") == "causes"]
    assert [b.get("fill") for b in bars] == [_CAUSE_COLOURS[c.key] for c in with_time]
    lefts, widths = [float(b.get("x") or 0) for b in bars], [float(b.get("width") or 0) for b in bars]
    assert lefts == sorted(lefts)
    assert [w / sum(widths) for w in widths] == pytest.approx([c.billed_s / g.billed_s for c in with_time], abs=1e-3)
    words = texts(chart.svg)
    assert all(any(w.startswith(f"{c.label}  ") and "$" in w for w in words) for c in with_time)  # time, share, $
    assert f"{g.percent:.0f}%" in words  # the productive segment says its share
    assert {"id": "goodput", "points": {"causes": 8}} in planned(build_timeline(events, rows), rows, g)


def test_a_flex_start_instance_s_wait_is_not_told_apart_from_its_create() -> None:
    """A Compute Engine flex-start instance waits PENDING inside its create; its handle does not say so, its spec
    does (accelerator.provisioning: queued)."""
    vm = {"kind": "instance", "name": "job-1", "zone": "us-central1-a"}
    events = [
        ev(0, "submitted"),
        ev(1, "provisioning", handle=vm),
        ev(900, "provisioned", handle=vm),
        ev(910, "bootstrap_started", "bootstrap-0"),
        ev(920, "container_started", "bootstrap-0"),
        ev(925, "job_started", "worker-0"),
        ev(990, "worker_exited", "worker-0", state="succeeded"),
        ev(995, "delete_requested", "bootstrap-0"),
    ]
    assert goodput(events, [], "v5litepod-8").cause("capacity").waited_s == 0  # a create at once: it waited none
    g = goodput(events, [], "v5litepod-8", queued=True)
    capacity = g.cause("capacity")
    assert capacity.billed_s == 0 and capacity.waited_s is None and "no event of its end" in capacity.note
    assert g.cause("provisioning").waited_s == pytest.approx(900)
    assert billed(g)["job"] == 65.0 and g.percent is None


def test_the_json_percent_is_the_written_seconds_divided():
    """A short run: the seconds are written to the ms, and the percent is of those figures (rounding each apart once
    put the percent 0.01 off the quotient a reader works out from the JSON)."""
    # billed 9.00049 s -> 9.0 as written; productive 0.39749 s -> 0.397: 100 * 0.397 / 9.0 = 4.4111 -> 4.41
    g = Goodput(
        billed_s=9.00049,
        billable=False,
        open=False,
        causes=(Cause("productive", 0.39749), Cause("job", 9.00049 - 0.39749)),
        disruptions=(),
        price=None,
    )
    data = g.to_json()
    assert data["billed_s"] == 9.0 and data["productive_s"] == 0.397
    assert data["percent"] == 4.41
    assert [c["billed_s"] for c in data["causes"] if c["cause"] == "productive"] == [0.397]
