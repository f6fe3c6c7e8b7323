#!/usr/bin/env bash
# Download the cp312 wheels a lent GPU machine lacks (../shared/GPU.md) into .whl, at the versions
# this checkout's .venv holds, for scripts/gpu_check.sh to install there. About 41 MB; the working
# tree a device call carries must stay under 64 MiB.
#
# --store downloads instead, into DIR (default .whl-store), what gpu_check.sh's embedding store
# step needs (--store-wheels): Mooncake's cp312 wheel at requirements/store-cpu.txt's pin and the
# Debian packages of the system libraries it loads (libibverbs1, librdmacm1 and their libnl),
# which gpu_check.sh unpacks without installing them. Mooncake's wheel is large: carry it in a
# device call of its own.
#
#   scripts/gpu_wheels.sh [DIR]
#   scripts/gpu_wheels.sh --store [DIR]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PIP=("${EPD_VENV:-$ROOT/.venv}/bin/python" -m pip)
PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
if [[ ${1:-} == --store ]]; then
  DEST="$(realpath -m "${2:-$ROOT/.whl-store}")"
  mkdir -p "$DEST"
  "${PIP[@]}" download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${PLATFORMS[@]}" -d "$DEST" "$(grep -v '^#' "$ROOT/requirements/store-cpu.txt" | head -n 1)"
  (cd "$DEST" && apt-get download -q libibverbs1 librdmacm1 libnl-3-200 libnl-route-3-200)
  du -sh "$DEST"
  exit 0
fi
DEST="${1:-$ROOT/.whl}"
NAMES=(
  grpcio grpcio-health-checking grpcio-reflection grpcio-status grpcio-tools protobuf
  googleapis-common-protos opentelemetry-api opentelemetry-sdk opentelemetry-semantic-conventions
  opentelemetry-proto opentelemetry-exporter-otlp opentelemetry-exporter-otlp-proto-common
  opentelemetry-exporter-otlp-proto-grpc opentelemetry-exporter-otlp-proto-http
  opentelemetry-exporter-http-transport opentelemetry-exporter-otlp-common
  opentelemetry-instrumentation opentelemetry-instrumentation-grpc transformers tokenizers regex
  pytest pytest-asyncio pluggy iniconfig aiohttp multidict yarl propcache frozenlist aiosignal
  aiohappyeyeballs attrs openai pydantic pydantic_core jiter distro annotated-types
  typing-inspection sniffio httpx2 httpcore2 truststore wrapt setproctitle av pybase64 blake3
)
declare -A version
while read -r name ver; do version[${name,,}]=$ver; done < <(
  "${PIP[@]}" show "${NAMES[@]}" 2>/dev/null | awk '/^Name: /{n=$2} /^Version: /{print n, $2}')
pins=()
for name in "${NAMES[@]}"; do
  key=${name,,}
  ver=${version[$key]:-${version[${key//-/_}]:-${version[${key//_/-}]:-}}}
  if [[ -n $ver ]]; then pins+=("$name==$ver"); else pins+=("$name"); fi
done
mkdir -p "$DEST"
"${PIP[@]}" download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${PLATFORMS[@]}" -d "$DEST" "${pins[@]}"
du -sh "$DEST"
