"""Teardown outside the lifecycle's own `finally`: `runner down` (one run, any phase), `runner gc` (the sweeper of
what every run left behind), and how signals behave while a teardown is under way (interrupts)."""
