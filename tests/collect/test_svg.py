"""runner.collect.svg and the charts drawn with it (runner.collect.plots): round-number ticks, escaping, numbers no
axis can hold, and counts of points that are the elements in the SVG. The page that holds the charts, in a browser:
tests/collect/test_report.py."""

from __future__ import annotations

import itertools
import math
import xml.etree.ElementTree as ET
from collections import Counter
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runner.collect import plots, svg
from runner.collect.timeline import Marker, Phase, Timeline

NS = "{http://www.w3.org/2000/svg}"


def parse(document: str) -> ET.Element:
    """The SVG as XML: an error here is a file no viewer opens."""
    root = ET.fromstring(document)
    assert root.tag == f"{NS}svg" and root.get("role") == "img" and root.get("aria-label")
    assert root.findtext(f"{NS}title") == root.get("aria-label")
    return root


def drawn(document: str) -> dict[str, int]:
    """Series -> elements drawn for it, read from the SVG itself."""
    return dict(Counter(e.get("data-series") for e in parse(document).iter() if e.get("data-series") is not None))


def texts(document: str) -> list[str]:
    return [e.text or "" for e in parse(document).iter(f"{NS}text")]


def tick_texts(document: str, anchor: str) -> list[str]:
    """The muted labels of one axis: the y axis' are right-aligned ("end"), the x axis' centred ("middle")."""
    return [
        e.text or ""
        for e in parse(document).iter(f"{NS}text")
        if e.get("fill") == svg.MUTED and e.get("text-anchor") == anchor
    ]


# -- ticks ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("span", "count", "integer", "step"),
    [
        (1.0, 5, False, 0.2),
        (10.0, 5, False, 2.0),
        (7.0, 5, False, 2.0),
        (12.5, 5, False, 2.5),
        (100.0, 5, False, 20.0),
        (0.03, 5, False, 0.01),
        (1e6, 4, False, 250_000.0),
        (3.0, 5, True, 1.0),
        (12.5, 5, True, 5.0),  # no 2.5 on an axis of whole numbers
        (40.0, 8, True, 5.0),
    ],
)
def test_nice_step_is_a_round_number(span: float, count: int, integer: bool, step: float) -> None:
    assert svg.nice_step(span, count, integer=integer) == pytest.approx(step)


@pytest.mark.parametrize("span", [0.0, -1.0, math.nan, math.inf, 5e-324])
def test_nice_step_of_no_range_is_a_chart_error(span: float) -> None:
    with pytest.raises(svg.ChartError):
        svg.nice_step(span)


@pytest.mark.parametrize(
    ("low", "high", "integer", "expected", "labels"),
    [
        (0, 1, False, [0, 0.2, 0.4, 0.6, 0.8, 1], ["0.0", "0.2", "0.4", "0.6", "0.8", "1.0"]),
        (0.1, 0.9, False, [0.2, 0.4, 0.6, 0.8], ["0.2", "0.4", "0.6", "0.8"]),
        (-3, 7, False, [-2, 0, 2, 4, 6], ["-2", "0", "2", "4", "6"]),
        (0, 0.3, False, [0, 0.1, 0.2, 0.3], ["0.0", "0.1", "0.2", "0.3"]),
        (0, 0.25, False, [0, 0.05, 0.1, 0.15, 0.2, 0.25], ["0.00", "0.05", "0.10", "0.15", "0.20", "0.25"]),
        (1, 3, True, [1, 2, 3], ["1", "2", "3"]),
        (0.5, 3.5, True, [1, 2, 3], ["1", "2", "3"]),
        (0, 2000, False, [0, 500, 1000, 1500, 2000], ["0", "500", "1000", "1500", "2000"]),
        (0, 3.7e7, False, [0, 1e7, 2e7, 3e7], ["0", "1e+07", "2e+07", "3e+07"]),
        (2.5, 2.5, False, [2.5], ["2.5"]),
    ],
)
def test_ticks_are_round_multiples_with_plain_labels(
    low: float, high: float, integer: bool, expected: list[float], labels: list[str]
) -> None:
    marks = svg.ticks(low, high, integer=integer)
    assert marks == expected  # exact: 0.15, never 0.15000000000000002
    assert svg.tick_labels(marks) == labels


def test_no_tick_label_is_minus_zero() -> None:
    assert svg.tick_labels([-0.0, 0.5]) == ["0.0", "0.5"]
    assert "-0" not in svg.tick_labels(svg.ticks(-1.0, 1.0))


@pytest.mark.parametrize(("low", "high"), [(math.nan, 1.0), (0.0, math.inf), (1.0, 0.0), (-1e308, 1e308)])
def test_ticks_of_numbers_no_axis_holds_are_a_chart_error(low: float, high: float) -> None:
    with pytest.raises(svg.ChartError):
        svg.ticks(low, high)


@given(
    low=st.floats(min_value=-1e6, max_value=1e6),
    span=st.floats(min_value=1e-3, max_value=1e6),
    count=st.integers(min_value=4, max_value=10),
)
def test_ticks_split_any_range_into_a_few_even_round_steps(low: float, span: float, count: int) -> None:
    high = low + span
    marks = svg.ticks(low, high, count)
    step = svg.nice_step(high - low, count)  # the span as the floats have it
    assert 2 <= len(marks) <= count + 1
    assert all(low - step * 1e-6 <= m <= high + step * 1e-6 for m in marks)
    assert all(b - a == pytest.approx(step, rel=1e-6, abs=1e-9) for a, b in itertools.pairwise(marks))
    labels = svg.tick_labels(marks)
    assert len(set(labels)) == len(labels)  # no two ticks read the same
    assert all(
        float(text) == pytest.approx(m, rel=1e-6, abs=step * 1e-6) for text, m in zip(labels, marks, strict=True)
    )


def test_a_single_value_gets_a_range_around_it() -> None:
    assert svg.extent([5.0]) == (2.5, 7.5)
    assert svg.extent([0.0, 0.0]) == (-1.0, 1.0)
    axis = svg.linear([0.25])
    assert axis.low < 0.25 < axis.high and 0.25 in axis.ticks
    assert svg.extent([3.0], zero=True) == (0.0, 3.0)


def test_a_value_axis_leaves_a_margin_but_bars_stand_on_zero() -> None:
    lines = svg.linear([0.2, 1.2], margin=0.05)
    assert lines.low == pytest.approx(0.15) and lines.high == pytest.approx(1.25)
    assert lines.ticks == (0.25, 0.5, 0.75, 1.0, 1.25) and lines.labels == ("0.25", "0.50", "0.75", "1.00", "1.25")
    bars = svg.linear([1100.0, 1500.0], zero=True, margin=0.05)
    assert bars.low == 0.0 and bars.high == pytest.approx(1575.0) and bars.ticks[0] == 0.0


@pytest.mark.parametrize("values", [[math.nan], [1.0, math.inf], [-math.inf, 0.0], [-1e308, 1e308], [1.7e308], []])
def test_an_axis_over_numbers_it_cannot_hold_is_a_chart_error(values: list[float]) -> None:
    with pytest.raises(svg.ChartError):
        svg.linear(values)


def test_a_log_axis_ticks_the_given_marks_or_1_2_5() -> None:
    batches = svg.logarithmic([256.0, 512.0, 1024.0], marks=[256.0, 512.0, 1024.0])
    assert batches.ticks == (256.0, 512.0, 1024.0) and batches.labels == ("256", "512", "1024")
    assert batches.fraction(512.0) == pytest.approx(0.5)
    times = svg.logarithmic([24.0, 60.0, 94.0, 400.0])
    assert times.labels == ("20", "50", "100", "200", "500")
    narrow = svg.logarithmic([30.0, 33.0])  # no 1-2-5 mark but one inside: round linear steps
    assert len(narrow.ticks) >= 2 and all(narrow.low <= t <= narrow.high for t in narrow.ticks)
    with pytest.raises(svg.ChartError):
        svg.logarithmic([0.0, 5.0])


# -- escaping and counting --------------------------------------------------------------------------------------


def test_text_is_escaped_and_reads_back_as_written() -> None:
    label = "a<b & \"c\" 'd' $x^2$ </svg><script>"
    assert svg.escape(label) == "a&lt;b &amp; &quot;c&quot; &#39;d&#39; $x^2$ &lt;/svg&gt;&lt;script&gt;"
    canvas = svg.Canvas(100, 50)
    canvas.text(10, 20, label)
    canvas.rect(0, 0, 5, 5, "red", tip=label)
    document = canvas.render(f"title {label}")
    root = parse(document)
    assert texts(document) == [label]  # `$` is a dollar sign, not math
    assert root.get("aria-label") == f"title {label}"
    assert "<script>" not in document and "$x^2$" in document


def test_characters_xml_forbids_become_a_replacement_character() -> None:
    canvas = svg.Canvas(100, 50)
    canvas.text(0, 10, "nul\x00 bell\x07 tab\t")
    assert texts(canvas.render("t")) == ["nul\ufffd bell\ufffd tab\t"]


def test_the_points_counted_are_the_elements_drawn() -> None:
    canvas = svg.Canvas(400, 300)
    frame = svg.Frame(canvas, 50, 20, 300, 200, svg.linear([1.0, 4.0]), svg.linear([0.0, 10.0]))
    frame.axes("x", "y")
    frame.line("a", [1.0, 2.0, 3.0], [1.0, 5.0, 9.0], "#000")
    frame.bars("b", [1.0, 4.0], [2.0, 3.0], "#0f0")
    frame.legend([svg.Entry("a", "#000"), svg.Entry("b", "#0f0", "box")])
    assert canvas.drawn == {"a": 3, "b": 2} == drawn(canvas.render("t"))
    circles = [e for e in parse(canvas.render("t")).iter(f"{NS}circle") if e.get("data-series") == "a"]
    assert [float(c.get("cy") or 0) for c in circles] == pytest.approx([200.0, 120.0, 40.0])  # y grows upwards


def test_the_legend_takes_the_corner_that_hides_the_fewest_points() -> None:
    canvas = svg.Canvas(400, 300)
    frame = svg.Frame(canvas, 50, 20, 300, 200, svg.linear([1.0, 10.0]), svg.linear([0.0, 1.0]))
    frame.line("rising", [float(x) for x in range(1, 11)], [x / 10 for x in range(1, 11)], "#000")  # to top right
    frame.legend([svg.Entry("rising", "#000")])
    box = next(e for e in parse(canvas.render("t")).iter(f"{NS}rect") if e.get("fill-opacity"))
    assert float(box.get("x") or 0) < 100 and float(box.get("y") or 0) < 100  # top left: the line never goes there


# -- the report's charts ----------------------------------------------------------------------------------------

EPOCH_ROWS = [
    {"epoch": n, "loss": 1.0 / n, "val_loss": 1.2 / n, "accuracy": 1 - 0.5 / n, "val_accuracy": 1 - 0.6 / n}
    | {"examples_per_s": 1000.0 + 100 * n}
    for n in range(1, 6)
]


def timeline(*spans: tuple[str, float, float], markers: tuple[Marker, ...] = ()) -> Timeline:
    phases = [Phase(name, start, end, 1, "test") for name, start, end in spans]
    return Timeline(origin=0.0, phases=phases, markers=list(markers), attempts=1)


def by_id(charts: list[plots.Chart]) -> dict[str, plots.Chart]:
    return {c.id: c for c in charts}


def test_every_chart_parses_and_its_points_are_its_elements() -> None:
    tl = timeline(("boot", 0.0, 10.0), ("training", 10.0, 60.0), ("teardown", 60.0, 65.0), ("training", 70.0, 90.0))
    tl = Timeline(tl.origin, tl.phases, [Marker(65.0, "preempted", "preempted")], attempts=2)
    problems: list[str] = []
    charts = by_id(plots.charts(tl, EPOCH_ROWS, problems))
    assert problems == [] and list(charts) == ["timeline", "loss", "accuracy", "speed"]
    for chart in charts.values():
        assert drawn(chart.svg) == {k: v for k, v in chart.points.items() if v}, chart.id
        root = parse(chart.svg)
        assert (root.get("width"), root.get("height")) == (str(chart.width), str(chart.height))
    assert charts["timeline"].points == {"phases": 4, "markers": 1}
    assert charts["loss"].points == {"loss": 5, "val_loss": 5}
    assert charts["speed"].points == {"examples_per_s": 5}
    speed = [e for e in parse(charts["speed"].svg).iter() if e.get("data-series") == "examples_per_s"]
    assert {e.tag for e in speed} == {f"{NS}rect"}  # bars, a marker per point elsewhere
    loss = [e for e in parse(charts["loss"].svg).iter() if e.get("data-series") == "val_loss"]
    assert {e.tag for e in loss} == {f"{NS}circle"}
    assert plots.planned(tl, EPOCH_ROWS) == [{"id": c.id, "points": c.points} for c in charts.values()]


def test_tick_labels_are_sensible() -> None:
    (loss,) = (c for c in plots.charts(timeline(("boot", 0, 10)), EPOCH_ROWS, []) if c.id == "loss")
    assert tick_texts(loss.svg, "middle") == ["1", "2", "3", "4", "5"]  # epochs: whole numbers
    ys = [float(t) for t in tick_texts(loss.svg, "end")]
    assert ys == sorted(ys) and ys[0] >= 0.15 and ys[-1] <= 1.25 and len(ys) >= 3  # 0.2 to 1.2, and a margin
    steps = {round(b - a, 9) for a, b in itertools.pairwise(ys)}
    assert len(steps) == 1 and steps.pop() in (0.1, 0.2, 0.25)
    (tl,) = plots.charts(timeline(("boot", 0, 10), ("training", 10, 340)), [], [])
    xs = tick_texts(tl.svg, "middle")
    assert xs == ["0", "50", "100", "150", "200", "250", "300"]
    assert tick_texts(tl.svg, "end") == ["boot", "training"]  # the rows are the phases


def test_a_one_epoch_run_draws_one_point_on_axes_with_a_range() -> None:
    rows = [{"epoch": 1, "loss": 0.5, "examples_per_s": 1200.0}]
    problems: list[str] = []
    charts = by_id(plots.charts(timeline(("job", 0.0, 0.0)), rows, problems))
    assert problems == [] and charts["loss"].points == {"loss": 1} and charts["speed"].points == {"examples_per_s": 1}
    assert tick_texts(charts["loss"].svg, "middle") == ["1"]
    assert tick_texts(charts["loss"].svg, "end") == ["0.3", "0.4", "0.5", "0.6", "0.7"]
    assert charts["timeline"].points == {"phases": 1, "markers": 0}


def test_labels_with_markup_and_dollars_are_escaped() -> None:
    key = "a<b & $c$"
    rows: list[dict[str, Any]] = [{"step": n, key: float(n), "other": 2.0 * n} for n in (1, 2, 3)]
    problems: list[str] = []
    (chart,) = plots.charts(timeline(), rows, problems)
    assert problems == [] and chart.id == "metrics" and chart.points == {key: 3, "other": 3}
    assert key in texts(chart.svg) and "a&lt;b &amp; $c$" in chart.svg and "a<b" not in chart.svg
    assert drawn(chart.svg) == chart.points


def test_nan_and_infinity_in_metrics_are_not_points() -> None:
    """metrics.jsonl may hold NaN and Infinity (Python's json writes them): a diverged loss. They are not drawn, and
    the points say so; the finite ones still are."""
    rows = [{"epoch": 1, "loss": 0.9}, {"epoch": 2, "loss": math.nan}, {"epoch": 3, "loss": math.inf}]
    problems: list[str] = []
    (chart,) = plots.charts(timeline(), rows, problems)
    assert problems == [] and chart.points == {"loss": 1} == drawn(chart.svg)
    assert plots.charts(timeline(), [{"epoch": 1, "loss": math.nan}], []) == []  # nothing to draw: no chart


def test_numbers_no_axis_holds_leave_the_chart_out_and_say_why() -> None:
    rows = [{"epoch": 1, "loss": -1e308, "accuracy": 0.5}, {"epoch": 2, "loss": 1e308, "accuracy": 0.6}]
    problems: list[str] = []
    charts = plots.charts(timeline(("boot", 0.0, 5.0)), rows, problems)
    assert [c.id for c in charts] == ["timeline", "accuracy"]  # the page still has the others
    assert len(problems) == 1 and problems[0].startswith("the loss chart could not be drawn: ")
    assert problems[0].endswith("-1e+308 to 1e+308 is a range wider than a float holds")
    assert [c["id"] for c in plots.planned(timeline(("boot", 0.0, 5.0)), rows)] == ["timeline", "accuracy"]
    far = timeline(("boot", -1e308, 0.0), ("training", 0.0, 1e308))
    assert plots.charts(far, [], problems) == [] and problems[-1].startswith("the timeline chart could not be drawn")
    bad = timeline(("boot", 0.0, math.nan))
    assert plots.charts(bad, [], problems) == [] and problems[-1].startswith("the timeline chart could not be drawn")
