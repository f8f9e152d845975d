"""In-container supervisor: runs the job under the run-directory contract (entrypoint `python -m runner.worker`)."""
