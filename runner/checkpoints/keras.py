"""The runner's own checkpoints (the built-in trainer, keras_callbacks()): Keras files and their manifest.

    ckpt-000003.keras           after epoch 3 (3 epochs done)
    ckpt-000003-s000040.keras   mid-epoch: 3 epochs done and 40 steps of epoch 4 (a stop, or a timed save)
    latest.json                 the manifest: every kept checkpoint, newest first, with size, crc32c, global step

A checkpoint appears whole (Keras writes a hidden temporary file, renamed to its final name; runner.train.checkpoints
publishes it), so a file present is committed. One the manifest names must match its size and crc32c and be an
intact .keras zip (every member's CRC); an unlisted one (the manifest is unreadable, or a crash came between rename
and manifest) only the zip check. Positions come from the manifest or the file name, never from lexical order:
"ckpt-000002-s000010.keras" sorts before "ckpt-000002.keras" but is newer.

No TensorFlow import here: the trainer reads the manifest before it chooses which Keras to import.
"""

from __future__ import annotations

import base64
import json
import re
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runner import contract
from runner.checkpoints.base import Format, Found, Listing, Saved, by_series

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


# Each fit in one process (a head, then fine-tuning) is its own resume point with its own series: the first fit's
# checkpoints at the top of the checkpoint directory (where every run before several fits had them), the Nth's
# (N >= 2) in fit-N/, with its own manifest.
FIT_KEY_RE = re.compile(r"^(fit-\d+/)")


def fit_prefix(ordinal: int) -> str:
    """The directory, under the checkpoint directory, of the series of a process's fit number `ordinal` (0: its
    first): '' for the first, 'fit-2/' for the second."""
    return "" if ordinal == 0 else f"fit-{ordinal + 1}/"


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
    """Checkpoint files in `directory`, newest first by the position their names encode (as the directory is: a
    file rotated away meanwhile is not there)."""
    found = []
    for key in Listing.of_directory(directory).objects:
        position = parse_name(key)
        if position is not None:
            found.append(Checkpoint(file=key, epochs_done=position[0], step=position[1]))
    return sorted(found, key=lambda c: c.position, reverse=True)


def verify_file(path: Path, entry: Checkpoint | None) -> str | None:
    """Why the checkpoint at `path` cannot be resumed from, or None. `entry`: what a readable manifest says of it
    (its size and crc32c are checked too); None for a file found by its name alone (its zip CRCs only)."""
    try:
        size = path.stat().st_size
    except (FileNotFoundError, NotADirectoryError):
        return f"named by {MANIFEST} but missing" if entry is not None else "missing"
    if entry is not None and entry.size is not None and size != entry.size:
        return f"size mismatch (manifest {entry.size} bytes, file {size} bytes)"
    if entry is not None and entry.crc32c is not None:
        crc = file_crc32c(path)
        if crc != entry.crc32c:
            return f"crc32c mismatch (manifest {entry.crc32c}, file {crc})"
    return archive_problem(path)


class KerasFiles(Format):
    """ckpt-*.keras at the top of the checkpoint directory, and latest.json naming them."""

    label = "Keras"

    def find(self, listing: Listing, unclaimed: set[str]) -> Found:
        found = Found()
        fits = {""} | {m[1] for k in unclaimed if (m := FIT_KEY_RE.match(k)) is not None}
        for prefix in sorted(fits):  # the first fit's series at the top, each later fit's in its own fit-N/
            self._find_series(listing, unclaimed, prefix, found)
        return found

    def _find_series(self, listing: Listing, unclaimed: set[str], prefix: str, found: Found) -> None:
        mine = {k.removeprefix(prefix) for k in unclaimed if k.startswith(prefix) and "/" not in k[len(prefix) :]}
        names = {k: position for k in mine if (position := parse_name(k)) is not None}
        manifest = prefix + MANIFEST
        found.shared += [manifest] if MANIFEST in mine else []
        entries: dict[str, Checkpoint] = {}
        problem = None
        if MANIFEST in mine:
            raw = listing.read(manifest)
            try:
                if raw is None:
                    raise ManifestError("cannot be read")
                entries = {c.file: c for c in parse_manifest(raw)}
            except ManifestError as exc:
                problem = f"is unreadable: {exc}"
        elif names:
            problem = "is missing"
        if missing := sorted(set(entries) - set(names)):
            problem = problem or f"names {missing[0]}, which is not there"
        if problem is not None and found.problem is None:
            found.problem = problem if not prefix else f"({prefix}{MANIFEST}) {problem}"
        for name, position in names.items():
            key = prefix + name
            entry = entries.get(name)
            step = entry.global_step if entry is not None else None
            found.saved.append(
                Saved(
                    format=self.label,
                    path=key,
                    keys=(key,),
                    committed=True,  # it appeared by a rename, whole
                    series=self.label + (f" {prefix.rstrip('/')}" if prefix else ""),
                    order=position,
                    step=step,
                    epochs_done=position[0],
                    epoch_step=position[1],
                    size=listing.objects[key].size,
                    time=entry.time if entry is not None and entry.time is not None else listing.objects[key].updated,
                    shown=key if step is None else f"{key} (step {step})",
                )
            )
        found.indexed |= {prefix + name for name in entries}

    def verify(self, saved: Saved, directory: Path) -> str | None:
        where = (directory / saved.path).parent  # a later fit's series is in its own fit-N/
        try:
            entry = next((c for c in read_manifest(where) if c.file == Path(saved.path).name), None)
        except (FileNotFoundError, ManifestError):
            entry = None
        return verify_file(directory / saved.path, entry)

    def restore(self, found: Found, keep: int) -> list[str]:
        """Every checkpoint the manifest names; when it is missing, unreadable or names what is not there, the
        newest keep+1 by position too (for the trainer's directory scan); the manifest last, even unreadable, so
        that the trainer says so and scans instead."""
        named = [s.path for s in found.saved if s.path in found.indexed]
        if found.problem is not None:  # any series' manifest: each series' newest by position too
            for series in by_series(found.saved).values():
                by_position = sorted(series, key=lambda s: s.order, reverse=True)[: keep + 1]
                named += [s.path for s in by_position if s.path not in named]
        return named + found.shared
