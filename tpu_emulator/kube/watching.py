"""List, then watch from the list's resourceVersion; a 410 Gone lists again: how every played controller follows the
API server (and the shape a backend's watch takes: STYLE.md, the kubernetes client's watch).

The official client's `watch.Watch().stream` raises ApiException(410) both when the watch is refused at once
(a resourceVersion etcd has compacted away) and for the ERROR event an open watch ends with; either way the
follower lists again, tells its handler the whole state (`on_sync`), and watches from the new resourceVersion.
A watch that simply ends (its timeoutSeconds, a restarted API server) is resumed from the last resourceVersion
seen, so no event is lost and none is seen twice.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tpu_emulator.stderr import note

Handler = Callable[[str, Any], None]  # (ADDED | MODIFIED | DELETED, the object as the client returns it)


@dataclass
class Follower:
    """Follows one list function of the official client (CoreV1Api.list_pod_for_all_namespaces, ...) on a thread."""

    name: str
    list_fn: Callable[..., Any]
    on_event: Handler
    on_sync: Callable[[list[Any]], None]
    kwargs: dict[str, Any] = field(default_factory=dict)  # label_selector, namespace, group/version/plural, ...
    timeout_s: int = 60  # each watch's timeoutSeconds: the server ends it, the follower resumes
    retry_s: float = 0.5  # after an error other than 410 (the API server away)
    stop: threading.Event = field(default_factory=threading.Event)
    relists: int = 0  # lists after a 410 Gone (the first list not counted)
    resource_version: str | None = None
    synced: threading.Event = field(default_factory=threading.Event)  # set after the first list
    _thread: threading.Thread | None = None
    _watch: Any = None  # the open watch, whose connection `close` shuts

    def start(self) -> Follower:
        self._thread = threading.Thread(target=self._run, name=f"follow-{self.name}", daemon=True)
        self._thread.start()
        return self

    def close(self, timeout: float = 10.0) -> None:
        """Stop following: the open watch's connection is shut (a watch waits for its server otherwise)."""
        self.stop.set()
        response = getattr(self._watch, "_resp", None)
        if response is not None:
            with contextlib.suppress(Exception):
                response.shutdown()  # urllib3 2.3+: unblocks the reading thread
        if self._thread is not None:
            self._thread.join(timeout)

    def _items(self, answer: Any) -> tuple[list[Any], str]:
        if isinstance(answer, dict):  # CustomObjectsApi answers plain dicts
            return list(answer.get("items") or []), str(answer["metadata"]["resourceVersion"])
        return list(answer.items or []), str(answer.metadata.resource_version)

    def _list(self) -> None:
        items, self.resource_version = self._items(self.list_fn(**self.kwargs))
        self.on_sync(items)
        self.synced.set()

    def _run(self) -> None:
        from kubernetes import watch
        from kubernetes.client.rest import ApiException

        while not self.stop.is_set():
            try:
                if self.resource_version is None:
                    self._list()
                stream = self._watch = watch.Watch()
                for event in stream.stream(
                    self.list_fn,
                    resource_version=self.resource_version,
                    timeout_seconds=self.timeout_s,
                    **self.kwargs,
                ):
                    if self.stop.is_set():
                        stream.stop()
                        break
                    obj = event["object"]
                    rv = obj["metadata"]["resourceVersion"] if isinstance(obj, dict) else obj.metadata.resource_version
                    self.resource_version = str(rv)
                    self.on_event(str(event["type"]), obj)
            except ApiException as exc:
                if exc.status == 410:
                    self.relists += 1
                    self.resource_version = None  # expired: list again
                    continue
                self._pause(exc)
            except Exception as exc:  # the API server away (connection refused, reset): resume when it is back
                self._pause(exc)

    def _pause(self, exc: BaseException) -> None:
        if not self.stop.is_set():
            with contextlib.suppress(Exception):
                note(f"[kube] {self.name}: {type(exc).__name__}: {str(exc)[:200]}")
            self.stop.wait(self.retry_s)
