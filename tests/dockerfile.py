"""What an image built from docker/Dockerfile runs (entrypoint, environment, user), read from the Dockerfile itself:
the tests check the variants without a Docker engine. Test code: the product never needs it."""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from runner.launch import image


@dataclass(frozen=True)
class ImageConfig:
    """What the final stage of docker/Dockerfile sets for a variant. `env` is what the Dockerfile itself sets,
    not what the base image brings (PATH, LANG, PYTHON_VERSION)."""

    entrypoint: list[str]
    cmd: list[str]
    env: dict[str, str] = field(default_factory=dict)
    user: str | None = None
    workdir: str | None = None

    @property
    def argv(self) -> list[str]:
        return [*self.entrypoint, *self.cmd]


def _expand(value: str, scope: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: scope.get(m.group(1) or m.group(2), ""), value)


def _exec_form(rest: str) -> list[str]:
    if rest.startswith("["):
        return [str(part) for part in json.loads(rest)]
    return ["/bin/sh", "-c", rest]


def image_config(
    variant: str, *, dockerfile: Path = image.REPO_ROOT / image.DOCKERFILE, build_args: dict[str, str] | None = None
) -> ImageConfig:
    """Follow the final stage's FROM chain through the stages of the Dockerfile and collect ENV, ENTRYPOINT, CMD,
    USER and WORKDIR. Supports the instructions docker/Dockerfile uses (not ONBUILD or shell-form ENV lists)."""
    text = dockerfile.read_text()
    args = {**{k: v for k, v in image.arg_defaults(text) if v is not None}, **(build_args or {})}
    args["VARIANT"] = variant
    global_scope = dict(args)
    stages: dict[str, dict] = {}
    current: dict | None = None
    for keyword, rest in image.instructions(text):
        if keyword == "FROM":
            words = [w for w in rest.split() if not w.startswith("--platform")]
            base = _expand(words[0], global_scope)
            name = words[2] if len(words) > 2 and words[1].upper() == "AS" else f"#{len(stages)}"
            parent = stages.get(base)
            current = {"env": {}, "entrypoint": [], "cmd": [], "user": None, "workdir": None, "scope": dict(args)}
            if parent:
                current.update({k: (dict(v) if isinstance(v, dict) else v) for k, v in parent.items()})
            stages[name] = current
            stages["__last__"] = current
        elif current is None:
            continue
        elif keyword == "ENV":
            for pair in shlex.split(rest):
                key, _, value = pair.partition("=")
                current["env"][key] = _expand(value, {**current["scope"], **current["env"]})
        elif keyword == "ARG":
            name, eq, value = rest.partition("=")
            current["scope"][name] = args.get(name, value.strip('"') if eq else "")
        elif keyword == "ENTRYPOINT":
            current["entrypoint"], current["cmd"] = _exec_form(rest), []
        elif keyword == "CMD":
            current["cmd"] = _exec_form(rest)
        elif keyword == "USER":
            current["user"] = _expand(rest, current["scope"])
        elif keyword == "WORKDIR":
            current["workdir"] = _expand(rest, current["scope"])
    final = stages.get("__last__")
    if final is None:
        raise ValueError(f"{dockerfile} has no FROM")
    return ImageConfig(final["entrypoint"], final["cmd"], final["env"], final["user"], final["workdir"])


# -- the registry -------------------------------------------------------------------------------------------------
