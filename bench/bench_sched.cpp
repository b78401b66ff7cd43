// SPDX-License-Identifier: MIT
// Scheduling benchmarks.
//
// BM_plan_step/<policy>/<running>: the scheduler's own cost, one pure
// plan_step over a state with <running> decoding sequences and 4x as many
// waiting prompts (counters: steps/s, scheduled sequences/s). The
// request-level policy (a plain loop over the running batch) is the
// baseline in the same binary.
//
// BM_policy/<workload>/<policy>: one simulated serving run of the synthetic
// ~100M Llama on this machine's roofline (bench/roofline.hpp) per iteration.
// Counters are the simulated results, not the benchmark's wall time:
// tokens/s, TTFT and TPOT p50/p99 (ms), KV use, and ratios to the
// request-level run (throughput) or to the unchunked continuous run (TPOT
// p99) of the same workload, computed in the same process:
//   mixed:  Poisson arrivals, uniform prompts [16, 512], outputs [8, 256];
//   burst:  64 short requests decoding when 8 prompts of 1500 tokens arrive.
//
// LLMKIT_BENCH_SMOKE=1 shrinks every size so the smoke run takes seconds.
#include <benchmark/benchmark.h>

#include <llmkit/sched/cost_model.hpp>
#include <llmkit/sched/policy.hpp>
#include <llmkit/sched/simulator.hpp>
#include <llmkit/sched/state.hpp>
#include <llmkit/sched/trace.hpp>

#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "roofline.hpp"

namespace {

namespace sched = llmkit::sched;

bool smoke() {
  const char* v = std::getenv("LLMKIT_BENCH_SMOKE");
  return v != nullptr && std::string(v) != "0";
}

const sched::cost_model& model() {
  static const sched::cost_model cm = [] {
    const auto& roof = llmkit_bench::roofline::get();
    return sched::cost_model{
        .model = {.n_layers = 12, .dim = 768, .n_heads = 12, .n_kv_heads = 4, .head_dim = 64, .ffn_dim = 2048,
                  .vocab = 32000, .bytes_per_weight = 4, .bytes_per_kv = 4},
        .machine = {.peak_flops = roof.fma_gflops_all * 1e9, .bandwidth = roof.read_gbps_all * 1e9,
                    .step_overhead_s = 20e-6},
        .block_size = 16};
  }();
  return cm;
}

// ---- scheduler overhead ---------------------------------------------------

sched::policy named_policy(int which, std::int64_t max_batch, std::int64_t context) {
  switch (which) {
    case 0: return {.mode = sched::batching::request_level, .max_batch_seqs = max_batch, .max_step_tokens = max_batch * context};
    case 1: return {.max_batch_seqs = max_batch, .max_step_tokens = 2 * context};
    case 2: return {.max_batch_seqs = max_batch, .max_step_tokens = 256, .chunked_prefill = true};
    default:
      return {.max_batch_seqs = max_batch, .max_step_tokens = 4 * context, .layout = sched::prefill_layout::packed};
  }
}
const char* policy_names[] = {"request-level", "continuous", "continuous+chunked", "continuous+prepacked"};

void BM_plan_step(benchmark::State& st) {
  const int which = static_cast<int>(st.range(0));
  const std::int64_t running = st.range(1);
  const std::int64_t context = 1024;
  sched::sched_state s = sched::make_state({.max_context = context, .block_size = 16, .n_blocks = 1 << 20});
  const sched::policy p = named_policy(which, running + 8, context);
  // Bring `running` sequences into decode, then queue 4x as many prompts.
  std::int64_t id = 0;
  for (; id < running; ++id) sched::submit(s, id, 64 + id % 300, 512);
  const sched::policy warm{.max_batch_seqs = running + 8, .max_step_tokens = 1 << 20};
  sched::commit_step(s, sched::plan_step(s, warm));
  if (which == 0) s.static_batch_size = running;
  for (std::int64_t k = 0; k < 4 * running; ++k, ++id) sched::submit(s, id, 16 + id % 500, 128);
  std::int64_t items = 0;
  for (auto _ : st) {
    const sched::step_plan plan = sched::plan_step(s, p);
    items += static_cast<std::int64_t>(plan.items.size());
    benchmark::DoNotOptimize(plan.items.data());
  }
  st.SetLabel(policy_names[which]);
  st.counters["steps_per_s"] = benchmark::Counter(static_cast<double>(st.iterations()), benchmark::Counter::kIsRate);
  st.counters["seqs_per_s"] = benchmark::Counter(static_cast<double>(items), benchmark::Counter::kIsRate);
}

// ---- simulated policies ------------------------------------------------------

struct workload_case {
  std::vector<sched::trace_request> trace;
  sched::engine_limits limits;
  std::int64_t max_batch;
};

workload_case mixed() {
  const bool small = smoke();
  sched::workload w{.n_requests = small ? 24 : 400,
                    .rate = 4.0,
                    .prompt_lengths = {.min_length = 16, .max_length = 512},
                    .output_lengths = {.min_length = 8, .max_length = 256},
                    .seed = 8};
  const std::int64_t context = 768;
  return {sched::make_trace(w), {.max_context = context, .block_size = 16, .n_blocks = 32 * context / 16}, 32};
}

workload_case burst() {
  const bool small = smoke();
  std::vector<sched::trace_request> t;
  const std::int64_t n_short = small ? 8 : 64, n_long = small ? 2 : 8;
  sched::request_id id = 0;
  for (std::int64_t i = 0; i < n_short; ++i, ++id)
    t.push_back({.id = id, .arrival_s = 0.0, .n_prompt = 32, .n_output = 200, .max_new_tokens = 200});
  for (std::int64_t i = 0; i < n_long; ++i, ++id)
    t.push_back({.id = id, .arrival_s = 1.0 + 0.5 * static_cast<double>(i), .n_prompt = 1500, .n_output = 16,
                 .max_new_tokens = 16});
  const std::int64_t context = 2048;
  return {t, {.max_context = context, .block_size = 16, .n_blocks = 96 * context / 16}, 96};
}

sched::policy sim_policy(int which, const workload_case& w) {
  const std::int64_t ctx = w.limits.max_context;
  switch (which) {
    case 0: return {.mode = sched::batching::request_level, .max_batch_seqs = w.max_batch, .max_step_tokens = w.max_batch * ctx};
    case 1:
      return {.max_batch_seqs = w.max_batch, .max_step_tokens = w.max_batch * ctx, .layout = sched::prefill_layout::padded};
    case 2: return {.max_batch_seqs = w.max_batch, .max_step_tokens = 256, .chunked_prefill = true};
    default:
      return {.max_batch_seqs = w.max_batch, .max_step_tokens = w.max_batch * ctx, .layout = sched::prefill_layout::packed};
  }
}

const sched::run_result& simulated(const std::string& workload, int which) {
  static std::map<std::pair<std::string, int>, sched::run_result> cache;
  const auto key = std::make_pair(workload, which);
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  const workload_case w = workload == "mixed" ? mixed() : burst();
  return cache[key] = sched::simulate(w.trace, w.limits, sim_policy(which, w), model());
}

void BM_policy(benchmark::State& st, const std::string& workload) {
  const int which = static_cast<int>(st.range(0));
  const workload_case w = workload == "mixed" ? mixed() : burst();
  const sched::policy p = sim_policy(which, w);
  sched::run_result r;
  for (auto _ : st) {
    r = sched::simulate(w.trace, w.limits, p, model());
    benchmark::DoNotOptimize(r.tokens_per_s);
  }
  const auto& baseline = simulated(workload, 0);
  const auto& unchunked = simulated(workload, 1);
  st.SetLabel(std::string(policy_names[which]) + " (simulated)");
  st.counters["sim_tokens_per_s"] = r.tokens_per_s;
  st.counters["sim_ttft_p50_ms"] = r.ttft_p50_s * 1e3;
  st.counters["sim_ttft_p99_ms"] = r.ttft_p99_s * 1e3;
  st.counters["sim_tpot_p50_ms"] = r.tpot_p50_s * 1e3;
  st.counters["sim_tpot_p99_ms"] = r.tpot_p99_s * 1e3;
  st.counters["sim_itl_p99_ms"] = r.itl_p99_s * 1e3;
  st.counters["kv_use_mean"] = r.kv_use_mean;
  st.counters["preemptions"] = static_cast<double>(r.n_preemptions);
  st.counters["throughput_x_request_level"] = r.tokens_per_s / baseline.tokens_per_s;
  st.counters["tpot_p99_cut_x_vs_continuous"] = unchunked.tpot_p99_s / r.tpot_p99_s;
  st.counters["roof_gflops"] = model().machine.peak_flops / 1e9;
  st.counters["roof_gbps"] = model().machine.bandwidth / 1e9;
}

}  // namespace

BENCHMARK(BM_plan_step)->ArgsProduct({{0, 1, 2, 3}, {8, 64, 256}})->ArgNames({"policy", "running"});
BENCHMARK_CAPTURE(BM_policy, mixed, std::string("mixed"))->DenseRange(0, 3)->ArgName("policy")->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_policy, burst, std::string("burst"))->DenseRange(0, 3)->ArgName("policy")->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
