"""Pick the distribution strategy the way the Colab guides do, and fall back instead of failing.

    TPU (TPUClusterResolver -> TPUStrategy)  ->  several GPUs (MirroredStrategy)  ->  the default strategy

Several workers without a TPU ($RUNNER_NUM_WORKERS > 1 and a TF_CONFIG: `runner submit --local --workers N`, the
multi-worker rehearsal) take MultiWorkerMirroredStrategy instead: one replica per worker on its CPU (or GPU), the
gradients all-reduced between the processes (tensorflow.org/tutorials/distribute/multi_worker_with_keras).

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
        aliases = {
            "_DefaultDistributionStrategy": "DefaultStrategy",
            "CollectiveAllReduceStrategy": "MultiWorkerMirroredStrategy",  # its class's name
        }
        return aliases.get(name, name)

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


def multi_worker() -> bool:
    """Several workers that TF_CONFIG connects (the local rehearsal); a pod slice's TensorFlow runs on worker 0."""
    return int(os.environ.get(contract.NUM_WORKERS) or 1) > 1 and bool(os.environ.get("TF_CONFIG"))


def _multi_worker(tf: Any, kind: str, note: str) -> ResolvedStrategy:
    """MultiWorkerMirroredStrategy over TF_CONFIG's cluster. It must be created before any other TensorFlow op runs
    (the guide's rule); the CPU's collectives are the ring's."""
    options = tf.distribute.experimental.CommunicationOptions(
        implementation=tf.distribute.experimental.CommunicationImplementation.RING
    )
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    devices = [d.name for d in tf.config.list_logical_devices(kind.upper())]
    resolver = strategy.cluster_resolver
    text = f"worker {resolver.task_id} of {len(resolver.cluster_spec().as_dict().get('worker', []))}"
    return ResolvedStrategy(strategy, kind, strategy.num_replicas_in_sync, devices, f"{text}; {note}" if note else text)


def is_chief(resolved: ResolvedStrategy) -> bool:
    """Whether this process writes the run directory: always, except a worker other than TF_CONFIG's worker 0 (the
    chief: no 'chief' task is configured) under MultiWorkerMirroredStrategy."""
    resolver = getattr(resolved.strategy, "cluster_resolver", None)
    if resolver is None or not multi_worker() or resolver.task_type != "worker":
        return True
    return int(resolver.task_id or 0) == 0


def resolve_strategy(hint: str | None = None, tpu: str | None = None) -> ResolvedStrategy:
    """The best strategy available here. `hint` (default $RUNNER_STRATEGY or "auto") is auto, tpu, gpu or cpu;
    an explicit tpu or gpu that is not available raises StrategyError instead of silently training on CPU."""
    import tensorflow as tf

    hint = (hint or os.environ.get(contract.STRATEGY) or "auto").lower()
    if hint not in ("auto", "tpu", "gpu", "cpu"):
        raise StrategyError(f"unknown strategy hint {hint!r}; use auto, tpu, gpu or cpu")
    note = ""
    if hint == "tpu" or (hint == "auto" and (tpu or tpu_present())):
        name = tpu or tpu_name_from_env() or contract.THIS_TPU
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
    if multi_worker():
        return _multi_worker(tf, "gpu" if gpus else "cpu", note)
    if len(gpus) > 1:
        strategy = tf.distribute.MirroredStrategy()
        devices = [d.name for d in tf.config.list_logical_devices("GPU")]
        return ResolvedStrategy(strategy, "gpu", strategy.num_replicas_in_sync, devices, note)
    kind = "gpu" if gpus else "cpu"
    devices = [d.name for d in tf.config.list_logical_devices(kind.upper())]
    return ResolvedStrategy(tf.distribute.get_strategy(), kind, 1, devices, note)
