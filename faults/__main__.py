"""`python -m faults`: run the cases, print the table. Exit status 1 when a run is not as expected, leaks a node
or loses a checkpoint."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path

from faults import table
from faults.result import RunResult
from faults.scenario import Scenario
from faults.scenarios import CASES, case_named
from faults.suite import Suite


def run_cases(suite: Suite, cases: Sequence[Scenario], repeat: int = 1) -> list[RunResult]:
    results = []
    for case in cases:
        for i in range(1, repeat + 1):
            suite.say(f"[faults] {case.name} ({i}/{repeat}): {case.fault} ...")
            result = suite.run_case(case, i)
            suite.say(table.one_line(result))
            for text in result.problems:
                suite.say(f"[faults]   problem: {text}")
            results.append(result)
    return results


def main(argv: Sequence[str] | None = None, say: Callable[[str], None] | None = None) -> int:
    say = say or (lambda s: print(s, flush=True))
    parser = argparse.ArgumentParser(prog="python -m faults", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--only", action="append", metavar="NAME", help="run only this case (repeatable)")
    parser.add_argument("--repeat", type=int, default=1, metavar="N", help="run each case N times")
    parser.add_argument("--json", metavar="FILE", help="write every run's measurements here")
    parser.add_argument("--fast", action="store_true", help="only the quick cases (the ones `make test` runs)")
    parser.add_argument("--list", action="store_true", help="list the cases (those chosen) and exit")
    parser.add_argument("--workdir", metavar="DIR", help="keep emulator VM directories and runner output here")
    args = parser.parse_args(argv)
    try:
        cases = [case_named(n) for n in args.only] if args.only else [c for c in CASES if c.fast or not args.fast]
    except KeyError as exc:
        parser.error(str(exc.args[0]))
    if args.list:
        for case in cases:
            say(f"{case.name:<24} {case.fault}{'  (fast)' if case.fast else ''}")
        return 0
    for name in ("gcp_storage_emulator", "api"):  # the storage emulator logs every 404 as an error
        logging.getLogger(name).setLevel(logging.CRITICAL)
    t0 = time.time()
    with contextlib.ExitStack() as stack:
        workdir = args.workdir or stack.enter_context(tempfile.TemporaryDirectory(prefix="runner-faults-"))
        suite = stack.enter_context(Suite(Path(workdir), say=say))
        results = run_cases(suite, cases, args.repeat)
    say("")
    say(table.report(results))
    say(f"\n{len(results)} run(s) in {time.time() - t0:.0f}s")
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) for r in results], indent=1, default=str))
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
