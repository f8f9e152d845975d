"""Run by Python's `site` at the start of every interpreter of the job (the supervisor puts this directory first on
the job's PYTHONPATH when the runner made a cluster for it): the runner's cluster becomes one JAX knows, so that a
bare `jax.distributed.initialize()` (and keras.distribution.initialize() on JAX) connects the job's processes.

Nothing is imported now: the registration (runner.train.jaxcluster) waits until the job imports JAX, so a job that
never does pays only for one entry on sys.meta_path. A sitecustomize of the job's own (its image's, a user's on
PYTHONPATH) still runs: the next one on the path is run after this one, as if this one were not there.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

_TARGET = "jax._src.clusters"  # where JAX's ClusterEnv and its cluster kinds are


class _ThenRegister(importlib.abc.Loader):
    """JAX's own loader of jax._src.clusters, then the runner's cluster registered in the module it made."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self._loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        try:
            from runner.train.jaxcluster import register

            register(module)
        except Exception as exc:  # the job runs on; a bare initialize() then says what it lacks
            print(f"[runner] JAX does not know the runner's cluster: {exc!r}", file=sys.stderr, flush=True)

    def __getattr__(self, name: str) -> Any:  # get_source, get_resource_reader, ... stay the real loader's
        if name == "_loader":
            raise AttributeError(name)
        return getattr(self._loader, name)


class _WhenJaxLoads(importlib.abc.MetaPathFinder):
    """Finds nothing itself: it asks the finders after it for jax._src.clusters, once, and wraps the loader."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != _TARGET:
            return None
        sys.meta_path.remove(self)
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _ThenRegister(spec.loader)
                return spec
        return None


def _next_sitecustomize() -> None:
    """The sitecustomize this one hides, if any: the next on sys.path, run as `sitecustomize` from now on."""
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


if not any(isinstance(finder, _WhenJaxLoads) for finder in sys.meta_path):
    sys.meta_path.insert(0, _WhenJaxLoads())
_next_sitecustomize()
