#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Runs every benchmark binary at full length; bench_roofline first, since the
# others read its limits (build/roofline.json) to print roofline fractions.
set -euo pipefail
dir=${1:-build/release/bench}
"$dir/bench_roofline" --benchmark_counters_tabular=true
for b in "$dir"/bench_*; do
  [ -x "$b" ] && [ "$(basename "$b")" != bench_roofline ] || continue
  "$b" --benchmark_counters_tabular=true
done
