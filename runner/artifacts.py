"""Collect: what a finished run produced, as rows for the terminal and paths a user can open."""

from __future__ import annotations

from typing import Any

from runner import contract
from runner.status import RunState, Snapshot


def _join(run_dir: str, key: str) -> str:
    return f"{run_dir.rstrip('/')}/{key}"


def summary_rows(run_dir: str, state: RunState, snapshot: Snapshot) -> list[tuple[str, str]]:
    """The end-of-run summary: results, timings, strategy, and where every artifact is."""
    rows: list[tuple[str, str]] = [("state", str(state))]
    s: dict[str, Any] = snapshot.summary or {}
    if s:
        rows.append(
            (
                "test accuracy",
                f"{s['test_accuracy']:.4f}  (loss {s['test_loss']:.4f}, {s['test_examples']} test examples)",
            )
        )
        times = s.get("epoch_times_s") or []
        rows.append(("epoch times", ", ".join(f"{t:.1f}s" for t in times) or "-"))
        if s.get("examples_per_s"):
            rows.append(
                (
                    "examples/s",
                    f"{s['examples_per_s']:.0f}  (mean over epochs after the first, which compiles)"
                    if len(times) > 1
                    else f"{s['examples_per_s']:.0f}",
                )
            )
        strat = s.get("strategy") or {}
        rows.append(
            (
                "strategy",
                f"{strat.get('name')} on {str(strat.get('kind', '?')).upper()}, "
                f"{strat.get('replicas')} replica(s); global batch {s['global_batch_size']} "
                f"({s['per_replica_batch_size']} per replica)",
            )
        )
        if strat.get("note"):
            rows.append(("strategy note", strat["note"]))
        rows.append(
            (
                "model",
                f"{s['model']} on {s['dataset']} ({s['train_examples']} train examples), "
                f"{s['epochs']} epochs, {s['versions']['keras']}",
            )
        )
        if s.get("resumed_from_epoch"):
            rows.append(("resumed", f"from the checkpoint after epoch {s['resumed_from_epoch']}"))
    for exit_ in snapshot.exits:
        if exit_.state != RunState.SUCCEEDED:
            rows.append(
                (
                    f"worker {exit_.worker}",
                    f"{exit_.state}, exit code {exit_.exit_code}" + (f": {exit_.error}" if exit_.error else ""),
                )
            )
    rows += [
        ("run directory", run_dir),
        ("metrics", _join(run_dir, contract.METRICS)),
        (
            "checkpoints",
            _join(run_dir, contract.CHECKPOINTS)
            + (f"/  (latest: {s['checkpoint'].split('/')[-1]})" if s.get("checkpoint") else "/"),
        ),
        ("tensorboard", f"tensorboard --logdir {_join(run_dir, contract.TENSORBOARD)}"),
        ("logs", _join(run_dir, contract.log_key(0))),
    ]
    return rows


def failure_tail(snapshot: Snapshot, lines: int = 15) -> list[str]:
    """The last output lines of the first worker that did not succeed: usually the error itself."""
    for exit_ in snapshot.exits:
        if exit_.state != RunState.SUCCEEDED and exit_.tail:
            return exit_.tail[-lines:]
    return []
