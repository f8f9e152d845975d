"""The JAX engine's speed choices on this machine (runner.train.jaxperf): each variant's training step timed in
turns (ABBA), in one process, through the engine's own feed (runner.train.npdata) and Keras fit.

    .venv/bin/python scripts/bench_jax_choices.py                       # mnist_cnn, batch 1024, 6 rounds
    .venv/bin/python scripts/bench_jax_choices.py --batch-size 128 --rounds 8

Variants: float32 with 1 step per execution (the CPU table's choice), mixed_bfloat16, and 4 steps per execution.
Each round fits every variant over the same `--steps` batches (the order flipped every round), after one compiling
fit each; the result is the median ms/step per variant and its ratio to float32. No TensorFlow is imported.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

VARIANTS = {
    "float32, 1 step/exec": ("float32", 1),
    "mixed_bfloat16": ("mixed_bfloat16", 1),
    "4 steps/exec": ("float32", 4),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="mnist_cnn")
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=8, help="training steps per fit")
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()

    from runner.train.engines.jax import keep_tensorflow_out

    keep_tensorflow_out()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax
    import keras

    from runner import datasets
    from runner.train import cpu as cpus
    from runner.train import npdata
    from runner.train.models import build_model, make_optimizer

    data = datasets.load_npz(datasets.fetch_mnist())
    examples = args.batch_size * args.steps
    feed = npdata.TrainData(keras, data.x_train[:examples], data.y_train[:examples], args.batch_size, seed=0)
    models = {}
    for name, (policy, spe) in VARIANTS.items():
        keras.mixed_precision.set_global_policy(policy)
        model = build_model(args.model, keras)
        model.compile(
            optimizer=make_optimizer("adam", 3e-3, keras),
            loss="sparse_categorical_crossentropy",
            steps_per_execution=spe,
        )
        model.fit(feed.epoch(0), verbose=0)  # compiles
        models[name] = model
    keras.mixed_precision.set_global_policy("float32")
    times: dict[str, list[float]] = {name: [] for name in VARIANTS}
    names = list(VARIANTS)
    for r in range(args.rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            start = time.perf_counter()
            models[name].fit(feed.epoch(r + 1), verbose=0)
            times[name].append((time.perf_counter() - start) / args.steps * 1e3)
    machine = cpus.detect()
    print(
        f"{machine.model}, {cpus.usable_cpus()} CPUs, native bfloat16: {machine.native_bf16}; JAX {jax.__version__}, "
        f"keras {keras.__version__}; {args.model}, batch {args.batch_size}, {args.rounds} rounds of {args.steps} steps"
    )
    base = statistics.median(times[names[0]])
    for name in names:
        ms = statistics.median(times[name])
        print(
            f"{name:>22}: {ms:8.1f} ms/step median ({min(times[name]):.1f}-{max(times[name]):.1f}), "
            f"{base / ms:.2f}x the examples/s of float32"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
