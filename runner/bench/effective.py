"""What a compiled Keras model really runs with, read back from the model and from TensorFlow in the process that
runs it, rather than taken from what was asked: `runner bench` prints it for both of its trainers, so the plain
fit's column shows Keras' and TensorFlow's defaults as they resolve on the machine at hand (oneDNN, for one, is on
by default on some x86 CPUs and off on others).

Functions take TensorFlow as an argument or import it lazily: importing this module stays cheap.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from runner.train.cpu import usable_cpus
from runner.train.perf import ONEDNN_ENV


def onednn_enabled() -> bool | None:
    """Whether this TensorFlow process runs oneDNN's CPU kernels: TensorFlow's own answer (IsMklEnabled, which reads
    TF_ENABLE_ONEDNN_OPTS and, when it is unset, the CPU's features), so also the effective value when nobody set
    the variable. None when this TensorFlow does not say."""
    try:
        from tensorflow.python.util import _pywrap_util_port
    except ImportError:
        return None
    return bool(_pywrap_util_port.IsMklEnabled())


def effective_threads(tf: Any, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The sizes of TensorFlow's two CPU thread pools as it resolves them: a value set through tf.config, else
    $TF_NUM_INTRAOP_THREADS / $TF_NUM_INTEROP_THREADS, else its default: the CPUs this process may run on
    (port::NumSchedulableCPUs and MaxParallelism in tensorflow/core/common_runtime/local_device.cc and
    process_util.cc, for builds without OpenMP, which the PyPI wheels are), whatever a cgroup quota says."""
    environ = os.environ if environ is None else environ
    default = usable_cpus()
    out: dict[str, Any] = {}
    sources: list[str] = []
    for pool, env_key in (("intra_op", "TF_NUM_INTRAOP_THREADS"), ("inter_op", "TF_NUM_INTEROP_THREADS")):
        configured = int(getattr(tf.config.threading, f"get_{pool}_parallelism_threads")())
        try:
            from_env = int(environ.get(env_key, "0"))
        except ValueError:
            from_env = 0
        if configured > 0:
            out[pool], source = configured, "set"
        elif from_env > 0:
            out[pool], source = from_env, env_key
        else:
            out[pool], source = default, "TensorFlow default"
        sources.append(source)
    out["source"] = "/".join(dict.fromkeys(sources))
    return out


def effective_settings(tf: Any, model: Any) -> dict[str, Any]:
    """What a compiled Keras model will really run with, read back from the model and TensorFlow rather than from
    what was asked: dtype policy (and any layer computing in another dtype), XLA, steps per execution, oneDNN,
    thread pools (`tf` None: Keras 3 on JAX, without the last two). The same keys for every trainer, so
    `runner bench` shows both of its arms alike."""
    policy = getattr(model, "dtype_policy", None)
    precision = str(getattr(policy, "name", policy or "float32"))
    others = sorted(
        {
            f"{type(layer).__name__} {layer.compute_dtype}"
            for layer in getattr(model, "layers", [])
            if getattr(getattr(layer, "dtype_policy", None), "name", precision) != precision
        }
    )
    if others:
        precision += f" ({', '.join(others)})"
    jit = getattr(model, "jit_compile", None)
    steps: Any = getattr(model, "steps_per_execution", None)
    if steps is None:  # tf_keras keeps it in a variable
        steps = getattr(model, "_steps_per_execution", None)
    if hasattr(steps, "numpy"):
        steps = int(steps.numpy())
    from runner.worker.allocator import described

    allocator = described(os.environ)  # what this process started with
    if tf is None:  # Keras 3 on JAX: XLA compiles for the CPU itself; TensorFlow's oneDNN and pools do not apply
        return {
            "precision": precision,
            "jit_compile": None if jit is None else bool(jit),
            "steps_per_execution": steps,
            "onednn": None,
            "onednn_source": "not TensorFlow",
            "threads": None,
            "allocator": allocator,
        }
    from runner.train.fused_dropout import dropout_layers, fused_layers

    dropouts, fused = dropout_layers(model, tf), fused_layers(model, tf)
    return {
        "precision": precision,
        "jit_compile": None if jit is None else bool(jit),
        "steps_per_execution": steps,
        # Whose kernel draws the dropout masks: XLA's fused one (fused_dropout.py) or Keras' own.
        "dropout": f"fused by XLA ({fused} of {len(dropouts)} layers)" if fused else "Keras" if dropouts else None,
        "onednn": onednn_enabled(),
        "onednn_source": (
            f"{ONEDNN_ENV}={os.environ[ONEDNN_ENV]}" if ONEDNN_ENV in os.environ else "TensorFlow default"
        ),
        "threads": effective_threads(tf),
        "allocator": allocator,
    }


def describe_effective(settings: Mapping[str, Any]) -> str:
    """One line of effective_settings, e.g. "float32, XLA off, 1 step/execution, oneDNN on (TensorFlow default),
    threads 2 intra / 2 inter (TensorFlow default)"."""
    jit = settings.get("jit_compile")
    onednn = settings.get("onednn")
    threads = settings.get("threads") or {}
    return ", ".join(
        [
            str(settings.get("precision")),
            "XLA " + ("?" if jit is None else "on" if jit else "off"),
            f"{settings.get('steps_per_execution')} step(s)/execution",
            *([f"dropout {settings['dropout']}"] if settings.get("dropout") else []),
            f"oneDNN {'?' if onednn is None else 'on' if onednn else 'off'} ({settings.get('onednn_source')})",
            f"threads {threads.get('intra_op')} intra / {threads.get('inter_op')} inter ({threads.get('source')})"
            if threads
            else "threads: XLA's own (not TensorFlow)",
            *([f"allocator: {settings['allocator']}"] if settings.get("allocator") else []),
        ]
    )
