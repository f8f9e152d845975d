"""Checkpoint files: ckpt-EEEEEE.keras (model + optimizer state) and latest.json, which names the newest.

No TensorFlow import here: the trainer reads the manifest before it chooses which Keras to import.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from runner import contract
from runner.storage.local import write_atomic

MANIFEST = Path(contract.LATEST_CHECKPOINT).name


def save_checkpoint(model: Any, directory: Path, epoch: int, keras_impl: str, keep: int = 2) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    name = contract.checkpoint_name(epoch)
    final = directory / name
    tmp = directory / f".{name}.tmp.keras"  # Keras insists on the .keras suffix
    model.save(tmp)
    os.replace(tmp, final)
    manifest = {"epoch": epoch, "path": name, "keras": keras_impl, "time": round(time.time(), 3)}
    write_atomic(directory / MANIFEST, json.dumps(manifest).encode())
    for old in sorted(directory.glob("ckpt-*.keras"))[:-keep]:
        old.unlink(missing_ok=True)
    return final


def read_manifest(directory: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((directory / MANIFEST).read_text())
        return data if isinstance(data, dict) else None
    except (OSError, ValueError):
        return None


def latest_checkpoint(directory: Path) -> tuple[int, Path] | None:
    """(epochs done, file) of the newest checkpoint, or None when there is none to resume from."""
    data = read_manifest(directory)
    try:
        path = directory / data["path"]  # type: ignore[index]
        return (int(data["epoch"]), path) if path.is_file() else None  # type: ignore[index]
    except (KeyError, TypeError, ValueError):
        return None
