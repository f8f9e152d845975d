"""What pip installs into the trainer image, per variant, derived from pyproject.toml (the one source of versions).

    python docker/requirements.py requirements --variant tpu --out DIR   # DIR/requirements.txt, DIR/no-deps.txt
    python docker/requirements.py check --no-deps DIR/no-deps.txt        # pip check, after the install
    python docker/requirements.py lock                                   # rewrite docker/constraints.txt

The image gets the runner's runtime dependencies and its `train` extra, with one change per variant:

    cpu   tensorflow-cpu==X               the same TensorFlow without the CUDA kernels: 259 MB of wheel, not 621
    gpu   tensorflow[and-cuda]==X         as pyproject.toml says, with NVIDIA's CUDA/cuDNN wheels (host: driver only)
    tpu   tensorflow-tpu==X + libtpu      Cloud TPU's TensorFlow build, installed with the libtpu-tf-releases
                                          find-links as the Cloud TPU docs do; libtpu pinned (see LIBTPU below)

tf-keras requires the package `tensorflow`, which would install the full build over tensorflow-cpu or
tensorflow-tpu (all ship the `tensorflow` module); on those variants it is installed with --no-deps, and `check`
runs `pip check` allowing exactly that one missing requirement.

`lock` resolves every variant on this machine (Linux x86_64, the image's Python minor version) and writes the exact
versions of everything pip chose into docker/constraints.txt, which the image build applies: the same pyproject.toml
gives the same packages on every machine and every day. Standard library and pip only: it runs inside the image.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the copy pip vendors
    from pip._vendor import tomli as tomllib  # type: ignore[no-redef]

VARIANTS = ("cpu", "gpu", "tpu")
# tensorflow-tpu 2.20.0 declares libtpu~=0.0.14; left open, pip takes the newest 0.0.x on PyPI, a build made for
# JAX months later. The floor of that range is the build the wheel was made against.
LIBTPU = "0.0.14"
LIBTPU_FIND_LINKS = "https://storage.googleapis.com/libtpu-tf-releases/index.html"
_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?\s*(.*)$")
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
    lines = list(project["dependencies"])
    no_deps: list[str] = []
    for req in project["optional-dependencies"]["train"]:
        name, rest = _split(req)
        if name == "tensorflow" and variant == "cpu":
            req = f"tensorflow-cpu{rest}"
        elif name == "tensorflow" and variant == "gpu":
            req = f"tensorflow[and-cuda]{rest}"
        elif name == "tensorflow" and variant == "tpu":
            lines += [f"--find-links {LIBTPU_FIND_LINKS}", f"libtpu=={libtpu}"]
            req = f"tensorflow-tpu{rest}"
        elif name == "tf-keras" and variant != "gpu":
            no_deps.append(req)
            continue
        lines.append(req)
    return lines, no_deps


def write(out: Path, pyproject: Path, variant: str, libtpu: str) -> None:
    reqs, no_deps = requirements(pyproject, variant, libtpu)
    out.mkdir(parents=True, exist_ok=True)
    (out / "requirements.txt").write_text("\n".join(reqs) + "\n")
    (out / "no-deps.txt").write_text("".join(f"{line}\n" for line in no_deps))


def _resolve(lines: list[str], constraints: list[str]) -> tuple[dict[str, str], dict[str, list[str]]]:
    """pip's choice for `lines` under `constraints`: {name: version} and {name: Requires-Dist lines}."""
    with tempfile.TemporaryDirectory() as tmp:
        req, con = Path(tmp, "req.txt"), Path(tmp, "con.txt")
        req.write_text("\n".join(lines) + "\n")
        con.write_text("\n".join(constraints) + "\n")
        # Short timeouts: an unreachable find-links host (libtpu-tf-releases offline) costs seconds, not minutes.
        argv = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet"]
        argv += ["--timeout", "30", "--retries", "1"]
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


def lock(pyproject: Path, target: Path) -> None:
    """Resolve cpu first, then gpu and tpu under its pins, so all variants share one set of versions. The CUDA
    wheels are pinned to the lower bounds of TensorFlow's `and-cuda` extra (the CUDA/cuDNN it was built with), as
    libtpu is to the floor tensorflow-tpu declares, instead of whatever is newest on the day of the lock."""
    pins: dict[str, str] = {}
    requires: dict[str, list[str]] = {}
    for variant in VARIANTS:
        reqs, _ = requirements(pyproject, variant)  # the no-deps lines (tf-keras) are pinned by cpu
        constraints = [f"{k}=={v}" for k, v in pins.items()]
        if variant == "gpu":  # tensorflow-cpu, resolved first, carries the same Requires-Dist as tensorflow
            constraints += floors(requires["tensorflow-cpu"], "and-cuda")
        resolved, requires = _resolve(reqs, constraints)
        pins.update(resolved)
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    header = (
        "# Exact versions for the trainer image, all variants (cpu, gpu, tpu); applied with pip --constraint.\n"
        f"# Generated by `python docker/requirements.py lock` (`make image-lock`) on Linux x86_64, Python {py}.\n"
        "# Regenerate after changing dependencies in pyproject.toml; do not edit by hand.\n"
    )
    target.write_text(header + "".join(f"{name}=={pins[name]}\n" for name in sorted(pins)))


def check(no_deps: Path) -> int:
    """`pip check`, allowing only what the --no-deps installs leave out on purpose (tf-keras -> tensorflow)."""
    names = {_split(line)[0] for line in no_deps.read_text().splitlines() if line.strip()}
    result = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True, check=False)
    allowed = re.compile(r"^(\S+) \S+ requires tensorflow, which is not installed\.$")
    problems = [
        line
        for line in result.stdout.splitlines()
        if line.strip()
        and not ((m := allowed.match(line)) and _canonical(m.group(1)) in names)
        and not line.startswith("No broken requirements")
    ]
    print("\n".join(problems) or "pip check: no broken requirements (tf-keras installed without its tensorflow pin)")
    return 1 if problems else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    req = sub.add_parser("requirements", help="write requirements.txt and no-deps.txt for one variant")
    req.add_argument("--variant", choices=VARIANTS, required=True)
    req.add_argument("--libtpu", default=LIBTPU)
    req.add_argument("--pyproject", type=Path, default=HERE.parent / "pyproject.toml")
    req.add_argument("--out", type=Path, required=True)
    lk = sub.add_parser("lock", help="resolve every variant and rewrite docker/constraints.txt")
    lk.add_argument("--pyproject", type=Path, default=HERE.parent / "pyproject.toml")
    lk.add_argument("--target", type=Path, default=HERE / "constraints.txt")
    ck = sub.add_parser("check", help="pip check, allowing what the no-deps installs leave out")
    ck.add_argument("--no-deps", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.command == "requirements":
        write(args.out, args.pyproject, args.variant, args.libtpu or LIBTPU)
    elif args.command == "check":
        return check(args.no_deps)
    else:
        lock(args.pyproject, args.target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
