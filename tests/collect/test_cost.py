"""What a run cost, from its events and the catalog's prices; its startup breakdown and phases from the same
events. Every figure is checked against arithmetic done here by hand, not against the code's own formulas."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from runner.backends import info
from runner.collect.cost import price_for, run_cost
from runner.collect.facts import gather
from runner.collect.timeline import build_timeline, startup
from runner.plan import catalog
from runner.storage import open_storage
from runner.watch.events import Event
from runner.watch.runs import RunRecord
from runner.watch.state import RunState

T0 = 1_800_000_000.0
NODE = {"node_id": "job-1", "created": True}


def ev(t: float, kind: str, source: str = "runner", **fields: object) -> Event:
    return Event(T0 + t, source, kind, dict(fields))


def test_price_is_the_catalogs_per_chip_hour_times_chips() -> None:
    gen = catalog.generations()["v5litepod"]
    price = price_for("v5litepod-8", spot=False)
    assert price is not None and price.chips == 8
    assert price.per_chip_hour == gen.on_demand_price
    assert price.per_hour == pytest.approx(8 * gen.on_demand_price)
    spot = price_for("v5litepod-8", spot=True)
    assert spot is not None and spot.per_chip_hour == gen.spot_price
    assert price_for("v99-8", spot=False) is None  # a type this catalog does not know: no figure, no guess
    assert price_for("tpu7x-8", spot=False) is None  # one it knows without a list price: no $0 either


def test_one_node_bills_from_ready_to_its_delete_request_idle_included() -> None:
    price = price_for("v5litepod-8", spot=False)
    assert price is not None
    events = [
        ev(0, "submitted"),
        ev(1, "provisioning", handle=NODE),
        ev(61, "provisioned", handle=NODE),  # READY: billing starts, whatever the VM does next
        ev(70, "bootstrap_started", "bootstrap-0"),
        ev(1861, "teardown_requested", state="succeeded"),  # 1800 s READY, boot and idle seconds included
        ev(1900, "teardown_done", confirmed=True),
    ]
    cost = run_cost(events, price, now=T0 + 5000)
    assert cost.seconds == pytest.approx(1800)
    assert cost.chip_hours == pytest.approx(8 * 0.5)
    assert cost.usd == pytest.approx(8 * 0.5 * catalog.generations()["v5litepod"].on_demand_price)
    assert not cost.open and cost.spans[0].confirmed and cost.spans[0].ended_by == "deleted"
    assert cost.to_json()["usd"] == pytest.approx(cost.usd, abs=1e-6)


def test_a_preempted_node_and_its_replacement_are_two_spans() -> None:
    price = price_for("v4-8", spot=True)  # v4-8: 4 chips
    assert price is not None and price.chips == 4
    events = [
        ev(0, "submitted"),
        ev(1, "provisioning", handle=NODE),
        ev(100, "provisioned", handle=NODE),
        ev(700, "preempted", attempt=1, retry=True),  # 600 s, then it bills no more
        ev(710, "teardown_requested", state="replacing"),
        ev(720, "teardown_done", confirmed=True),
        ev(730, "provisioning", handle={"node_id": "job-2"}),
        ev(1000, "provisioned", handle={"node_id": "job-2"}),
        ev(4600, "delete_requested", "bootstrap-0", exit_code=0),  # the VM deletes itself: 3600 s
        ev(4700, "finished", state="succeeded"),
    ]
    cost = run_cost(events, price, now=T0 + 9000)
    assert [round(s.seconds) for s in cost.spans] == [600, 3600]
    assert [s.node for s in cost.spans] == ["job-1", "job-2"]
    assert cost.preemptions == 1
    assert cost.usd == pytest.approx(4 * (4200 / 3600) * catalog.generations()["v4"].spot_price)
    assert "1 preemption" in cost.text() and "2 nodes" in cost.text()


def test_a_node_still_ready_or_kept_bills_up_to_now() -> None:
    price = price_for("v5litepod-4", spot=False)
    assert price is not None
    running = [ev(0, "submitted"), ev(10, "provisioned", handle=NODE)]
    cost = run_cost(running, price, now=T0 + 370)
    assert cost.open and cost.seconds == pytest.approx(360) and "so far" in cost.text()
    kept = [*running, ev(100, "teardown_skipped", policy="never"), ev(101, "finished", state="failed")]
    cost = run_cost(kept, price, now=T0 + 3610)
    assert cost.open and cost.seconds == pytest.approx(3600)
    assert cost.spans[0].ended_by.startswith("kept") and "bills until deleted" in cost.text()


def test_a_node_preempted_while_booting_was_never_ready_and_costs_nothing() -> None:
    price = price_for("v5litepod-8", spot=True)
    assert price is not None
    events = [ev(0, "submitted"), ev(1, "provisioning", handle=NODE), ev(50, "preempted", at="boot")]
    cost = run_cost(events, price, now=T0 + 100)
    assert cost.spans == () and cost.usd == 0 and cost.preemptions == 1


def test_gather_reads_the_cost_from_the_run_directory(tmp_path: Path) -> None:
    """Through the files a real run leaves: spec.yaml names the type, events/*.jsonl the spans."""
    import json

    run_dir = tmp_path / "run"
    (run_dir / "events").mkdir(parents=True)
    (run_dir / "spec.yaml").write_text(yaml.safe_dump({"accelerator": {"type": "v5litepod-8"}, "budget": 50.0}))
    runner_events = [
        {"time": T0, "source": "runner", "event": "submitted"},
        {"time": T0 + 30, "source": "runner", "event": "provisioned", "handle": NODE},
        {"time": T0 + 30 + 900, "source": "runner", "event": "teardown_requested", "state": "succeeded"},
        {"time": T0 + 940, "source": "runner", "event": "teardown_done", "confirmed": True},
    ]
    (run_dir / "events" / "runner.jsonl").write_text("".join(json.dumps(e) + "\n" for e in runner_events))
    boot = [
        {"time": T0 + 40, "source": "bootstrap-0", "event": "bootstrap_started"},
        {"time": T0 + 95, "source": "bootstrap-0", "event": "container_started"},
    ]
    (run_dir / "events" / "bootstrap-0.jsonl").write_text("".join(json.dumps(e) + "\n" for e in boot))
    trainer = [
        {"time": T0 + 105, "source": "trainer-0", "event": "framework_imported"},
        {"time": T0 + 112, "source": "trainer-0", "event": "device_found"},
        {"time": T0 + 140, "source": "trainer-0", "event": "first_step"},
    ]
    (run_dir / "events" / "trainer-0.jsonl").write_text("".join(json.dumps(e) + "\n" for e in trainer))
    for name, written in (("runner", runner_events), ("bootstrap-0", boot), ("trainer-0", trainer)):
        last = written[-1]["time"]  # each writer uploads its file as it adds an event: stored at its last event's time
        os.utime(run_dir / "events" / f"{name}.jsonl", (last, last))
    record = RunRecord(
        run_id="r-1", job="j", backend="tpu-vm", run_dir=str(run_dir), created_at=T0 - 1, state=RunState.SUCCEEDED
    )
    facts = gather(record, open_storage(str(run_dir)), now=T0 + 10_000)
    assert facts.cost is not None and facts.budget == 50.0
    expected = 8 * (900 / 3600) * catalog.generations()["v5litepod"].on_demand_price
    assert facts.cost.usd == pytest.approx(expected)
    assert facts.cost_cell() == f"${expected:,.2f}"
    assert "of budget $50.00" in facts.cost_text()
    s = facts.startup
    assert (s.ready_s, s.image_pulled_s, s.framework_imported_s, s.device_found_s, s.first_step_s) == (
        30,
        95,
        105,
        112,
        140,
    )
    assert s.text().startswith("READY 30.0s, image pulled 95.0s, framework imported 105.0s")
    names = [p.name for p in facts.timeline.phases]
    assert names[:4] == ["plan", "queue/provision", "boot", "image pull"]


def test_startup_and_timeline_of_a_machine_replaced_after_a_preemption() -> None:
    events = [
        ev(0, "submitted"),
        ev(1, "provisioning", handle=NODE),
        ev(20, "provisioned", handle=NODE),
        ev(25, "job_started", "worker-0"),
        ev(40, "preempted", attempt=1, retry=True),
        ev(50, "provisioning", handle={"node_id": "job-2"}),
        ev(80, "provisioned", handle={"node_id": "job-2"}),
        ev(90, "job_started", "worker-0"),
    ]
    s = startup(events, [], ready=info("tpu-vm").ready)
    assert s.ready_s == 20 and s.job_started_s == 25  # the first machine's, never the replacement's
    timeline = build_timeline(events, [])
    assert timeline.attempts == 2
    assert [(p.name, p.attempt) for p in timeline.phases if p.name == "queue/provision"] == [
        ("queue/provision", 1),
        ("queue/provision", 2),
    ]
    assert [m.label for m in timeline.markers] == ["preempted", "machine 2"]


def test_a_deletion_that_failed_keeps_the_node_billing_until_a_later_one() -> None:
    price = price_for("v2-8", spot=False)
    assert price is not None
    events = [
        ev(10, "provisioned", handle=NODE),
        ev(100, "delete_requested", "bootstrap-0"),
        ev(101, "teardown_requested", state="succeeded"),
        ev(103, "delete_failed", error="Permission 'tpu.nodes.delete' denied"),  # the node is READY again
    ]
    still = run_cost([*events, ev(105, "delete_requested", "bootstrap-0")], price, now=T0 + 400)  # refused as well
    assert still.open and still.seconds == pytest.approx(390) and still.spans[0].ended_by == "still READY"
    down = [ev(500, "down_requested", "runner-down"), ev(503, "down_done", "runner-down", confirmed=True)]
    later = run_cost([*events, *down], price, now=T0 + 900)
    assert not later.open and later.seconds == pytest.approx(490) and later.spans[0].ended_by == "deleted"


def test_the_api_s_ready_time_starts_the_span_and_spans_stay_within_what_can_be() -> None:
    price = price_for("v2-8", spot=False)
    assert price is not None
    ready = ev(10, "provisioned", handle=NODE, ready_at=T0 + 9.2)  # the create operation's end, by the API's clock
    spans = run_cost([ready, ev(16.5, "teardown_requested")], price, now=T0 + 60).spans
    assert spans[0].start == T0 + 9.2 and spans[0].seconds == pytest.approx(7.3)
    # A close request dated after `now` (a clock ahead, not put right) never bills past now.
    ahead = run_cost(
        [ev(10, "provisioned", handle=NODE), ev(3610, "delete_requested", "bootstrap-0")], price, now=T0 + 20
    )
    assert ahead.seconds == pytest.approx(10)


def test_an_absurd_event_time_is_a_warning_never_an_infinite_cost(tmp_path: Path) -> None:
    import json

    run_dir = tmp_path / "run"
    (run_dir / "events").mkdir(parents=True)
    (run_dir / "spec.yaml").write_text(yaml.safe_dump({"accelerator": {"type": "v2-8"}}))
    lines = [
        {"time": T0, "source": "runner", "event": "provisioned", "handle": NODE},
        {"time": 1e308, "source": "runner", "event": "teardown_requested"},
        {"time": T0 + 6, "source": "runner", "event": "teardown_requested"},
    ]
    (run_dir / "events" / "runner.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines))
    os.utime(run_dir / "events" / "runner.jsonl", (T0 + 6, T0 + 6))
    record = RunRecord(run_id="r-1", job="j", backend="tpu-vm", run_dir=str(run_dir), created_at=T0 - 1)
    facts = gather(record, open_storage(str(run_dir)), now=T0 + 100)
    assert facts.cost is not None and facts.cost.seconds == pytest.approx(6) and facts.cost.usd < 0.01
    assert any("line 2 (time 1e+308 is not a date between 2000 and 2100)" in w for w in facts.warnings)
