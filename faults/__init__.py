"""Fault-injection suite: real `runner submit` runs on the Cloud TPU API emulator and a Cloud Storage emulator, each
with one injected fault, measured against the promise that a TPU never idles on the bill and a preemption never
loses more than one checkpoint interval. A development tool: not part of the runner's wheel.

    python -m faults                        every case once (make faults)
    python -m faults --only preemption-x2 --only container-crash --repeat 3 --json out.json
    python -m faults --fast                 the quick cases (the ones `make test` runs)
    python -m faults --list

    faults/scenario.py      Scenario: a case as data (job, fault, hooks, expected state and exit code)
    faults/scenarios/       the cases, one module per theme
    faults/actions.py       what cases do to a run (preempt, tear a checkpoint, kill the runner, `runner down` ...)
    faults/checks.py        what cases expect of the measured run
    faults/context.py       Ctx: what hooks see, and the recorder of the run directory over time
    faults/suite.py         the one runner: emulators, the `runner submit` subprocess, measuring
    faults/measure.py       pure measurements (attempts, checkpoints lost, steps lost, idle billable time)
    faults/table.py         the one printer

See docs/faults.md.
"""
