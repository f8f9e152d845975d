"""The report's charts as PNG bytes: the timeline of phases, where the billed time went (goodput), loss and accuracy
per epoch, examples/s.

matplotlib is imported here only, by `runner report` (and the end of `submit`), through its object API and the Agg
canvas: no pyplot, no global backend, nothing drawn on a screen. Each chart says how many points each of its series
has, so that a test (or a reader) can hold the picture to metrics.jsonl.
"""

from __future__ import annotations

import functools
import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

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
    png: bytes
    points: dict[str, int]  # series -> number of points drawn
    width: int  # pixels
    height: int

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "title": self.title, "points": self.points, "width": self.width, "height": self.height}


def _figure(width_in: float, height_in: float) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width_in, height_in), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _png(fig: Any) -> tuple[bytes, int, int]:
    out = io.BytesIO()
    fig.savefig(out, format="png", dpi=100, metadata={"Software": None})
    width, height = (round(v) for v in fig.get_size_inches() * 100)
    return out.getvalue(), width, height


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
    fig = _figure(6.4, 3.4)
    ax = fig.add_subplot()
    points: dict[str, int] = {}
    for key in keys:
        xs, ys = series(rows, key)
        if not ys:
            continue
        # The count is read back from what was drawn (bars, or the line's vertices), not from the rows.
        if chart_id == "speed":
            points[key] = len(ax.bar(xs, ys, color="#43a047", label=key, width=0.6).patches)
        else:
            (line,) = ax.plot(xs, ys, marker="o", label=key, linestyle="--" if key.startswith("val_") else "-")
            points[key] = len(line.get_xdata())
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title(title)
    ax.set_xlabel("epoch" if any("epoch" in r for r in rows) else "row")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if len(points) > 1 or chart_id != "speed":
        ax.legend(loc="best")
    png, width, height = _png(fig)
    return Chart(chart_id, title, png, points, width, height)


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


def timeline_chart(timeline: Timeline) -> Chart | None:
    """A Gantt chart: one row per phase, every attempt's bar in it; preemptions and restarts as vertical lines."""
    if not timeline.phases:
        return None
    names: list[str] = []
    for phase in timeline.phases:
        if phase.name not in names:
            names.append(phase.name)
    fig = _figure(9.0, 0.45 * len(names) + 1.6)
    ax = fig.add_subplot()
    origin = timeline.origin
    for row, name in enumerate(names):
        spans = [(p.start - origin, max(p.seconds, 1e-3)) for p in timeline.phases if p.name == name]
        ax.broken_barh(spans, (row - 0.38, 0.76), color=_PHASE_COLOURS.get(name, "#607d8b"))
    markers = shown_markers(timeline)
    for marker in markers:
        x = marker.time - origin
        colour = "#d81b60" if marker.event == "preempted" else "#546e7a"
        ax.axvline(x, color=colour, linestyle=":", linewidth=1.5)
        ax.text(x, -0.9, marker.label, rotation=0, fontsize=8, color=colour, ha="left", va="bottom")
    ax.set_yticks(range(len(names)), labels=names)
    ax.invert_yaxis()
    ax.set_xlim(*_x_range(timeline))
    ax.set_xlabel("seconds after the submit")
    ax.set_title("Timeline" + (f" ({timeline.attempts} machines)" if timeline.attempts > 1 else ""))
    ax.grid(axis="x", alpha=0.3)
    png, width, height = _png(fig)
    points = {"phases": len(timeline.phases), "markers": len(markers)}
    return Chart("timeline", "Timeline", png, points, width, height)


def _plain(text: str) -> str:
    """Text as it reads: matplotlib takes what stands between two $ for math."""
    return text.replace("$", r"\$")


def _billed_parts(goodput: Goodput) -> list[tuple[str, str, float]]:
    """(cause, label, billed seconds) of every cause with billed time, productive first."""
    return [(c.key, c.label, c.billed_s) for c in goodput.causes if c.billed_s and c.billed_s > 0]


def goodput_chart(goodput: Goodput) -> Chart | None:
    """One stacked bar: the billed time by cause, productive steps first, each in the legend with its time and share
    (and dollars, where there is a price)."""
    parts = _billed_parts(goodput)
    if not parts or goodput.billed_s <= 0:
        return None
    fig = _figure(9.0, 1.9 + 0.26 * ((len(parts) + 1) // 2))
    ax = fig.add_subplot()
    left = 0.0
    drawn = 0
    for key, label, seconds in parts:
        share = 100 * seconds / goodput.billed_s
        dollars = f", {money(seconds * goodput.price.per_hour / 3600)}" if goodput.price is not None else ""
        colour = _CAUSE_COLOURS.get(key, "#607d8b")
        name = _plain(f"{label}  {duration(seconds)} ({share:.0f}%{dollars})")
        drawn += len(ax.barh([0], [seconds], left=left, height=0.6, color=colour, edgecolor="white", label=name))
        if share >= 8:
            ink = "#212121" if key in ("checkpoint_save", "unmeasured", "idle", "checkpoint_restore") else "white"
            ax.text(left + seconds / 2, 0, f"{share:.0f}%", ha="center", va="center", fontsize=10, color=ink)
        left += seconds
    ax.set_xlim(0, goodput.billed_s)
    ax.set_ylim(-0.5, 0.5)
    ax.set_yticks([])
    what = "billed" if goodput.billable else "of machine time (a local run bills nothing)"
    ax.set_xlabel(f"seconds {what}" + (" so far" if goodput.open else ""))
    percent = goodput.percent
    head = "not measured" if percent is None else f"{percent:.0f}%"
    if goodput.usd is not None and goodput.billed_usd is not None:
        head += f", {money(goodput.usd)} of {money(goodput.billed_usd)}"
    ax.set_title(_plain(f"Where the {'billed' if goodput.billable else 'machine'} time went: goodput {head}"))
    fig.legend(loc="outside lower center", ncol=2, frameon=False, fontsize=9)
    png, width, height = _png(fig)
    return Chart("goodput", "Goodput", png, {"causes": drawn}, width, height)


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
        except Exception as exc:  # matplotlib's errors have no common root
            problems.append(f"the {name} chart could not be drawn: {type(exc).__name__}: {str(exc)[:200]}")
            continue
        if chart is not None:
            out.append(chart)
    return out


def planned(timeline: Timeline, rows: Sequence[dict[str, Any]], goodput: Goodput | None = None) -> list[dict[str, Any]]:
    """The charts `charts` draws and their points, without drawing them (no matplotlib): for --json."""
    out = []
    if timeline.phases:
        out.append(
            {"id": "timeline", "points": {"phases": len(timeline.phases), "markers": len(shown_markers(timeline))}}
        )
    if goodput is not None and goodput.billed_s > 0 and (parts := _billed_parts(goodput)):
        out.append({"id": "goodput", "points": {"causes": len(parts)}})
    for chart_id, _, _, keys in curve_keys(rows):
        points = {k: n for k in keys if (n := len(series(rows, k)[1]))}
        out.append({"id": chart_id, "points": points})
    return out
