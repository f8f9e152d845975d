"""Charts as SVG text, for the report's page and the bench's plot: axes with round-number ticks, gridlines, lines
with markers, bars, a legend. Standard library only: a plotting library costs every process that imports it (Keras
imports matplotlib at start-up wherever it is installed), and these charts need a few rectangles, lines and words.

A chart is drawn on a `Canvas`; an element drawn for a named series is counted there (`Canvas.drawn`) and carries
`data-series`, so that the counts a chart reports are those of the elements in its SVG. Text is XML-escaped where it
is written. Numbers no axis can hold (NaN, infinity, a range wider than a float) raise ChartError, never a picture
that lies; a range of one value is widened around it.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

FONT = "system-ui, -apple-system, 'Segoe UI', Helvetica, Arial, sans-serif"
INK = "#212121"
MUTED = "#616161"
GRID = "#e0e0e0"
SIZE = 12  # px: tick labels and legends; titles and axis labels a little larger
# one colour per series, in order: matplotlib's tab10, the colours readers of such charts know
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22")
_MAX_TICKS = 50

# Characters XML 1.0 does not allow in a document at all, escaped or not: a metric name may hold one.
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


class ChartError(ValueError):
    """Numbers no axis can hold; the message says which."""


def escape(text: object) -> str:
    """Text for an SVG element or attribute: markup characters as entities, characters XML forbids as U+FFFD."""
    plain = _NOT_XML.sub("\ufffd", str(text))
    return (
        plain.replace("&", "&amp;")
        .replace("<", "&lt;")
        .replace(">", "&gt;")
        .replace('"', "&quot;")
        .replace("'", "&#39;")
    )


def text_width(text: str, size: float) -> float:
    """About how wide `text` is set in the sans-serif font at `size` px: generous, as layout needs no more."""
    return len(text) * size * 0.6


def _finite(*values: float) -> None:
    for value in values:
        if not math.isfinite(value):
            raise ChartError(f"{value} is not a finite number")


def _num(value: float) -> str:
    """A coordinate in an attribute: two decimals at most, no trailing zeros."""
    text = f"{value:.2f}".rstrip("0").rstrip(".")
    return "0" if text == "-0" else text


# -- ticks ------------------------------------------------------------------------------------------------------


def nice_step(span: float, count: int = 5, *, integer: bool = False) -> float:
    """The smallest round step (1, 2, 2.5 or 5 times a power of ten) that cuts `span` into `count` parts or fewer
    (at least half as many); a whole number of at least 1 where `integer` (no 2.5)."""
    _finite(span)
    raw = span / max(count, 1)
    if raw <= 0:
        raise ChartError(f"an axis needs a positive range, not {span}")
    power = 10.0 ** math.floor(math.log10(raw))
    if power == 0.0 or not math.isfinite(power):
        raise ChartError(f"a range of {span} has no round step a float can hold")
    for mantissa in (1.0, 2.0, 5.0, 10.0) if integer else (1.0, 2.0, 2.5, 5.0, 10.0):
        step = mantissa * power
        if raw <= step * (1 + 1e-9):
            return max(1.0, round(step)) if integer else step
    raise AssertionError("unreachable: 10 x power is at least raw")


def _decimals(step: float) -> int:
    """The decimals a multiple of `step` needs: 0.25 -> 2, 0.5 -> 1, 20 -> 0."""
    for digits in range(0, 17):
        if abs(round(step, digits) - step) <= abs(step) * 1e-6:
            return digits
    return 17


def ticks(low: float, high: float, count: int = 5, *, integer: bool = False) -> list[float]:
    """The multiples of a round step (`nice_step`) from `low` to `high`, ends included where they are multiples:
    count + 1 of them at most, 2 at least where count >= 4. One value where low == high."""
    _finite(low, high)
    if high < low:
        raise ChartError(f"an axis from {low} down to {high}")
    if high == low:
        return [low]
    return _multiples(low, high, nice_step(high - low, count, integer=integer))


def _multiples(low: float, high: float, step: float) -> list[float]:
    first, last = math.ceil(low / step - 1e-9), math.floor(high / step + 1e-9)
    if last - first > _MAX_TICKS:
        raise ChartError(f"{low} to {high} is too fine a range for a float axis")
    digits = _decimals(step)
    return [round(k * step, digits) + 0.0 for k in range(first, last + 1)]  # + 0.0: no "-0"


def tick_labels(values: Sequence[float]) -> list[str]:
    """Labels for ticks a round step apart: as many decimals as the step needs ("0.25", "0.5", "1"), or a short
    exponent form far from 1 ("2e+07"), the same for every tick of an axis."""
    if not values:
        return []
    step = min((b - a for a, b in itertools.pairwise(values)), default=0.0)
    digits = _decimals(step) if step > 0 else _decimals(values[0])
    biggest = max(abs(v) for v in values)
    if digits > 6 or (biggest >= 1e7 and digits == 0):
        scale = math.floor(math.log10(step)) if step > 0 else 0
        significant = max(1, math.floor(math.log10(biggest)) - scale + 1) if biggest else 1
        labels = [f"{v:.{significant}g}" for v in values]
    else:
        labels = [f"{v:.{digits}f}" for v in values]
    return [label[1:] if label.startswith("-") and float(label) == 0 else label for label in labels]  # no "-0"


@dataclass(frozen=True)
class Axis:
    """Where a value lies along one axis (`fraction`, 0 at `low`, 1 at `high`), and the ticks to write on it."""

    low: float
    high: float
    ticks: tuple[float, ...]
    labels: tuple[str, ...]
    log: bool = False

    def fraction(self, value: float) -> float:
        _finite(value)
        if self.log:
            if value <= 0:
                raise ChartError(f"{value} has no place on a logarithmic axis")
            return (math.log(value) - math.log(self.low)) / (math.log(self.high) - math.log(self.low))
        return (value - self.low) / (self.high - self.low)


def extent(values: Sequence[float], *, zero: bool = False) -> tuple[float, float]:
    """The smallest and largest of `values` (and 0, where `zero`), widened around a single value so that the axis
    has a range: by half of it (round ticks, the value in the middle), or by 1 around 0."""
    if not values:
        raise ChartError("no values to draw")
    _finite(*values)
    low, high = min(values), max(values)
    if not math.isfinite(high - low):
        raise ChartError(f"{low:g} to {high:g} is a range wider than a float holds")
    if zero:
        low, high = min(low, 0.0), max(high, 0.0)
    if high - low <= 1e-9 * max(abs(low), abs(high)):
        widen = abs(high) * 0.5 or 1.0
        low, high = low - widen, high + widen
    _finite(low, high, high - low)
    return low, high


def linear(
    values: Sequence[float], *, count: int = 5, integer: bool = False, zero: bool = False, margin: float = 0.0
) -> Axis:
    """A linear axis over `values` (and 0, where `zero`), `margin` of its range beyond each end (not below a 0 that
    `zero` put there: bars stand on the axis), ticks at the round multiples inside it."""
    low, high = extent(values, zero=zero)
    room = (high - low) * margin
    low, high = (low if zero and low == 0 else low - room), (high if zero and high == 0 else high + room)
    _finite(low, high, high - low)
    marks = _multiples(low, high, nice_step(high - low, count, integer=integer))
    return Axis(low, high, tuple(marks), tuple(tick_labels(marks)))


def logarithmic(values: Sequence[float], *, marks: Sequence[float] | None = None) -> Axis:
    """A log axis over positive `values`, a quarter beyond each end; ticks at `marks` (say, the batch sizes), else
    at 1, 2 and 5 times the powers of ten inside it (or round linear steps, where fewer than two are)."""
    low, high = extent(values)
    if low <= 0:
        raise ChartError(f"{low} has no place on a logarithmic axis")
    low, high = low / 1.25, high * 1.25
    if marks is not None:
        chosen = sorted(m for m in marks if low <= m <= high)
        return Axis(low, high, tuple(chosen), tuple(f"{m:g}" for m in chosen), log=True)
    chosen = [
        m * 10.0**power
        for power in range(math.floor(math.log10(low)), math.ceil(math.log10(high)) + 1)
        for m in (1, 2, 5)
        if low <= m * 10.0**power <= high
    ]
    if len(chosen) < 2:
        chosen = [t for t in ticks(low, high, 4) if t > 0]
    labels = [f"{m:g}" for m in chosen]
    return Axis(low, high, tuple(chosen), tuple(labels), log=True)


# -- drawing ----------------------------------------------------------------------------------------------------


class Canvas:
    """One SVG picture in the making. An element drawn with `series=` counts in `drawn[series]`."""

    def __init__(self, width: float, height: float) -> None:
        self.width, self.height = round(width), round(height)
        self.drawn: dict[str, int] = {}
        self._parts: list[str] = []

    def element(
        self,
        tag: str,
        attrs: dict[str, object],
        *,
        text: str | None = None,
        series: str | None = None,
        tip: str | None = None,
    ) -> None:
        if series is not None:
            attrs = {**attrs, "data-series": series}
            self.drawn[series] = self.drawn.get(series, 0) + 1
        cells = "".join(
            f' {name}="{_num(value) if isinstance(value, float) else escape(value)}"'
            for name, value in attrs.items()
            if value is not None
        )
        inner = (f"<title>{escape(tip)}</title>" if tip else "") + (escape(text) if text is not None else "")
        self._parts.append(f"<{tag}{cells}>{inner}</{tag}>" if inner else f"<{tag}{cells}/>")

    def rect(
        self,
        x: float,
        y: float,
        w: float,
        h: float,
        fill: str,
        *,
        series: str | None = None,
        tip: str | None = None,
        extra: dict[str, object] | None = None,
    ) -> None:
        attrs: dict[str, object] = {"x": float(x), "y": float(y), "width": float(w), "height": float(h), "fill": fill}
        self.element("rect", {**attrs, **(extra or {})}, series=series, tip=tip)

    def line(
        self,
        x1: float,
        y1: float,
        x2: float,
        y2: float,
        stroke: str,
        width: float = 1.0,
        *,
        series: str | None = None,
        dash: str | None = None,
    ) -> None:
        attrs = {"x1": float(x1), "y1": float(y1), "x2": float(x2), "y2": float(y2), "stroke": stroke}
        self.element("line", {**attrs, "stroke-width": float(width), "stroke-dasharray": dash}, series=series)

    def polyline(self, points: Sequence[tuple[float, float]], stroke: str, width: float, dash: str | None) -> None:
        path = " ".join(f"{_num(x)},{_num(y)}" for x, y in points)
        attrs = {"points": path, "fill": "none", "stroke": stroke, "stroke-width": float(width)}
        self.element("polyline", {**attrs, "stroke-dasharray": dash, "stroke-linejoin": "round"})

    def circle(
        self, x: float, y: float, r: float, fill: str, *, series: str | None = None, tip: str | None = None
    ) -> None:
        self.element("circle", {"cx": float(x), "cy": float(y), "r": float(r), "fill": fill}, series=series, tip=tip)

    def text(
        self,
        x: float,
        y: float,
        words: str,
        *,
        size: float = SIZE,
        anchor: str = "start",
        colour: str = INK,
        rotate: float | None = None,
    ) -> None:
        attrs: dict[str, object] = {"x": float(x), "y": float(y), "font-size": float(size), "fill": colour}
        if anchor != "start":
            attrs["text-anchor"] = anchor
        if rotate is not None:
            attrs["transform"] = f"rotate({_num(rotate)} {_num(x)} {_num(y)})"
        self.element("text", attrs, text=words)

    def render(self, title: str) -> str:
        """The standalone SVG document (also valid inline in an HTML page), titled for screen readers."""
        w, h = self.width, self.height
        head = (
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" role="img" '
            f'aria-label="{escape(title)}" font-family="{escape(FONT)}">'
        )
        body = "\n".join([f"<title>{escape(title)}</title>", f'<rect width="{w}" height="{h}" fill="white"/>'])
        return head + "\n" + body + "\n" + "\n".join(self._parts) + "\n</svg>\n"


@dataclass(frozen=True)
class Entry:
    """One legend line: a swatch in `colour` drawn as `kind` ("line", "dashed" or "box"), then `label`."""

    label: str
    colour: str
    kind: str = "line"


def legend_size(entries: Sequence[Entry], *, columns: int = 1, size: float = SIZE) -> tuple[float, float]:
    rows = math.ceil(len(entries) / columns)
    widest = max((text_width(e.label, size) for e in entries), default=0.0)
    return columns * (widest + 2.6 * size + 12) + 8, rows * size * 1.6 + 8


def legend(
    canvas: Canvas,
    x: float,
    y: float,
    entries: Sequence[Entry],
    *,
    columns: int = 1,
    size: float = SIZE,
    frame: bool = True,
) -> None:
    """The legend with its top-left corner at (x, y), entries filled row by row."""
    width, height = legend_size(entries, columns=columns, size=size)
    if frame:
        canvas.rect(x, y, width, height, "white", extra={"stroke": "#bdbdbd", "fill-opacity": "0.85", "rx": "3"})
    column_w = (width - 8) / columns
    for n, entry in enumerate(entries):
        left = x + 6 + (n % columns) * column_w
        middle = y + 4 + (n // columns + 0.5) * size * 1.6
        swatch = 2 * size
        if entry.kind == "box":
            canvas.rect(left, middle - size / 2, swatch, size, entry.colour)
        else:
            dash = "5 3" if entry.kind == "dashed" else None
            canvas.line(left, middle, left + swatch, middle, entry.colour, 2.0, dash=dash)
            canvas.circle(left + swatch / 2, middle, 3.0, entry.colour)
        canvas.text(left + swatch + 0.6 * size, middle + size * 0.35, entry.label, size=size)


@dataclass
class Frame:
    """The plotting area of a chart: `x` and `y` axes over the box (left, top, width, height) of a canvas."""

    canvas: Canvas
    left: float
    top: float
    width: float
    height: float
    x: Axis
    y: Axis
    plotted: list[tuple[float, float]] = field(default_factory=list)  # every point drawn, in pixels

    def px(self, value: float) -> float:
        return self.left + self.x.fraction(value) * self.width

    def py(self, value: float) -> float:
        return self.top + (1 - self.y.fraction(value)) * self.height

    def axes(self, xlabel: str, ylabel: str | None, *, grid: str = "xy", size: float = SIZE) -> None:
        """Gridlines (`grid`: the axes that have them), the frame, ticks and their labels, the axis labels."""
        c, bottom, right = self.canvas, self.top + self.height, self.left + self.width
        for value, label in zip(self.x.ticks, self.x.labels, strict=True):
            at = self.px(value)
            if "x" in grid:
                c.line(at, self.top, at, bottom, GRID)
            c.line(at, bottom, at, bottom + 4, MUTED)
            c.text(at, bottom + 6 + size, label, size=size, anchor="middle", colour=MUTED)
        for value, label in zip(self.y.ticks, self.y.labels, strict=True):
            at = self.py(value)
            if "y" in grid:
                c.line(self.left, at, right, at, GRID)
            c.line(self.left - 4, at, self.left, at, MUTED)
            c.text(self.left - 7, at + size * 0.35, label, size=size, anchor="end", colour=MUTED)
        c.rect(self.left, self.top, self.width, self.height, "none", extra={"stroke": MUTED})
        c.text(self.left + self.width / 2, bottom + 2 * size + 14, xlabel, size=size + 1, anchor="middle")
        if ylabel:
            widest = max((text_width(t, size) for t in self.y.labels), default=0.0)
            at_x, at_y = self.left - widest - 14, self.top + self.height / 2
            c.text(at_x, at_y, ylabel, size=size + 1, anchor="middle", rotate=-90)

    def line(self, series: str, xs: Sequence[float], ys: Sequence[float], colour: str, *, dashed: bool = False) -> None:
        """A line through the points, and a marker on each: the markers are what `drawn[series]` counts."""
        points = [(self.px(x), self.py(y)) for x, y in zip(xs, ys, strict=True)]
        if len(points) > 1:
            self.canvas.polyline(points, colour, 2.2, "6 4" if dashed else None)
        for (x, y), (px, py) in zip(zip(xs, ys, strict=True), points, strict=True):
            self.canvas.circle(px, py, 4.0, colour, series=series, tip=f"{series} {x:g}: {y:.6g}")
        self.plotted.extend(points)

    def bars(self, series: str, xs: Sequence[float], ys: Sequence[float], colour: str, width: float = 0.6) -> None:
        """One bar from 0 (or the axis' foot) up to each y, `width` in x units wide; each bar counts."""
        base = self.py(min(max(0.0, self.y.low), self.y.high))
        for x, y in zip(xs, ys, strict=True):
            left, right, top = self.px(x - width / 2), self.px(x + width / 2), self.py(y)
            tip = f"{series} {x:g}: {y:.6g}"
            self.canvas.rect(left, min(top, base), right - left, abs(base - top), colour, series=series, tip=tip)
            self.plotted.append(((left + right) / 2, top))

    def legend(self, entries: Sequence[Entry], *, size: float = SIZE) -> None:
        """The legend in the corner of the frame that hides the fewest points drawn (matplotlib's "best")."""
        width, height = legend_size(entries, size=size)
        inset = 8
        corners = [
            (self.left + self.width - width - inset, self.top + inset),
            (self.left + inset, self.top + inset),
            (self.left + self.width - width - inset, self.top + self.height - height - inset),
            (self.left + inset, self.top + self.height - height - inset),
        ]

        def hidden(corner: tuple[float, float]) -> int:
            x, y = corner
            return sum(1 for px, py in self.plotted if x - 4 <= px <= x + width + 4 and y - 4 <= py <= y + height + 4)

        x, y = min(corners, key=hidden)
        legend(self.canvas, x, y, entries, size=size)
