// SPDX-License-Identifier: MIT
// Prepacking benchmarks.
//
// Packers: FFD / BFD / next-fit / online first-fit on 1e5 and 1e6 lognormal
// item sizes (median 60, p99 1000, capped at the capacity 2048), with the
// naive O(n * bins) first-fit-decreasing scan in the same binary as the
// baseline. Counters: items/s, bins / lower bound, fill ratio.
//
// Prefill on stories260K: padded, length-sorted and prepacked batching of
// the same prompts for uniform[8, 512], lognormal (median 60, p99 1000,
// capped at 2048), constant (128) lengths and a mixed set (uniform[8, 64]
// with 1 prompt in 16 at 512 tokens: padding ratio ~8). BM_prefill/<method>/<dist>
// times one method (counters: real tokens/s, useful GFLOP/s and its fraction
// of the one-core FMA peak from bench/roofline.hpp, padding ratio);
// BM_prefill_compare/<dist> times all three in every iteration (process CPU
// time, steady on a shared machine) and reports the speedups of prepacking
// as counters, so the ratios come from one run.
//
// LLMKIT_BENCH_SMOKE=1 shrinks every size so the smoke run takes seconds.
#include <benchmark/benchmark.h>

#include <llmkit/kv/paged_cache.hpp>
#include <llmkit/model/batch.hpp>
#include <llmkit/model/llama.hpp>
#include <llmkit/pack/length_distribution.hpp>
#include <llmkit/pack/packed_batch.hpp>
#include <llmkit/pack/packers.hpp>
#include <llmkit/pack/padded_batch.hpp>
#include <llmkit/pack/prefill.hpp>

#include <ctime>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "reference/pack_reference.hpp"
#include "roofline.hpp"

namespace {

using namespace llmkit::pack;

using llmkit_bench::smoke;

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

// ---- prefill --------------------------------------------------------------

llmkit::model::llama_model& stories() {
  static llmkit::model::llama_model m = llmkit::model::llama_model::load(LLMKIT_DEFAULT_MODEL);
  return m;
}

double cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

enum class method { padded, sorted, prepacked };
constexpr std::size_t padded_batch_size = 16;

struct workload {
  std::vector<std::vector<std::int32_t>> prompts;
  std::vector<std::size_t> lengths;
  std::size_t real_tokens = 0;
  double useful_flops = 0;  // matmuls and causal attention of the real tokens only
};

workload make_workload(length_shape shape) {
  const std::size_t n = smoke() ? 8 : 64;
  const length_distribution d{.shape = shape, .min_length = 8, .max_length = smoke() ? 64u : 512u, .median = 60,
                              .p99 = 1000, .constant = smoke() ? 32u : 128u, .long_fraction = 1.0 / 16.0,
                              .short_max = smoke() ? 16u : 64u};
  length_distribution capped = d;
  if (shape == length_shape::lognormal) capped.max_length = smoke() ? 128 : 2048;
  workload w;
  w.lengths = sample_lengths(capped, n, 2404);
  std::mt19937_64 rng(7);
  const auto& c = stories().config();
  const double qd = double(c.n_heads * c.head_dim), kvd = double(c.n_kv_heads * c.head_dim);
  const double matmul_per_token = 2.0 * c.n_layers * (c.dim * (qd + 2 * kvd) + qd * c.dim + 3.0 * c.dim * c.ffn_dim);
  for (std::size_t l : w.lengths) {
    std::vector<std::int32_t> p(l);
    p[0] = 1;
    for (std::size_t t = 1; t < l; ++t) p[t] = static_cast<std::int32_t>(3 + rng() % (c.n_vocab - 3));
    w.prompts.push_back(std::move(p));
    w.real_tokens += l;
    w.useful_flops += matmul_per_token * double(l) + 2.0 * c.dim * c.n_vocab;            // + last-token logits
    w.useful_flops += 4.0 * c.n_layers * qd * (double(l) * double(l + 1) / 2.0);        // QK^T and PV, causal
  }
  return w;
}

const workload& get_workload(length_shape shape) {
  static std::vector<std::pair<length_shape, workload>> cache;
  for (const auto& [s, w] : cache)
    if (s == shape) return w;
  cache.emplace_back(shape, make_workload(shape));
  return cache.back().second;
}

template <class Row>
double run_rows(const std::vector<Row>& rows, std::size_t n_requests) {
  auto& model = stories();
  std::size_t slots = 0;
  for (const auto& r : rows) slots += r.token_ids.size();
  llmkit::kv::paged_cache<float, 16> cache(model.kv_shape(), {.n_blocks = slots / 16 + 2 * n_requests + 8,
                                                               .max_sequences = n_requests});
  for (std::size_t q = 0; q < n_requests; ++q) (void)cache.add_sequence();
  std::vector<float> logits(n_requests * model.vocab_size());
  auto forward = [&](const Row& row) {
    return model.forward(llmkit::model::batch{row.token_ids, row.positions, row.seq_ids, row.logit_rows}, cache);
  };
  const double start = cpu_seconds();
  run_prefill(std::span<const Row>(rows), forward,
              llmkit::matrix_view<float>(logits.data(), n_requests, model.vocab_size()));
  const double seconds = cpu_seconds() - start;
  benchmark::DoNotOptimize(logits.data());
  return seconds;
}

// Runs one method on the workload; returns CPU seconds (batching included) and the slot count.
std::pair<double, std::size_t> run_method(method m, const workload& w) {
  if (m == method::prepacked) {
    const double start = cpu_seconds();
    std::size_t peak = 0;
    for (const auto& b : make_padded_batches(w.prompts, padded_batch_size, batch_order::request))
      peak = std::max(peak, b.n_slots());  // same activation budget as the padded baseline
    const auto batch = build_packed_batch(
        w.prompts, first_fit_decreasing(w.lengths, {.capacity = peak, .split_oversized = true}));
    const double prep = cpu_seconds() - start;
    return {prep + run_rows(batch.rows, w.prompts.size()), batch.n_tokens};
  }
  const auto batches = make_padded_batches(w.prompts, padded_batch_size,
                                           m == method::padded ? batch_order::request : batch_order::by_length);
  std::size_t slots = 0;
  for (const auto& b : batches) slots += b.n_slots();
  return {run_rows(batches, w.prompts.size()), slots};
}

void BM_prefill(benchmark::State& state, method m, length_shape shape) {
  const workload& w = get_workload(shape);
  const auto& roof = llmkit_bench::roofline::get();
  double seconds = 0;
  std::size_t slots = 0;
  for (auto _ : state) {
    const auto [s, n] = run_method(m, w);
    state.SetIterationTime(s);
    seconds += s;
    slots = n;
  }
  const double iters = double(state.iterations());
  state.counters["real_tokens_per_s"] = double(w.real_tokens) * iters / seconds;
  state.counters["useful_gflops"] = w.useful_flops * iters / seconds * 1e-9;
  state.counters["roof_frac"] = w.useful_flops * iters / seconds * 1e-9 / roof.fma_gflops_1t;
  state.counters["padding_ratio"] = double(slots) / double(w.real_tokens);
}

void BM_prefill_compare(benchmark::State& state, length_shape shape) {
  const workload& w = get_workload(shape);
  double t[3] = {0, 0, 0};
  std::size_t slots[3] = {0, 0, 0};
  for (auto _ : state) {
    double total = 0;
    for (int k = 0; k < 3; ++k) {
      const auto [s, n] = run_method(static_cast<method>(k), w);
      t[k] += s;
      slots[k] = n;
      total += s;
    }
    state.SetIterationTime(total);
  }
  state.counters["padding_ratio"] = double(slots[0]) / double(w.real_tokens);
  state.counters["padding_ratio_sorted"] = double(slots[1]) / double(w.real_tokens);
  state.counters["speedup_vs_padded"] = t[0] / t[2];
  state.counters["speedup_vs_sorted"] = t[1] / t[2];
  state.counters["goal_frac"] = (t[0] / t[2]) / (0.85 * double(slots[0]) / double(w.real_tokens));
}

#define LLMKIT_PREFILL_BENCH(dist)                                                                           \
  BENCHMARK_CAPTURE(BM_prefill, padded_##dist, method::padded, length_shape::dist)->UseManualTime()->Unit(benchmark::kMillisecond); \
  BENCHMARK_CAPTURE(BM_prefill, sorted_##dist, method::sorted, length_shape::dist)->UseManualTime()->Unit(benchmark::kMillisecond); \
  BENCHMARK_CAPTURE(BM_prefill, prepacked_##dist, method::prepacked, length_shape::dist)->UseManualTime()->Unit(benchmark::kMillisecond); \
  BENCHMARK_CAPTURE(BM_prefill_compare, dist, length_shape::dist)->UseManualTime()->Unit(benchmark::kMillisecond)

LLMKIT_PREFILL_BENCH(uniform);
LLMKIT_PREFILL_BENCH(lognormal);
LLMKIT_PREFILL_BENCH(constant);
LLMKIT_PREFILL_BENCH(mixed);

}  // namespace

BENCHMARK_MAIN();
