#!/usr/bin/env bash
# Builds kube-apiserver, kube-controller-manager and kube-scheduler from Debian's
# `kubernetes` source package (1.20.2) and caches them, with etcd, in
# ${RLMESH_K8S_CACHE:-~/.cache/rlmesh/k8s}/bin. The Kubernetes integration tests
# (tests/integration/kubernetes) start these on loopback.
#
# Idempotent: when the four binaries are already cached it exits at once.
# Duration of a cold build: ~10 min for kube-apiserver on 2 cores, ~2 min more for
# the controller manager and scheduler (plus the apt downloads).
#
# Why this way: a plain `go build ./cmd/kube-apiserver` fails on the vendored tree;
# the upstream `make WHAT=...` wrapper builds in GOPATH mode and works with Debian's
# golang-go 1.19 (it needs rsync). Packages come from Debian's archive only.
#
# Set RLMESH_K8S_KEEP_SRC=1 to keep the unpacked source (~2.5 GB) after a build.
# Needs root (or the packages golang-go, etcd-server, rsync, dpkg-dev installed
# and a deb-src line configured) the first time. Run it niced when sharing cores:
#   nice -n 10 bash scripts/k8s_build.sh > ~/.cache/rlmesh/k8s/build.log 2>&1
set -euo pipefail

cache="${RLMESH_K8S_CACHE:-$HOME/.cache/rlmesh/k8s}"
bin="$cache/bin"
src="$cache/src"
wanted=(kube-apiserver kube-controller-manager kube-scheduler etcd)
mkdir -p "$bin" "$src"
# One build at a time: a second caller (another test run) waits for the first, then finds the cache.
exec 9>"$cache/.build.lock"
flock 9

have_all() {
  local b
  for b in "${wanted[@]}"; do [ -x "$bin/$b" ] || return 1; done
}

if have_all; then
  echo "k8s_build: cached binaries in $bin"
  exit 0
fi

log() { echo "k8s_build: $(date -u +%H:%M:%S) $*"; }

# 1. Packages from Debian's archive (needs a deb-src line for `apt-get source`).
need_pkgs=()
command -v go >/dev/null || [ -x /usr/lib/go/bin/go ] || need_pkgs+=(golang-go)
[ -x /usr/bin/etcd ] || need_pkgs+=(etcd-server)
command -v rsync >/dev/null || need_pkgs+=(rsync)
command -v dpkg-source >/dev/null || need_pkgs+=(dpkg-dev)
srcfile=/etc/apt/sources.list.d/rlmesh-deb-src.sources
if ! grep -rqs '^Types:.*deb-src\|^deb-src' /etc/apt/sources.list /etc/apt/sources.list.d/; then
  if [ "$(id -u)" != 0 ]; then
    echo "k8s_build: no deb-src line and not root; add one (see $0) and rerun" >&2
    exit 2
  fi
  codename="$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")"
  log "adding $srcfile for $codename"
  cat > "$srcfile" <<EOF
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: $codename
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  need_update=1
fi
if [ "${#need_pkgs[@]}" -gt 0 ] || [ -n "${need_update:-}" ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "k8s_build: missing packages ${need_pkgs[*]} and not root" >&2
    exit 2
  fi
  log "apt-get update"
  apt-get update -qq
  if [ "${#need_pkgs[@]}" -gt 0 ]; then
    log "installing ${need_pkgs[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_pkgs[@]}" >/dev/null
  fi
fi
export PATH="/usr/lib/go/bin:$PATH"
cp -f /usr/bin/etcd "$bin/etcd"

# 2. The source package (unpacked once into $src/kubernetes-*).
cd "$src"
tree="$(ls -d kubernetes-*/ 2>/dev/null | head -n1 || true)"
if [ -z "$tree" ]; then
  log "apt-get source kubernetes"
  apt-get source -qq kubernetes
  tree="$(ls -d kubernetes-*/ | head -n1)"
fi
cd "$src/$tree"
log "building in $PWD with $(go version)"

# 3. The upstream make wrapper, GOPATH mode. KUBE_GIT_VERSION avoids a git lookup
#    (the source package is not a git checkout).
export GO111MODULE=off GOFLAGS= KUBE_GIT_VERSION="${KUBE_GIT_VERSION:-v1.20.2}"
export KUBE_BUILD_PLATFORMS=linux/amd64 GOMAXPROCS="${GOMAXPROCS:-2}"
for what in kube-apiserver kube-controller-manager kube-scheduler; do
  if [ -x "$bin/$what" ]; then continue; fi
  log "make WHAT=cmd/$what"
  make WHAT="cmd/$what"
  out="$(find _output -type f -name "$what" -perm -u+x | head -n1)"
  [ -n "$out" ] || { echo "k8s_build: $what not produced" >&2; exit 1; }
  cp -f "$out" "$bin/$what"
  log "cached $bin/$what"
done
have_all
# The unpacked tree and its _output are ~2.5 GB and not needed once the binaries are cached.
if [ -z "${RLMESH_K8S_KEEP_SRC:-}" ]; then
  rm -rf "$src"
fi
log "done"
