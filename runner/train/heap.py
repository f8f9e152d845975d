"""The framework's import with Python's cyclic garbage collector paused, and what it made frozen after.

Importing TensorFlow and Keras makes about 300,000 Python objects (modules, functions, classes, op registries) that
live as long as the process. With the collector on, the import runs hundreds of collections that walk them again and
again, each later full collection (while the first epoch is traced, and at the interpreter's exit) walks them once
more: on a 2-core Xeon, `import tensorflow, keras` and exit took 3.0 CPU s, 1.9 with the collector paused for the
import and the objects frozen after it (gc.freeze: no collection looks at them again), and the built-in trainer's
whole run of 2 short epochs 7.8 CPU s against 6.2 (JAX: 6.3 against 5.6; 4 runs of each, taking turns). Nothing is
lost: those objects are never garbage. What the import left as cyclic garbage (a few thousand objects, the ones a
collection would have freed) stays frozen with them: less memory than one full collection costs in time (0.25 s).

Once per process: a process that imports a second framework later (runner bench's arms run in their own processes;
a test may call prepare() twice) collects as usual from then on, so what the first run left behind is still freed.
A process that turned the collector off itself keeps it off and unfrozen: its choice.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

_done = False


@contextmanager
def framework_import() -> Iterator[None]:
    """Run the block (the engine's start: its framework's import) with the collector paused, then freeze what is
    alive and resume collecting. The first time in a process only."""
    global _done
    if _done or not gc.isenabled():
        yield
        return
    _done = True
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.enable()
