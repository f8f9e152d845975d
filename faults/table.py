"""The printer: one table row per case (repeated runs folded together), then notes and problems under it."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from faults.result import RunResult

IDLE_GOAL_S = 10.0

COLUMNS = (
    "fault",
    "runs",
    "terminal state (expected)",
    "as expected",
    "nodes leaked",
    "ckpts lost",
    "epochs re-done",
    "steps lost",
    "idle billable s",
    "recovered from",
)
_NUMERIC = {"runs", "nodes leaked", "ckpts lost"}


def fmt_s(value: float | None) -> str:
    return "never" if value is None else f"{value:.1f}"


def _fold(values: Sequence[str]) -> str:
    """One value when every run agrees, else each run's, in order."""
    return values[0] if len(set(values)) == 1 else " | ".join(values)


def _idle(runs: Sequence[RunResult]) -> str:
    idles = [r.idle_max for r in runs if r.idle_s or r.idle_preempted_s]
    if not idles:
        return "-"
    known = [v for v in idles if v is not None]
    idle = fmt_s(max(known)) if known else "never"
    if len(runs) > 1 and known:
        idle = f"max {idle}, " + " ".join(fmt_s(v) for v in idles)
    never = sum(r.idle_undeleted for r in runs)
    return idle + (f" ({never} never deleted)" if never else "")


def summarize(results: Sequence[RunResult]) -> list[dict[str, str]]:
    """One table row per case: every run of it folded together."""
    rows = []
    by_case: dict[str, list[RunResult]] = {}
    for r in results:
        by_case.setdefault(r.case, []).append(r)
    for runs in by_case.values():
        first = runs[0]
        states = Counter(r.got for r in runs)
        got = ", ".join(s if n == 1 else f"{s} x{n}" for s, n in states.items())
        ok = sum(r.as_expected for r in runs)
        trains = [r for r in runs if r.checkpoints_lost is not None]
        redone = "-"
        if trains:
            total = sum(r.epochs_redone or 0 for r in trains)
            partial = sum(r.partial_epochs or 0 for r in trains)
            redone = f"{total}" + (f" (+{partial} partial)" if partial else "")
        steps = [", ".join(map(str, r.steps_lost)) for r in trains if r.steps_lost]
        leaked = str(sum(r.nodes_leaked for r in runs))
        others = sum(r.others_nodes for r in runs)
        rows.append(
            {
                "fault": first.fault,
                "runs": str(len(runs)),
                "terminal state (expected)": f"{got} ({first.expected})",
                "as expected": "yes" if ok == len(runs) else f"NO ({ok}/{len(runs)})",
                "nodes leaked": leaked + (f" (+{others} not ours)" if others else ""),
                "ckpts lost": str(sum(r.checkpoints_lost or 0 for r in trains)) if trains else "-",
                "epochs re-done": redone,
                "steps lost": _fold(steps) if steps else "-",
                "idle billable s": _idle(runs),
                "recovered from": _fold(["; ".join(r.recovered) for r in runs])
                if any(r.recovered for r in runs)
                else "-",
            }
        )
    return rows


def render_table(rows: Sequence[dict[str, str]], columns: Sequence[str] = COLUMNS) -> str:
    widths = [max(len(c), *(len(r.get(c, "")) for r in rows)) if rows else len(c) for c in columns]

    def line(values: Sequence[str]) -> str:
        cells = [v.rjust(w) if c in _NUMERIC else v.ljust(w) for c, v, w in zip(columns, values, widths, strict=True)]
        return "  ".join(cells).rstrip()

    out = [line(list(columns)), line(["-" * w for w in widths])]
    out += [line([r.get(c, "") for c in columns]) for r in rows]
    return "\n".join(out)


def longest_idle(results: Sequence[RunResult]) -> tuple[float, str] | None:
    best: tuple[float, str] | None = None
    for r in (r for r in results if r.idle_goal):
        for kind, values in (("", r.idle_s), (" (preempted VM)", r.idle_preempted_s)):
            for v in values:
                if v is not None and (best is None or v > best[0]):
                    best = (v, f"{r.case}{kind}, run {r.run_id}")
    return best


def one_line(result: RunResult) -> str:
    """The progress line printed as each run ends."""
    idle = fmt_s(result.idle_max) if result.idle_s or result.idle_preempted_s else "-"
    mark = "ok" if result.as_expected else "NOT AS EXPECTED"
    return (
        f"[faults] {result.case}: {result.got}, exit {result.exit_code}, {result.nodes_leaked} leaked, idle {idle} s, "
        f"{result.wall_s:.0f}s wall: {mark}"
    )


def report(results: Sequence[RunResult]) -> str:
    lines = [render_table(summarize(results)), ""]
    best = longest_idle(results)
    if best:
        lines.append(f"longest idle billable time: {best[0]:.1f}s ({best[1]}); goal <= {IDLE_GOAL_S:.0f}s")
    for r in results:
        for text in r.notes:
            lines.append(f"  {r.case}: {text}")
        for text in r.problems:
            lines.append(f"  {r.case}: PROBLEM: {text}")
    return "\n".join(lines)
