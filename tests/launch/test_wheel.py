"""The built wheel, installed into a fresh virtual environment, plans a TPU VM job: everything a submit reads (the
bootstrap template, the TPU catalog) travels in the wheel, not only in a checkout. The tests elsewhere use the
editable install, which would never notice a file left out of the package."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def wheel_env(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv with the wheel installed (no dependencies from the network: the dependencies of this environment are
    put on its path by a .pth file, which, unlike a site directory, does not bring this checkout's editable
    install along)."""
    root = tmp_path_factory.mktemp("wheel")
    dist = root / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(dist), str(REPO)],
        check=True,
        timeout=600,
    )
    (wheel,) = dist.glob("tpu_runner-*.whl")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    (site / "deps-of-the-test-env.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps", str(wheel)],
        check=True,
        timeout=600,
    )
    return venv


def test_the_installed_wheel_dry_runs_a_tpu_vm_job(wheel_env: Path, tmp_path: Path) -> None:
    spec = tmp_path / "mnist.yaml"
    spec.write_text((REPO / "jobs" / "mnist.yaml").read_text())
    where = subprocess.run(
        [str(wheel_env / "bin" / "python"), "-c", "import runner; print(runner.__file__)"],
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},  # a checkout on the path is not the wheel
        capture_output=True,
        text=True,
        check=True,
    )
    assert str(wheel_env) in where.stdout, f"runner came from {where.stdout}, not the wheel"
    argv = [str(wheel_env / "bin" / "runner"), "submit", str(spec), "--dry-run", "--project", "my-project"]
    result = subprocess.run(
        [*argv, "--storage", "gs://my-bucket/tpu-runner"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "CLOUDSDK_CONFIG": "/nonexistent"},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "startup-script (runs as root on every worker at boot" in result.stdout
    assert "DEADLINE=" in result.stdout and "v5litepod-8" in result.stdout
    assert "Traceback" not in result.stderr
