"""Control-plane cold start: `runner --help` and `runner validate` next to the import cost of the libraries.

    .venv/bin/python scripts/bench_cli.py            # 15 rounds; `make cli-bench`

Every measurement is a fresh process (cold: nothing imported yet, the OS file cache warm as on a user's second
command). The commands and the imports take turns, one round at a time, so a slow spell of a shared machine hits
all of them alike; the medians are printed with each command's time over its goal and each library's share of
`runner validate`. Exit status 1 when a command's median misses its goal or when a command imports TensorFlow or
a Google Cloud SDK, which only the commands that talk to Google Cloud may load.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RUNNER = Path(sys.executable).with_name("runner")
COMMANDS = {  # name -> (argv, goal in seconds)
    "runner --help": ([str(RUNNER), "--help"], 0.15),
    "runner validate jobs/mnist.yaml": ([str(RUNNER), "validate", "jobs/mnist.yaml"], 0.3),
}
LIBRARIES = {  # what a user's commands could pay for, cheapest first
    "yaml": "import yaml",
    "typer": "import typer",
    "pydantic": "import pydantic",
    "rich.console": "import rich.console",
    "google.cloud.storage": "import google.cloud.storage",
    "google.cloud.tpu_v2": "import google.cloud.tpu_v2",
    "tensorflow": "import tensorflow",
}
HEAVY = ("tensorflow", "google.cloud", "grpc", "google.api_core", "keras", "numpy")


def wall(argv: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    done = subprocess.run(argv, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False)
    elapsed = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.decode()[-2000:]}")
    return elapsed


def imported_packages(argv: list[str], env: dict[str, str]) -> set[str]:
    """The modules a command imports, from `python -X importtime` (the console script's own code, run as -c)."""
    code = f"import sys; sys.argv = {['runner', *argv[1:]]!r}; from runner.cli import main; sys.exit(main())"
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    names = set()
    for line in done.stderr.splitlines():
        if line.startswith("import time:") and line.count("|") == 2:
            names.add(line.rsplit("|", 1)[1].strip())
    return names


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--tensorflow-rounds", type=int, default=3, help="import tensorflow takes seconds")
    args = parser.parse_args()
    if not RUNNER.exists():
        raise SystemExit(f"{RUNNER} not found: run `make install` first")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    python = [sys.executable, "-c"]
    times: dict[str, list[float]] = {name: [] for name in [*COMMANDS, "python (no imports)", *LIBRARIES]}
    for round_ in range(args.rounds):
        times["python (no imports)"].append(wall([*python, "pass"], env))
        for name, (argv, _) in COMMANDS.items():
            times[name].append(wall(argv, env))
        for name, code in LIBRARIES.items():
            if name != "tensorflow" or round_ < args.tensorflow_rounds:
                times[name].append(wall([*python, code], env))
    median = {name: statistics.median(values) for name, values in times.items()}
    bare = median["python (no imports)"]
    validate = median["runner validate jobs/mnist.yaml"]

    print(f"cold start, median of {args.rounds} fresh processes (tensorflow: {args.tensorflow_rounds}), interleaved")
    print(f"{'command':<34} {'median s':>9} {'goal s':>7} {'goal/median':>12}")
    failed = False
    for name, (_, goal) in COMMANDS.items():
        ok = median[name] <= goal
        failed |= not ok
        spread = f"{min(times[name]):.3f}-{max(times[name]):.3f}"
        verdict = "ok" if ok else "SLOW"
        print(f"{name:<34} {median[name]:>9.3f} {goal:>7.2f} {goal / median[name]:>11.2f}x  ({spread}) {verdict}")
    print()
    print(f"{'import (fresh python)':<34} {'median s':>9} {'minus bare python':>18} {'x runner validate':>18}")
    print(f"{'python (no imports)':<34} {bare:>9.3f}")
    for name in LIBRARIES:
        cost = median[name] - bare
        print(f"{name:<34} {median[name]:>9.3f} {cost:>18.3f} {median[name] / validate:>17.2f}x")
    print()
    for name, (argv, _) in COMMANDS.items():
        loaded = imported_packages(argv, env)
        heavy = sorted(p for p in HEAVY if any(m == p or m.startswith(p + ".") for m in loaded))
        failed |= bool(heavy)
        print(f"{name}: {len(loaded)} modules imported; heavy ones: {', '.join(heavy) or 'none'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
