"""`runner build` (the trainer image, tagged by content) and `runner bench` (the notebook's benchmark)."""

from __future__ import annotations

import typer

from runner.bench.command import bench  # typer and the standard library only
from runner.cli.output import echo
from runner.cli.typer_app import app


@app.command()
def build(
    variant: str = typer.Option("cpu", "--variant", help="cpu (local emulation), gpu, or tpu (Cloud TPU VMs)."),
    project: str | None = typer.Option(
        None, "--project", help="Google Cloud project of the Artifact Registry repository."
    ),
    region: str = typer.Option("us-central1", "--region", help="Region of the repository (REGION-docker.pkg.dev)."),
    repo: str = typer.Option("tpu-runner", "--repo", help="Artifact Registry repository."),
    push: bool = typer.Option(False, "--push", help="Push to Artifact Registry (skipped when the tag is there)."),
    build_arg: list[str] = typer.Option([], "--build-arg", help="KEY=VALUE for docker build (part of the tag)."),
    print_ref: bool = typer.Option(False, "--print-ref", help="Print the image reference and exit (no Docker)."),
) -> None:
    """Build the trainer image tagged by content, and push it; a tag that exists is never rebuilt or re-pushed."""
    from runner.launch import image

    args = image.parse_build_args(build_arg)
    if print_ref:
        tag = image.content_tag(variant, build_args=args)
        ref = image.reference(project, region, repo, variant, tag) if project else image.local_reference(variant, tag)
        echo(ref)
        return
    result = image.ensure_image(variant, project=project, region=region, repo=repo, push=push, build_args=args)
    echo(f"image: {result.reference}")


app.command("bench")(bench)
