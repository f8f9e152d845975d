"""`runner build` (the trainer image, tagged by content) and `runner bench` (the notebook's benchmark)."""

from __future__ import annotations

from pathlib import Path

import typer

from runner.bench.command import bench  # typer and the standard library only
from runner.cli.output import echo, warn
from runner.cli.typer_app import app


@app.command()
def build(
    variant: str | None = typer.Option(
        None,
        "--variant",
        help="cpu (local emulation), gpu, tpu (TensorFlow), jax-tpu, jax-gpu (JAX). Default: from --spec, else cpu.",
    ),
    spec: str | None = typer.Option(
        None, "--spec", help="Choose the variant for this job spec: its training.framework on --device."
    ),
    device: str = typer.Option("tpu", "--device", help="With --spec: tpu (a Cloud TPU VM), gpu or cpu (--local)."),
    project: str | None = typer.Option(
        None, "--project", help="Google Cloud project of the Artifact Registry repository."
    ),
    region: str = typer.Option("us-central1", "--region", help="Region of the repository (REGION-docker.pkg.dev)."),
    repo: str = typer.Option("tpu-runner", "--repo", help="Artifact Registry repository."),
    push: bool = typer.Option(False, "--push", help="Push to Artifact Registry (skipped when the tag is there)."),
    build_arg: list[str] = typer.Option([], "--build-arg", help="KEY=VALUE for docker build (part of the tag)."),
    print_ref: bool = typer.Option(False, "--print-ref", help="Print the image reference and exit (no Docker)."),
    context: Path | None = typer.Option(
        None,
        "--context",
        help="Your code: this directory goes into the image at /workspace (the working directory of `command`), its "
        "requirements.txt (or pyproject.toml's dependencies) in a layer of their own under it.",
        file_okay=False,
    ),
    ca_certs: Path | None = typer.Option(
        None,
        "--ca-certs",
        envvar="RUNNER_BUILD_CA_CERTS",
        help="CA certificates pip must trust in the build (a PEM file or a directory of .crt files), for networks "
        "that reach PyPI through a TLS-intercepting proxy. A build secret: not in the image, not in the tag.",
        exists=True,
    ),
) -> None:
    """Build the trainer image tagged by content with Docker or Podman, and push it; a tag that exists is never
    rebuilt or re-pushed. Says the image's size, and checks its packages against its variant's lock."""
    from runner.launch import build as builder
    from runner.launch import code, image

    variant = _variant(variant, spec, device)
    if spec is not None and context is not None:  # what the job's command needs from DIR, before a build
        from runner.launch.job import context_problems
        from runner.spec.loader import load_spec

        for problem in context_problems(load_spec(spec).command, context):
            warn(problem)
    if context is not None:  # the requirements there are read, and refused on a conflict, before any build
        code.dependency_layer(context, variant)
    args = builder.parse_build_args(build_arg)
    if print_ref:
        tag = image.content_tag(variant, build_args=args)
        ref = image.reference(project, region, repo, variant, tag) if project else image.local_reference(variant, tag)
        echo(code.code_reference(ref, context) if context else ref)
        return
    result = builder.ensure_image(
        variant, project=project, region=region, repo=repo, push=push, build_args=args, ca_certs=ca_certs
    )
    if context is not None:
        result = code.ensure_code_image(result, context, push=push, ca_certs=ca_certs)
    echo(f"image: {result.reference}")


def _variant(variant: str | None, spec_path: str | None, device: str) -> str:
    """--variant as given, else the one the spec's training.framework needs on --device, else cpu."""
    from runner.errors import UsageError
    from runner.launch.variants import variant_for

    if spec_path is None:
        return variant or "cpu"
    if variant is not None:
        raise UsageError("give --variant or --spec, not both")
    from runner.spec.loader import load_spec

    job = load_spec(spec_path)
    # A custom command brings its own engine: the spec does not say which, so it gets TensorFlow's, as by default.
    framework = job.training.framework if job.training is not None else "tensorflow"
    try:
        chosen = variant_for(framework, device)
    except ValueError as exc:
        raise UsageError(str(exc), hint="--device tpu, gpu or cpu") from None
    echo(f"variant: {chosen} (training.framework {framework} on {device})", err=True)  # stdout: the reference
    return chosen


app.command("bench")(bench)
