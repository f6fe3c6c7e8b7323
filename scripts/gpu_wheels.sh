#!/usr/bin/env bash
# Download the cp312 wheels a lent GPU machine lacks (../shared/GPU.md) into .whl, at the versions
# this checkout's .venv holds, for scripts/gpu_check.sh to install there. About 41 MB; the working
# tree a device call carries must stay under 64 MiB.
#
#   scripts/gpu_wheels.sh [DIR]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="${1:-$ROOT/.whl}"
PIP=("${EPD_VENV:-$ROOT/.venv}/bin/python" -m pip)
NAMES=(
  grpcio grpcio-health-checking grpcio-reflection grpcio-status grpcio-tools protobuf
  googleapis-common-protos opentelemetry-api opentelemetry-sdk opentelemetry-semantic-conventions
  opentelemetry-proto opentelemetry-exporter-otlp opentelemetry-exporter-otlp-proto-common
  opentelemetry-exporter-otlp-proto-grpc opentelemetry-exporter-otlp-proto-http
  opentelemetry-exporter-http-transport opentelemetry-exporter-otlp-common
  opentelemetry-instrumentation opentelemetry-instrumentation-grpc transformers tokenizers regex
  pytest pytest-asyncio pluggy iniconfig aiohttp multidict yarl propcache frozenlist aiosignal
  aiohappyeyeballs attrs openai pydantic pydantic_core jiter distro annotated-types
  typing-inspection sniffio httpx2 httpcore2 truststore wrapt setproctitle av
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
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux1_x86_64 -d "$DEST" "${pins[@]}"
du -sh "$DEST"
