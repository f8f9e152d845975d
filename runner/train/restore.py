"""Which checkpoint a run continues from, and the proof that a checkpoint from the other engine loaded whole.

Both engines write Keras 3 `.keras` archives (config.json + model.weights.h5), which Keras 3 reads on either
backend: a model saved by the TensorFlow engine loads under JAX with every weight and optimizer value equal, and the
other way round (checked with Keras 3.15.1, TensorFlow 2.20, JAX 0.10.2). tf_keras archives are Keras 2's, which
Keras 3 cannot read. Keras does not fail a load that leaves variables behind: it warns ("Skipping variable loading
for optimizer ...") and goes on with fresh ones, which would silently restart the optimizer. So a checkpoint whose
engine is not this run's, or unknown (found by a directory scan), is taken only when every array stored in its
model.weights.h5 is found, equal, among the loaded model's weights and optimizer variables (tf_keras archives,
TensorFlow's only, are loaded as before). One from the other
engine that does not pass is refused (TrainerError, exit 2): going on from an older checkpoint or from scratch would
quietly drop the run's progress.

No TensorFlow or JAX import here: the engines pass their `keras`.
"""

from __future__ import annotations

import io
import warnings
import zipfile
from collections.abc import Callable
from typing import Any

from runner.train.checkpoints import Candidate, ResumeChooser


class TrainerError(Exception):
    """A problem with the job's configuration or data that a traceback would only obscure."""


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200]}" if text else type(exc).__name__


_LEFT_BEHIND = ("Skipping variable loading", "could not be loaded")


def _fingerprint(array: Any) -> tuple[tuple[int, ...], float, float]:
    import numpy as np

    values = np.asarray(array, dtype=np.float64)
    return tuple(values.shape), float(values.sum()), float(np.abs(values).sum())


def stored_arrays(path: Any) -> list[tuple[tuple[int, ...], float, float]]:
    """(shape, sum, sum of magnitudes) of every array in the archive's model.weights.h5, sorted."""
    import h5py  # a dependency of Keras 3 itself
    import numpy as np

    found: list[tuple[tuple[int, ...], float, float]] = []

    def visit(_name: str, obj: Any) -> None:
        if isinstance(obj, h5py.Dataset):
            found.append(_fingerprint(np.asarray(obj)))

    with zipfile.ZipFile(path) as archive, h5py.File(io.BytesIO(archive.read("model.weights.h5")), "r") as weights:
        weights.visititems(visit)
    return sorted(found)


def loaded_whole(model: Any, path: Any) -> str | None:
    """Why `model` (just loaded from `path`) is not everything the archive stores, or None when it is."""
    variables = list(model.weights) + (list(model.optimizer.variables) if getattr(model, "optimizer", None) else [])
    stored, loaded = stored_arrays(path), sorted(_fingerprint(v) for v in variables)
    if stored == loaded:
        return None
    missing = len([s for s in stored if s not in loaded])
    return f"{missing} of the {len(stored)} stored arrays are not among the {len(loaded)} loaded ones"


def load_verified(keras: Any, candidate: Candidate) -> tuple[Any, str | None]:
    """(model, None) when the archive loads whole; (None, why) when it does not."""
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model = keras.models.load_model(candidate.path)
    except Exception as exc:
        return None, f"failed to load ({first_line(exc)})"
    # What Keras 3 says when it leaves variables behind (saving_lib, optimizers/base_optimizer.py).
    lost = [str(w.message).splitlines()[0][:200] for w in caught if any(s in str(w.message) for s in _LEFT_BEHIND)]
    problem = lost[0] if lost else loaded_whole(model, candidate.path)
    return (None, problem) if problem else (model, None)


def restore(
    chooser: ResumeChooser,
    first: Candidate | None,
    keras: Any,
    keras_impl: str,
    framework: str,
    say: Callable[[str], None],
) -> tuple[Any, Candidate | None]:
    """(model, candidate) from the newest checkpoint that verifies and loads, or (None, None)."""
    candidate = first
    while candidate is not None:
        written_by, engine = candidate.keras, candidate.framework
        if written_by not in (None, keras_impl):
            chooser.skip(candidate, f"written by {written_by}, and this run uses {keras_impl}")
        elif engine == framework or keras_impl == "tf_keras":  # only TensorFlow writes and reads tf_keras
            try:
                return keras.models.load_model(candidate.path), candidate
            except Exception as exc:  # a file that verifies can still fail to load (another Keras version, a bug)
                chooser.skip(candidate, f"failed to load ({first_line(exc)})")
        else:
            model, problem = load_verified(keras, candidate)
            by = f"the {engine} engine" if engine else "an unknown engine (not in the manifest)"
            if problem is None:
                say(
                    f"[trainer] {candidate.name} was written by {by}; under {framework} it loaded whole (every "
                    "stored weight and optimizer value found, equal)"
                )
                return model, candidate
            if engine is not None:
                raise TrainerError(
                    f"the checkpoint to resume from, {candidate.name}, was written by the {engine} engine and does "
                    f"not load whole under {framework} ({problem}); set training.framework: {engine} to continue it, "
                    "or start in a new run directory"
                )
            chooser.skip(candidate, problem)
        candidate = chooser.next_verified()
    return None, None
