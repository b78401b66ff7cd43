#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Installs the Debian packages llmkit builds with, if any are missing.
# As root: apt-get installs them and says which. Otherwise: prints the exact
# apt-get line to run and fails.
set -euo pipefail
packages=("$@")
missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "llmkit: all Debian packages present (${packages[*]})"
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "llmkit: missing Debian packages: ${missing[*]}" >&2
  echo "llmkit: run this as root, then run make again:" >&2
  echo "    apt-get update && apt-get install -y --no-install-recommends ${missing[*]}" >&2
  exit 1
fi
echo "llmkit: installing missing Debian packages: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "llmkit: installed ${missing[*]}"
