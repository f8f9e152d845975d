"""Watch: what a run's directory says, and what that means. The typed records of the run directory (rundir), the
run's state decided in one place (state), lifecycle events (events), following output (follow), this machine's run
records (runs), and finding a run and its state now (lookup)."""
