#!/usr/bin/env bash
# Regenerate the Python stubs in epd/v1/ from proto/epd/v1/*.proto (grpcio-tools, with .pyi).
# The stubs are generated code: never edit them by hand, run this instead.
#
#   scripts/gen_protos.sh          # regenerate in place
#   scripts/gen_protos.sh --check  # exit 1 if the committed stubs differ from the .proto files
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
[ -x "$PYTHON" ] || PYTHON=python3

generate() {
  local out="$1"
  mkdir -p "$out/epd/v1"
  "$PYTHON" -m grpc_tools.protoc -I "$ROOT/proto" -I "$("$PYTHON" -c "import grpc_tools, os; print(os.path.join(os.path.dirname(grpc_tools.__file__), '_proto'))")" \
    --python_out="$out" --pyi_out="$out" --grpc_python_out="$out" \
    "$ROOT"/proto/epd/v1/*.proto
  printf '"""Generated protobuf and gRPC stubs for package epd.v1 (scripts/gen_protos.sh). Do not edit."""\n' \
    > "$out/epd/v1/__init__.py"
}

if [ "${1:-}" = "--check" ]; then
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  generate "$tmp"
  if ! diff -r "$tmp/epd/v1" "$ROOT/epd/v1" --exclude=__pycache__; then
    echo "epd/v1 stubs are out of date with proto/: run scripts/gen_protos.sh" >&2
    exit 1
  fi
  echo "stubs up to date"
else
  rm -f "$ROOT"/epd/v1/*_pb2*.py "$ROOT"/epd/v1/*_pb2*.pyi
  generate "$ROOT"
  echo "regenerated $(ls "$ROOT"/epd/v1/*.py | wc -l) files in epd/v1"
fi
