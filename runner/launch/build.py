"""Build and push the trainer image with Docker or Podman: `runner build` (runner.cli.tools), `make image`, `make push`.

    build   `docker build` (or `podman build`: runner.launch.engine finds which) unless the content tag is already
            on this machine (`image inspect`); then the finished image is checked against its variant's lock
            (below) and its size is said
    push    `push` unless the registry already has the tag (image.image_exists, else `manifest inspect`)

Before a build, the hosts the variant installs from besides PyPI must answer: Google's libtpu find-links for tpu and
jax-tpu. Where they cannot be reached the build stops at once and says so, instead of pip retrying in the build.

After a build, `requirements.py check` runs in a fresh container of the final image (the dependency layer keeps
its variant's requirement files in /opt/requirements): exactly the locked versions, nothing else. This runs
outside every cached step, so an image whose layers came from a stale cache can never pass as its variant.

Behind a TLS-intercepting proxy, `ca_certs` (a PEM file, or a directory of .crt/.pem files such as
/usr/local/share/ca-certificates) goes to the build as the secret `ca-certificates`: pip trusts it during the
install, and it is neither in a layer nor part of the content tag.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from runner.errors import BackendError, UsageError
from runner.launch import engine as engines
from runner.launch.engine import Engine
from runner.launch.image import DOCKERFILE, REPO_ROOT, content_tag, image_exists, local_reference, reference
from runner.launch.variants import VARIANTS

REQUIREMENTS = "/opt/requirements"  # where the image keeps its variant's requirement files (docker/Dockerfile)
CA_SECRET = "ca-certificates"  # the build secret docker/Dockerfile reads
HOST_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class ImageResult:
    reference: str  # the registry reference when there is one, else the local name
    tags: tuple[str, ...]
    built: bool
    pushed: bool


class Cli:
    """The engine's command line, found on first use: a tag the registry already has needs no engine at all."""

    def __init__(self, engine: Engine | None = None) -> None:
        self._engine = engine

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            found = engines.detect()
            if found.engine is None:
                raise BackendError(
                    f"cannot build or push the image: {found.why}",
                    hint="start Docker, or install Podman (`make podman`); RUNNER_CONTAINER_ENGINE=docker|podman picks "
                    "one. `--local` runs the trainer as a process meanwhile",
                )
            self._engine = found.engine
        return self._engine

    def __call__(
        self, *args: str, capture: bool = True, timeout: float | None = None
    ) -> subprocess.CompletedProcess[str]:
        env = {**self.engine.env(), "DOCKER_BUILDKIT": "1"}  # BuildKit: the Dockerfile uses RUN --mount
        try:
            return subprocess.run(
                self.engine.command(*args), capture_output=capture, text=True, check=False, env=env, timeout=timeout
            )
        except FileNotFoundError as exc:
            raise BackendError(f"the {self.engine.name} CLI is not installed") from exc

    def tee(self, *args: str) -> subprocess.CompletedProcess[str]:
        """The CLI with its output shown as it comes (as with capture=False) and kept: in stdout and stderr alike
        (merged), for a failure to be read."""
        env = {**self.engine.env(), "DOCKER_BUILDKIT": "1"}
        try:
            proc = subprocess.Popen(
                self.engine.command(*args), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
            )
        except FileNotFoundError as exc:
            raise BackendError(f"the {self.engine.name} CLI is not installed") from exc
        kept = []
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            kept.append(line)
        output = "".join(kept)
        return subprocess.CompletedProcess(list(args), proc.wait(), output, output)

    def present(self, ref: str) -> bool:
        return self("image", "inspect", "--format", "{{.Id}}", ref).returncode == 0

    def size(self, ref: str) -> int | None:
        """The image's size on disk in bytes, as `image inspect` reports it (uncompressed layers)."""
        result = self("image", "inspect", "--format", "{{.Size}}", ref)
        try:
            return int(result.stdout.strip().splitlines()[0]) if result.returncode == 0 else None
        except (IndexError, ValueError):
            return None


def check(result: subprocess.CompletedProcess[str], what: str) -> None:
    if result.returncode != 0:
        detail = (result.stderr or "").strip().splitlines()[-1:] if result.stderr else []
        raise BackendError(
            f"{what} failed (exit {result.returncode})" + (f": {detail[0]}" if detail else ""),
            hint="does the engine answer (`docker version` / `podman version`)? For a push: `gcloud auth "
            "configure-docker REGION-docker.pkg.dev`",
        )


def in_registry(ref: str, cli: Cli, exists: Callable[[str], bool | None]) -> bool:
    known = exists(ref)
    if known is None:  # no ADC here: the engine's CLI may still have credentials (gcloud auth configure-docker)
        known = cli("manifest", "inspect", ref).returncode == 0
    return known


def requirements_module(root: Path) -> ModuleType:
    """docker/requirements.py of the checkout being built (it is the image's, not the runner's: not importable)."""
    path = root / "docker" / "requirements.py"
    spec = importlib.util.spec_from_file_location("image_requirements", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def extra_hosts(variant: str, root: Path = REPO_ROOT) -> list[str]:
    """The find-links URLs the variant's install reads besides PyPI (Google's libtpu indexes for tpu, jax-tpu)."""
    module = requirements_module(root)
    lines, _ = module.requirements(root / "pyproject.toml", variant)
    return [line.split(None, 1)[1] for line in lines if line.startswith("--find-links ")]


def unreachable(url: str, timeout: float = HOST_TIMEOUT_S) -> str | None:
    """Why `url` cannot be read from here (DNS, refused, TLS, timeout), or None when its server answers at all."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout):
            return None
    except urllib.error.HTTPError:
        return None  # the server answered; what pip makes of it is pip's business
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        return str(reason) or type(exc).__name__


def check_hosts(variant: str, root: Path = REPO_ROOT) -> None:
    """Refuse at once to build a variant whose extra package hosts do not answer from this machine."""
    for url in extra_hosts(variant, root):
        if why := unreachable(url):
            host = urllib.parse.urlsplit(url).netloc
            pypi_only = ", ".join(v for v in VARIANTS if not extra_hosts(v, root))
            raise BackendError(
                f"cannot build the {variant} image here: {host} does not answer ({why}); the {variant} variant "
                f"installs libtpu from {url}, as the Cloud TPU docs do",
                hint="build it on a machine that reaches Google's storage (Cloud Build, a VM in Google Cloud); "
                f"{pypi_only} install from PyPI alone",
            )


def ca_bundle(source: Path, into: Path) -> Path:
    """One PEM file of `source` (a file, or every .crt/.pem file of a directory), for the build secret."""
    files = sorted(p for p in source.iterdir() if p.suffix in (".crt", ".pem")) if source.is_dir() else [source]
    try:
        text = "".join(f.read_text().rstrip("\n") + "\n" for f in files)
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"--ca-certs {source}: cannot read it ({exc})") from None
    if "-----BEGIN CERTIFICATE-----" not in text:
        raise UsageError(f"--ca-certs {source}: no PEM certificate in it", hint="a .crt/.pem file or a directory")
    bundle = into / "ca-certificates.pem"
    bundle.write_text(text)
    return bundle


def verify(cli: Cli, ref: str) -> None:
    """`requirements.py check` in a fresh container of the finished image, off the network: its variant's locked
    set and nothing else, whatever the build cache did."""
    at = f"{REQUIREMENTS}/"
    result = cli(
        "run", "--rm", "--network", "none", "--entrypoint", "python", ref, f"{at}requirements.py", "check",
        "--no-deps", f"{at}no-deps.txt", "--constraints", f"{at}constraints.txt",
    )  # fmt: skip
    if result.returncode != 0:
        raise BackendError(
            f"{ref} does not hold what its variant locks:\n{(result.stdout + result.stderr).strip()}",
            hint=f"remove it (`{cli.engine.name} rmi {ref}`) and build again; a stale build cache is the usual cause",
        )


def _say_size(cli: Cli, ref: str, say: Callable[[str], None], how: str) -> None:
    size = cli.size(ref)
    say(f"{ref}: {size / 1e9:.2f} GB on disk ({how})" if size else f"{ref}: {how}")


def ensure_image(
    variant: str,
    *,
    project: str | None = None,
    region: str = "us-central1",
    repo: str = "tpu-runner",
    push: bool = False,
    build_args: dict[str, str] | None = None,
    ca_certs: Path | None = None,
    root: Path = REPO_ROOT,
    engine: Engine | None = None,
    say: Callable[[str], None] = print,
    exists: Callable[[str], bool | None] = image_exists,
) -> ImageResult:
    """Build (and push) the image for this code, doing only what is missing: a tag already in the registry means
    nothing to do; a tag already on this machine means no build."""
    tag = content_tag(variant, root=root, build_args=build_args)
    local = local_reference(variant, tag)
    remote = reference(project, region, repo, variant, tag) if project else None
    if push and not remote:
        raise UsageError("pushing needs a project", hint="pass --project (make push PROJECT=...)")
    tags = (remote, local) if remote else (local,)
    cli = Cli(engine)
    if push and remote and in_registry(remote, cli, exists):
        say(f"{remote} is already in the registry: nothing to build or push")
        return ImageResult(remote, tags, built=False, pushed=False)
    present = [t for t in tags if cli.present(t)]
    if present:
        _say_size(cli, present[0], say, f"already built, content tag {tag}")
        for missing in (t for t in tags if t not in present):
            check(cli("tag", present[0], missing), f"{cli.engine.name} tag {missing}")
    else:
        check_hosts(variant, root)
        argv = ["build", "--file", str(root / DOCKERFILE), "--build-arg", f"VARIANT={variant}"]
        for key, value in sorted((build_args or {}).items()):
            argv += ["--build-arg", f"{key}={value}"]
        argv += ["--label", f"org.opencontainers.image.version={tag}"]
        for t in tags:
            argv += ["--tag", t]
        say(f"building {tags[0]} with {cli.engine.title}" + (f" (CA certificates from {ca_certs})" if ca_certs else ""))
        started = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="runner-build-") as tmp:
            if ca_certs is not None:
                argv += ["--secret", f"id={CA_SECRET},src={ca_bundle(ca_certs, Path(tmp))}"]
            check(cli(*argv, str(root), capture=False), f"{cli.engine.name} build")
        verify(cli, tags[0])
        _say_size(cli, tags[0], say, f"built in {time.monotonic() - started:.0f} s, its packages checked")
    pushed = False
    if push and remote:
        say(f"pushing {remote}")
        check(cli("push", remote, capture=False), f"{cli.engine.name} push {remote}")
        pushed = True
    return ImageResult(tags[0], tags, built=not present, pushed=pushed)


def parse_build_args(values: list[str]) -> dict[str, str]:
    """--build-arg KEY=VALUE options as a dict; a UsageError for one that is not."""
    args = {}
    for item in values:
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise UsageError(f"--build-arg {item!r} is not KEY=VALUE")
        args[key] = value
    return args
