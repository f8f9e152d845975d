"""runner.launch.image: the content tag, references, and the registry check against a real local HTTP server speaking
the Docker Registry HTTP API v2. (Building and pushing: test_build.)"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import stat
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from runner import backends, spec
from runner.errors import PlanError
from runner.launch import image, variants
from runner.launch.imageref import ImageRef
from runner.plan import planner as plan
from tests.conftest import REPO, free_port

# -- the content tag ----------------------------------------------------------------------------------------------


@pytest.fixture
def context(tmp_path: Path) -> Path:
    """A copy of what the tag reads (the build context, the Dockerfile, the .dockerignore), at another path."""
    root = tmp_path / "checkout"
    for rel in [*image.context_files(REPO), image.DOCKERFILE, f"{image.DOCKERFILE}.dockerignore"]:
        src, dst = REPO / rel, root / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            dst.symlink_to(os.readlink(src))
        else:
            shutil.copy2(src, dst)
    return root


def digest(root: Path, variant: str = "cpu", **args: str) -> str:
    return image.content_digest(variant, root=root, build_args=args or None)


def test_tag_is_stable_across_checkouts_and_calls(context: Path) -> None:
    assert digest(context) == digest(context) == digest(REPO)
    assert re.fullmatch(r"\d+\.\d+\.\d+-[0-9a-f]{16}", image.content_tag("cpu", root=context))
    assert len({digest(context, v) for v in image.VARIANTS}) == len(image.VARIANTS) == 5


@pytest.mark.parametrize(
    "edit",
    [
        "runner/worker/supervisor.py",  # code
        "runner/new_module.py",  # a new file
        "pyproject.toml",
        "docker/constraints.txt",
        "docker/requirements.py",
        "docker/Dockerfile",  # the recipe itself, though not in the context
    ],
)
def test_tag_changes_with_what_goes_into_the_image(context: Path, edit: str) -> None:
    before = digest(context)
    path = context / edit
    path.write_text((path.read_text() if path.exists() else "") + "\n# changed\n")
    assert digest(context) != before


def test_a_variants_tag_changes_with_its_own_lines_of_the_lock_and_its_stage(context: Path) -> None:
    before = {v: digest(context, v) for v in image.VARIANTS}
    lock = context / "docker" / "constraints.txt"
    text = lock.read_text()
    assert "\n# [jax-tpu]\nlibtpu==" in text
    lock.write_text(re.sub(r"(# \[jax-tpu\]\nlibtpu==)\S+", r"\g<1>0.0.99", text))
    relocked = {v: digest(context, v) for v in image.VARIANTS}
    assert relocked["jax-tpu"] != before["jax-tpu"]
    # The tag hashes the whole lock, so the other variants' tags move too (their dependency layers do not: the build
    # installs from the variant's own lines, docker/README.md).
    assert all(relocked[v] != before[v] for v in image.VARIANTS)
    lock.write_text(text)
    dockerfile = context / image.DOCKERFILE
    recipe = dockerfile.read_text()
    stage = "FROM deps AS variant-jax-tpu\nENV KERAS_BACKEND=jax\n"
    assert stage in recipe
    dockerfile.write_text(recipe.replace(stage, stage + "ENV JAX_TRACEBACK_FILTERING=off\n"))
    assert digest(context, "jax-tpu") != before["jax-tpu"]


def test_the_variant_is_chosen_from_framework_and_device() -> None:
    chosen = {(f, d): variants.variant_for(f, d) for f in ("tensorflow", "jax") for d in variants.DEVICES}
    assert chosen == {
        ("tensorflow", "cpu"): "cpu",
        ("tensorflow", "gpu"): "gpu",
        ("tensorflow", "tpu"): "tpu",
        ("jax", "cpu"): "jax-tpu",  # no JAX-only CPU image: JAX runs on the CPU where it finds no TPU chips
        ("jax", "gpu"): "jax-gpu",
        ("jax", "tpu"): "jax-tpu",
    }
    assert all(image.FRAMEWORKS[v] == f and v in image.VARIANTS for (f, _), v in chosen.items())
    with pytest.raises(ValueError, match="unknown device"):
        variants.variant_for("jax", "arm")
    with pytest.raises(ValueError, match="unknown framework"):
        variants.variant_for("torch", "tpu")
    ref = image.reference("p", "us-central1", "tpu-runner", "jax-tpu", "0.1.0-0123456789abcdef")
    assert variants.variant_of(ref) == "jax-tpu"
    assert variants.variant_of(image.local_reference("gpu", "t")) == "gpu"
    assert variants.variant_of("us-docker.pkg.dev/p/r/trainer:v1") is None  # not named by `runner build`
    assert variants.variant_of("us-docker.pkg.dev/p/r/trainer-arm:v1") is None


def _job(image_ref: str, framework: str | None) -> spec.JobSpec:
    body: dict[str, object] = {"name": "job", "image": image_ref}
    if framework:
        body["training"] = {"framework": framework}
    else:
        body["command"] = ["python", "train.py"]
    return spec.JobSpec.model_validate(body)


@pytest.mark.parametrize(
    ("variant", "framework", "refused"),
    [
        ("tpu", "tensorflow", None),
        ("jax-tpu", "jax", None),
        ("tpu", "jax", "holds TensorFlow and no JAX"),
        ("jax-tpu", "tensorflow", "holds JAX and no TensorFlow"),
        ("jax-gpu", "jax", "built for GPU, not TPU"),
        ("cpu", "tensorflow", "built for CPU, not TPU"),
        ("jax-tpu", None, None),  # a custom command brings its own engine: only the device counts
        ("tpu", None, None),
        ("gpu", None, "built for GPU, not TPU"),
    ],
)
def test_a_tpu_vm_job_is_refused_an_image_of_the_wrong_variant(
    variant: str, framework: str | None, refused: str | None
) -> None:
    job = _job(image.reference("p", "us-central1", "tpu-runner", variant, "0.1.0-0123456789abcdef"), framework)
    if refused is None:
        plan.check_image_variant(job, "tpu")
        return
    with pytest.raises(PlanError, match=refused) as caught:
        plan.check_image_variant(job, "tpu")
    wanted = variants.variant_for(framework or "tensorflow", "tpu")
    assert f"make push VARIANT={wanted} " in (caught.value.hint or "")
    # An image of any other name is taken as it is.
    plan.check_image_variant(_job("us-central1-docker.pkg.dev/p/r/trainer:v1", framework), "tpu")


def test_plan_cloud_checks_the_variant() -> None:
    job = _job(image.reference("my-project", "us-central1", "tpu-runner", "tpu", "0.1.0-0123456789abcdef"), "jax")
    with pytest.raises(PlanError, match="holds TensorFlow and no JAX"):
        backends.plan_cloud(job, None, storage="gs://my-bucket/x", project="my-project", zone="us-central1-a")


def test_tag_changes_with_mode_symlinks_and_build_args(context: Path) -> None:
    before = digest(context)
    script = context / "runner" / "__main__.py"
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    assert digest(context) != before
    script.chmod(script.stat().st_mode & ~(stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH))
    assert digest(context) == before
    link = context / "runner" / "launch" / "linked.sh"
    link.symlink_to("startup-script.sh")
    linked = digest(context)
    assert linked != before
    link.unlink()
    link.symlink_to("elsewhere.sh")
    assert digest(context) not in (before, linked)
    link.unlink()
    # Build arguments count, except one given with its default value (the build is the same).
    assert digest(context, LIBTPU_VERSION="0.0.15") != digest(context)
    assert digest(context, LIBTPU_VERSION="0.0.14") == digest(context)


def test_tag_ignores_mtimes_and_what_the_dockerignore_keeps_out(context: Path) -> None:
    before = digest(context)
    for path in context.rglob("*"):
        if path.is_file() and not path.is_symlink():
            os.utime(path, (1, 1))
    junk = {
        "runner/__pycache__/worker.cpython-311.pyc": "bytecode",
        "runner/train/model.pyo": "bytecode",
        "README.md": "docs",
        "docker/README.md": "docs",
        "tests/test_new.py": "tests",
        ".venv/lib/site.py": "venv",
        "runs/x/metrics.jsonl": "a run",
        ".git/HEAD": "ref",
    }
    for rel, text in junk.items():
        (context / rel).parent.mkdir(parents=True, exist_ok=True)
        (context / rel).write_text(text)
    dockerignore = context / "docker" / "Dockerfile.dockerignore"
    dockerignore.write_text("# another comment\n" + dockerignore.read_text())
    assert digest(context) == before


def test_dockerignore_semantics_match_docker() -> None:
    rules = image.parse_ignore("*\n!runner\n!docker/keep.txt\n**/__pycache__\n**/*.py[cod]\nrunner/secret/**\n")
    assert not image.ignored("runner/a.py", rules)
    assert image.ignored("runner/x/__pycache__/a.cpython-311.pyc", rules)
    assert image.ignored("runner/b.pyc", rules)
    assert image.ignored("runner/secret/key", rules)
    assert not image.ignored("docker/keep.txt", rules)
    assert image.ignored("docker/other.txt", rules)
    assert image.ignored("README.md", rules)
    rules = image.parse_ignore("/build\n*.log\n!important.log\n")
    assert (
        image.ignored("build/x", rules) and image.ignored("a.log", rules) and not image.ignored("important.log", rules)
    )
    assert not image.ignored("sub/a.log", rules)  # `*` stays within one directory, as in Docker


def _dockerfile_sources() -> set[str]:
    """Paths of the build context the Dockerfile reads: COPY without --from, and bind mounts without from=."""
    sources = set()
    for keyword, rest in image.instructions((REPO / image.DOCKERFILE).read_text()):
        words = rest.split()
        if keyword == "COPY" and not any(w.startswith("--from") for w in words):
            sources |= {w for w in words[:-1] if not w.startswith("--")}
        for mount in re.findall(r"--mount=(\S+)", rest):
            fields = dict(part.split("=", 1) for part in mount.split(","))
            if fields.get("type") == "bind" and "from" not in fields:
                sources.add(fields["source"])
    return sources


def test_the_tag_reads_exactly_what_the_dockerfile_copies() -> None:
    files = image.context_files(REPO)
    sources = _dockerfile_sources()
    assert sources == {"pyproject.toml", "docker/requirements.py", "docker/constraints.txt", "runner"}
    covered = {f for f in files if any(f == s or f.startswith(s + "/") for s in sources)}
    assert covered == set(files), "the .dockerignore lets in files the image never uses"
    assert all(any(f == s or f.startswith(s + "/") for f in files) for s in sources)
    assert not any("__pycache__" in f or f.endswith(".pyc") for f in files)


# -- references -------------------------------------------------------------------------------------------------


def test_reference_is_what_the_pre_flight_accepts() -> None:
    ref = image.reference("my-project", "us-central1", "tpu-runner", "tpu", "0.1.0-0123456789abcdef")
    assert ref == "us-central1-docker.pkg.dev/my-project/tpu-runner/trainer-tpu:0.1.0-0123456789abcdef"
    plan.check_image_for_cloud(ref)
    assert re.match(spec.IMAGE_RE, ref)

    def split(text: str) -> tuple[str, str, str]:
        parsed = ImageRef.parse(text)
        return parsed.registry, parsed.path, parsed.version

    assert split(ref) == ("us-central1-docker.pkg.dev", "my-project/tpu-runner/trainer-tpu", "0.1.0-0123456789abcdef")
    assert image.local_reference("cpu", "t") == "trainer-cpu:t"
    assert split("python:3.11") == ("registry-1.docker.io", "library/python", "3.11")
    digest_ref = "localhost:5000/a/b@sha256:" + "0" * 64
    assert split(digest_ref) == ("localhost:5000", "a/b", "sha256:" + "0" * 64)
    assert ImageRef.parse("trainer-cpu").normalized == "library/trainer-cpu:latest"
    assert ImageRef.parse(digest_ref).normalized == digest_ref
    with pytest.raises(ValueError):
        ImageRef.parse("UPPER/case")


def test_print_ref_needs_no_docker() -> None:
    from typer.testing import CliRunner

    from runner.cli import app

    argv = ["build", "--variant", "tpu", "--project", "my-project", "--region", "europe-west4", "--print-ref"]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 0, result.output
    tag = image.content_tag("tpu")
    assert result.output.strip() == f"europe-west4-docker.pkg.dev/my-project/tpu-runner/trainer-tpu:{tag}"
    assert CliRunner().invoke(app, ["build", "--variant", "arm", "--print-ref"]).exit_code == 2


def test_build_picks_the_variant_from_the_spec(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from runner.cli import app

    job = tmp_path / "job.yaml"
    job.write_text("name: jax-job\nimage: trainer:v1\ntraining:\n  framework: jax\n")
    for device, variant in [("tpu", "jax-tpu"), ("gpu", "jax-gpu"), ("cpu", "jax-tpu")]:
        argv = ["build", "--spec", str(job), "--device", device, "--project", "p", "--print-ref"]
        result = CliRunner().invoke(app, argv)
        assert result.exit_code == 0, result.output
        tag = image.content_tag(variant)
        assert result.stdout.strip() == f"us-central1-docker.pkg.dev/p/tpu-runner/trainer-{variant}:{tag}"
        assert f"variant: {variant} (training.framework jax on {device})" in result.stderr
    job.write_text("name: tf-job\nimage: trainer:v1\ntraining:\n  epochs: 1\n")
    result = CliRunner().invoke(app, ["build", "--spec", str(job), "--print-ref"])  # --device tpu by default
    assert result.exit_code == 0 and result.stdout.strip() == f"trainer-tpu:{image.content_tag('tpu')}"
    result = CliRunner().invoke(app, ["build", "--spec", str(job), "--variant", "cpu", "--print-ref"])
    assert result.exit_code == 2 and "not both" in result.output
    assert CliRunner().invoke(app, ["build", "--spec", str(job), "--device", "arm", "--print-ref"]).exit_code == 2


# -- the registry check -----------------------------------------------------------------------------------------

ACCESS_TOKEN = "ya29.access-token"
REGISTRY_TOKEN = "registry-jwt"


class Registry:
    """A real HTTP server with the manifest HEAD and token service of a Docker Registry v2 (Artifact Registry's
    flow: a Bearer access token is accepted directly; otherwise 401 with a challenge, and the token service trades
    Basic oauth2accesstoken:<access token> for a registry token)."""

    def __init__(self) -> None:
        self.images = {("p/r/trainer-cpu", "t1"), ("p/r/trainer-cpu", "sha256:" + "a" * 64)}
        self.accept_access_token = True
        self.forbidden: set[str] = set()
        self.realm: str | None = None  # the token service named in the challenge (default: this server)
        self.requests: list[tuple[str, str, str]] = []
        self.port = free_port()
        registry = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_HEAD(self) -> None:
                auth = self.headers.get("Authorization", "")
                registry.requests.append(("HEAD", self.path, auth))
                match = re.fullmatch(r"/v2/(.+)/manifests/(.+)", self.path)
                ok = {f"Bearer {REGISTRY_TOKEN}"} | (
                    {f"Bearer {ACCESS_TOKEN}"} if registry.accept_access_token else set()
                )
                if not match:
                    self.send_response(400)
                elif auth not in ok:
                    self.send_response(401)
                    realm = registry.realm or f"http://127.0.0.1:{registry.port}/v2/token"
                    self.send_header("WWW-Authenticate", f'Bearer realm="{realm}",service="test-registry"')
                elif match.group(1) in registry.forbidden:
                    self.send_response(403)
                elif (match.group(1), match.group(2)) in registry.images:
                    self.send_response(200)
                    self.send_header("Docker-Content-Digest", "sha256:" + "a" * 64)
                else:
                    self.send_response(404)
                self.end_headers()

            def do_GET(self) -> None:
                auth = self.headers.get("Authorization", "")
                registry.requests.append(("GET", self.path, auth))
                basic = "Basic " + base64.b64encode(f"oauth2accesstoken:{ACCESS_TOKEN}".encode()).decode()
                if self.path.startswith("/v2/token?") and auth == basic and "service=test-registry" in self.path:
                    body = json.dumps({"token": REGISTRY_TOKEN}).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                else:
                    self.send_response(401)
                    self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.url = f"http://127.0.0.1:{self.port}"


@pytest.fixture
def registry() -> Iterator[Registry]:
    reg = Registry()
    thread = threading.Thread(target=reg.server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield reg
    finally:
        reg.server.shutdown()
        reg.server.server_close()


REF = "us-central1-docker.pkg.dev/p/r/trainer-cpu"


def check(registry: Registry, ref: str, token: str | None = ACCESS_TOKEN) -> image.RegistryAnswer:
    return image.check_image(ref, token=(lambda: token) if token else None, endpoint=registry.url, timeout=5)


def test_exists_and_missing(registry: Registry) -> None:
    assert check(registry, f"{REF}:t1") == image.RegistryAnswer(True, "HTTP 200")
    assert check(registry, f"{REF}@sha256:" + "a" * 64).exists is True
    assert check(registry, f"{REF}:t2") == image.RegistryAnswer(False, "not found (HTTP 404)")
    assert check(registry, "us-central1-docker.pkg.dev/p/r/other:t1").exists is False
    head = registry.requests[0]
    assert head == ("HEAD", "/v2/p/r/trainer-cpu/manifests/t1", f"Bearer {ACCESS_TOKEN}")


def test_token_exchange_when_the_access_token_is_not_taken_directly(registry: Registry) -> None:
    registry.accept_access_token = False
    assert check(registry, f"{REF}:t1").exists is True
    assert check(registry, f"{REF}:t9").exists is False
    methods = [(m, p.split("?")[0], a.split(" ")[0]) for m, p, a in registry.requests[:3]]
    assert methods == [
        ("HEAD", "/v2/p/r/trainer-cpu/manifests/t1", "Bearer"),
        ("GET", "/v2/token", "Basic"),
        ("HEAD", "/v2/p/r/trainer-cpu/manifests/t1", "Bearer"),
    ]
    assert "scope=repository%3Ap%2Fr%2Ftrainer-cpu%3Apull" in registry.requests[1][1]


def test_cannot_tell_is_none_never_an_exception(registry: Registry) -> None:
    registry.accept_access_token = False
    wrong = check(registry, f"{REF}:t1", token="not-the-token")
    assert wrong.exists is None and "token service refused (HTTP 401)" in wrong.detail
    anonymous = check(registry, f"{REF}:t1", token=None)
    assert anonymous.exists is None
    registry.accept_access_token = True
    registry.forbidden.add("p/r/trainer-cpu")
    denied = check(registry, f"{REF}:t1")
    assert denied.exists is None and "HTTP 403" in denied.detail and "artifactregistry.reader" in denied.detail

    def no_credentials() -> str:
        raise RuntimeError("Your default credentials were not found.")

    none = image.check_image(f"{REF}:t1", token=no_credentials, endpoint=registry.url)
    detail = "no credentials for us-central1-docker.pkg.dev: Your default credentials were not found."
    assert none == image.RegistryAnswer(None, detail)
    closed = f"http://127.0.0.1:{free_port()}"
    unreachable = image.check_image(f"{REF}:t1", token=lambda: ACCESS_TOKEN, endpoint=closed, timeout=5)
    assert unreachable.exists is None and unreachable.detail.startswith("cannot reach")


def test_a_google_token_never_goes_to_another_host(registry: Registry) -> None:
    other = Registry()  # a token service on another host
    thread = threading.Thread(target=other.server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        registry.accept_access_token = False
        registry.realm = f"http://localhost:{other.port}/v2/token"
        assert check(registry, f"{REF}:t1").exists is None
        assert [(m, a) for m, _, a in other.requests] == [("GET", "")]  # asked, but without the access token
    finally:
        other.server.shutdown()
        other.server.server_close()


def test_endpoint_from_the_environment_and_anonymous_without_a_google_host(
    registry: Registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(image.REGISTRY_ENDPOINT_ENV, registry.url)
    registry.images.add(("library/python", "3.11"))
    # Docker Hub reference: asked anonymously (401 challenge, anonymous token request refused -> cannot tell).
    assert image.image_exists("python:3.11") is None
    assert all(auth == "" for _, _, auth in registry.requests)
    # A Google host with the endpoint override: Application Default Credentials are not used either.
    assert image.image_exists(f"{REF}:t1") is None


def test_require_in_registry_is_the_pre_flight_contract(registry: Registry) -> None:
    kwargs = {"token": lambda: ACCESS_TOKEN, "endpoint": registry.url}
    assert image.require_in_registry(f"{REF}:t1", **kwargs) is None
    with pytest.raises(PlanError, match="is not in the registry") as err:
        image.require_in_registry(f"{REF}:t2", **kwargs)
    assert err.value.exit_code == 2 and "make push" in (err.value.hint or "")
    registry.forbidden.add("p/r/trainer-cpu")
    warning = image.require_in_registry(f"{REF}:t1", **kwargs)
    assert warning and warning.startswith(f"could not check that {REF}:t1 exists")
