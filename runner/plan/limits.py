"""Platform limits, checked before anything is created: what Compute Engine metadata (a TPU node's and a Compute
Engine instance's: the startup script travels there), labels and a Linux process's arguments and environment can
hold. Each problem names the value that is over, by how much, and which limit (`runner validate`, the dry run and
`submit` refuse with exit 2), instead of a create refused after the plan, or "Argument list too long" from a
process that never started.

Sources:
- Metadata: compute.v1.json (google-api-python-client's discovery document), Metadata.items[].value: "their size
  must be less than or equal to 262144 bytes (256 KiB)"; Metadata.items: "The total size of all keys and values
  must be less than 512 KB"; a key "less than 128 bytes in length". Cloud TPU VMs are Compute Engine VMs: a node's
  `metadata` (tpu.v2.json: "Custom metadata to apply to the TPU Node. Can set startup-script and shutdown-script")
  reaches them as instance metadata, under the same limits.
- Labels (cloud.google.com/compute/docs/labeling-resources): at most 64 per resource; keys 1 to 63 characters,
  values up to 63, lowercase letters, digits, '_' and '-'.
- Linux (include/uapi/linux/binfmts.h): one argument or environment string, "KEY=VALUE" with its NUL, is at most
  MAX_ARG_STRLEN = 32 pages = 131072 bytes; all of them together, with a pointer each, at most ARG_MAX
  (sysconf(_SC_ARG_MAX): a quarter of the stack limit, 2 MiB by default). Beyond either, execve fails E2BIG
  ("Argument list too long"). A container's process is started by execve too.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping, Sequence

from runner.spec import MAX_ARG_STRLEN

METADATA_VALUE_MAX = 262_144
METADATA_TOTAL_MAX = 512 * 1024  # "less than 512 KB"
METADATA_KEY_MAX = 128  # "less than 128 bytes"
LABELS_MAX = 64
LABEL_CHARS_MAX = 63
POINTER = 8  # each argument and environment string also takes a pointer in the new process's arrays (64-bit)
_LABEL_KEY = re.compile(r"[a-z][a-z0-9_-]{0,62}")
_LABEL_VALUE = re.compile(r"[a-z0-9_-]{0,63}")


def env_problems(env: Mapping[str, str], *, where: str = "env") -> list[str]:
    """Each environment variable whose KEY=VALUE string a process cannot be given (MAX_ARG_STRLEN)."""
    out = []
    for key, value in env.items():
        size = len(f"{key}={value}".encode()) + 1
        if size > MAX_ARG_STRLEN:
            out.append(
                f"{where}.{key}: {size:,} bytes as one KEY=VALUE string, over the {MAX_ARG_STRLEN:,} bytes (128 KiB) "
                "Linux gives one environment string (MAX_ARG_STRLEN): the job's process could not be started"
            )
    return out


def exec_problems(argv: Sequence[str], env: Mapping[str, str], arg_max: int) -> list[str]:
    """The command line and environment together over this machine's ARG_MAX, with the largest values named; and
    each string over MAX_ARG_STRLEN."""
    out = env_problems(env)
    for i, arg in enumerate(argv):
        if len(arg.encode()) + 1 > MAX_ARG_STRLEN:
            out.append(f"command[{i}]: {len(arg.encode()) + 1:,} bytes, over Linux's {MAX_ARG_STRLEN:,} per argument")
    sizes = {f"env.{k}": len(f"{k}={v}".encode()) + 1 + POINTER for k, v in env.items()}
    total = sum(sizes.values()) + sum(len(a.encode()) + 1 + POINTER for a in argv)
    if total > arg_max:
        largest = ", ".join(f"{name} {size:,}" for name, size in sorted(sizes.items(), key=lambda kv: -kv[1])[:3])
        out.append(
            f"the job's command line and environment take {total:,} bytes, over this machine's ARG_MAX of "
            f"{arg_max:,} (largest: {largest}): the job's process could not be started"
        )
    return out


def metadata_problems(items: Mapping[str, str], what: str) -> list[str]:
    """`what`'s metadata (a TPU node's, an instance's) over a value's or the total's limit, or with a long key."""
    out = []
    total = 0
    for key, value in items.items():
        size = len(value.encode())
        total += size + len(key.encode())
        if size > METADATA_VALUE_MAX:
            more = " (it carries the job's environment, base64-encoded)" if key == "startup-script" else ""
            out.append(
                f"{what}'s metadata {key!r} is {size:,} bytes{more}, over the {METADATA_VALUE_MAX:,} bytes (256 KiB) "
                "a metadata value can hold"
            )
        if len(key.encode()) >= METADATA_KEY_MAX:
            out.append(f"{what}'s metadata key {key[:40]!r}... is {len(key.encode())} bytes, not under 128")
    if total >= METADATA_TOTAL_MAX:
        limit = f"{METADATA_TOTAL_MAX:,} (512 KB)"
        out.append(f"{what}'s metadata is {total:,} bytes in all, not under the {limit} allowed")
    return out


def label_problems(labels: Mapping[str, str], what: str) -> list[str]:
    out = []
    if len(labels) > LABELS_MAX:
        out.append(f"{what} has {len(labels)} labels, over the {LABELS_MAX} a resource can have")
    for key, value in labels.items():
        if not _LABEL_KEY.fullmatch(key):
            rule = f"1 to {LABEL_CHARS_MAX} of a-z 0-9 _ -, starting with a letter"
            out.append(f"{what}'s label key {key[:70]!r}: {rule}")
        if not _LABEL_VALUE.fullmatch(value):
            out.append(f"{what}'s label {key}={value[:70]!r}: up to {LABEL_CHARS_MAX} of a-z 0-9 _ -")
    return out


def env_in_metadata_problems(env: Mapping[str, str]) -> list[str]:
    """The spec's environment alone, as a TPU VM's startup script carries it (a Docker env file, base64-encoded),
    over what one metadata value can hold: whatever else the script holds, it cannot fit (`runner validate`)."""
    carried = len(base64.b64encode("".join(f"{k}={v}\n" for k, v in env.items()).encode()))
    if carried <= METADATA_VALUE_MAX:
        return []
    largest = max(env, key=lambda k: len(env[k]))
    return [
        f"env: {carried:,} bytes once base64-encoded into a TPU VM's startup script (the largest value: env.{largest}, "
        f"{len(env[largest].encode()):,} bytes), over the {METADATA_VALUE_MAX:,} bytes (256 KiB) a metadata value can "
        "hold; put large values in a file the job reads (the image, or Cloud Storage)"
    ]
