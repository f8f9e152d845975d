"""`runner report` of a real run: a tiny `runner submit --local` on real MNIST, its page opened in headless
Chromium (the inline SVG charts decode, have ink, and plot one point per epoch; nothing is fetched from a network), and
`runner report --json`'s shape."""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from runner.cli import app
from tests.browser import IMAGES_JS, INKED_JS, Browser, chromium_or_skip
from tests.collect.test_svg import drawn, parse

EPOCHS = 3
cli = CliRunner()


def invoke(*args: str):  # type: ignore[no-untyped-def]
    return cli.invoke(app, list(args), catch_exceptions=False)


@pytest.mark.slow
def test_report_of_a_real_local_run_in_a_headless_browser(tmp_path: Path, mnist_npz: Path) -> None:
    chromium = chromium_or_skip()  # before the run: without a browser there is nothing to check it with
    job = tmp_path / "job.yaml"
    job.write_text(
        textwrap.dedent(f"""\
        name: tiny-report
        image: trainer:test
        training: {{model: mnist_mlp, epochs: {EPOCHS}, batch_size: 128, max_train_examples: 512,
                   max_test_examples: 256}}
        storage: {tmp_path / "store"}
        """)
    )
    result = invoke("submit", str(job), "--local")
    assert result.exit_code == 0, result.output
    run_id = next(line.split()[1] for line in result.output.splitlines() if line.startswith("Run "))
    run_dir = tmp_path / "store" / "runs" / run_id
    page = run_dir / "report" / "index.html"
    rows = dict(line.split(None, 1) for line in result.output.splitlines() if line[:1].isalpha() and " " in line)
    assert rows["report"].strip() == str(page)  # `runner submit` says where the report is
    assert rows["cost"].strip() == "$0: a local run pays for no TPU"
    assert "framework imported" in rows["startup"] and "first step" in rows["startup"]
    # where the machine's time went: a local run bills nothing, but its time is split all the same
    assert re.match(r"\d+% of [\d.ms]+ machine time \(bills nothing\): [\d.ms]+ of productive steps$", rows["goodput"])
    assert "checkpoint save" in rows["badput"] and "data" in rows["badput"]  # the trainer times both
    # each chart beside the page as an SVG file that parses (test_svg.parse), none as a PNG
    files = {
        name: (page.parent / f"{name}.svg").read_text() for name in ("timeline", "goodput", "loss", "accuracy", "speed")
    }
    assert all(parse(text) is not None for text in files.values()) and not list(page.parent.glob("*.png"))

    status = invoke("status", run_id)
    assert "startup" in status.output and "cost" in status.output and "goodput" in status.output
    listing = invoke("list")
    assert "cost" in listing.output and "$0" in listing.output
    header, line = [x for x in listing.output.splitlines() if x.startswith(("run ", run_id))][:2]
    assert header.split()[-1] == "goodput" and re.search(r"\d+%$", line.rstrip()), listing.output

    # --json: the data the page shows, nothing written
    page.unlink()
    data = json.loads(invoke("report", run_id, "--json").output)
    assert not page.exists()
    assert {
        "run_id",
        "state",
        "spec",
        "summary",
        "metrics",
        "startup",
        "timeline",
        "cost",
        "checkpoints",
        "charts",
    } <= (data.keys())
    assert data["run_id"] == run_id and data["state"] == "succeeded" and data["cost"] is None
    assert data["spec"]["training"]["epochs"] == EPOCHS and len(data["metrics"]) == EPOCHS
    assert [c["epochs_done"] for c in data["checkpoints"]] == [3, 2]  # checkpoint_keep 2, newest first
    startup = data["startup"]
    assert 0 <= startup["ready_s"] <= startup["job_started_s"] <= startup["framework_imported_s"]
    assert startup["framework_imported_s"] <= startup["device_found_s"] <= startup["first_step_s"]
    assert startup["missing"] == []
    phases = {p["name"] for p in data["timeline"]["phases"]}
    assert {"queue/provision", "framework import", "first step", "training", "teardown"} <= phases
    goodput = data["goodput"]
    causes = {c["cause"]: c["billed_s"] for c in goodput["causes"]}
    assert sum(v or 0 for v in causes.values()) == pytest.approx(goodput["billed_s"], abs=0.01)
    assert causes["productive"] > 0 and causes["data"] > 0 and causes["checkpoint_save"] > 0, causes
    assert goodput["percent"] == pytest.approx(100 * causes["productive"] / goodput["billed_s"], abs=0.01)
    assert goodput["usd"] is None and not goodput["billable"] and goodput["disruptions"] == []
    # the end of submit added the same figures to summary.json
    assert json.loads((run_dir / "summary.json").read_text())["goodput"]["billed_s"] == goodput["billed_s"]
    charts = {c["id"]: c["points"] for c in data["charts"]}
    assert charts["goodput"] == {"causes": sum(1 for v in causes.values() if v)}
    assert charts["loss"] == {"loss": EPOCHS, "val_loss": EPOCHS}
    assert charts["accuracy"] == {"accuracy": EPOCHS, "val_accuracy": EPOCHS}
    assert charts["speed"] == {"examples_per_s": EPOCHS}
    # what the files drew is what --json counts: a marker per epoch and series, a bar per cause and per phase
    assert {name: drawn(text) for name, text in files.items()} == {
        name: {k: v for k, v in points.items() if v} for name, points in charts.items()
    }

    written = invoke("report", run_id)
    assert written.exit_code == 0 and str(page) in written.output
    with Browser(chromium) as browser:
        browser.open(page.as_uri())
        assert browser.evaluate("document.title") == f"Run {run_id}"
        images = {i["id"]: i for i in browser.evaluate(INKED_JS + IMAGES_JS)}
        # Nothing from a network: no resource was fetched, no script or stylesheet is linked.
        assert (
            browser.evaluate("performance.getEntriesByType('resource').filter(r => !r.name.startsWith('data:')).length")
            == 0
        )
        assert browser.evaluate("document.querySelectorAll('script[src], link[href], iframe').length") == 0
        embedded = json.loads(browser.evaluate("document.getElementById('report-data').textContent"))
        named = browser.evaluate(
            "[...document.querySelectorAll('svg.chart')].map(s => [s.id, s.getAttribute('role'), "
            "s.getAttribute('aria-label'), s.querySelector('title').textContent])"
        )
        text = browser.evaluate("document.body.innerText")
    assert set(images) == {"chart-timeline", "chart-goodput", "chart-loss", "chart-accuracy", "chart-speed"}
    for image in images.values():
        assert image["tag"] == "svg" and image["decoded"] and image["complete"] and not image["external"], image
        assert image["naturalWidth"] > 300 and image["shownWidth"] > 300 and image["shownHeight"] > 150, image
        assert image["inked"] > 0.02, image  # drawn on, not a blank canvas
    assert images["chart-loss"]["points"] == {"loss": EPOCHS, "val_loss": EPOCHS}
    assert images["chart-accuracy"]["points"] == {"accuracy": EPOCHS, "val_accuracy": EPOCHS}
    assert images["chart-speed"]["points"] == {"examples_per_s": EPOCHS}
    assert images["chart-timeline"]["points"]["phases"] == len(data["timeline"]["phases"])
    assert images["chart-goodput"]["points"] == charts["goodput"]
    assert [n[0] for n in named] == ["chart-goodput", "chart-timeline", "chart-loss", "chart-accuracy", "chart-speed"]
    assert all(role == "img" and label and label == title for _, role, label, title in named), named
    assert embedded["run_id"] == run_id and len(embedded["metrics"]) == EPOCHS
    for words in (
        "Final metrics",
        "test accuracy",
        "DefaultStrategy",
        "Cost",
        "Goodput",
        "productive steps",
        "Startup",
        "first step",
        "Checkpoints",
        "ckpt-000003.keras",
        "Spec",
        "mnist_mlp",
    ):
        assert words in text, words


T0 = 1_800_000_000.0


def damaged_run_dir(tmp_path: Path) -> Path:
    """Hand-written files, as another runner version or user code may leave them: a corrupt manifest and spec, a
    torn metrics line, an event whose clock is absurd."""
    t0 = T0
    run_dir = tmp_path / "run"
    (run_dir / "events").mkdir(parents=True)
    (run_dir / "checkpoints").mkdir()
    events = [
        {"time": t0, "source": "runner", "event": "submitted"},
        {"time": t0 + 1, "source": "runner", "event": "provisioned", "handle": {"pid": 1}},
        {"time": t0 + 2, "source": "worker-0", "event": "job_started"},
        {"time": 1e300, "source": "runner", "event": "preempted"},
        {"time": t0 + 9, "source": "worker-0", "event": "worker_exited", "state": "succeeded"},
    ]
    (run_dir / "events" / "runner.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    rows = [{"epoch": n, "loss": 1.0 / n, "time": t0 + 3 + n, "epoch_time_s": 1.0} for n in (1, 2)]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"epoch": 3, "lo')
    (run_dir / "spec.yaml").write_text(": : [")
    (run_dir / "checkpoints" / "latest.json").write_text("not json")
    (run_dir / "logs").mkdir()
    (run_dir / "logs" / "worker-0.log").write_text("[trainer] </script><script>alert(1)</script> <!-- x\n")
    (run_dir / "run.json").write_text(json.dumps({"run_id": "r-1", "job": "j", "backend": "local", "created_at": t0}))
    return run_dir


def test_a_report_of_a_run_directory_with_damaged_files_still_comes(tmp_path: Path) -> None:
    """The page is written; each problem is a warning on it."""
    from runner.collect.report import make_report
    from runner.watch.runs import RunRecord
    from runner.watch.state import RunState

    run_dir = damaged_run_dir(tmp_path)
    record = RunRecord(
        run_id="r-1", job="j", backend="local", run_dir=str(run_dir), created_at=T0, state=RunState.SUCCEEDED
    )
    report = make_report(record, RunState.SUCCEEDED)
    page = report.path.read_text()
    assert report.path == run_dir / "report" / "index.html"
    assert any("spec.yaml is corrupt" in w for w in report.warnings)
    assert any("latest.json is corrupt" in w for w in report.warnings)
    assert 'id="chart-timeline"' in page and 'id="chart-loss"' in page
    # inline, with the points it drew; the same SVG beside the page, as a file that parses
    assert '<svg class="chart" id="chart-loss" data-points="{&quot;loss&quot;: 2}" xmlns=' in page
    assert drawn((report.path.parent / "loss.svg").read_text()) == {"loss": 2}
    charts = {c["id"]: c["points"] for c in report.data["charts"]}
    assert charts["loss"] == {"loss": 2}  # the torn third line is not a point
    # an event dated 1e300 is no clock's reading: a warning naming its file, never a marker or a cost
    assert report.data["timeline"]["markers"] == [] and charts["timeline"]["markers"] == 0
    assert any("runner.jsonl: skipped 1 corrupt line(s), the first is line 4" in w for w in report.warnings)
    assert "<script>" not in page  # the only script is the data block, which never runs
    block = page.split('<script type="application/json" id="report-data">', 1)[1].split("</script>", 1)[0]
    assert json.loads(block)["trainer_lines"] == ["[trainer] </script><script>alert(1)</script> <!-- x"]


def test_report_json_shape_of_a_run_directory(tmp_path: Path) -> None:
    """`runner report DIR --json`: the page's data, nothing written, every top-level key there with its type."""
    run_dir = damaged_run_dir(tmp_path)
    result = invoke("report", str(run_dir), "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert not (run_dir / "report").exists()
    types = {
        "run_id": str,
        "job": str,
        "backend": str,
        "state": str,
        "run_dir": str,
        "created_at": float,
        "spec": dict,
        "spec_yaml": str,
        "metrics": list,
        "exits": list,
        "preemptions": int,
        "machines": int,
        "trainer_lines": list,
        "startup": dict,
        "timeline": dict,
        "checkpoints": list,
        "charts": list,
        "warnings": list,
        "generated_at": float,
    }
    assert {k: type(data[k]) for k in types} == types
    assert data["cost"] is None and data["summary"] is None  # a local run; no summary.json
    assert set(data["startup"]) >= {
        "ready_s",
        "image_pulled_s",
        "job_started_s",
        "framework_imported_s",
        "first_step_s",
    }
    assert set(data["timeline"]) == {"origin", "attempts", "phases", "markers"}
    assert all(set(p) == {"name", "attempt", "start_s", "seconds", "evidence"} for p in data["timeline"]["phases"])
    assert [c["id"] for c in data["charts"]] == ["timeline", "goodput", "loss"]
    assert any("spec.yaml is corrupt" in w for w in data["warnings"])
