#!/usr/bin/env bash
# End-to-end tests of the MCP endpoint with the official Python MCP SDK.
#
# Needs the dev services (scripts/dev up) and a built binary; builds nothing.
#   MNEMOSYNE_BIN   the mnemosyne binary (default: target/debug/mnemosyne)
#   PYTHON          the interpreter that creates the venv (default: python3)
# Extra arguments go to pytest, e.g. tests/python/run.sh -k stateless -x
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
if [ -n "${MNEMOSYNE_BIN:-}" ] && [ "${MNEMOSYNE_BIN#/}" = "$MNEMOSYNE_BIN" ]; then
  MNEMOSYNE_BIN="$PWD/$MNEMOSYNE_BIN" # relative to where we were called from
fi
cd "$ROOT"

VENV="$ROOT/.dev/pyenv"
REQ="$ROOT/tests/python/requirements.txt"
STAMP="$VENV/.requirements.sha256"
PYTHON="${PYTHON:-python3}"

export MNEMOSYNE_BIN="${MNEMOSYNE_BIN:-$ROOT/target/debug/mnemosyne}"
if [ ! -x "$MNEMOSYNE_BIN" ]; then
  echo "tests/python: no mnemosyne binary at $MNEMOSYNE_BIN (cargo build --bin mnemosyne, or set MNEMOSYNE_BIN)" >&2
  exit 2
fi

if ! "$VENV/bin/python" -c 'import sys' >/dev/null 2>&1; then
  echo "tests/python: creating $VENV" >&2
  "$PYTHON" -m venv --clear "$VENV"
fi
# Reinstall only when requirements.txt (or the venv's interpreter) changed.
want="$( (cat "$REQ"; "$VENV/bin/python" -c 'import sys; print(sys.version)') | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$STAMP" 2>/dev/null || true)" != "$want" ]; then
  echo "tests/python: installing requirements into $VENV" >&2
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check -r "$REQ"
  echo "$want" >"$STAMP"
fi

exec "$VENV/bin/python" -m pytest -q tests/python "$@"
