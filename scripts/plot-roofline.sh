#!/bin/sh
# SPDX-License-Identifier: MIT
# Draws the roofline plot of docs/scheduling.md: the machine's limits from
# bench_roofline's JSON and the measured engine steps (BM_step_cost) of
# bench_sched's JSON output, as achieved GFLOP/s against arithmetic intensity
# (FLOP per byte of weights and KV), one point per step shape.
#
#   build/release/bench/bench_sched --benchmark_filter=BM_step_cost \
#       --benchmark_out=build/bench_sched.json
#   scripts/plot-roofline.sh build/bench_sched.json build/roofline.json docs/scheduling-roofline.svg
#
# Needs jq and gnuplot (Debian: jq, gnuplot-nox).
set -eu
bench_json=${1:?usage: plot-roofline.sh BENCH_SCHED_JSON ROOFLINE_JSON OUT.svg}
roofline_json=${2:?usage: plot-roofline.sh BENCH_SCHED_JSON ROOFLINE_JSON OUT.svg}
out=${3:?usage: plot-roofline.sh BENCH_SCHED_JSON ROOFLINE_JSON OUT.svg}
for tool in jq gnuplot; do
  command -v "$tool" >/dev/null || { echo "plot-roofline.sh: $tool is not installed" >&2; exit 1; }
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# One line per step shape: intensity, GFLOP/s, kind, label.
jq -r '.benchmarks[] | select(.name | startswith("BM_step_cost/"))
       | [.flop_per_byte, .GFLOP_per_s, (.label | split(" ")[0]),
          (.label | capture("decodes=(?<d>[0-9]+) ctx=(?<c>[0-9]+) chunk=(?<k>[0-9]+)")
                  | (if .d != "0" then .d + "d" else "" end) + (if .k != "0" then (if .d != "0" then "+" else "" end) + .k + "p" else "" end))]
       | @tsv' "$bench_json" > "$tmp/steps.tsv"
[ -s "$tmp/steps.tsv" ] || { echo "plot-roofline.sh: no BM_step_cost results in $bench_json" >&2; exit 1; }
for kind in decode prefill mixed; do
  awk -F'\t' -v k="$kind" '$3 == k' "$tmp/steps.tsv" > "$tmp/$kind.tsv"
done
peak1=$(jq '.fma_gflops_1t' "$roofline_json")
bw1=$(jq '.read_gbps_1t' "$roofline_json")
peak=$(jq '.fma_gflops_all' "$roofline_json")
bw=$(jq '.read_gbps_all' "$roofline_json")
fit=$(jq -r '[.benchmarks[] | select(.name | startswith("BM_step_cost/"))][0]
             | "\(.fit_peak_gflops) \(.fit_gbps)"' "$bench_json")
fit_peak=${fit% *}
fit_bw=${fit#* }

gnuplot <<EOF
set terminal svg size 760,480 dynamic enhanced font "sans,12" background rgb "white"
set output "$out"
set title "Steps of the synthetic ~100M Llama (reference forward, 1 thread, f32)" noenhanced
set logscale xy
set xrange [0.25:256]
set yrange [1:1000]
set xlabel "arithmetic intensity (FLOP per byte of weights + KV)"
set ylabel "GFLOP/s"
set key right bottom font ",10"
set grid
roof(x, p, b) = (x * b < p) ? x * b : p
plot roof(x, $peak, $bw) with lines lw 2 lc rgb "#888888" title sprintf("roofline, 2 cores (%.0f GFLOP/s, %.1f GB/s)", $peak, $bw), \
     roof(x, $peak1, $bw1) with lines lw 2 lc rgb "#000000" title sprintf("roofline, 1 core (%.0f GFLOP/s, %.1f GB/s)", $peak1, $bw1), \
     roof(x, $fit_peak, $fit_bw) with lines lw 1 dt 2 lc rgb "#d62728" title sprintf("calibrated peak and bandwidth (%.0f GFLOP/s, %.1f GB/s)", $fit_peak, $fit_bw), \
     "$tmp/decode.tsv" using 1:2 with points pt 7 ps 1.2 lc rgb "#1f77b4" title "decode steps", \
     "$tmp/decode.tsv" using 1:2:4 with labels offset 0,-0.9 font ",9" notitle, \
     "$tmp/prefill.tsv" using 1:2 with points pt 5 ps 1.2 lc rgb "#2ca02c" title "prefill chunks", \
     "$tmp/prefill.tsv" using 1:2:4 with labels offset 0,0.9 font ",9" notitle, \
     "$tmp/mixed.tsv" using 1:2 with points pt 9 ps 1.4 lc rgb "#ff7f0e" title "decodes + a prefill chunk", \
     "$tmp/mixed.tsv" using 1:2:4 with labels offset 0,0.9 font ",9" notitle
EOF
echo "wrote $out"
