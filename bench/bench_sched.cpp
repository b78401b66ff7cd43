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
//   longtail: 400 requests queued at once, prompts uniform [16, 256], outputs
//           lognormal (median 32, p99 512, cap 512): a long tail of outputs;
//   burst:  64 short requests decoding when 8 prompts of 1500 tokens arrive.
//
// LLMKIT_BENCH_SMOKE=1 shrinks every size so the smoke run takes seconds.
#include <benchmark/benchmark.h>

#include <llmkit/core/executor.hpp>
#include <llmkit/kv/paged_cache.hpp>
#include <llmkit/model/batch.hpp>
#include <llmkit/model/llama.hpp>
#include <llmkit/model/synthetic.hpp>
#include <llmkit/sched/cost_model.hpp>
#include <llmkit/sched/policy.hpp>
#include <llmkit/sched/simulator.hpp>
#include <llmkit/sched/state.hpp>
#include <llmkit/sched/trace.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "roofline.hpp"

namespace {

namespace sched = llmkit::sched;

using llmkit_bench::smoke;

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

// The mixed workload with a long tail of output lengths, all requests
// queued at t = 0 (a saturated server): request-level batches run until
// their longest member finishes.
workload_case longtail() {
  const bool small = smoke();
  sched::workload w{.n_requests = small ? 24 : 400,
                    .rate = 0.0,
                    .prompt_lengths = {.min_length = 16, .max_length = 256},
                    .output_lengths = {.shape = llmkit::pack::length_shape::lognormal, .min_length = 4,
                                       .max_length = 512, .median = 32, .p99 = 512},
                    .seed = 9};
  const std::int64_t context = 768;
  return {sched::make_trace(w), {.max_context = context, .block_size = 16, .n_blocks = 32 * context / 16}, 32};
}

workload_case burst() {
  const bool small = smoke();
  std::vector<sched::trace_request> t;
  const std::int64_t n_short = small ? 8 : 64, n_long = small ? 2 : 8;
  llmkit::request_id id = 0;
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

workload_case make_workload(const std::string& name) {
  return name == "mixed" ? mixed() : name == "longtail" ? longtail() : burst();
}

const sched::cost_model& calibrated_model();

/// The cost model of a simulation: the 2-thread roofline, or the limits
/// calibrated on the measured 1-thread steps of the real model.
const sched::cost_model& sim_model(bool calibrated) { return calibrated ? calibrated_model() : model(); }

const sched::run_result& simulated(const std::string& workload, int which, bool calibrated) {
  static std::map<std::tuple<std::string, int, bool>, sched::run_result> cache;
  const auto key = std::make_tuple(workload, which, calibrated);
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  const workload_case w = make_workload(workload);
  return cache[key] = sched::simulate(w.trace, w.limits, sim_policy(which, w), sim_model(calibrated));
}

void BM_policy(benchmark::State& st, const std::string& workload, bool calibrated) {
  const int which = static_cast<int>(st.range(0));
  const workload_case w = make_workload(workload);
  const sched::policy p = sim_policy(which, w);
  const sched::cost_model& cm = sim_model(calibrated);
  sched::run_result r;
  for (auto _ : st) {
    r = sched::simulate(w.trace, w.limits, p, cm);
    benchmark::DoNotOptimize(r.tokens_per_s);
  }
  const auto& baseline = simulated(workload, 0, calibrated);
  const auto& unchunked = simulated(workload, 1, calibrated);
  st.SetLabel(std::string(policy_names[which]) +
              (calibrated ? " (simulated, limits calibrated on the 1-thread engine)" : " (simulated, roofline)"));
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
  st.counters["model_gflops"] = cm.machine.peak_flops / 1e9;
  st.counters["model_gbps"] = cm.machine.bandwidth / 1e9;
  st.counters["model_overlap"] = cm.machine.overlap ? 1 : 0;
}

// ---- the cost model against measured steps -----------------------------------

// The synthetic ~100M Llama (seeded random weights, f32 in memory), or a
// small one under LLMKIT_BENCH_SMOKE, run by the reference forward pass on
// one thread (serial_executor) over a paged cache. Step times are thread
// CPU time, so other processes on the machine slow them down only through
// shared caches and memory bandwidth.
struct real_model {
  std::vector<std::byte> image;
  std::unique_ptr<llmkit::model::llama_model> model;
  sched::llama_config shape;
};

real_model& synthetic_model() {
  static real_model m = [] {
    namespace lm = llmkit::model;
    lm::llama_config c = lm::synthetic_100m_config();
    if (smoke()) {
      c.dim = 128;
      c.n_layers = 2;
      c.n_heads = 2;
      c.n_kv_heads = 1;
      c.ffn_dim = 256;
      c.n_vocab = 512;
    }
    real_model r;
    r.image = lm::synthetic_llama({.config = c, .weight_type = lm::ggml_type::f16, .seed = 1}).bytes();
    r.model = std::make_unique<lm::llama_model>(lm::gguf_file(r.image));
    r.image = {};
    const auto& k = r.model->config();
    r.shape = {.n_layers = static_cast<std::int64_t>(k.n_layers), .dim = static_cast<std::int64_t>(k.dim),
               .n_heads = static_cast<std::int64_t>(k.n_heads), .n_kv_heads = static_cast<std::int64_t>(k.n_kv_heads),
               .head_dim = static_cast<std::int64_t>(k.head_dim), .ffn_dim = static_cast<std::int64_t>(k.ffn_dim),
               .vocab = static_cast<std::int64_t>(k.n_vocab), .bytes_per_weight = 4, .bytes_per_kv = 4};
    return r;
  }();
  return m;
}

/// One step shape: `n_decodes` single-token decodes at context `context`
/// plus, when `chunk > 0`, one prefill chunk of `chunk` tokens from position 0.
struct step_shape {
  const char* kind;
  std::int64_t n_decodes, context, chunk;
  bool calibrate;  // in the calibration set (else held out)
};

const std::vector<step_shape>& step_shapes() {
  static const std::vector<step_shape> shapes = {
      {"decode", 1, 128, 0, true},    {"decode", 2, 128, 0, false},   {"decode", 4, 128, 0, false},
      {"decode", 8, 128, 0, true},    {"decode", 16, 128, 0, false},  {"decode", 32, 128, 0, true},
      {"decode", 8, 512, 0, false},   {"prefill", 0, 0, 16, false},   {"prefill", 0, 0, 32, true},
      {"prefill", 0, 0, 64, false},   {"prefill", 0, 0, 128, false},  {"prefill", 0, 0, 256, true},
      {"mixed", 8, 128, 64, false},   {"mixed", 16, 128, 128, false}, {"mixed", 4, 512, 32, false},
  };
  return shapes;
}

sched::step_plan plan_of(const step_shape& s) {
  sched::step_plan plan;
  for (std::int64_t d = 0; d < s.n_decodes; ++d)
    plan.items.push_back({.id = d, .first_pos = s.context, .n_tokens = 1, .samples = true, .is_prefill = false});
  if (s.chunk > 0)
    plan.items.push_back({.id = s.n_decodes, .first_pos = 0, .n_tokens = s.chunk, .samples = true, .is_prefill = true});
  return plan;
}

double thread_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

/// Runs steps of one shape on the real model: decode sequences hold
/// `context` tokens of filler K/V; each step's tokens are rolled back after
/// it, so every step sees the same shape.
class step_runner {
 public:
  using cache_t = llmkit::kv::paged_cache<float, 16>;
  explicit step_runner(const step_shape& s)
      : shape_(s),
        m_(*synthetic_model().model),
        cache_(m_.kv_shape(), {.n_blocks = static_cast<std::size_t>(s.n_decodes * ((s.context + 1) / 16 + 2) +
                                                                    (s.chunk + 15) / 16 + 2)}) {
    const auto& k = m_.kv_shape();
    const std::vector<float> filler(static_cast<std::size_t>(s.context) * k.n_kv_heads * k.head_dim, 0.01f);
    for (std::int64_t d = 0; d < s.n_decodes; ++d) {
      const auto seq = *cache_.add_sequence();
      (void)cache_.grow(seq, static_cast<std::size_t>(s.context));
      for (std::size_t l = 0; l < k.n_layers; ++l) cache_.store(seq, l, 0, filler, filler);
      decode_seqs_.push_back(seq);
    }
    if (s.chunk > 0) prefill_seq_ = *cache_.add_sequence();
    for (std::int64_t t = 0; t < std::max<std::int64_t>(s.chunk, 1); ++t)
      tokens_.push_back(static_cast<std::int32_t>(3 + (t * 7919) % static_cast<std::int64_t>(m_.vocab_size() - 3)));
  }

  /// Runs one step; returns its thread CPU time in seconds.
  double step() {
    batch_.clear();
    for (auto seq : decode_seqs_)
      batch_.add(seq, std::span<const std::int32_t>(tokens_).first(1), static_cast<std::int32_t>(shape_.context));
    if (shape_.chunk > 0) batch_.add(prefill_seq_, tokens_, 0);
    const double t0 = thread_seconds();
    const auto logits = m_.forward(batch_.view(), cache_, exec_);
    benchmark::DoNotOptimize(logits.row(0).data());
    const double t = thread_seconds() - t0;
    for (auto seq : decode_seqs_) cache_.truncate(seq, static_cast<std::size_t>(shape_.context));
    if (shape_.chunk > 0) cache_.truncate(prefill_seq_, 0);
    return t;
  }

 private:
  step_shape shape_;
  llmkit::model::llama_model& m_;
  cache_t cache_;
  llmkit::serial_executor exec_;
  llmkit::model::batch_builder batch_;
  std::vector<llmkit::kv::seq_id> decode_seqs_;
  llmkit::kv::seq_id prefill_seq_ = 0;
  std::vector<std::int32_t> tokens_;
};

/// The calibration: the median of a few measured steps of every shape, and
/// the machine limits fitted (fit_machine_limits) to the calibration shapes
/// only, from the roofline as upper bounds.
struct calibration {
  std::vector<double> measured_s;  // [shape]
  sched::cost_model roofline, fitted;
};

const calibration& calibrated() {
  static const calibration c = [] {
    const auto& roof = llmkit_bench::roofline::get();
    calibration out;
    out.roofline = {.model = synthetic_model().shape,
                    .machine = {.peak_flops = roof.fma_gflops_1t * 1e9, .bandwidth = roof.read_gbps_1t * 1e9,
                                .step_overhead_s = 0},
                    .block_size = 16};
    std::vector<sched::step_sample> samples;
    for (const step_shape& s : step_shapes()) {
      step_runner r(s);
      r.step();  // warm-up
      std::vector<double> t;
      for (int k = 0; k < (smoke() ? 2 : 5); ++k) t.push_back(r.step());
      out.measured_s.push_back(sched::percentile(t, 0.5));
      if (s.calibrate) {
        const sched::step_cost c = out.roofline(plan_of(s));
        samples.push_back({c.flops(), c.bytes(), out.measured_s.back()});
      }
    }
    // Peak and bandwidth up to 2x the measured single-core roofline (the
    // weights of the ~100M model fit this machine's 480 MiB L3); both forms
    // (overlapped, additive); the worst calibration error minimised.
    out.fitted = out.roofline;
    out.fitted.machine = sched::fit_machine_limits(
        samples, {.peak_flops = 2 * out.roofline.machine.peak_flops, .bandwidth = 2 * out.roofline.machine.bandwidth},
        1e3, 161, true, 1.0);
    return out;
  }();
  return c;
}

const sched::cost_model& calibrated_model() { return calibrated().fitted; }

// BM_step_cost/<shape>: measured step time of one shape (the benchmark's
// own timing: thread CPU time of the forward pass) against the cost model
// with the roofline limits and with the calibrated limits.
void BM_step_cost(benchmark::State& st) {
  const auto k = static_cast<std::size_t>(st.range(0));
  const step_shape& s = step_shapes()[k];
  const calibration& cal = calibrated();
  step_runner r(s);
  double total = 0;
  std::int64_t n = 0;
  for (auto _ : st) {
    const double t = r.step();
    st.SetIterationTime(t);
    total += t;
    ++n;
  }
  const double measured = total / static_cast<double>(n);
  const sched::step_plan plan = plan_of(s);
  const sched::step_cost raw = cal.roofline(plan), fit = cal.fitted(plan);
  char label[96];
  std::snprintf(label, sizeof label, "%s decodes=%lld ctx=%lld chunk=%lld %s", s.kind,
                static_cast<long long>(s.n_decodes), static_cast<long long>(s.context), static_cast<long long>(s.chunk),
                s.calibrate ? "(calibration)" : "(held out)");
  st.SetLabel(label);
  st.counters["measured_ms"] = measured * 1e3;
  st.counters["predicted_ms"] = fit.time_s * 1e3;
  st.counters["error_pct"] = 100 * (fit.time_s / measured - 1);
  st.counters["roofline_ms"] = raw.time_s * 1e3;
  st.counters["calibration_median_ms"] = cal.measured_s[k] * 1e3;
  st.counters["held_out"] = s.calibrate ? 0 : 1;
  st.counters["GFLOP_per_s"] = raw.flops() / measured / 1e9;
  st.counters["GB_per_s"] = raw.bytes() / measured / 1e9;
  st.counters["flop_per_byte"] = raw.flops() / raw.bytes();
  st.counters["fit_peak_gflops"] = cal.fitted.machine.peak_flops / 1e9;
  st.counters["fit_gbps"] = cal.fitted.machine.bandwidth / 1e9;
  st.counters["fit_overhead_us"] = cal.fitted.machine.step_overhead_s * 1e6;
  st.counters["roof_gflops_1t"] = cal.roofline.machine.peak_flops / 1e9;
  st.counters["roof_gbps_1t"] = cal.roofline.machine.bandwidth / 1e9;
}

}  // namespace

BENCHMARK(BM_plan_step)->ArgsProduct({{0, 1, 2, 3}, {8, 64, 256}})->ArgNames({"policy", "running"});
BENCHMARK_CAPTURE(BM_policy, mixed, std::string("mixed"), false)->DenseRange(0, 3)->ArgName("policy")->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_policy, longtail, std::string("longtail"), false)->DenseRange(0, 3)->ArgName("policy")->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_policy, burst, std::string("burst"), false)->DenseRange(0, 3)->ArgName("policy")->Unit(benchmark::kMillisecond);

BENCHMARK_CAPTURE(BM_policy, mixed_calibrated, std::string("mixed"), true)->DenseRange(0, 3)->ArgName("policy")->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_policy, longtail_calibrated, std::string("longtail"), true)->DenseRange(0, 3)->ArgName("policy")->Unit(benchmark::kMillisecond);
BENCHMARK(BM_step_cost)
    ->DenseRange(0, static_cast<int>(step_shapes().size()) - 1)
    ->ArgName("shape")
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond)
    ->Iterations(smoke() ? 1 : 4);

BENCHMARK_MAIN();
