// SPDX-License-Identifier: MIT
// bench_kv: KV-cache costs.
//
// - append/<cache>/<dtype>: grow + store of 64-token chunks (every layer)
//   into a cache far larger than the last-level cache, so writes go to DRAM.
//   bytes_per_second counts the f32 rows read plus the storage rows written
//   (the traffic an append must move); frac_read_bw sets it against the
//   one-core sustained read bandwidth of bench/roofline.hpp (a mixed
//   read/write stream, so read bandwidth is an upper reference, not a hard
//   roof). append_naive/<dtype> is the same traffic with plain scalar loops
//   into a flat buffer: the baseline for the ratio.
// - fork/paged/<tokens> vs fork/contiguous/<tokens>: fork + free of a
//   sequence of that many tokens. Paged cost grows with the block table
//   only (ns per block reported); contiguous copies every row.
// - memory/<workload>: bytes a workload of sequences keeps reserved in a
//   contiguous cache (max_tokens each) and a paged one (whole blocks, shared
//   prefixes counted once), over the bytes the tokens need. No timing.
// - memory/window/<cache>: resident KV bytes of one 8192-token sequence of
//   Gemma 3 1B's shape (26 layers, 1 KV head of 256, f16; 22 local layers
//   with a window of 512, prefill in 512-token chunks) when every layer keeps
//   its history (full_bytes) and when the local layers keep a ring
//   (model::window_cache / paged_window_cache, window_bytes). No timing.
//
// LLMKIT_BENCH_SMOKE=1 shrinks sizes so the smoke run takes seconds.

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <llmkit/core/aligned_buffer.hpp>
#include <llmkit/core/dtype.hpp>
#include <llmkit/kv/contiguous_cache.hpp>
#include <llmkit/kv/paged_cache.hpp>
#include <llmkit/model/window_cache.hpp>

#include "roofline.hpp"

namespace {

using namespace llmkit;
using namespace llmkit::kv;

using llmkit_bench::smoke;

constexpr std::size_t chunk_tokens = 64;
constexpr std::size_t block = 16;
const kv_shape append_shape{4, 8, 128};  // 4 layers, 8 KV heads, head_dim 128

/// Tokens the append caches hold: 1 GiB of f32 KV, twice this machine's
/// 480 MiB L3, so the writes really go to DRAM (8 MiB when smoke).
std::size_t append_capacity() {
  const std::size_t bytes = smoke() ? (std::size_t{8} << 20) : (std::size_t{1} << 30);
  return bytes / kv_bytes_per_token<float>(append_shape.n_layers, append_shape.n_kv_heads, append_shape.head_dim) /
         chunk_tokens * chunk_tokens;
}

std::vector<float> random_rows(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  std::vector<float> out(n);
  for (auto& x : out) x = u(rng);
  return out;
}

/// CPU seconds of the calling thread over the timed loop (what Google
/// Benchmark's rates use too, and what bench/roofline.hpp measures against:
/// other processes time-slicing the shared cores do not count).
struct loop_timer {
  double start = llmkit_bench::thread_cpu_seconds();
  double seconds() const { return llmkit_bench::thread_cpu_seconds() - start; }
};

void set_append_counters(benchmark::State& state, std::size_t bytes_per_token_stored, double seconds) {
  const double row_f32 = static_cast<double>(append_shape.n_layers * 2 * append_shape.n_kv_heads * append_shape.head_dim * 4);
  const double per_iter = static_cast<double>(chunk_tokens) * (row_f32 + static_cast<double>(bytes_per_token_stored));
  const double bytes = per_iter * static_cast<double>(state.iterations());
  state.SetBytesProcessed(static_cast<std::int64_t>(bytes));
  state.counters["tokens_per_second"] =
      benchmark::Counter(static_cast<double>(chunk_tokens * state.iterations()), benchmark::Counter::kIsRate);
  state.counters["frac_read_bw"] = bytes / seconds / 1e9 / llmkit_bench::roofline::get().read_gbps_1t;
}

template <class Cache>
void run_append(benchmark::State& state, Cache& cache) {
  const std::size_t row = append_shape.n_kv_heads * append_shape.head_dim;
  const auto k = random_rows(chunk_tokens * row, 1), v = random_rows(chunk_tokens * row, 2);
  const seq_id s = *cache.add_sequence();
  const std::size_t capacity = append_capacity();
  // Touch the whole cache once so page faults are not timed.
  while (cache.n_tokens(s) + chunk_tokens <= capacity) cache.grow(s, chunk_tokens);
  for (std::size_t layer = 0; layer < append_shape.n_layers; ++layer)
    for (std::size_t t = 0; t + chunk_tokens <= capacity; t += chunk_tokens) cache.store(s, layer, t, k, v);
  cache.truncate(s, 0);
  loop_timer timer;
  for (auto _ : state) {
    if (cache.n_tokens(s) + chunk_tokens > capacity) cache.truncate(s, 0);
    const std::size_t first = cache.n_tokens(s);
    if (!cache.grow(s, chunk_tokens)) state.SkipWithError("grow failed");
    for (std::size_t layer = 0; layer < append_shape.n_layers; ++layer) cache.store(s, layer, first, k, v);
    benchmark::ClobberMemory();
  }
  set_append_counters(state, cache.bytes_per_token(), timer.seconds());
}

template <class T>
void bm_append_paged(benchmark::State& state) {
  paged_cache<T, block> cache(append_shape, {.n_blocks = append_capacity() / block});
  run_append(state, cache);
}

template <class T>
void bm_append_contiguous(benchmark::State& state) {
  contiguous_cache<T> cache(append_shape, {.max_sequences = 1, .max_tokens = append_capacity()});
  run_append(state, cache);
}

/// Naive baseline: the same rows converted with plain scalar loops into a
/// flat [tokens][layer][kv][head][dim] buffer (int8: scale per row).
template <class T>
void bm_append_naive(benchmark::State& state) {
  const std::size_t row = append_shape.n_kv_heads * append_shape.head_dim, d = append_shape.head_dim;
  const auto k = random_rows(chunk_tokens * row, 1), v = random_rows(chunk_tokens * row, 2);
  const std::size_t capacity = append_capacity();
  const std::size_t per_token = append_shape.n_layers * 2 * row;
  aligned_vector<T> data(capacity * per_token);
  aligned_vector<float> scales(capacity * append_shape.n_layers * 2 * append_shape.n_kv_heads);
  std::size_t pos = 0;
  loop_timer timer;
  for (auto _ : state) {
    if (pos + chunk_tokens > capacity) pos = 0;
    for (std::size_t layer = 0; layer < append_shape.n_layers; ++layer)
      for (std::size_t t = 0; t < chunk_tokens; ++t)
        for (int which = 0; which < 2; ++which) {
          const float* src = (which == 0 ? k.data() : v.data()) + t * row;
          T* dst = data.data() + (pos + t) * per_token + (layer * 2 + static_cast<std::size_t>(which)) * row;
          for (std::size_t h = 0; h < append_shape.n_kv_heads; ++h) {
            if constexpr (std::is_same_v<T, float>) {
              for (std::size_t i = 0; i < d; ++i) dst[h * d + i] = src[h * d + i];
            } else if constexpr (std::is_same_v<T, f16>) {
              for (std::size_t i = 0; i < d; ++i) dst[h * d + i] = to_f16(src[h * d + i]);
            } else if constexpr (std::is_same_v<T, bf16>) {
              for (std::size_t i = 0; i < d; ++i) dst[h * d + i] = to_bf16(src[h * d + i]);
            } else {
              float amax = 0.0f;
              for (std::size_t i = 0; i < d; ++i) amax = std::max(amax, std::fabs(src[h * d + i]));
              const float scale = amax / 127.0f, inv = scale != 0.0f ? 1.0f / scale : 0.0f;
              for (std::size_t i = 0; i < d; ++i)
                dst[h * d + i] = static_cast<std::int8_t>(std::lround(src[h * d + i] * inv));
              scales[((pos + t) * append_shape.n_layers * 2 + layer * 2 + static_cast<std::size_t>(which)) *
                         append_shape.n_kv_heads +
                     h] = scale;
            }
          }
        }
    pos += chunk_tokens;
    benchmark::DoNotOptimize(data.data());
    benchmark::ClobberMemory();
  }
  set_append_counters(state, kv_bytes_per_token<T>(append_shape.n_layers, append_shape.n_kv_heads, append_shape.head_dim),
                      timer.seconds());
}

// Fork: a small shape so long contiguous sequences fit in memory.
const kv_shape fork_shape{2, 2, 64};

void bm_fork_paged(benchmark::State& state) {
  const auto n_tokens = static_cast<std::size_t>(state.range(0));
  paged_cache<f16, block> cache(fork_shape, {.n_blocks = n_tokens / block + 2});
  const seq_id s = *cache.add_sequence();
  cache.grow(s, n_tokens);
  loop_timer timer;
  for (auto _ : state) {
    const auto child = cache.fork(s);
    cache.free(*child);
  }
  const double seconds = timer.seconds();
  state.counters["blocks"] = static_cast<double>(cache.n_chunks(s));
  state.counters["ns_per_block"] =
      seconds * 1e9 / static_cast<double>(state.iterations()) / static_cast<double>(cache.n_chunks(s));
}

void bm_fork_contiguous(benchmark::State& state) {
  const auto n_tokens = static_cast<std::size_t>(state.range(0));
  contiguous_cache<f16> cache(fork_shape, {.max_sequences = 2, .max_tokens = n_tokens});
  const seq_id s = *cache.add_sequence();
  cache.grow(s, n_tokens);
  for (auto _ : state) {
    const auto child = cache.fork(s);
    cache.free(*child);
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * n_tokens * cache.bytes_per_token()));
}

/// Memory workloads (no timing), run through the real caches' usage():
/// reserved bytes over the bytes the tokens need. Bytes scale linearly with
/// bytes_per_token, so a tiny shape gives the same ratios as a 7B model's.
void bm_memory(benchmark::State& state) {
  const int workload = static_cast<int>(state.range(0));
  const kv_shape shape{1, 1, 8};
  const std::size_t max_tokens = 4096;
  std::mt19937 rng(7);
  contiguous_cache<f16> contiguous(shape, {.max_sequences = 64, .max_tokens = max_tokens});
  paged_cache<f16, block> paged(shape, {.n_blocks = 64 * max_tokens / block});
  if (workload == 0) {  // 64 chats with lengths uniform in [1, 4096]
    for (int i = 0; i < 64; ++i) {
      const std::size_t len = std::uniform_int_distribution<std::size_t>(1, max_tokens)(rng);
      contiguous.grow(*contiguous.add_sequence(), len);
      paged.grow(*paged.add_sequence(), len);
    }
  } else {  // beam search: 8 beams forked from a 2000-token prompt, each 100 tokens on
    const seq_id c0 = *contiguous.add_sequence(), p0 = *paged.add_sequence();
    contiguous.grow(c0, 2000);
    paged.grow(p0, 2000);
    std::vector<seq_id> cs{c0}, ps{p0};
    for (int i = 1; i < 8; ++i) {
      cs.push_back(*contiguous.fork(c0));
      ps.push_back(*paged.fork(p0));
    }
    for (int t = 0; t < 100; ++t)
      for (int i = 0; i < 8; ++i) {
        contiguous.grow(cs[static_cast<std::size_t>(i)], 1);
        paged.grow(ps[static_cast<std::size_t>(i)], 1);
      }
  }
  for (auto _ : state) benchmark::DoNotOptimize(paged.usage());
  const cache_usage c = contiguous.usage(), p = paged.usage();
  state.counters["contiguous_over_tokens"] = static_cast<double>(c.bytes_in_use) / static_cast<double>(c.token_bytes);
  state.counters["paged_over_tokens"] = static_cast<double>(p.bytes_in_use) / static_cast<double>(p.token_bytes);
  state.counters["contiguous_over_paged"] = static_cast<double>(c.bytes_in_use) / static_cast<double>(p.bytes_in_use);
}

/// One long sequence of Gemma 3 1B's shape: every layer's history vs the
/// local layers in rings (range 0: contiguous global layers, 1: paged).
void bm_memory_window(benchmark::State& state) {
  const kv_shape shape{26, 1, 256};
  const std::size_t context = smoke() ? 2048 : 8192, chunk = 512;
  std::vector<std::uint8_t> local(shape.n_layers);
  for (std::size_t l = 0; l < local.size(); ++l) local[l] = (l + 1) % 6 != 0;  // 5 local, then 1 global
  const sliding_window_options ring{.window = 512, .max_grow = chunk, .align = llmkit::model::local_ring_align};
  auto fill = [&](auto& cache) {
    const seq_id s = *cache.add_sequence();
    for (std::size_t n = 0; n < context; n += chunk) cache.grow(s, chunk);
    return cache.usage().bytes_in_use;
  };
  std::size_t full_bytes = 0, window_bytes = 0;
  if (state.range(0) == 0) {
    contiguous_cache<f16> full(shape, {.max_tokens = context});
    hybrid_cache<contiguous_cache<f16>, sliding_window_cache<f16>> window(shape, local,
                                                                          contiguous_cache_options{.max_tokens = context}, ring);
    full_bytes = fill(full);
    window_bytes = fill(window);
  } else {
    paged_cache<f16, block> full(shape, {.n_blocks = context / block});
    hybrid_cache<paged_cache<f16, block>, sliding_window_cache<f16>> window(
        shape, local, paged_cache_options{.n_blocks = context / block}, ring);
    full_bytes = fill(full);
    window_bytes = fill(window);
  }
  for (auto _ : state) benchmark::DoNotOptimize(window_bytes);
  state.counters["context"] = static_cast<double>(context);
  state.counters["full_bytes"] = static_cast<double>(full_bytes);
  state.counters["window_bytes"] = static_cast<double>(window_bytes);
  state.counters["full_over_window"] = static_cast<double>(full_bytes) / static_cast<double>(window_bytes);
}

std::vector<std::int64_t> fork_lengths() {
  if (smoke()) return {64, 1024};
  return {64, 1024, 16384, 131072};
}

const bool registered = [] {
  benchmark::RegisterBenchmark("append/paged/f32", bm_append_paged<float>);
  benchmark::RegisterBenchmark("append/paged/f16", bm_append_paged<f16>);
  benchmark::RegisterBenchmark("append/paged/bf16", bm_append_paged<bf16>);
  benchmark::RegisterBenchmark("append/paged/i8", bm_append_paged<std::int8_t>);
  benchmark::RegisterBenchmark("append/contiguous/f32", bm_append_contiguous<float>);
  benchmark::RegisterBenchmark("append/contiguous/f16", bm_append_contiguous<f16>);
  benchmark::RegisterBenchmark("append/contiguous/bf16", bm_append_contiguous<bf16>);
  benchmark::RegisterBenchmark("append/contiguous/i8", bm_append_contiguous<std::int8_t>);
  benchmark::RegisterBenchmark("append_naive/f32", bm_append_naive<float>);
  benchmark::RegisterBenchmark("append_naive/f16", bm_append_naive<f16>);
  benchmark::RegisterBenchmark("append_naive/bf16", bm_append_naive<bf16>);
  benchmark::RegisterBenchmark("append_naive/i8", bm_append_naive<std::int8_t>);
  for (auto n : fork_lengths()) {
    benchmark::RegisterBenchmark("fork/paged", bm_fork_paged)->Arg(n);
    if (n <= 16384) benchmark::RegisterBenchmark("fork/contiguous", bm_fork_contiguous)->Arg(n);
  }
  benchmark::RegisterBenchmark("memory/chats64", bm_memory)->Arg(0)->Iterations(1);
  benchmark::RegisterBenchmark("memory/beam8", bm_memory)->Arg(1)->Iterations(1);
  benchmark::RegisterBenchmark("memory/window/contiguous", bm_memory_window)->Arg(0)->Iterations(1);
  benchmark::RegisterBenchmark("memory/window/paged", bm_memory_window)->Arg(1)->Iterations(1);
  return true;
}();

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  llmkit_bench::add_roofline_context();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
