#!/usr/bin/env bash
# The project's test command: install (idempotent, seconds when nothing changed), then every check.
#
#   scripts/test.sh                 # contracts, lint, types, the whole pytest suite
#   scripts/test.sh -k scheduler    # extra arguments go to pytest
#   scripts/test.sh -m "not integration"    # tests/unit and tests/grpc only (under 2 min)
#
# Fails on any failing check, any failing test, or a pytest run that collects no test.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
"$ROOT/scripts/install.sh"
VENV="${EPD_VENV:-$ROOT/.venv}"
BIN="$VENV/bin"

step() { printf '\n==> %s\n' "$*"; }

step "protobuf contracts: buf lint, buf format, generated stubs up to date"
"$BIN/buf" lint
"$BIN/buf" format --diff --exit-code
PYTHON="$BIN/python" "$ROOT/scripts/gen_protos.sh" --check

step "shell scripts parse"
for script in scripts/*.sh .ci/run; do bash -n "$script"; done

step "ruff: lint, and the formatter owns the layout"
"$BIN/ruff" check .
"$BIN/ruff" format --check .

step "mypy (strict) on hand-written code"
MYPY="$BIN/mypy" "$ROOT/scripts/typecheck.sh"

step "pytest"
"$BIN/pytest" -q -ra --instafail --durations=15 "$@"
