"""Whether a job can run where its spec sends it, from the catalog alone (no network, no project, no credentials):
accelerator type, backend, zones, runtime version, framework and hosts. The planner refuses on any error before it
plans a cloud run; `runner validate` runs the same checks offline and reports every finding at once.

`common` holds whichever backend creates the machine; `check` is the Cloud TPU API's (the tpu-vm backend's) slice.

    type                      unknown ones get a did-you-mean (v5e-8 -> v5litepod-8, v7x-8 -> tpu7x-8)
    backend x generation      the catalog's `backends` (TPU7x only through compute-engine, with the reason)
    framework x generation    the catalog's `frameworks` (TensorFlow refused on v6e and TPU7x, with the evidence)
    runtime x generation      the catalog's patterns, -pod on multi-host slices, the TF >= 2.18 chip-family names
    framework x hosts         TensorFlow on a pod slice needs a tpu-vm-tf-*-pod-* runtime (and runs on worker 0);
                              open TensorFlow pod bugs are warnings
    slices x generation       multislice on TPU v4 and later only
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from runner.plan import catalog
from runner.spec import JobSpec


@dataclass(frozen=True)
class Finding:
    error: bool  # False: a warning; the plan goes on
    message: str
    hint: str | None = None


def _type(name: str) -> tuple[catalog.AcceleratorType | None, Finding | None]:
    try:
        return catalog.accelerator(name), None
    except catalog.CatalogError as exc:
        generation, _, size = name.partition("-")
        if (canonical := catalog.aliases().get(generation.lower())) is not None:
            return None, Finding(
                True,
                f"accelerator.type {name!r}: the catalog names {generation} {canonical}",
                f"did you mean {canonical}-{size}?",
            )
        known = catalog.generations().get(generation)
        if known is not None and size.isdigit():  # a real generation, a size it does not come in: the nearest
            nearest = sorted(sorted(known.sizes, key=lambda s: abs(s - int(size)))[:2])
            hint = f"did you mean {' or '.join(f'{generation}-{s}' for s in nearest)}?"
            return None, Finding(True, f"accelerator.type: {exc}", hint)
        close = difflib.get_close_matches(name, [t.name for t in catalog.all_types()], n=3, cutoff=0.6)
        return None, Finding(True, f"accelerator.type: {exc}", f"did you mean {', '.join(close)}?" if close else None)


def common(spec: JobSpec, backend: str) -> tuple[catalog.AcceleratorType | None, list[Finding]]:
    """The accelerator type (None when unknown) and what holds on any backend: `backend` creates its generation,
    and the job's framework runs on it."""
    accel, problem = _type(spec.accelerator.type)
    if accel is None:
        return None, [problem] if problem else []
    generation = accel.generation
    findings: list[Finding] = []
    if backend not in generation.backends:
        why = f": {generation.backends_note}" if generation.backends_note else ""
        findings.append(
            Finding(
                True,
                f"accelerator.backend {backend}: {generation.title} is not created through it{why}",
                f"set accelerator.backend: {generation.backends[0]} (or auto)",
            )
        )
    if spec.training is not None and (refused := _refused(spec.training.framework, generation)) is not None:
        findings.append(refused)
    if not generation.priced:
        findings.append(
            Finding(
                False,
                f"{generation.title} has no price in the catalog (no public list price was found): its cost is not "
                "estimated",
                "check cloud.google.com/tpu/pricing",
            )
        )
    return accel, findings


def _refused(framework: str, generation: catalog.Generation) -> Finding | None:
    refused = generation.frameworks.get(framework, "the catalog does not list it")
    if not refused:
        return None
    other = "jax" if framework == "tensorflow" else "tensorflow"
    return Finding(
        True,
        f"training.framework {framework} on {generation.name}: {' '.join(refused.split())}",
        f"set training.framework: {other}, or give a `command`" if not generation.frameworks.get(other) else None,
    )


def check(
    spec: JobSpec, backend: str, zones: tuple[str, ...] | None = None
) -> tuple[catalog.AcceleratorType | None, list[Finding]]:
    """The accelerator type (None when unknown) and every finding about where `spec` would run through the Cloud TPU
    API (`backend` is the registry's name of the backend that uses it). `zones` overrides the spec's own (the
    planner resolves gcloud's default zone)."""
    acc = spec.accelerator
    accel, findings = common(spec, backend)
    if accel is None or backend not in accel.generation.backends:
        return accel, findings  # its zones and runtimes are not the Cloud TPU API's
    listed = acc.candidate_zones if zones is None else list(zones)
    missing = [z for z in listed if z not in accel.zones]
    if missing and not acc.node:
        findings.append(
            Finding(
                True,
                f"{accel.name} is not offered in {', '.join(missing)}",
                f"{accel.name} is offered in {', '.join(accel.zones)}",
            )
        )
    runtime = acc.runtime_version or accel.generation.default_runtime
    if (why := accel.runtime_problem(runtime)) is not None:
        findings.append(Finding(True, f"runtime version {runtime!r} does not run on {accel.name}", why))
    if acc.slices > 1 and accel.generation.name in ("v2", "v3"):
        # "Multislice is only supported on Cloud TPU v4 and later" (cloud.google.com/tpu/docs/multislice-introduction)
        findings.append(
            Finding(
                True,
                f"accelerator.slices {acc.slices}: Cloud TPU Multislice needs TPU v4 or later, not {accel.name}",
                "use a v4, v5p, v5litepod or v6e type, or one slice",
            )
        )
    if spec.training is not None and accel.generation.frameworks.get(spec.training.framework, "?") is None:
        findings += _framework(spec, accel, runtime)
    return accel, findings


def _framework(spec: JobSpec, accel: catalog.AcceleratorType, runtime: str) -> list[Finding]:
    assert spec.training is not None
    framework = spec.training.framework
    generation = accel.generation
    findings: list[Finding] = []
    tf_runtime = runtime.startswith("tpu-vm-tf-")
    if framework == "tensorflow" and accel.multi_host:
        # Google's TF pod CI: the script runs on worker 0 with TPUClusterResolver(tpu=<node>); the other hosts serve
        # through the TPU runtime of a tpu-vm-tf-*-pod-* image.
        if not tf_runtime:
            findings.append(
                Finding(
                    True,
                    f"{accel.name} has {accel.hosts} hosts: TensorFlow needs a tpu-vm-tf-X.Y.Z-pod-pjrt runtime there, "
                    f"not {runtime!r}",
                    "set accelerator.runtime_version, or training.framework: jax (it runs on every host)",
                )
            )
        elif (bug := catalog.tensorflow_pod_bug(runtime)) is not None:
            findings.append(Finding(False, f"{runtime}: {bug}", "use another TensorFlow version, or framework: jax"))
    if framework == "jax" and tf_runtime:
        findings.append(
            Finding(
                False,
                f"runtime version {runtime!r} is a TensorFlow image; JAX runs on {generation.default_runtime}",
                "drop accelerator.runtime_version",
            )
        )
    return findings
