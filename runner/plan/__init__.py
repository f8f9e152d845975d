"""Plan: everything decided before anything is created (no network, no side effects), so `--dry-run` shows exactly
what would happen. The planner resolves the run id, the run directory, the job's environment and, for a TPU VM, the
pre-flight checks against the catalog (what Cloud TPU offers, runner/plan/tpu_catalog.yaml) and gcloud's defaults."""
