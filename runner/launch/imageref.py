"""Container image references, parsed once: what the spec accepts, what the planner checks, what the registry is asked.

Docker's grammar (distribution/reference), simplified: [HOST[:PORT]/]PATH[:TAG][@sha256:DIGEST]. The first path
component is a registry host only if it has a dot or a port, or is localhost, as Docker decides; without one the
image is on Docker Hub (and a one-component path is under library/). Standard library only: the spec (and so
`runner validate`) imports this.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_LABEL = r"[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?"
_HOST = rf"(?:{_LABEL}(?:\.{_LABEL})+(?::[0-9]+)?|localhost(?::[0-9]+)?|{_LABEL}:[0-9]+)"
IMAGE_RE = (
    rf"^(?:(?P<host>{_HOST})/)?(?P<path>{_COMPONENT}(?:/{_COMPONENT})*)"
    r"(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}))?(?:@(?P<digest>sha256:[a-f0-9]{64}))?$"
)
_IMAGE = re.compile(IMAGE_RE)
# Artifact Registry: REGION-docker.pkg.dev/PROJECT/REPOSITORY/IMAGE (cloud.google.com/artifact-registry/docs/docker).
_ARTIFACT_REGISTRY = re.compile(r"^(?P<project>[a-z][-a-z0-9.:]*[a-z0-9])/(?P<repo>[a-z0-9][-a-z0-9]*)/[a-z0-9._/-]+$")
DOCKER_HUB = "registry-1.docker.io"


@dataclass(frozen=True)
class ImageRef:
    host: str | None  # None: Docker Hub, named without a host
    path: str  # the repository path on that registry (library/NAME on Docker Hub)
    tag: str | None
    digest: str | None

    @classmethod
    def parse(cls, ref: str) -> ImageRef:
        """Raises ValueError for what is not an image reference."""
        m = _IMAGE.match(ref)
        if not m:
            raise ValueError(f"{ref!r} is not a container image reference")
        path = m["path"]
        if m["host"] is None and "/" not in path:
            path = f"library/{path}"
        return cls(m["host"], path, m["tag"], m["digest"])

    @property
    def registry(self) -> str:
        return self.host or DOCKER_HUB

    @property
    def version(self) -> str:
        """What the registry is asked for: the digest, else the tag, else latest."""
        return self.digest or self.tag or "latest"

    @property
    def repository(self) -> str:
        """HOST/PATH as written (what `docker pull` and a registry fault name), without tag or digest."""
        return f"{self.host}/{self.path}" if self.host else self.path

    @property
    def normalized(self) -> str:
        """With its tag spelled out (:latest when none), as Docker stores it."""
        if self.digest:
            return f"{self.repository}@{self.digest}"
        return f"{self.repository}:{self.tag or 'latest'}"

    @property
    def is_google(self) -> bool:
        host = self.host or ""
        return host.endswith("-docker.pkg.dev") or host == "gcr.io" or host.endswith(".gcr.io")

    @property
    def artifact_registry_problem(self) -> str | None:
        """Why an Artifact Registry reference is malformed (it needs PROJECT/REPOSITORY/IMAGE), else None."""
        if not (self.host or "").endswith("-docker.pkg.dev"):
            return None
        if _ARTIFACT_REGISTRY.match(self.path):
            return None
        return "an Artifact Registry image is REGION-docker.pkg.dev/PROJECT/REPOSITORY/IMAGE[:TAG]"
