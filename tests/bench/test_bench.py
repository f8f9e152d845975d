"""runner bench and the trainer's device choices: pure parts as unit tests, then the real bench on a slice of MNIST.

Nothing here asserts on wall time: the machines these tests run on are shared and their timings are noise.
"""

from __future__ import annotations

import itertools
import json
import os
import statistics
import subprocess
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from runner.bench import effective, report
from runner.bench.command import bench
from runner.bench.notebook import NOTEBOOK, NOTEBOOK_GPU, NOTEBOOK_TPU
from runner.bench.report import ArmResult, BenchResult
from runner.errors import UsageError
from runner.train import calibration, cpu
from runner.worker import allocator
from tests.collect.test_svg import NS, drawn, parse, texts, tick_texts
from tests.conftest import REPO
from tests.environ import child_env

NO_BF16 = "-avx512_bf16,-amx_bf16,-bf16"  # the CPU's flags without bfloat16, whatever this machine has


# -- results, tables, plots -----------------------------------------------------------------------------------------


THREADS = {"intra_op": 2, "inter_op": 2, "source": "TensorFlow default"}
BASE_SETTINGS = {
    "input": "numpy float32 arrays",
    "effective": {
        "precision": "float32",
        "jit_compile": False,
        "steps_per_execution": 1,
        "dropout": "Keras",
        "onednn": True,
        "onednn_source": "TensorFlow default",
        "threads": THREADS,
    },
}
OUR_SETTINGS = {
    "input": "tf.data (runner.train.data)",
    "precision": "mixed_bfloat16",
    "effective": {
        "precision": "mixed_bfloat16 (Dropout float32)",
        "jit_compile": False,
        "steps_per_execution": 1,
        "dropout": "fused by XLA (3 of 3 layers)",
        "onednn": True,
        "onednn_source": "TF_ENABLE_ONEDNN_OPTS=1",
        "threads": THREADS,
        "allocator": "glibc defaults",
    },
}


def _result(label: str = "cpu: test box", slow_first: float = 100.0) -> BenchResult:
    arms = []
    for batch, base_s, ours_s in ((256, 60.0, 30.0), (1024, 50.0, 25.0)):
        base_times = (slow_first, base_s, base_s * 1.2)
        arms.append(ArmResult("baseline", batch, 60000, base_times, (slow_first, base_s, base_s), 0.98, BASE_SETTINGS))
        examples = 60000 // batch * batch
        ours_times = (slow_first, ours_s, ours_s * 1.2)
        arms.append(ArmResult("ours", batch, examples, ours_times, (90.0, 24.0, 24.0), 0.981, OUR_SETTINGS))
    return BenchResult(
        label=label,
        device={"kind": "cpu"},
        versions={"tensorflow": "TensorFlow 2.20.0", "keras": "keras 3.15.1"},
        train_examples=60000,
        test_examples=10000,
        epochs=3,
        schedule="interleaved",
        arms=tuple(arms),
    )


class _FakeWorker:
    """Stands for one arm's worker process: notes when it runs an epoch, in one shared log."""

    def __init__(self, key: tuple[str, int], log: list[tuple[str, int]]) -> None:
        self.key, self.log = key, log

    def ready(self) -> dict[str, Any]:
        settings = {"input": "fake", "effective": {"precision": "float32"}}
        return {"examples_per_epoch": 1000, "test_examples": 100, "keras": "keras 3", "settings": settings}

    def epoch(self) -> Any:
        from runner.bench.arms import EpochTime

        self.log.append(self.key)
        return EpochTime(1.0, 0.9)

    def finish(self) -> float:
        return 0.9

    def close(self) -> None:
        pass


@pytest.mark.parametrize("batches", [(1024,), (256, 1024), (256, 512, 1024), (128, 256, 512, 1024)])
def test_each_batch_size_alternates_which_trainer_runs_first(
    batches: tuple[int, ...], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The driver's real loop, its workers faked. At every batch size the trainer that runs first must alternate
    from one epoch pair to the next, with any number of batch sizes. The former scheme flipped the order once per
    turn over all batch sizes, so with 2 or 4 of them each batch size ran in the same order every epoch."""
    from runner.bench import harness

    log: list[tuple[str, int]] = []
    monkeypatch.setattr(
        harness, "_start", lambda options, batches, logs, in_process: {k: _FakeWorker(k, log) for k in _keys(batches)}
    )
    epochs = 6
    harness._run_group(harness.BenchOptions(batch_sizes=batches, epochs=epochs), batches, tmp_path, False, print)
    assert len(log) == 2 * epochs * len(batches)
    pairs = [log[i : i + 2] for i in range(0, len(log), 2)]
    assert all(a[1] == b[1] and {a[0], b[0]} == {"ours", "baseline"} for a, b in pairs)
    for batch in batches:
        firsts = [a[0] for a, _ in pairs if a[1] == batch]
        assert all(x != y for x, y in itertools.pairwise(firsts)), (batch, firsts)
    # And the whole sequence is ABBA: each pair starts with the trainer that ended the one before.
    assert all(before[1][0] == after[0][0] for before, after in itertools.pairwise(pairs))


def _keys(batches: Sequence[int]) -> list[tuple[str, int]]:
    return [(t, b) for b in batches for t in ("baseline", "ours")]


def test_epoch_time_leaves_out_the_first_epoch() -> None:
    result = _result(slow_first=1000.0)
    base = result.arm("baseline", 256)
    assert base is not None
    assert base.epoch_time_s == pytest.approx(66.0)  # median of 60 and 72; the 1000 s compiling epoch is out
    assert base.us_per_example == pytest.approx(60.0 / 60000 * 1e6)
    ours = result.arm("ours", 256)
    assert ours is not None and ours.us_per_example == pytest.approx(24.0 / 59904 * 1e6)
    # Pairwise: (59904/30)/(60000/60) and (59904/36)/(60000/72) -> both 1.9968
    assert result.speedup(256) == pytest.approx(2 * 59904 / 60000)
    assert result.speedup(512) is None


def test_markdown_table_has_both_trainers_every_batch_and_the_notebook() -> None:
    text = report.render_markdown(_result())
    times = text.split("What each trainer ran with")[0]
    rows = [line for line in times.splitlines() if line.startswith("| 256 ") or line.startswith("| 1024 ")]
    assert len(rows) == 8  # 2 batch sizes x (ours, plain fit, notebook GPU, notebook TPU)
    assert "| 256 | our trainer | 33.0 | 401 | 1815 | 0.9810 | 2.00x |" in text
    assert "| 256 | plain model.fit (numpy) | 66.0 | 1000 | 909 | 0.9800 |  |" in text
    assert f"| 1024 | {NOTEBOOK_TPU.label} | 2 | 37 |" in text
    assert f"| 256 | {NOTEBOOK_GPU.label} | 6 | 94 |" in text
    assert "TensorFlow 2.20.0, keras 3.15.1" in text


def test_the_table_shows_what_each_trainer_ran_with() -> None:
    text = report.render_markdown(_result())
    assert (
        "| 1024 | plain model.fit (numpy) | float32 | off | 1 | Keras | on (TensorFlow default) "
        "| 2 / 2 (TensorFlow default) | - | numpy float32 arrays |" in text
    )
    assert (
        "| 256 | our trainer | mixed_bfloat16 (Dropout float32) | off | 1 | fused by XLA (3 of 3 layers) "
        "| on (TF_ENABLE_ONEDNN_OPTS=1) "
        "| 2 / 2 (TensorFlow default) | glibc defaults | tf.data (runner.train.data) |" in text
    )
    old = ArmResult("ours", 256, 59904, (1.0, 1.0), (1.0, 1.0), 0.9)  # a bench.json from before the settings
    assert report.settings_cells(old.settings) == ["-"] * 8
    line = effective.describe_effective(BASE_SETTINGS["effective"])  # type: ignore[arg-type]
    assert line == (
        "float32, XLA off, 1 step(s)/execution, dropout Keras, oneDNN on (TensorFlow default), "
        "threads 2 intra / 2 inter (TensorFlow default)"
    )


def test_effective_threads_are_what_tensorflow_resolves() -> None:
    class Threading:
        intra, inter = 0, 0

        def get_intra_op_parallelism_threads(self) -> int:
            return self.intra

        def get_inter_op_parallelism_threads(self) -> int:
            return self.inter

    class FakeTf:
        class config:  # shaped like tf.config
            threading = Threading()

    cpus = cpu.usable_cpus()
    default = effective.effective_threads(FakeTf, environ={})
    assert default == {"intra_op": cpus, "inter_op": cpus, "source": "TensorFlow default"}
    from_env = effective.effective_threads(FakeTf, environ={"TF_NUM_INTEROP_THREADS": "1"})
    assert from_env == {"intra_op": cpus, "inter_op": 1, "source": "TensorFlow default/TF_NUM_INTEROP_THREADS"}
    FakeTf.config.threading.intra = 3
    assert effective.effective_threads(FakeTf, environ={"TF_NUM_INTRAOP_THREADS": "5"})["intra_op"] == 3  # set wins


def test_results_round_trip_and_combine(tmp_path: Path) -> None:
    first, second = _result("cpu: box A"), _result("gpu: box B")
    assert BenchResult.from_json(first.to_json()) == first
    summary = json.loads(first.to_json())
    assert summary["speedup"] == {"256": 1.997, "1024": 1.98}  # 2 x 59904/60000 and 2 x 59392/60000
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "bench.json").write_text(first.to_json())
    (tmp_path / "b.json").write_text(second.to_json())
    loaded = [report.load(tmp_path / "a"), report.load(tmp_path / "b.json")]  # a directory or the file itself
    text = report.render_comparison(loaded)
    assert "| notebook K80 GPU | 6 s / 94 us | 5 s / 82 us | 4 s / 79 us |" in text
    assert "| cpu: box A, our trainer | 33.0 s / 401 us |" in text
    assert "| gpu: box B, plain model.fit (numpy) |" in text
    assert "batch 256: 2.00x" in text
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ValueError, match="not a readable bench result"):
        report.load(tmp_path / "bad.json")


def test_plot_is_an_svg_of_every_series(tmp_path: Path) -> None:
    results = [_result(), _result("gpu: other <&>")]
    path = report.plot(results, tmp_path / "bench.svg")
    document = path.read_text()
    root = parse(document)  # well-formed: the label's "<&>" is escaped
    labels = [f"{r.label}, {report.TRAINER_NAMES[t]}" for r in results for t in report.TRAINERS]
    published = {pub.label: pub.epoch_s for pub in NOTEBOOK}
    # every series in both panels (epoch time, per-example step time): a marker per batch size it has
    assert drawn(document) == {label: 2 * 2 for label in labels} | {k: 2 * len(v) for k, v in published.items()}
    words = texts(document)
    assert set(labels) | set(published) <= set(words)  # the legend
    batches = sorted({b for v in published.values() for b in v} | {256, 1024})
    assert tick_texts(document, "middle").count("256") == 2  # the batch sizes are the x ticks of both panels
    assert sorted({int(t) for t in tick_texts(document, "middle")}) == batches
    dashed = [e for e in root.iter(f"{NS}polyline") if e.get("stroke-dasharray")]
    assert len(dashed) == 2 * len(published)  # the notebook's numbers dashed, ours solid


def test_compare_command_writes_the_combined_table(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text(_result("cpu: A").to_json())
    (tmp_path / "b.json").write_text(_result("cpu: B").to_json())
    result = CliRunner().invoke(
        _app(), ["--compare", str(tmp_path / "a.json"), "--compare", str(tmp_path / "b.json"), "--out", str(tmp_path)]
    )
    assert result.exit_code == 0, result.output
    assert "cpu: A, our trainer" in result.output and "cpu: B, our trainer" in result.output
    assert "cpu: B, our trainer" in (tmp_path / "compare.md").read_text()
    assert "cpu: B, our trainer" in drawn((tmp_path / "compare.svg").read_text())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--epochs", "1"], "at least 2"),
        (["--batch-sizes", "256,x"], "positive integers"),
        (["--precision", "fp8"], "mixed_bfloat16"),
        (["--epochs", "10001"], "--epochs 10001: input should be less than or equal to 10000"),
        (["--examples", "-1"], "--examples -1: input should be greater than or equal to 1"),
        (["--test-examples", "0"], "--test-examples 0"),
        (["--learning-rate", "0"], "--learning-rate 0.0"),
        (["--steps-per-execution", "0"], "--steps-per-execution 0"),
        (["--seed", "-3"], "--seed -3"),
        (["--batch-sizes", "256,2000000"], "--batch-sizes 2000000"),
        (["--compare", "/dev/zero"], "not a regular file"),
        (["--compare", "/dev/null"], "not a regular file"),
    ],
)
def test_bad_options_are_usage_errors(args: list[str], message: str) -> None:
    result = CliRunner().invoke(_app(), args)
    assert isinstance(result.exception, UsageError), result.output
    assert message in str(result.exception)


def test_out_of_range_options_exit_2_before_any_worker_starts(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # opening it for reading would wait for a writer forever
    env = child_env()
    for args in (["--examples", "-1"], ["--compare", "/dev/zero"], ["--compare", str(fifo)]):
        done = subprocess.run(
            [sys.executable, "-m", "runner.bench", *args, "--out", str(tmp_path / "out")],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 2, done.stderr
        assert "Traceback" not in done.stderr and "error" in done.stderr.lower()
    assert not (tmp_path / "out").exists()


def _app() -> typer.Typer:
    app = typer.Typer()
    app.command()(bench)
    return app


def test_framework_option_defaults_to_the_engines_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    from runner.bench import command

    assert command.installed_frameworks() == ("tensorflow", "jax")  # both, in this environment
    assert command._frameworks(None) == ("tensorflow", "jax")
    assert command._frameworks("JAX, jax") == ("jax",)
    with pytest.raises(UsageError, match="use tensorflow, jax, or both"):
        command._frameworks("pytorch")
    monkeypatch.setattr(command, "installed_frameworks", lambda: ())
    with pytest.raises(UsageError, match="neither TensorFlow nor JAX"):
        command._frameworks(None)
    result = CliRunner().invoke(_app(), ["--framework", "jax", "--xla", "off"])
    assert result.exit_code != 0 and "always compiles with XLA" in str(result.exception)
    monkeypatch.setenv("RUNNER_TPU_NAME", "local")  # a TPU host: one process, one engine
    result = CliRunner().invoke(_app(), ["--framework", "tensorflow,jax"])
    assert result.exit_code != 0 and "one after the other" in str(result.exception)


# -- the real bench, on a slice of real MNIST -----------------------------------------------------------------------


@pytest.mark.slow
def test_bench_runs_both_trainers_at_every_batch_size(
    tmp_path: Path, mnist_npz: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No bfloat16 whatever this CPU has: only the dropout kernel is timed (the TPU-schedule test forces bfloat16 on).
    monkeypatch.setenv(cpu.CPU_FLAGS_ENV, NO_BF16)
    out = tmp_path / "bench"
    args = ["--batch-sizes", "128,256", "--epochs", "2", "--examples", "1024", "--test-examples", "256"]
    args += ["--framework", "tensorflow"]  # the JAX engine's bench has its own test below
    result = CliRunner().invoke(_app(), [*args, "--data", str(mnist_npz), "--out", str(out)])
    assert result.exit_code == 0, f"{result.output}\n{result.exception!r}"
    assert {p.name for p in out.iterdir()} >= {"bench.md", "bench.json", "bench.svg", "bench-logs"}
    data = json.loads((out / "bench.json").read_text())
    assert {(a["trainer"], a["batch_size"]) for a in data["arms"]} == {
        (t, b) for t in ("ours", "baseline") for b in (128, 256)
    }
    plotted = drawn((out / "bench.svg").read_text())  # both trainers at both batch sizes, in both panels
    assert [plotted[f"{data['label']}, {name}"] for name in report.TRAINER_NAMES.values()] == [4, 4]
    for arm in data["arms"]:
        assert len(arm["epoch_times_s"]) == 2 and len(arm["train_times_s"]) == 2
        assert all(t > 0 for t in arm["epoch_times_s"])
        assert 0.1 < arm["test_accuracy"] <= 1.0  # real data, real learning: far above chance after 2 epochs
    for row in data["summary"]:  # the reported epoch time is the second epoch's: the first one is left out
        arm = next(a for a in data["arms"] if (a["trainer"], a["batch_size"]) == (row["trainer"], row["batch_size"]))
        assert row["epoch_time_s"] == pytest.approx(statistics.median(arm["epoch_times_s"][1:]), abs=1e-3)
    for ours in (a for a in data["arms"] if a["trainer"] == "ours"):  # the code's own decision for this CPU
        settings = ours["settings"]
        assert settings["steps_per_execution"] == 1 and settings["jit_compile"] is False
        assert settings["native_bf16"] is False and settings["cpu_flags_override"] == NO_BF16
        _assert_own_decision(settings)
        assert settings["precision"] == "float32"
    baseline = next(a for a in data["arms"] if a["trainer"] == "baseline")
    assert baseline["examples_per_epoch"] == 1024 and baseline["settings"]["input"] == "numpy float32 arrays"
    table = (out / "bench.md").read_text()
    assert table in result.output  # printed as well as written
    assert "| 128 | our trainer |" in table and "| 256 | plain model.fit (numpy) |" in table
    assert data["test_examples"] == 256 and data["train_examples"] == 1024

    combined = CliRunner().invoke(_app(), ["--compare", str(out), "--compare", str(out / "bench.json")])
    assert combined.exit_code == 0, combined.output
    assert combined.output.count(", our trainer |") == 2


def _assert_own_decision(settings: dict[str, Any]) -> None:
    """What the trainer recorded is what perf decides from the features it saw (and the times it measured), for
    mnist_cnn on a CPU: its dropout kernel is timed on every CPU, bfloat16 where it is native."""
    source = settings["precision_source"]
    if source in ("calibrated", "cached"):
        native = frozenset({"avx512_bf16"}) if settings["native_bf16"] else frozenset()
        candidates = calibration.cpu_candidates(native, fusable=True)
        assert settings["calibration"]["candidates"] == list(candidates)
        timings = {v: settings["calibration"]["rounds_ms"][v] for v in candidates}  # JSON may sort the keys
        assert all(t > 0 for rounds in timings.values() for t in rounds)
        picked = calibration.pick_from_timings(timings)
        assert (settings["precision"], settings["dropout"]) == calibration.split_variant(picked)
    else:  # a trainer that does not pass its model and batch to plan_for cannot calibrate
        assert (settings["precision"], settings["dropout"], source) == ("float32", "keras", "uncalibrated")
    assert settings["precision_reason"]


@pytest.mark.slow
def test_bench_in_one_process_as_on_a_tpu_host(tmp_path: Path, mnist_npz: Path) -> None:
    """The TPU schedule (both trainers in one process), exercised on CPU in a child process of its own, with native
    bfloat16 forced on (the test above forces it off): the trainer's decision, and a real calibration of the run's
    model and batch on this CPU, then read back from the start-up cache."""
    forced = "+avx512_bf16"
    script = textwrap.dedent(
        f"""
        import json
        from pathlib import Path
        from runner.bench.harness import BenchOptions, run_bench
        options = BenchOptions(batch_sizes=(128,), epochs=2, examples=512, test_examples=128,
                               data={str(mnist_npz)!r}, in_process=True)
        result = run_bench(options, Path({str(tmp_path)!r}), command="test")
        print("RESULT", result.to_json().replace("\\n", ""))

        import keras, tensorflow as tf
        from runner.train import perf
        from runner.train.models import build_model
        plans = [perf.plan_for("cpu", 4, tf=tf, model="mnist_cnn", batch_size=128) for _ in range(2)]
        names = [layer.name for layer in build_model("mnist_cnn", keras).layers]
        print("PLANS", json.dumps({{"plans": [p.as_dict() for p in plans], "names": names}}))
        """
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RUNNER_", "TF_"))}
    env.update({cpu.CPU_FLAGS_ENV: forced, "RUNNER_CACHE_DIR": str(tmp_path / "cache")})
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))
    result = BenchResult.from_json(line[len("RESULT ") :])
    assert "one process" in result.schedule
    assert {a.trainer for a in result.arms} == {"ours", "baseline"}
    assert all(len(a.epoch_times_s) == 2 for a in result.arms)
    ours = result.arm("ours", 128)
    assert ours is not None and ours.settings["native_bf16"] is True
    _assert_own_decision(ours.settings)

    line = next(line for line in done.stdout.splitlines() if line.startswith("PLANS "))
    plans, names = json.loads(line[len("PLANS ") :]).values()
    for plan in plans:
        _assert_own_decision(plan)
    # Timed once on the real CPU (by the trainer already, when it passes its model and batch), then read back.
    assert [p["precision_source"] for p in plans] in (["calibrated", "cached"], ["cached", "cached"])
    assert plans[1]["precision_reason"].startswith("cached from ")
    assert len(list((tmp_path / "cache" / calibration.CACHE_KIND).glob("*.json"))) == 1  # one key: one entry
    if plans[0]["precision_source"] == "calibrated":
        assert names[0] == "conv2d"  # the calibration's models left no trace in Keras' naming


# Installed in every process of the bench (its workers are spawned interpreters) through sitecustomize: TensorFlow
# and tf_keras cannot be imported, as in an environment with numpy, jax and keras only, and each attempt is noted.
NO_TENSORFLOW = """
import importlib.abc, os, sys, traceback

class NoTensorFlow(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.partition(".")[0] in ("tensorflow", "tf_keras"):
            with open(os.environ["IMPORT_ATTEMPTS"], "a") as f:
                f.write(fullname + " " + "".join(traceback.format_stack(limit=6)).replace("\\n", " | ") + "\\n")
            raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
        return None

sys.meta_path.insert(0, NoTensorFlow())
"""


@pytest.mark.slow
def test_bench_on_jax_runs_without_tensorflow(tmp_path: Path, mnist_npz: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(NO_TENSORFLOW)
    attempts = tmp_path / "attempts.txt"
    env = child_env("TF_", "KERAS_")
    env.update({"PYTHONPATH": os.pathsep.join([str(site), str(REPO)]), "IMPORT_ATTEMPTS": str(attempts)})
    probe = subprocess.run([sys.executable, "-c", "import tensorflow"], env=env, capture_output=True, text=True)
    assert "No module named 'tensorflow'" in probe.stderr and attempts.read_text().startswith("tensorflow ")
    attempts.unlink()  # the blocker works; from here on, no attempt is expected
    out = tmp_path / "bench"
    args = ["--framework", "jax", "--batch-sizes", "128", "--epochs", "2", "--examples", "512", "--test-examples"]
    done = subprocess.run(
        [sys.executable, "-m", "runner.bench", *args, "128", "--data", str(mnist_npz), "--out", str(out)],
        env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    logs = "\n".join(p.read_text()[-2000:] for p in (out / "bench-logs").glob("*.log"))
    assert done.returncode == 0, f"{done.stderr[-3000:]}\n{logs}"
    assert not attempts.exists(), attempts.read_text()[:3000]  # nothing even tried to import TensorFlow
    result = BenchResult.from_json((out / "bench.json").read_text())
    assert result.framework == "jax" and result.versions["engine"].startswith("JAX ")
    assert result.label.endswith(", JAX")
    for trainer in ("ours", "baseline"):
        arm = result.arm(trainer, 128)
        assert arm is not None and len(arm.epoch_times_s) == 2
        assert arm.settings["effective"]["jit_compile"] is True and arm.settings["effective"]["onednn"] is None
    ours, plain = result.arm("ours", 128), result.arm("baseline", 128)
    assert ours is not None and plain is not None
    # Our trainer's process starts as the supervisor starts the built-in trainer on this machine; the plain fit's as
    # a notebook's does.
    mine = allocator.described({**env, **allocator.for_engine("jax", env)})
    assert (ours.settings["effective"]["allocator"], plain.settings["effective"]["allocator"]) == (
        mine,
        allocator.described(env),
    )
    # The same accuracy check as TensorFlow's bench; 4 steps of 128 on this slice reached 0.5-0.7 here.
    assert ours.test_accuracy > 0.3 and plain.test_accuracy > 0.3
    assert "runner.train.npdata" in ours.settings["input"]
    assert "on Keras 3 on JAX: our trainer vs a plain model.fit" in done.stdout


@pytest.mark.slow
def test_bench_puts_both_engines_side_by_side(tmp_path: Path, mnist_npz: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(cpu.CPU_FLAGS_ENV, NO_BF16)  # a shorter calibration: this test is about the layout
    out = tmp_path / "bench"
    args = ["--batch-sizes", "128", "--epochs", "2", "--examples", "512", "--test-examples", "128"]
    result = CliRunner().invoke(_app(), [*args, "--data", str(mnist_npz), "--out", str(out)])  # the default: both
    assert result.exit_code == 0, f"{result.output}\n{result.exception!r}"
    engines = {name: report.load(out / name) for name in ("tensorflow", "jax")}
    for name, bench_result in engines.items():
        assert bench_result.framework == name and {a.trainer for a in bench_result.arms} == {"ours", "baseline"}
        assert all(a.test_accuracy > 0.3 for a in bench_result.arms)  # 4 steps of 128 reached 0.5-0.7 here
    assert engines["tensorflow"].versions["engine"].startswith("TensorFlow ")
    assert engines["jax"].versions["engine"].startswith("JAX ")
    compared = (out / "compare.md").read_text()
    assert "TensorFlow, our trainer" in compared and "JAX, our trainer" in compared
    assert "on TensorFlow: our trainer vs" in result.output and "on Keras 3 on JAX: our trainer vs" in result.output
