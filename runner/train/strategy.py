"""Pick the distribution strategy the way the Colab guides do, and fall back instead of failing.

    TPU (TPUClusterResolver -> TPUStrategy)  ->  several GPUs (MirroredStrategy)  ->  the default strategy

On a single-host TPU VM the resolver is given the literal tpu="local" (the env var TPU_NAME=local is not special-
cased by TensorFlow); on a multi-host pod slice, the node name. TensorFlow is imported inside the functions so
that importing this module (and `runner.train`) stays cheap for user code and for the control plane.
"""

from __future__ import annotations

import glob
import logging
import os
from dataclasses import dataclass, field
from typing import Any

from runner import contract

log = logging.getLogger(__name__)


class StrategyError(RuntimeError):
    """The strategy that was asked for explicitly (RUNNER_STRATEGY=tpu or gpu) is not available."""


@dataclass(frozen=True)
class ResolvedStrategy:
    strategy: Any  # tf.distribute.Strategy
    kind: str  # "tpu" | "gpu" | "cpu"
    replicas: int
    devices: list[str] = field(default_factory=list)
    note: str = ""  # why this strategy (e.g. what the TPU attempt said before falling back)

    @property
    def name(self) -> str:
        name = type(self.strategy).__name__
        return "DefaultStrategy" if name == "_DefaultDistributionStrategy" else name

    def describe(self) -> str:
        text = f"{self.name} on {self.kind.upper()}, {self.replicas} replica{'s' if self.replicas != 1 else ''}"
        return f"{text} ({self.note})" if self.note else text

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "replicas": self.replicas,
            "devices": self.devices,
            "note": self.note,
        }


def tpu_name_from_env() -> str | None:
    return os.environ.get(contract.TPU_NAME) or os.environ.get("TPU_NAME") or None


def tpu_device_files() -> list[str]:
    """The TPU chips' device files: /dev/accel* (v2-v4) or VFIO groups (v5e+)."""
    return sorted(glob.glob("/dev/accel*")) + sorted(glob.glob("/dev/vfio/[0-9]*"))


def tpu_present() -> bool:
    """Cheap check, without TensorFlow: a TPU VM exposes its chips as device files, or a TPU name is set."""
    return bool(tpu_device_files() or tpu_name_from_env())


def _connect_tpu(tf: Any, name: str) -> ResolvedStrategy:
    resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=name)
    tf.config.experimental_connect_to_cluster(resolver)
    tf.tpu.experimental.initialize_tpu_system(resolver)
    strategy = tf.distribute.TPUStrategy(resolver)
    devices = [d.name for d in tf.config.list_logical_devices("TPU")]
    return ResolvedStrategy(strategy, "tpu", strategy.num_replicas_in_sync, devices, f"tpu={name!r}")


def resolve_strategy(hint: str | None = None, tpu: str | None = None) -> ResolvedStrategy:
    """The best strategy available here. `hint` (default $RUNNER_STRATEGY or "auto") is auto, tpu, gpu or cpu;
    an explicit tpu or gpu that is not available raises StrategyError instead of silently training on CPU."""
    import tensorflow as tf

    hint = (hint or os.environ.get(contract.STRATEGY) or "auto").lower()
    if hint not in ("auto", "tpu", "gpu", "cpu"):
        raise StrategyError(f"unknown strategy hint {hint!r}; use auto, tpu, gpu or cpu")
    note = ""
    if hint == "tpu" or (hint == "auto" and (tpu or tpu_present())):
        name = tpu or tpu_name_from_env() or "local"
        try:
            resolved = _connect_tpu(tf, name)
            log.info("TPU strategy: %s", resolved.describe())
            return resolved
        except (ValueError, RuntimeError, tf.errors.OpError) as exc:
            if hint == "tpu":
                raise StrategyError(f"no TPU reachable as {name!r}: {exc}") from exc
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            note = f"no TPU: {first.split('. ')[0].rstrip('.')[:100]}"  # the whole error goes to the log below
            log.warning("TPU not available, falling back: %s", exc)
    gpus = tf.config.list_physical_devices("GPU") if hint != "cpu" else []
    if hint == "gpu" and not gpus:
        raise StrategyError("RUNNER_STRATEGY=gpu, but TensorFlow sees no GPU")
    if len(gpus) > 1:
        strategy = tf.distribute.MirroredStrategy()
        devices = [d.name for d in tf.config.list_logical_devices("GPU")]
        return ResolvedStrategy(strategy, "gpu", strategy.num_replicas_in_sync, devices, note)
    kind = "gpu" if gpus else "cpu"
    devices = [d.name for d in tf.config.list_logical_devices(kind.upper())]
    return ResolvedStrategy(tf.distribute.get_strategy(), kind, 1, devices, note)
