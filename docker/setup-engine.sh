#!/usr/bin/env bash
# What building and running the trainer image needs on this machine (`make containers`, run by `make test`): a
# container engine that answers, and the Python base image docker/Dockerfile starts FROM.
#
#   docker/setup-engine.sh PYTHON      PYTHON: the project's venv interpreter (runs runner.launch.engine)
#
# - A Docker engine that answers (or RUNNER_CONTAINER_ENGINE=docker): nothing to do; Docker pulls the base itself.
# - Otherwise Podman: Debian's packages (podman runc catatonit debootstrap docker-registry) are installed when one is
#   missing (apt-get, as root or through sudo), the project's Podman settings are written into the cache
#   (`python -m runner.launch.engine setup`: never /etc), and the base image is pulled, or, where no registry
#   answers, made from Debian's packages (docker/base-image.sh, about 2 minutes, once per machine).
#
# Exit status 0 when the engine and the base image are ready, 1 when not (the reason on stderr). `make containers`
# turns a failure into a warning, except with CI=true.
set -euo pipefail
cd "$(dirname "$0")/.."

python="${1:?usage: docker/setup-engine.sh PYTHON}"
packages=(podman runc catatonit debootstrap docker-registry)
base="$(sed -n 's/^ARG PYTHON_IMAGE=//p' docker/Dockerfile)"

say() { printf '[containers] %s\n' "$*" >&2; }
seconds() { date +%s; }

if [ "${RUNNER_CONTAINER_ENGINE:-}" != podman ] && docker version --format '{{.Server.Version}}' >/dev/null 2>&1; then
  say "Docker $(docker version --format '{{.Server.Version}}') answers: it pulls ${base} itself"
  exit 0
fi
if [ "${RUNNER_CONTAINER_ENGINE:-}" = docker ]; then
  say "RUNNER_CONTAINER_ENGINE=docker, but no Docker engine answers (\`docker version\`)"
  exit 1
fi

missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f '${Status}' "$package" 2>/dev/null | grep -q 'ok installed' || missing+=("$package")
done
if [ "${#missing[@]}" -gt 0 ]; then
  if ! command -v apt-get >/dev/null; then
    say "cannot install ${missing[*]}: no apt-get here (install Podman by hand, or run a Docker engine)"
    exit 1
  fi
  sudo=""
  if [ "$(id -u)" != 0 ]; then
    if ! sudo -n true 2>/dev/null; then
      say "cannot install ${missing[*]}: not root, and sudo asks for a password"
      exit 1
    fi
    sudo=sudo
  fi
  start="$(seconds)"
  say "installing ${missing[*]} (Debian's packages)"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  say "installed in $(($(seconds) - start)) s"
fi

eval "$("$python" -m runner.launch.engine setup)"
export CONTAINERS_CONF CONTAINERS_STORAGE_CONF CONTAINERS_REGISTRIES_CONF
if ! version="$(podman version --format '{{.Server.Version}}' 2>&1)"; then
  say "podman does not answer: ${version}"
  exit 1
fi
say "Podman ${version}, settings in $(dirname "$CONTAINERS_CONF")"

if podman image exists "$base"; then
  say "base image ${base} is there"
  exit 0
fi
start="$(seconds)"
if timeout 300 podman pull -q "$base" >/dev/null 2>&1; then
  say "pulled ${base} in $(($(seconds) - start)) s"
  exit 0
fi
say "cannot pull ${base} (no registry answers): making it from Debian's packages (make base-image)"
docker/base-image.sh
say "base image made in $(($(seconds) - start)) s"
