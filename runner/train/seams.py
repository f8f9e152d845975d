"""How a user's own `model.fit` continues at a checkpoint's position, through the seams Keras itself uses.

A resumed fit must (1) start at the checkpoint's epoch, (2) not train the steps of that epoch that were done, and
(3) see the batches the interrupted run would have seen, so that together the attempts train what one
uninterrupted run trains. Keras' own BackupAndRestore does (1) through the same seams as here, and none of (2)
and (3); this module does all three where the data allows it, and says so where it does not:

  (1) Keras 3 reads `model._initial_epoch` after on_train_begin (BackupAndRestore sets it); tf_keras asks
      `model._training_state.maybe_load_initial_counters_from_ckpt(...)` for (epoch, step) after on_train_begin
      (its BackupAndRestore's WorkerTrainingState does), and then counts that epoch's steps from `step`.
  (2)+(3) Keras calls `model.train_function` once per step (or per steps_per_execution chunk); for the steps to
      skip, it is swapped for one that takes the step's batches from the iterator and trains nothing, then swapped
      back. Which batches are skipped depends on how Keras iterates the data (checked with Keras 3.15 on
      TensorFlow and JAX, and tf_keras 2.20):
        * numpy arrays (and other in-memory arrays), Keras 3: a new iterator each epoch, its order drawn when it
          starts: skip the epoch's done steps. The order is replayed by seeding: TensorFlow's shuffle op is seeded
          once, before fit builds its dataset (Keras 3 on TensorFlow then draws the same order every epoch, as it
          does whenever a seed is set); numpy's (JAX and the other backends) at each epoch's start from the run's
          seed and the epoch.
        * numpy arrays, tf_keras: one iterator over every epoch, each epoch's order the next draw of one seeded
          stream: skip every batch of the epochs done too (no training, only the index gathers), so the resumed
          epochs see the draws the uninterrupted run saw.
        * a tf.data.Dataset, iterated anew each epoch (no steps_per_epoch): exact when each iteration yields the
          same elements (no unseeded or reshuffling randomness: `dataset_determinism`); otherwise, and for
          anything else (generators, PyDataset, a dataset read across epochs), the interrupted epoch starts over
          from its first step, with the newest weights, said in the log.

Keras' batch numbers keep counting the skipped steps (Keras 3) or start at the step (tf_keras): either way they
are the steps of the epoch, which the runner's Cursor reads as such. No TensorFlow or JAX import at module level.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

ARRAYS = "arrays"
DATASET = "dataset"
OTHER = "other"


def flavour(keras: Any) -> str:
    """keras3 or tf_keras: which Keras `keras` is."""
    return "tf_keras" if str(getattr(keras, "__version__", "3")).startswith("2.") else "keras3"


def backend(keras: Any) -> str:
    """The backend Keras runs on: tensorflow for tf_keras, else Keras 3's own setting."""
    if flavour(keras) == "tf_keras":
        return "tensorflow"
    return str(keras.backend.backend())


@dataclass(frozen=True)
class FitData:
    """What was given to fit, as far as replaying it goes."""

    kind: str  # ARRAYS | DATASET | OTHER
    shuffle: Any
    steps_per_epoch: int | None
    deterministic: bool | None = None  # a dataset's, when it could be told
    note: str = ""  # why a dataset is not replayable
    batch_size: int | None = None  # fit's, for arrays (Keras' default 32 when not given); None when the data batches
    examples: int = 0  # how many, for arrays

    @property
    def batches(self) -> int:
        """Batches in one pass over arrays (the last one partial), as Keras counts them."""
        return -(-self.examples // self.batch_size) if self.batch_size else 0

    def describe(self) -> str:
        what = {ARRAYS: "in-memory arrays", DATASET: "a tf.data.Dataset", OTHER: "a generator or other input"}
        return what[self.kind] + (f" ({self.note})" if self.note else "")


def fit_data(model: Any) -> FitData:
    """The data of the fit that is calling back now: read from the arguments of the `fit` frame running `model`
    (the callbacks never see the data otherwise). OTHER when no such frame is found, which restarts an epoch
    rather than assume."""
    frame = sys._getframe(1)
    while frame is not None:
        local = frame.f_locals
        if frame.f_code.co_name == "fit" and local.get("self") is model:
            return classify(
                local.get("x"), local.get("shuffle", True), local.get("steps_per_epoch"), local.get("batch_size")
            )
        frame = frame.f_back  # type: ignore[assignment]
    return FitData(OTHER, True, None, note="fit's arguments were not found")


def classify(x: Any, shuffle: Any, steps_per_epoch: Any, batch_size: Any = None) -> FitData:
    steps = int(steps_per_epoch) if steps_per_epoch else None
    if _is_dataset(x):
        deterministic, note = dataset_determinism(x)
        return FitData(DATASET, shuffle, steps, deterministic, note)
    if _is_arrays(x):
        return FitData(ARRAYS, shuffle, steps, batch_size=int(batch_size or 32), examples=_length(x))
    return FitData(OTHER, shuffle, steps)


def _length(x: Any) -> int:
    first = next(iter(x.values())) if isinstance(x, dict) else x[0] if isinstance(x, list | tuple) else x
    try:
        return len(first)
    except TypeError:
        return 0


def _is_dataset(x: Any) -> bool:
    tf = sys.modules.get("tensorflow")
    return tf is not None and isinstance(x, tf.data.Dataset)


def _is_arrays(x: Any) -> bool:
    """numpy arrays, or anything Keras slices the same way (tensors, lists, dicts and tuples of them)."""
    if isinstance(x, dict):
        return bool(x) and all(_is_arrays(v) for v in x.values())
    if isinstance(x, list | tuple):
        return bool(x) and all(_is_arrays(v) or np.isscalar(v) for v in x)
    return isinstance(x, np.ndarray) or (hasattr(x, "shape") and hasattr(x, "dtype") and hasattr(x, "__getitem__"))


# Dataset ops whose elements differ between two iterations (or two processes) unless seeded to stay the same.
_SHUFFLES = (
    "ShuffleDataset",
    "ShuffleDatasetV2",
    "ShuffleDatasetV3",
    "ShuffleAndRepeatDataset",
    "ShuffleAndRepeatDatasetV2",
)
_STATEFUL_RANDOM = ("Random", "TruncatedNormal", "Multinomial", "ParameterizedTruncatedNormal")
_RANDOM_DATASETS = ("RandomDataset", "RandomDatasetV2", "ExperimentalRandomDataset", "SamplingDataset")
_PARALLEL = ("ParallelMapDatasetV2", "ParallelInterleaveDatasetV4", "ParallelBatchDataset", "MapAndBatchDataset")


def dataset_determinism(dataset: Any) -> tuple[bool, str]:
    """(whether every iteration of `dataset` yields the same elements in the same order, why not), read from its
    graph: a shuffle that reshuffles each iteration or has no seed, a random dataset, a stateful random op without
    a seed in any of its functions, or parallel work allowed to reorder (deterministic=false) make it not so."""
    import tensorflow as tf

    try:
        raw = tf.raw_ops.DatasetToGraphV2(input_dataset=dataset._variant_tensor, external_state_policy=1)
        graph = tf.compat.v1.GraphDef.FromString(raw.numpy())
    except Exception as exc:  # an input the serializer cannot take: unknown is not deterministic
        return False, f"its graph could not be read ({type(exc).__name__})"
    consts = {n.name: n.attr["value"].tensor for n in graph.node if n.op == "Const"}
    nodes = list(graph.node) + [n for f in graph.library.function for n in f.node_def]
    for node in nodes:
        if node.op in _SHUFFLES:
            reshuffles = "reshuffle_each_iteration" not in node.attr or node.attr["reshuffle_each_iteration"].b
            seeds = [_const_int(consts, name) for name in node.input[2:4]] if len(node.input) >= 4 else []
            if reshuffles:
                return False, "it reshuffles on every iteration"
            if not seeds or all(s == 0 for s in seeds):
                return False, "it shuffles without a seed"
        elif node.op in _RANDOM_DATASETS:
            return False, f"it draws at random ({node.op})"
        elif node.op.startswith(_STATEFUL_RANDOM) and node.attr["seed"].i == 0 and node.attr["seed2"].i == 0:
            return False, f"an unseeded random op ({node.op}) in its functions"
        elif node.op in _PARALLEL and node.attr["deterministic"].s == b"false":
            return False, f"{node.op} may reorder its elements (deterministic=False)"
    return True, ""


def _const_int(consts: dict[str, Any], name: str) -> int | None:
    tensor = consts.get(name.split(":")[0].lstrip("^"))
    if tensor is None:
        return None
    values = list(tensor.int64_val) or list(tensor.int_val)
    return int(values[0]) if values else None


@dataclass(frozen=True)
class Replay:
    """How a fit continues at (epoch, step): `start` is where Keras is told to begin, `skip` the batches to take
    without training at the first step, `exact` whether the batches from there are the uninterrupted run's."""

    start: tuple[int, int]
    skip: int
    exact: bool
    why: str


def plan_replay(keras: Any, data: FitData, position: tuple[int, int], steps_per_epoch: int) -> Replay:
    """How to continue at `position` (epochs done, steps of the next) given what fit was given: the batches to take
    untrained are those Keras' iteration had drawn by then (see the module docstring)."""
    epoch, step = position
    legacy = flavour(keras) == "tf_keras"
    drawn = epoch * steps_per_epoch + step  # batches taken since fit began, in the interrupted run
    if data.kind == ARRAYS and data.batches:
        if legacy:  # one stream of every epoch's draws
            return Replay((epoch, step), drawn, True, "")
        if data.steps_per_epoch in (None, data.batches):  # a new iterator each epoch
            return Replay((epoch, step), step, True, "")
        # One iterator read across epochs (steps_per_epoch), started again when it runs out, on Keras' own count of
        # steps: its place cannot be reached without ending an epoch early. The steps stay exact; the batches of the
        # rest of the epoch are drawn anew.
        return Replay((epoch, step), step, False, "arrays read across epochs (steps_per_epoch) cannot be replayed")
    elif data.kind == DATASET and data.steps_per_epoch is None and (data.deterministic or step == 0):
        return Replay((epoch, step), step, True, "")
    if step == 0:
        return Replay((epoch, 0), 0, True, "")
    return Replay((epoch, 0), 0, False, f"{data.describe()} cannot be replayed to step {step}")


class _Counters:
    """tf_keras' WorkerTrainingState, as much of it as fit asks for: the (epoch, step) to begin at."""

    def __init__(self, epoch: int, step: int) -> None:
        self.epoch, self.step = epoch, step

    def maybe_load_initial_counters_from_ckpt(self, steps_per_epoch: int, initial_epoch: int, mode: Any = None) -> Any:
        return self.epoch, self.step


def continue_at(model: Any, keras: Any, replay: Replay, steps_per_execution: int) -> Callable[[], None]:
    """Make the fit that is calling on_train_begin now begin at replay.start, taking replay.skip batches untrained
    first. Returns what undoes it (at on_train_end)."""
    epoch, step = replay.start
    legacy = flavour(keras) == "tf_keras"
    if legacy:
        model._training_state = _Counters(epoch, step)
    else:
        model._initial_epoch = epoch
    if replay.skip:
        _skip_batches(model, keras, replay.skip, legacy, steps_per_execution)

    def undo() -> None:
        if legacy:
            model._training_state = None
        else:
            model._initial_epoch = None

    return undo


def _skip_batches(model: Any, keras: Any, count: int, legacy: bool, chunk: int) -> None:
    """Swap model.train_function for one that takes `count` batches without training, then swaps itself back.
    tf_keras counts the epoch's steps from the resumed step: the first call takes every batch at once. Keras 3
    calls once per chunk of steps_per_execution, counting the skipped ones: one untrained call per chunk (on JAX,
    the real function is put back before the last untrained call returns, so Keras calls it itself: calling the
    donated-state step from inside the swap broke JAX's buffers)."""
    real = model.train_function
    jax_backend = not legacy and backend(keras) == "jax"
    left = [count]
    logs: dict[str, Any] = {}

    def take(iterator: Any, n: int) -> None:
        for _ in range(n):
            next(iterator)

    if legacy:

        def first_call(iterator: Any) -> Any:
            model.train_function = real
            take(iterator, left[0])
            return real(iterator)

        model.train_function = first_call
        return

    def untrained(*args: Any) -> Any:
        n = min(chunk, left[0])
        left[0] -= n
        if left[0] <= 0:
            model.train_function = real
        if jax_backend:
            state, iterator = args
            take(iterator, n)
            return logs, state
        (iterator,) = args
        take(iterator, n)
        return logs

    model.train_function = untrained


def seed_shuffle(keras: Any, seed: int) -> None:
    """Before fit builds its input: TensorFlow's global seed, which seeds the shuffle of a fit on arrays (Keras 3
    and tf_keras on TensorFlow). Numpy's is seeded per epoch (epoch_seed), for the other backends."""
    if backend(keras) == "tensorflow":
        import tensorflow as tf

        tf.random.set_seed(seed)


def epoch_seed(keras: Any, seed: int, epoch: int) -> None:
    """At an epoch's start, before Keras 3 draws its order with numpy (every backend but TensorFlow): a seed that
    depends on the run's seed and the epoch, so that each epoch has its own order and a resume draws it again."""
    if flavour(keras) == "keras3" and backend(keras) != "tensorflow":
        np.random.seed((seed * 1_000_003 + epoch) % (1 << 32))
