"""Keras 3 on JAX: the devices, and keras.distribution over them; the JAX counterpart of strategy.py.

    resolve_distribution()  ->  keras.distribution.DataParallel over keras.distribution.list_devices()

What is expected comes from $RUNNER_STRATEGY, as for TensorFlow: a tpu or gpu that JAX cannot see is an error
(StrategyError, the trainer's exit 2), never a quiet fall back to the CPU; auto takes the best JAX has (TPU, then
GPU, then CPU), except on a machine with TPU chips (/dev/accel*, /dev/vfio) that JAX cannot use: an error too,
where TensorFlow's auto falls back (a TPU VM bills for its chips whatever trains); with a TPU name but no chips
(the emulator's VMs) it says why in the note; cpu keeps JAX off any accelerator (JAX_PLATFORMS=cpu, when JAX is
not imported yet).

Multi-host ($RUNNER_NUM_WORKERS > 1: a pod slice, every host running the same program): keras.distribution
.initialize() comes first, before any JAX computation. "For certain runtime like cloud TPU, this value can be None,
and the backend will figure it out with the TPU environment variables" (keras.io/api/distribution/
distribution_utils/, `initialize`); elsewhere KERAS_DISTRIBUTION_JOB_ADDRESSES, KERAS_DISTRIBUTION_NUM_PROCESSES
and KERAS_DISTRIBUTION_PROCESS_ID say where the coordinator is and who this process is. list_devices() then
returns the devices of every host ("in a distributed setting, global devices are returned"), and DataParallel
replicates the variables over all of them and splits each global batch (keras.io/guides/distribution/).

Importing this module imports neither JAX nor Keras.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any

from runner import contract
from runner.train.strategy import StrategyError, tpu_device_files, tpu_name_from_env

HINTS = ("auto", "tpu", "gpu", "cpu")


@dataclass(frozen=True)
class ResolvedDistribution:
    distribution: Any  # keras.distribution.DataParallel
    kind: str  # "tpu" | "gpu" | "cpu"
    devices: list[str]  # global: every process's, as keras.distribution.list_devices() names them
    processes: int = 1
    process_index: int = 0
    local_devices: int = 1
    note: str = ""

    name = "DataParallel"

    @property
    def replicas(self) -> int:
        return len(self.devices)

    @property
    def is_chief(self) -> bool:
        """Process 0, which alone writes the run directory on a multi-host slice."""
        return self.process_index == 0

    def describe(self) -> str:
        replicas = f"{self.replicas} replica{'s' if self.replicas != 1 else ''}"
        shown = ", ".join(self.devices) if len(self.devices) <= 8 else f"{self.devices[0]} ... {self.devices[-1]}"
        text = f"{self.name} on {self.kind.upper()}, {replicas} ({shown})"
        if self.processes > 1:
            text += (
                f", {self.processes} processes of {self.local_devices} devices (this is process {self.process_index})"
            )
        return f"{text} ({self.note})" if self.note else text

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "replicas": self.replicas,
            "devices": self.devices,
            "processes": self.processes,
            "process_index": self.process_index,
            "note": self.note,
        }


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__


def keras_on_jax(force: bool = False) -> Any:
    """Keras 3 on the JAX backend. `force` (the built-in trainer) sets KERAS_BACKEND=jax; otherwise a
    KERAS_BACKEND the user set is kept, and a Keras already running on another backend is an error."""
    if force:
        os.environ["KERAS_BACKEND"] = "jax"
    else:
        os.environ.setdefault("KERAS_BACKEND", "jax")
    import keras

    if keras.backend.backend() != "jax":
        raise StrategyError(
            f"Keras runs on {keras.backend.backend()} in this process: set KERAS_BACKEND=jax before keras is "
            "first imported"
        )
    return keras


def expect(hint: str | None = None) -> str:
    """The device kind asked for (`hint`, else $RUNNER_STRATEGY, else auto), checked. For cpu, JAX is kept off any
    accelerator: JAX_PLATFORMS=cpu, which JAX reads when it is imported, so only before that."""
    hint = (hint or os.environ.get(contract.STRATEGY) or "auto").lower()
    if hint not in HINTS:
        raise StrategyError(f"unknown strategy hint {hint!r}; use auto, tpu, gpu or cpu")
    if hint == "cpu" and "jax" not in sys.modules:
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
    return hint


def _devices(keras: Any, hint: str) -> tuple[str, list[str], str]:
    """(kind, devices, note) for the hint; StrategyError when an explicit tpu or gpu is not there."""
    import jax

    list_devices = keras.distribution.list_devices
    if hint in ("tpu", "gpu", "cpu"):
        try:
            devices = list_devices(hint)
        except RuntimeError as exc:
            raise StrategyError(
                f"{contract.STRATEGY}={hint}, but JAX sees no {hint.upper()}: {_first_line(exc)}"
            ) from exc
        if not devices:
            raise StrategyError(f"{contract.STRATEGY}={hint}, but JAX lists no {hint.upper()} device")
        return hint, devices, ""
    devices = list_devices()
    kind = jax.default_backend()
    note = ""
    files = tpu_device_files()
    if kind != "tpu" and (files or tpu_name_from_env()):
        why = "JAX lists none"
        try:
            jax.devices("tpu")
        except RuntimeError as exc:
            why = _first_line(exc)[:150]
        if files:  # TPU chips on this machine that JAX cannot use: a broken image, not a reason to train on CPU
            raise StrategyError(
                f"this machine has TPU chips ({files[0]}, {len(files)} in all), but JAX sees no TPU ({why}); the "
                "image needs jax[tpu] (libtpu), and only one process per host may hold the TPU "
                f"(/tmp/libtpu_lockfile). Set {contract.STRATEGY}=cpu to train on the CPU anyway"
            )
        note = f"no TPU: {why}"  # a TPU name but no chips (the emulator's VMs): the CPU, said
    return kind if kind in ("tpu", "gpu") else "cpu", devices, note


def resolve_distribution(
    hint: str | None = None, *, num_workers: int | None = None, set_global: bool = True, force_backend: bool = False
) -> ResolvedDistribution:
    """DataParallel over every device JAX has (of every host, on a multi-host slice), set as Keras' global
    distribution unless `set_global` is False. `hint` (default $RUNNER_STRATEGY or auto) is auto, tpu, gpu or cpu;
    `num_workers` (default $RUNNER_NUM_WORKERS) above 1 calls keras.distribution.initialize() first, which must
    come before any JAX computation. Raises StrategyError when what was asked for is not there."""
    hint = expect(hint)
    keras = keras_on_jax(force_backend)
    workers = num_workers if num_workers is not None else int(os.environ.get(contract.NUM_WORKERS) or 1)
    if workers > 1:
        try:
            keras.distribution.initialize()
        except Exception as exc:  # no coordinator, no TPU metadata: say so instead of a traceback
            raise StrategyError(
                f"keras.distribution.initialize() failed for {workers} workers: {_first_line(exc)}"
            ) from exc
    import jax

    kind, devices, note = _devices(keras, hint)
    if workers > 1 and jax.process_count() != workers:
        raise StrategyError(f"{contract.NUM_WORKERS}={workers}, but JAX found {jax.process_count()} processes")
    distribution = keras.distribution.DataParallel(devices=devices)
    if jax.process_count() > 1:
        # Each process feeds its own share of every global batch (npdata), not the whole batch for Keras to shard
        # (which Keras does only for a tf.data.Dataset).
        distribution.auto_shard_dataset = False
    if set_global:
        keras.distribution.set_distribution(distribution)
    return ResolvedDistribution(
        distribution,
        kind,
        devices,
        processes=jax.process_count(),
        process_index=jax.process_index(),
        local_devices=jax.local_device_count(kind if hint != "auto" else None),
        note=note,
    )
