"""What a job runs, shown in plain text by the plan and the dry run, and the warning for a file of yours that the
command names and the machine will not have: never for what cannot be known (`python -c`, a program on PATH, an
image the runner did not build, a shell line with more than one command)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from runner.cli import app
from runner.launch import job
from runner.launch.job import Named, context_problems, missing_files, named_files
from tests.cli.test_cli import write_job
from tests.conftest import REPO

TRAINER = "us-central1-docker.pkg.dev/p/tpu-runner/trainer-tpu:0.1.0-0123456789abcdef"
WITH_CODE = TRAINER + "-code-0123456789ab"
SH = ["/bin/sh", "-c"]


@pytest.mark.parametrize(
    ("command", "named"),
    [
        (["python", "train.py", "--epochs", "3"], [Named("script", "train.py")]),
        ([*SH, "python3 -u -W ignore src/train.py"], [Named("script", "src/train.py")]),
        ([*SH, "EPOCHS=3 python -m pkg.train --fast"], [Named("module", "pkg.train")]),
        (["/usr/bin/env", "FOO=1", "python3.11", "-mpkg"], [Named("module", "pkg")]),
        (["bash", "run.sh"], [Named("script", "run.sh")]),
        (["./run.sh"], [Named("program", "./run.sh")]),
        (["python", "-c", "print(1)"], []),
        ([*SH, "python -c 'import train'"], []),
        (["python", "-"], []),
        (["nvidia-smi"], []),  # on PATH: the image's own
        ([*SH, "cd src && python train.py"], []),  # more than one command: not read
        ([*SH, "python $SCRIPT"], []),
        (["bash", "-c"], []),
        (["python"], []),
    ],
)
def test_the_file_a_command_names(command: list[str], named: list[Named]) -> None:
    assert named_files(command) == named


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    (root / "pkg").mkdir(parents=True)
    (root / "train.py").write_text("print('training')\n")
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "train.py").write_text("print('training')\n")
    return root


def test_a_local_process_run_looks_where_it_runs(project: Path) -> None:
    def check(*command: str, env: dict[str, str] | None = None) -> list[str]:
        return missing_files(list(command), TRAINER, process=True, cwd=project, env=env or {})

    assert check("python", "train.py") == [] and check("python", "-m", "pkg.train") == []
    assert check("python", "-m", "json.tool") == [] and check("python", "-m", "runner.train") == []
    assert check("python", "-c", "import missing") == []
    assert check("python", "nope.py") == [
        f"the command runs `nope.py`, which is not in {project}, the working directory of a --local run"
    ]
    assert check("python", "-m", "nopkg.train") == [
        f"the command runs module `nopkg.train`, which neither {project} nor this Python's packages hold"
    ]
    assert check("python", "-m", "nopkg", env={"PYTHONPATH": "/elsewhere"}) == []  # not this process's path


def test_an_image_without_your_code(project: Path, tmp_path: Path) -> None:
    def check(command: list[str], image: str = TRAINER, cwd: Path = project) -> list[str]:
        return missing_files(command, image, process=False, cwd=cwd, env={})

    (warning,) = check(["python", "train.py"])
    assert warning.startswith(f"the command runs `train.py`, but image {TRAINER} carries no code of yours")
    assert "`runner build --context DIR`" in warning
    assert len(check([*SH, "python -m pkg.train"])) == 1  # a package of yours, here beside the spec
    assert len(check(["python", "/workspace/train.py"])) == 1
    assert check(["python", "-m", "pkg.train"], cwd=tmp_path) == []  # not yours here: may be installed
    assert check(["python", "-m", "runner.train"]) == [] and check(["python", "/opt/app/x.py"]) == []
    assert check(["python", "train.py"], image=WITH_CODE) == []  # /workspace: `runner build` checks it
    assert check(["python", "train.py"], image="docker.io/me/mine:1") == []  # not ours: its contents are unknown


def test_runner_build_checks_the_context_against_the_command(project: Path, tmp_path: Path) -> None:
    assert context_problems(["python", "train.py"], project) == []
    assert context_problems(["python", "-m", "pkg.train"], project) == []
    assert context_problems(["python", "-m", "numpy"], project) == []  # not the project's
    (project / ".dockerignore").write_text("train.py\npkg\n")
    assert context_problems(["python", "train.py"], project) == [
        f"the command runs `train.py`: {project}/train.py, which .dockerignore leaves out, will not be in the image"
    ]
    assert context_problems(["python", "-m", "pkg.train"], project) == [
        f"the command runs module `pkg.train`, but {project}/.dockerignore leaves `pkg` out of the image"
    ]
    assert context_problems(["python", "/workspace/other.py"], project) == [
        f"the command runs `/workspace/other.py`: {project}/other.py, which is not there, will not be in the image"
    ]
    spec = write_job(
        tmp_path,
        f"""\
        name: mine
        image: {TRAINER}
        command: python train.py
        storage: gs://my-bucket/runs
        """,
    )
    shown = CliRunner().invoke(
        app, ["build", "--spec", str(spec), "--context", str(project), "--project", "p-123456", "--print-ref"]
    )
    assert shown.exit_code == 0, shown.output
    assert "warning: the command runs `train.py`" in shown.output and "-code-" in shown.output


def test_the_trainer_images_working_directory_is_the_dockerfiles() -> None:
    workdirs = re.findall(r"^WORKDIR (\S+)$", (REPO / "docker" / "Dockerfile").read_text(), re.M)
    assert workdirs == [job.IMAGE_WORKDIR]


def test_the_local_dry_run_shows_command_directory_and_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    spec = write_job(
        tmp_path,
        f"""\
        name: mine
        image: trainer:test
        command: python train.py --epochs 3
        env: {{EPOCHS: 3, NOTE: "two words"}}
        storage: {tmp_path / "store"}
        """,
    )
    out = CliRunner().invoke(app, ["submit", str(spec), "--local", "--process", "--dry-run"]).output
    rows = {line[:15].strip(): line[15:] for line in out.splitlines() if line[:1].isalpha() and line[14:15] == " "}
    assert rows["working dir"].startswith(f"{tmp_path}  (where `runner submit` runs")
    assert rows["env"].startswith("EPOCHS=3 NOTE='two words'; ")
    assert rows["warning"] == (
        f"the command runs `train.py`, which is not in {tmp_path}, the working directory of a --local run"
    )
    section = out[out.index("Job (what runs on each worker)") :]
    assert "  command      /bin/sh -c 'python train.py --epochs 3'\n" in section  # a string runs in a shell
    assert f"  working dir  {tmp_path}  (" in section
    assert re.search(r"^    EPOCHS +3$", section, re.M) and re.search(r"^    NOTE +two words$", section, re.M)
    assert re.search(r'^    RUNNER_COMMAND +\["/bin/sh", "-c", "python train.py --epochs 3"\]$', section, re.M)
    (tmp_path / "train.py").write_text("print(1)\n")
    again = CliRunner().invoke(app, ["submit", str(spec), "--local", "--process", "--dry-run"]).output
    assert "warning" not in again
