"""Safety nets in time: max_runtime (with and without the VM's own watchdog), a hung job, a VM that never boots."""

from __future__ import annotations

from faults import checks
from faults.scenario import LONG_COMMAND, Command, Scenario
from runner import contract

# Prints a few lines, then nothing, for 15 minutes: what hang_timeout is for.
_SILENT_COMMAND = ("python", "-c", "import time\nfor i in range(3):\n    print('step', i, flush=True)\ntime.sleep(900)")
# Says whether it was told its deadline, then works for 15 minutes.
_DEADLINE_UNKNOWN = (
    "python",
    "-c",
    f"import os, time\nprint('{contract.DEADLINE}:', os.environ.get('{contract.DEADLINE}'), flush=True)\n"
    "for i in range(900):\n    print('working', i, flush=True); time.sleep(1)",
)

CASES = (
    Scenario(
        "max-runtime",
        "max_runtime exceeded (60s)",
        "timed_out",
        6,
        job=Command(LONG_COMMAND),
        teardown={"max_runtime": "60s"},
        checks=(checks.safety_stop,),
    ),
    # The container never learns its deadline (drop-env fault), so the supervisor cannot stop it; the bootstrap's
    # backstop would, 5 minutes after the deadline, which this case never waits for: only the runner can delete.
    Scenario(
        "deadline-no-vm-watchdog",
        "max_runtime (60s) passed, the VM's own watchdog off",
        "timed_out",
        6,
        job=Command(_DEADLINE_UNKNOWN),
        teardown={"max_runtime": "60s"},
        setup=(lambda ctx: ctx.emulator.drop_env(contract.MAX_RUNTIME_S, contract.DEADLINE),),
        checks=(checks.runner_deleted_at_deadline,),
        timeout_s=200,
    ),
    Scenario(
        "hung-job",
        "job stops printing (hang_timeout 10s)",
        "hung",
        6,
        job=Command(_SILENT_COMMAND),
        teardown={"hang_timeout": "10s"},
        checks=(checks.safety_stop,),
        timeout_s=200,
    ),
    Scenario(
        "silent-boot",
        "READY node whose startup script never starts (once)",
        "succeeded",
        0,
        teardown={"boot_timeout": "10s"},
        setup=(lambda ctx: ctx.emulator.boot_hang(count=1),),
        checks=(checks.boot_timeouts(1),),
    ),
    Scenario(
        "silent-boot-forever",
        "READY nodes whose startup script never starts (always)",
        "failed",
        6,
        teardown={"boot_timeout": "10s"},
        setup=(lambda ctx: ctx.emulator.boot_hang(),),
        checks=(checks.boot_timeouts(2),),
    ),
)
