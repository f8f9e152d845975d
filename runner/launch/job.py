"""What a job runs, in plain text, and the files its command names that the machine will not have.

The plan and the dry run show a job's command, working directory and environment as the container gets them (the
TPU VM's startup script carries the environment base64-encoded, which nobody can read at a glance). And a `command`
that names a file of yours (`python train.py`, `python -m pkg.train`, `./run.sh`) is checked where that can be
known before anything runs, never guessed:

    where the job runs                   its working directory   what is checked
    --local, as a process                where `runner submit`   the file is there (a module: there, or importable
                                         runs                    by this interpreter, which the job runs with)
    a trainer image without your code    /tmp (docker/Dockerfile) nothing of yours is there: a file, or a module
                                                                  that is a package or file here, is missing
    an image with your code              /workspace              `runner build --spec JOB --context DIR` checks DIR
    any other image                      its own WORKDIR         nothing: what it holds is unknown here

A command run by a shell is checked only when it is one simple command (no `cd`, `&&`, `$VAR`, globs, ...);
`python -c`, a program found on PATH and absolute paths outside /workspace are never checked.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from runner import contract
from runner.launch import code, deps, variants
from runner.plan.planner import Plan, PlannedSecret

IMAGE_WORKDIR = "/tmp"  # the trainer image's WORKDIR (docker/Dockerfile; a test holds them equal)
_SHELLS = {"sh", "bash", "dash", "zsh"}
_PYTHON = re.compile(r"^python(\d+(\.\d+)?)?$")
_PYTHON_ARG_OPTIONS = {"-W", "-X", "-Q"}  # options of python's that take the next argument
_SHELL_SYNTAX = re.compile(r"[;&|<>()$`*?\[\]{}~\\\n#!]")  # beyond one simple command: not checked


@dataclass(frozen=True)
class Named:
    """A file the command needs: a script (python's or a shell's argument), a program run by its path, or a
    module (python -m)."""

    kind: str  # "script" | "program" | "module"
    name: str

    def __str__(self) -> str:
        return f"module `{self.name}`" if self.kind == "module" else f"`{self.name}`"


def _words(command: list[str]) -> list[str] | None:
    """The command as the words it runs: a shell's `-c` string split as the shell would, when it is one simple
    command; None when it is more (cd, pipes, variables, globs) and cannot be read without running it."""
    if len(command) >= 3 and PurePosixPath(command[0]).name in _SHELLS and command[1] == "-c":
        if _SHELL_SYNTAX.search(command[2]):
            return None
        try:
            words = shlex.split(command[2])
        except ValueError:
            return None
        return words if not words or words[0] != "cd" else None
    return list(command)


def named_files(command: list[str]) -> list[Named]:
    """The file or module of yours that `command` runs, if one can be read from it."""
    words = _words(command)
    while words and ("=" in words[0] and not words[0].startswith("=")):  # VAR=value before the program
        words = words[1:]
    if words and PurePosixPath(words[0]).name == "env":
        words = words[1:]
        while words and "=" in words[0]:
            words = words[1:]
        if words and words[0].startswith("-"):
            return []
    if not words:
        return []
    program = PurePosixPath(words[0]).name
    if _PYTHON.match(program):
        i = 1
        while i < len(words):
            arg = words[i]
            if arg in ("-c", "-") or arg.startswith("-c"):
                return []  # code given inline or on stdin
            if arg == "-m":
                return [Named("module", words[i + 1])] if i + 1 < len(words) else []
            if arg.startswith("-m"):
                return [Named("module", arg[2:])]
            if arg in _PYTHON_ARG_OPTIONS:
                i += 2
            elif arg.startswith("-"):
                i += 1
            else:
                return [Named("script", arg)]
        return []
    if program in _SHELLS:
        args = words[1:]
        if args and args[0] == "-c":
            return named_files(words) if len(words) >= 3 else []
        return [Named("script", args[0])] if args and not args[0].startswith("-") else []
    if "/" in words[0]:
        return [Named("program", words[0])]
    return []  # found on PATH: the image's own


def working_directory(image: str, *, process: bool, cwd: Path) -> tuple[str, str]:
    """(the job's working directory, why), as the plan shows it."""
    if process:
        return str(cwd), "where `runner submit` runs: a --local process run"
    if code.has_code(image):
        return code.WORKSPACE, "your code, which `runner build --context` put in the image"
    if variants.variant_of(image) is not None:
        return IMAGE_WORKDIR, (
            f"the trainer image's, with no code of yours: `runner build --context DIR` adds DIR at {code.WORKSPACE}"
        )
    return "the image's WORKDIR", "an image the runner did not build: what it holds is unknown here"


def _user_module(top: str, where: Path) -> bool:
    return (where / top).is_dir() or (where / f"{top}.py").is_file()


def _relative(name: str) -> str | None:
    """`name` relative to the working directory of an image with code, or None for a path outside /workspace."""
    path = PurePosixPath(name)
    if not path.is_absolute():
        return str(path)
    try:
        return str(path.relative_to(code.WORKSPACE))
    except ValueError:
        return None


def missing_files(command: list[str] | None, image: str, *, process: bool, cwd: Path, env: dict[str, str]) -> list[str]:
    """Warnings for the plan: each file of yours the command names that will not be where it runs."""
    if not command:
        return []
    found: list[str] = []
    for named in named_files(command):
        if process:
            if named.kind == "module":
                top = named.name.split(".")[0]
                # PYTHONPATH in the job's env may add places this process does not search: not checked then.
                if "PYTHONPATH" in env or _user_module(top, cwd) or importlib.util.find_spec(top) is not None:
                    continue
                found.append(f"the command runs {named}, which neither {cwd} nor this Python's packages hold")
            elif not (cwd / named.name).exists():
                found.append(f"the command runs {named}, which is not in {cwd}, the working directory of a --local run")
        elif not code.has_code(image) and variants.variant_of(image) is not None:
            if named.kind == "module":
                top = named.name.split(".")[0]
                if top == "runner" or not _user_module(top, cwd):
                    continue  # the runner's own, or a package the image may have installed
            elif _relative(named.name) is None:
                continue  # an absolute path outside /workspace: the image's own files
            found.append(
                f"the command runs {named}, but image {image} carries no code of yours (its working directory is "
                f"{IMAGE_WORKDIR}): `runner build --context DIR` puts DIR at {code.WORKSPACE}, where the command runs"
            )
    return found


def context_problems(command: list[str] | None, context: Path) -> list[str]:
    """`runner build --spec JOB --context DIR`: each file of yours the job's command names that the image built
    from DIR will not contain (not in DIR, or left out by its .dockerignore)."""
    if not command:
        return []
    files = set(code.code_files(context))
    dirs = {str(PurePosixPath(f).parent) for f in files}
    found: list[str] = []
    for named in named_files(command):
        if named.kind == "module":
            top = named.name.split(".")[0]
            if f"{top}.py" in files or top in dirs or any(d.startswith(f"{top}/") for d in dirs):
                continue
            if not _user_module(top, context):
                continue  # not yours: a package the image may have installed
            found.append(f"the command runs {named}, but {context}/.dockerignore leaves `{top}` out of the image")
            continue
        relative = _relative(named.name)
        if relative is None or relative in files:
            continue
        why = "which .dockerignore leaves out" if (context / relative).exists() else "which is not there"
        found.append(f"the command runs {named}: {context}/{relative}, {why}, will not be in the image")
    return found


def env_text(env: dict[str, str], indent: str = "  ") -> list[str]:
    width = max((len(k) for k in env), default=0)
    return [f"{indent}{k:<{width}}  {v}" for k, v in sorted(env.items())]


def job_text(
    command: list[str] | None,
    env: dict[str, str],
    workdir: tuple[str, str],
    *,
    per_worker: str = "",
    secrets: tuple[PlannedSecret, ...] = (),
) -> str:
    """The dry run's "Job" section: command, working directory, environment and secrets (their references: a
    value is read only where the job runs), in plain text."""
    shown = shlex.join(command) if command else f"python -m runner.train  (the built-in trainer: {contract.TRAINING})"
    lines = [
        "Job (what runs on each worker)",
        f"  command      {shown}",
        f"  working dir  {workdir[0]}  ({workdir[1]})",
        "  environment" + (f"  ({per_worker})" if per_worker else ""),
        *env_text(env, "    "),
    ]
    if secrets:
        lines.append("  secrets  (references: the values are read where the job runs, and never shown)")
        lines += env_text({s.name: f"{s.source}  (as {s.mode})" for s in secrets}, "    ")
    return "\n".join(lines)


def secret_rows(plan: Plan) -> list[tuple[str, str]]:
    """The plan's row for each secret: where it is read from, by whom, and how the job gets it."""
    rows = []
    for planned in plan.secrets:
        if plan.cloud is not None:
            account = plan.spec.accelerator.service_account or "the project's Compute Engine default service account"
            reader = f"read on the VM as {account}"
        else:
            reader = "read with your Google credentials" if planned.secret_manager else "read from this machine"
        held = "the value" if planned.mode == "env" else "the path of a file with the value, on a tmpfs"
        rows.append((f"secret {planned.name}", f"{planned.source}  ({reader}; ${planned.name} holds {held})"))
    return rows


def env_row(env: dict[str, str]) -> str:
    """The plan's one line of the environment: every variable but the runner's own RUNNER_* ones (the spec's,
    and those the runner sets for the framework), and how many of those there are."""
    own = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(env.items()) if not k.startswith("RUNNER_"))
    ours = len([k for k in env if k.startswith("RUNNER_")])
    return (own + "; " if own else "") + f"{ours} RUNNER_* variables (the dry run lists them all)"


def plan_rows(plan: Plan, *, process: bool, cwd: Path | None = None) -> list[tuple[str, str]]:
    """The plan's rows of what the job runs: a command's working directory, the environment, and a warning for
    each file of yours the command names that will not be there."""
    spec, cwd = plan.spec, cwd or Path.cwd()
    rows = []
    if spec.command is not None:
        where, why = working_directory(spec.image, process=process, cwd=cwd)
        rows.append(("working dir", f"{where}  ({why})"))
    rows.append(("env", env_row(plan.env)))
    rows += secret_rows(plan)
    warnings = missing_files(spec.command, spec.image, process=process, cwd=cwd, env=spec.env)
    return rows + dependency_rows(plan, process=process) + [("warning", text) for text in warnings]


def dependency_rows(plan: Plan, *, process: bool) -> list[tuple[str, str]]:
    """What the plan says of the job's own requirements (runner.launch.deps): a process run's install, cached or to
    come (a conflict is an error here), or for a container, whether its image holds them."""
    requirements = deps.of_env(plan.env)
    if requirements is None:
        return []
    what = f"{requirements.source}: {requirements.shown()}"
    if process:
        install = deps.prepare(requirements)
        return [("dependencies", install.describe() if install else f"{what}: all in this Python already")]
    image = plan.spec.image
    if code.has_code(image):
        return [("dependencies", f"{what}: in the image, a layer `runner build --context` installed under your code")]
    if variants.variant_of(image) is not None:
        return [
            (
                "warning",
                f"{what}: image {image} carries no code of yours, nor these: `runner build --context DIR` installs "
                f"them in a layer of their own under DIR",
            )
        ]
    return [("dependencies", f"{what}: image {image} must hold them (an image the runner did not build)")]
