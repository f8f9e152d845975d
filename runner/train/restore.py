"""Which checkpoint a run continues from, loaded into the run's model, and the proof that it loaded whole.

A checkpoint is loaded into the model the run has built and compiled (the built-in trainer's, or a user's own):
weights and optimizer state, through Keras' load_weights, so that the run's own choices (precision, dropout kernel,
steps per execution) stand whatever the checkpoint's were. Both engines write Keras 3 `.keras` archives
(config.json + model.weights.h5), which Keras 3 reads on either backend: a model saved by the TensorFlow engine
loads under JAX with every weight and optimizer value equal, and the other way round (checked with Keras 3.15.1,
TensorFlow 2.20, JAX 0.10.2). tf_keras archives are Keras 2's, which Keras 3 cannot read.

Keras does not fail a load that leaves variables behind: it warns ("Skipping variable loading for optimizer ...")
and goes on with fresh ones, which would silently restart the optimizer; that is a failed load here, and the model
is put back as it was. A checkpoint whose engine is not this run's, or unknown (found by a directory scan), is
taken only when every array stored in its model.weights.h5 is found, equal, among the loaded model's weights and
optimizer variables. One from the other engine that does not pass is refused (TrainerError, exit 2): going on from
an older checkpoint or from scratch would quietly drop the run's progress.

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
    stored, loaded = stored_arrays(path), sorted(_fingerprint(v) for v in _variables(model))
    if stored == loaded:
        return None
    missing = len([s for s in stored if s not in loaded])
    return f"{missing} of the {len(stored)} stored arrays are not among the {len(loaded)} loaded ones"


def _variables(model: Any) -> list[Any]:
    optimizer = getattr(model, "optimizer", None)
    return list(model.weights) + (list(optimizer.variables) if optimizer is not None else [])


def _build_optimizer(model: Any) -> None:
    """Optimizer variables exist before a load can fill them (Keras' own BackupAndRestore does the same); a load
    into an optimizer not built yet leaves its state behind without a word (tf_keras)."""
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None or not hasattr(optimizer, "build"):
        return
    built = getattr(optimizer, "built", None)  # Keras 3; tf_keras says _built, and only once it is
    if not (built if built is not None else getattr(optimizer, "_built", False)):
        optimizer.build(model.trainable_variables)


def stored_optimizer_count(path: Any) -> int:
    """How many optimizer arrays the archive's model.weights.h5 holds (names only are read; Keras 3 and tf_keras
    both keep them under optimizer/)."""
    import h5py

    with zipfile.ZipFile(path) as archive, h5py.File(io.BytesIO(archive.read("model.weights.h5")), "r") as weights:
        group = weights.get("optimizer")
        if group is None:
            return 0
        count = 0

        def visit(_name: str, obj: Any) -> None:
            nonlocal count
            count += isinstance(obj, h5py.Dataset)

        group.visititems(visit)
        return count


def load_into(model: Any, candidate: Candidate, whole: bool) -> str | None:
    """Load the checkpoint's weights and optimizer state into `model` (built and compiled by whoever trains: the
    built-in trainer, or a user's script); why not, or None. What fails leaves the model as it was. Keras does not
    fail a load that leaves variables behind: it warns ("Skipping variable loading for optimizer ..."), which is a
    failure here; `whole` also checks every stored array against the loaded ones (a checkpoint of the other engine,
    or of one unknown)."""
    _build_optimizer(model)
    variables = _variables(model)
    before = [v.numpy() for v in variables]
    problem: str | None = None
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model.load_weights(str(candidate.path))
    except Exception as exc:
        problem = f"failed to load ({first_line(exc)})"
    else:
        lost = [str(w.message).splitlines()[0][:200] for w in caught if any(s in str(w.message) for s in _LEFT_BEHIND)]
        optimizer = getattr(model, "optimizer", None)
        stored, loaded = stored_optimizer_count(candidate.path), len(optimizer.variables) if optimizer else 0
        if lost:
            problem = lost[0]
        elif stored != loaded:  # optimizer state Keras left behind without a word, or another optimizer's
            problem = f"it holds {stored} optimizer values and this run's optimizer has {loaded}"
        elif whole:
            problem = loaded_whole(model, candidate.path)
    if problem is not None:
        for variable, value in zip(variables, before, strict=True):
            variable.assign(value)
    return problem


def restore_into(
    model: Any,
    chooser: ResumeChooser,
    first: Candidate | None,
    keras_impl: str,
    framework: str,
    say: Callable[[str], None],
) -> Candidate | None:
    """Fill `model` from the newest checkpoint that verifies and loads; that checkpoint, or None (the model is left
    as it was). A checkpoint of the other engine that does not load whole is refused (TrainerError): going on from
    an older one or from scratch would quietly drop the run's progress."""
    candidate = first
    while candidate is not None:
        written_by, engine = candidate.keras, candidate.framework
        same = engine == framework or keras_impl == "tf_keras"  # only TensorFlow writes and reads tf_keras
        if written_by not in (None, keras_impl):
            chooser.skip(candidate, f"written by {written_by}, and this run uses {keras_impl}")
        else:
            problem = load_into(model, candidate, whole=not same)
            if problem is None:
                if not same:
                    by = f"the {engine} engine" if engine else "an unknown engine (not in the manifest)"
                    say(
                        f"[trainer] {candidate.name} was written by {by}; under {framework} it loaded whole (every "
                        "stored weight and optimizer value found, equal)"
                    )
                return candidate
            if engine is not None and not same:
                raise TrainerError(
                    f"the checkpoint to resume from, {candidate.name}, was written by the {engine} engine and does "
                    f"not load whole under {framework} ({problem}); set training.framework: {engine} to continue it, "
                    "or start in a new run directory"
                )
            chooser.skip(candidate, problem)
        candidate = chooser.next_verified()
    return None
