"""A copy of this process's environment that another thread's change cannot break.

Copying os.environ iterates its keys, then reads each one: a key another thread deletes in between raises KeyError
(and an added one can raise RuntimeError). Threads that start processes while the rest of the program sets and
unsets variables (an emulated kubelet's pods beside a test runner that sets PYTEST_CURRENT_TEST for every test)
take their copy here.
"""

from __future__ import annotations

import os


def snapshot() -> dict[str, str]:
    """os.environ as one consistent dict: copied again whenever a change came in the middle of the copy."""
    while True:
        try:
            return dict(os.environ)
        except (KeyError, RuntimeError):  # changed while copied: the next copy sees the change whole
            continue
