"""Regenerate the Keras log fixtures: real fits of mnist_fit.py on Keras 3 and tf_keras, verbose 1 and 2, each run
by the real supervisor (python -m runner.worker, output through a pipe as in every run), and its
logs/worker-0.log stored as it is. Two more, *-redraws, train longer epochs and store what the supervisor's log
cleaner makes of the output with its redraw interval at 1 s instead of 30 s: Keras redraws its bar in place (on
any POSIX system, a pipe too), and the cleaner stores the bar's state every interval, so a long epoch leaves lines
like "140/422 ━━━━━━╺━━━━ 2s 7ms/step - accuracy: ..." (an ETA, not the epoch's time) before its last one.

    .venv/bin/python tests/watch/keras_logs/make_fixtures.py      # about a minute on 2 cores
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent.parent
SCRIPT = HERE / "mnist_fit.py"
CASES = {
    "keras3-verbose1": {"FIT_VERBOSE": "1"},
    "keras3-verbose2": {"FIT_VERBOSE": "2"},
    "tf_keras-verbose1": {"FIT_VERBOSE": "1", "TF_USE_LEGACY_KERAS": "1"},
    "tf_keras-verbose2": {"FIT_VERBOSE": "2", "TF_USE_LEGACY_KERAS": "1"},
}


def _env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNNER_") or k == "RUNNER_DATA_DIR"}
    return {**env, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "0", **extra}


def supervised(name: str, extra: dict[str, str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        env = {
            **_env(extra),
            "RUNNER_RUN_DIR": tmp,
            "RUNNER_RUN_ID": name,
            "RUNNER_COMMAND": json.dumps([sys.executable, str(SCRIPT)]),
        }
        subprocess.run([sys.executable, "-m", "runner.worker"], env=env, check=True, stdout=subprocess.DEVNULL)
        (HERE / f"{name}.log").write_bytes((Path(tmp) / "logs" / "worker-0.log").read_bytes())


def with_redraws(name: str, extra: dict[str, str]) -> None:
    sys.path.insert(0, str(REPO))
    from runner.watch.logtext import LogCleaner

    env = {**_env(extra), "TRAIN_EXAMPLES": "30000", "EPOCHS": "2"}
    proc = subprocess.Popen([sys.executable, str(SCRIPT)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert proc.stdout is not None
    cleaner, out = LogCleaner(redraw_every_s=1.0), b""
    while chunk := os.read(proc.stdout.fileno(), 65536):
        out += cleaner.feed(chunk)
    if proc.wait() != 0:
        raise SystemExit(f"{name}: the fit failed")
    (HERE / f"{name}.log").write_bytes(out + cleaner.flush())


if __name__ == "__main__":
    for case, extra in CASES.items():
        supervised(case, extra)
        print("wrote", case)
    for case, extra in (("keras3-redraws", {}), ("tf_keras-redraws", {"TF_USE_LEGACY_KERAS": "1"})):
        with_redraws(case, {"FIT_VERBOSE": "1", **extra})
        print("wrote", case)
