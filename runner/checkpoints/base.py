"""The interface every checkpoint format implements, after Orbax's CheckpointManager: find its checkpoints (each
committed or not), verify one, and say which objects bring the newest back onto a new machine.

A format reads a Listing: what a checkpoint directory holds (RUNNER_CHECKPOINT_DIR on the machine, or checkpoints/
in the run directory), keyed relative to it, and a way to read the few small files a format needs (the runner's
manifest, a BackupAndRestore's metadata). Finding is pure logic over that listing, so one format serves the
supervisor, the mirror, the trainer and `runner status` alike.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from runner.errors import StorageError
from runner.storage import ObjectInfo, Storage


@dataclass(frozen=True)
class Listing:
    """A checkpoint directory as it is now: its objects keyed relative to it, `read` for one of them (None when
    missing or unreadable), and whether it is a local disk (where a rename is atomic: Orbax commits a step so)."""

    objects: dict[str, ObjectInfo]
    read: Callable[[str], bytes | None]
    local: bool

    @classmethod
    def of_directory(cls, directory: Path) -> Listing:
        """A local directory (missing: empty), listed as a job rewrites it (runner.storage.local)."""
        from runner.storage.local import LocalStorage

        return cls.of_storage(LocalStorage(directory), "")

    @classmethod
    def of_storage(cls, storage: Storage, prefix: str, root: str | None = None) -> Listing:
        """The objects under `prefix` (e.g. 'checkpoints/') of a storage, keyed relative to `root` (a prefix of
        it; default: `prefix` itself); raises StorageError when it cannot be listed. A read that fails later reads
        as missing: the object may be gone by then."""
        root = prefix if root is None else root

        def read(key: str) -> bytes | None:
            try:
                return storage.read_bytes(root + key)
            except StorageError:
                return None

        objects = {o.key.removeprefix(root): o for o in storage.list(prefix)}
        return cls(objects, read, storage.is_local)

    def without(self, prefix: str) -> Listing:
        """The same listing less the keys under `prefix` (the shared location, within checkpoints/)."""
        return Listing({k: v for k, v in self.objects.items() if not k.startswith(prefix)}, self.read, self.local)

    @classmethod
    def of_keys(cls, keys: Iterable[str], local: bool = True) -> Listing:
        """Keys alone (what a mirror pushed): grouping needs no sizes, and nothing is read."""
        return cls({k: ObjectInfo(k, 0) for k in keys}, lambda _key: None, local)


@dataclass(frozen=True)
class Saved:
    """One checkpoint as its format finds it. `keys`: its objects (relative to the checkpoint directory), data
    first and `markers` (what makes it count: Orbax's commit_success.txt) last, so that they are uploaded last and
    deleted first. `order` ranks it in its `series` (higher: newer); `step` is the training step it holds, when its
    format says (Orbax's step, the runner's manifest's global step)."""

    format: str
    path: str  # a file, a directory ('640'), or a TensorFlow prefix ('tf/ckpt-6'), under the checkpoint directory
    keys: tuple[str, ...]
    committed: bool
    series: str = ""
    order: tuple[int, ...] = ()
    step: int | None = None
    epochs_done: int | None = None
    epoch_step: int | None = None  # steps of the next epoch done (a mid-epoch save of the runner's trainer)
    size: int = 0
    time: float | None = None  # when it was saved: its format's word, else its newest object's
    markers: tuple[str, ...] = ()
    shown: str = ""  # how a person reads it, when its path alone does not say: 'step 640 (Orbax)'

    @property
    def title(self) -> str:
        """'step 640 (Orbax)', 'ckpt-000003.keras (step 180)', 'tf/ckpt-6 (TensorFlow)', 'model-03.keras'."""
        return self.shown or self.path


@dataclass
class Found:
    """What one format found: its checkpoints, the objects it owns beside them (a manifest, TensorFlow's
    `checkpoint` state file: restored with them), and a problem worth saying (an unreadable manifest)."""

    saved: list[Saved] = field(default_factory=list)
    shared: list[str] = field(default_factory=list)
    problem: str | None = None
    indexed: set[str] = field(default_factory=set)  # the paths its own index names (the runner's manifest)

    @property
    def keys(self) -> set[str]:
        return {k for s in self.saved for k in s.keys} | set(self.shared)


class Format(ABC):
    """One kind of checkpoint. Formats are asked in turn, each among the keys no earlier one claimed."""

    label: str = ""

    @abstractmethod
    def find(self, listing: Listing, unclaimed: set[str]) -> Found:
        """Its checkpoints among `unclaimed` (every one, committed or not), and the objects it owns beside them.
        Must not fail on what a job writes: a file it cannot read is a problem noted, or a checkpoint not counted."""

    def verify(self, saved: Saved, directory: Path) -> str | None:
        """Why the checkpoint (a copy in the local `directory`) cannot be resumed from, or None. The default: it is
        committed and every object is there."""
        if not saved.committed:
            return "not committed (still being written, or abandoned)"
        missing = [k for k in saved.keys if not (directory / k).is_file()]
        return f"{len(missing)} of its files are missing (first: {missing[0]})" if missing else None

    def restore(self, found: Found, keep: int) -> list[str]:
        """The objects a new machine needs, in the order to fetch them: of each series the `keep` newest committed
        checkpoints (markers last), then the objects the format owns beside them. Says nothing; never fails."""
        chosen: list[str] = []
        for members in by_series(found.saved).values():
            for saved in newest_first([s for s in members if s.committed])[:keep]:
                chosen += [k for k in saved.keys if k not in saved.markers] + list(saved.markers)
        return chosen + found.shared


def by_series(saved: Iterable[Saved]) -> dict[str, list[Saved]]:
    out: dict[str, list[Saved]] = {}
    for s in saved:
        out.setdefault(s.series, []).append(s)
    return out


def newest_first(saved: Iterable[Saved]) -> list[Saved]:
    """By rank in the series, then by when saved."""
    return sorted(saved, key=lambda s: (s.order, s.time or 0.0, s.path), reverse=True)


def newest_time(listing: Listing, keys: Iterable[str]) -> float | None:
    times = [t for k in keys if (t := listing.objects[k].updated) is not None]
    return max(times) if times else None


def total_size(listing: Listing, keys: Iterable[str]) -> int:
    return sum(listing.objects[k].size for k in keys)
