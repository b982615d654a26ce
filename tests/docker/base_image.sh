#!/usr/bin/env bash
# Build a local stand-in for the Dockerfile's base image, for machines that cannot pull from Docker Hub.
#
# $ DOCKER_HOST=unix:///run/capsnet-ci/docker.sock tests/docker/base_image.sh [TAG]
#
# TAG defaults to python:3.11-slim-bookworm (the Dockerfile's BASE_IMAGE), so the Dockerfile builds
# unchanged. The stand-in holds only Debian bookworm packages (debootstrap minbase + python3,
# python3-venv, python3-pip, python-is-python3, ca-certificates): Python 3.11 with `python`,
# `python3`, `pip` on PATH, as in the real image (there under /usr/local/bin, here under /usr/bin;
# the Dockerfile only says `python3 -m venv`, which works in both).
#
# The debootstrapped root is cached in $CAPSNET_CI_CACHE (default /var/cache/capsnet-ci), so a
# second run only re-imports it (seconds); a fresh machine builds it in about a minute and a half.
# The host's local CA certificates (/usr/local/share/ca-certificates) are added at import time so
# that pip inside a build trusts the same registry proxy as pip on the host.
set -euo pipefail

TAG=${1:-python:3.11-slim-bookworm}
CACHE=${CAPSNET_CI_CACHE:-/var/cache/capsnet-ci}
ROOT=$CACHE/bookworm-python3-rootfs
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
PACKAGES=python3,python3-venv,python3-pip,python-is-python3,ca-certificates

if docker image inspect "$TAG" >/dev/null 2>&1; then
    echo "base image $TAG: already present"
    exit 0
fi

if [[ ! -f $ROOT/.complete || $(cat "$ROOT/.complete") != "$PACKAGES" ]]; then
    echo "debootstrap bookworm ($PACKAGES) into $ROOT ..."
    rm -rf "$ROOT" "$ROOT.tmp"
    mkdir -p "$CACHE"
    nice -n "${CAPSNET_CI_NICE:-15}" debootstrap --variant=minbase --include="$PACKAGES" \
        bookworm "$ROOT.tmp" "$MIRROR" >"$CACHE/debootstrap.log" 2>&1 \
        || { tail -n 20 "$CACHE/debootstrap.log" >&2; exit 1; }
    # what python:*-slim also leaves out: the .deb cache and the package lists
    rm -rf "$ROOT.tmp"/var/cache/apt/archives/*.deb "$ROOT.tmp"/var/lib/apt/lists/* \
        "$ROOT.tmp"/usr/share/doc/* "$ROOT.tmp"/usr/share/man/*
    echo "$PACKAGES" >"$ROOT.tmp/.complete"
    mv "$ROOT.tmp" "$ROOT"
fi

# trust the host's local CAs (the registry proxy's) inside builds; nothing else from the host
shopt -s nullglob
local_cas=(/usr/local/share/ca-certificates/*.crt)
rm -f "$ROOT"/usr/local/share/ca-certificates/*.crt
if ((${#local_cas[@]})); then cp "${local_cas[@]}" "$ROOT/usr/local/share/ca-certificates/"; fi
chroot "$ROOT" update-ca-certificates --fresh >/dev/null 2>&1

tar -C "$ROOT" --exclude=./.complete -c . | docker import \
    --change 'ENV LANG=C.UTF-8' \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["python3"]' \
    - "$TAG" >/dev/null
echo "base image $TAG: imported from $ROOT ($(docker image inspect -f '{{.Size}}' "$TAG" | numfmt --to=iec))"
