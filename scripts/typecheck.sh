#!/usr/bin/env bash
# mypy (strict, see pyproject.toml) over the hand-written code, under its installed module names.
# mypy cannot follow the editable install's folder mapping (server/ -> epd.server, ...), so this
# builds a tree of symlinks shaped like the installed package and checks that.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MYPY="${MYPY:-$ROOT/.venv/bin/mypy}"
TREE="$ROOT/build/typecheck"
rm -rf "$TREE" && mkdir -p "$TREE/epd"
for item in "$ROOT"/epd/*; do ln -s "$item" "$TREE/epd/$(basename "$item")"; done
for folder in server common client launch scheduler; do ln -s "$ROOT/$folder" "$TREE/epd/$folder"; done
cd "$TREE"
"$MYPY" --config-file "$ROOT/pyproject.toml" -p epd "$@"
