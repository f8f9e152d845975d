"""runner bench and the trainer's device choices: pure parts as unit tests, then the real bench on a slice of MNIST.

Nothing here asserts on wall time: the machines these tests run on are shared and their timings are noise.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from runner.bench import report
from runner.bench.command import bench
from runner.bench.notebook import NOTEBOOK_GPU, NOTEBOOK_TPU
from runner.bench.report import ArmResult, BenchResult
from runner.errors import UsageError
from runner.train import perf

EPYC_AVX2 = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 7B13
flags\t\t: fpu vme de pse tsc msr sse sse2 ssse3 fma sse4_1 sse4_2 avx f16c avx2 bmi2 sha_ni

processor\t: 1
flags\t\t: fpu avx2
"""
SAPPHIRE_RAPIDS = """processor\t: 0
model name\t: Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz
flags\t\t: fpu sse2 avx2 avx512f avx512_vnni avx512_bf16 amx_bf16 amx_tile amx_int8
"""
COOPER_LAKE = "flags\t: avx2 avx512f avx512_bf16\n"
GRAVITON3 = "processor\t: 0\nBogoMIPS\t: 2100.00\nFeatures\t: fp asimd evtstrm aes sve bf16 i8mm\nCPU part\t: 0xd40\n"
GRAVITON2 = "processor\t: 0\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics\n"


# -- CPU features and the precision policy ---------------------------------------------------------------------------


def test_cpu_flags_come_from_the_first_cpu() -> None:
    flags = perf.cpu_flags(EPYC_AVX2)
    assert {"avx2", "fma", "sha_ni"} <= flags and "avx512f" not in flags
    assert perf.cpu_model(EPYC_AVX2) == "AMD EPYC 7B13"
    assert perf.cpu_flags("") == frozenset()


@pytest.mark.parametrize(
    ("cpuinfo", "native"),
    [(EPYC_AVX2, False), (SAPPHIRE_RAPIDS, True), (COOPER_LAKE, True), (GRAVITON3, True), (GRAVITON2, False)],
)
def test_native_bf16_is_detected_from_cpuinfo(cpuinfo: str, native: bool) -> None:
    assert perf.has_native_bf16(perf.cpu_flags(cpuinfo)) is native


@pytest.mark.parametrize(
    ("kind", "cpuinfo", "capability", "policy"),
    [
        ("tpu", "", None, "mixed_bfloat16"),
        ("gpu", "", (3, 7), "float32"),  # the notebook's K80: no tensor cores
        ("gpu", "", (6, 0), "float32"),
        ("gpu", "", (7, 0), "mixed_float16"),
        ("gpu", "", (9, 0), "mixed_float16"),
        ("gpu", "", None, "float32"),
        ("cpu", EPYC_AVX2, None, "float32"),  # emulated bf16 measured 0.21x
        ("cpu", SAPPHIRE_RAPIDS, None, "mixed_bfloat16"),
        ("cpu", GRAVITON3, None, "mixed_bfloat16"),
    ],
)
def test_precision_policy_per_device(kind: str, cpuinfo: str, capability: tuple[int, int] | None, policy: str) -> None:
    assert perf.precision_policy(kind, perf.cpu_flags(cpuinfo), capability) == policy


def test_precision_can_be_forced_but_not_misspelt() -> None:
    assert perf.precision_policy("tpu", requested="float32") == "float32"
    assert perf.precision_policy("cpu", requested="mixed_bfloat16") == "mixed_bfloat16"
    with pytest.raises(ValueError, match="mixed_float16"):
        perf.precision_policy("cpu", requested="fp16")


def test_xla_and_steps_per_execution_per_device() -> None:
    assert perf.jit_compile("cpu") is False
    assert perf.jit_compile("gpu") is None and perf.jit_compile("tpu") is None  # Keras' own default
    assert perf.steps_per_execution("cpu", 58) == 1
    assert perf.steps_per_execution("tpu", 58) == 50
    assert perf.steps_per_execution("tpu", 7) == 7


def test_plan_records_the_choices() -> None:
    plan = perf.plan_for("cpu", 58, cpuinfo=EPYC_AVX2, env={"TF_ENABLE_ONEDNN_OPTS": "1"})
    assert (plan.precision, plan.jit_compile, plan.steps_per_execution) == ("float32", False, 1)
    assert plan.cpu == "AMD EPYC 7B13" and not plan.native_bf16
    assert "oneDNN" in plan.describe()
    assert json.loads(json.dumps(plan.as_dict()))["precision"] == "float32"
    assert perf.plan_for("cpu", 58, cpuinfo=SAPPHIRE_RAPIDS, requested_steps=4).steps_per_execution == 4


def test_onednn_is_enabled_on_x86_unless_the_user_chose() -> None:
    env: dict[str, str] = {}
    assert perf.process_environment(env, machine="x86_64") == {"TF_ENABLE_ONEDNN_OPTS": "1"}
    assert env == {"TF_ENABLE_ONEDNN_OPTS": "1"}
    user = {"TF_ENABLE_ONEDNN_OPTS": "0"}
    assert perf.process_environment(user, machine="x86_64") == {} and user["TF_ENABLE_ONEDNN_OPTS"] == "0"
    arm: dict[str, str] = {}
    assert perf.process_environment(arm, machine="aarch64") == {} and arm == {}


def test_cpu_quota_from_cgroup_files(tmp_path: Path) -> None:
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "cpu.max").write_text("max 100000\n")
    assert perf.cpu_quota(str(v2)) is None
    (v2 / "cpu.max").write_text("150000 100000\n")
    assert perf.cpu_quota(str(v2)) == 1.5
    v1 = tmp_path / "v1" / "cpu"
    v1.mkdir(parents=True)
    (v1 / "cpu.cfs_quota_us").write_text("-1\n")
    (v1 / "cpu.cfs_period_us").write_text("100000\n")
    assert perf.cpu_quota(str(tmp_path / "v1")) is None
    (v1 / "cpu.cfs_quota_us").write_text("400000\n")
    assert perf.cpu_quota(str(tmp_path / "v1")) == 4.0
    assert perf.cpu_quota(str(tmp_path / "none")) is None
    assert perf.usable_cpus(1.5, affinity=16) == 2
    assert perf.usable_cpus(None, affinity=16) == 16
    assert perf.usable_cpus(32.0, affinity=8) == 8


def test_threads_follow_a_quota_and_are_left_alone_without_one() -> None:
    calls: list[tuple[str, int]] = []

    class Threading:
        def set_intra_op_parallelism_threads(self, n: int) -> None:
            calls.append(("intra", n))

        def set_inter_op_parallelism_threads(self, n: int) -> None:
            calls.append(("inter", n))

    class FakeTf:
        class config:  # shaped like tf.config
            threading = Threading()

    cores = os.cpu_count() or 1
    assert perf.configure_threads(FakeTf, quota=float(cores)) == {} and calls == []  # no smaller than the host
    if cores > 1:
        assert perf.configure_threads(FakeTf, quota=1.0) == {"intra_op": 1, "inter_op": 1}
        assert calls == [("intra", 1), ("inter", 1)]


# -- results, tables, plots -----------------------------------------------------------------------------------------


def _result(label: str = "cpu: test box", slow_first: float = 100.0) -> BenchResult:
    arms = []
    for batch, base_s, ours_s in ((256, 60.0, 30.0), (1024, 50.0, 25.0)):
        arms.append(
            ArmResult("baseline", batch, 60000, (slow_first, base_s, base_s * 1.2), (slow_first, base_s, base_s), 0.98)
        )
        examples = 60000 // batch * batch
        arms.append(ArmResult("ours", batch, examples, (slow_first, ours_s, ours_s * 1.2), (90.0, 24.0, 24.0), 0.981))
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
    rows = [line for line in text.splitlines() if line.startswith("| 256 ") or line.startswith("| 1024 ")]
    assert len(rows) == 8  # 2 batch sizes x (ours, plain fit, notebook GPU, notebook TPU)
    assert "| 256 | our trainer | 33.0 | 401 | 1815 | 0.9810 | 2.00x |" in text
    assert "| 256 | plain model.fit (numpy) | 66.0 | 1000 | 909 | 0.9800 |  |" in text
    assert f"| 1024 | {NOTEBOOK_TPU.label} | 2 | 37 |" in text
    assert f"| 256 | {NOTEBOOK_GPU.label} | 6 | 94 |" in text
    assert "TensorFlow 2.20.0, keras 3.15.1" in text


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


def test_plot_is_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    path = report.plot([_result(), _result("gpu: other")], tmp_path / "bench.png")
    assert path is not None and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_compare_command_writes_the_combined_table(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text(_result("cpu: A").to_json())
    (tmp_path / "b.json").write_text(_result("cpu: B").to_json())
    result = CliRunner().invoke(
        _app(), ["--compare", str(tmp_path / "a.json"), "--compare", str(tmp_path / "b.json"), "--out", str(tmp_path)]
    )
    assert result.exit_code == 0, result.output
    assert "cpu: A, our trainer" in result.output and "cpu: B, our trainer" in result.output
    assert "cpu: B, our trainer" in (tmp_path / "compare.md").read_text()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--epochs", "1"], "at least 2"),
        (["--batch-sizes", "256,x"], "positive integers"),
        (["--precision", "fp8"], "mixed_bfloat16"),
    ],
)
def test_bad_options_are_usage_errors(args: list[str], message: str) -> None:
    result = CliRunner().invoke(_app(), args)
    assert isinstance(result.exception, UsageError), result.output
    assert message in str(result.exception)


def _app() -> typer.Typer:
    app = typer.Typer()
    app.command()(bench)
    return app


# -- the real bench, on a slice of real MNIST -----------------------------------------------------------------------


@pytest.mark.slow
def test_bench_runs_both_trainers_at_every_batch_size(tmp_path: Path, mnist_npz: Path) -> None:
    out = tmp_path / "bench"
    args = ["--batch-sizes", "128,256", "--epochs", "2", "--examples", "1024", "--test-examples", "256"]
    result = CliRunner().invoke(_app(), [*args, "--data", str(mnist_npz), "--out", str(out)])
    assert result.exit_code == 0, f"{result.output}\n{result.exception!r}"
    assert {p.name for p in out.iterdir()} >= {"bench.md", "bench.json", "bench.png", "bench-logs"}
    data = json.loads((out / "bench.json").read_text())
    assert {(a["trainer"], a["batch_size"]) for a in data["arms"]} == {
        (t, b) for t in ("ours", "baseline") for b in (128, 256)
    }
    for arm in data["arms"]:
        assert len(arm["epoch_times_s"]) == 2 and len(arm["train_times_s"]) == 2
        assert all(t > 0 for t in arm["epoch_times_s"])
        assert 0.1 < arm["test_accuracy"] <= 1.0  # real data, real learning: far above chance after 2 epochs
    for row in data["summary"]:  # the reported epoch time is the second epoch's: the first one is left out
        arm = next(a for a in data["arms"] if (a["trainer"], a["batch_size"]) == (row["trainer"], row["batch_size"]))
        assert row["epoch_time_s"] == pytest.approx(statistics.median(arm["epoch_times_s"][1:]), abs=1e-3)
    ours = next(a for a in data["arms"] if a["trainer"] == "ours")
    assert ours["settings"]["precision"] == "float32" and ours["settings"]["steps_per_execution"] == 1
    baseline = next(a for a in data["arms"] if a["trainer"] == "baseline")
    assert baseline["examples_per_epoch"] == 1024 and baseline["settings"]["input"] == "numpy float32 arrays"
    table = (out / "bench.md").read_text()
    assert table in result.output  # printed as well as written
    assert "| 128 | our trainer |" in table and "| 256 | plain model.fit (numpy) |" in table
    assert data["test_examples"] == 256 and data["train_examples"] == 1024

    combined = CliRunner().invoke(_app(), ["--compare", str(out), "--compare", str(out / "bench.json")])
    assert combined.exit_code == 0, combined.output
    assert combined.output.count(", our trainer |") == 2


@pytest.mark.slow
def test_bench_in_one_process_as_on_a_tpu_host(tmp_path: Path, mnist_npz: Path) -> None:
    """The TPU schedule (both trainers in one process), exercised on CPU in a child process of its own."""
    script = textwrap.dedent(
        f"""
        from pathlib import Path
        from runner.bench.harness import BenchOptions, run_bench
        options = BenchOptions(batch_sizes=(128,), epochs=2, examples=512, test_examples=128,
                               data={str(mnist_npz)!r}, in_process=True)
        result = run_bench(options, Path({str(tmp_path)!r}), command="test")
        print("RESULT", result.to_json().replace("\\n", ""))
        """
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RUNNER_", "TF_"))}
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))
    result = BenchResult.from_json(line[len("RESULT ") :])
    assert "one process" in result.schedule
    assert {a.trainer for a in result.arms} == {"ours", "baseline"}
    assert all(len(a.epoch_times_s) == 2 for a in result.arms)
