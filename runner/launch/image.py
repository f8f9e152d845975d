"""The trainer image: its content tag, its Artifact Registry reference, and whether a registry has it.

    tag        content_tag(variant): a digest of exactly what goes into the image (below); the same code gives the
               same tag on every machine, so a retry or a second submit never rebuilds or re-pushes
    reference  REGION-docker.pkg.dev/PROJECT/REPO/trainer-VARIANT:TAG (and trainer-VARIANT:TAG locally)
    exists     image_exists(ref): asks the registry itself (Docker Registry HTTP API v2), for the pre-flight check

Building and pushing, with Docker or Podman, is runner.launch.build.

What the tag covers: docker/Dockerfile, the variant and any other build argument given, and every file of the build
context that docker/Dockerfile.dockerignore lets in (pyproject.toml, docker/requirements.py, docker/constraints.txt,
runner/), by path, content, executable bit and symlink target. Not mtimes, not anything the .dockerignore keeps out
(caches, .venv, README.md, tests). The base image is named by tag in the Dockerfile, so a rebuilt upstream tag is
not seen; pass --build-arg PYTHON_IMAGE=python:3.11.13-slim-bookworm@sha256:... to pin it by digest.

Only the standard library is imported here; google-auth is loaded when a registry is asked.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import urllib.parse
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runner.errors import PlanError, UsageError
from runner.launch.imageref import ImageRef
from runner.launch.variants import BY_NAME, IMAGE_NAME, VARIANTS

# The variants and the training.framework each one runs (runner.launch.variants; the JAX ones hold no TensorFlow).
FRAMEWORKS = {name: v.framework for name, v in BY_NAME.items()}
REPO_ROOT = Path(__file__).resolve().parents[2]  # the build context: a checkout of this repository
DOCKERFILE = "docker/Dockerfile"
TAG_SCHEME = "tpu-runner-image-tag/1"  # bump when the definition of the tag changes
REGISTRY_ENDPOINT_ENV = "RUNNER_REGISTRY_ENDPOINT"  # tests: send registry requests to http://127.0.0.1:PORT instead
MANIFEST_TYPES = ", ".join(
    [
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
        "application/vnd.docker.distribution.manifest.v2+json",
    ]
)

# -- .dockerignore --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class IgnoreRule:
    pattern: str
    regex: re.Pattern[str]
    exception: bool  # a `!pattern`: lets back in what an earlier rule kept out


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    """Docker's pattern syntax (moby/patternmatcher): `**` any number of path segments, `*` and `?` within one."""
    out, i = "", 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**", i):
            i += 2
            if pattern.startswith("/", i):
                out, i = out + "(?:.*/)?", i + 1
            else:
                out += ".*"
            continue
        if c == "*":
            out += "[^/]*"
        elif c == "?":
            out += "[^/]"
        elif c == "[" and (end := pattern.find("]", i + 1)) > i:
            body = pattern[i + 1 : end]
            out += "[" + ("^" + body[1:] if body.startswith("^") else body) + "]"
            i = end
        elif c == "\\" and i + 1 < len(pattern):
            i += 1
            out += re.escape(pattern[i])
        else:
            out += re.escape(c)
        i += 1
    return re.compile(f"^{out}$")


def parse_ignore(text: str) -> list[IgnoreRule]:
    rules = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        exception = line.startswith("!")
        pattern = os.path.normpath(line[1:].strip() if exception else line).lstrip("/")
        rules.append(IgnoreRule(pattern, _pattern_regex(pattern), exception))
    return rules


def ignore_rules(root: Path = REPO_ROOT, dockerfile: str = DOCKERFILE) -> list[IgnoreRule]:
    """BuildKit's choice: <Dockerfile>.dockerignore next to the Dockerfile, else .dockerignore at the context root."""
    for path in (root / f"{dockerfile}.dockerignore", root / ".dockerignore"):
        if path.is_file():
            return parse_ignore(path.read_text())
    return []


def ignored(path: str, rules: list[IgnoreRule]) -> bool:
    """As Docker decides: the last rule that matches the path or one of its parent directories wins."""
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    excluded = False
    for rule in rules:
        if any(rule.regex.match(p) for p in prefixes):
            excluded = not rule.exception
    return excluded


def context_files(root: Path = REPO_ROOT, rules: list[IgnoreRule] | None = None) -> list[str]:
    """The build context as Docker sends it: every file and symlink under `root` the rules let in, sorted."""
    rules = ignore_rules(root) if rules is None else rules
    exceptions = [r.pattern for r in rules if r.exception]
    found: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = Path(dirpath).relative_to(root).as_posix()
        rel_dir = "" if rel_dir == "." else rel_dir + "/"
        keep = []
        for name in sorted(dirnames):
            rel = rel_dir + name
            if (root / rel).is_symlink():
                filenames.append(name)
            elif not ignored(rel, rules) or any(e.startswith(rel + "/") or "*" in e.split("/")[0] for e in exceptions):
                keep.append(name)  # walk on: something below may be let in again
        dirnames[:] = keep
        found += [rel_dir + name for name in filenames if not ignored(rel_dir + name, rules)]
    return sorted(found)


# -- the content tag --------------------------------------------------------------------------------------------------


def content_digest(variant: str, *, root: Path = REPO_ROOT, build_args: dict[str, str] | None = None) -> str:
    """sha256 over the Dockerfile, the build arguments and the build context (see the module docstring)."""
    if variant not in VARIANTS:
        raise UsageError(f"unknown image variant {variant!r}", hint=f"use one of {', '.join(VARIANTS)}")
    dockerfile = root / DOCKERFILE
    if not dockerfile.is_file():
        raise UsageError(f"{dockerfile} not found", hint="build the image from a checkout of the repository")
    text = dockerfile.read_bytes()
    args = effective_build_args(variant, build_args, text.decode())
    digest = hashlib.sha256()

    def put(*items: str | bytes) -> None:
        for item in items:
            data = item.encode() if isinstance(item, str) else item
            digest.update(len(data).to_bytes(8, "big") + data)

    put(TAG_SCHEME, text, json.dumps(args, sort_keys=True))
    for rel in context_files(root):
        path = root / rel
        if path.is_symlink():
            put("link", rel, os.readlink(path))
        else:
            mode = "x" if path.stat().st_mode & 0o111 else "-"  # Docker keeps modes; only the x bit is portable
            put("file", rel, mode, hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def content_tag(variant: str, *, root: Path = REPO_ROOT, build_args: dict[str, str] | None = None) -> str:
    """The image tag for this code: '<runner version>-<16 hex digits of content_digest>', e.g. '0.1.0-3fa2...'."""
    from runner import __version__

    return f"{__version__}-{content_digest(variant, root=root, build_args=build_args)[:16]}"


def effective_build_args(variant: str, given: dict[str, str] | None, dockerfile_text: str) -> dict[str, str]:
    """VARIANT and the arguments that differ from the Dockerfile's defaults (passing a default changes nothing)."""
    defaults = {name: value for name, value in arg_defaults(dockerfile_text) if value is not None}
    args = {k: v for k, v in (given or {}).items() if k != "VARIANT" and defaults.get(k) != v}
    return {"VARIANT": variant, **dict(sorted(args.items()))}


def image_name(variant: str) -> str:
    return f"{IMAGE_NAME}-{variant}"


def reference(project: str, region: str, repo: str, variant: str, tag: str) -> str:
    """REGION-docker.pkg.dev/PROJECT/REPO/trainer-VARIANT:TAG, the form the planner's check_image_for_cloud accepts."""
    return f"{region}-docker.pkg.dev/{project}/{repo}/{image_name(variant)}:{tag}"


def local_reference(variant: str, tag: str) -> str:
    return f"{image_name(variant)}:{tag}"


# -- the Dockerfile, read as Docker would: its ARGs (for the tag), its final config (tests hold --process to it) -


def instructions(text: str) -> Iterable[tuple[str, str]]:
    logical = ""
    for line in text.splitlines():
        stripped = line.strip()
        if not logical and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):
            continue  # a comment inside a continued instruction
        if stripped.endswith("\\"):
            logical += stripped[:-1] + " "
            continue
        logical += stripped
        keyword, _, rest = logical.partition(" ")
        yield keyword.upper(), rest.strip()
        logical = ""


def arg_defaults(text: str) -> Iterable[tuple[str, str | None]]:
    for keyword, rest in instructions(text):
        if keyword == "ARG":
            name, eq, value = rest.partition("=")
            yield name.strip(), (value.strip().strip('"') if eq else None)


@dataclass(frozen=True)
class RegistryAnswer:
    exists: bool | None  # None: could not tell
    detail: str  # why, in words: "HTTP 200", "not found (HTTP 404)", "no credentials: ..."


def _adc_token() -> str:
    """An OAuth2 access token from Application Default Credentials (raises when there are none)."""
    import google.auth
    import google.auth.transport.requests

    from runner.credentials import CLOUD_PLATFORM

    credentials, _ = google.auth.default(scopes=[CLOUD_PLATFORM])
    credentials.refresh(google.auth.transport.requests.Request())
    return str(credentials.token)


def _http(method: str, url: str, headers: dict[str, str], timeout: float) -> tuple[int, dict[str, str], bytes]:
    import urllib.error
    import urllib.request  # here, not at the top: http.client and email cost `runner --help` ~30 ms

    class _NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any, **kwargs: Any) -> None:
            return None  # a manifest HEAD is answered, not redirected; never carry a token elsewhere

    request = urllib.request.Request(url, method=method, headers=headers)
    opener = urllib.request.build_opener(_NoRedirect)
    try:
        with opener.open(request, timeout=timeout) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers or {}), b""


def _challenge(header: str) -> dict[str, str]:
    scheme, _, params = header.partition(" ")
    if scheme.lower() != "bearer":
        return {}
    return {k.lower(): v for k, v in re.findall(r'(\w+)="([^"]*)"', params)}


def check_image(
    ref: str,
    *,
    token: Callable[[], str] | None = None,
    endpoint: str | None = None,
    timeout: float = 10.0,
) -> RegistryAnswer:
    """Ask the registry whether `ref` exists: HEAD /v2/<name>/manifests/<tag or digest>, as `docker pull` would.

    Credentials: for Artifact Registry and gcr.io, an OAuth2 access token from `token()` (default: Application
    Default Credentials), sent as a Bearer token, and, if the registry answers 401 with a Bearer challenge, traded
    at its token service for a registry token (user `oauth2accesstoken`, as `docker login` does). A Google token is
    only ever sent to the registry's own host. Other registries are asked anonymously (public images).
    `endpoint` (default $RUNNER_REGISTRY_ENDPOINT) replaces https://<host> in every URL; with it, the default
    credentials are not used (pass `token` to send one). Never raises for network or credential problems.
    """
    parsed = ImageRef.parse(ref)
    host, name, tag = parsed.registry, parsed.path, parsed.version
    endpoint = endpoint or os.environ.get(REGISTRY_ENDPOINT_ENV)
    base = (endpoint or f"https://{host}").rstrip("/")
    access = None
    if token is not None or (parsed.is_google and not endpoint):
        try:
            access = (token or _adc_token)()
        except Exception as exc:  # no ADC, expired refresh token, no network to the token endpoint
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            return RegistryAnswer(None, f"no credentials for {host}: {first[:200]}")
    url = f"{base}/v2/{name}/manifests/{urllib.parse.quote(tag, safe=':')}"
    headers = {"Accept": MANIFEST_TYPES, **({"Authorization": f"Bearer {access}"} if access else {})}
    try:
        status, reply, _ = _http("HEAD", url, headers, timeout)
        challenge = _challenge(reply.get("WWW-Authenticate", reply.get("www-authenticate", "")))
        if status == 401 and challenge.get("realm"):
            realm = challenge["realm"]
            query = {
                k: v for k, v in (("service", challenge.get("service")), ("scope", f"repository:{name}:pull")) if v
            }
            exchange = {}
            if access and urllib.parse.urlsplit(realm).netloc == urllib.parse.urlsplit(base).netloc:
                exchange["Authorization"] = "Basic " + base64.b64encode(f"oauth2accesstoken:{access}".encode()).decode()
            sep = "&" if "?" in realm else "?"
            t_status, _, body = _http("GET", f"{realm}{sep}{urllib.parse.urlencode(query)}", exchange, timeout)
            if t_status != 200:
                return RegistryAnswer(None, f"the registry's token service refused (HTTP {t_status})")
            grant = json.loads(body or b"{}")
            registry_token = grant.get("token") or grant.get("access_token")
            if not registry_token:
                return RegistryAnswer(None, "the registry's token service sent no token")
            status, _, _ = _http("HEAD", url, {**headers, "Authorization": f"Bearer {registry_token}"}, timeout)
    except (OSError, ValueError) as exc:  # refused, DNS, TLS, timeout, a garbled token reply
        return RegistryAnswer(None, f"cannot reach {base}: {exc}")
    if status == 200:
        return RegistryAnswer(True, "HTTP 200")
    if status == 404:
        return RegistryAnswer(False, "not found (HTTP 404)")
    if status in (401, 403):
        return RegistryAnswer(None, f"not allowed to read it (HTTP {status}); roles/artifactregistry.reader is needed")
    return RegistryAnswer(None, f"unexpected HTTP {status}")


def image_exists(ref: str, **kwargs: object) -> bool | None:
    """True: the registry has `ref` (tag or digest). False: the registry says it does not (HTTP 404).
    None: cannot tell (no credentials, no network, not allowed, an error). See check_image for the details."""
    return check_image(ref, **kwargs).exists  # type: ignore[arg-type]


def require_in_registry(ref: str, **kwargs: object) -> str | None:
    """Pre-flight: raise PlanError (exit 2) when the registry says `ref` does not exist; return a warning line when
    it cannot tell, None when it is there. A TPU VM would otherwise boot, fail to pull, and be paid for."""
    answer = check_image(ref, **kwargs)  # type: ignore[arg-type]
    if answer.exists is False:
        raise PlanError(
            f"image {ref} is not in the registry",
            hint="build and push it first: `runner build --spec JOB.yaml --push --project ...` (or `make push "
            "VARIANT=tpu PROJECT=...`, VARIANT=jax-tpu for training.framework: jax); it prints the reference to put "
            "in the spec",
        )
    return None if answer.exists else f"could not check that {ref} exists: {answer.detail}"
