// SPDX-License-Identifier: MIT
// bench_prefill: the masked flash-attention prefill kernel against the fp32
// FMA roofline, and a naive baseline in the same run.
//
// Shapes: 32 query heads, 8 KV heads (GQA 4), head_dim 128.
// - prefill/<dtype>/causal/tokens:<N>/threads:<T>: one sequence of N query
//   tokens against its own N cached tokens, causal mask.
// - prefill/<dtype>/packed/tokens:<N>/threads:<T>: a packed (ragged) batch
//   of four prompts of N/4 tokens each (cu_seqlens = 0, N/4, N/2, 3N/4, N),
//   each causal against its own cache sequence.
// - prefill/<dtype>/packed_row/...: the same four prompts packed back to
//   back into ONE cache sequence under packed_causal_mask (what the pack
//   module runs).
// - prefill_naive/<dtype>/<kind>/...: Eigen Q K^T into a materialised
//   [n, n] score matrix, masked softmax, P V, per prompt and query head,
//   one thread.
//
// Counters:
// - GFLOPs: 4 * head_dim flops per visible (query, key) pair per query head
//   (Q.K and P.V; masked work is not counted), as a rate.
// - frac_fma_peak: GFLOP/s over bench_roofline's measured fp32 FMA peak for
//   the same thread count (roofline::fma_gflops); a plain ratio
//   computed from this bench's own timing of the kernel calls (thread CPU
//   time with one thread, wall time with more).
// - roof_fma_GFLOPs: the peak used.
// - live_fma_GFLOPs / frac_live_peak: the FMA peak re-measured (a short
//   run of bench_roofline's FMA loop, untimed) after every kernel call (the
//   median of those), and the median over the calls of each call's rate
//   over the probe right after it: under load from other processes
//   (time-sliced cores, a busy hyperthread sibling) both sink together, so
//   this ratio is the more stable figure on a shared machine.
//
// - speedup_1t (runs on more than one thread): the median over iterations
//   of the call's wall time on one thread (a second pool, run untimed right
//   after the timed call) over its wall time on all threads: the speed-up
//   on like clocks, in the same minute. Dividing the two runs' GFLOPs
//   instead compares CPU time with wall time, and understates it.
//
// Timing: one-thread runs are timed in the calling thread's CPU time (the
// thread_pool runs tasks on the caller), so other processes time-slicing the
// core do not count against the kernel; two-thread runs use wall time, so
// take them on a quiet machine:
//   build/.../bench/bench_prefill --benchmark_filter='threads:2'
//
// LLMKIT_BENCH_SMOKE=1 shrinks sizes so the smoke run takes seconds.

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <ctime>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include <llmkit/attention/mask.hpp>
#include <llmkit/attention/prefill.hpp>
#include <llmkit/core/aligned_buffer.hpp>
#include <llmkit/core/dtype.hpp>
#include <llmkit/core/executor.hpp>
#include <llmkit/kv/contiguous_cache.hpp>

#include <llmkit/simd/detail/diagnostics.hpp>

#include "roofline.hpp"

// GCC 12 false positives in Eigen's AVX-512 kernels (see diagnostics.hpp):
// Eigen is included inside the bracket, so its inlined code is covered.
LLMKIT_SIMD_DIAGNOSTICS_BEGIN
#include <Eigen/Dense>

namespace {

using namespace llmkit;

using llmkit_bench::smoke;

constexpr std::size_t n_heads = 32, n_kv_heads = 8, head_dim = 128, n_prompts = 4;

enum class kind : std::int64_t { causal = 0, packed = 1, packed_row = 2 };

const char* kind_label(kind k) {
  switch (k) {
    case kind::causal: return "causal";
    case kind::packed: return "packed";
    default: return "packed_row";
  }
}

template <class T>
const char* dtype_label() {
  if constexpr (std::is_same_v<T, float>) return "f32";
  else if constexpr (std::is_same_v<T, f16>) return "f16";
  else if constexpr (std::is_same_v<T, bf16>) return "bf16";
  else return "int8";
}

/// Seconds on the clock that fits the thread count: the calling thread's CPU
/// time for one thread, wall time for more.
double now_seconds(std::size_t threads) {
  if (threads > 1)
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

/// The prompts of one case: their cache, the prefill arguments and the
/// visible-pair flop count.
template <class T>
struct prefill_data {
  std::unique_ptr<kv::contiguous_cache<T>> cache;
  std::vector<kv::seq_id> ids;
  std::vector<std::int32_t> cu{0};        // batch cu_seqlens
  std::vector<std::int32_t> segments{0};  // prompt boundaries (packed_row: inside the one sequence)
  aligned_vector<float> q, out;

  prefill_data(kind k, std::size_t tokens) {
    const std::size_t n_seqs = k == kind::packed ? n_prompts : 1;
    const std::size_t per_seq = tokens / n_seqs;
    cache = std::make_unique<kv::contiguous_cache<T>>(kv::kv_shape{1, n_kv_heads, head_dim},
                                                      kv::contiguous_cache_options{n_seqs, per_seq});
    std::mt19937 rng(3);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> kr(per_seq * n_kv_heads * head_dim), vr(kr.size());
    for (std::size_t i = 0; i < n_seqs; ++i) {
      for (auto& x : kr) x = u(rng);
      for (auto& x : vr) x = u(rng);
      const kv::seq_id s = *cache->add_sequence();
      cache->grow(s, per_seq);
      cache->store(s, 0, 0, kr, vr);
      ids.push_back(s);
      cu.push_back(cu.back() + static_cast<std::int32_t>(per_seq));
    }
    const std::size_t n_segments = k == kind::causal ? 1 : n_prompts;
    for (std::size_t i = 0; i < n_segments; ++i)
      segments.push_back(segments.back() + static_cast<std::int32_t>(tokens / n_segments));
    q.resize(tokens * n_heads * head_dim);
    for (auto& x : q) x = u(rng);
    out.resize(q.size());
  }
  /// Flops of the visible (query, key) pairs: causal within each prompt.
  double flops() const {
    double pairs = 0.0;
    for (std::size_t i = 0; i + 1 < segments.size(); ++i) {
      const double n = segments[i + 1] - segments[i];
      pairs += n * (n + 1) / 2;
    }
    return 4.0 * static_cast<double>(head_dim) * static_cast<double>(n_heads) * pairs;
  }
};

/// The FMA peak measured again right after each kernel call (a short run of
/// bench_roofline's FMA loop on `threads` threads, outside the timed region,
/// `llmkit_bench::live_ratio`): on a loaded machine it sinks with the
/// kernel, so kernel / live peak stays close to what a quiet machine shows.
struct live_peak {
  llmkit_bench::live_ratio ratio;
  /// Records the call just made (`call_gflops`) against a probe run now.
  void probe(benchmark::State& state, std::size_t threads, double call_gflops) {
    state.PauseTiming();
    ratio.add(call_gflops,
              llmkit_bench::measure_fma_gflops(static_cast<unsigned>(threads), smoke() ? 2'000 : 200'000, 1));
    state.ResumeTiming();
  }
};

void roof_counters(benchmark::State& state, double flops_per_iter, double seconds, std::size_t threads,
                   const live_peak& live) {
  const auto& roof = llmkit_bench::roofline::get();
  const double peak = roof.fma_gflops(threads);
  const double iters = static_cast<double>(state.iterations());
  const double gflops = seconds > 0 ? flops_per_iter * 1e-9 * iters / seconds : 0.0;
  state.counters["GFLOPs"] = benchmark::Counter(flops_per_iter * 1e-9 * iters, benchmark::Counter::kIsRate);
  state.counters["roof_fma_GFLOPs"] = peak;
  state.counters["frac_fma_peak"] = gflops / peak;
  state.counters["live_fma_GFLOPs"] = live.ratio.probe_median();
  state.counters["frac_live_peak"] = live.ratio.ratio_median();
}

template <class T>
void bm_prefill(benchmark::State& state) {
  const auto k = static_cast<kind>(state.range(0));
  const auto tokens = static_cast<std::size_t>(state.range(1));
  const auto threads = static_cast<std::size_t>(state.range(2));
  prefill_data<T> data(k, tokens);
  thread_pool pool(threads);
  const attention::prefill_params params{.q = data.q, .out = data.out, .cu_seqlens = data.cu, .seq_ids = data.ids,
                                         .layer = 0, .n_heads = n_heads};
  const attention::packed_causal_mask row_mask(data.segments);
  const auto run = [&](thread_pool& on) {
    if (k == kind::packed_row) attention::prefill(params, *data.cache, row_mask, on);
    else attention::prefill(params, *data.cache, attention::causal_mask{}, on);
    benchmark::DoNotOptimize(data.out.data());
  };
  thread_pool one(1);                // threads > 1: the same call on one thread, for speedup_1t
  llmkit_bench::live_ratio speedup;  // per iteration: this call's rate over the one-thread call's
  double seconds = 0.0;
  live_peak live;
  for (auto _ : state) {
    const double t0 = now_seconds(threads);
    run(pool);
    const double call = now_seconds(threads) - t0;
    seconds += call;
    live.probe(state, threads, data.flops() * 1e-9 / call);
    if (threads > 1) {
      state.PauseTiming();
      const double t1 = now_seconds(threads);
      run(one);
      speedup.add(1.0 / call, 1.0 / (now_seconds(threads) - t1));
      state.ResumeTiming();
    }
  }
  roof_counters(state, data.flops(), seconds, threads, live);
  if (threads > 1) state.counters["speedup_1t"] = speedup.ratio_median();
}

using row_matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

template <class T>
void to_matrix(const T* rows, std::size_t n, row_matrix& m) {
  m.resize(static_cast<Eigen::Index>(n), static_cast<Eigen::Index>(head_dim));
  for (std::size_t t = 0; t < n; ++t)
    for (std::size_t d = 0; d < head_dim; ++d) m(t, d) = to_f32(rows[t * head_dim + d]);
}

/// Eigen products and a materialised, masked [n, n] score matrix per prompt
/// and query head (K/V converted to f32 per head): the baseline.
template <class T>
void bm_prefill_naive(benchmark::State& state) {
  const auto k = static_cast<kind>(state.range(0));
  const auto tokens = static_cast<std::size_t>(state.range(1));
  prefill_data<T> data(k, tokens);
  const std::size_t group = n_heads / n_kv_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  row_matrix qh, km, vm, o, s;
  const auto ninf = -std::numeric_limits<float>::infinity();
  double seconds = 0.0;
  live_peak live;
  for (auto _ : state) {
    const double t0 = now_seconds(1);
    for (std::size_t seg = 0; seg + 1 < data.segments.size(); ++seg) {
      const auto first = static_cast<std::size_t>(data.segments[seg]);
      const std::size_t n = static_cast<std::size_t>(data.segments[seg + 1]) - first;
      // packed: prompt seg is its own cache sequence; otherwise rows [first, first + n) of sequence 0.
      const std::size_t seq = k == kind::packed ? seg : 0;
      const std::size_t row0 = k == kind::packed ? 0 : first;
      qh.resize(static_cast<Eigen::Index>(n), head_dim);
      for (std::size_t h = 0; h < n_heads; ++h) {
        const auto c = data.cache->chunk(data.ids[seq], 0, h / group, 0);
        to_matrix(c.k + row0 * head_dim, n, km);
        to_matrix(c.v + row0 * head_dim, n, vm);
        for (std::size_t t = 0; t < n; ++t)
          for (std::size_t d = 0; d < head_dim; ++d)
            qh(static_cast<Eigen::Index>(t), static_cast<Eigen::Index>(d)) =
                data.q[((first + t) * n_heads + h) * head_dim + d];
        s.noalias() = (qh * km.transpose()) * scale;  // [n, n] materialised scores
        for (Eigen::Index r = 0; r < s.rows(); ++r) {
          for (Eigen::Index col = r + 1; col < s.cols(); ++col) s(r, col) = ninf;
          const float m = s.row(r).maxCoeff();
          s.row(r) = (s.row(r).array() - m).exp();
          s.row(r) /= s.row(r).sum();
        }
        o.noalias() = s * vm;
        benchmark::DoNotOptimize(o.data());
      }
    }
    const double call = now_seconds(1) - t0;
    seconds += call;
    live.probe(state, 1, data.flops() * 1e-9 / call);
  }
  roof_counters(state, data.flops(), seconds, 1, live);
}

template <class T>
void register_prefill() {
  const std::vector<std::int64_t> sizes =
      smoke() ? std::vector<std::int64_t>{64} : std::vector<std::int64_t>{512, 2048};
  for (const auto n : sizes)
    for (const kind k : {kind::causal, kind::packed, kind::packed_row}) {
      const std::string suffix = std::string(dtype_label<T>()) + "/" + kind_label(k);
      for (const std::int64_t threads : llmkit_bench::thread_counts()) {
        auto* b = benchmark::RegisterBenchmark(("prefill/" + suffix).c_str(), bm_prefill<T>)
                      ->Args({static_cast<std::int64_t>(k), n, threads})
                      ->ArgNames({"kind", "tokens", "threads"})
                      ->Unit(benchmark::kMillisecond);
        if (threads > 1) b->UseRealTime();  // one thread: the caller's CPU time (the default)
      }
      if (k != kind::packed_row)
        benchmark::RegisterBenchmark(("prefill_naive/" + suffix).c_str(), bm_prefill_naive<T>)
            ->Args({static_cast<std::int64_t>(k), n, 1})
            ->ArgNames({"kind", "tokens", "threads"})
            ->Unit(benchmark::kMillisecond);
    }
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  register_prefill<float>();
  register_prefill<f16>();
  llmkit_bench::add_roofline_context();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

LLMKIT_SIMD_DIAGNOSTICS_END
