"""A job's own Python dependencies: found beside its code, checked against what the job already has, installed once.

    where the job runs                         what installs them                         cached by
    an image of `runner build --context DIR`   a layer of its own under the code (pip,    the engine's layer cache: the
                                               the base image's lock as constraints)      lines and the base image
    a --local process, an emulated VM's        pip --prefix into <cache>/<digest>, put    the digest: the lines, this
    container played as a process              first on PYTHONPATH                        Python and its packages

What they are: DIR/requirements.txt, else the [project] dependencies of DIR/pyproject.toml (not the runner's own
checkout's), where DIR is the build context, or for a run the directory `runner submit` runs in. Only a job with code
of its own has them: a `command`, or the built-in trainer with a module:function of yours. The plan carries them to
every worker in the job's environment (contract.REQUIREMENTS); there a process run installs them, an image holds them.

Your dependencies are added to the packages the job already has, never put over them: each of those is a constraint
at its version (the image variant's lock, docker/constraints.txt, or what this Python has installed), so nothing
silently replaces jax, tensorflow or keras. A line that asks for another version of one is refused before anything
runs (`conflicts`: exit 2, naming your line and the pinned version); one your packages ask for deeper down makes pip
fail its resolution, which `pip_conflict` turns into the same error with pip's own account. tensorflow-cpu and
tensorflow-tpu install the module `tensorflow` too: where one is there, `tensorflow` (or the other) is never
installed over it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import sysconfig
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from runner import contract
from runner.errors import BackendError, SpecError, UsageError

if TYPE_CHECKING:
    from packaging.requirements import Requirement

REQUIREMENTS_TXT = "requirements.txt"
PYPROJECT = "pyproject.toml"
RUNNER_PROJECT = "tpu-runner"  # the runner's own pyproject.toml: a job run from its checkout has no requirements
SCHEME = "tpu-runner-deps/1"  # bump when what the digest covers changes
# Options pip reads in a requirements file that leave what is installed to the requirement lines.
GLOBAL_OPTIONS = {
    "-i", "--index-url", "--extra-index-url", "--no-index", "-f", "--find-links", "--pre", "--prefer-binary",
    "--only-binary", "--no-binary", "--trusted-host",
}  # fmt: skip
REFUSED_OPTIONS = {
    "-r": "another file", "--requirement": "another file", "-c": "a constraints file", "--constraint":
    "a constraints file", "-e": "an editable install", "--editable": "an editable install",
}  # fmt: skip
# Distributions that install the same module: where one is there, the others would go over it.
SAME_MODULE = (("tensorflow", "tensorflow-cpu", "tensorflow-tpu", "tensorflow-gpu", "tensorflow-intel"),)
_COMMENT = re.compile(r"(^|\s+)#.*$")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class Line:
    number: int  # in the file, for messages
    text: str  # as pip reads it (continuations joined, comment dropped)
    name: str = ""  # canonical name of a requirement; "" for an option line


@dataclass(frozen=True)
class Requirements:
    source: str  # the file, as shown: requirements.txt or pyproject.toml
    lines: tuple[Line, ...]

    @property
    def requirements(self) -> list[Line]:
        return [line for line in self.lines if line.name]

    def shown(self) -> str:
        return ", ".join(line.text for line in self.requirements) or "no requirements"

    def encode(self) -> str:
        """The value of contract.REQUIREMENTS: one line of JSON (an environment variable carries no line break)."""
        return json.dumps({"source": self.source, "lines": [[line.number, line.text] for line in self.lines]})

    @classmethod
    def decode(cls, value: str) -> Requirements:
        try:
            data = json.loads(value)
            return parse(data["source"], [(int(n), str(text)) for n, text in data["lines"]])
        except (ValueError, KeyError, TypeError) as exc:
            raise UsageError(f"RUNNER_REQUIREMENTS is not what the runner writes ({exc})") from None


def _requirement(text: str) -> Requirement:
    from packaging.requirements import InvalidRequirement, Requirement

    try:
        return Requirement(text)
    except InvalidRequirement as exc:
        raise ValueError(str(exc)) from None


def parse(source: str, numbered: list[tuple[int, str]]) -> Requirements:
    """Requirements from (line number, text) pairs; every problem at once (SpecError, exit 2)."""
    lines, problems = [], []
    for number, text in numbered:
        where = f"{source} line {number}"
        if text.startswith("-"):
            option = text.split("=", 1)[0].split(None, 1)[0]
            if option in REFUSED_OPTIONS:
                problems.append(
                    f"{where}: `{text}` names {REFUSED_OPTIONS[option]}; list the requirements themselves here "
                    "(your own code needs no install: it runs from its working directory)"
                )
            elif option not in GLOBAL_OPTIONS:
                problems.append(f"{where}: `{text}`: the option {option} is not supported here")
            else:
                lines.append(Line(number, text))
            continue
        spec = re.split(r"\s+--", text, maxsplit=1)[0]  # per-requirement options (--hash=...) follow
        try:
            lines.append(Line(number, text, canonical(_requirement(spec).name)))
        except ValueError as exc:
            unnamed = re.match(r"^[./~]|^\w+\+|^\w+://", spec)  # a path or URL on its own
            hint = " (a path or URL needs a name: `pkg @ https://...`)" if unnamed else ""
            problems.append(f"{where}: `{spec}` is not a requirement: {exc}{hint}")
    if problems:
        raise SpecError(f"{source}: {len(problems)} problem(s)", problems)
    return Requirements(source, tuple(lines))


def read_requirements_txt(path: Path, shown: str | None = None) -> Requirements:
    numbered, pending, start = [], "", 0
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        text = raw if pending else raw.strip()
        start = start if pending else number
        if text.rstrip().endswith("\\"):
            pending += text.rstrip()[:-1]
            continue
        text = _COMMENT.sub("", pending + text).strip()
        pending = ""
        if text:
            numbered.append((start, " ".join(text.split())))
    return parse(shown or path.name, numbered)


def read_pyproject(path: Path, shown: str | None = None) -> Requirements | None:
    """[project] dependencies; None for the runner's own project, or one without them."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # Python 3.10: the copy pip vendors
        from pip._vendor import tomli as tomllib
    text = path.read_text()
    try:
        project = tomllib.loads(text).get("project", {})
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"{shown or path.name}: not TOML ({exc})") from None
    if project.get("name") == RUNNER_PROJECT or not project.get("dependencies"):
        return None
    rows = text.splitlines()

    def number(requirement: str) -> int:  # where the string stands in the file, for messages
        return next((i for i, row in enumerate(rows, 1) if f'"{requirement}"' in row or f"'{requirement}'" in row), 0)

    return parse(f"{shown or path.name} [project] dependencies", [(number(r), r) for r in project["dependencies"]])


def find(code_dir: Path) -> Requirements | None:
    """The requirements of the code in `code_dir`: requirements.txt, else pyproject.toml's; None when neither."""
    if (code_dir / REQUIREMENTS_TXT).is_file():
        return read_requirements_txt(code_dir / REQUIREMENTS_TXT)
    if (code_dir / PYPROJECT).is_file():
        return read_pyproject(code_dir / PYPROJECT)
    return None


def of_env(env: dict[str, str]) -> Requirements | None:
    """The job's requirements as the plan put them in its environment (contract.REQUIREMENTS), if it has any."""
    value = env.get(contract.REQUIREMENTS)
    return Requirements.decode(value) if value else None


# -- what the job has already -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pins:
    """The packages a job has before its own: {canonical name: version}, and where they are, in words."""

    versions: dict[str, str]
    where: str  # "the cpu image", "this Python"

    def constraints(self) -> list[str]:
        """pip constraints: each package at its version, and a distribution that would install a module one of
        them holds, refused by a version no release has (pip's error then names it)."""
        lines = [f"{name}=={version}" for name, version in sorted(self.versions.items())]
        for family in SAME_MODULE:
            if held := [name for name in family if name in self.versions]:
                lines += [f"{name}===provided.by.{held[0]}" for name in family if name not in self.versions]
        return lines


def lock_pins(lines: list[str], where: str) -> Pins:
    """Pins from name==version lines (the variant's part of docker/constraints.txt)."""
    return Pins({canonical(n): v.strip() for n, _, v in (line.partition("==") for line in lines) if v}, where)


def installed_pins(where: str = "this Python") -> Pins:
    """What this interpreter has installed (on its sys.path), less what the dependency cache adds."""
    from importlib import metadata

    cache = str(cache_root())
    versions: dict[str, str] = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"] if dist.metadata else None
        if not name or str(dist.locate_file("")).startswith(cache):
            continue
        versions.setdefault(canonical(name), dist.version)  # the first on sys.path is the one imported
    return Pins(versions, where)


def _held(name: str, pins: Pins) -> tuple[str, str] | None:
    """(distribution, version) the job has of `name`, or of one that installs the same module."""
    if name in pins.versions:
        return name, pins.versions[name]
    family = next((f for f in SAME_MODULE if name in f), ())
    return next(((other, pins.versions[other]) for other in family if other in pins.versions), None)


def _applies(line: Line) -> Requirement | None:
    """The line's requirement, if its environment marker holds here."""
    req = _requirement(re.split(r"\s+--", line.text, maxsplit=1)[0])
    return req if req.marker is None or req.marker.evaluate() else None


def conflicts(reqs: Requirements, pins: Pins) -> list[str]:
    """Each requirement that would replace a package the job has, naming both."""
    found = []
    for line in reqs.requirements:
        req = _applies(line)
        held = _held(line.name, pins)
        if req is None or held is None:
            continue
        dist, version = held
        what = f"{pins.where} has {dist}=={version}"
        if req.url:
            found.append(f"{reqs.source} line {line.number}: `{line.text}` would replace it from a URL; {what}")
        elif not req.specifier.contains(version, prereleases=True):
            found.append(f"{reqs.source} line {line.number}: `{line.text}` conflicts: {what}")
        elif dist != line.name and req.extras:
            found.append(f"{reqs.source} line {line.number}: `{line.text}` would install another build: {what}")
    return found


def check(reqs: Requirements, pins: Pins) -> None:
    if found := conflicts(reqs, pins):
        raise SpecError(
            f"{reqs.source}: {len(found)} requirement(s) conflict with the packages the job has; your dependencies "
            "are added to those, never installed over them",
            found,
            hint="loosen or drop those lines: the packages the job has keep their versions (an image's are its "
            "variant's lock, docker/constraints.txt)",
        )


def missing(reqs: Requirements, pins: Pins) -> list[Line]:
    """The lines pip has to act on: requirements the job does not have yet (or whose extras it may not), and the
    options; none when every requirement is there already."""
    todo = []
    for line in reqs.requirements:
        req = _applies(line)
        held = _held(line.name, pins)
        if req is None or (held is not None and not req.extras and not req.url):
            continue  # not for this environment, or there at a version it accepts (conflicts: checked apart)
        if held is not None and held[0] != line.name:
            continue  # tensorflow, where tensorflow-cpu is: the module is there
        todo.append(line)
    return [line for line in reqs.lines if not line.name] + todo if todo else []


def pip_conflict(output: str) -> str | None:
    """pip's account of a failed resolution ("The conflict is caused by: ..."), or None if it failed otherwise."""
    if "ResolutionImpossible" not in output and "conflicting dependencies" not in output:
        return None
    lines = output.splitlines()
    start = next((i for i, line in enumerate(lines) if "The conflict is caused by" in line), None)
    if start is None:
        return next((line.strip() for line in lines if "ERROR:" in line), "pip found no versions that fit together")
    cause = []
    for line in lines[start + 1 :]:
        if not line.strip():
            break
        cause.append(line.strip())
    return "; ".join(cause)


# -- the process-mode cache -------------------------------------------------------------------------------------

CACHE_ENV = "RUNNER_DEPS_DIR"
RECORD = "installed.json"


def cache_root() -> Path:
    """$RUNNER_DEPS_DIR, else $XDG_CACHE_HOME/tpu-runner/deps, else ~/.cache/tpu-runner/deps."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tpu-runner" / "deps"


def digest(lines: list[Line], pins: Pins) -> str:
    """What an install depends on: the lines pip reads, the constraints, this interpreter and platform."""
    content = {
        "scheme": SCHEME,
        "python": [sys.implementation.cache_tag, sysconfig.get_platform()],
        "lines": sorted(line.text for line in lines),
        "constraints": pins.constraints(),
    }
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class Install:
    """The requirements a process run installs, and where: <cache>/<digest> (cached once it holds RECORD)."""

    requirements: Requirements
    lines: tuple[Line, ...]  # what pip reads
    pins: Pins = field(repr=False)
    directory: Path

    @property
    def cached(self) -> bool:
        return (self.directory / RECORD).is_file()

    def site_dirs(self, prefix: Path | None = None) -> list[str]:
        base = str(prefix or self.directory)
        paths = sysconfig.get_paths(vars={"base": base, "platbase": base})
        return list(dict.fromkeys([paths["purelib"], paths["platlib"]]))

    def installed(self) -> list[str]:
        """name==version of what the cache holds (empty before it is installed)."""
        try:
            return list(json.loads((self.directory / RECORD).read_text())["installed"])
        except (OSError, ValueError, KeyError):
            return []

    def env(self, env: dict[str, str]) -> dict[str, str]:
        """`env` (the job's, over this process's) with the cache first on PYTHONPATH and its scripts on PATH."""
        pythonpath = env.get("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
        path = env.get("PATH", os.environ.get("PATH", os.defpath)).split(os.pathsep)
        path.insert(1 if path else 0, str(self.directory / "bin"))  # after the interpreter's own directory
        return {
            **env,
            "PYTHONPATH": os.pathsep.join([*self.site_dirs(), *([pythonpath] if pythonpath else [])]),
            "PATH": os.pathsep.join(path),
        }

    def describe(self) -> str:
        """The plan's words: what, and from where."""
        wanted = ", ".join(line.text for line in self.lines if line.name)
        there = [line.text for line in self.requirements.requirements if line not in self.lines]
        already = f"; {', '.join(there)}: in {self.pins.where} already" if there else ""
        if self.cached:
            held = ", ".join(self.installed())
            return f"{self.requirements.source}: {wanted}: cached in {self.directory} ({held}){already}"
        return (
            f"{self.requirements.source}: {wanted}: to install with pip into {self.directory}, once (later runs and "
            f"this machine's emulated VMs reuse it), beside {self.pins.where}'s {len(self.pins.versions)} packages, "
            f"never over them{already}"
        )


def prepare(reqs: Requirements, pins: Pins | None = None) -> Install | None:
    """What a process run needs installed for `reqs` (SpecError on a conflict); None when it has them all."""
    pins = pins or installed_pins()
    check(reqs, pins)
    lines = missing(reqs, pins)
    if not lines:
        return None
    return Install(reqs, tuple(lines), pins, cache_root() / digest(lines, pins)[:16])


def ensure(install: Install, say: Callable[[str], None] = print) -> None:
    """Install into the cache unless it holds the set already: one pip run into a directory of its own, renamed
    into place once complete (a half install is never taken for a cached one), under a lock, so workers and
    emulated VMs that start together install once and the others reuse it."""
    import fcntl
    import shutil
    import subprocess
    import tempfile
    import time

    root = install.directory.parent
    root.mkdir(parents=True, exist_ok=True)
    with (root / f"{install.directory.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if install.cached:
            return
        wanted = ", ".join(line.text for line in install.lines if line.name)
        say(f"installing {install.requirements.source}'s {wanted} with pip into {install.directory}")
        started = time.monotonic()
        with tempfile.TemporaryDirectory(prefix=f".{install.directory.name}-", dir=root) as tmp:
            work = Path(tmp)
            (work / "requirements.txt").write_text("".join(f"{line.text}\n" for line in install.lines))
            (work / "constraints.txt").write_text("".join(f"{line}\n" for line in install.pins.constraints()))
            prefix = work / "prefix"
            argv = [
                sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "--no-input",
                "--no-warn-script-location", "--no-compile", "--prefix", str(prefix),
                "--constraint", str(work / "constraints.txt"), "--requirement", str(work / "requirements.txt"),
                "--report", str(work / "report.json"),
            ]  # fmt: skip
            result = subprocess.run(argv, capture_output=True, text=True, env=_pip_env(), check=False)
            if result.returncode != 0:
                output = result.stdout + result.stderr
                if cause := pip_conflict(output):
                    raise SpecError(
                        f"{install.requirements.source}: pip found no versions that fit the packages the job has "
                        "(your dependencies are added to them, never installed over them)",
                        [cause],
                        hint="loosen the requirement that pulls in the conflicting version, or pin one that fits",
                    )
                tail = "\n".join(output.strip().splitlines()[-8:])
                raise BackendError(f"pip could not install {install.requirements.source}'s requirements:\n{tail}")
            report = json.loads((work / "report.json").read_text())
            installed = [f"{i['metadata']['name']}=={i['metadata']['version']}" for i in report.get("install", [])]
            seconds = round(time.monotonic() - started, 1)
            record = {"installed": installed, "lines": [line.text for line in install.lines], "seconds": seconds}
            (prefix / RECORD).write_text(json.dumps(record, indent=1) + "\n")
            if install.directory.exists():  # a leftover without its record: not a cache
                shutil.rmtree(install.directory)
            prefix.rename(install.directory)
        say(f"installed {', '.join(installed) or 'nothing new'} in {seconds:.1f} s (reused by later runs)")


def _pip_env() -> dict[str, str]:
    """This process's environment for pip, less what would send the install elsewhere or hide what is missing:
    pip's own target options, and a cached set on PYTHONPATH (pip would take its packages as installed)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PIP_TARGET", "PIP_PREFIX", "PIP_USER", "PIP_ROOT")}
    cache = str(cache_root())
    kept = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and not p.startswith(cache)]
    env["PYTHONPATH"] = os.pathsep.join(kept)
    return env
