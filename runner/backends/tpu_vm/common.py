"""The TPU VM backend's flows' context (runner.backends.flows): the Cloud TPU API, and its failures in words."""

from __future__ import annotations

from runner.backends import flows
from runner.backends.google_api import ApiFailure
from runner.backends.tpu_vm.api import TpuApi, explain
from runner.errors import BackendError


class Context(flows.Context[TpuApi]):
    def explain(self, failure: ApiFailure, action: str, *, project: str, zone: str) -> BackendError:
        return explain(failure, action, project=project, zone=zone)
