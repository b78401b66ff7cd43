// SPDX-License-Identifier: MIT
// Prepacking benchmarks.
//
// Packers: FFD / BFD / next-fit / online first-fit on 1e5 and 1e6 lognormal
// item sizes (median 60, p99 1000, capped at the capacity 2048), with the
// naive O(n * bins) first-fit-decreasing scan in the same binary as the
// baseline. Counters: items/s, bins / lower bound, fill ratio.
//
// LLMKIT_BENCH_SMOKE=1 shrinks every size so the smoke run takes seconds.
#include <benchmark/benchmark.h>

#include <llmkit/pack/length_distribution.hpp>
#include <llmkit/pack/packers.hpp>

#include <cstdlib>
#include <string>
#include <vector>

#include "reference/pack_reference.hpp"

namespace {

using namespace llmkit::pack;

bool smoke() {
  const char* v = std::getenv("LLMKIT_BENCH_SMOKE");
  return v != nullptr && std::string(v) != "0";
}

constexpr std::size_t packer_capacity = 2048;

const std::vector<std::size_t>& chat_sizes(std::size_t n) {
  static std::vector<std::size_t> cache;
  static std::size_t cached_n = 0;
  if (cached_n != n) {
    cache = sample_lengths({.shape = length_shape::lognormal, .min_length = 1, .max_length = packer_capacity,
                            .median = 60, .p99 = 1000},
                           n, 2404);
    cached_n = n;
  }
  return cache;
}

std::size_t scaled(std::size_t n) { return smoke() ? std::min<std::size_t>(n, 10000) : n; }

void packer_counters(benchmark::State& state, const packing& result, std::size_t n) {
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * n));
  state.counters["bins_over_bound"] = double(result.n_bins()) / double(result.lower_bound());
  state.counters["fill_ratio"] = result.fill_ratio();
  state.counters["n_items"] = double(n);
}

void BM_pack(benchmark::State& state, packer p) {
  const std::size_t n = scaled(static_cast<std::size_t>(state.range(0)));
  const auto& sizes = chat_sizes(n);
  packing result;
  for (auto _ : state) {
    result = pack_items(sizes, p, {.capacity = packer_capacity});
    benchmark::DoNotOptimize(result);
  }
  packer_counters(state, result, n);
}

// The naive baseline: first-fit decreasing by scanning every bin.
void BM_pack_naive_ffd(benchmark::State& state) {
  const std::size_t n = scaled(static_cast<std::size_t>(state.range(0)));
  const auto& sizes = chat_sizes(n);
  std::size_t n_bins = 0;
  for (auto _ : state) {
    const auto bins = pack_reference::first_fit(sizes, pack_reference::decreasing(sizes), packer_capacity);
    n_bins = bins.size();
    benchmark::DoNotOptimize(n_bins);
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * n));
  std::size_t total = 0;
  for (std::size_t s : sizes) total += s;
  state.counters["bins_over_bound"] = double(n_bins) / double((total + packer_capacity - 1) / packer_capacity);
  state.counters["n_items"] = double(n);
}

BENCHMARK_CAPTURE(BM_pack, ffd, packer::first_fit_decreasing)->Arg(100000)->Arg(1000000)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_pack, bfd, packer::best_fit_decreasing)->Arg(100000)->Arg(1000000)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_pack, next_fit, packer::next_fit)->Arg(100000)->Arg(1000000)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_pack, online_ff, packer::online_first_fit)->Arg(100000)->Arg(1000000)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_pack_naive_ffd)->Arg(100000)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
