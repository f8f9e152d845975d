"""runner.train.heap: the framework imported with the collector paused, its objects frozen after; each case in a fresh
interpreter, whose collector and frozen objects are its own."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from runner import contract
from tests.environ import child_env

REPO = Path(__file__).resolve().parents[2]


def in_fresh_interpreter(code: str, env: dict[str, str] | None = None) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=REPO, env=env, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    answer: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
    return answer


def test_the_import_runs_uncollected_then_its_objects_are_frozen_once_and_later_garbage_is_collected() -> None:
    answer = in_fresh_interpreter(
        """
import gc, json, weakref
from runner.train import heap

class Cycle:
    def __init__(self):
        self.me = self

with heap.framework_import():
    during = gc.isenabled()
    import decimal, email.parser  # a framework's worth of modules, in small
frozen = gc.get_freeze_count()
with heap.framework_import():  # a second engine start in the process: as without it
    again = gc.isenabled()
cycle = weakref.ref(Cycle())
gc.collect()
print(json.dumps({"during": during, "after": gc.isenabled(), "frozen": frozen, "again": again,
                  "frozen_after_again": gc.get_freeze_count(), "freed": cycle() is None}))
"""
    )
    assert answer["during"] is False and answer["after"] is True
    assert int(answer["frozen"]) > 10_000  # what was alive: the interpreter's, the runner's and the new modules
    assert answer["again"] is True and answer["frozen_after_again"] == answer["frozen"]
    assert answer["freed"] is True  # a cycle made after the freeze is still collected


def test_a_process_that_turned_the_collector_off_keeps_it_off_and_nothing_frozen() -> None:
    answer = in_fresh_interpreter(
        """
import gc, json
from runner.train import heap

gc.disable()
with heap.framework_import():
    pass
print(json.dumps({"enabled": gc.isenabled(), "frozen": gc.get_freeze_count()}))
"""
    )
    assert answer == {"enabled": False, "frozen": 0}


def test_the_trainer_imports_its_framework_that_way_and_collects_after_even_when_it_fails(
    tmp_path: Path, mnist_npz: Path
) -> None:
    """prepare() up to the data, which is not there: the engine started (TensorFlow imported), then the error."""
    env = child_env("TF_USE_LEGACY_KERAS")
    env[contract.DATA_DIR] = str(mnist_npz.parent)
    answer = in_fresh_interpreter(
        f"""
import gc, json
from runner import contract
from runner.spec import TrainingSpec
from runner.train import trainer

cfg = TrainingSpec.model_validate({{"data": {str(tmp_path / "missing.npz")!r}}})
ctx = contract.JobContext.from_env({{contract.OUTPUT_DIR: {str(tmp_path / "out")!r}, contract.STRATEGY: "cpu"}})
try:
    trainer.prepare(cfg, ctx)
except trainer.TrainerError as exc:
    error = str(exc)
import sys
print(json.dumps({{"error": error, "tensorflow": "tensorflow" in sys.modules, "enabled": gc.isenabled(),
                  "frozen": gc.get_freeze_count()}}))
""",
        env,
    )
    assert "missing.npz" in str(answer["error"]) and answer["tensorflow"] is True
    assert answer["enabled"] is True
    assert int(answer["frozen"]) > 200_000  # TensorFlow's and Keras' objects among them
