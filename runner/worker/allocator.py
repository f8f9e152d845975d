"""The C allocator's settings for the built-in trainer on the JAX engine on a machine without TPU or GPU chips,
where XLA keeps a program's temporaries in host memory.

XLA on CPU allocates every execution's temporary buffer anew (posix_memalign), and frees it when the step is done:
hundreds of megabytes for the built-in model's train step at batch 128. glibc gives a block that large its own
mapping (thread arenas always do: their heaps hold 64 MB at most), and returns it to the kernel when freed, so every
step faults in and zeroes fresh pages: the JAX engine's trainer at batch 128, run by the supervisor, spent 10.4 to
10.8 of its 22.8 to 24.4 CPU seconds in the kernel (64 steps, 4.0 million page faults). With one arena that never
maps a block of its own and keeps up to KEEP_BYTES of freed memory, the next step reuses the same pages: 0.9 s in
the kernel, 13.3 to 15.6 CPU s in all, epochs of 6.8 to 8.0 s instead of 12.7 to 13.6 (two pairs, taking turns). At
batch 32, 128 steps: 12.6 to 14.9 CPU s before, 9.5 after. TensorFlow's trainer allocates no such blocks and is
not slower with them (two interleaved pairs, 4096 examples at batch 32). glibc reads these variables when a process
starts, so the supervisor puts them in the job's environment; other C libraries ignore them.

Only the built-in trainer on the JAX engine gets them, where this was measured and its threads are few: your own
`command` may be anything (an input pipeline of many threads is better served by many arenas), and its spec's
`env:` can set the same variables. Left alone too: a machine with accelerator chips (XLA's temporaries are device
memory there), and a job whose environment already chooses its allocator.
"""

from __future__ import annotations

import glob
from collections.abc import Mapping, Sequence

from runner import contract
from runner.train.strategy import tpu_device_files

KEEP_BYTES = 1 << 30  # freed memory kept for reuse before the heap's top goes back to the kernel
SETTINGS = {"MALLOC_ARENA_MAX": "1", "MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(KEEP_BYTES)}
# Any of these in the job's environment is the user's choice of allocator: none of ours is added beside it.
CHOSEN = (*SETTINGS, "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_", "GLIBC_TUNABLES", "LD_PRELOAD")


def accelerator_device_files() -> list[str]:
    """TPU chips' device files (runner.train.strategy) and NVIDIA GPUs'."""
    return tpu_device_files() + sorted(glob.glob("/dev/nvidia[0-9]*"))


def allocator_env(environ: Mapping[str, str], devices: Sequence[str] | None = None) -> dict[str, str]:
    """The settings to add to a job's environment: for_engine() of the built-in trainer's engine; nothing for a
    `command` job."""
    framework = None if environ.get(contract.COMMAND) else contract.training_section(environ).get("framework")
    return for_engine(framework, environ, devices)


def for_engine(
    framework: str | None, environ: Mapping[str, str], devices: Sequence[str] | None = None
) -> dict[str, str]:
    """SETTINGS for the built-in trainer on the JAX engine (`framework` "jax") on a machine with no accelerator
    device files (`devices`, else this machine's); nothing for another engine, where there are some, or where
    `environ` sets any of CHOSEN. The supervisor's choice for a job, and `runner bench`'s for its own trainer's arm."""
    if framework != "jax" or any(environ.get(name) for name in CHOSEN):
        return {}
    if accelerator_device_files() if devices is None else devices:
        return {}
    return dict(SETTINGS)


def described(environ: Mapping[str, str]) -> str:
    """The C allocator's settings a process started with, as `runner bench` shows them."""
    chosen = [f"{name}={environ[name]}" for name in CHOSEN if environ.get(name)]
    return ", ".join(chosen) or "glibc defaults"
