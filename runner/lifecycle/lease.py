"""One owner per run: the lease in the run directory (`owner.json`) that `submit`, `resume` and the runner that
follows a run hold while they act on it.

Two runners acting on one run make two machines for one job, or two trainers in one run directory; so before a
runner creates, deletes or rewrites anything of a run, it takes the run's lease, and a second runner is refused
(RunBusy, exit 2) with who holds it: the command, the host and pid, and since when.

Taking it is one conditional write, which no other writer can come between: `write_if` at the generation just read
(0: the run has no lease yet). Two runners that both read the lease free and both write: Cloud Storage (or the
local disk's lock) lets exactly one through, and the other is refused naming the winner. While it holds the lease
the runner rewrites it every `refresh_s`, each rewrite conditioned on its own last one: a refresh that finds
another generation means someone took the run over (this runner was judged dead), and it stops acting on the run.
A lease is free when its holder released it (`released`), or when its holder died: on this host, its pid is gone;
anywhere, Cloud Storage has stored no refresh of it for `ttl_s`, by the storage's own clock (the object's
`updated` against a probe object written now), never by a time a machine wrote.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

from runner import contract
from runner.errors import PreconditionFailed, RunBusy, StorageError
from runner.storage import ObjectInfo, Storage
from runner.timings import Timings


@dataclass(frozen=True)
class Holder:
    """Who holds a run's lease, as its object says."""

    token: str  # this holder's, unique: tells its own writes from anyone else's
    host: str
    pid: int
    command: str  # submit, resume
    since: float | None = None  # when it took the lease, by the storage's clock (known from its first refresh)
    released: bool = False

    def encode(self, beat: int) -> bytes:
        return json.dumps({**asdict(self), "beat": beat}, sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes) -> Holder | None:
        """None for an object that is not a lease (torn, or someone else's bytes): no holder anyone can name."""
        try:
            doc = json.loads(data)
            return cls(
                str(doc["token"]),
                str(doc["host"]),
                int(doc["pid"]),
                str(doc["command"]),
                float(doc["since"]) if doc.get("since") is not None else None,
                bool(doc.get("released", False)),
            )
        except (ValueError, KeyError, TypeError):
            return None

    def said(self, written_at: float | None = None) -> str:
        """Who, where and since when (`written_at`: the object's storage time, for a lease not refreshed yet)."""
        since = self.since if self.since is not None else written_at
        when = time.strftime(" since %Y-%m-%d %H:%M:%S", time.localtime(since)) if since else ""
        return f"`runner {self.command}` on {self.host} (pid {self.pid}){when}"

    def dead_here(self) -> bool:
        """Certainly dead: it ran on this host, and no process has its pid (a pid taken again: alive, to be sure)."""
        if self.host != socket.gethostname():
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False


def storage_now(storage: Storage, token: str) -> float | None:
    """Now by the storage's own clock: a probe object written, its `updated` read, the probe deleted."""
    key = f"{contract.OWNER}.clock-{token}"
    try:
        storage.write_bytes(key, b"")
        now = next((info.updated for info in storage.list(key) if info.key == key), None)
        storage.delete(key)
    except StorageError:
        return None
    return now


class Lease:
    """A run's lease, held by this process from `take` to `release`, refreshed by a thread of its own."""

    def __init__(
        self,
        storage: Storage,
        run_id: str,
        holder: Holder,
        info: ObjectInfo,
        *,
        refresh_s: float,
        say: Callable[[str], None],
    ) -> None:
        self.storage, self.run_id, self.holder, self.say = storage, run_id, holder, say
        self.generation = info.generation or 0
        self.refresh_s = refresh_s
        self.lost = threading.Event()  # someone took the run over: this runner must stop acting on it
        self._beat = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True, name="run-lease")
        self._failing = False
        self._released = False
        if holder.since is None and info.updated is not None:
            self.holder = replace(holder, since=info.updated)

    @classmethod
    def take(
        cls,
        storage: Storage,
        run_id: str,
        *,
        command: str,
        timings: Timings | None = None,
        say: Callable[[str], None] = print,
    ) -> Lease:
        """The run's lease for this process, or RunBusy naming who holds it. StorageError when the run directory
        cannot be read or written: nothing is done to a run whose owner cannot be known."""
        timings = timings or Timings()
        token = secrets.token_hex(8)
        found = storage.read_versioned(contract.OWNER)
        generation = 0
        if found is not None:
            data, info = found
            current = Holder.decode(data)
            if current is None or not current.released:
                cls._must_be_dead(storage, run_id, current, info, timings.lease_ttl_s, token, say)
            generation = info.generation or 0
        mine = Holder(token, socket.gethostname(), os.getpid(), command)
        try:
            written = storage.write_if(contract.OWNER, mine.encode(0), generation=generation)
        except PreconditionFailed:
            again = storage.read_versioned(contract.OWNER)
            winner = Holder.decode(again[0]) if again is not None else None
            who = winner.said(again[1].updated) if winner is not None and again is not None else "another runner"
            raise RunBusy(
                f"run {run_id} was taken by {who} at the same moment: one runner acts on a run at a time",
                hint=_BUSY_HINT.format(run=run_id),
            ) from None
        lease = cls(storage, run_id, mine, written, refresh_s=timings.lease_refresh_s, say=say)
        lease._thread.start()
        return lease

    @staticmethod
    def _must_be_dead(
        storage: Storage,
        run_id: str,
        current: Holder | None,
        info: ObjectInfo,
        ttl_s: float,
        token: str,
        say: Callable[[str], None],
    ) -> None:
        """Returns when the lease's holder is gone (said, with how it is known); RunBusy while it may live."""
        who = current.said(info.updated) if current is not None else "a runner whose lease cannot be read"
        if current is not None and current.dead_here():
            say(f"taking run {run_id} over from {who}: no process has its pid any more")
            return
        now = storage_now(storage, token)
        age = None if now is None or info.updated is None else now - info.updated
        if age is not None and age > ttl_s:
            say(f"taking run {run_id} over from {who}: its lease was last refreshed {age:.0f}s ago (ttl {ttl_s:.0f}s)")
            return
        fresh = f"; its lease was refreshed {max(age, 0):.0f}s ago" if age is not None else ""
        raise RunBusy(f"run {run_id} is held by {who}{fresh}", hint=_BUSY_HINT.format(run=run_id))

    def _write(self, holder: Holder) -> None:
        with self._lock:
            self._beat += 1
            written = self.storage.write_if(contract.OWNER, holder.encode(self._beat), generation=self.generation)
            self.generation = written.generation or self.generation + 1

    def refresh(self) -> None:
        """Rewrite the lease (its storage time is its life). A generation not its own: the run was taken over."""
        if self.lost.is_set():
            return
        try:
            self._write(self.holder)
            self._failing = False
        except PreconditionFailed:
            self.lost.set()
            self.say(f"warning: another runner took run {self.run_id} over; this one stops acting on it")
        except StorageError as exc:
            if not self._failing:  # once per outage
                self.say(f"warning: could not refresh this runner's lease on run {self.run_id}: {exc.message}")
            self._failing = True

    def _run(self) -> None:
        while not self._stop.wait(self.refresh_s):
            self.refresh()

    def release(self) -> None:
        """Free the run for the next runner (a lease that cannot be written frees itself after its ttl). Once."""
        self._stop.set()
        if self.lost.is_set() or self._released:
            return
        self._released = True
        try:
            self._write(replace(self.holder, released=True))
        except PreconditionFailed:
            pass  # someone took it over already
        except StorageError as exc:
            self.say(f"warning: this runner's lease on run {self.run_id} could not be released: {exc.message}")


_BUSY_HINT = (
    "one runner acts on a run at a time: wait for it to end (`runner status {run}`), or stop the run with "
    "`runner down {run}`; a runner that died frees its run once its lease is no longer refreshed"
)
