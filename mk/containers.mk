# A container engine on this machine, for `runner build`, `--local` in a container and the tests that build and
# run the trainer image for real. Included by the Makefile.
#
#   make containers   what those need: a Docker engine that answers, else Podman (installed from Debian's packages
#                     when missing: apt-get as root or through sudo) with its settings in the cache, and the Python
#                     base image. `make test` runs it; a failure is a warning (the container tests then skip,
#                     naming why), except with CI=true, where it fails the run.
#   make podman       the same with Podman even where Docker answers: its packages (podman runc catatonit
#                     debootstrap docker-registry), its settings (~/.cache/tpu-runner/containers; never /etc), the base
#   make base-image   (re)make the Python base image from Debian's packages (debootstrap), ONLY for a machine that
#                     cannot pull the real one (no route to Docker Hub); `make containers` falls back to it by itself
#   make test-images  the trainer images the container tests use (cpu, gpu), built before pytest (`make test` runs
#                     it): tagged by content, so a build is paid once per change of their inputs and timed apart from
#                     the suite; a failure is a warning (the tests then build, or skip), except with CI=true
#
# RUNNER_CONTAINER_ENGINE=docker|podman picks the engine where both are there (runner/launch/engine.py).

.PHONY: containers podman base-image test-images

containers: $(STAMP)  ## a container engine (Docker, else Podman) and the base image, for the container tests
	@docker/setup-engine.sh $(PY) || { \
	  if [ "$${CI:-}" = true ]; then echo "[containers] CI=true: the container tests cannot run here" >&2; exit 1; fi; \
	  echo "[containers] warning: no container engine is ready; the tests that build and run the image will skip" >&2; }

podman: $(STAMP)  ## Podman from Debian's packages, its settings in the cache, and the base image
	RUNNER_CONTAINER_ENGINE=podman docker/setup-engine.sh $(PY)

base-image: $(STAMP)  ## (re)make the Python base image from Debian's packages: only where it cannot be pulled
	eval "$$($(PY) -m runner.launch.engine setup)" && docker/base-image.sh

test-images: containers  ## the trainer images the container tests use, built before the suite (cached by content)
	@start=$$(date +%s); $(PY) -m tests.containers || { \
	  if [ "$${CI:-}" = true ]; then echo "[test-images] CI=true: the test images could not be built" >&2; exit 1; fi; \
	  echo "[test-images] warning: not built; the container tests build them, or skip" >&2; }; \
	echo "[test-images] $$(( $$(date +%s) - start )) s" >&2
