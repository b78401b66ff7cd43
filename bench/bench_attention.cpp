// SPDX-License-Identifier: MIT
// bench_attention: masked attention kernels against the roofline.
//
// - decode/<dtype>/ctx:<C>/batch:<B>/threads:<T>: one decode step, 32 query
//   heads, 8 KV heads (GQA 4), head_dim 128, B sequences of C tokens in a
//   contiguous cache; contexts 512, 2048, 8192, 32768, batch 1 and 16,
//   f32/f16/bf16/int8 KV, 1, 2, 4, ... threads (decode/int8_q8: int8 KV with
//   decode_params::int8_queries; decode/bf16_qbf16: bf16 KV with
//   decode_params::bf16_queries; decode/bf16_qpbf16: with bf16_queries and
//   bf16_probabilities; decode/int8_q8p8: with int8_queries and
//   int8_probabilities). Enough distinct KV sets (cache
//   layers, one per call, rotated) that the calls between two reads of a set
//   stream >= 1 GiB, over twice the 480 MiB L3, so reads come from DRAM (a
//   set of >= 1 GiB is its own rotation). Counters, all plain numbers
//   computed from this bench's own timing of the calls (thread CPU time
//   with one thread, so other processes time-slicing the core do not count;
//   wall time with more):
//     kv_GBps       K/V bytes one step must read (rows + int8 scales), GB/s;
//     frac_read_bw  kv_GBps / bench_roofline's sustained read bandwidth for
//                   the same thread count (roofline::read_gbps);
//     roof_read_GBps that bandwidth;
//     live_read_GBps the read bandwidth measured again after every call
//                   (bench_roofline's read loop over the K/V rows of the
//                   set half a rotation away, same thread count, untimed),
//                   the median of those probes;
//     frac_live_read the median over the calls of the call's rate over the
//                   probe right after it: the fraction that moves least
//                   when the machine's memory does;
//     kv_sets the rotation; thp the fraction of the process's anonymous
//                   memory in huge pages.
// - decode_naive/...: the same step with Eigen products, materialised
//   scores and a separate softmax (K/V converted to f32 matrices first for
//   the 16-bit and int8 types), one thread: the baseline, same counters.
//
// Prefill is measured by bench_prefill (same cases, one place).
//
// Timing: one-thread runs are timed in the main thread's CPU time (as
// bench_roofline measures its limits), so other processes time-slicing the
// core do not count against the kernel; two-thread runs use wall time.
//
// LLMKIT_BENCH_SMOKE=1 shrinks sizes so the smoke run takes seconds;
// LLMKIT_DECODE_PREFETCH_BYTES=N sets how far ahead decode prefetches K/V
// (bytes per stream, 0 = off; unset = the default for this CPU's vendor)
// for tuning;
// LLMKIT_DECODE_AMX=0 runs int8 decode on the VNNI kernel where the AMX one
// would run (an A/B in one binary).

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <llmkit/attention/decode.hpp>
#include <llmkit/core/dtype.hpp>
#include <llmkit/core/executor.hpp>
#include <llmkit/simd/detail/diagnostics.hpp>
#include <llmkit/kv/contiguous_cache.hpp>

#include "roofline.hpp"

// GCC 12 false positives in Eigen's AVX-512 kernels (see diagnostics.hpp):
// Eigen is included inside the bracket, so its inlined code is covered.
LLMKIT_SIMD_DIAGNOSTICS_BEGIN
#include <Eigen/Dense>

namespace {

using namespace llmkit;

using llmkit_bench::smoke;

constexpr std::size_t n_heads = 32, n_kv_heads = 8, head_dim = 128;

template <class T>
const char* dtype_label() {
  if constexpr (std::is_same_v<T, float>) return "f32";
  else if constexpr (std::is_same_v<T, f16>) return "f16";
  else if constexpr (std::is_same_v<T, bf16>) return "bf16";
  else return "int8";
}

template <class T>
std::size_t kv_row_bytes() {  // K + V of one token and KV head
  return 2 * (head_dim * sizeof(T) + (std::is_same_v<T, std::int8_t> ? sizeof(float) : 0));
}

/// B sequences of C tokens, in n_sets layers of a contiguous cache.
template <class T>
struct kv_sets {
  std::unique_ptr<kv::contiguous_cache<T>> cache;
  std::vector<kv::seq_id> ids;
  std::size_t n_sets = 0;

  kv_sets(std::size_t context, std::size_t batch, std::size_t sets) : n_sets(sets) {
    cache = std::make_unique<kv::contiguous_cache<T>>(kv::kv_shape{sets, n_kv_heads, head_dim},
                                                      kv::contiguous_cache_options{batch, context});
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    const std::size_t step = std::min<std::size_t>(context, 256);
    std::vector<float> k(step * n_kv_heads * head_dim), v(k.size());
    for (auto& x : k) x = u(rng);
    for (auto& x : v) x = u(rng);
    for (std::size_t b = 0; b < batch; ++b) {
      const kv::seq_id s = *cache->add_sequence();
      ids.push_back(s);
      cache->grow(s, context);
      for (std::size_t layer = 0; layer < sets; ++layer)
        for (std::size_t t = 0; t < context; t += step) {
          const std::size_t n = std::min(step, context - t) * n_kv_heads * head_dim;
          cache->store(s, layer, t, std::span<const float>(k).first(n), std::span<const float>(v).first(n));
        }
    }
  }
};

/// The KV sets of the last (dtype, context, batch) asked for; the previous
/// ones are freed first so only one working set is alive.
template <class T>
kv_sets<T>& sets_for(std::size_t context, std::size_t batch) {
  static std::unique_ptr<kv_sets<T>> current;
  static std::size_t key_context = 0, key_batch = 0;
  if (!current || key_context != context || key_batch != batch) {
    current.reset();
    const std::size_t set_bytes = context * batch * n_kv_heads * kv_row_bytes<T>();
    const std::size_t target = smoke() ? (std::size_t{8} << 20) : (std::size_t{1} << 30);
    const std::size_t n_sets = std::clamp<std::size_t>((target + set_bytes - 1) / set_bytes, 1, 512);
    current = std::make_unique<kv_sets<T>>(context, batch, n_sets);
    key_context = context;
    key_batch = batch;
  }
  return *current;
}

// ---------------------------------------------------------------- decode

/// Fraction of the process's anonymous memory in transparent huge pages
/// (Linux; 0 when unknown): the KV sets dominate it.
double huge_page_fraction() {
  std::FILE* f = std::fopen("/proc/self/smaps_rollup", "r");
  if (f == nullptr) return 0.0;
  char line[256];
  double anon = 0.0, huge = 0.0;
  while (std::fgets(line, sizeof line, f) != nullptr) {
    double kb = 0.0;
    if (std::sscanf(line, "Anonymous: %lf kB", &kb) == 1) anon = kb;
    if (std::sscanf(line, "AnonHugePages: %lf kB", &kb) == 1) huge = kb;
  }
  std::fclose(f);
  return anon > 0.0 ? huge / anon : 0.0;
}

/// Times one call: thread CPU time with one thread, wall time with more.
struct call_timer {
  bool wall;
  double total = 0.0;
  static double wall_seconds() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  }
  double now() const { return wall ? wall_seconds() : llmkit_bench::thread_cpu_seconds(); }
};

/// The read bandwidth measured again after every decode call, outside its
/// timing (`llmkit_bench::live_ratio`): bench_roofline's read loop over the
/// K and V rows of one KV set, on the call's thread count. It reads the set
/// half a rotation away from the one just decoded, so its rows come from
/// DRAM and are not left in cache for the kernel's next calls.
class live_read {
 public:
  /// Reads the set half a rotation from `layer` and records `call_gbps`
  /// (the decode call just made) against the probe's rate.
  template <class T>
  void probe(const kv_sets<T>& kv, std::size_t layer, std::size_t threads, double call_gbps) {
    const std::size_t set = (layer + kv.n_sets / 2) % kv.n_sets;
    streams_.clear();
    for (const kv::seq_id s : kv.ids)
      for (std::size_t h = 0; h < n_kv_heads; ++h) {
        const auto c = kv.cache->chunk(s, set, h, 0);
        const std::size_t n_floats = c.n_tokens * c.row_stride * sizeof(T) / sizeof(float);
        streams_.emplace_back(reinterpret_cast<const float*>(c.k), n_floats);
        streams_.emplace_back(reinterpret_cast<const float*>(c.v), n_floats);
      }
    // Plain and prefetching passes alternate, as in bench_roofline.
    const bool prefetch = ratio_.size() % 2 == 1;
    ratio_.add(call_gbps, llmkit_bench::read_spans_gbps(streams_, static_cast<unsigned>(threads), prefetch));
  }
  /// Median of the probes' rates (GB/s).
  double gbps() const { return ratio_.probe_median(); }
  /// Median over the calls of the call's rate over the next probe's.
  double fraction() const { return ratio_.ratio_median(); }

 private:
  std::vector<llmkit_bench::read_span> streams_;  // each K or V stream of the set
  llmkit_bench::live_ratio ratio_;
};

/// The decode counters of a run that read `bytes` per call in `seconds`.
void decode_counters(benchmark::State& state, double bytes_per_call, double seconds, std::size_t threads,
                     std::size_t n_sets, const live_read& live) {
  const auto& roof = llmkit_bench::roofline::get();
  const double roof_gbps = roof.read_gbps(threads);
  const double gbps = bytes_per_call * static_cast<double>(state.iterations()) / seconds * 1e-9;
  state.counters["kv_GBps"] = gbps;
  state.counters["frac_read_bw"] = gbps / roof_gbps;
  state.counters["roof_read_GBps"] = roof_gbps;
  state.counters["live_read_GBps"] = live.gbps();
  state.counters["frac_live_read"] = live.fraction();
  state.counters["kv_sets"] = static_cast<double>(n_sets);
  state.counters["thp"] = huge_page_fraction();
}

template <class T>
double decode_bytes(std::size_t context, std::size_t batch) {
  return static_cast<double>(context * batch * n_kv_heads * kv_row_bytes<T>());
}

/// The decode tuning of every call: the defaults, or what
/// LLMKIT_DECODE_PREFETCH_BYTES and LLMKIT_DECODE_AMX ask for.
const attention::decode_tuning& bench_tuning() {
  static const attention::decode_tuning tuning = [] {
    attention::decode_tuning t;
    if (const char* env = std::getenv("LLMKIT_DECODE_PREFETCH_BYTES"); env != nullptr && *env != '\0')
      t.prefetch_bytes = std::strtoull(env, nullptr, 10);
    if (const char* env = std::getenv("LLMKIT_DECODE_AMX"); env != nullptr && std::string(env) == "0")
      t.use_amx = false;
    return t;
  }();
  return tuning;
}

/// RoundQueries: decode_params::int8_queries and bf16_queries (each
/// ignored by the other storage types); RoundProbabilities:
/// bf16_probabilities and int8_probabilities (likewise).
template <class T, bool RoundQueries = false, bool RoundProbabilities = false>
void bm_decode(benchmark::State& state) {
  const auto context = static_cast<std::size_t>(state.range(0));
  const auto batch = static_cast<std::size_t>(state.range(1));
  const auto threads = static_cast<std::size_t>(state.range(2));
  kv_sets<T>& kv = sets_for<T>(context, batch);
  std::mt19937 rng(2);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> q(batch * n_heads * head_dim), out(q.size());
  for (auto& x : q) x = u(rng);
  thread_pool pool(threads);
  attention::decode_workspace ws;
  std::size_t layer = 0;
  call_timer timer{threads > 1};
  live_read live;
  for (auto _ : state) {
    const double start = timer.now();
    attention::decode({.q = q, .out = out, .seq_ids = kv.ids, .layer = layer, .n_heads = n_heads, .workspace = &ws,
                       .int8_queries = RoundQueries, .bf16_queries = RoundQueries,
                       .bf16_probabilities = RoundProbabilities, .int8_probabilities = RoundProbabilities,
                       .tuning = bench_tuning()},
                      *kv.cache, attention::causal_mask{}, pool);
    benchmark::DoNotOptimize(out.data());
    const double seconds = timer.now() - start;
    timer.total += seconds;
    state.SetIterationTime(seconds);
    live.probe(kv, layer, threads, decode_bytes<T>(context, batch) / seconds * 1e-9);
    layer = (layer + 1) % kv.n_sets;
  }
  decode_counters(state, decode_bytes<T>(context, batch), timer.total, threads, kv.n_sets, live);
}

using row_matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

template <class T>
void to_matrix(const T* rows, const float* scales, std::size_t n, row_matrix& m) {
  m.resize(static_cast<Eigen::Index>(n), static_cast<Eigen::Index>(head_dim));
  for (std::size_t t = 0; t < n; ++t)
    for (std::size_t d = 0; d < head_dim; ++d) {
      if constexpr (std::is_same_v<T, std::int8_t>) m(t, d) = static_cast<float>(rows[t * head_dim + d]) * scales[t];
      else m(t, d) = to_f32(rows[t * head_dim + d]);
    }
}

/// out = softmax(q k^T * scale) v with the [group, n] scores materialised.
template <class KMat, class VMat>
void naive_attention(const row_matrix& q, const KMat& k, const VMat& v, float scale, row_matrix& out) {
  row_matrix s_mat = (q * k.transpose()) * scale;
  for (Eigen::Index r = 0; r < s_mat.rows(); ++r) {
    const float m = s_mat.row(r).maxCoeff();
    s_mat.row(r) = (s_mat.row(r).array() - m).exp();
    s_mat.row(r) /= s_mat.row(r).sum();
  }
  out.noalias() = s_mat * v;
}

template <class T>
void bm_decode_naive(benchmark::State& state) {
  const auto context = static_cast<std::size_t>(state.range(0));
  const auto batch = static_cast<std::size_t>(state.range(1));
  kv_sets<T>& kv = sets_for<T>(context, batch);
  row_matrix q(n_heads / n_kv_heads, head_dim), km, vm;
  q.setRandom();
  row_matrix out(n_heads / n_kv_heads, head_dim);
  std::size_t layer = 0;
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  call_timer timer{false};
  live_read live;
  for (auto _ : state) {
    const double start = timer.now();
    for (const kv::seq_id s : kv.ids)
      for (std::size_t h = 0; h < n_kv_heads; ++h) {
        const auto c = kv.cache->chunk(s, layer, h, 0);
        if constexpr (std::is_same_v<T, float>) {
          Eigen::Map<const row_matrix> k(c.k, static_cast<Eigen::Index>(c.n_tokens), head_dim);
          Eigen::Map<const row_matrix> v(c.v, static_cast<Eigen::Index>(c.n_tokens), head_dim);
          naive_attention(q, k, v, scale, out);
        } else {
          to_matrix(c.k, c.k_scale, c.n_tokens, km);
          to_matrix(c.v, c.v_scale, c.n_tokens, vm);
          naive_attention(q, km, vm, scale, out);
        }
        benchmark::DoNotOptimize(out.data());
      }
    const double seconds = timer.now() - start;
    timer.total += seconds;
    state.SetIterationTime(seconds);
    live.probe(kv, layer, 1, decode_bytes<T>(context, batch) / seconds * 1e-9);
    layer = (layer + 1) % kv.n_sets;
  }
  decode_counters(state, decode_bytes<T>(context, batch), timer.total, 1, kv.n_sets, live);
}

template <class T>
void register_decode() {
  const std::vector<std::int64_t> contexts =
      smoke() ? std::vector<std::int64_t>{512} : std::vector<std::int64_t>{512, 2048, 8192, 32768};
  const std::vector<std::int64_t> batches = smoke() ? std::vector<std::int64_t>{1, 2} : std::vector<std::int64_t>{1, 16};
  for (const auto b : batches)
    for (const auto c : contexts) {
      for (const std::int64_t threads : llmkit_bench::thread_counts()) {
        benchmark::RegisterBenchmark((std::string("decode/") + dtype_label<T>()).c_str(), bm_decode<T>)
            ->Args({c, b, threads})
            ->ArgNames({"ctx", "batch", "threads"})
            ->UseManualTime()
            ->Unit(benchmark::kMicrosecond);
        if constexpr (std::is_same_v<T, std::int8_t> || std::is_same_v<T, bf16>)
          benchmark::RegisterBenchmark(std::is_same_v<T, bf16> ? "decode/bf16_qbf16" : "decode/int8_q8",
                                       bm_decode<T, true>)
              ->Args({c, b, threads})
              ->ArgNames({"ctx", "batch", "threads"})
              ->UseManualTime()
              ->Unit(benchmark::kMicrosecond);
        if constexpr (std::is_same_v<T, bf16> || std::is_same_v<T, std::int8_t>)
          benchmark::RegisterBenchmark(std::is_same_v<T, bf16> ? "decode/bf16_qpbf16" : "decode/int8_q8p8",
                                       bm_decode<T, true, true>)
              ->Args({c, b, threads})
              ->ArgNames({"ctx", "batch", "threads"})
              ->UseManualTime()
              ->Unit(benchmark::kMicrosecond);
      }
      // The baseline is slow (it converts every row): up to 8192 x 16 rows.
      if (c * b <= 8192 * 16)
        benchmark::RegisterBenchmark((std::string("decode_naive/") + dtype_label<T>()).c_str(), bm_decode_naive<T>)
            ->Args({c, b, 1})
            ->ArgNames({"ctx", "batch", "threads"})
            ->UseManualTime()
            ->Unit(benchmark::kMicrosecond);
    }
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  register_decode<float>();
  register_decode<f16>();
  register_decode<bf16>();
  register_decode<std::int8_t>();
  const std::size_t pf = bench_tuning().prefetch_bytes;
  const auto default_pf = [](std::size_t bytes_per_value) {
    return std::to_string(attention::default_decode_prefetch_bytes(128 * bytes_per_value));
  };
  benchmark::AddCustomContext("decode_prefetch_bytes",
                              pf == attention::decode_tuning::cpu_default
                                  ? "default for this CPU, head_dim 128 (f32 " + default_pf(sizeof(float)) +
                                        ", f16 / bf16 " + default_pf(sizeof(f16)) + ", int8 " + default_pf(1) + ")"
                                  : std::to_string(pf));
  benchmark::AddCustomContext("decode_int8_scores", bench_tuning().use_amx && attention::detail::amx_tiles_usable()
                                                        ? "AMX tiles"
                                                        : "not AMX (VNNI where the build targets it)");
  llmkit_bench::add_roofline_context();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

LLMKIT_SIMD_DIAGNOSTICS_END
