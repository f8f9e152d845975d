"""Whether a job can run where its spec sends it, from the catalog alone (no network, no project, no credentials):
accelerator type, zones, runtime version, framework and hosts. The planner refuses on any error before it plans a
TPU VM run; `runner validate` runs the same checks offline and reports every finding at once.

    framework x generation    the catalog's `frameworks` (TensorFlow refused on v6e, with the public evidence)
    runtime x generation      the catalog's patterns, -pod on multi-host slices, the TF >= 2.18 chip-family names
    framework x hosts         TensorFlow on a pod slice needs a tpu-vm-tf-*-pod-* runtime (and runs on worker 0);
                              open TensorFlow pod bugs are warnings
    slices x generation       multislice on TPU v4 and later only
    type                      unknown ones get a did-you-mean (v5e-8 -> v5litepod-8); TPU7x is explained as out of
                              the Cloud TPU API's reach, with the route that reaches it
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
        if (far := catalog.unreachable(generation)) is not None:
            return None, Finding(
                True, f"accelerator.type {name!r}: {far.title} cannot be created here: {far.why}", far.route
            )
        if (canonical := catalog.aliases().get(generation)) is not None:
            return None, Finding(
                True,
                f"accelerator.type {name!r}: the Cloud TPU API names {generation} {canonical}",
                f"did you mean {canonical}-{size}?",
            )
        known = catalog.generations().get(generation)
        if known is not None and size.isdigit():  # a real generation, a size it does not come in: the nearest
            nearest = sorted(sorted(known.sizes, key=lambda s: abs(s - int(size)))[:2])
            hint = f"did you mean {' or '.join(f'{generation}-{s}' for s in nearest)}?"
            return None, Finding(True, f"accelerator.type: {exc}", hint)
        close = difflib.get_close_matches(name, [t.name for t in catalog.all_types()], n=3, cutoff=0.6)
        return None, Finding(True, f"accelerator.type: {exc}", f"did you mean {', '.join(close)}?" if close else None)


def check(spec: JobSpec, zones: tuple[str, ...] | None = None) -> tuple[catalog.AcceleratorType | None, list[Finding]]:
    """The accelerator type (None when unknown) and every finding about where `spec` would run. `zones` overrides the
    spec's own (the planner resolves gcloud's default zone)."""
    acc = spec.accelerator
    accel, problem = _type(acc.type)
    if accel is None:
        return None, [problem] if problem else []
    findings: list[Finding] = []
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
    if spec.training is not None:
        findings += _framework(spec, accel, runtime)
    return accel, findings


def _framework(spec: JobSpec, accel: catalog.AcceleratorType, runtime: str) -> list[Finding]:
    assert spec.training is not None
    framework = spec.training.framework
    generation = accel.generation
    refused = generation.frameworks.get(framework, "the catalog does not list it")
    if refused:
        other = "jax" if framework == "tensorflow" else "tensorflow"
        return [
            Finding(
                True,
                f"training.framework {framework} on {generation.name}: {' '.join(refused.split())}",
                f"set training.framework: {other}" if not generation.frameworks.get(other) else None,
            )
        ]
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
