#!/bin/sh
# Build every image of docker/compose.yaml with no image registry: the base image is bootstrapped from Debian's
# packages, the rest comes from Debian's archive and PyPI. Needs root (debootstrap), a Docker daemon and
# debootstrap; run it from anywhere in the repository.
#
#   sudo docker/local-base.sh                  # the three images below, then:
#   cd docker && docker compose -f compose.yaml -f compose.local.yaml up -d --scale ray-worker=2
#
# Images (each one is skipped when it is there already; --rebuild builds them again):
#   fractune-base:bookworm      debootstrap --variant=minbase bookworm + python3 (3.11), python3-venv, imported
#   fractune-postgres:15        that base + Debian's postgresql (15), docker/postgres/ (the official image's env)
#   fractune:$FRACTUNE_VARIANT  docker/Dockerfile on that base (PYTHON_IMAGE=fractune-base:bookworm)
#
# Options: --base-only (the two base images, not fractune), --rebuild.
# Environment:
#   FRACTUNE_VARIANT   cuda (default here: torch from PyPI, a CUDA build that also runs on the CPU, several GB)
#                      or cpu (torch from PyTorch's CPU index, a small image: for hosts that reach that index)
#   DEBIAN_MIRROR      the Debian archive (default http://deb.debian.org/debian)
#   PIP_CA_FILE        the CA bundle pip must trust (default: $PIP_CERT, $SSL_CERT_FILE, then
#                      /etc/ssl/certs/ca-certificates.crt when it exists). It reaches pip as a BuildKit build
#                      secret, mounted for the pip steps only: it is in no layer of the image.
#   PIP_INDEX_URL, PIP_EXTRA_INDEX_URL, PIP_TRUSTED_HOST, HTTP(S)_PROXY, NO_PROXY: passed on as build arguments
#                      when set (file:// indexes are left out: the build cannot see this machine's folders)
#   DOCKER             the docker client (default: one that can build with BuildKit)
# Each step prints its elapsed time.
set -eu

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
SUITE=bookworm
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
VARIANT=${FRACTUNE_VARIANT:-cuda}
BASE_IMAGE=fractune-base:$SUITE
PG_IMAGE=fractune-postgres:15
APP_IMAGE=fractune:$VARIANT
BASE_ONLY=0
REBUILD=0
for arg in "$@"; do
  case "$arg" in
    --base-only) BASE_ONLY=1 ;;
    --rebuild) REBUILD=1 ;;
    -h|--help) sed -n '2,29p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "local-base.sh: unknown option $arg (allowed: --base-only, --rebuild)" >&2; exit 2 ;;
  esac
done
case "$VARIANT" in cpu|cuda) ;; *) echo "FRACTUNE_VARIANT must be cpu or cuda, not '$VARIANT'" >&2; exit 2 ;; esac

now() { date +%s; }
step() { STEP_NAME=$1; STEP_T0=$(now); echo "== $1"; }
done_step() { echo "== $STEP_NAME: done in $(( $(now) - STEP_T0 ))s${1:+ ($1)}"; }
size_of() { "$DOCKER" image inspect -f '{{.Size}}' "$1" | awk '{printf "%.0f MB", $1 / 1e6}'; }
have_image() { [ "$REBUILD" = 0 ] && "$DOCKER" image inspect "$1" >/dev/null 2>&1; }

# A client that builds with BuildKit (RUN --mount, --secret): Docker >= 23 does it through the buildx plugin,
# older clients (Debian bookworm's docker.io 20.10) by themselves with DOCKER_BUILDKIT=1.
buildkit_client() {
  for c in ${DOCKER:-} docker /usr/bin/docker; do
    command -v "$c" >/dev/null 2>&1 || continue
    major=$("$c" version --format '{{.Client.Version}}' 2>/dev/null | cut -d. -f1) || continue
    case "$major" in ''|*[!0-9]*) continue ;; esac
    if [ "$major" -lt 23 ] || "$c" buildx version >/dev/null 2>&1; then echo "$c"; return 0; fi
  done
  return 1
}
DOCKER=$(buildkit_client) || { echo "local-base.sh: no docker client that builds with BuildKit (install Debian's docker.io, or the buildx plugin)" >&2; exit 1; }
export DOCKER_BUILDKIT=1
"$DOCKER" info >/dev/null 2>&1 || { echo "local-base.sh: no Docker daemon answers (start dockerd first)" >&2; exit 1; }

# --- build arguments and the CA secret for pip --------------------------------------------------------------
set --
for var in PIP_INDEX_URL PIP_EXTRA_INDEX_URL PIP_TRUSTED_HOST HTTP_PROXY HTTPS_PROXY NO_PROXY http_proxy https_proxy no_proxy; do
  eval "val=\${$var:-}"
  case "$val" in ''|file:*) continue ;; esac
  set -- "$@" --build-arg "$var=$val"
done
CA=${PIP_CA_FILE:-${PIP_CERT:-${SSL_CERT_FILE:-}}}
[ -n "$CA" ] || [ ! -f /etc/ssl/certs/ca-certificates.crt ] || CA=/etc/ssl/certs/ca-certificates.crt
if [ -n "$CA" ]; then
  [ -f "$CA" ] || { echo "local-base.sh: CA bundle $CA not found (PIP_CA_FILE)" >&2; exit 1; }
  set -- "$@" --secret "id=pip_ca,src=$CA"
fi

# --- fractune-base: Debian bookworm minbase + Python 3.11 ---------------------------------------------------
if have_image "$BASE_IMAGE"; then
  echo "== $BASE_IMAGE: present ($(size_of "$BASE_IMAGE")), kept (--rebuild builds it again)"
else
  command -v debootstrap >/dev/null 2>&1 || { echo "local-base.sh: debootstrap missing (apt-get install debootstrap)" >&2; exit 1; }
  [ "$(id -u)" = 0 ] || { echo "local-base.sh: debootstrap needs root" >&2; exit 1; }
  step "$BASE_IMAGE: debootstrap --variant=minbase $SUITE ($MIRROR) + python3"
  ROOTFS=$(mktemp -d /tmp/fractune-rootfs.XXXXXX)
  chmod 0755 "$ROOTFS"  # it becomes the image's /: mktemp's 0700 would lock every user but root out of it
  trap 'rm -rf "$ROOTFS"' EXIT INT TERM
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates,netbase \
    "$SUITE" "$ROOTFS" "$MIRROR" > "$ROOTFS.log" 2>&1 || { tail -20 "$ROOTFS.log" >&2; exit 1; }
  rm -f "$ROOTFS.log"
  # what Docker's own Debian images do: the suite's updates and security archives, no services started by
  # package scripts, no package caches or lists left behind
  SECURITY=$(echo "$MIRROR" | sed 's#/debian/*$#/debian-security#')
  printf 'deb %s %s main\ndeb %s %s-updates main\ndeb %s %s-security main\n' \
    "$MIRROR" "$SUITE" "$MIRROR" "$SUITE" "$SECURITY" "$SUITE" > "$ROOTFS/etc/apt/sources.list"
  printf '#!/bin/sh\nexit 101\n' > "$ROOTFS/usr/sbin/policy-rc.d" && chmod 0755 "$ROOTFS/usr/sbin/policy-rc.d"
  rm -rf "$ROOTFS"/var/cache/apt/archives/*.deb "$ROOTFS"/var/cache/apt/*.bin "$ROOTFS"/var/lib/apt/lists/* \
         "$ROOTFS"/var/log/* "$ROOTFS"/usr/share/doc/* "$ROOTFS"/usr/share/man/* "$ROOTFS"/tmp/*
  tar -C "$ROOTFS" -c . | "$DOCKER" import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change "LABEL org.opencontainers.image.description=\"Debian $SUITE minbase + python3, bootstrapped from $MIRROR\"" \
    --change 'CMD ["/bin/bash"]' - "$BASE_IMAGE" >/dev/null
  rm -rf "$ROOTFS"
  trap - EXIT INT TERM
  "$DOCKER" run --rm --network none "$BASE_IMAGE" python3 -c 'import sys, venv, ssl; assert sys.version_info[:2] == (3, 11), sys.version'
  done_step "$(size_of "$BASE_IMAGE")"
fi

# --- fractune-postgres: Debian's PostgreSQL 15 --------------------------------------------------------------
if have_image "$PG_IMAGE"; then
  echo "== $PG_IMAGE: present ($(size_of "$PG_IMAGE")), kept"
else
  step "$PG_IMAGE: docker build docker/postgres (FROM $BASE_IMAGE)"
  "$DOCKER" build --network host --build-arg "BASE_IMAGE=$BASE_IMAGE" -t "$PG_IMAGE" "$HERE/postgres"
  done_step "$(size_of "$PG_IMAGE")"
fi

[ "$BASE_ONLY" = 0 ] || exit 0

# --- fractune: docker/Dockerfile on the local base -----------------------------------------------------------
step "$APP_IMAGE: docker build -f docker/Dockerfile (PYTHON_IMAGE=$BASE_IMAGE, VARIANT=$VARIANT)"
"$DOCKER" build --network host --build-arg "PYTHON_IMAGE=$BASE_IMAGE" --build-arg "VARIANT=$VARIANT" "$@" \
  -f "$HERE/Dockerfile" -t "$APP_IMAGE" "$ROOT"
done_step "$(size_of "$APP_IMAGE")"
