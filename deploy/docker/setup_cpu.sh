#!/usr/bin/env bash
# What the CPU image holds, installed as root inside it: Dockerfile.cpu runs this as it builds,
# build_rootfs.sh runs it in a chroot of a Debian bookworm root file system. SRC is the source
# tree (the build context).
#
#   deploy/docker/setup_cpu.sh /src
#
# epd goes into the virtual environment /opt/epd, installed by scripts/install.sh --target cpu
# --no-dev: the pins of requirements/cpu.txt and requirements/cpu-no-deps.txt, torch's and
# torchvision's CPU builds from PyTorch's CPU index (EPD_TORCH_CPU_INDEX) unless a configured pip
# source has them (PIP_FIND_LINKS), and NIXL's CPU-capable build.
set -euo pipefail

SRC="${1:-/src}"
VENV=/opt/epd
# NOTE: the user the image runs as; a fixed id so volumes and pod securityContexts can name it.
USER_ID=10001

# Python 3.11 with venv (Debian bookworm's); libnuma1 for vLLM's CPU kernels (vllm/_C*.so link
# it; torch's wheel brings its own libgomp); ca-certificates for https image URLs and the hub.
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends python3 python3-venv libnuma1 ca-certificates
rm -rf /var/lib/apt/lists/*

id -u epd >/dev/null 2>&1 || useradd --create-home --uid "$USER_ID" --shell /bin/bash epd

PIP_NO_CACHE_DIR=1 EPD_VENV="$VENV" "$SRC/scripts/install.sh" --target cpu --no-dev
