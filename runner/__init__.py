"""tpu-runner: run containerized training jobs on Cloud TPU VMs, or locally, and never pay for an idle TPU."""

__version__ = "0.1.0"
