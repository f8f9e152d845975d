"""Bench results: the records, bench.json, the Markdown tables and the SVG plot. No TensorFlow here.

Epoch time leaves out the first epoch (it compiles the step function), as the notebook's numbers do. Per-example
step time is the training part of an epoch divided by the examples trained, like Keras' "us/sample"; our trainer's
epoch time also holds the validation pass it runs after every epoch, which the plain fit does not run.
"""

from __future__ import annotations

import json
import os
import stat
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from runner.bench.notebook import NOTEBOOK
from runner.collect import svg
from runner.storage.local import write_atomic

SCHEMA = 1
MAX_RESULT_BYTES = 16 << 20  # a bench.json of three batch sizes is about 10 KiB
TRAINERS = ("ours", "baseline")
TRAINER_NAMES = {"ours": "our trainer", "baseline": "plain model.fit (numpy)"}


@dataclass(frozen=True)
class ArmResult:
    """One trainer at one batch size."""

    trainer: str  # "ours" or "baseline"
    batch_size: int
    examples_per_epoch: int  # examples trained per epoch (ours drops the remainder batch; the plain fit does not)
    epoch_times_s: tuple[float, ...]  # every epoch, the first one included
    train_times_s: tuple[float, ...]  # the training part of each epoch (without validation)
    test_accuracy: float
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def epoch_time_s(self) -> float:
        return statistics.median(self.epoch_times_s[1:])

    @property
    def us_per_example(self) -> float:
        return statistics.median(self.train_times_s[1:]) / self.examples_per_epoch * 1e6

    @property
    def examples_per_s(self) -> float:
        return self.examples_per_epoch / self.epoch_time_s

    def rates(self) -> list[float]:
        """Examples/s of each epoch after the first."""
        return [self.examples_per_epoch / t for t in self.epoch_times_s[1:]]

    def train_rates(self) -> list[float]:
        """Examples/s of the training part of each epoch after the first."""
        return [self.examples_per_epoch / t for t in self.train_times_s[1:]]


@dataclass(frozen=True)
class BenchResult:
    label: str  # what ran, e.g. "cpu: AMD EPYC 7B13 (2 CPUs)"
    device: dict[str, Any]
    versions: dict[str, str]  # e.g. {"engine": "TensorFlow 2.20.0", "keras": "keras 3.15.1"}
    train_examples: int
    test_examples: int
    epochs: int
    schedule: str  # how the two trainers shared the machine
    arms: tuple[ArmResult, ...]
    command: str = ""
    created: float = 0.0
    framework: str = "tensorflow"  # the engine both trainers ran on (results from before the JAX engine: TensorFlow)

    @property
    def batch_sizes(self) -> list[int]:
        return sorted({a.batch_size for a in self.arms})

    def arm(self, trainer: str, batch_size: int) -> ArmResult | None:
        return next((a for a in self.arms if a.trainer == trainer and a.batch_size == batch_size), None)

    def speedup(self, batch_size: int) -> float | None:
        """Median over the interleaved epoch pairs of ours' examples/s over the baseline's, the first pair left out:
        each pair ran back to back, so a slow spell of a shared machine hits both sides of a ratio."""
        pairs = self.rate_pairs(batch_size)
        return statistics.median(o / b for o, b in pairs) if pairs else None

    def rate_pairs(self, batch_size: int, *, training_only: bool = False) -> list[tuple[float, float]]:
        """(ours, baseline) examples/s of each interleaved epoch pair after the first; [] without both arms."""
        ours, base = self.arm("ours", batch_size), self.arm("baseline", batch_size)
        if not ours or not base:
            return []
        if training_only:
            return list(zip(ours.train_rates(), base.train_rates(), strict=False))
        return list(zip(ours.rates(), base.rates(), strict=False))

    def to_json(self) -> str:
        data = asdict(self)
        data["schema"] = SCHEMA
        data["summary"] = [
            {
                "trainer": a.trainer,
                "batch_size": a.batch_size,
                "epoch_time_s": round(a.epoch_time_s, 3),
                "us_per_example": round(a.us_per_example, 1),
                "examples_per_s": round(a.examples_per_s, 1),
                "test_accuracy": a.test_accuracy,
            }
            for a in self.arms
        ]
        data["speedup"] = {str(b): _round(self.speedup(b), 3) for b in self.batch_sizes}
        return json.dumps(data, indent=1)

    @classmethod
    def from_json(cls, text: str) -> BenchResult:
        data = json.loads(text)
        if data.get("schema") != SCHEMA:
            raise ValueError(f"not a bench.json of schema {SCHEMA}")
        arms = tuple(
            ArmResult(
                trainer=a["trainer"],
                batch_size=int(a["batch_size"]),
                examples_per_epoch=int(a["examples_per_epoch"]),
                epoch_times_s=tuple(a["epoch_times_s"]),
                train_times_s=tuple(a["train_times_s"]),
                test_accuracy=float(a["test_accuracy"]),
                settings=dict(a.get("settings") or {}),
            )
            for a in data["arms"]
        )
        fields = {k: data[k] for k in ("label", "device", "versions", "train_examples", "test_examples", "epochs")}
        return cls(
            **fields,
            schedule=data.get("schedule", ""),
            arms=arms,
            command=data.get("command", ""),
            created=data.get("created", 0.0),
            framework=str(data.get("framework") or "tensorflow"),
        )


def _read_regular(path: Path) -> str:
    """The text of a regular file of at most MAX_RESULT_BYTES. Checked with stat() before it is opened, as
    runner.spec.loader.read_spec_bytes does: opening a FIFO blocks until a writer comes, and reading /dev/zero or
    /dev/urandom never ends. Checked again on the open descriptor, in case the path was swapped in between."""
    if not stat.S_ISREG(os.stat(path).st_mode):
        raise ValueError("not a regular file")
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise ValueError("not a regular file")
        raw = f.read(MAX_RESULT_BYTES + 1)
    if len(raw) > MAX_RESULT_BYTES:
        raise ValueError(f"larger than {MAX_RESULT_BYTES >> 20} MiB")
    return raw.decode()


def load(path: Path) -> BenchResult:
    """A bench.json, or a directory holding one."""
    path = path / "bench.json" if path.is_dir() else path
    try:
        return BenchResult.from_json(_read_regular(path))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path}: not a readable bench result ({exc})") from exc


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    if isinstance(value, int):
        return str(value)  # published whole seconds
    return f"{value:.0f}" if value >= 100 else f"{value:.1f}"


def _us(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def _header(result: BenchResult) -> str:
    test = f", {result.test_examples} test" if result.test_examples else ""
    versions = ", ".join(result.versions.values())
    return (
        f"{result.label}; {versions}; {result.train_examples} training examples{test}, "
        f"{result.epochs} epochs per trainer and batch size, the first (compiling) one excluded; {result.schedule}."
    )


def render_markdown(result: BenchResult) -> str:
    """One run: both trainers at every batch size, with the notebook's published numbers beside them."""
    engine = "Keras 3 on JAX" if result.framework == "jax" else "TensorFlow"
    lines = [
        f"## MNIST CNN of the 'GPU vs TPU' notebook on {engine}: our trainer vs a plain model.fit",
        "",
        _header(result),
        "",
        "| batch | trainer | epoch (s) | per-example step (us) | examples/s | test accuracy | speed-up |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    for batch in result.batch_sizes:
        speedup = result.speedup(batch)
        for trainer in TRAINERS:
            arm = result.arm(trainer, batch)
            if arm is None:
                continue
            ratio = f"{speedup:.2f}x" if trainer == "ours" and speedup else ""
            lines.append(
                f"| {batch} | {TRAINER_NAMES[trainer]} | {_seconds(arm.epoch_time_s)} | {_us(arm.us_per_example)} | "
                f"{arm.examples_per_s:.0f} | {arm.test_accuracy:.4f} | {ratio} |"
            )
        for pub in NOTEBOOK:
            if batch in pub.epoch_s:
                lines.append(
                    f"| {batch} | {pub.label} | {_seconds(pub.epoch_s[batch])} | {_us(pub.us_per_example[batch])} "
                    "| | | |"
                )
    lines += [
        "",
        "Epoch time: median of the epochs after the first; ours includes its validation pass over the test set. "
        "Per-example step time: training time / examples trained. Speed-up: median over the interleaved epoch pairs "
        "of our examples/s over the plain fit's.",
        "",
        *render_settings(result),
    ]
    return "\n".join(lines) + "\n"


def _yes_no(value: Any) -> str:
    return "-" if value is None else "on" if value else "off"


def settings_cells(settings: dict[str, Any]) -> list[str]:
    """precision, XLA, steps/execution, dropout kernel, oneDNN, threads, C allocator and input of one arm, as it ran
    (perf.effective_settings, read back from the model and TensorFlow in the arm's process); "-" where a result
    predates them."""
    eff = settings.get("effective") or {}
    threads = eff.get("threads") or {}
    onednn = _yes_no(eff.get("onednn"))
    return [
        str(eff.get("precision", "-")),
        _yes_no(eff.get("jit_compile")),
        str(eff.get("steps_per_execution", "-")),
        str(eff.get("dropout") or "-"),
        f"{onednn} ({eff['onednn_source']})" if eff.get("onednn_source") else onednn,
        f"{threads['intra_op']} / {threads['inter_op']} ({threads.get('source', '')})" if threads else "-",
        str(eff.get("allocator") or "-"),
        str(settings.get("input", "-")),
    ]


def render_settings(result: BenchResult) -> list[str]:
    defaults = "Keras' defaults on JAX" if result.framework == "jax" else "Keras' and TensorFlow's defaults"
    lines = [
        f"What each trainer ran with, read back in its own process (the plain fit's are {defaults} as they resolve "
        "on this machine):",
        "",
        "| batch | trainer | precision | XLA | steps/execution | dropout | oneDNN | threads intra / inter "
        "| C allocator | input |",
        "|---:|---|---|---|---:|---|---|---|---|---|",
    ]
    for arm in sorted(result.arms, key=lambda a: (a.batch_size, TRAINERS.index(a.trainer))):
        cells = " | ".join(settings_cells(arm.settings))
        lines.append(f"| {arm.batch_size} | {TRAINER_NAMES[arm.trainer]} | {cells} |")
    return lines


def _series(results: Sequence[BenchResult]) -> list[tuple[str, dict[int, tuple[float, float]]]]:
    """(label, batch -> (epoch s, us/example)) for the notebook and for each trainer of each result."""
    out: list[tuple[str, dict[int, tuple[float, float]]]] = [  # ints stay ints: published
        (pub.label, {b: (pub.epoch_s[b], pub.us_per_example[b]) for b in pub.epoch_s}) for pub in NOTEBOOK
    ]
    for result in results:
        for trainer in TRAINERS:
            points = {a.batch_size: (a.epoch_time_s, a.us_per_example) for a in result.arms if a.trainer == trainer}
            if points:
                out.append((f"{result.label}, {TRAINER_NAMES[trainer]}", points))
    return out


def render_comparison(results: Sequence[BenchResult]) -> str:
    """Several runs (CPU here, a GPU or TPU elsewhere) side by side with the notebook: epoch s / us per example."""
    series = _series(results)
    batches = sorted({b for _, points in series for b in points})
    lines = [
        "## MNIST CNN, epoch time (s) / per-example step time (us), first epoch excluded",
        "",
        "| series | " + " | ".join(f"batch {b}" for b in batches) + " |",
        "|---|" + "---:|" * len(batches),
    ]
    for label, points in series:
        cells = [f"{_seconds(points[b][0])} s / {_us(points[b][1])} us" if b in points else "-" for b in batches]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines.append("")
    for i, result in enumerate(results, 1):
        ratios = ", ".join(f"batch {b}: {s:.2f}x" for b in result.batch_sizes if (s := result.speedup(b)) is not None)
        lines.append(f"{i}. {_header(result)} Speed-up of our trainer: {ratios or '-'}.")
    return "\n".join(lines) + "\n"


def plot(results: Sequence[BenchResult], path: Path) -> Path:
    """Epoch time and per-example step time against batch size, both axes logarithmic, as an SVG file; the
    notebook's published numbers dashed. svg.ChartError where a time is no positive finite number."""
    series = _series(results)
    batches = sorted({b for _, points in series for b in points})
    entries = [
        svg.Entry(label, svg.PALETTE[n % len(svg.PALETTE)], "dashed" if _published(label) else "line")
        for n, (label, _) in enumerate(series)
    ]
    legend_w, legend_h = svg.legend_size(entries, columns=2, size=10)
    canvas = svg.Canvas(max(1100, legend_w + 24), 420 + legend_h)
    gap, margin = 110, 80  # room for the right panel's tick labels and axis label; then the left one's
    panel_w = (canvas.width - margin - gap - 20) / 2
    for n, (title, unit) in enumerate((("epoch time", "s"), ("per-example step time", "us"))):
        x_axis = svg.logarithmic([float(b) for b in batches], marks=[float(b) for b in batches])
        y_axis = svg.logarithmic([points[b][n] for _, points in series for b in points])
        left = margin + n * (panel_w + gap)
        frame = svg.Frame(canvas, left, 40, panel_w, 300, x_axis, y_axis)
        canvas.text(left + frame.width / 2, 26, f"MNIST CNN: {title}", size=16, anchor="middle")
        frame.axes("batch size", f"{title} ({unit})")
        for (label, points), entry in zip(series, entries, strict=True):
            xs = sorted(points)
            frame.line(
                label, [float(b) for b in xs], [points[b][n] for b in xs], entry.colour, dashed=_published(label)
            )
    svg.legend(canvas, (canvas.width - legend_w) / 2, 400, entries, columns=2, size=10, frame=False)
    # the run directory is mirrored while the job runs: never half a file
    write_atomic(path, canvas.render("MNIST CNN: epoch time and per-example step time by batch size").encode())
    return path


def _published(label: str) -> bool:
    return any(label == pub.label for pub in NOTEBOOK)


def write(result: BenchResult, directory: Path) -> dict[str, Path]:
    """bench.json, bench.md and bench.svg of one run."""
    write_atomic(directory / "bench.json", result.to_json().encode())
    write_atomic(directory / "bench.md", render_markdown(result).encode())
    return {
        "json": directory / "bench.json",
        "markdown": directory / "bench.md",
        "plot": plot([result], directory / "bench.svg"),
    }


def write_comparison(results: Sequence[BenchResult], directory: Path) -> dict[str, Path]:
    write_atomic(directory / "compare.md", render_comparison(results).encode())
    return {"markdown": directory / "compare.md", "plot": plot(results, directory / "compare.svg")}


__all__ = [
    "ArmResult",
    "BenchResult",
    "load",
    "plot",
    "render_comparison",
    "render_markdown",
    "write",
    "write_comparison",
]
