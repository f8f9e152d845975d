# The trainer image (docker/Dockerfile), built with Docker or Podman, and the one-time Google Cloud setup (infra/).
# Included by the Makefile.
#
#   make image VARIANT=cpu                                   build, tagged by content; skipped when the tag exists
#   make push VARIANT=tpu PROJECT=p REGION=us-central1       build if needed, push; skipped when the registry has it
#   make push SPEC=jobs/mnist.yaml PROJECT=p                 the variant the spec's training.framework needs on a TPU
#   make gcp-setup-dry-run PROJECT=p BUCKET=b                print every change the one-time setup would make
#   make image CA_CERTS=/usr/local/share/ca-certificates     pip in the build trusts these CAs (a TLS proxy's)
#
# VARIANT: cpu, gpu, tpu (TensorFlow) or jax-tpu, jax-gpu (JAX, no TensorFlow); docker/README.md says which is for
# what. SPEC=FILE picks it instead, from training.framework on DEVICE (tpu, or gpu, cpu for --local runs).
#
# PROJECT defaults to gcloud's configured project (read only when a target needs it).

VARIANT ?= cpu
SPEC ?=
DEVICE ?= tpu
# Expanded once, on first use: a plain $(shell ...) would run gcloud (about a second) at every mention.
PROJECT ?= $(eval PROJECT := $(shell gcloud config get-value project 2>/dev/null))$(PROJECT)
REGION ?= us-central1
REPO ?= tpu-runner
BUCKET ?= $(PROJECT)-tpu-runner
SETUP_ARGS ?=
CA_CERTS ?=
VARIANT_ARGS = $(if $(SPEC),--spec $(SPEC) --device $(DEVICE),--variant $(VARIANT))
IMAGE_ARGS = $(VARIANT_ARGS) $(if $(PROJECT),--project $(PROJECT)) --region $(REGION) --repo $(REPO)
BUILD_ARGS = $(IMAGE_ARGS) $(if $(CA_CERTS),--ca-certs $(CA_CERTS))
GCP_SETUP_ARGS = --project $(PROJECT) --region $(REGION) --bucket $(BUCKET) --repo $(REPO) $(SETUP_ARGS)
PRUNE := \( -path ./.venv -o -path ./.git -o -path ./runs -o -path ./node_modules -o -path ./build -o -path ./dist \) -prune
DOCKERFILES = $(shell find . $(PRUNE) -o -type f \( -name Dockerfile -o -name 'Dockerfile.*' -o -name '*.Dockerfile' \) ! -name '*.dockerignore' -print)
SHELL_SCRIPTS = $(shell find . $(PRUNE) -o -type f -name '*.sh' -print)

.PHONY: image push image-ref image-lock lint-docker gcp-setup gcp-setup-dry-run

image: $(STAMP)  ## build the trainer image (VARIANT=cpu|gpu|tpu|jax-tpu|jax-gpu) tagged by content
	$(RUNNER) build $(BUILD_ARGS)

push: $(STAMP)  ## build if needed and push to Artifact Registry (PROJECT, REGION, REPO)
	@test -n "$(PROJECT)" || { echo "make push needs PROJECT=... (or gcloud config set project)" >&2; exit 2; }
	$(RUNNER) build $(BUILD_ARGS) --push

image-ref: $(STAMP)  ## print the image reference for this code (no Docker needed)
	@$(RUNNER) build $(IMAGE_ARGS) --print-ref

image-lock: $(STAMP)  ## re-resolve docker/constraints.txt (every variant) after a dependency change
	$(PY) docker/requirements.py lock

lint-docker: $(STAMP)  ## hadolint every Dockerfile, shellcheck every shell script
	$(VENV)/bin/hadolint $(DOCKERFILES)
	$(VENV)/bin/shellcheck $(SHELL_SCRIPTS)

gcp-setup-dry-run: $(STAMP)  ## print every change the one-time GCP setup would make (PROJECT, BUCKET)
	$(PY) infra/gcp_setup.py $(GCP_SETUP_ARGS) --dry-run

gcp-setup: $(STAMP)  ## one-time GCP setup: APIs, repository, bucket, service account (idempotent)
	$(PY) infra/gcp_setup.py $(GCP_SETUP_ARGS)
