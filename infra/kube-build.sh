#!/usr/bin/env bash
# A real Kubernetes control plane for the GKE rehearsals (`make kube`, run by `make test`), from Debian's packages
# only, built once and cached on this machine:
#
#   infra/kube-build.sh [--force]       the binaries in $KUBE_CACHE/bin (default ~/.cache/tpu-runner/kube/bin)
#
# - kube-apiserver, kube-scheduler, kube-controller-manager: built from Debian bookworm's source package
#   `kubernetes` (Kubernetes 1.20.2 with its vendor/ tree: it builds offline), fetched with `apt-get source` through
#   a deb-src line in a file of its own under /etc/apt/sources.list.d, on the mirror the machine already uses.
# - Go 1.15 from Debian bullseye (`apt-get download golang-1.15-go golang-1.15-src`, unpacked with `dpkg -x` into
#   the cache, never installed): bookworm's Go 1.19 builds an API server that crashes on the first custom object
#   (vendored modern-go/reflect2 1.0.1 against Go >= 1.18). The bullseye line is pinned low (priority 1 in
#   /etc/apt/preferences.d) so that it never replaces a bookworm package.
# - etcd from bookworm's etcd-server package, downloaded and unpacked the same way (no service is installed).
#
# Idempotent: with the binaries and their stamp ($KUBE_CACHE/bin/STAMP: the source version, the Go, etcd, the
# build's seconds) present it does nothing; --force builds again. The build tree is removed after a success (the
# source and Go's build cache are about 2 GB); the Go toolchain and the downloaded packages stay for a rebuild.
# Needs root, or sudo without a password, for apt-get update (the lists) only. Exit status 0 when the binaries
# are ready, 1 when not (the reason on stderr); `make kube` turns a failure into a warning except with CI=true.
set -euo pipefail

cache="${KUBE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tpu-runner/kube}"
bin="$cache/bin"
stamp="$bin/STAMP"
binaries=(kube-apiserver kube-scheduler kube-controller-manager etcd)
sources=/etc/apt/sources.list.d/tpu-runner-kube.sources
pin=/etc/apt/preferences.d/tpu-runner-kube

say() { printf '[kube] %s\n' "$*" >&2; }
seconds() { date +%s; }

ready() {
  [ -f "$stamp" ] || return 1
  for name in "${binaries[@]}"; do [ -x "$bin/$name" ] || return 1; done
}

if [ "${1:-}" != --force ] && ready; then
  say "cached in $bin: $(tr '\n' ' ' <"$stamp")"
  exit 0
fi

start="$(seconds)"
sudo=""
if [ "$(id -u)" != 0 ]; then
  if ! sudo -n true 2>/dev/null; then
    say "cannot add Debian's kubernetes source to apt: not root, and sudo asks for a password"
    exit 1
  fi
  sudo=sudo
fi
for tool in apt-get dpkg; do
  if ! command -v "$tool" >/dev/null; then
    say "cannot build: no $tool here (Debian's apt is needed)"
    exit 1
  fi
done

# The mirror the machine already uses (deb822 or one-line format).
mirror="$(sed -n 's/^URIs:[[:space:]]*\([^[:space:]]*debian\/*\)$/\1/p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -1)"
if [ -z "$mirror" ]; then
  mirror="$(awk '$1 == "deb" && $3 ~ /^bookworm$/ {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)"
fi
mirror="${mirror:-http://deb.debian.org/debian}"
mirror="${mirror%/}"
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
if [ ! -f "$sources" ] || ! grep -q "$mirror" "$sources"; then
  say "adding $sources (bookworm deb-src, bullseye for Go 1.15) on $mirror"
  $sudo tee "$sources" >/dev/null <<EOF
# Written by tpu-runner's infra/kube-build.sh: Debian's kubernetes source and bullseye's Go 1.15 for the GKE
# rehearsal's control plane. Remove this file and $pin to undo.
Types: deb-src
URIs: $mirror
Suites: bookworm bookworm-updates
Components: main
Signed-By: $keyring

Types: deb
URIs: $mirror
Suites: bullseye
Components: main
Signed-By: $keyring
EOF
  $sudo tee "$pin" >/dev/null <<'EOF'
# Written by tpu-runner's infra/kube-build.sh: bullseye is there for `apt-get download golang-1.15-*` only.
Package: *
Pin: release n=bullseye
Pin-Priority: 1
EOF
fi
$sudo apt-get update -qq
# What Kubernetes' own make needs besides Go: dpkg-source unpacks the source package, rsync copies generated files.
missing=()
for package in dpkg-dev make rsync; do
  dpkg-query -W -f '${Status}' "$package" 2>/dev/null | grep -q 'ok installed' || missing+=("$package")
done
if [ "${#missing[@]}" -gt 0 ]; then
  say "installing ${missing[*]} (Debian's packages)"
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# apt's downloads run as its _apt user, which cannot write into a root-only cache: as root, download as root.
sandbox=()
[ "$(id -u)" = 0 ] && sandbox=(-o APT::Sandbox::User=root)

work="$cache/work"
mkdir -p "$work" "$cache/debs" "$bin.new"
rm -rf "${bin:?}.new"/*
cd "$cache/debs"
if ! ls golang-1.15-go_*.deb golang-1.15-src_*.deb etcd-server_*.deb >/dev/null 2>&1; then
  say "downloading golang-1.15-go golang-1.15-src (bullseye) and etcd-server (bookworm)"
  apt-get "${sandbox[@]}" download -qq golang-1.15-go golang-1.15-src etcd-server
fi
goroot="$cache/go1.15/usr/lib/go-1.15"
if [ ! -x "$goroot/bin/go" ]; then
  rm -rf "$cache/go1.15"
  for deb in golang-1.15-go_*.deb golang-1.15-src_*.deb; do dpkg -x "$deb" "$cache/go1.15"; done
fi
etcd_debs=(etcd-server_*.deb)
rm -rf "$cache/etcd-server"
dpkg -x "${etcd_debs[0]}" "$cache/etcd-server"
cp "$cache/etcd-server/usr/bin/etcd" "$bin.new/etcd"
go_version="$("$goroot/bin/go" version | awk '{print $3}')"
etcd_version="$(dpkg-deb -f "${etcd_debs[0]}" Version)"

source_version="$(apt-cache showsrc kubernetes | sed -n 's/^Version: //p' | sort -V | tail -1)"
case "$source_version" in
  *1.20.*) ;;
  *)
    say "Debian's kubernetes source is '${source_version:-missing}', not 1.20 (bookworm's): cannot build"
    exit 1
    ;;
esac
rm -rf "$work"
mkdir -p "$work"
cd "$work"
say "apt-get source kubernetes=$source_version"
apt-get "${sandbox[@]}" source -qq "kubernetes=$source_version" >/dev/null
tree="$(find "$work" -mindepth 1 -maxdepth 1 -type d -name 'kubernetes-*' | head -1)"
cd "$tree"
mkdir -p .go/src/k8s.io
ln -sfn ../../.. .go/src/k8s.io/kubernetes
export GOROOT="$goroot" GOPATH="$PWD/.go" GOCACHE="$work/go-build" CGO_ENABLED=0 GOPROXY=off GOFLAGS=""
export PATH="$goroot/bin:$PATH"
for name in kube-apiserver kube-scheduler kube-controller-manager; do
  t0="$(seconds)"
  say "building cmd/$name with $go_version"
  make WHAT="cmd/$name" >"$work/$name.log" 2>&1 || {
    tail -20 "$work/$name.log" >&2
    say "make WHAT=cmd/$name failed (the whole log: $work/$name.log)"
    exit 1
  }
  cp "$(find _output -type f -name "$name" -perm -u+x | head -1)" "$bin.new/$name"
  say "$name built in $(($(seconds) - t0)) s"
done
"$bin.new/kube-apiserver" --version >/dev/null

elapsed="$(($(seconds) - start))"
cat >"$bin.new/STAMP" <<EOF
kubernetes-source=$source_version
go=$go_version (Debian bullseye golang-1.15)
etcd-server=$etcd_version (Debian bookworm)
built=$(date -u +%Y-%m-%dT%H:%M:%SZ)
build-seconds=$elapsed
EOF
rm -rf "$bin"
mv "$bin.new" "$bin"
cd "$cache"
rm -rf "$work" "$cache/etcd-server"
say "built in $elapsed s: $(tr '\n' ' ' <"$stamp")"
