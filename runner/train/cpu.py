"""The CPU a trainer runs on, as the speed choices see it: its model, its feature flags, the CPUs a quota grants.

$RUNNER_CPU_FLAGS changes the CPU features the choices see (/proc/cpuinfo's flags), so that every path can be
tested on any machine: "+avx512_bf16,-amx_bf16" adds and removes flags; a list without signs ("avx2,fma")
replaces the detected flags, "none" empties them. It changes what is decided, not what the hardware does: a
calibration still times the real CPU.

Standard library only: both engines' plans (perf.py, jaxperf.py) and the bench read it before any framework.
"""

from __future__ import annotations

import hashlib
import math
import os
import platform
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

CPU_FLAGS_ENV = "RUNNER_CPU_FLAGS"
# CPU flags that mean bfloat16 arithmetic in hardware: AVX512-BF16 (Cooper Lake, Zen 4+), AMX (Sapphire Rapids+),
# and FEAT_BF16 on Arm (Neoverse V1/N2, Graviton 3+), which /proc/cpuinfo lists as "bf16".
NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})


def read_cpuinfo(path: str = "/proc/cpuinfo") -> str:
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return ""  # not Linux: no flags, so nothing is assumed


def cpu_flags(cpuinfo: str) -> frozenset[str]:
    """The feature flags of the first CPU in a /proc/cpuinfo text ("flags" on x86, "Features" on Arm)."""
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip().lower() in ("flags", "features"):
            return frozenset(value.split())
    return frozenset()


def override_flags(detected: frozenset[str], spec: str | None) -> frozenset[str]:
    """The flags after $RUNNER_CPU_FLAGS: "+f" adds f, "-f" removes it, bare names replace the detected set
    ("none": no flags); commas or spaces separate them. Unset or empty: the detected flags."""
    tokens = (spec or "").replace(",", " ").split()
    if not tokens:
        return detected
    bare = [t for t in tokens if t[0] not in "+-"]
    if any(len(t) < 2 for t in tokens if t[0] in "+-"):
        raise ValueError(f"{CPU_FLAGS_ENV}={spec!r}: give flags as +name, -name or name, e.g. +avx512_bf16,-amx_bf16")
    flags = set() if bare else set(detected)
    flags.update(t for t in bare if t != "none")
    flags.update(t[1:] for t in tokens if t[0] == "+")
    flags.difference_update(t[1:] for t in tokens if t[0] == "-")
    return frozenset(flags)


def cpu_model(cpuinfo: str) -> str:
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip().lower() in ("model name", "cpu model", "hardware"):
            return value.strip()
    return platform.processor() or platform.machine()


def has_native_bf16(flags: frozenset[str]) -> bool:
    return bool(flags & NATIVE_BF16_FLAGS)


def cpu_quota(root: str = "/sys/fs/cgroup") -> float | None:
    """CPUs granted by a cgroup quota (docker --cpus), or None when unlimited or unknown."""
    base = Path(root)
    try:
        quota, period = (base / "cpu.max").read_text().split()[:2]  # cgroup v2: "max 100000" or "150000 100000"
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota_us = int((base / "cpu" / "cpu.cfs_quota_us").read_text())  # cgroup v1: -1 when unlimited
        period_us = int((base / "cpu" / "cpu.cfs_period_us").read_text())
        return quota_us / period_us if quota_us > 0 else None
    except (OSError, ValueError):
        return None


def usable_cpus(quota: float | None = None, affinity: int | None = None) -> int:
    if affinity is None:
        affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(affinity, math.ceil(quota))) if quota else affinity


@dataclass(frozen=True)
class Cpu:
    """This machine's CPU as the choices see it: `flags` after $RUNNER_CPU_FLAGS (`forced`, when set)."""

    model: str
    flags: frozenset[str]
    forced: str | None = None

    @property
    def native_bf16(self) -> bool:
        return has_native_bf16(self.flags)

    def flags_digest(self) -> str:
        """The flags in a few characters, for a cache key: another CPU feature set is another key."""
        return hashlib.sha256(" ".join(sorted(self.flags)).encode()).hexdigest()[:16]


def detect(cpuinfo: str | None = None, environ: Mapping[str, str] | None = None) -> Cpu:
    """The CPU from /proc/cpuinfo (or the `cpuinfo` text given), its flags as $RUNNER_CPU_FLAGS leaves them."""
    text = read_cpuinfo() if cpuinfo is None else cpuinfo
    forced = (os.environ if environ is None else environ).get(CPU_FLAGS_ENV) or None
    return Cpu(cpu_model(text), override_flags(cpu_flags(text), forced), forced)
