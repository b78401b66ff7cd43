// SPDX-License-Identifier: MIT
// Sampling: each processor, the samplers and two common chains at vocab
// 32000, 128256, 131072 (flat uniform logits in [-1, 1], the case
// llama.cpp's sampler test times) and 256000 (randn x 3), batch 1 (calling
// thread) and batch 64 on thread_pools of 1, 2, 4, ... threads (up to the
// hardware's; llmkit_bench::thread_counts), against
// - a full-sort reference (std::sort of (logit, id) pairs, float softmax and
//   cumulative sum, as Hugging Face / textbook code does; std::partial_sort
//   for top-k), and
// - llmkit::simd::softmax over the same rows (max, exp, sum, scale), the
//   floor of anything that samples from the full distribution.
// Batch 64 of a chain goes through llmkit::sampling::sample_batch (one task
// per row, thread-local workspaces); processors and references run one task
// per row on the same pool. Every iteration restores the rows from a
// pristine copy while the timer is paused (processors modify rows in place);
// buffers are allocated and faulted once. Counters: bytes_per_second =
// logits bytes read once per row (4 * vocab * batch per iteration),
// roofline = that rate / the machine's sustained read bandwidth
// (bench/roofline.hpp, for the same thread count). After the run, tables give
// per case the ratios reference / llmkit and llmkit / softmax floor, and the
// batch-64 speed-up from 1 thread to each larger count, all from this same run.
// LLMKIT_BENCH_SMOKE=1 runs vocab 32000 only, batch 1 and batch 4 on 2 threads.
//
// One command for every figure (batch 1 and 64, every thread count):
//   bench_sampling --benchmark_min_time=0.1

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

#include <llmkit/core/aligned_buffer.hpp>
#include <llmkit/core/executor.hpp>
#include <llmkit/sampling/sampling.hpp>
#include <llmkit/simd/softmax.hpp>

#include "roofline.hpp"

namespace {

using namespace llmkit;
using namespace llmkit::sampling;

using llmkit_bench::smoke;

/// Pristine and working rows for (vocab, batch), allocated and faulted once.
struct rows {
  aligned_vector<float> pristine, work;
};
rows& data(std::size_t vocab, std::size_t batch) {
  static std::map<std::pair<std::size_t, std::size_t>, std::unique_ptr<rows>> cache;
  auto& slot = cache[{vocab, batch}];
  if (!slot) {
    slot = std::make_unique<rows>();
    slot->pristine.resize(vocab * batch);
    std::mt19937 rng(static_cast<unsigned>(vocab + batch));
    std::uniform_real_distribution<float> flat(-1.0f, 1.0f);
    std::normal_distribution<float> normal(0.0f, 3.0f);
    for (auto& x : slot->pristine) x = vocab == 256000 ? normal(rng) : flat(rng);
    slot->work = slot->pristine;
  }
  return *slot;
}

/// A pool per thread count (created on first use).
thread_pool& pool(std::size_t n_threads) {
  static std::map<std::size_t, std::unique_ptr<thread_pool>> pools;
  auto& slot = pools[n_threads];
  if (!slot) slot = std::make_unique<thread_pool>(n_threads);
  return *slot;
}

// ---- full-sort reference implementations (float, allocation-free per call) ----
struct ref_workspace {
  std::vector<std::pair<float, std::int32_t>> pairs;
  std::vector<float> probs;
};
ref_workspace& ref_ws() {
  thread_local ref_workspace ws;
  return ws;
}
void sort_desc(std::span<const float> row, ref_workspace& ws) {
  ws.pairs.resize(row.size());
  for (std::size_t i = 0; i < row.size(); ++i) ws.pairs[i] = {row[i], static_cast<std::int32_t>(i)};
  std::sort(ws.pairs.begin(), ws.pairs.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
}
/// softmax of the first n sorted pairs into ws.probs; returns nothing.
void sorted_softmax(ref_workspace& ws, std::size_t n, float t = 1.0f) {
  ws.probs.resize(n);
  const float m = ws.pairs[0].first;
  float z = 0.0f;
  for (std::size_t i = 0; i < n; ++i) z += ws.probs[i] = std::exp((ws.pairs[i].first - m) / t);
  for (std::size_t i = 0; i < n; ++i) ws.probs[i] /= z;
}
std::size_t cut_top_p(ref_workspace& ws, std::size_t n, float p) {
  float cum = 0.0f;
  for (std::size_t i = 0; i < n; ++i) {
    cum += ws.probs[i];
    if (cum >= p) return i + 1;
  }
  return n;
}
std::int32_t draw(ref_workspace& ws, std::size_t n, double u) {
  double cum = 0.0, z = 0.0;
  for (std::size_t i = 0; i < n; ++i) z += ws.probs[i];
  for (std::size_t i = 0; i < n; ++i) {
    cum += ws.probs[i];
    if (cum > u * z) return ws.pairs[i].second;
  }
  return ws.pairs[n - 1].second;
}

using row_fn = std::function<std::int32_t(std::span<float>, const sampling_context&)>;
/// A whole batch at once: `[batch, vocab] logits`, `[batch]` contexts and results.
using batch_fn = std::function<void(matrix_view<float>, std::span<const sampling_context>, std::span<sample_result>,
                                    thread_pool&)>;

struct bench_case {
  std::string name;  // processor or chain
  row_fn fast;
  row_fn reference;  // may be empty
  batch_fn fast_batch{};  // batched path of `fast` (chains: sample_batch); empty = one task per row
};

std::int32_t reference_top_k(std::span<float> row, std::size_t k) {
  auto& ws = ref_ws();
  ws.pairs.resize(row.size());
  for (std::size_t i = 0; i < row.size(); ++i) ws.pairs[i] = {row[i], static_cast<std::int32_t>(i)};
  std::partial_sort(ws.pairs.begin(), ws.pairs.begin() + static_cast<std::ptrdiff_t>(k), ws.pairs.end(),
                    [](const auto& a, const auto& b) { return a.first > b.first; });
  return ws.pairs[0].second;
}

std::vector<bench_case> cases() {
  auto chain_fn = [](auto chain) {
    return row_fn([chain](std::span<float> row, const sampling_context& ctx) {
      thread_local candidates ws;
      return sample_row(row, ctx, chain, chain, ws).token;
    });
  };
  auto chain_batch = [](auto chain, auto pick) {
    return batch_fn([chain, pick](matrix_view<float> rows, std::span<const sampling_context> ctx,
                                  std::span<sample_result> out, thread_pool& exec) {
      sample_batch(rows, ctx, chain, pick, out, exec);
    });
  };
  auto proc_fn = [](auto proc) {
    return row_fn([proc](std::span<float> row, const sampling_context& ctx) {
      thread_local candidates ws;
      ws.reset(row);
      proc.apply(ws, ctx);
      return static_cast<std::int32_t>(ws.size());
    });
  };
  static const std::vector<std::int32_t> history = [] {
    std::vector<std::int32_t> h(256);
    std::mt19937 rng(5);
    for (auto& t : h) t = static_cast<std::int32_t>(rng() % 32000);
    return h;
  }();
  std::vector<bench_case> out;
  out.push_back({"softmax_floor", [](std::span<float> row, const sampling_context&) {
                   simd::softmax(row);
                   return std::int32_t{0};
                 }, {}});
  out.push_back({"temperature(0.8)", proc_fn(temperature{0.8f}), {}});
  out.push_back({"penalties(repeat=1.1,last_n=64)", proc_fn(penalties{.repeat = 1.1f, .last_n = 64}), {}});
  out.push_back({"top_k(40)", proc_fn(top_k{40}),
                 [](std::span<float> row, const sampling_context&) { return reference_top_k(row, 40); }});
  out.push_back({"top_p(0.8)", proc_fn(top_p{0.8f}), [](std::span<float> row, const sampling_context&) {
                   auto& ws = ref_ws();
                   sort_desc(row, ws);
                   sorted_softmax(ws, row.size());
                   return static_cast<std::int32_t>(cut_top_p(ws, row.size(), 0.8f));
                 }});
  out.push_back({"min_p(0.05)", proc_fn(min_p{0.05f}), [](std::span<float> row, const sampling_context&) {
                   auto& ws = ref_ws();
                   sort_desc(row, ws);
                   sorted_softmax(ws, row.size());
                   std::size_t n = 0;
                   while (n < row.size() && ws.probs[n] >= 0.05f * ws.probs[0]) ++n;
                   return static_cast<std::int32_t>(n);
                 }});
  out.push_back({"typical(0.5)", proc_fn(typical_p{0.5f}), [](std::span<float> row, const sampling_context&) {
                   auto& ws = ref_ws();
                   sort_desc(row, ws);
                   sorted_softmax(ws, row.size());
                   float h = 0.0f;
                   for (float p : ws.probs)
                     if (p > 0) h -= p * std::log(p);
                   std::vector<std::pair<float, std::size_t>>& scored =
                       *[] { thread_local std::vector<std::pair<float, std::size_t>> s; return &s; }();
                   scored.resize(row.size());
                   for (std::size_t i = 0; i < row.size(); ++i) scored[i] = {std::fabs(-std::log(ws.probs[i]) - h), i};
                   std::sort(scored.begin(), scored.end());
                   float cum = 0.0f;
                   std::size_t n = 0;
                   while (n < row.size() && cum < 0.5f) cum += ws.probs[scored[n++].second];
                   return static_cast<std::int32_t>(n);
                 }});
  out.push_back({"sample", chain_fn(runtime_chain::parse("sample")), [](std::span<float> row, const sampling_context& ctx) {
                   auto& ws = ref_ws();
                   sort_desc(row, ws);
                   sorted_softmax(ws, row.size());
                   return draw(ws, row.size(), ctx.uniform());
                 }, chain_batch(runtime_chain::parse("sample"), runtime_chain::parse("sample"))});
  out.push_back({"greedy", chain_fn(runtime_chain::parse("greedy")), {},
                 chain_batch(runtime_chain::parse("greedy"), runtime_chain::parse("greedy"))});
  const std::string chain1 = "top_k(40);top_p(0.95);temperature(0.8);sample";
  out.push_back({chain1, chain_fn(runtime_chain::parse(chain1)), [](std::span<float> row, const sampling_context& ctx) {
                   auto& ws = ref_ws();
                   sort_desc(row, ws);
                   sorted_softmax(ws, 40);
                   const std::size_t n = cut_top_p(ws, 40, 0.95f);
                   sorted_softmax(ws, n, 0.8f);
                   return draw(ws, n, ctx.uniform());
                 }, chain_batch(runtime_chain::parse(chain1), runtime_chain::parse(chain1))});
  out.push_back({chain1 + " [compiled]", [](std::span<float> row, const sampling_context& ctx) {
                   thread_local candidates ws;
                   static const processor_chain chain{top_k{40}, top_p{0.95f}, temperature{0.8f}};
                   return sample_row(row, ctx, chain, categorical{}, ws).token;
                 }, {}, chain_batch(processor_chain{top_k{40}, top_p{0.95f}, temperature{0.8f}}, categorical{})});
  const std::string chain2 = "min_p(0.05);sample";
  out.push_back({chain2, chain_fn(runtime_chain::parse(chain2)), [](std::span<float> row, const sampling_context& ctx) {
                   auto& ws = ref_ws();
                   sort_desc(row, ws);
                   sorted_softmax(ws, row.size());
                   std::size_t n = 0;
                   while (n < row.size() && ws.probs[n] >= 0.05f * ws.probs[0]) ++n;
                   sorted_softmax(ws, n);
                   return draw(ws, n, ctx.uniform());
                 }, chain_batch(runtime_chain::parse(chain2), runtime_chain::parse(chain2))});
  (void)history;
  return out;
}

void run_case(benchmark::State& state, const row_fn& fn, const batch_fn& batched, std::size_t vocab,
              std::size_t batch, std::size_t n_threads) {
  auto& d = data(vocab, batch);
  const auto& roof = llmkit_bench::roofline::get();
  thread_pool& exec = pool(n_threads);
  std::uint64_t step = 0;
  static const std::vector<std::int32_t> history(64, 7);
  std::vector<sampling_context> contexts(batch);
  std::vector<sample_result> results(batch);
  for (auto _ : state) {
    state.PauseTiming();
    std::copy(d.pristine.begin(), d.pristine.end(), d.work.begin());
    for (std::size_t r = 0; r < batch; ++r)
      contexts[r] = sampling_context{.seed = 1, .request_id = r, .step = step, .history = history};
    state.ResumeTiming();
    if (batch > 1 && batched) {
      batched(matrix_view<float>(d.work.data(), batch, vocab), contexts, results, exec);
      benchmark::DoNotOptimize(results.data());
    } else {
      auto one = [&](std::size_t r) {
        benchmark::DoNotOptimize(fn(std::span<float>(d.work.data() + r * vocab, vocab), contexts[r]));
      };
      if (batch == 1) one(0);
      else exec.parallel_for(batch, one);
    }
    ++step;
  }
  const double bytes = 4.0 * static_cast<double>(vocab * batch);
  state.SetBytesProcessed(static_cast<std::int64_t>(bytes) * state.iterations());
  const double limit = roof.read_gbps(n_threads) * 1e9;
  state.counters["roofline"] = benchmark::Counter(bytes / limit, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["threads"] = static_cast<double>(n_threads);
}

/// Collects real times for the ratio table.
class ratio_reporter : public benchmark::ConsoleReporter {
 public:
  std::map<std::string, double> times;      // name -> real time per iteration (us)
  std::map<std::string, double> cpu_times;  // name -> CPU time of the main thread per iteration (us)
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const auto& r : runs)
      if (!r.error_occurred) {
        std::string name = r.benchmark_name();
        if (const auto at = name.find("/real_time"); at != std::string::npos) name.erase(at);
        times[name] = r.GetAdjustedRealTime();
        cpu_times[name] = r.GetAdjustedCPUTime();
      }
    ConsoleReporter::ReportRuns(runs);
  }
};

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  const std::vector<std::size_t> vocabs = smoke() ? std::vector<std::size_t>{32000}
                                                  : std::vector<std::size_t>{32000, 128256, 131072, 256000};
  // (batch, threads)
  const std::size_t big = smoke() ? 4 : 64;
  std::vector<std::pair<std::size_t, std::size_t>> configs{{1, 1}};
  for (const auto t : llmkit_bench::thread_counts())
    if (!smoke() || t > 1) configs.emplace_back(big, static_cast<std::size_t>(t));
  const auto all = cases();
  auto suffix = [](std::size_t vocab, std::size_t batch, std::size_t threads) {
    return "/vocab:" + std::to_string(vocab) + "/batch:" + std::to_string(batch) + "/threads:" + std::to_string(threads);
  };
  for (const auto& [batch, threads] : configs)
    for (std::size_t vocab : vocabs)
      for (const auto& c : all) {
        const std::string tail = suffix(vocab, batch, threads);
        benchmark::RegisterBenchmark(("llmkit/" + c.name + tail).c_str(), run_case, c.fast, c.fast_batch, vocab, batch,
                                     threads)
            ->Unit(benchmark::kMicrosecond)
            ->UseRealTime();
        if (c.reference)
          benchmark::RegisterBenchmark(("full_sort/" + c.name + tail).c_str(), run_case, c.reference, batch_fn{}, vocab,
                                       batch, threads)
              ->Unit(benchmark::kMicrosecond)
              ->UseRealTime();
      }
  ratio_reporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  // One thread: the CPU time of the calling thread, robust to other
  // processes sharing the machine. Two threads: wall-clock time (the
  // workers' CPU time is not the calling thread's).
  std::printf("\n%-55s %7s %5s %7s %5s %11s %12s %11s %14s\n", "case", "vocab", "batch", "threads", "clock",
              "llmkit_us", "full_sort_us", "sort/llmkit", "llmkit/softmax");
  for (const auto& [batch, threads] : configs)
    for (std::size_t vocab : vocabs) {
      const auto& t = threads == 1 ? reporter.cpu_times : reporter.times;
      const std::string tail = suffix(vocab, batch, threads);
      const auto floor = t.find("llmkit/softmax_floor" + tail);
      for (const auto& c : all) {
        const auto fast = t.find("llmkit/" + c.name + tail);
        if (fast == t.end()) continue;
        const auto slow = t.find("full_sort/" + c.name + tail);
        const double t_slow = slow == t.end() ? 0.0 : slow->second;
        std::printf("%-55s %7zu %5zu %7zu %5s %11.1f %12.1f %11.1f %14.2f\n", c.name.c_str(), vocab, batch, threads,
                    threads == 1 ? "cpu" : "wall", fast->second, t_slow, t_slow > 0 ? t_slow / fast->second : 0.0,
                    floor != t.end() ? fast->second / floor->second : 0.0);
      }
    }
  // Scaling of the big batch from 1 thread to each larger count, in wall-clock time for both.
  std::printf("\n%-55s %7s %5s %7s %13s %13s %9s\n", "case (wall clock)", "vocab", "batch", "threads", "1_thread_us",
              "n_threads_us", "speed-up");
  for (const auto& [batch, threads] : configs) {
    if (batch != big || threads == 1) continue;
    for (std::size_t vocab : vocabs)
      for (const auto& c : all)
        for (const std::string kind : {"llmkit/", "full_sort/"}) {
          const auto one = reporter.times.find(kind + c.name + suffix(vocab, big, 1));
          const auto many = reporter.times.find(kind + c.name + suffix(vocab, big, threads));
          if (one == reporter.times.end() || many == reporter.times.end()) continue;
          std::printf("%-55s %7zu %5zu %7zu %13.1f %13.1f %9.2f\n", (kind + c.name).c_str(), vocab, big, threads,
                      one->second, many->second, one->second / many->second);
        }
  }
  std::printf("(times per iteration = per batch of rows; roofline from %s)\n",
              llmkit_bench::roofline::get().source.c_str());
  benchmark::Shutdown();
  return 0;
}
