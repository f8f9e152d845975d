"""Your code in the image: `runner build --context DIR` layers a directory onto the trainer image.

The layer is two instructions on top of the trainer image (`COPY . /workspace`, `WORKDIR /workspace`), so a
`command: python train.py` finds train.py where the container starts, on a TPU VM as with `--local` in Docker. Its
tag is the trainer image's tag plus a digest of what the directory sends (its .dockerignore applied; .git,
__pycache__ and virtual environments always left out): `trainer-tpu:0.1.0-3fa2...-code-9c1e...`. The image name
stays `trainer-<variant>`, so the planner still knows what the image can run; the same code is never built or
pushed twice. A `--local` run as a process needs no image: the command runs in the directory `runner submit` is
started from.

Your requirements (requirements.txt, else pyproject.toml's [project] dependencies: runner.launch.deps) go in a
layer of their own between the trainer image and the code: `pip install` with the image's own lock as constraints,
so nothing of the variant's (jax, tensorflow, keras, ...) is replaced; a line that asks for another version of one is
refused before the build (exit 2). The layer's instruction holds the requirement lines themselves, so the engine's
layer cache keys it on them and the trainer image alone: a change to your code rebuilds the code layer only.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import tempfile
from collections.abc import Callable
from pathlib import Path

from runner.errors import SpecError, UsageError
from runner.launch import build, deps, image, variants
from runner.launch.engine import Engine
from runner.launch.imageref import ImageRef

WORKSPACE = "/workspace"
CODE_TAG = "-code-"
ALWAYS_IGNORED = ".git\n**/.git\n**/__pycache__\n**/*.pyc\n.venv\n**/.venv\n"


JOB_REQUIREMENTS = f"{build.REQUIREMENTS}/job.txt"  # what the dependency layer installed, kept in the image
JOB_CONSTRAINTS = f"{build.REQUIREMENTS}/job-constraints.txt"


def dockerfile(base: str, lines: list[str] | None = None, constraints: list[str] | None = None, user: str = "") -> str:
    """The code image's recipe: the dependency layer (`lines` for pip, `constraints` beside the image's lock; run
    as root, then the base image's `user` again), then the code."""
    recipe = f"FROM {base}\n"
    if lines:
        as_root = user not in ("", "root", "0", "0:0")
        ca = f"/run/secrets/{build.CA_SECRET}"
        recipe += "USER root\n" if as_root else ""
        recipe += (
            f"RUN --mount=type=secret,id={build.CA_SECRET} \\\n"
            f"    if [ -s {ca} ]; then \\\n"
            f"      cat \"$(python -c 'from pip._vendor import certifi; print(certifi.where())')\" {ca} \\\n"
            "        > /tmp/ca-bundle.pem && export PIP_CERT=/tmp/ca-bundle.pem; \\\n"
            "    fi \\\n"
            f"    && printf '%s\\n' {' '.join(shlex.quote(line) for line in lines)} > {JOB_REQUIREMENTS} \\\n"
            f"    && printf '%s\\n' {' '.join(shlex.quote(c) for c in constraints or [])} > {JOB_CONSTRAINTS} \\\n"
            "    && pip install --no-cache-dir --no-warn-script-location \\\n"
            f"      --constraint {build.REQUIREMENTS}/constraints.txt --constraint {JOB_CONSTRAINTS} \\\n"
            f"      --requirement {JOB_REQUIREMENTS} \\\n"
            "    && rm -f /tmp/ca-bundle.pem\n"
        )
        recipe += f"USER {user}\n" if as_root else ""
    return recipe + f"COPY . {WORKSPACE}\nWORKDIR {WORKSPACE}\n"


def variant_pins(variant: str | None, root: Path = image.REPO_ROOT) -> deps.Pins | None:
    """What the variant's image holds, from this checkout's lock (docker/constraints.txt); None where unknown."""
    lock = root / "docker" / "constraints.txt"
    if variant not in variants.BY_NAME or not lock.is_file():
        return None
    lines = build.requirements_module(root).constraints(lock.read_text(), variant)
    return deps.lock_pins(lines, f"the {variant} image")


def dependency_layer(context: Path, variant: str | None) -> tuple[list[str], list[str]] | None:
    """(pip's lines, extra constraints) of the layer `context`'s requirements need on the `variant`'s image, or None
    when there are none or the image has them all. One that conflicts with the image's lock: SpecError (exit 2)."""
    requirements = deps.find(context)
    if requirements is None:
        return None
    pins = variant_pins(variant)
    if pins is None:  # not a trainer-<variant> image: pip, with the image's own lock, is the only check
        return [line.text for line in requirements.lines], []
    deps.check(requirements, pins)
    lines = deps.missing(requirements, pins)
    if not lines:
        return None
    return [line.text for line in lines], [c for c in pins.constraints() if "===" in c]


def code_files(context: Path) -> list[str]:
    """What `docker build` sends of `context`: its .dockerignore applied, and ALWAYS_IGNORED."""
    if not context.is_dir():
        raise UsageError(f"--context {context}: not a directory")
    rules = image.parse_ignore(ALWAYS_IGNORED)
    if (context / ".dockerignore").is_file():
        rules += image.parse_ignore((context / ".dockerignore").read_text())
    return image.context_files(context, rules)


def code_digest(context: Path) -> str:
    digest = hashlib.sha256()
    for rel in code_files(context):
        path = context / rel
        if path.is_symlink():
            item = f"link {rel} {os.readlink(path)}".encode()
        else:
            mode = "x" if path.stat().st_mode & 0o111 else "-"
            item = f"file {rel} {mode} ".encode() + hashlib.sha256(path.read_bytes()).digest()
        digest.update(len(item).to_bytes(8, "big") + item)
    return digest.hexdigest()


def code_reference(base: str, context: Path) -> str:
    """The base image's reference, spelled as given (`trainer-cpu`, not Docker Hub's `library/trainer-cpu`: a local
    image has no registry), with the code's digest added to its tag."""
    ref = ImageRef.parse(base)
    name = base.split("@", 1)[0]
    name = name[: -len(ref.tag) - 1] if ref.tag else name
    return f"{name}:{ref.tag or 'latest'}{CODE_TAG}{code_digest(context)[:12]}"


def has_code(reference: str) -> bool:
    """Whether an image reference is one `runner build --context` made (what the plan says of it)."""
    try:
        return CODE_TAG in (ImageRef.parse(reference).tag or "")
    except ValueError:
        return False


def ensure_code_image(
    base: build.ImageResult,
    context: Path,
    *,
    push: bool = False,
    engine: Engine | None = None,
    say: Callable[[str], None] = print,
    exists: Callable[[str], bool | None] = image.image_exists,
    ca_certs: Path | None = None,
) -> build.ImageResult:
    """Build (and push) the code image on top of `base`, doing only what is missing, as build.ensure_image does;
    your requirements in a layer of their own under the code (`ca_certs`: pip's extra CA certificates there)."""
    variant = next((v for t in base.tags if (v := variants.variant_of(t))), None)
    layer = dependency_layer(context, variant)  # a conflict is refused before anything is built
    tags = tuple(code_reference(t, context) for t in base.tags)
    remote = tags[0] if len(tags) > 1 else None  # (registry, local) when there is a project, as for the base
    cli = build.Cli(engine)
    if push and remote and build.in_registry(remote, cli, exists):
        say(f"{remote} is already in the registry: nothing to build or push")
        return build.ImageResult(remote, tags, built=False, pushed=False)
    present = [t for t in tags if cli.present(t)]
    if present:
        say(f"{present[0]} is already built")
        for missing in (t for t in tags if t not in present):
            build.check(cli("tag", present[0], missing), f"{cli.engine.name} tag {missing}")
    else:
        with tempfile.TemporaryDirectory(prefix="runner-code-") as tmp:
            recipe = Path(tmp) / "Dockerfile"
            user = cli("image", "inspect", "--format", "{{.Config.User}}", base.tags[0]).stdout.strip() if layer else ""
            recipe.write_text(dockerfile(base.tags[0], *(layer or ([], [])), user=user))
            ignore = Path(tmp) / "Dockerfile.dockerignore"  # BuildKit reads it beside the Dockerfile
            extra = (context / ".dockerignore").read_text() if (context / ".dockerignore").is_file() else ""
            ignore.write_text(ALWAYS_IGNORED + extra)
            argv = ["build", "--file", str(recipe)]
            if cli.engine.name == "podman":
                argv += ["--ignorefile", str(ignore)]  # Podman reads a .dockerignore in the context, not beside
            for t in tags:
                argv += ["--tag", t]
            if layer and ca_certs is not None:
                argv += ["--secret", f"id={build.CA_SECRET},src={build.ca_bundle(ca_certs, Path(tmp))}"]
            say(f"building {tags[0]} (your code from {context} at {WORKSPACE})")
            if layer:
                say(
                    f"dependencies: {', '.join(line for line in layer[0] if not line.startswith('-'))}, in a layer "
                    "under the code (built again only when they or the trainer image change), never over the "
                    "image's own packages"
                )
            result = cli.tee(*argv, str(context))
            if result.returncode != 0 and (cause := deps.pip_conflict(result.stdout)):
                raise SpecError(
                    f"{context.resolve()}: pip found no versions of your requirements that fit the image's packages "
                    "(yours are added to them, never installed over them)",
                    [cause],
                    hint="loosen the requirement that pulls in the conflicting version, or pin one that fits",
                )
            build.check(result, f"{cli.engine.name} build")
    pushed = False
    if push and remote:
        say(f"pushing {remote}")
        build.check(cli("push", remote, capture=False), f"{cli.engine.name} push {remote}")
        pushed = True
    return build.ImageResult(tags[0], tags, built=not present, pushed=pushed)
