"""Checkpoint files, their manifest, rotation, and the choice of the one to resume from.

    checkpoints/ckpt-000003.keras           after epoch 3 (3 epochs done)
    checkpoints/ckpt-000003-s000040.keras   mid-epoch: 3 epochs done and 40 steps of epoch 4 (a stop, or a timed save)
    checkpoints/latest.json                 the manifest: every kept checkpoint, newest first, with size and crc32c

Publishing: Keras writes a hidden temporary file, which is renamed to its final name, then the manifest is rewritten
(atomically), and only then are checkpoints beyond the newest `keep` deleted. A reader thus never finds a manifest
naming a file that was not complete, and the mirror (which uploads oldest first, and deletes what rotation removed
after uploading) gives the bucket the same guarantee.

Resuming: the newest checkpoint that verifies wins. A listed one must match the manifest's size and crc32c and be an
intact .keras zip (every member's CRC); an unlisted one (the manifest is unreadable, or a crash came between rename
and manifest) only the zip check. Positions come from the manifest or the file name, never from lexical order:
"ckpt-000002-s000010.keras" sorts before "ckpt-000002.keras" but is newer.

No TensorFlow import here: the trainer reads the manifest before it chooses which Keras to import.
"""

from __future__ import annotations

import atexit
import base64
import json
import os
import re
import shutil
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from runner import contract
from runner.storage.local import write_atomic

MANIFEST = Path(contract.LATEST_CHECKPOINT).name
MANIFEST_FORMAT = 2
DEFAULT_KEEP = 2
NAME_RE = re.compile(r"^ckpt-(?P<epochs>\d{6,})(?:-s(?P<step>\d{6,}))?\.keras$")
TEMP_SUFFIX = ".tmp.keras"  # Keras insists on the .keras suffix, even for the temporary file
# Members every .keras archive has, from Keras 3 and tf_keras alike (checked: metadata.json, config.json,
# model.weights.h5, all stored uncompressed).
ARCHIVE_MEMBERS = ("metadata.json", "config.json")
_CHUNK = 1 << 20

Position = tuple[int, int]  # (epochs done, steps done of the next epoch): orders checkpoints


class ManifestError(ValueError):
    """latest.json cannot be used; the message says why (for the trainer's log line)."""


def checkpoint_name(epochs_done: int, step: int = 0) -> str:
    """ckpt-EEEEEE.keras at an epoch end, ckpt-EEEEEE-sSSSSSS.keras `step` steps into the next epoch."""
    return contract.checkpoint_name(epochs_done) if step == 0 else f"ckpt-{epochs_done:06d}-s{step:06d}.keras"


def parse_name(name: str) -> Position | None:
    """The position a checkpoint's file name encodes, or None when the name is not a checkpoint's."""
    match = NAME_RE.match(name)
    if not match:
        return None
    return int(match["epochs"]), int(match["step"] or 0)


def describe(position: Position, steps_per_epoch: int) -> str:
    """'epoch E step S of N' with E the epoch the position is in (1-based): an epoch end reads as its last step."""
    epochs_done, step = position
    if step == 0 and epochs_done > 0:
        return f"epoch {epochs_done} step {steps_per_epoch} of {steps_per_epoch}"
    return f"epoch {epochs_done + 1} step {step} of {steps_per_epoch}"


def file_crc32c(path: Path) -> str:
    """CRC32C as Cloud Storage reports it (blob.crc32c): base64 of the 4 big-endian bytes."""
    import google_crc32c  # installed with google-cloud-storage; C implementation where available

    checksum = google_crc32c.Checksum()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            checksum.update(chunk)
    return base64.b64encode(checksum.digest()).decode("ascii")


def archive_problem(path: Path) -> str | None:
    """Why `path` is not an intact .keras archive, or None. testzip reads every member and checks its CRC, so a
    truncated file (no central directory) and flipped bytes (a member's CRC) are both caught."""
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
            if bad is not None:
                return f"not an intact .keras archive (CRC error in {bad})"
            missing = [m for m in ARCHIVE_MEMBERS if m not in archive.namelist()]
            if missing:
                return f"not a .keras archive (no {', '.join(missing)})"
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, ValueError) as exc:
        return f"not an intact .keras archive ({exc})"
    return None


def archive_keras(path: Path) -> str | None:
    """keras3 or tf_keras, from the keras_version the archive's metadata.json records (3.x or 2.x)."""
    try:
        with zipfile.ZipFile(path) as archive:
            version = str(json.loads(archive.read("metadata.json"))["keras_version"])
    except (zipfile.BadZipFile, OSError, KeyError, ValueError, TypeError, EOFError):
        return None
    return "tf_keras" if version.startswith("2.") else "keras3" if version.startswith("3.") else None


# How an engine draws an epoch's order from (seed, epoch): the same seed gives other batches under each.
TF_SHUFFLE = "tf.random.experimental.stateless_shuffle"  # runner.train.data (TensorFlow)
NUMPY_SHUFFLE = "numpy.random.RandomState.permutation"  # runner.train.npdata (JAX)


@dataclass(frozen=True)
class DataOrder:
    """What fixes an epoch's batches (runner.train.data, runner.train.npdata): a mid-epoch position only means
    something for the same. Manifests from before the JAX engine say no `shuffle`: theirs is TensorFlow's."""

    seed: int
    examples: int
    batch_size: int
    steps_per_epoch: int
    shuffle: str = TF_SHUFFLE

    def to_json(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "examples": self.examples,
            "batch_size": self.batch_size,
            "steps_per_epoch": self.steps_per_epoch,
            "shuffle": self.shuffle,
        }

    @classmethod
    def from_json(cls, raw: Any) -> DataOrder:
        counts = {k: int(raw[k]) for k in ("seed", "examples", "batch_size", "steps_per_epoch")}
        return cls(**counts, shuffle=str(raw.get("shuffle") or TF_SHUFFLE))


def _framework(raw: Any) -> str | None:
    """The manifest entry's engine: absent in manifests from before the JAX engine (TensorFlow's), null when
    unknown."""
    if "framework" not in raw:
        return "tensorflow"
    return str(raw["framework"]) if raw["framework"] else None


@dataclass(frozen=True)
class Checkpoint:
    """One manifest entry. Only file and position are known for a checkpoint found by a directory scan."""

    file: str
    epochs_done: int
    step: int = 0
    global_step: int | None = None
    size: int | None = None
    crc32c: str | None = None
    keras: str | None = None
    time: float | None = None
    data: DataOrder | None = None
    # The engine that wrote it (training.framework), None when unknown: a checkpoint found by a directory scan (the
    # archive does not say) or listed as such. Manifests from before the JAX engine have no such key: TensorFlow's.
    framework: str | None = None

    @property
    def position(self) -> Position:
        return self.epochs_done, self.step

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "file": self.file,
            "epochs_done": self.epochs_done,
            "step": self.step,
            "global_step": self.global_step,
            "size": self.size,
            "crc32c": self.crc32c,
            "keras": self.keras,
            "framework": self.framework,
            "time": self.time,
        }
        if self.data is not None:
            out["data"] = self.data.to_json()
        return out

    @classmethod
    def from_json(cls, raw: Any) -> Checkpoint:
        if not isinstance(raw, dict):
            raise ManifestError(f"an entry is {type(raw).__name__}, not an object")
        try:
            name = str(raw["file"])
            if parse_name(name) is None or Path(name).name != name:
                raise ManifestError(f"{name!r} is not a checkpoint file name")
            data = raw.get("data")
            return cls(
                file=name,
                epochs_done=int(raw["epochs_done"]),
                step=int(raw.get("step") or 0),
                global_step=None if raw.get("global_step") is None else int(raw["global_step"]),
                size=None if raw.get("size") is None else int(raw["size"]),
                crc32c=None if raw.get("crc32c") is None else str(raw["crc32c"]),
                keras=None if raw.get("keras") is None else str(raw["keras"]),
                time=None if raw.get("time") is None else float(raw["time"]),
                data=None if data is None else DataOrder.from_json(data),
                framework=_framework(raw),
            )
        except ManifestError:
            raise
        except (KeyError, TypeError, ValueError) as exc:
            raise ManifestError(f"an entry is malformed ({type(exc).__name__}: {exc})") from exc


def manifest_bytes(entries: Iterable[Checkpoint]) -> bytes:
    """The manifest: every kept checkpoint, newest first. The top-level epoch/path/keras/time describe the newest,
    as format 1 did, for readers that only want that (scripts/faults.py, older runners)."""
    listed = sorted(entries, key=lambda c: c.position, reverse=True)
    newest = listed[0] if listed else None
    doc = {
        "format": MANIFEST_FORMAT,
        "epoch": newest.epochs_done if newest else None,
        "step": newest.step if newest else None,
        "path": newest.file if newest else None,
        "keras": newest.keras if newest else None,
        "time": newest.time if newest else None,
        "checkpoints": [c.to_json() for c in listed],
    }
    return json.dumps(doc, indent=1).encode()


def parse_manifest(raw: bytes) -> list[Checkpoint]:
    """The entries of a manifest, newest first. Format 1 ({"epoch", "path", "keras"}) reads as one entry without
    size and crc32c, so it is verified like a scanned file. Raises ManifestError."""
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ManifestError(f"not JSON ({exc})") from exc
    if not isinstance(doc, dict):
        raise ManifestError("not a JSON object")
    if "checkpoints" in doc:
        if not isinstance(doc["checkpoints"], list):
            raise ManifestError("'checkpoints' is not a list")
        entries = [Checkpoint.from_json(item) for item in doc["checkpoints"]]
    elif "path" in doc:
        position = parse_name(str(doc["path"]))
        if position is None:
            raise ManifestError(f"{doc['path']!r} is not a checkpoint file name")
        entries = [
            Checkpoint(
                file=str(doc["path"]),
                epochs_done=position[0],
                step=position[1],
                keras=doc.get("keras"),
                framework="tensorflow",  # format 1 predates the JAX engine
            )
        ]
    else:
        raise ManifestError("it lists no checkpoint")
    return sorted(entries, key=lambda c: c.position, reverse=True)


def read_manifest(directory: Path) -> list[Checkpoint]:
    """The manifest's entries, newest first. Raises ManifestError, FileNotFoundError when there is none."""
    try:
        raw = (directory / MANIFEST).read_bytes()
    except FileNotFoundError:
        raise  # no manifest at all (a fresh run), which callers tell apart from an unreadable one
    except OSError as exc:
        raise ManifestError(f"cannot be read ({exc.strerror})") from exc
    return parse_manifest(raw)


def scan(directory: Path) -> list[Checkpoint]:
    """Checkpoint files in `directory`, newest first by the position their names encode."""
    found = []
    if directory.is_dir():
        for path in directory.iterdir():
            position = parse_name(path.name)
            if position is not None and path.is_file():
                found.append(Checkpoint(file=path.name, epochs_done=position[0], step=position[1]))
    return sorted(found, key=lambda c: c.position, reverse=True)


class CheckpointStore:
    """Publishes checkpoints into one directory and keeps its manifest and rotation. `history` is what the manifest
    lists, newest first; the trainer seeds it at resume with the checkpoints older than the one it resumed from."""

    def __init__(self, directory: Path, keep: int = DEFAULT_KEEP) -> None:
        if keep < 1:
            raise ValueError("keep must be at least 1")
        self.directory = directory
        self.keep = keep
        self.history: list[Checkpoint] = []

    def temp_path(self, name: str) -> Path:
        """Hidden, so the mirror never uploads a checkpoint Keras is still writing."""
        self.directory.mkdir(parents=True, exist_ok=True)
        return self.directory / f".{name}{TEMP_SUFFIX}"

    def publish(self, tmp: Path, checkpoint: Checkpoint) -> Checkpoint:
        """Rename the finished temporary file to checkpoint.file, list it in the manifest with its size and crc32c,
        then rotate. Returns the entry as listed."""
        with tmp.open("rb") as f:
            os.fsync(f.fileno())  # the rename must not reach the disk before the data
        entry = replace(
            checkpoint,
            size=tmp.stat().st_size,
            crc32c=file_crc32c(tmp),
            time=round(time.time(), 3) if checkpoint.time is None else checkpoint.time,
        )
        final = self.directory / entry.file
        os.replace(tmp, final)
        _fsync_dir(self.directory)
        # Anything at or after this position belongs to a timeline this run has left (resumed from an older one).
        older = [c for c in self.history if c.position < entry.position and c.file != entry.file]
        self.history = [entry, *older][: self.keep]
        write_atomic(self.directory / MANIFEST, manifest_bytes(self.history))
        self._rotate()
        return entry

    def _rotate(self) -> None:
        """Delete checkpoint files the manifest no longer lists (rotated, torn, or from an abandoned timeline), and
        temporary files a killed save left behind."""
        kept = {c.file for c in self.history}
        for path in self.directory.iterdir():
            stale_temp = path.name.startswith(".ckpt-") and path.name.endswith(TEMP_SUFFIX)
            if (parse_name(path.name) is not None and path.name not in kept) or stale_temp:
                path.unlink(missing_ok=True)


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return  # not every platform opens directories; the rename is still atomic
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass(frozen=True)
class Candidate:
    """A checkpoint that may be resumed from. `listed`: named by a readable manifest, so its size and crc32c are
    checked too; otherwise found by a directory scan and checked by its zip CRCs only."""

    checkpoint: Checkpoint
    path: Path
    listed: bool

    @property
    def name(self) -> str:
        return self.checkpoint.file

    @property
    def keras(self) -> str | None:
        return self.checkpoint.keras or archive_keras(self.path)

    @property
    def framework(self) -> str | None:
        """The engine that wrote it; None for a checkpoint found by a directory scan (its archive does not say)."""
        return self.checkpoint.framework if self.listed else None


def verify(candidate: Candidate) -> str | None:
    """Why the candidate cannot be resumed from, or None when it verifies."""
    path, entry = candidate.path, candidate.checkpoint
    if not path.is_file():
        return f"named by {MANIFEST} but missing"
    if candidate.listed and entry.size is not None:
        size = path.stat().st_size
        if size != entry.size:
            return f"size mismatch (manifest {entry.size} bytes, file {size} bytes)"
    if candidate.listed and entry.crc32c is not None:
        crc = file_crc32c(path)
        if crc != entry.crc32c:
            return f"crc32c mismatch (manifest {entry.crc32c}, file {crc})"
    return archive_problem(path)


@dataclass
class ResumeChooser:
    """Walks the checkpoints in `directory` newest first and hands out those that verify, noting why it skipped
    others. Build it with ResumeChooser.open; `say` gets every line meant for the job's log."""

    directory: Path
    candidates: list[Candidate]
    say: Callable[[str], None]
    manifest_problem: str | None = None  # "is missing", "is unreadable: ...", or None
    skipped: list[tuple[str, str]] = field(default_factory=list)
    _next: int = 0

    @property
    def found_any(self) -> bool:
        """Whether there was anything to resume from: a manifest (readable or not) or a checkpoint file."""
        return bool(self.candidates) or self.manifest_problem != "is missing"

    @classmethod
    def open(cls, directory: Path, say: Callable[[str], None] = print) -> ResumeChooser:
        listed: list[Checkpoint] = []
        problem = None
        try:
            listed = read_manifest(directory)
        except FileNotFoundError:
            problem = "is missing"
        except ManifestError as exc:
            problem = f"is unreadable: {exc}"
        on_disk = scan(directory)
        if problem and (on_disk or problem != "is missing"):
            say(f"[trainer] {contract.LATEST_CHECKPOINT} {problem}; scanning {contract.CHECKPOINTS}/ instead")
        elif any(not (directory / c.file).is_file() for c in listed):
            say(f"[trainer] {contract.LATEST_CHECKPOINT} names missing files; scanning {contract.CHECKPOINTS}/ too")
        # Listed entries keep their manifest facts; files the manifest does not name join by their names' positions.
        names = {c.file for c in listed}
        candidates = [Candidate(c, directory / c.file, listed=True) for c in listed]
        candidates += [Candidate(c, directory / c.file, listed=False) for c in on_disk if c.file not in names]
        candidates.sort(key=lambda c: c.checkpoint.position, reverse=True)
        return cls(directory, candidates, say, manifest_problem=problem)

    def skip(self, candidate: Candidate, reason: str) -> None:
        self.skipped.append((candidate.name, reason))
        self.say(f"[trainer] skipping {candidate.name}: {reason}")

    def next_verified(self) -> Candidate | None:
        """The next newest checkpoint that verifies, or None when none is left."""
        while self._next < len(self.candidates):
            candidate = self.candidates[self._next]
            self._next += 1
            problem = verify(candidate)
            if problem is None:
                if not candidate.listed:
                    self.say(f"[trainer] {candidate.name} is not in {MANIFEST}; its zip CRCs verify")
                return candidate
            self.skip(candidate, problem)
        return None

    def history_for(self, chosen: Candidate | None) -> list[Checkpoint]:
        """What the manifest keeps listing once training goes on from `chosen`: it and the older checkpoints still
        on disk, newest first (older ones unverified: a later resume verifies them if it needs them)."""
        if chosen is None:
            return []
        bad = {name for name, _ in self.skipped}
        out = []
        for c in self.candidates:
            if c.checkpoint.position > chosen.checkpoint.position or c.name in bad or not c.path.is_file():
                continue
            entry = c.checkpoint
            if entry.size is None or entry.crc32c is None:  # scanned: the manifest needs its facts
                entry = replace(entry, size=c.path.stat().st_size, crc32c=file_crc32c(c.path), keras=c.keras)
            out.append(entry)
        return out


class CheckpointPolicy:
    """When to save: every `every_epochs` epochs, or once `every_seconds` of wall-clock time have passed since the
    last save (checked at step ends, so mid-epoch too, and at epoch ends); always at the final epoch."""

    def __init__(
        self,
        every_epochs: int | None,
        every_seconds: float | None,
        last_epoch: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if (every_epochs is None) == (every_seconds is None):
            raise ValueError("give exactly one of every_epochs and every_seconds")
        self.every_epochs, self.every_seconds, self.last_epoch = every_epochs, every_seconds, last_epoch
        self.clock = clock
        self._last = clock()

    def saved(self) -> None:
        self._last = self.clock()

    def due_mid_epoch(self) -> bool:
        return self.every_seconds is not None and self.clock() - self._last >= self.every_seconds

    def due_at_epoch_end(self, epochs_done: int) -> bool:
        if epochs_done >= self.last_epoch:
            return True
        if self.every_epochs is not None:
            return epochs_done % self.every_epochs == 0
        return self.due_mid_epoch()


def scratch_dir() -> Path:
    """Where a non-chief worker saves its checkpoints. Saving is collective (under MultiWorkerMirroredStrategy; on
    JAX, model.save checks each array is the same on every process), so every worker saves at the same points, all
    but the chief to a temporary directory that is deleted on exit
    (tensorflow.org/tutorials/distribute/multi_worker_with_keras, "Model saving and loading")."""
    path = Path(tempfile.mkdtemp(prefix="runner-worker-"))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path
