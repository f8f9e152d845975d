"""Request validation as the Cloud TPU API does it, with runner.plan.catalog as the one source of what exists.

Every problem in a request is collected (field, description) so one 400 answer names them all.
"""

from __future__ import annotations

import math
import re
from typing import Any

from runner.plan import catalog

ID_RE = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
ID_MAX = 63
LABEL_KEY_RE = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
LABEL_VALUE_RE = re.compile(r"^[a-z0-9_-]{0,63}$")
MAX_LABELS = 64
METADATA_KEY_RE = re.compile(r"^[a-zA-Z0-9_-]{1,128}$")
METADATA_VALUE_MAX = 256 * 1024
METADATA_TOTAL_MAX = 512 * 1024

Violations = list[tuple[str, str]]


def check_id(value: str | None, field: str, what: str) -> Violations:
    if not value:
        return [(field, f"{field} is required: the {what}'s unqualified name")]
    if len(value) > ID_MAX or not ID_RE.match(value):
        return [
            (
                field,
                f"Invalid value for field '{field}': '{value}'. It must be 1-{ID_MAX} characters, start with a "
                "lowercase letter, and contain only lowercase letters, digits and hyphens, not ending with a hyphen "
                f"(regex {ID_RE.pattern}).",
            )
        ]
    return []


def accelerator_name(node: dict[str, Any], prefix: str) -> tuple[str | None, Violations]:
    """The type the node asks for: acceleratorType, or the one acceleratorConfig's type and topology describe."""
    name = node.get("acceleratorType")
    config = node.get("acceleratorConfig")
    if config is None:
        if not name:
            return None, [(f"{prefix}.accelerator_type", "Either acceleratorType or acceleratorConfig is required.")]
        return name, []
    # AcceleratorConfig.Type -> the catalog's generation name.
    config_generations = {g.api_type: name for name, g in catalog.generations().items() if g.in_tpu_api}
    gen_name = config_generations.get(str(config.get("type", "")))
    dims = str(config.get("topology", "")).split("x")
    if gen_name is None or not all(d.isdigit() and int(d) > 0 for d in dims):
        return None, [
            (
                f"{prefix}.accelerator_config",
                f"Invalid acceleratorConfig {config}: a type ({', '.join(config_generations)}) and a topology "
                "like 2x2x1 are required.",
            )
        ]
    gen = catalog.generations()[gen_name]
    chips = math.prod(int(d) for d in dims)
    derived = f"{gen_name}-{chips * gen.cores_per_chip if gen.size_unit == 'cores' else chips}"
    if name and name != derived:
        return None, [
            (
                f"{prefix}.accelerator_type",
                f"acceleratorType '{name}' contradicts acceleratorConfig {config} (which is {derived}); give one.",
            )
        ]
    return derived, []


def validate_node(
    node: dict[str, Any], zone: str, prefix: str = "node"
) -> tuple[catalog.AcceleratorType | None, Violations]:
    """Check a Node to be created in `zone`; returns its type (None when unusable) and every violation."""
    problems: Violations = []
    accel: catalog.AcceleratorType | None = None
    name, found = accelerator_name(node, prefix)
    problems += found
    if name:
        try:
            accel = catalog.accelerator(name)
            if not accel.generation.in_tpu_api:  # TPU7x and later: Compute Engine's, never the Cloud TPU API's
                raise catalog.CatalogError(f"{accel.generation.title} is not served by the Cloud TPU API")
        except catalog.CatalogError as exc:
            accel = None
            problems.append(
                (
                    f"{prefix}.accelerator_type",
                    f"Cloud TPU received a bad request. the accelerator {name} was not found in zone {zone} ({exc})",
                )
            )
        else:
            if zone not in accel.zones:
                problems.append(
                    (
                        f"{prefix}.accelerator_type",
                        f"Cloud TPU received a bad request. the accelerator {name} was not found in zone {zone}; "
                        f"{name} is offered in {', '.join(accel.zones)}",
                    )
                )
    runtime = node.get("runtimeVersion")
    if not runtime:
        problems.append((f"{prefix}.runtime_version", "runtimeVersion is required."))
    elif accel is not None and not accel.runtime_ok(runtime):
        hint = ""
        if runtime.startswith("tpu-vm-tf-"):
            hint = " (multi-host slices need a -pod- TensorFlow runtime, single hosts one without)"
        problems.append(
            (
                f"{prefix}.runtime_version",
                f"Invalid runtime version '{runtime}' for accelerator type {accel.name}{hint}; "
                f"e.g. {accel.generation.default_runtime} is accepted.",
            )
        )
    problems += check_labels(node.get("labels") or {}, prefix)
    problems += check_scheduling(node.get("schedulingConfig") or {}, prefix)
    problems += check_metadata(node.get("metadata") or {}, prefix)
    return accel, problems


def check_labels(labels: dict[str, str], prefix: str) -> Violations:
    problems: Violations = []
    if len(labels) > MAX_LABELS:
        problems.append((f"{prefix}.labels", f"A resource can have at most {MAX_LABELS} labels; got {len(labels)}."))
    for key, value in labels.items():
        if not LABEL_KEY_RE.match(key):
            problems.append(
                (
                    f"{prefix}.labels",
                    f"Invalid label key '{key}': keys are 1-63 characters, start with a lowercase letter and hold "
                    "only lowercase letters, digits, underscores and hyphens.",
                )
            )
        if not LABEL_VALUE_RE.match(value):
            problems.append(
                (
                    f"{prefix}.labels",
                    f"Invalid value for label '{key}': '{value}'. Values are 0-63 characters of lowercase letters, "
                    "digits, underscores and hyphens.",
                )
            )
    return problems


def check_scheduling(config: dict[str, Any], prefix: str) -> Violations:
    chosen = [k for k in ("spot", "preemptible", "reserved") if config.get(k)]
    if len(chosen) > 1:
        return [
            (
                f"{prefix}.scheduling_config",
                f"Invalid schedulingConfig: {' and '.join(chosen)} cannot be combined; choose one of spot, "
                "preemptible (legacy) and reserved.",
            )
        ]
    return []


def check_metadata(metadata: dict[str, str], prefix: str) -> Violations:
    problems: Violations = []
    total = 0
    for key, value in metadata.items():
        size = len(key.encode()) + len(value.encode())
        total += size
        if not METADATA_KEY_RE.match(key):
            problems.append((f"{prefix}.metadata", f"Invalid metadata key '{key}': 1-128 characters of [a-zA-Z0-9_-]."))
        if len(value.encode()) > METADATA_VALUE_MAX:
            problems.append(
                (
                    f"{prefix}.metadata",
                    f"Metadata value of '{key}' is {len(value.encode())} bytes; a value may be at most "
                    f"{METADATA_VALUE_MAX} bytes (256 KiB).",
                )
            )
    if total > METADATA_TOTAL_MAX:
        problems.append(
            (
                f"{prefix}.metadata",
                f"Metadata is {total} bytes in all; keys and values together may be at most {METADATA_TOTAL_MAX} "
                "bytes (512 KiB).",
            )
        )
    return problems


def quota_name(accel: catalog.AcceleratorType, *, preemptible: bool) -> str:
    """A quota name in Cloud TPU's style, e.g. TPUV4sPreemptiblePodPerProjectPerRegionForTPUAPI."""
    base = accel.generation.quota_prefix
    return (
        f"{base}{'Preemptible' if preemptible else ''}{'Pod' if accel.multi_host else ''}PerProjectPerRegionForTPUAPI"
    )
