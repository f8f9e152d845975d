"""The JAX engine's device probe (runner.train.distribution), on this machine's CPU-only JAX. Keras is a stand-in:
Keras picks its backend once per process, and the tests of this process use it on TensorFlow."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from runner.train import distribution
from runner.train.strategy import StrategyError

KERAS = SimpleNamespace(distribution=SimpleNamespace(list_devices=lambda kind=None: ["cpu:0"]))


def test_auto_on_a_machine_with_tpu_chips_that_jax_cannot_see_fails_fast(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(distribution, "tpu_device_files", lambda: ["/dev/vfio/0", "/dev/vfio/1"])
    with pytest.raises(StrategyError, match=r"TPU chips \(/dev/vfio/0, 2 in all\), but JAX sees no TPU") as caught:
        distribution._devices(KERAS, "auto")
    assert "jax[tpu]" in str(caught.value) and "RUNNER_STRATEGY=cpu" in str(caught.value)


def test_auto_with_a_tpu_name_but_no_chips_trains_on_the_cpu_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(distribution, "tpu_device_files", lambda: [])
    monkeypatch.setenv("RUNNER_TPU_NAME", "local")  # as on the emulator's VMs
    kind, devices, note = distribution._devices(KERAS, "auto")
    assert (kind, devices) == ("cpu", ["cpu:0"]) and note.startswith("no TPU: ")
    monkeypatch.delenv("RUNNER_TPU_NAME")
    assert distribution._devices(KERAS, "auto") == ("cpu", ["cpu:0"], "")


def test_an_explicit_accelerator_jax_cannot_see_is_an_error() -> None:
    def list_devices(kind: str | None = None) -> list[str]:
        import jax

        return [str(d) for d in jax.devices(kind)]

    keras = SimpleNamespace(distribution=SimpleNamespace(list_devices=list_devices))
    with pytest.raises(StrategyError, match="RUNNER_STRATEGY=gpu, but JAX sees no GPU"):
        distribution._devices(keras, "gpu")
    with pytest.raises(StrategyError, match="unknown strategy hint 'tpu-v4'"):
        distribution.expect("tpu-v4")
