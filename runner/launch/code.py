"""Your code in the image: `runner build --context DIR` layers a directory onto the trainer image.

The layer is two instructions on top of the trainer image (`COPY . /workspace`, `WORKDIR /workspace`), so a
`command: python train.py` finds train.py where the container starts, on a TPU VM as with `--local` in Docker. Its
tag is the trainer image's tag plus a digest of what the directory sends (its .dockerignore applied; .git,
__pycache__ and virtual environments always left out): `trainer-tpu:0.1.0-3fa2...-code-9c1e...`. The image name
stays `trainer-<variant>`, so the planner still knows what the image can run; the same code is never built or
pushed twice. A `--local` run as a process needs no image: the command runs in the directory `runner submit` is
started from.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from runner.errors import UsageError
from runner.launch import build, image
from runner.launch.engine import Engine
from runner.launch.imageref import ImageRef

WORKSPACE = "/workspace"
CODE_TAG = "-code-"
ALWAYS_IGNORED = ".git\n**/.git\n**/__pycache__\n**/*.pyc\n.venv\n**/.venv\n"


def dockerfile(base: str) -> str:
    return f"FROM {base}\nCOPY . {WORKSPACE}\nWORKDIR {WORKSPACE}\n"


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
) -> build.ImageResult:
    """Build (and push) the code image on top of `base`, doing only what is missing, as build.ensure_image does."""
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
            recipe.write_text(dockerfile(base.tags[0]))
            ignore = Path(tmp) / "Dockerfile.dockerignore"  # BuildKit reads it beside the Dockerfile
            extra = (context / ".dockerignore").read_text() if (context / ".dockerignore").is_file() else ""
            ignore.write_text(ALWAYS_IGNORED + extra)
            argv = ["build", "--file", str(recipe)]
            if cli.engine.name == "podman":
                argv += ["--ignorefile", str(ignore)]  # Podman reads a .dockerignore in the context, not beside
            for t in tags:
                argv += ["--tag", t]
            say(f"building {tags[0]} (your code from {context} at {WORKSPACE})")
            build.check(cli(*argv, str(context), capture=False), f"{cli.engine.name} build")
    pushed = False
    if push and remote:
        say(f"pushing {remote}")
        build.check(cli("push", remote, capture=False), f"{cli.engine.name} push {remote}")
        pushed = True
    return build.ImageResult(tags[0], tags, built=not present, pushed=pushed)
