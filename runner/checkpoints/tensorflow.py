"""TensorFlow checkpoints: tf.train.Checkpoint and CheckpointManager saves, tf_keras' BackupAndRestore (in its
`chief/` directory), save_weights in the TensorFlow format. Each save is an index and its data shards; beside them,
the `checkpoint` state file names the newest.

    tf/ckpt-6.index
    tf/ckpt-6.data-00000-of-00001
    tf/checkpoint                      model_checkpoint_path: "ckpt-6"

TensorFlow writes the data shards, then the index, then the state file: a save counts once its index and every
shard it names (-of-N) are there. Its number (a save count unless the job numbers saves by step) orders its series.
"""

from __future__ import annotations

import re

from runner.checkpoints.base import Format, Found, Listing, Saved, newest_time, total_size

INDEX = ".index"
DATA_RE = re.compile(r"^(?P<prefix>.+)\.data-(?P<shard>\d+)-of-(?P<count>\d+)$")
NUMBER_RE = re.compile(r"^(?P<base>.*?)-?(?P<number>\d+)$")
STATE = "checkpoint"


class TensorFlowSaves(Format):
    label = "TensorFlow"

    def find(self, listing: Listing, unclaimed: set[str]) -> Found:
        saves: dict[str, list[str]] = {}
        shards: dict[str, tuple[set[int], set[int]]] = {}  # prefix -> (shards there, shard counts named)
        for key in unclaimed:
            if match := DATA_RE.match(key):
                saves.setdefault(match["prefix"], []).append(key)
                there, counts = shards.setdefault(match["prefix"], (set(), set()))
                there.add(int(match["shard"]))
                counts.add(int(match["count"]))
        # An index joins its save's shards; one without any (a file of another kind named *.index) is not a save.
        for prefix, keys in saves.items():
            keys += [prefix + INDEX] if prefix + INDEX in unclaimed else []
        found = Found()
        directories = set()
        for prefix, keys in saves.items():
            there, counts = shards.get(prefix, (set(), set()))
            complete = len(counts) == 1 and there == set(range(next(iter(counts))))
            directory, _, name = prefix.rpartition("/")
            directories.add(directory)
            number = NUMBER_RE.match(name)
            found.saved.append(
                Saved(
                    format=self.label,
                    path=prefix,
                    keys=tuple(sorted(keys)),
                    committed=prefix + INDEX in keys and complete,
                    series=f"{directory}/{number['base'] if number else name}",
                    order=(int(number["number"]),) if number else (),
                    size=total_size(listing, keys),
                    time=newest_time(listing, keys),
                    shown=f"{prefix} ({self.label})",
                )
            )
        found.shared = sorted(key for d in directories if (key := f"{d}/{STATE}" if d else STATE) in unclaimed)
        return found
