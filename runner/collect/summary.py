"""Collect: what a finished run produced, as rows for the terminal and paths a user can open.

summary.json is written by the built-in trainer, by user code in any shape it likes, or derived from a command's
metrics and log (runner.watch.results), so every field is checked before use: a derived one shows the last
epoch's metrics and the test metrics, one of user code's own shows its top-level values, and a field of the wrong
type is left out, never a KeyError at the end of a run that succeeded. Numbers are rounded for people
(runner.collect.figures); `--json` and summary.json keep them whole.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from runner import contract
from runner.collect.facts import CheckpointInfo, checkpoints_text
from runner.collect.figures import metrics_text, rounded
from runner.storage import Storage
from runner.watch.logtext import one_line
from runner.watch.rundir import ExitRecord, Snapshot, Summary
from runner.watch.state import RunState

_MAX_USER_ROWS = 20  # a user's summary may be large; the terminal summary shows its first entries


def _join(run_dir: str, key: str) -> str:
    return f"{run_dir.rstrip('/')}/{key}"


def _derived_rows(s: Summary) -> list[tuple[str, str]]:
    """A summary derived from the job's metrics.jsonl and Keras' lines in its log (runner.watch.results)."""
    rows: list[tuple[str, str]] = []
    test: dict[str, Any] = s.get("test") or {}
    if s.test_accuracy is not None:
        loss = s.get("test_loss")
        text = rounded(s.test_accuracy) + (f"  (loss {rounded(loss)})" if loss is not None else "")
        rows.append(("test accuracy", text))
    elif test:
        rows.append(("test", metrics_text(test)))
    last = s.get("last_metrics")
    if last:
        rows.append(("last epoch" if "epoch" in last else "last step", metrics_text(last)))
    times: list[float] = s.get("epoch_times_s") or []
    if times:
        shown = ", ".join(f"{t:.3g}s" for t in times[:20]) + (", …" if len(times) > 20 else "")
        rows.append(("epoch times", shown))
    sources = [
        f"Keras' lines in {one_line(k, 80)}" if str(k).startswith(contract.LOGS_DIR + "/") else one_line(k, 80)
        for k in s.get("derived_from") or []
    ]
    rows.append(("results from", ", ".join(sources) + "  (the job wrote no summary.json)"))
    return rows


def _trainer_rows(s: Summary) -> list[tuple[str, str]]:
    """The built-in trainer's summary (runner.train.trainer.finish): its typed fields, each only when present."""
    rows: list[tuple[str, str]] = []
    accuracy = s.test_accuracy
    if accuracy is not None:
        details = []
        if (loss := s.get("test_loss")) is not None:
            details.append(f"loss {loss:.4f}")
        if s.get("test_examples") is not None:
            details.append(f"{s.get('test_examples')} test examples")
        rows.append(("test accuracy", f"{accuracy:.4f}" + (f"  ({', '.join(details)})" if details else "")))
    times: list[float] = s.get("epoch_times_s") or []
    if "epoch_times_s" in s.fields:
        rows.append(("epoch times", ", ".join(f"{t:.1f}s" for t in times) or "-"))
    if speed := s.get("examples_per_s"):
        first = "  (mean over epochs after the first, which compiles)" if len(times) > 1 else ""
        rows.append(("examples/s", f"{speed:.0f}{first}"))
    strat = s.get("strategy")
    if strat is not None:
        batch = ""
        if s.get("global_batch_size") is not None:
            batch = f"; global batch {s.get('global_batch_size')}"
            if s.get("per_replica_batch_size") is not None:
                batch += f" ({s.get('per_replica_batch_size')} per replica)"
        rows.append(
            (
                "strategy",
                f"{one_line(strat.get('name'))} on {one_line(strat.get('kind', '?')).upper()}, "
                f"{one_line(strat.get('replicas'))} replica(s){batch}",
            )
        )
        if strat.get("note"):
            rows.append(("strategy note", one_line(strat["note"], 400)))
    if s.get("model") is not None:
        keras = (s.get("versions") or {}).get("keras")
        model, dataset, examples, epochs = (
            one_line(s.get(k) if s.get(k) is not None else "?")
            for k in ("model", "dataset", "train_examples", "epochs")
        )
        text = f"{model} on {dataset} ({examples} train examples), {epochs} epochs"
        rows.append(("model", text + (f", {one_line(keras)}" if keras else "")))
    if (resumed := s.get("resumed_from")) and s.get("resumed") is None:  # a summary from before the resume record
        rows.append(("resumed", f"from {one_line(resumed.get('checkpoint'))}"))
    return rows


def _user_rows(s: Summary) -> list[tuple[str, str]]:
    """A summary written by user code: its top-level values that fit on a line, as they are."""
    values = s.to_json()
    rows = [(one_line(k, 40), rounded(v)) for k, v in values.items() if v is None or isinstance(v, str | int | float)]
    if len(rows) > _MAX_USER_ROWS:
        rows = [*rows[:_MAX_USER_ROWS], ("…", f"{len(rows) - _MAX_USER_ROWS} more in summary.json")]
    return rows


ARTIFACTS = (contract.METRICS, contract.CHECKPOINTS, contract.TENSORBOARD, contract.LOGS_DIR)


def existing_artifacts(storage: Storage) -> set[str]:
    """Which of ARTIFACTS the run directory holds (a listing of each, never of the whole run directory, which a job
    may be rewriting): a custom command may write no metrics, no checkpoints, no TensorBoard logs, and a run that
    never started has no log."""
    return {a for a in ARTIFACTS if any(o.key == a or o.key.startswith(a + "/") for o in storage.list(_under(a)))}


def _under(artifact: str) -> str:
    return artifact if artifact == contract.METRICS else artifact + "/"


def summary_rows(
    run_dir: str,
    state: RunState,
    snapshot: Snapshot,
    present: Collection[str] | None = None,
    *,
    summary: Summary | None = None,
    checkpoints: Sequence[CheckpointInfo] | None = None,
) -> list[tuple[str, str]]:
    """The end-of-run summary: results, timings, strategy, and where every artifact is (of `present`, those that
    exist, when the caller knows: existing_artifacts; else all of them). `summary`: the run's (RunFacts.summary:
    summary.json, or the one derived for a command); `checkpoints`: what checkpoints/ holds (RunFacts.checkpoints)."""
    rows: list[tuple[str, str]] = [("state", str(state))]
    s = summary or snapshot.summary or Summary()
    if s.fields or s.extra:
        rows += _trainer_rows(s) if s.is_trainers else _derived_rows(s) if s.is_derived else _user_rows(s)
    for exit_ in snapshot.exits:
        if exit_.state != RunState.SUCCEEDED:
            rows.append(
                (
                    f"worker {exit_.worker}",
                    f"{exit_.state}, exit code {exit_.exit_code}"
                    + (f": {one_line(exit_.error)}" if exit_.error else ""),
                )
            )
    checkpoint = s.get("checkpoint") if s.is_trainers else None
    held = f"  ({one_line(checkpoints_text(list(checkpoints)), 200)})" if checkpoints else ""
    if not held and checkpoint:
        held = f"  (latest: {one_line(checkpoint.split('/')[-1])})"
    artifacts = {
        contract.METRICS: ("metrics", _join(run_dir, contract.METRICS)),
        contract.CHECKPOINTS: ("checkpoints", _join(run_dir, contract.CHECKPOINTS) + "/" + held),
        contract.TENSORBOARD: ("tensorboard", f"tensorboard --logdir {_join(run_dir, contract.TENSORBOARD)}"),
        contract.LOGS_DIR: (
            "logs",
            _join(run_dir, contract.log_key(0) if len(snapshot.exits) < 2 else f"{contract.LOGS_DIR}/worker-N.log"),
        ),
    }
    rows.append(("run directory", run_dir))
    rows += [row for key, row in artifacts.items() if present is None or key in present]
    return rows


def first_failure(snapshot: Snapshot) -> ExitRecord | None:
    """The worker that did not succeed first (by when it ended): on a slice, the others usually only followed it."""
    failed = [e for e in snapshot.exits if e.state != RunState.SUCCEEDED]
    return min(failed, key=lambda e: e.finished_at) if failed else None


def failure_output(snapshot: Snapshot, lines: int = 15) -> tuple[int | None, list[str]]:
    """(worker, its last output lines) of the first worker that did not succeed and left some: usually the error
    itself."""
    failed = sorted((e for e in snapshot.exits if e.state != RunState.SUCCEEDED), key=lambda e: e.finished_at)
    return next(((e.worker, e.tail[-lines:]) for e in failed if e.tail), (None, []))


def failure_tail(snapshot: Snapshot, lines: int = 15) -> list[str]:
    return failure_output(snapshot, lines)[1]


def ending(run_id: str, state: RunState, snapshot: Snapshot, reason: str | None = None) -> str:
    """One line that says how a run ended, after its log was shown (`runner logs -f`): the state, the first
    failed worker's exit code and error, and where the results are."""
    text = f"run {run_id} {state}"
    failed = first_failure(snapshot)
    if reason:
        text += f": {one_line(reason)}"
    elif failed is not None:
        worker = f"worker {failed.worker} " if len(snapshot.exits) > 1 else ""
        text += f": {worker}exit code {failed.exit_code}" + (f", {one_line(failed.error)}" if failed.error else "")
    return text + f"  (`runner status {run_id}` for the results)"
