#!/usr/bin/env bash
# Build the CPU image without a Docker daemon or a registry: a Debian bookworm root file system
# from an apt mirror (debootstrap), epd installed in it by the same setup_cpu.sh that
# Dockerfile.cpu runs, then (where podman works) an OCI image made from it.
#
#   deploy/docker/build_rootfs.sh            # rootfs, then the image epd:0.1.0 with podman
#   deploy/docker/build_rootfs.sh rootfs     # only the root file system
#   deploy/docker/build_rootfs.sh import     # only the podman image, from the rootfs
#   deploy/docker/build_rootfs.sh run ARGS   # `epd ARGS` in the rootfs as user epd (chroot)
#
# Needs root, debootstrap, unshare and chroot (podman for the image). Environment:
#   EPD_IMAGE_DIR     where the rootfs lives (default /var/tmp/epd-image; several GB)
#   EPD_APT_MIRROR    Debian mirror (default: this machine's, else http://deb.debian.org/debian)
#   EPD_TORCH_WHEELS  a folder of wheels pip may take torch's CPU build from (find-links), for
#                     machines that reach PyPI but not PyTorch's CPU index; torchvision then
#                     comes from PyPI and scripts/patch_torchvision.py, as scripts/install.sh does
#   EPD_IMAGE         image name (default epd:0.1.0, the chart's default)
#   EPD_BUILD_CA      CA bundle pip trusts during the build only (default this machine's), for
#                     networks behind a TLS-intercepting proxy; the image does not keep it
# Rerunnable: a step whose result is there is skipped, and setup_cpu.sh is idempotent.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
DIR="${EPD_IMAGE_DIR:-/var/tmp/epd-image}"
ROOTFS="$DIR/rootfs"
IMAGE="${EPD_IMAGE:-epd:0.1.0}"
BUILD_CA="${EPD_BUILD_CA:-/etc/ssl/certs/ca-certificates.crt}"
# Dockerfile.cpu's EXPOSE.
EXPOSE="50050 8000 50051 50061 50071 50081 5600 9400 50090 50091 50092 50093"

apt_mirror() {
  local uri
  uri="$(sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/*.sources 2>/dev/null | grep -v security \
    | head -n1)"
  echo "${EPD_APT_MIRROR:-${uri:-http://deb.debian.org/debian}}"
}

# Run a command chrooted into the rootfs, in private mount and PID namespaces (/proc, /dev,
# /dev/shm, /sys mounted there vanish with it), on the host's network.
in_rootfs() {
  unshare --mount --pid --fork --propagation private -- /bin/sh -ec '
    r="$1"; shift
    mount --rbind /dev "$r/dev"
    mount -t tmpfs -o size=2g shm "$r/dev/shm"
    mount -t proc proc "$r/proc"
    mount -t sysfs sys "$r/sys"
    exec chroot "$r" "$@"' in_rootfs "$ROOTFS" "$@"
}

build_rootfs() {
  if [ ! -f "$ROOTFS/etc/debian_version" ]; then
    mkdir -p "$DIR"
    # minbase: what debian:bookworm-slim holds (essential packages and apt).
    debootstrap --variant=minbase bookworm "$ROOTFS" "$(apt_mirror)"
  fi
  cp /etc/resolv.conf "$ROOTFS/etc/resolv.conf"
  # The build context: the working tree's files that git tracks or does not ignore.
  rm -rf "$ROOTFS/src" && mkdir -p "$ROOTFS/src"
  git -C "$ROOT" ls-files -z --cached --others --exclude-standard \
    | (cd "$ROOT" && tar --null -T - -cf -) | tar -C "$ROOTFS/src" -xf -
  local env=(PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root)
  if [ -f "$BUILD_CA" ]; then
    cp "$BUILD_CA" "$ROOTFS/tmp/build-ca.crt"
    env+=(PIP_CERT=/tmp/build-ca.crt)
  fi
  if [ -n "${EPD_TORCH_WHEELS:-}" ]; then
    rm -rf "$ROOTFS/wheels" && cp -r "$EPD_TORCH_WHEELS" "$ROOTFS/wheels"
    env+=(PIP_FIND_LINKS=/wheels)
  fi
  in_rootfs /usr/bin/env -i "${env[@]}" /bin/bash /src/deploy/docker/setup_cpu.sh /src
  rm -rf "$ROOTFS/src" "$ROOTFS/wheels" "$ROOTFS/tmp/build-ca.crt" "$ROOTFS/root/.cache"
  du -sh "$ROOTFS"
}

# An OCI image of the rootfs with Dockerfile.cpu's settings, without what `run` left behind.
import_image() {
  local expose=()
  # NOTE: podman import takes one port per EXPOSE change.
  for port in $EXPOSE; do expose+=(--change "EXPOSE $port"); done
  tar -C "$ROOTFS" --exclude='./proc/*' --exclude='./sys/*' --exclude='./dev/*' \
      --exclude='./tmp/*' --exclude=./home/epd/.epd --exclude=./home/epd/.cache -cf - . \
    | podman import \
      --change 'ENV PATH=/opt/epd/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
      --change 'ENV PYTHONUNBUFFERED=1' \
      --change 'USER epd' \
      --change 'WORKDIR /home/epd' \
      "${expose[@]}" \
      --change 'ENTRYPOINT ["epd"]' \
      --change 'CMD ["--help"]' \
      - "$IMAGE"
  podman image ls "$IMAGE"
}

# `epd ARGS` in the rootfs as the image runs it: user epd, /opt/epd on PATH, in /home/epd.
run_epd() {
  in_rootfs /usr/bin/env -i PATH=/opt/epd/bin:/usr/bin:/bin HOME=/home/epd PYTHONUNBUFFERED=1 \
    /usr/sbin/runuser -u epd -- /bin/sh -c 'cd /home/epd && exec epd "$@"' epd "$@"
}

case "${1:-all}" in
  all) build_rootfs; import_image ;;
  rootfs) build_rootfs ;;
  import) import_image ;;
  run) shift; run_epd "$@" ;;
  *) echo "usage: deploy/docker/build_rootfs.sh [all|rootfs|import|run ARGS]" >&2; exit 2 ;;
esac
