#!/usr/bin/env bash
# A Debian bookworm base image made from the Debian mirror apt already uses (no image registry
# needed): debootstrap --variant=minbase, then imported as IMAGE. Usage: debian-base.sh ENGINE IMAGE
set -euo pipefail
ENGINE="$1"; IMAGE="$2"
# the first mirror apt uses (a "URIs:" line of a deb822 file, or a "deb" line), not a comment
MIRROR="${TRIBUTARY_DEBIAN_MIRROR:-$(grep -rhE '^(URIs:|deb) ' /etc/apt/sources.list /etc/apt/sources.list.d/ 2>/dev/null \
  | grep -oE 'https?://[^ ]+/debian/?( |$)' | grep -v security | head -1 | tr -d ' ' || true)}"
MIRROR="${MIRROR:-http://deb.debian.org/debian}"
command -v debootstrap >/dev/null || { echo "debootstrap is missing: apt-get install debootstrap"; exit 1; }
ROOTFS="$(mktemp -d /tmp/tributary-rootfs-XXXXXX)"
trap 'rm -rf "$ROOTFS"' EXIT
echo "debootstrap bookworm from $MIRROR"
debootstrap --variant=minbase bookworm "$ROOTFS" "$MIRROR" >/dev/null
# as debian:bookworm-slim: no docs, no apt caches in layers
rm -rf "$ROOTFS"/var/cache/apt/archives/*.deb "$ROOTFS"/var/lib/apt/lists/*
tar -C "$ROOTFS" -c . | "$ENGINE" import --change 'CMD ["bash"]' - "$IMAGE" >/dev/null
echo "base image $IMAGE imported"
