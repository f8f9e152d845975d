"""The trainer image's variants (docker/Dockerfile): the engine and the accelerator each one is built for, and the
one a job needs. Standard library only: the planner imports it.

    variant   framework    device  what it holds
    cpu       tensorflow   cpu     tensorflow-cpu (local emulation)
    gpu       tensorflow   gpu     tensorflow[and-cuda]
    tpu       tensorflow   tpu     tensorflow-tpu + libtpu
    jax-tpu   jax          tpu     jax[tpu] + Keras 3, no TensorFlow
    jax-gpu   jax          gpu     jax[cuda12] + Keras 3, no TensorFlow

There is no JAX image for the CPU alone: JAX runs on the CPU of a machine without TPU chips (it skips the TPU and
the metadata server), so a JAX job on a CPU gets jax-tpu, the smaller of the two (docker/README.md has the sizes).
"""

from __future__ import annotations

from dataclasses import dataclass

from runner.launch.imageref import ImageRef

IMAGE_NAME = "trainer"  # images are trainer-<variant>: trainer-cpu, trainer-jax-tpu, ...


@dataclass(frozen=True)
class Variant:
    name: str
    framework: str  # training.framework
    device: str  # cpu | gpu | tpu: what it is built to use


_ALL = (
    Variant("cpu", "tensorflow", "cpu"),
    Variant("gpu", "tensorflow", "gpu"),
    Variant("tpu", "tensorflow", "tpu"),
    Variant("jax-tpu", "jax", "tpu"),
    Variant("jax-gpu", "jax", "gpu"),
)
BY_NAME = {v.name: v for v in _ALL}
VARIANTS = tuple(BY_NAME)
DEVICES = ("cpu", "gpu", "tpu")


def variant_for(framework: str, device: str) -> str:
    """The variant that runs `framework` on `device` (cpu, gpu, tpu)."""
    if device not in DEVICES:
        raise ValueError(f"unknown device {device!r}; one of {', '.join(DEVICES)}")
    if framework == "jax":
        return "jax-gpu" if device == "gpu" else "jax-tpu"
    if framework == "tensorflow":
        return device
    raise ValueError(f"unknown framework {framework!r}; tensorflow or jax")


def variant_of(image: str) -> str | None:
    """The variant of an image named as `runner build` names them (.../trainer-<variant>:TAG), else None: an image
    of another name may hold anything, and is taken as it is."""
    try:
        last = ImageRef.parse(image).path.rsplit("/", 1)[-1]
    except ValueError:
        return None
    prefix = f"{IMAGE_NAME}-"
    return last[len(prefix) :] if last.startswith(prefix) and last[len(prefix) :] in BY_NAME else None


def mismatch(image: str, framework: str | None, device: str) -> str | None:
    """Why `image` cannot run a job on `device`, or None (also None for an image of another name). `framework`:
    the built-in trainer's engine; None for a custom command, which brings its own, so only the device counts."""
    name = variant_of(image)
    if name is None:
        return None
    variant = BY_NAME[name]
    if framework is not None and variant.framework != framework:
        holds = "TensorFlow and no JAX" if variant.framework == "tensorflow" else "JAX and no TensorFlow"
        return f"image {image!r} is the {name} variant, which holds {holds}; this job's framework is {framework}"
    if variant.device != device and not (device == "cpu" and variant.framework == "jax"):
        return f"image {image!r} is the {name} variant, built for {variant.device.upper()}, not {device.upper()}"
    return None
