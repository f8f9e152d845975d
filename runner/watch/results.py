"""A run's results when its job wrote no summary.json: derived from what it did write.

A `command` job owes the runner nothing. What it leaves anyway says how training went: metrics.jsonl when it used
runner.metrics (one row per epoch, any numbers), else Keras' own epoch lines in its log (runner.watch.keraslog),
and the test metrics of an evaluate() after training. `derive_summary` turns them into a summary.json that says
where it came from ("derived_from"), so a reader never takes it for the built-in trainer's:

    {"derived_from": ["logs/worker-0.log"], "epochs": 3,
     "last_metrics": {"epoch": 3, "accuracy": 0.8752, "loss": 0.5173, "val_accuracy": 0.878, "val_loss": 0.4476},
     "test": {"accuracy": 0.824, "loss": 0.613}, "test_accuracy": 0.824, "test_loss": 0.613,
     "epoch_times_s": [3.0, 1.0, 1.0]}

The supervisor writes it when the job ends without a summary of its own (worker 0; write_derived_summary), and
the collect package derives the same for a finished run that has none (one written before this existed). Pure and
light: the standard library and keraslog, nothing else.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from runner import contract
from runner.watch.keraslog import parse_keras_log

DERIVED_FROM = "derived_from"
LOG_TAIL_BYTES = 8 << 20  # of a longer log, its last 8 MiB are read for Keras' lines (a second's parsing at most)
_NOT_METRICS = {"epoch", "step", "time", "global_step"}


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _test_accuracy(test: dict[str, float]) -> float | None:
    """The accuracy among the test metrics: `accuracy` or `acc`, else the one metric whose name ends so."""
    for key in ("accuracy", "acc"):
        if key in test:
            return test[key]
    named = [v for k, v in test.items() if k.endswith("accuracy")]
    return named[0] if len(named) == 1 else None


def derive_summary(
    metrics: list[dict[str, Any]], log: str | None, *, log_key: str = contract.log_key(0)
) -> dict[str, Any] | None:
    """The summary of a run from its metrics.jsonl rows and its (cleaned) log text; None when neither says
    anything of epochs, steps or test metrics. metrics.jsonl's rows (per epoch, else per step) win over the log's
    epochs; the test metrics are the log's evaluate() line, and any `test_*` number the job logged to
    metrics.jsonl."""
    rows = [r for r in metrics if isinstance(r, dict) and _finite(r.get("epoch")) is not None]
    rows = rows or [r for r in metrics if isinstance(r, dict) and _finite(r.get("step")) is not None]
    sources: list[str] = [contract.METRICS] if rows else []
    parsed = parse_keras_log(log) if log else None
    if not rows and parsed is not None and parsed.epochs:
        rows, sources = parsed.epochs, [log_key]
    test: dict[str, float] = dict(parsed.test) if parsed is not None else {}
    if test and log_key not in sources:
        sources.append(log_key)
    for row in metrics:
        for key, value in row.items() if isinstance(row, dict) else ():
            if key.startswith("test_") and (number := _finite(value)) is not None:
                test[key.removeprefix("test_")] = number
                if contract.METRICS not in sources:
                    sources.append(contract.METRICS)
    if not rows and not test:
        return None
    summary: dict[str, Any] = {DERIVED_FROM: sources}
    if rows:
        last = rows[-1]
        where = "epoch" if "epoch" in last else "step"
        summary["epochs" if where == "epoch" else "steps"] = int(last[where])
        summary["last_metrics"] = {
            k: v
            for k, v in last.items()
            if k == where or (k not in _NOT_METRICS and not k.startswith("test_") and _finite(v) is not None)
        }
        times = [_finite(r.get("epoch_time_s")) for r in rows]
        if all(t is not None for t in times):
            summary["epoch_times_s"] = times
    if test:
        summary["test"] = test
        if (accuracy := _test_accuracy(test)) is not None:
            summary["test_accuracy"] = accuracy
        if "loss" in test:
            summary["test_loss"] = test["loss"]
    return summary


def write_derived_summary(output_dir: Path, resumed: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """At the job's end (worker 0's supervisor): summary.json derived from the output directory's metrics.jsonl
    and logs/worker-0.log, unless the job wrote a summary of its own. One derived by an earlier attempt is derived
    again (the log and the metrics have grown since). `resumed`: where this attempt went on from
    (runner.checkpoints.resumed), kept in it. Returns what it wrote."""
    from runner.watch.rundir import parse_jsonl

    target = output_dir / contract.SUMMARY
    try:
        existing = json.loads(target.read_bytes())
        if not (isinstance(existing, dict) and DERIVED_FROM in existing):
            return None  # the job's own (or the trainer's)
    except FileNotFoundError:
        pass
    except ValueError:
        return None  # the job's, torn or not JSON: not ours to replace
    metrics_file, log_file = output_dir / contract.METRICS, output_dir / contract.log_key(0)
    metrics = []
    if metrics_file.is_file():
        metrics = parse_jsonl(metrics_file.read_bytes(), contract.METRICS, None, lambda r: r)
    log = None
    if log_file.is_file():
        with log_file.open("rb") as stream:
            stream.seek(max(0, log_file.stat().st_size - LOG_TAIL_BYTES))
            log = stream.read().decode(errors="replace")
    summary = derive_summary(metrics, log)
    if summary is not None and resumed is not None:
        summary["resumed"] = resumed
    if summary is not None:
        temporary = target.with_name(f".{target.name}.derived")
        temporary.write_text(json.dumps(summary, indent=1))
        temporary.replace(target)
    return summary
