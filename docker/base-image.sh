#!/usr/bin/env bash
# The Python base image made from Debian's own packages, for a machine that cannot pull the real one (no route to
# Docker Hub, as on a build host that reaches only a Debian mirror and PyPI): `make base-image`. Where
# `docker pull python:...` works, use the real image and never this.
#
#   docker/base-image.sh [NAME]   NAME: default docker/Dockerfile's PYTHON_IMAGE, imported under the reference its
#                                 FROM resolves to (docker.io/library/python:3.11.13-slim-bookworm), so no build
#                                 argument changes
#
# debootstrap --variant=minbase of the Debian release the tag names (bookworm), with python3, python3-venv and
# ca-certificates; a virtual environment at /usr/local, so `python` and `pip` are where the python:*-slim images put
# them (and pip installs there without Debian's externally-managed guard); then `podman import` (or `docker import`)
# under NAME. The Python is Debian's (3.11.2 on bookworm), not the tag's 3.11.13: the same minor version, which is
# what the lock (docker/constraints.txt) is resolved for. About 2 minutes and 150 MB. Needs root, debootstrap and
# the engine. MIRROR overrides the Debian mirror (default: the first one apt uses here, else deb.debian.org);
# ENGINE picks podman or docker (default: podman).
set -euo pipefail

cd "$(dirname "$0")/.."
name="${1:-$(sed -n 's/^ARG PYTHON_IMAGE=//p' docker/Dockerfile)}"
first="${name%%/*}"
if [ "$first" = "$name" ]; then
  name="docker.io/library/${name}" # a Docker Hub official image, as FROM python:... resolves
elif [[ "$first" != *[.:]* && "$first" != localhost ]]; then
  name="docker.io/${name}" # a Docker Hub user's image
fi
engine="${ENGINE:-podman}"
suite="${name##*-}" # python:3.11.13-slim-bookworm -> bookworm
suite="${suite%%@*}"
case "$suite" in
  bullseye | bookworm | trixie) ;;
  *)
    echo "base-image: cannot tell the Debian release from ${name} (a tag ending in -bookworm, -trixie, ...)" >&2
    exit 2
    ;;
esac

# The mirror apt already uses on this machine: it is reachable, which deb.debian.org may not be.
apt_mirror() {
  local uri
  uri="$(grep -hsE '^(URIs:|deb )' /etc/apt/sources.list /etc/apt/sources.list.d/*.sources \
    /etc/apt/sources.list.d/*.list 2>/dev/null | grep -v security | grep -oE 'https?://[^ ]+' | head -n 1 || true)"
  printf '%s' "${uri:-http://deb.debian.org/debian}"
}
mirror="${MIRROR:-$(apt_mirror)}"

for tool in debootstrap "$engine"; do
  command -v "$tool" >/dev/null || {
    echo "base-image: ${tool} is not installed (\`make podman\` installs podman and debootstrap)" >&2
    exit 2
  }
done

work="$(mktemp -d "${TMPDIR:-/tmp}/tpu-runner-base.XXXXXX")"
trap 'rm -rf "$work"' EXIT
root="${work}/rootfs"

echo "base-image: debootstrap ${suite} from ${mirror}"
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates "$suite" "$root" "$mirror" \
  >"${work}/debootstrap.log" 2>&1 || {
  tail -n 20 "${work}/debootstrap.log" >&2
  exit 1
}
# /usr/local as a virtual environment: /usr/local/bin/python and pip, as in python:*-slim.
chroot "$root" /usr/bin/python3 -m venv /usr/local
chroot "$root" /usr/local/bin/python -m pip --version
# What an image does not need: package lists, downloaded packages, documentation, byte-code caches.
rm -rf "${root}/var/lib/apt/lists/"* "${root}/var/cache/apt/"*.bin "${root}/var/cache/apt/archives/"*.deb \
  "${root}/usr/share/doc" "${root}/usr/share/man" "${root}/usr/share/info" "${root}/usr/share/locale/"* \
  "${root}/var/log/"*
find "${root}/usr" -name __pycache__ -type d -prune -exec rm -rf {} +

echo "base-image: importing as ${name}"
tar -C "$root" --numeric-owner -c . | "$engine" import \
  --change 'ENV PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'CMD ["python"]' \
  --change "LABEL org.opencontainers.image.description=debootstrap-${suite}-stand-in-for-${name##*/}" \
  - "$name"
"$engine" image inspect --format '{{.Id}} {{.Size}}' "$name"
