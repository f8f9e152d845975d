"""What pip installs into the trainer image, per variant, and into `make install`'s virtual environment, derived from
pyproject.toml (the one source of versions).

    python docker/requirements.py requirements --variant tpu --out DIR   # DIR/requirements.txt, no-deps.txt,
                                                                         # constraints.txt (this variant's pins)
    python docker/requirements.py local --out DIR                        # the train extra for this machine
    python docker/requirements.py slim --site-packages DIR               # after the install: what no job loads
    python docker/requirements.py check --no-deps DIR/no-deps.txt --constraints DIR/constraints.txt   # then
    python docker/requirements.py lock                                   # rewrite docker/constraints.txt

The image gets the runner's runtime dependencies but the provisioning clients (PROVISIONING_ONLY), and its `train`
extra, with one change per variant:

    cpu      tensorflow-cpu==X              the same TensorFlow without the CUDA kernels: 259 MB of wheel, not 621
    gpu      tensorflow[and-cuda]==X        as pyproject.toml says, with NVIDIA's CUDA/cuDNN wheels (host: driver)
    tpu      tensorflow-tpu==X + libtpu     Cloud TPU's TensorFlow build, installed with the libtpu-tf-releases
                                            find-links as the Cloud TPU docs do; libtpu pinned (see LIBTPU below)
    jax-tpu  jax[tpu], no TensorFlow        JAX with the libtpu its release pins, jax-releases find-links
    jax-gpu  jax[cuda12], no TensorFlow     JAX with NVIDIA's CUDA 12 wheels (host: driver >= 525.60.13)

The TensorFlow variants leave out the extra's jax[cpu] and gcsfs; the JAX variants leave out tensorflow and tf-keras,
and keep Keras 3, numpy, gcsfs (Orbax's gs:// paths without TensorFlow) and the control plane's packages
(google-cloud-storage for the mirror, pydantic, ...).

tf-keras requires the package `tensorflow`, which would install the full build over tensorflow-cpu or
tensorflow-tpu (all ship the `tensorflow` module); on those variants it is installed with --no-deps, and `check`
runs `pip check` allowing exactly that one missing requirement.

`local` gives `make install` the train extra as pyproject.toml writes it on a machine with an NVIDIA GPU, and with
the cpu variant's TensorFlow (tf-keras --no-deps too) on one without.

`lock` resolves every variant on this machine (Linux x86_64, the image's Python minor version) and writes the exact
set of packages each one installs into docker/constraints.txt: lines before the first `# [...]` header are installed
by every variant, a header names the variants that install the lines under it. `requirements` hands the build its
variant's lines, which the image applies with pip --constraint, and `check` verifies after the install that the
image holds exactly those versions and nothing unlocked (so "no TensorFlow in the JAX images" holds in the image,
not only in the lock), less the two packages `slim` removes because no job loads them (NOT_AT_RUN_TIME). The
image keeps its variant's files, and `runner build` runs `check` again in the finished image. The same
pyproject.toml gives the same packages on every machine and every day.
Standard library and pip only: it runs inside the image.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the copy pip vendors
    from pip._vendor import tomli as tomllib  # type: ignore[no-redef]

VARIANTS = ("cpu", "gpu", "tpu", "jax-tpu", "jax-gpu")
TENSORFLOW_VARIANTS = ("cpu", "gpu", "tpu")
JAX_EXTRA = {"jax-tpu": "tpu", "jax-gpu": "cuda12"}  # jax[cuda12]: the CUDA the TensorFlow gpu image has too
TENSORFLOW_ONLY = ("tensorflow", "tf-keras")  # train-extra entries the JAX variants leave out
# Train-extra entries the TensorFlow variants leave out: JAX itself, and gcsfs, Orbax's way to gs:// without
# TensorFlow (etils.epath takes tf.io.gfile where TensorFlow is installed).
JAX_ONLY = ("jax", "gcsfs")
# The control plane's provisioning clients: nothing in the image creates or deletes a machine (the supervisor talks
# to Cloud Storage; a VM's self-delete is the bootstrap's curl on the host), and google-cloud-compute alone is 70 MB.
# Nor does it read a secret (the pre-flight and a --local run's reads are the runner's, a VM's the bootstrap's curl),
# or manage a cluster: a GKE run's JobSet and node pools are the runner's, from outside the pod.
PROVISIONING_ONLY = (
    "google-cloud-tpu",
    "google-cloud-compute",
    "google-cloud-secret-manager",
    "google-cloud-container",
    "kubernetes",
)
# tensorflow-tpu 2.20.0 declares libtpu~=0.0.14; left open, pip takes the newest 0.0.x on PyPI, a build made for
# JAX months later. The floor of that range is the build the wheel was made against. (jax[tpu] pins its own.)
LIBTPU = "0.0.14"
LIBTPU_FIND_LINKS = "https://storage.googleapis.com/libtpu-tf-releases/index.html"
# JAX's install docs for Cloud TPU: `pip install jax[tpu] -f .../libtpu_releases.html`. libtpu is on PyPI now too
# (the lock resolves from there), but PyPI drops old releases; this index keeps every libtpu.
JAX_LIBTPU_FIND_LINKS = "https://storage.googleapis.com/jax-releases/libtpu_releases.html"
# Installed by the base image, not by the lock: allowed in the image at whatever version it brings.
BASE_PACKAGES = ("pip", "setuptools", "wheel")
# Installed as dependencies, then removed by `slim`: nothing in a training job loads them. TensorFlow's wheel
# requires libclang (its op-code generator's C parser, 62 MB); tensorboard requires tensorboard-data-server, the
# binary behind TensorBoard's web UI (20 MB): the image writes TensorBoard logs, it never serves them.
NOT_AT_RUN_TIME = ("libclang", "tensorboard-data-server")
# Directories no job needs: TensorFlow's C++ headers (for compiling custom ops) and packages' own test suites.
BUILD_ONLY_DIRS = ("tensorflow/include",)
TEST_DIRS = ("tests",)
# Packages whose shared libraries `slim` strips: TensorFlow's, built by Bazel with their symbol tables left in (256
# MB of the cpu image). Wheels repaired by auditwheel (numpy's, Pillow's, ...) are left alone: patchelf edited them,
# and a stripped copy fails to load ("ELF load command address/offset not page-aligned"); so are the vendors'
# builds that cannot be run here (libtpu, NVIDIA's CUDA wheels).
STRIPPED = ("tensorflow",)
_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?\s*(.*)$")
_SECTION = re.compile(r"^#\s*\[([a-z0-9 -]+)\]\s*$")
HERE = Path(__file__).resolve().parent


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _split(requirement: str) -> tuple[str, str]:
    match = _NAME.match(requirement)
    if not match:
        raise ValueError(f"cannot read requirement {requirement!r}")
    return _canonical(match.group(1)), match.group(3)


def requirements(pyproject: Path, variant: str, libtpu: str = LIBTPU) -> tuple[list[str], list[str]]:
    """(requirements, no-deps requirements) for one variant: pip lines, options included."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; one of {', '.join(VARIANTS)}")
    project = tomllib.loads(pyproject.read_text())["project"]
    lines = [req for req in project["dependencies"] if _split(req)[0] not in PROVISIONING_ONLY]
    no_deps: list[str] = []
    for req in project["optional-dependencies"]["train"]:
        name, rest = _split(req)
        if variant in JAX_EXTRA:
            if name in TENSORFLOW_ONLY:
                continue
            if name == "jax":
                if variant == "jax-tpu":
                    lines.append(f"--find-links {JAX_LIBTPU_FIND_LINKS}")
                req = f"jax[{JAX_EXTRA[variant]}]{rest}"
        elif name in JAX_ONLY:
            continue  # the TensorFlow images stay TensorFlow's
        elif variant == "cpu" and name in TENSORFLOW_ONLY:
            _cpu_tensorflow(name, req, lines, no_deps)
            continue
        elif name == "tensorflow" and variant == "gpu":
            req = f"tensorflow[and-cuda]{rest}"
        elif name == "tensorflow" and variant == "tpu":
            lines += [f"--find-links {LIBTPU_FIND_LINKS}", f"libtpu=={libtpu}"]
            req = f"tensorflow-tpu{rest}"
        elif name == "tf-keras" and variant == "tpu":
            no_deps.append(req)
            continue
        lines.append(req)
    return lines, no_deps


def _cpu_tensorflow(name: str, req: str, lines: list[str], no_deps: list[str]) -> None:
    """TensorFlow without its CUDA kernels (tensorflow-cpu: 259 MB of wheel, not 621), and tf-keras without the
    dependency on `tensorflow` that would install the full build over it."""
    if name == "tensorflow":
        lines.append(f"tensorflow-cpu{_split(req)[1]}")
    else:
        no_deps.append(req)


def has_nvidia_gpu() -> bool:
    """An NVIDIA driver is loaded (its /proc entry), or its nvidia-smi is installed."""
    return Path("/proc/driver/nvidia/version").exists() or shutil.which("nvidia-smi") is not None


def local(pyproject: Path, gpu: bool) -> tuple[list[str], list[str]]:
    """(requirements, no-deps requirements) of the train extra for `make install`'s virtual environment: as
    pyproject.toml writes it where there is an NVIDIA GPU, else with the cpu image's TensorFlow build. The full build
    brings CUDA kernels a machine without a GPU never runs: 0.5 CPU s more to import (3.9-4.3 against 3.2-3.7 here),
    and an error line on every start (`failed call to cuInit`)."""
    lines: list[str] = []
    no_deps: list[str] = []
    for req in tomllib.loads(pyproject.read_text())["project"]["optional-dependencies"]["train"]:
        name = _split(req)[0]
        if not gpu and name in TENSORFLOW_ONLY:
            _cpu_tensorflow(name, req, lines, no_deps)
        else:
            lines.append(req)
    return lines, no_deps


def constraints(text: str, variant: str) -> list[str]:
    """The lines of a lock (docker/constraints.txt) that `variant` installs: name==version, sorted by name."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; one of {', '.join(VARIANTS)}")
    found, applies = [], True
    for raw in text.splitlines():
        line = raw.strip()
        if section := _SECTION.match(line):
            applies = variant in section.group(1).split()
        elif line and not line.startswith("#") and applies:
            found.append(line)
    return sorted(found, key=lambda line: _split(line)[0])


def pins(lines: list[str]) -> dict[str, str]:
    """{canonical name: version} of name==version lines."""
    return {_split(line)[0]: line.split("==", 1)[1].strip() for line in lines}


def write(out: Path, pyproject: Path, variant: str, libtpu: str, lock: Path) -> None:
    reqs, no_deps = requirements(pyproject, variant, libtpu)
    pinned = constraints(lock.read_text(), variant)
    if variant == "tpu":  # --build-arg LIBTPU_VERSION=... replaces the locked libtpu (it has no dependencies)
        pinned = [line if _split(line)[0] != "libtpu" else f"libtpu=={libtpu}" for line in pinned]
    _write(out, requirements=reqs, no_deps=no_deps, constraints=pinned)


def _write(out: Path, **files: list[str]) -> None:
    """out/<name with - for _>.txt for each list of lines."""
    out.mkdir(parents=True, exist_ok=True)
    for name, lines in files.items():
        (out / f"{name.replace('_', '-')}.txt").write_text("".join(f"{line}\n" for line in lines))


def _resolve(
    lines: list[str], constraints: list[str], *, no_deps: bool = False
) -> tuple[dict[str, str], dict[str, list[str]]]:
    """pip's choice for `lines` under `constraints`: {name: version} and {name: Requires-Dist lines}."""
    with tempfile.TemporaryDirectory() as tmp:
        req, con = Path(tmp, "req.txt"), Path(tmp, "con.txt")
        req.write_text("\n".join(lines) + "\n")
        con.write_text("\n".join(constraints) + "\n")
        # Short timeouts: an unreachable find-links host (Google's buckets offline) costs seconds, not minutes.
        argv = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet"]
        argv += ["--timeout", "30", "--retries", "1"] + (["--no-deps"] if no_deps else [])
        argv += ["--report", "-", "-r", str(req), "-c", str(con)]
        report = json.loads(subprocess.run(argv, check=True, capture_output=True, text=True).stdout)
    dists = [item["metadata"] for item in report["install"]]
    return (
        {_canonical(m["name"]): m["version"] for m in dists},
        {_canonical(m["name"]): m.get("requires_dist", []) for m in dists},
    )


def floors(requires: list[str], extra: str) -> list[str]:
    """name==lower-bound for each requirement of `extra`: the versions a framework was built and tested with."""
    pins = []
    for line in requires:
        if f'extra == "{extra}"' not in line:
            continue
        name, rest = _split(line.split(";")[0])
        bound = re.search(r"(?:>=|~=)\s*([0-9][^,;\s]*)", rest)
        if bound:
            pins.append(f"{name}=={bound.group(1)}")
    return pins


def own_runtime(name: str) -> bool:
    """An accelerator runtime: each variant resolves its own (tensorflow-tpu's libtpu is not jax[tpu]'s, and
    TensorFlow's CUDA is not the one JAX asks for); everything else is shared across variants."""
    return name == "libtpu" or name.startswith(("nvidia-", "jax-cuda"))


def lock(pyproject: Path, target: Path) -> None:
    """Resolve every variant in VARIANTS order, each under the versions the earlier ones chose, so all variants
    share one set of versions (numpy, Keras, google-cloud-storage, ...) except their accelerator runtimes. The
    gpu variant's CUDA wheels are pinned to the lower bounds of TensorFlow's `and-cuda` extra (the CUDA/cuDNN it
    was built with), as libtpu is to the floor tensorflow-tpu declares, instead of whatever is newest on the day of
    the lock; jax-tpu gets the libtpu its jax pins, jax-gpu the CUDA 12 wheels pip chooses for jax[cuda12] (JAX
    checks at start-up that they are new enough)."""
    shared: dict[str, str] = {}
    installs: dict[str, dict[str, str]] = {}
    tensorflow_requires: list[str] = []
    for variant in VARIANTS:
        reqs, no_deps = requirements(pyproject, variant)
        pinned = [f"{k}=={v}" for k, v in sorted(shared.items())]
        if variant == "gpu":  # tensorflow-cpu, resolved first, carries the same Requires-Dist as tensorflow
            pinned += floors(tensorflow_requires, "and-cuda")
        resolved, requires = _resolve(reqs, pinned)
        if no_deps:
            extra, _ = _resolve(no_deps, pinned, no_deps=True)
            resolved.update(extra)
        if variant == "cpu":
            tensorflow_requires = requires["tensorflow-cpu"]
        installs[variant] = resolved
        shared.update({k: v for k, v in resolved.items() if not own_runtime(k)})
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    header = (
        f"# Exact versions for the trainer image, per variant ({', '.join(VARIANTS)}): what each one installs.\n"
        f"# Generated by `python docker/requirements.py lock` (`make image-lock`) on Linux x86_64, Python {py}.\n"
        "# Regenerate after changing dependencies in pyproject.toml; do not edit by hand.\n"
        "# Lines before the first [section] are installed by every variant; a section names the variants that\n"
        "# install the lines under it. The image build applies its variant's lines with pip --constraint.\n"
    )
    target.write_text(header + render(installs))


def render(installs: dict[str, dict[str, str]]) -> str:
    """The lock's body: each name==version under the set of variants that install it (none: every variant)."""
    groups: dict[tuple[str, ...], list[str]] = {}
    for name in sorted({name for resolved in installs.values() for name in resolved}):
        by_version: dict[str, list[str]] = {}
        for variant in VARIANTS:
            if name in installs.get(variant, {}):
                by_version.setdefault(installs[variant][name], []).append(variant)
        for version, variants in by_version.items():
            key = () if tuple(variants) == VARIANTS else tuple(variants)
            groups.setdefault(key, []).append(f"{name}=={version}")
    order = sorted(groups, key=lambda k: (k != (), min(map(VARIANTS.index, k), default=0), -len(k), k))
    text = ""
    for key in order:
        text += f"\n# [{' '.join(key)}]\n" if key else ""
        text += "".join(f"{line}\n" for line in groups[key])
    return text


def slim(site_packages: Path, strip: str = "strip") -> int:
    """Make the installed set smaller without changing what a job runs: remove NOT_AT_RUN_TIME (as pip uninstall
    does, by their RECORD), BUILD_ONLY_DIRS and every package's `tests` directory, and strip the symbol tables of the
    STRIPPED packages' shared libraries (`strip --strip-unneeded`: what the dynamic linker and dlsym read stays; a
    crash's native stack shows addresses instead of TensorFlow's internal names). Returns the bytes saved."""
    before = _size(site_packages)
    removed = [name for name in NOT_AT_RUN_TIME if _remove_distribution(site_packages, name)]
    for rel in BUILD_ONLY_DIRS:
        shutil.rmtree(site_packages / rel, ignore_errors=True)
    for name in TEST_DIRS:
        for found in sorted(site_packages.glob(f"*/**/{name}"), reverse=True):
            if found.is_dir() and not found.is_symlink():
                shutil.rmtree(found, ignore_errors=True)
    libraries = [
        str(path)
        for package in STRIPPED
        for path in sorted((site_packages / package).rglob("*.so*"))
        if path.is_file() and not path.is_symlink()
    ]
    for start in range(0, len(libraries), 200):
        subprocess.run([strip, "--strip-unneeded", *libraries[start : start + 200]], check=True)
    saved = before - _size(site_packages)
    print(
        f"slim: {saved / 1e6:.0f} MB removed ({', '.join(removed) or 'no package'} uninstalled, "
        f"{len(libraries)} shared libraries stripped)"
    )
    return saved


def _remove_distribution(site_packages: Path, name: str) -> bool:
    """Uninstall `name` from `site_packages` as pip does: every file its RECORD lists, then its dist-info."""
    found = [
        d
        for d in site_packages.glob("*.dist-info")
        if _canonical(d.name.removesuffix(".dist-info").rsplit("-", 1)[0]) == _canonical(name)
    ]
    root = site_packages.resolve()
    for dist_info in found:
        record = dist_info / "RECORD"
        emptied = set()
        for line in record.read_text().splitlines() if record.is_file() else []:
            path = (site_packages / line.split(",", 1)[0]).resolve()
            if path.is_file() or path.is_symlink():
                path.unlink()
                emptied.add(path.parent)
        for directory in sorted(emptied, key=lambda p: len(p.parts), reverse=True):
            # The package's own directories, now empty, up to site-packages (never past it).
            while root in directory.parents and directory.is_dir() and not any(directory.iterdir()):
                directory.rmdir()
                directory = directory.parent
        shutil.rmtree(dist_info, ignore_errors=True)
    return bool(found)


def _size(root: Path) -> int:
    return sum(p.lstat().st_size for p in root.rglob("*") if p.is_file() or p.is_symlink())


def check(no_deps: Path, lock: Path | None = None) -> int:
    """After the install: `pip check`, allowing only what the --no-deps installs leave out on purpose (tf-keras ->
    tensorflow) and what `slim` removed (NOT_AT_RUN_TIME); and, given the variant's lock lines, exactly those
    versions installed and nothing unlocked."""
    names = {_split(line)[0] for line in no_deps.read_text().splitlines() if line.strip()}
    result = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True, check=False)
    allowed = re.compile(r"^(\S+) \S+ requires (\S+), which is not installed\.$")
    removed = set(NOT_AT_RUN_TIME)

    def accepted(line: str) -> bool:
        if not (m := allowed.match(line)):
            return False
        return (_canonical(m.group(1)) in names and m.group(2) == "tensorflow") or _canonical(m.group(2)) in removed

    problems = [
        line
        for line in result.stdout.splitlines()
        if line.strip() and not accepted(line) and not line.startswith("No broken requirements")
    ]
    if lock is not None:
        locked = pins([line for line in lock.read_text().splitlines() if line.strip()])
        installed = {_canonical(d.name): d.version for d in metadata.distributions() if d.name}
        for name, version in sorted(locked.items()):
            if installed.get(name) != version and not (name in removed and name not in installed):
                problems.append(f"{name}: locked {version}, installed {installed.get(name, 'nothing')}")
        for name in sorted(set(installed) - set(locked) - set(BASE_PACKAGES)):
            problems.append(f"{name} {installed[name]} is installed but not in the lock (`make image-lock`)")
    ok = "pip check: no broken requirements" + (f" ({', '.join(sorted(names))} without dependencies)" if names else "")
    if gone := sorted(removed - {_canonical(d.name) for d in metadata.distributions() if d.name}):
        ok += f", {', '.join(gone)} removed (not used at run time)"
    print("\n".join(problems) or ok + ("; exactly the locked versions installed" if lock else ""))
    return 1 if problems else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    req = sub.add_parser("requirements", help="write requirements.txt, no-deps.txt and constraints.txt")
    req.add_argument("--variant", choices=VARIANTS, required=True)
    req.add_argument("--libtpu", default=LIBTPU, help="tensorflow-tpu's libtpu (tpu variant only)")
    req.add_argument("--pyproject", type=Path, default=HERE.parent / "pyproject.toml")
    req.add_argument("--constraints", type=Path, default=HERE / "constraints.txt", help="the lock")
    req.add_argument("--out", type=Path, required=True)
    lk = sub.add_parser("lock", help="resolve every variant and rewrite docker/constraints.txt")
    lk.add_argument("--pyproject", type=Path, default=HERE.parent / "pyproject.toml")
    lk.add_argument("--target", type=Path, default=HERE / "constraints.txt")
    ck = sub.add_parser("check", help="pip check (allowing what no-deps leaves out), and the locked versions")
    ck.add_argument("--no-deps", type=Path, required=True)
    ck.add_argument("--constraints", type=Path, help="the variant's lock lines (requirements' constraints.txt)")
    lo = sub.add_parser("local", help="write requirements.txt, no-deps.txt and remove.txt: the train extra here")
    lo.add_argument("--pyproject", type=Path, default=HERE.parent / "pyproject.toml")
    lo.add_argument("--out", type=Path, required=True)
    sl = sub.add_parser("slim", help="remove what no job loads, strip shared libraries (after the install)")
    sl.add_argument("--site-packages", type=Path, required=True)
    sl.add_argument("--strip", default="strip", help="binutils' strip")
    args = parser.parse_args(argv)
    if args.command == "requirements":
        write(args.out, args.pyproject, args.variant, args.libtpu or LIBTPU, args.constraints)
    elif args.command == "check":
        return check(args.no_deps, args.constraints)
    elif args.command == "local":
        gpu = has_nvidia_gpu()
        reqs, no_deps = local(args.pyproject, gpu)
        # The other build, where an earlier install left it: both ship the module `tensorflow`.
        _write(args.out, requirements=reqs, no_deps=no_deps, remove=["tensorflow-cpu" if gpu else "tensorflow"])
    elif args.command == "slim":
        slim(args.site_packages, args.strip)
    else:
        lock(args.pyproject, args.target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
