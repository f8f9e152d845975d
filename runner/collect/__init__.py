"""Collect: what a finished run produced (results, timings, where every artifact is), as rows a terminal shows."""
