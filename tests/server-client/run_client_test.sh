#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# ctest driver: starts llmkit-server on a free loopback port (with an API key
# and a chat template, zephyr unless given), runs SCRIPT (default client.mjs:
# the `openai` npm package; structured.mjs: structured outputs checked by
# `ajv`; tools.mjs: tool calls) against it, then stops it with SIGTERM and
# checks that it exits 0.
# Exits 77 (ctest: skipped) only when node is not installed.
#   run_client_test.sh SERVER_BINARY [SCRIPT.mjs [CHAT_TEMPLATE]]
set -uo pipefail
server=$1
script=${2:-client.mjs}
template=${3:-zephyr}
dir=$(cd "$(dirname "$0")" && pwd)
if ! command -v node >/dev/null 2>&1; then
  echo "SKIPPED: node is not installed; the openai client test needs node and 'npm ci' in $dir"
  exit 77
fi
for package in openai ajv ajv-formats; do
  if [ ! -f "$dir/node_modules/$package/package.json" ]; then
    echo "error: $dir/node_modules/$package is missing: run 'make deps-all' (npm ci in $dir)"
    exit 1
  fi
done
work=$(mktemp -d)
"$server" --port 0 --api-key test-key --chat-template "$template" --drain-seconds 5 >"$work/out" 2>"$work/err" &
pid=$!
cleanup() {
  kill -KILL "$pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
url=
for _ in $(seq 1 300); do  # 30 s at most
  url=$(grep -o 'http://[0-9.]*:[0-9]*' "$work/out")
  [ -n "$url" ] && break
  if ! kill -0 "$pid" 2>/dev/null; then
    echo "error: llmkit-server exited before listening:"
    cat "$work/err"
    exit 1
  fi
  sleep 0.1
done
if [ -z "$url" ]; then
  echo "error: llmkit-server did not print its address within 30 s"
  exit 1
fi
echo "llmkit-server at $url"
timeout 200 node "$dir/$script" "$url/v1"
client_status=$?
kill -TERM "$pid"
for _ in $(seq 1 150); do  # 15 s at most
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.1
done
if kill -0 "$pid" 2>/dev/null; then
  echo "error: llmkit-server still runs 15 s after SIGTERM"
  exit 1
fi
wait "$pid"
server_status=$?
cat "$work/err"
if [ "$server_status" -ne 0 ]; then
  echo "error: llmkit-server exited with $server_status after SIGTERM"
  exit 1
fi
exit "$client_status"
