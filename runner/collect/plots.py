"""The report's charts as SVG: the timeline of phases, where the billed time went (goodput), loss and accuracy per
epoch, examples/s.

Drawn with runner.collect.svg, from strings: no plotting library, so nothing heavy is imported by `runner report`
(and the end of `submit`), nor sits in the environment for Keras to import at start-up. Each chart says how many
points each of its series has, counted from the elements it drew, so that a test (or a reader) can hold the picture
to metrics.jsonl.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from runner.collect import svg
from runner.collect.goodput import Goodput
from runner.collect.timeline import Marker, Timeline
from runner.plan.budget import duration, money
from runner.watch.rundir import number

# (chart id, title, y label, series): the known metrics.jsonl columns, train and validation.
CURVES = [
    ("loss", "Loss per epoch", "loss", ("loss", "val_loss")),
    ("accuracy", "Accuracy per epoch", "accuracy", ("accuracy", "val_accuracy")),
    ("speed", "Training speed per epoch", "examples/s", ("examples_per_s",)),
]
_BOOKKEEPING = {"epoch", "time", "global_step", "epoch_time_s", "resumed_at_step", "step"}
_PHASE_COLOURS = {
    "plan": "#9e9e9e",
    "queue/provision": "#8d6e63",
    "boot": "#ffb300",
    "image pull": "#fb8c00",
    "container start": "#f4511e",
    "worker start": "#f4511e",
    "framework import": "#8e24aa",
    "device found": "#5e35b1",
    "first step": "#3949ab",
    "start-up (import, device, data, model)": "#7e57c2",
    "training": "#43a047",
    "job": "#43a047",
    "final evaluation": "#00897b",
    "after training": "#80cbc4",
    "upload": "#1e88e5",
    "idle before teardown": "#90a4ae",
    "teardown": "#e53935",
    "waiting for capacity": "#6d4c41",
    "data": "#00acc1",
    "checkpoint save": "#fdd835",
    "checkpoint restore": "#c0ca33",
}
# goodput's causes: productive green, what went before the job warm, the job's own overheads cool, idle grey
_CAUSE_COLOURS = {
    "productive": "#43a047",
    "provisioning": "#ffb300",
    "image_pull": "#fb8c00",
    "startup": "#8e24aa",
    "data": "#00acc1",
    "checkpoint_restore": "#c0ca33",
    "checkpoint_save": "#fdd835",
    "redone": "#e53935",
    "evaluation": "#00897b",
    "idle": "#90a4ae",
    "job": "#607d8b",
    "unmeasured": "#e0e0e0",
}


@dataclass(frozen=True)
class Chart:
    id: str
    title: str
    svg: str  # a standalone SVG document, which an HTML page can also hold inline
    points: dict[str, int]  # series -> number of points drawn (elements in the SVG)
    width: int  # pixels
    height: int

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "title": self.title, "points": self.points, "width": self.width, "height": self.height}


def _chart(chart_id: str, title: str, canvas: svg.Canvas, points: dict[str, int], heading: str | None = None) -> Chart:
    return Chart(chart_id, title, canvas.render(heading or title), points, canvas.width, canvas.height)


def _title(canvas: svg.Canvas, words: str) -> None:
    canvas.text(canvas.width / 2, 24, words, size=16, anchor="middle")


def series(rows: Sequence[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    """(x, y) of one metrics column: x is the row's epoch when it has one, else its line number (from 1)."""
    xs, ys = [], []
    for n, row in enumerate(rows, start=1):
        y = number(row.get(key))
        if y is None:
            continue
        epoch = number(row.get("epoch"))
        xs.append(epoch if epoch is not None else float(n))
        ys.append(y)
    return xs, ys


def curve_keys(rows: Sequence[dict[str, Any]]) -> list[tuple[str, str, str, tuple[str, ...]]]:
    """The charts these rows can fill: the known ones with data, else one of whatever numbers a custom job wrote."""
    charts = [c for c in CURVES if any(series(rows, k)[1] for k in c[3])]
    if charts:
        return charts
    others: list[str] = []
    for row in rows:
        for key, value in row.items():
            if key not in _BOOKKEEPING and key not in others and number(value) is not None:
                others.append(str(key))
    return [("metrics", "Metrics per row of metrics.jsonl", "value", tuple(others[:8]))] if others else []


def curve_chart(chart_id: str, title: str, ylabel: str, keys: Sequence[str], rows: Sequence[dict[str, Any]]) -> Chart:
    """Lines with a marker per point (validation dashed); "speed" as bars. ChartError: numbers no axis can hold."""
    drawn = [(key, *series(rows, key)) for key in keys]
    drawn = [(key, xs, ys) for key, xs, ys in drawn if ys]
    if not drawn:
        raise svg.ChartError("no series has a number")
    bars = chart_id == "speed"
    all_x = [x for _, xs, _ in drawn for x in xs]
    all_y = [y for _, _, ys in drawn for y in ys]
    pad = max(0.5, 0.05 * (max(all_x) - min(all_x)))  # half a bar at least
    x_axis = svg.linear([min(all_x) - pad, max(all_x) + pad], integer=True)
    y_axis = svg.linear(all_y, count=8, zero=bars, margin=0.05)
    canvas = svg.Canvas(640, 340)
    size = svg.SIZE
    widest = max(svg.text_width(label, size) for label in y_axis.labels)
    left = 12 + 1.2 * (size + 1) + widest + 12
    frame = svg.Frame(canvas, left, 40, canvas.width - left - 18, canvas.height - 40 - 52, x_axis, y_axis)
    _title(canvas, title)
    frame.axes("epoch" if any("epoch" in r for r in rows) else "row", ylabel)
    entries = []
    for n, (key, xs, ys) in enumerate(drawn):
        colour = "#43a047" if bars else svg.PALETTE[n % len(svg.PALETTE)]
        if bars:
            frame.bars(key, xs, ys, colour, width=0.6)
        else:
            frame.line(key, xs, ys, colour, dashed=key.startswith("val_"))
        entries.append(svg.Entry(key, colour, "box" if bars else "dashed" if key.startswith("val_") else "line"))
    if len(entries) > 1 or not bars:
        frame.legend(entries)
    # The counts are read back from what was drawn (a marker per point, or a bar), not from the rows.
    return _chart(chart_id, title, canvas, {key: canvas.drawn.get(key, 0) for key, _, _ in drawn})


def _x_range(timeline: Timeline) -> tuple[float, float]:
    origin = timeline.origin
    start = min(0.0, min(p.start - origin for p in timeline.phases))
    return start, max(p.end - origin for p in timeline.phases) * 1.02 + 1e-3


def shown_markers(timeline: Timeline) -> list[Marker]:
    """The markers inside the phases' span: one whose clock is far off (a VM's, a hand-edited file) is listed in the
    page's table, never drawn (it would stretch the chart to nothing)."""
    if not timeline.phases:
        return []
    low, high = _x_range(timeline)
    return [m for m in timeline.markers if low <= m.time - timeline.origin <= high]


def _levels(spans: Sequence[tuple[float, float]], most: int = 3) -> list[int]:
    """A line for each label (left, right in pixels) so that none overlaps the one before it on its line; past
    `most` lines they overlap on the last."""
    ends: list[float] = []
    out = []
    for left, right in spans:
        level = next((n for n, end in enumerate(ends) if left > end + 4), len(ends))
        level = min(level, most - 1)
        if level == len(ends):
            ends.append(right)
        else:
            ends[level] = max(ends[level], right)
        out.append(level)
    return out


def timeline_chart(timeline: Timeline) -> Chart | None:
    """A Gantt chart: one row per phase, every attempt's bar in it; preemptions and restarts as vertical lines."""
    if not timeline.phases:
        return None
    names: list[str] = []
    for phase in timeline.phases:
        if phase.name not in names:
            names.append(phase.name)
    size, row_h = svg.SIZE, 30
    low, high = _x_range(timeline)
    x_axis = svg.linear([low, high], count=8)
    rows = tuple(float(n) for n in range(len(names)))
    y_axis = svg.Axis(len(names) - 0.5, -0.5, rows, tuple(names))  # from the top down, as read
    left = 14 + max(svg.text_width(name, size) for name in names) + 10
    width = 900
    plot_w = width - left - 24
    markers = shown_markers(timeline)
    origin = timeline.origin
    at = [left + x_axis.fraction(m.time - origin) * plot_w for m in markers]
    levels = _levels([(x, x + 4 + svg.text_width(m.label, 11)) for x, m in zip(at, markers, strict=True)])
    top = 40 + (max(levels) + 1) * 14 if markers else 40
    canvas = svg.Canvas(width, top + row_h * len(names) + 52)
    frame = svg.Frame(canvas, left, top, plot_w, row_h * len(names), x_axis, y_axis)
    heading = "Timeline" + (f" ({timeline.attempts} machines)" if timeline.attempts > 1 else "")
    _title(canvas, heading)
    frame.axes("seconds after the submit", None, grid="x")
    for phase in timeline.phases:
        row = names.index(phase.name)
        x0, x1 = frame.px(phase.start - origin), frame.px(phase.start - origin + max(phase.seconds, 1e-3))
        y0, y1 = frame.py(row - 0.38), frame.py(row + 0.38)
        tip = f"{phase.name} (machine {phase.attempt}): {phase.start - origin:.1f}s + {phase.seconds:.1f}s"
        colour = _PHASE_COLOURS.get(phase.name, "#607d8b")
        canvas.rect(x0, y0, max(x1 - x0, 1.0), y1 - y0, colour, series="phases", tip=tip)
    for marker, x, level in zip(markers, at, levels, strict=True):
        colour = "#d81b60" if marker.event == "preempted" else "#546e7a"
        label_y = 40 + level * 14 + 9
        canvas.line(x, label_y - 9, x, top + frame.height, colour, 1.5, series="markers", dash="2 3")
        canvas.text(x + 3, label_y, marker.label, size=11, colour=colour)
    points = {"phases": canvas.drawn.get("phases", 0), "markers": canvas.drawn.get("markers", 0)}
    return _chart("timeline", "Timeline", canvas, points, heading)


def _billed_parts(goodput: Goodput) -> list[tuple[str, str, float]]:
    """(cause, label, billed seconds) of every cause with billed time, productive first."""
    return [(c.key, c.label, c.billed_s) for c in goodput.causes if c.billed_s and c.billed_s > 0]


def goodput_chart(goodput: Goodput) -> Chart | None:
    """One stacked bar: the billed time by cause, productive steps first, each in the legend with its time and share
    (and dollars, where there is a price)."""
    parts = _billed_parts(goodput)
    if not parts or goodput.billed_s <= 0:
        return None
    entries = []
    for key, label, seconds in parts:
        share = 100 * seconds / goodput.billed_s
        dollars = f", {money(seconds * goodput.price.per_hour / 3600)}" if goodput.price is not None else ""
        entries.append(svg.Entry(f"{label}  {duration(seconds)} ({share:.0f}%{dollars})", _colour(key), "box"))
    legend_w, legend_h = svg.legend_size(entries, columns=2)
    canvas = svg.Canvas(max(900, legend_w + 24), 156 + legend_h + 10)
    x_axis = svg.linear([0.0, goodput.billed_s], count=8)
    y_axis = svg.Axis(-0.5, 0.5, (), ())
    frame = svg.Frame(canvas, 24, 44, canvas.width - 48, 56, x_axis, y_axis)
    percent = goodput.percent
    head = "not measured" if percent is None else f"{percent:.0f}%"
    if goodput.usd is not None and goodput.billed_usd is not None:
        head += f", {money(goodput.usd)} of {money(goodput.billed_usd)}"
    heading = f"Where the {'billed' if goodput.billable else 'machine'} time went: goodput {head}"
    _title(canvas, heading)
    what = "billed" if goodput.billable else "of machine time (a local run bills nothing)"
    frame.axes(f"seconds {what}" + (" so far" if goodput.open else ""), None, grid="")
    left = 0.0
    y0, y1 = frame.py(0.3), frame.py(-0.3)
    for (key, _, seconds), entry in zip(parts, entries, strict=True):
        x0, x1 = frame.px(left), frame.px(min(left + seconds, goodput.billed_s))
        canvas.rect(x0, y0, x1 - x0, y1 - y0, _colour(key), series="causes", tip=entry.label, extra={"stroke": "white"})
        share = 100 * seconds / goodput.billed_s
        if share >= 8:
            ink = "#212121" if key in ("checkpoint_save", "unmeasured", "idle", "checkpoint_restore") else "white"
            canvas.text((x0 + x1) / 2, (y0 + y1) / 2 + 4.5, f"{share:.0f}%", size=13, anchor="middle", colour=ink)
        left += seconds
    svg.legend(canvas, (canvas.width - legend_w) / 2, 156, entries, columns=2, frame=False)
    return _chart("goodput", "Goodput", canvas, {"causes": canvas.drawn.get("causes", 0)}, heading)


def _colour(cause: str) -> str:
    return _CAUSE_COLOURS.get(cause, "#607d8b")


def charts(
    timeline: Timeline, rows: Sequence[dict[str, Any]], problems: list[str], goodput: Goodput | None = None
) -> list[Chart]:
    """Every chart this run has data for, timeline and goodput first. A chart that cannot be drawn (numbers no axis
    can hold, from a run directory someone else wrote) is left out and named in `problems`: the page still comes."""
    drawers: list[tuple[str, Callable[[], Chart | None]]] = [("timeline", lambda: timeline_chart(timeline))]
    if goodput is not None:
        drawers.append(("goodput", lambda: goodput_chart(goodput)))
    for cid, title, ylabel, keys in curve_keys(rows):
        drawers.append((cid, functools.partial(curve_chart, cid, title, ylabel, keys, rows)))
    out = []
    for name, draw in drawers:
        try:
            chart = draw()
        except svg.ChartError as exc:
            problems.append(f"the {name} chart could not be drawn: {str(exc)[:200]}")
            continue
        if chart is not None:
            out.append(chart)
    return out


def planned(timeline: Timeline, rows: Sequence[dict[str, Any]], goodput: Goodput | None = None) -> list[dict[str, Any]]:
    """The charts `charts` draws and their points, for --json, which writes no picture. Drawing is building a few
    strings, so they are drawn and dropped: the list is what the page holds, a chart left out for its numbers too."""
    return [{"id": c.id, "points": c.points} for c in charts(timeline, rows, [], goodput)]
