#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Installs the `openai`, `ajv` and `ajv-formats` npm packages for llmkit-server's client tests into
# tests/server-client/node_modules, from its lockfile (npm ci), unless the
# installed tree already matches the lockfile. Without node/npm it says the
# test will be skipped and succeeds.
set -euo pipefail
dir="$(cd "$(dirname "$0")/.." && pwd)/tests/server-client"
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  echo "llmkit: node/npm not found: the openai client test of llmkit-server (tests/server-client) will be skipped"
  exit 0
fi
installed="$dir/node_modules/.package-lock.json"
if [ -f "$installed" ] && [ "$installed" -nt "$dir/package-lock.json" ] && [ -f "$dir/node_modules/openai/package.json" ] &&
  [ -f "$dir/node_modules/ajv/package.json" ] && [ -f "$dir/node_modules/ajv-formats/package.json" ]; then
  echo "llmkit: npm packages of tests/server-client present"
  exit 0
fi
echo "llmkit: npm ci in tests/server-client (the openai client and ajv for llmkit-server's tests)"
(cd "$dir" && npm ci --no-audit --no-fund --loglevel=error)
