"""Any other files a job keeps in its checkpoint directory (Keras' ModelCheckpoint, weights saved by hand, a
framework this runner does not know): a series is the names in one directory that differ only in their numbers
(model-03.keras, model-10.keras), ordered by their first number (an epoch, a step, a save count), and the files
that share it are one checkpoint. A file whose name holds no number is one of its own (rewritten in place). Each
counts once it is there: the writer's rename made it whole, or nothing here can tell."""

from __future__ import annotations

import re

from runner.checkpoints.base import Format, Found, Listing, Saved, newest_time, total_size

_NUMBER = re.compile(r"\d+")


class NumberedFiles(Format):
    label = "files"

    def find(self, listing: Listing, unclaimed: set[str]) -> Found:
        sets: dict[tuple[str, int | None], list[str]] = {}
        for key in unclaimed:
            directory, _, name = key.rpartition("/")
            numbers = _NUMBER.findall(name)
            series = f"{directory}/{_NUMBER.sub('#', name)}" if numbers else key
            sets.setdefault((series, int(numbers[0]) if numbers else None), []).append(key)
        found = Found()
        for (series, first), keys in sets.items():
            keys.sort()
            found.saved.append(
                Saved(
                    format=self.label,
                    path=keys[-1],
                    keys=tuple(keys),
                    committed=True,
                    series=series,
                    order=(first,) if first is not None else (),
                    size=total_size(listing, keys),
                    time=newest_time(listing, keys),
                )
            )
        return found
