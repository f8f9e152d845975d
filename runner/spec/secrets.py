"""The spec's `secrets:`: where each secret of a job is kept, never its value.

Every value under `secrets:` is a reference, in a form that says by itself that it is one, so that a value pasted
by mistake is refused rather than taken for the name of a secret (and written into the run directory as one):

    projects/P/secrets/S/versions/V   a Secret Manager version (V a number or `latest`); without /versions/V: latest
    S/versions/V                      the same in the run's project (accelerator.project, --project, gcloud's)
    env:NAME                          an environment variable of this machine (--local runs only)
    file:PATH                         a file of this machine (--local runs only; ~ is expanded)

A secret reaches the job as an environment variable named by its key (`as: env`, the default) or as a file on a
memory file system whose path that variable holds (`as: file`). The values themselves are read only where the job
runs: by the TPU VM's bootstrap with the VM's own service account, or by `runner submit --local` on this machine.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

if TYPE_CHECKING:
    from runner.spec import JobSpec

_SECRET_ID = r"[A-Za-z0-9_-]{1,255}"  # Secret Manager's secret ids
_VERSION = r"[1-9][0-9]{0,18}|latest"
_PROJECT = r"[a-z][-a-z0-9]{4,28}[a-z0-9]|[0-9]{1,20}"  # a project id, or its number (as the API names it)
FULL_RE = re.compile(
    rf"^projects/(?P<project>{_PROJECT})/secrets/(?P<secret>{_SECRET_ID})(?:/versions/(?P<version>{_VERSION}))?$"
)
SHORT_RE = re.compile(rf"^(?P<secret>{_SECRET_ID})/versions/(?P<version>{_VERSION})$")
ENV_RE = re.compile(r"^env:(?P<name>[A-Za-z_][A-Za-z0-9_]*)$")
FILE_PREFIX = "file:"
# Every form at once, for the JSON Schema (an editor marks a value that is no reference as it is typed).
REF_PATTERN = (
    rf"^(projects/({_PROJECT})/secrets/{_SECRET_ID}(/versions/({_VERSION}))?|{_SECRET_ID}/versions/({_VERSION})"
    r"|env:[A-Za-z_][A-Za-z0-9_]*|file:.+)$"
)
# The words of an `env:` key that make it look like a secret (WANDB_API_KEY, HF_TOKEN, DB_PASSWORD).
SECRET_WORDS = ("TOKEN", "KEY", "PASSWORD", "PASSWD", "SECRET", "APIKEY", "CREDENTIALS")
FORMS = (
    "NAME/versions/latest (a Secret Manager secret of the run's project), projects/PROJECT/secrets/NAME/versions/N, "
    "or for --local runs env:VARIABLE or file:PATH"
)
LITERAL_FIX = (
    "a secret's value never goes in the spec: keep it in Secret Manager (`gcloud secrets create NAME "
    f"--data-file=FILE`) and write a reference: {FORMS}"
)
Kind = Literal["secretmanager", "env", "file"]


@dataclass(frozen=True)
class SecretRef:
    """A parsed reference: a Secret Manager version, or (local runs) a variable or a file of this machine."""

    kind: Kind
    text: str  # as written in the spec
    project: str | None = None  # Secret Manager, when the reference names it
    secret: str = ""  # Secret Manager's secret id
    version: str = "latest"
    local: str = ""  # the variable's name (env:) or the path (file:)

    @property
    def is_local(self) -> bool:
        return self.kind != "secretmanager"

    def version_name(self, project: str) -> str:
        """projects/P/secrets/S/versions/V, in `project` when the reference names none."""
        return f"projects/{self.project or project}/secrets/{self.secret}/versions/{self.version}"


def parse_ref(text: Any) -> SecretRef:
    """A reference, or ValueError saying what a reference looks like. The message never repeats `text`: what fails
    to parse may be the secret itself."""
    if not isinstance(text, str) or not text.strip() or any(ord(c) < 32 or ord(c) == 127 for c in text):
        raise ValueError(f"not a reference to a secret, so it is refused as a literal value: {LITERAL_FIX}")
    if m := FULL_RE.match(text):
        return SecretRef("secretmanager", text, m["project"], m["secret"], m["version"] or "latest")
    if m := SHORT_RE.match(text):
        return SecretRef("secretmanager", text, None, m["secret"], m["version"])
    if m := ENV_RE.match(text):
        return SecretRef("env", text, local=m["name"])
    if text.startswith(FILE_PREFIX) and text[len(FILE_PREFIX) :].strip():
        return SecretRef("file", text, local=text[len(FILE_PREFIX) :])
    if text.startswith(("env:", "projects/")):
        raise ValueError(f"not a valid secret reference; write {FORMS}")
    raise ValueError(f"not a reference to a secret, so it is refused as a literal value: {LITERAL_FIX}")


class SecretSpec(BaseModel):
    """One secret of the job: where it is kept, and how the job gets it."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    ref: str = Field(
        description=f"Where the secret is kept: {FORMS}. Never the value itself.",
        json_schema_extra={"pattern": REF_PATTERN},
    )
    as_: Literal["env", "file"] = Field(
        "env",
        alias="as",
        description="env: the job's environment variable named by the key holds the value (a final line break "
        "dropped); file: that variable holds the path of a file with the value, on a memory file system, readable "
        "only by the job's user.",
    )

    @field_validator("ref", mode="before")
    @classmethod
    def _reference(cls, value: Any) -> Any:
        # Checked before pydantic's own type check, whose message would repeat a non-string value.
        parse_ref(value)
        return value

    @property
    def reference(self) -> SecretRef:
        return parse_ref(self.ref)


def map_schema(schema: dict[str, Any]) -> None:
    """The JSON Schema of the `secrets:` map: each entry a reference alone, or a SecretSpec (as secrets_map reads
    the first as the second)."""
    schema["additionalProperties"] = {
        "anyOf": [{"type": "string", "pattern": REF_PATTERN}, schema["additionalProperties"]]
    }


def secrets_map(value: Any) -> Any:
    """`KEY: REFERENCE` is `KEY: {ref: REFERENCE}`. Whatever is not a mapping is taken as a `ref`, so that its
    check (which never repeats it: a number under `secrets:` may be the value itself) locates it by its key."""
    if not isinstance(value, dict):
        return value
    return {key: item if isinstance(item, dict) else {"ref": item} for key, item in value.items()}


def looks_secret(key: str) -> bool:
    """Whether an environment variable's name says it holds a secret: one of its words is TOKEN, KEY, PASSWORD..."""
    words = [w for w in re.split(r"[^A-Za-z0-9]+", key.upper()) if w]
    return any(w in SECRET_WORDS or w.endswith(("TOKEN", "PASSWORD", "SECRET", "APIKEY")) for w in words)


def env_warnings(spec: JobSpec) -> list[str]:
    """A warning for each `env:` variable whose name says it is a secret, with the fix (never its value)."""
    return [
        f"env.{key} looks like a secret, and env values travel in plain text (the VM's metadata, spec.yaml in the "
        f"run directory, the dry run): keep it in Secret Manager and move it to "
        f"`secrets: {{{key}: NAME/versions/latest}}` "
        f"(`gcloud secrets create NAME --data-file=FILE`; for --local runs `secrets: {{{key}: env:{key}}}` reads it "
        "from this shell's environment)"
        for key in sorted(spec.env)
        if looks_secret(key)
    ]
