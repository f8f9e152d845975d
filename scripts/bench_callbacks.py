"""What keras_callbacks() costs a user's own fit: the same fit with and without it, epochs taking turns.

    .venv/bin/python scripts/bench_callbacks.py              # the Dense guide's fit, batch 64, 6 epochs, 2 runs
    .venv/bin/python scripts/bench_callbacks.py --batch-size 32 --runs 3

The fit is the "Using GPU/TPU" guide's (examples/gpu_tpu_guide/train.py): Dense(128) on (N, 784) MNIST, Adam,
batch 64, about 3 ms a step on a 2-core CPU, where per-step work in the callbacks shows. Each arm is a process of
its own: one fit with callbacks=keras_callbacks() in a run's environment (a run directory of its own, checkpoints
every epoch, as the guide's job), one without. They take turns epoch by epoch (ABBA, runner.bench.harness.turns),
only one running at a time, so a slow spell of a shared machine hits both; an epoch's time runs from its first hook
to its last, the runner's own epoch-end work (the metrics row, the checkpoint) included. The first epoch of each run
(tracing) is left out; the headline is the median over the epoch pairs of examples/s with over without, with the
pairs' range. Exit status 1 when the median is under --target.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from runner.bench.harness import turns

ARMS = {"baseline": "without", "ours": "with keras_callbacks()"}


def _arm(conn: Any, with_callbacks: bool, run_dir: str, batch_size: int, epochs: int, seed: int) -> None:
    """One arm: the guide's fit, waiting for its turn at each epoch's start and reporting the epoch's seconds."""
    import time

    from runner import contract

    if with_callbacks:
        os.environ.update({contract.RUN_ID: "bench", contract.RUN_DIR: run_dir, contract.OUTPUT_DIR: run_dir})
        os.environ.update(contract.JobContext.from_env().env())
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    from runner.datasets import mnist
    from runner.train import keras_callbacks

    tf.keras.utils.set_random_seed(seed)
    model = tf.keras.Sequential(
        [
            tf.keras.layers.Input((784,)),
            tf.keras.layers.Dense(128, activation="relu"),
            tf.keras.layers.Dense(10, activation="softmax"),
        ]
    )
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    (x_train, y_train), _ = mnist.load_data()
    x_train = x_train.reshape(-1, 784) / 255.0

    class Turn(tf.keras.callbacks.Callback):
        """First in the list: waits for the turn, then the epoch's clock starts."""

        t0 = cpu0 = 0.0

        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            conn.recv()
            Turn.t0, Turn.cpu0 = time.perf_counter(), time.process_time()

    class Done(tf.keras.callbacks.Callback):
        """Last in the list: the epoch's clock stops after every other hook of its end."""

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            conn.send((time.perf_counter() - Turn.t0, time.process_time() - Turn.cpu0))

    callbacks = [Turn(), *(keras_callbacks() if with_callbacks else []), Done()]
    conn.send(len(callbacks) - 2)  # ready: how many callbacks the arm added
    model.fit(x_train, y_train, epochs=epochs, batch_size=batch_size, callbacks=callbacks, verbose=0)
    conn.send(len(x_train))


def run_once(batch_size: int, epochs: int, seed: int, say: Any) -> tuple[list[float], list[float]]:
    """One run: both arms started at once, taking turns; the ratios (with / without) of each epoch pair after the
    first: in examples/s, and in examples per CPU second (the arms' own CPU time, all threads: steadier than wall
    time when other work shares the machine, but not what the user waits for)."""
    mp = multiprocessing.get_context("spawn")
    workers: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-callbacks-") as run_dir:
        for name in ARMS:
            conn, child = mp.Pipe()
            process = mp.Process(target=_arm, args=(child, name == "ours", run_dir, batch_size, epochs, seed))
            process.start()
            child.close()
            workers[name] = (conn, process)
        added = {name: conn.recv() for name, (conn, _) in workers.items()}
        if added["ours"] < 1:
            raise SystemExit("keras_callbacks() returned nothing: the arm is not in a run's environment")
        seconds: dict[str, list[tuple[float, float]]] = {name: [] for name in ARMS}
        for e, _, order in turns(epochs, [batch_size]):
            for name in order:
                conn = workers[name][0]
                conn.send("go")
                seconds[name].append(conn.recv())
            (base, base_cpu), (ours, ours_cpu) = seconds["baseline"][-1], seconds["ours"][-1]
            note = "tracing, left out" if e == 0 else f"with {base / ours:.3f}x the examples/s of without"
            say(
                f"  epoch {e + 1}/{epochs}: without {base:.2f} s ({base_cpu:.2f} s CPU), with {ours:.2f} s "
                f"({ours_cpu:.2f} s CPU) ({note})"
            )
        examples = {name: conn.recv() for name, (conn, _) in workers.items()}
        for _, process in workers.values():
            process.join(60)
    steps = -(-examples["ours"] // batch_size)
    step_ms = 1e3 * statistics.median(wall for wall, _ in seconds["baseline"][1:]) / steps
    say(f"  {steps} steps an epoch, {step_ms:.2f} ms a step without")
    pairs = list(zip(seconds["baseline"][1:], seconds["ours"][1:], strict=True))
    return [b[0] / o[0] for b, o in pairs], [b[1] / o[1] for b, o in pairs]


def _spread(ratios: list[float]) -> str:
    """The median's company: how many pairs, their range, the middle half."""
    low, _, high = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else (ratios[0],) * 3
    pairs = f"median of {len(ratios)} epoch pairs, {min(ratios):.3f}x-{max(ratios):.3f}x"
    return f"{pairs}, middle half {low:.3f}x-{high:.3f}x"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=6, help="per run, the first (tracing) one left out")
    parser.add_argument("--runs", type=int, default=2, help="runs, each with new processes and its own seed")
    parser.add_argument("--target", type=float, default=0.97, help="the least median ratio that passes")
    args = parser.parse_args()
    if args.epochs < 2:
        parser.error("--epochs must be at least 2: the first, tracing epoch is left out")
    ratios: list[float] = []
    cpu_ratios: list[float] = []
    for seed in range(args.runs):
        print(f"run {seed + 1}/{args.runs}: {args.epochs} epochs per arm, batch {args.batch_size}", flush=True)
        wall, cpu = run_once(args.batch_size, args.epochs, seed, lambda line: print(line, flush=True))
        ratios, cpu_ratios = ratios + wall, cpu_ratios + cpu
    median = statistics.median(ratios)
    print(f"keras_callbacks(): {median:.3f}x the examples/s of the same fit without it ({_spread(ratios)})")
    print(
        f"                   {statistics.median(cpu_ratios):.3f}x the examples per CPU second ({_spread(cpu_ratios)})"
    )
    ok = median >= args.target
    print(("PASS" if ok else "FAIL") + f" (target: at least {args.target:.2f}x)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
