"""Orbax step directories (orbax.checkpoint.CheckpointManager), wherever they are under the checkpoint directory.

    640/                                  a step: named `<step>` or `<prefix>_<step>`, zero-padded or not
      _CHECKPOINT_METADATA
      default/...                         its items' files
      commit_success.txt                  written last: the step is committed
    650.orbax-checkpoint-tmp-1733312/     a save in progress, or one a stop cut short

A step counts once committed: its commit_success.txt (how Orbax commits on Cloud Storage and across hosts; Orbax
0.12 writes one on a local disk too, then renames), or, on a local disk, the atomic rename of its temporary
directory to the step's name (a step directory that holds no commit file at all: an Orbax that writes none). An
unfinished step is never restored, counted or taken as the newest: a temporary directory, a step directory on
Cloud Storage without its commit file, or one on a local disk whose commit file is gone while its items' are there
(being deleted).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from runner import contract
from runner.checkpoints.base import Format, Found, Listing, Saved, newest_time, total_size

STEP_RE = re.compile(r"^(?:(?P<prefix>.*)_)?(?P<step>\d+)$")
TMP_MARK = ".orbax-checkpoint-tmp"
TMP_STEP_RE = re.compile(r"^(?:(?P<prefix>.*?)_)?(?P<step>\d+)\.orbax-checkpoint-tmp")
COMMIT = "commit_success.txt"
METADATA = "_CHECKPOINT_METADATA"
# What an item directory of a step holds, in the Orbax versions that write no step-level file.
ITEM_FILES = frozenset({"_METADATA", "manifest.ocdbt", "_sharding", COMMIT})
# The shared location (RUNNER_SHARED_CHECKPOINT_DIR), as a path under checkpoints/: a multi-host job's steps.
SHARED = contract.SHARED_CHECKPOINTS.removeprefix(contract.CHECKPOINTS + "/") + "/"


def _step_dirs(keys: set[str]) -> tuple[set[str], set[str]]:
    """(step directories, temporary directories), each proven by a file of its own: a step's commit file or
    metadata, or an item's metadata; the outermost such directory of a key (a step's items are not steps)."""
    steps: set[str] = set()
    temps: set[str] = set()
    for key in keys:
        parts = key.split("/")
        for i, part in enumerate(parts[:-1]):
            if TMP_MARK in part:
                temps.add("/".join(parts[: i + 1]))
                break
            tail = parts[i + 1 :]
            own = tail in ([COMMIT], [METADATA]) or (len(tail) == 2 and tail[1] in ITEM_FILES)
            if own and STEP_RE.match(part):
                steps.add("/".join(parts[: i + 1]))
                break
    return steps, temps


class OrbaxSteps(Format):
    label = "Orbax"

    def find(self, listing: Listing, unclaimed: set[str]) -> Found:
        steps, temps = _step_dirs(unclaimed)
        members: dict[str, list[str]] = {}
        for key in unclaimed:
            parts = key.split("/")
            owner = next(
                (p for i in range(1, len(parts)) if (p := "/".join(parts[:i])) in steps or p in temps),
                None,
            )
            if owner is not None:
                members.setdefault(owner, []).append(key)
        found = Found()
        for path, keys in members.items():
            parent, _, name = path.rpartition("/")
            temp = path in temps
            match = (TMP_STEP_RE if temp else STEP_RE).match(name)
            step = int(match["step"]) if match and match["step"] else None
            marker = f"{path}/{COMMIT}"
            item_markers = any(k.endswith("/" + COMMIT) and k != marker for k in keys)
            committed = not temp and (marker in keys or (listing.local and not item_markers))
            found.saved.append(
                Saved(
                    format=self.label,
                    path=path,
                    keys=tuple(sorted(k for k in keys if k != marker)) + ((marker,) if marker in keys else ()),
                    committed=committed,
                    series=f"{parent}/{(match['prefix'] if match else None) or ''}",
                    order=(step,) if step is not None else (),
                    step=step,
                    size=total_size(listing, keys),
                    time=newest_time(listing, keys),
                    markers=(marker,) if marker in keys else (),
                    shown=f"step {step} (Orbax{', shared' if path.startswith(SHARED) else ''})",
                )
            )
        return found

    def verify(self, saved: Saved, directory: Path) -> str | None:
        problem = super().verify(saved, directory)
        if problem is None and f"{saved.path}/{METADATA}" in saved.keys:
            try:
                json.loads((directory / saved.path / METADATA).read_bytes())
            except (OSError, ValueError) as exc:
                return f"its {METADATA} cannot be read ({exc})"
        return problem


def committed_steps(directory: Path | Listing) -> list[int]:
    """The committed steps of the CheckpointManager whose directory is `directory` (its step directories directly
    in it; a local path, or a Listing of one in storage), oldest first: what CheckpointManager.all_steps() would
    restore from, without importing Orbax."""
    listing = directory if isinstance(directory, Listing) else Listing.of_directory(directory)
    found = OrbaxSteps().find(listing, set(listing.objects))
    return sorted(s.step for s in found.saved if s.committed and s.step is not None and "/" not in s.path)


def newest_step(directory: Path | Listing) -> int | None:
    """The newest committed step in `directory` (a CheckpointManager's), or None when there is none."""
    steps = committed_steps(directory)
    return steps[-1] if steps else None
