#!/usr/bin/env bash
# Make sure the base image our Dockerfiles name exists locally.
#
# Anywhere with a registry this is just `docker pull`. Here no image registry
# is reachable, so when the pull fails we build the same base from Debian's
# own packages with debootstrap and `docker import` it under the same tag:
# the Dockerfiles stay the ordinary `FROM debian:bookworm-slim`.
set -euo pipefail

TAG="${1:-debian:bookworm-slim}"
SUITE="${SUITE:-bookworm}"
MIRROR="${MIRROR:-http://deb.debian.org/debian}"

if docker image inspect "$TAG" >/dev/null 2>&1; then
    echo "base image: $TAG present"
    exit 0
fi
echo "base image: $TAG missing; trying docker pull"
if timeout 60 docker pull -q "$TAG" >/dev/null 2>&1; then
    echo "base image: pulled $TAG"
    exit 0
fi

echo "base image: no registry; building $TAG with debootstrap from $MIRROR (a few minutes)"
command -v debootstrap >/dev/null || {
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
}
root="$(mktemp -d /tmp/wakeloop-rootfs.XXXXXX)"
trap 'rm -rf "$root"' EXIT
debootstrap --variant=minbase "$SUITE" "$root" "$MIRROR" >"$root.log" 2>&1 || {
    tail -20 "$root.log"; echo "base image: debootstrap failed (log: $root.log)"; exit 1; }
rm -f "$root.log"
# Trim to what bookworm-slim leaves out: docs, man pages, apt lists.
rm -rf "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/var/lib/apt/lists/* \
       "$root"/var/cache/apt/*.bin "$root"/var/log/*.log
tar -C "$root" -c . | docker import \
    --change 'CMD ["bash"]' \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    - "$TAG" >/dev/null
echo "base image: built $TAG locally"
