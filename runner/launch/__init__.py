"""Launch: what makes a machine run the job's container. The TPU VM bootstrap (startup-script.sh, rendered per run
with every value shell-quoted) and the trainer image (content tag, build, push, registry pre-flight)."""
