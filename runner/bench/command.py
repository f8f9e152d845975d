"""`runner bench`: the notebook's experiment on the devices here, our trainer against a plain model.fit, on each
engine (TensorFlow, Keras 3 on JAX) side by side.

Only typer and the standard library are imported at module level, so registering the command keeps `runner --help`
fast; TensorFlow or JAX is imported by the bench's worker processes, and `--framework jax` never imports TensorFlow.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from runner.bench.harness import BenchOptions

QUICK = {"epochs": 2, "examples": 8192, "test_examples": 2048}


FRAMEWORKS = ("tensorflow", "jax")


def installed_frameworks() -> tuple[str, ...]:
    """The engines whose packages are installed here (found, not imported): TensorFlow; JAX with Keras 3."""
    import importlib.util

    def found(module: str) -> bool:
        try:
            return importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):  # a finder that refuses it, a half-installed package
            return False

    present = {"tensorflow": found("tensorflow"), "jax": found("jax") and found("keras")}
    return tuple(f for f in FRAMEWORKS if present[f])


def _frameworks(text: str | None) -> tuple[str, ...]:
    from runner.errors import UsageError

    if text is None:
        chosen = installed_frameworks()
        if not chosen:
            raise UsageError("neither TensorFlow nor JAX with Keras 3 is installed here: pip install tpu-runner[train]")
        return chosen
    chosen = tuple(dict.fromkeys(part for part in text.replace(" ", "").lower().split(",") if part))
    unknown = [f for f in chosen if f not in FRAMEWORKS]
    if not chosen or unknown:
        raise UsageError(f"--framework {text!r}: use tensorflow, jax, or both separated by a comma")
    return chosen


def _printer(prefix: str) -> Callable[[str], None]:
    """Progress lines to stderr, each after `prefix` (the engine's name when there are two)."""
    return lambda line: typer.echo(prefix + line, err=True)


def _batch_sizes(text: str) -> tuple[int, ...]:
    from runner.errors import UsageError

    try:
        sizes = tuple(int(part) for part in text.replace(" ", "").split(",") if part)
    except ValueError:
        sizes = ()
    if not sizes or min(sizes) < 1:
        raise UsageError(f"--batch-sizes {text!r}: give positive integers separated by commas, e.g. 256,512,1024")
    return sizes


# The options that become fields of the trainer's TrainingSpec, whose limits they must meet.
_SPEC_OPTIONS = {
    "epochs": "--epochs",
    "batch_size": "--batch-sizes",
    "learning_rate": "--learning-rate",
    "seed": "--seed",
    "max_train_examples": "--examples",
    "max_test_examples": "--test-examples",
    "steps_per_execution": "--steps-per-execution",
}


def _check_against_spec(options: BenchOptions) -> None:
    """Refuse, before any worker starts, what the trainer's spec would refuse inside one (as a traceback): the
    spec's own limits, so the two cannot drift apart."""
    from pydantic import ValidationError

    from runner.errors import UsageError
    from runner.spec import TrainingSpec

    problems: list[str] = []
    for batch in options.batch_sizes:
        try:
            TrainingSpec(
                epochs=options.epochs,
                batch_size=batch,
                learning_rate=options.learning_rate,
                seed=options.seed,
                max_train_examples=options.examples,
                max_test_examples=options.test_examples,
                steps_per_execution=options.steps_per_execution,
            )
        except ValidationError as exc:
            for error in exc.errors():
                name = str(error["loc"][0]) if error["loc"] else ""
                option = _SPEC_OPTIONS.get(name, name)
                problems.append(f"{option} {error.get('input')!r}: {error['msg'].lower()}")
    if problems:
        raise UsageError("; ".join(dict.fromkeys(problems)))


def _default_out() -> Path:
    from runner import contract

    if os.environ.get(contract.OUTPUT_DIR):  # a job: the run directory the supervisor mirrors
        return contract.JobContext.from_env().output_dir
    return Path("runs") / time.strftime("bench-%Y%m%d-%H%M%S")


def bench(
    batch_sizes: Annotated[
        str, typer.Option("--batch-sizes", help="Comma-separated global batch sizes.")
    ] = "256,512,1024",
    epochs: Annotated[
        int | None,
        typer.Option(
            help="Epochs per trainer and batch size, >= 2 (the first, compiling one is excluded). [default: 3]"
        ),
    ] = None,
    examples: Annotated[
        int | None, typer.Option(help="Train on the first N of the 60000 training examples. [default: all]")
    ] = None,
    test_examples: Annotated[
        int | None, typer.Option(help="Evaluate on the first N of the 10000 test examples. [default: all]")
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(
            help="Directory for bench.md, bench.json, bench.svg. [default: $RUNNER_OUTPUT_DIR in a job, "
            "else runs/bench-TIMESTAMP]"
        ),
    ] = None,
    compare: Annotated[
        list[Path] | None,
        typer.Option(
            help="Combine earlier results (bench.json files or their directories, repeat the option) side by "
            "side with the notebook's numbers instead of running; with --out, writes compare.md and compare.svg."
        ),
    ] = None,
    quick: Annotated[bool, typer.Option(help="A short run: 2 epochs on 8192 training and 2048 test examples.")] = False,
    label: Annotated[str | None, typer.Option(help="Name of this run in tables. [default: the device]")] = None,
    learning_rate: Annotated[float, typer.Option(help="Adam's learning rate, the same for both trainers.")] = 3e-3,
    seed: Annotated[int, typer.Option(help="Seed for weights and shuffling, the same for both trainers.")] = 0,
    precision: Annotated[
        str, typer.Option(help="Our trainer's dtype policy: auto, float32, mixed_float16 or mixed_bfloat16.")
    ] = "auto",
    steps_per_execution: Annotated[
        int | None, typer.Option(help="Our trainer's steps per execution. [default: the device's choice]")
    ] = None,
    xla: Annotated[
        str, typer.Option(help="Our trainer's XLA compilation: auto (the device's choice), on or off.")
    ] = "auto",
    data: Annotated[str | None, typer.Option(help="An MNIST .npz (local or gs://). [default: the data cache]")] = None,
    framework: Annotated[
        str | None,
        typer.Option(
            help="The engine both trainers run on: tensorflow, jax (Keras 3 on JAX; needs no TensorFlow), or "
            "tensorflow,jax for both side by side. [default: each one installed here]"
        ),
    ] = None,
) -> None:
    """Reproduce the 'GPU vs TPU' notebook: epoch and per-example step time at each batch size, for our trainer
    and for a plain model.fit on numpy arrays, epochs interleaved, on each engine; writes bench.md, bench.json and
    bench.svg (per engine in a folder of its name when there are two, with compare.md beside them)."""
    from runner.bench import report
    from runner.errors import UsageError

    if compare:
        try:
            results = [report.load(path) for path in compare]
        except ValueError as exc:
            raise UsageError(str(exc)) from exc
        typer.echo(report.render_comparison(results))
        if out:
            written = report.write_comparison(results, out)
            typer.echo(f"wrote {', '.join(str(p) for p in written.values())}")
        return
    from runner.bench.harness import BenchOptions, run_bench
    from runner.train.choices import PRECISIONS

    if precision != "auto" and precision not in PRECISIONS:
        raise UsageError(f"--precision {precision!r}: use auto or one of {', '.join(PRECISIONS)}")
    if xla not in ("auto", "on", "off"):
        raise UsageError(f"--xla {xla!r}: use auto, on or off")
    frameworks = _frameworks(framework)
    from runner.train.strategy import tpu_present

    if len(frameworks) > 1 and tpu_present():
        raise UsageError(
            "on a TPU host the bench runs in one process, which only one engine can hold the TPU from: run "
            "--framework tensorflow and --framework jax one after the other, then --compare the two"
        )
    if xla == "off" and "jax" in frameworks:
        raise UsageError("--xla off: the JAX engine always compiles with XLA; give --framework tensorflow")
    preset = QUICK if quick else {"epochs": 3, "examples": None, "test_examples": None}
    options = BenchOptions(
        batch_sizes=_batch_sizes(batch_sizes),
        epochs=epochs if epochs is not None else int(preset["epochs"]),  # type: ignore[arg-type]
        examples=examples if examples is not None else preset["examples"],
        test_examples=test_examples if test_examples is not None else preset["test_examples"],
        learning_rate=learning_rate,
        seed=seed,
        precision=precision,
        steps_per_execution=steps_per_execution,
        jit_compile=None if xla == "auto" else xla == "on",
        data=data,
        label=label,
    )
    if options.epochs < 2:
        raise UsageError("--epochs must be at least 2: the first, compiling epoch is excluded from the times")
    _check_against_spec(options)
    directory = out or _default_out()
    typer.echo(
        f"bench: {', '.join(frameworks)}; batch sizes {', '.join(map(str, options.batch_sizes))}; "
        f"{options.epochs} epochs each; {options.examples or 'all'} training examples; output {directory}",
        err=True,
    )
    results = []
    for engine in frameworks:
        # Engine after engine, each with both of its trainers taking turns: the ratio that matters is within one.
        where = directory / engine if len(frameworks) > 1 else directory
        prefix = f"{engine}: " if len(frameworks) > 1 else ""
        result = run_bench(
            dataclasses.replace(options, framework=engine),
            where,
            say=_printer(prefix),
            command=" ".join(sys.argv),
        )
        written = report.write(result, where)
        typer.echo(report.render_markdown(result))
        typer.echo(f"wrote {', '.join(str(p) for p in written.values())}", err=True)
        results.append(result)
    if len(results) > 1:
        typer.echo(report.render_comparison(results))
        written = report.write_comparison(results, directory)
        typer.echo(f"wrote {', '.join(str(p) for p in written.values())}", err=True)
