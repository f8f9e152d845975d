"""`runner report`: one self-contained HTML page per run, its charts inline SVG, so that it opens in a browser with
no network, from a laptop, a bucket or an e-mail.

The page shows the spec, the timeline of phases (runner.collect.timeline: evidence only), preemptions and
restarts, loss and accuracy per epoch (train and validation; a command's metrics.jsonl, else the epochs Keras
printed to its log), examples/s, strategy and devices, final metrics (summary.json, or the summary derived from a
command's metrics and log), every committed checkpoint under checkpoints/ (each read by its format:
runner.checkpoints), the startup breakdown, the cost (runner.collect.cost) and where the billed time went, with what
each disruption cost (runner.collect.goodput). Tables show numbers rounded; the JSON keeps them whole.
Every chart's <svg> (id chart-<chart id>, role img, named by its aria-label and <title>) says in data-points how many
points each of its series has; the page carries the report's data as JSON in
<script id="report-data" type="application/json"> (what `runner report --json` prints).

Where it goes: <run dir>/report/index.html for a local run directory; for a gs:// one, a local directory
($RUNNER_HOME/reports/<run id>/) and a copy uploaded to <run dir>/report/index.html. Each chart is also written
beside the page as <chart id>.svg (timeline.svg, loss.svg, ...), for slides and issues; the page needs none of them.
"""

from __future__ import annotations

import html
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runner import backends, contract
from runner.checkpoints.resumed import Resumed
from runner.collect.facts import CheckpointInfo, RunFacts, checkpoints_text, gather, size_text
from runner.collect.figures import metrics_text, rounded
from runner.collect.plots import charts as draw_charts
from runner.collect.plots import planned
from runner.errors import RunnerError, StorageError
from runner.plan.budget import duration, money
from runner.storage import Storage, open_storage
from runner.watch.logtext import one_line
from runner.watch.rundir import Snapshot, number
from runner.watch.runs import RunRecord, runner_home
from runner.watch.state import RunState

PAGE = "index.html"
_TRAINER_LINES = 60


@dataclass(frozen=True)
class Report:
    path: Path  # the page on this machine
    uploaded: str | None  # where a copy went (a gs:// run directory), or None
    data: dict[str, Any]
    warnings: list[str] = field(default_factory=list)


def default_dir(record: RunRecord) -> Path:
    """<run dir>/report for a local run directory; $RUNNER_HOME/reports/<run id> for a gs:// one."""
    if record.run_dir.startswith("gs://"):
        return runner_home() / "reports" / record.run_id
    return Path(record.run_dir) / contract.REPORT_DIR


def trainer_lines(storage: Storage) -> list[str]:
    """The trainer's own lines of worker 0's log ("[trainer] strategy: ...", "data: ...", "perf: ..."), the first
    few: they say what the run ran on when no summary does (a failed run)."""
    raw = storage.read_bytes(contract.log_key(0)) or b""
    lines = [one_line(line, 400) for line in raw.decode(errors="replace").splitlines() if line.startswith("[trainer]")]
    return lines[:_TRAINER_LINES]


def report_data(facts: RunFacts, state: RunState | str, storage: Storage) -> dict[str, Any]:
    """Everything the page shows, as JSON (what `runner report --json` prints)."""
    record, snapshot = facts.record, facts.snapshot
    summary = facts.summary.to_json() if facts.summary else None
    spec_yaml = (storage.read_bytes(contract.SPEC) or b"").decode(errors="replace")
    return {
        "run_id": record.run_id,
        "job": record.job,
        "backend": record.backend,
        "state": str(state),
        "reason": record.reason,
        "run_dir": record.run_dir,
        "created_at": record.created_at,
        "finished_at": record.finished_at or next((e.time for e in facts.events if e.event == "finished"), None),
        "spec": facts.spec,
        "spec_yaml": spec_yaml,
        "summary": summary,
        "metrics": facts.metrics,
        "metrics_from": facts.metrics_from,
        "exits": [e.to_json() for e in snapshot.exits],
        "preemptions": sum(1 for e in facts.events if e.event == "preempted" and e.source == "runner"),
        "machines": facts.timeline.attempts,
        "trainer_lines": trainer_lines(storage),
        **facts.to_json(),
        "warnings": list(facts.warnings),
        "generated_at": round(time.time(), 3),
    }


# -- HTML -------------------------------------------------------------------------------------------------------

_CSS = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 1000px; color: #222; padding: 0 1em; }
h1 { font-size: 1.5em; margin-bottom: .2em; }
h2 { font-size: 1.15em; margin-top: 1.8em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; margin: .5em 0; }
td, th { padding: .2em .8em .2em 0; text-align: left; vertical-align: top; }
th { color: #555; font-weight: 600; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
pre { background: #f6f6f6; padding: .8em; overflow-x: auto; font-size: 12px; }
svg.chart { display: block; max-width: 100%; height: auto; margin: .8em 0; border: 1px solid #eee; }
.state { font-weight: 700; } .muted { color: #777; } .warn { color: #b26a00; }
"""


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value))


def _table(rows: list[tuple[str, str]], *, raw: bool = False) -> str:
    cells = "".join(f"<tr><th>{_e(k)}</th><td>{v if raw else _e(v)}</td></tr>" for k, v in rows)
    return f"<table>{cells}</table>"


def _grid(header: list[str], rows: list[list[str]], numeric: set[int] | None = None) -> str:
    numeric = numeric or set()
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(f"<td{' class=num' if i in numeric else ''}>{_e(c)}</td>" for i, c in enumerate(r)) + "</tr>"
        for r in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def _when(stamp: Any) -> str:
    value = number(stamp)
    if value is None:
        return "-"
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(value))
    except (OverflowError, ValueError, OSError):
        return "?"


def _final_rows(data: dict[str, Any]) -> list[tuple[str, str]]:
    s = data.get("summary") or {}
    rows: list[tuple[str, str]] = []
    test = s.get("test") if isinstance(s.get("test"), dict) else {}
    if test and number(s.get("test_accuracy")) is None:
        rows.append(("test", metrics_text(test)))
    if isinstance(last := s.get("last_metrics"), dict):
        rows.append(("last epoch" if "epoch" in last else "last step", metrics_text(last)))
    for key, label, fmt in [
        ("test_accuracy", "test accuracy", "{:.4f}"),
        ("test_loss", "test loss", "{:.4f}"),
        ("examples_per_s", "examples/s", "{:.0f}  (mean over epochs after the first, which compiles)"),
        ("epochs", "epochs", "{}"),
        ("steps", "steps", "{}"),
        ("global_step", "global step", "{}"),
        ("global_batch_size", "global batch", "{}"),
        ("wall_time_s", "trainer wall time", "{:.1f}s"),
    ]:
        value = s.get(key)
        if number(value) is not None:
            rows.append((label, fmt.format(value)))
    strategy = s.get("strategy")
    if isinstance(strategy, dict):
        devices = strategy.get("devices")
        rows.append(
            (
                "strategy",
                f"{one_line(strategy.get('name'))} on {one_line(strategy.get('kind', '?')).upper()}, "
                f"{one_line(strategy.get('replicas'))} replica(s)",
            )
        )
        if isinstance(devices, list) and devices:
            rows.append(("devices", one_line(", ".join(map(str, devices)), 400)))
    perf = s.get("perf")
    if isinstance(perf, dict):
        bits = [f"{k} {one_line(perf.get(k), 40)}" for k in ("precision", "jit_compile", "steps_per_execution")]
        rows.append(("speed choices", ", ".join(bits)))
    versions = s.get("versions")
    if isinstance(versions, dict):
        rows.append(("versions", one_line(", ".join(f"{k} {v}" for k, v in versions.items()), 200)))
    if isinstance(sources := s.get("derived_from"), list):
        rows.append(("results from", one_line(", ".join(map(str, sources)), 200) + "  (the job wrote no summary.json)"))
    elif not rows and s:
        rows = [(one_line(k, 40), rounded(v)) for k, v in s.items() if isinstance(v, str | int | float)][:20]
    return rows


def _cost_html(data: dict[str, Any]) -> str:
    cost = data.get("cost")
    if cost is None:
        free = backends.info(data["backend"]).no_cost
        text = f"$0: {free}" if free is not None else "unknown (type not in the catalog)"
        return f"<p>{_e(text)}</p>"
    price = cost["price"]
    kind = "Spot" if price["spot"] else "reserved (on-demand list price)" if price["reserved"] else "on-demand"
    rows = [
        ("total", money(cost["usd"]) + (" so far (a node is still READY)" if cost["open"] else "")),
        (
            "how",
            f"{price['chips']} chips x {cost['ready_seconds'] / 3600:.4f} h READY = {cost['chip_hours']:.4f} "
            f"chip-hours x ${price['usd_per_chip_hour']}/chip-hour ({price['accelerator']}, {kind}; list prices read "
            f"{price['prices_read_on']})",
        ),
        ("preemptions", str(cost["preemptions"])),
    ]
    if cost.get("budget_usd") is not None:
        rows.append(("budget", money(cost["budget_usd"])))
    nodes = [
        [n["node"], _when(n["ready_at"]), duration(n["seconds"]), n["ended_by"] + (" (open)" if n["open"] else "")]
        for n in cost["nodes"]
    ]
    return _table(rows) + _grid(["node", "READY at", "READY for", "ended by"], nodes, {2})


def _waited(cause: dict[str, Any]) -> str:
    """A cause's time that did not bill: a queued machine's wait for capacity is not measured; a cause that is not
    measured at all says so once, in its billed column."""
    if cause["waited_s"] is None:
        return "not measured" if cause["cause"] == "capacity" else ""
    return f"{cause['waited_s']:.1f}" if cause["waited_s"] else ""


def _shown(cause: dict[str, Any]) -> bool:
    """A row of the goodput table: a cause that took time, or one not measured (said as such); productive steps
    always. A measured nought is no row (the JSON keeps every cause)."""
    took = (cause["billed_s"] or 0.0) >= 0.05 or (cause["waited_s"] or 0.0) >= 0.05
    return cause["cause"] == "productive" or took or cause["billed_s"] is None or _waited(cause) == "not measured"


def _goodput_html(data: dict[str, Any], chart: Any) -> str:
    g = data.get("goodput")
    if g is None:
        return '<p class="muted">no machine time yet</p>'
    total = g["billed_s"] or 0.0
    head = "not measured" if g["percent"] is None else f"{g['percent']:.1f}%"
    if g["usd"] is not None and g["billed_usd"] is not None:
        head += f" ({money(g['usd'])} of {money(g['billed_usd'])})"
    elif g["billable"] and g["no_price"]:
        head += f"; dollars {g['no_price']}"
    what = "billed" if g["billable"] else "machine time (a local run bills nothing)"
    parts = [f"<p>goodput {_e(head)} of {_e(duration(total))} {what}{' so far' if g['open'] else ''}</p>"]
    if chart is not None:
        parts.append(_chart_html(chart))

    def seconds(value: float | None) -> str:
        return "not measured" if value is None else f"{value:.1f}"

    rows = [
        [
            c["label"] + (f" ({c['steps']} steps)" if c.get("steps") else ""),
            seconds(c["billed_s"]),
            "" if c["billed_s"] is None or not total else f"{100 * c['billed_s'] / total:.1f}%",
            "" if c["usd"] is None else money(c["usd"]),
            _waited(c),
            c["note"],
        ]
        for c in g["causes"]
        if _shown(c)
    ]
    parts.append(_grid(["cause", "billed (s)", "share", "$", "not billed (s)", "note"], rows, {1, 2, 3, 4}))
    lost = [
        [
            f"{d['kind']} (machine {d['attempt']})",
            f"{d['at_s']:.1f}",
            "-" if d["reached_step"] is None else str(d["reached_step"]),
            "-" if d["resumed_step"] is None else str(d["resumed_step"]),
            "-" if d["redone_steps"] is None else str(d["redone_steps"]),
            seconds(d["redone_s"]),
            f"{d['restart_s']:.1f}",
            "" if d["usd"] is None else money(d["usd"]),
        ]
        for d in g["disruptions"]
    ]
    if lost:
        header = ["disruption", "at (s)", "step reached", "resumed from", "steps redone", "redone (s)", "restart (s)"]
        parts.append(_grid([*header, "$ lost"], lost, {1, 2, 3, 4, 5, 6, 7}))
    return "".join(parts)


def _startup_html(data: dict[str, Any]) -> str:
    s = data["startup"]
    info = backends.info(data["backend"])
    labels = [
        ("ready_s", f"{info.ready} (provisioned)" if info.bills else "process started"),
        ("image_pulled_s", "image pulled (container started)"),
        ("job_started_s", "job started"),
        ("framework_imported_s", "framework imported"),
        ("device_found_s", "device found"),
        ("first_step_s", "first step"),
        ("training_started_s", "epoch 1 began (metrics.jsonl)"),
        ("first_epoch_done_s", "epoch 1 done"),
    ]
    if not info.pulls_image:
        labels = [(k, label) for k, label in labels if k != "image_pulled_s"]  # no image to pull here
    rows = [[label, "-" if s.get(key) is None else f"{s[key]:.1f}"] for key, label in labels]
    note = ""
    if s.get("missing"):
        note = f'<p class="muted">{_e(", ".join(s["missing"]))}: the run has no event that says when.</p>'
    return _grid(["seconds after the submit to", "s"], rows, {1}) + note


def _chart_html(chart: Any) -> str:
    """The chart's SVG inline, its root given the page's id, class and data-points."""
    points = html.escape(json.dumps(chart.points), quote=True)
    head, sep, rest = chart.svg.partition("<svg ")
    if head or not sep:
        raise ValueError(f"the {chart.id} chart is not an SVG document")  # plots.Chart always is
    return f'<svg class="chart" id="chart-{_e(chart.id)}" data-points="{points}" {rest.rstrip()}'


def render(data: dict[str, Any], charts: list[Any]) -> str:
    """The page. Everything from the run directory is escaped; the charts are inline SVG (escaped as they are drawn)."""
    by_id = {c.id: c for c in charts}
    title = f"Run {data['run_id']}"
    head_rows = [
        ("job", one_line(data["job"], 80)),
        ("state", str(data["state"])),
        ("backend", one_line(data["backend"], 40)),
        ("created", _when(data["created_at"])),
        ("finished", _when(data["finished_at"])),
        ("run directory", data["run_dir"]),
    ]
    if data.get("reason"):
        head_rows.insert(2, ("reason", one_line(data["reason"], 400)))
    if data["machines"] > 1 or data["preemptions"]:
        head_rows.append(("machines", f"{data['machines']} ({data['preemptions']} preemption(s))"))
    if (resumed := Resumed.from_json(data.get("resumed"))) is not None:
        head_rows.append(("resumed", one_line(resumed.row(), 300)))
    parts = [
        f"<h1>{_e(title)}</h1>",
        _table(head_rows),
        "<h2>Final metrics, strategy and devices</h2>",
        _table(_final_rows(data)) if _final_rows(data) else '<p class="muted">no summary.json</p>',
        "<h2>Cost</h2>",
        _cost_html(data),
        "<h2>Goodput: where the billed time went</h2>",
        _goodput_html(data, by_id.get("goodput")),
        "<h2>Startup</h2>",
        _startup_html(data),
        "<h2>Timeline</h2>",
    ]
    if "timeline" in by_id:
        parts.append(_chart_html(by_id["timeline"]))
        phases = [
            [p["name"], str(p["attempt"]), f"{p['start_s']:.1f}", f"{p['seconds']:.1f}", p["evidence"]]
            for p in data["timeline"]["phases"]
        ]
        parts.append(_grid(["phase", "machine", "start (s)", "seconds", "from"], phases, {1, 2, 3}))
        markers = [[m["label"], f"{m['at_s']:.1f}"] for m in data["timeline"]["markers"]]
        if markers:
            parts.append(_grid(["event", "at (s)"], markers, {1}))
    else:
        parts.append('<p class="muted">no events with both ends of a phase</p>')
    parts.append("<h2>Training curves</h2>")
    curves = [c for c in charts if c.id not in ("timeline", "goodput")]
    parts += [_chart_html(c) for c in curves] or ['<p class="muted">no metrics.jsonl rows</p>']
    if data["metrics"]:
        keys = [k for k in data["metrics"][0] if k != "time"][:10]
        rows = [[rounded(r[k]) if k in r else "" for k in keys] for r in data["metrics"]]
        parts.append(_grid(keys, rows, set(range(len(keys)))))
        if data.get("metrics_from") and data["metrics_from"] != contract.METRICS:
            parts.append(f'<p class="muted">from Keras\' epoch lines in {_e(data["metrics_from"])}</p>')
    parts.append("<h2>Checkpoints</h2>")
    if data["checkpoints"]:
        parts.append(f"<p>{_e(checkpoints_text([CheckpointInfo(**c) for c in data['checkpoints']]))}</p>")
        rows = [
            [
                c["file"],
                c.get("format") or "files",
                "-" if c["global_step"] is None else str(c["global_step"]),
                "-" if c["epochs_done"] is None else str(c["epochs_done"]) + (f" +{c['step']}" if c["step"] else ""),
                "-" if c["size"] is None else size_text(c["size"]),
                _when(c["time"]),
            ]
            for c in data["checkpoints"]
        ]
        parts.append(_grid(["checkpoint", "format", "step", "epochs done", "size", "saved"], rows, {2, 3, 4}))
    else:
        parts.append('<p class="muted">none committed under checkpoints/</p>')
    if data["trainer_lines"]:
        parts += ["<h2>The trainer's log lines</h2>", f"<pre>{_e(chr(10).join(data['trainer_lines']))}</pre>"]
    parts += ["<h2>Spec</h2>", f"<pre>{_e(data['spec_yaml'] or '(no spec.yaml)')}</pre>"]
    if data["warnings"]:
        items = "".join(f"<li>{_e(w)}</li>" for w in data["warnings"])
        parts += ["<h2>Warnings</h2>", f'<ul class="warn">{items}</ul>']
    # Every "<" as \u003c (only strings hold one): neither "</script>" nor "<!--" in a log line or a metric name
    # can end or bend the data block. Still valid JSON.
    payload = json.dumps({**data, "charts": [c.to_json() for c in charts]}, default=str).replace("<", "\\u003c")
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>\n"
        + "\n".join(parts)
        + f'\n<p class="muted">generated by runner report at {_when(data["generated_at"])}</p>'
        + f'\n<script type="application/json" id="report-data">{payload}</script>\n</body></html>\n'
    )


def build(
    record: RunRecord, state: RunState | str, *, snapshot: Snapshot | None = None, facts: RunFacts | None = None
) -> tuple[dict[str, Any], RunFacts]:
    """The report's data (what --json prints) and the facts it came from (`facts`: gathered already, with the
    checkpoints); nothing is written (the charts are drawn only to count their points)."""
    storage = open_storage(record.run_dir)
    facts = facts or gather(record, storage, snapshot=snapshot, checkpoints=True)
    data = report_data(facts, state, storage)
    data["charts"] = planned(facts.timeline, facts.metrics, facts.goodput)
    return data, facts


def write(data: dict[str, Any], facts: RunFacts, *, out_dir: Path | None = None, upload: bool = True) -> Report:
    """Draw the charts and write the page (and, for a gs:// run directory, upload a copy to
    <run dir>/report/index.html: a failed upload is a warning)."""
    problems: list[str] = []
    charts = draw_charts(facts.timeline, facts.metrics, problems, facts.goodput)
    data = {**data, "warnings": [*data["warnings"], *problems]}
    page = render(data, charts)
    record = facts.record
    directory = out_dir or default_dir(record)
    path = directory / PAGE
    try:
        directory.mkdir(parents=True, exist_ok=True)
        path.write_text(page, encoding="utf-8")
        for chart in charts:
            (directory / f"{chart.id}.svg").write_text(chart.svg, encoding="utf-8")
    except OSError as exc:
        raise StorageError(f"cannot write the report to {path}: {exc.strerror or exc}") from None
    warnings = [*facts.warnings, *problems]
    uploaded = None
    storage = open_storage(record.run_dir)
    if upload and not storage.is_local:
        key = f"{contract.REPORT_DIR}/{PAGE}"
        try:
            storage.write_bytes(key, page.encode())
            uploaded = f"{storage.url.rstrip('/')}/{key}"
        except RunnerError as exc:
            warnings.append(f"the report was not uploaded to the run directory: {exc.message}")
    return Report(path.absolute(), uploaded, data, warnings)


def make_report(
    record: RunRecord,
    state: RunState | str,
    *,
    out_dir: Path | None = None,
    upload: bool = True,
    snapshot: Snapshot | None = None,
    facts: RunFacts | None = None,
) -> Report:
    """The whole report of one run: build, draw, write (and upload)."""
    data, facts = build(record, state, snapshot=snapshot, facts=facts)
    return write(data, facts, out_dir=out_dir, upload=upload)
