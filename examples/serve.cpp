// SPDX-License-Identifier: MIT
// llmkit-serve: serves a stream of requests (Poisson arrivals, mixed prompt
// and output lengths) under four scheduling policies in the same run and
// prints throughput, TTFT, TPOT and KV pool use for each:
//   request-level            static batches, padded prefill, KV reserved up front
//   continuous               iteration-level batching, prefills of a step padded to the longest
//   continuous+chunked       prefills split under a per-step token budget (ragged)
//   continuous+prepacked     prefills of a step bin-packed into rows (llmkit/pack FFD)
//
// With no arguments: the synthetic ~100M Llama (f16 weights, so a decode
// step reads 200 MB as a real model's does and its cost barely grows with
// the rows in it), 32 requests all arriving at once (a saturated server, so
// the policies' batching sets the pace rather than the arrivals), chat-like
// short prompts uniform in [8, 16], long-tailed (lognormal) outputs capped
// at 128, batches of up to 8, threads by the model's size, step times in
// process CPU time. A model whose steps cost microseconds (stories260K)
// computes in proportion to its rows, where a half-empty static batch costs
// little: there the policies differ only in latency.
//
// Each policy drives llmkit::serve::engine (the library's serving engine)
// on the reference Llama forward pass (llmkit/model/llama.hpp) and a paged
// KV cache with prefix caching (kv::prefix_cache), greedy decoding: a step
// runs the plan's tokens as one ragged forward pass and takes its measured
// time (--clock); arrivals follow the Poisson trace in that virtual clock. The
// reference forward has no padded kernel, so the layouts of "continuous"
// (padded) and "continuous+prepacked" are executed ragged: in a real run
// they differ from each other only in batch formation. --check reruns the
// first requests alone and compares the tokens (greedy, batch invariant).
//
// --burst N adds N requests with --burst-prompt-token prompts arriving from
// --burst-start every --burst-interval seconds while the trace decodes (the
// chunked-prefill case: a long unchunked prefill stalls every decode).
//
// --shared-prefix N starts every prompt with the same N tokens (a system
// prompt; the drawn lengths come on top), which --prefix-reuse on (the
// default) computes once and reuses from the prefix cache.
//
// --model serves a GGUF file instead of the synthetic ~100M Llama (seeded
// random weights, llmkit/model/synthetic.hpp).
//
// --simulate runs the policies in virtual time with the roofline cost model
// instead (model shapes from the GGUF file or the synthetic ~100M config,
// machine limits from build/roofline.json written by bench_roofline).
//
// Besides tokens/s over the whole run, a real run reports the decode rate:
// tokens sampled by steps without prefill work over those steps' time (what
// llama.cpp's batched-bench calls the generation rate, S_TG).
#include <llmkit/core/executor.hpp>
#include <llmkit/kv/prefix_cache.hpp>
#include <llmkit/model/batch.hpp>
#include <llmkit/model/gguf.hpp>
#include <llmkit/model/llama.hpp>
#include <llmkit/model/synthetic.hpp>
#include <llmkit/sched/cost_model.hpp>
#include <llmkit/sched/policy.hpp>
#include <llmkit/sched/simulator.hpp>
#include <llmkit/sched/trace.hpp>
#include <llmkit/serve/engine.hpp>

#include "example_cli.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <vector>

namespace sched = llmkit::sched;

namespace {

struct options {
  std::string model;
  bool synthetic = false;
  bool simulate = false;
  bool json = false;
  bool quiet = false;
  std::int64_t n_requests = 32;
  double rate = 0.0;  // all at once: the server is saturated and the policies' batching decides the pace
  std::string prompt_shape = "uniform";
  std::size_t prompt_min = 8, prompt_max = 16;
  double prompt_median = 48, prompt_p99 = 120;
  std::string output_shape = "lognormal";  // long-tailed, as real traces are: a static batch waits for its longest
  std::size_t output_min = 4, output_max = 128;
  double output_median = 16, output_p99 = 256;
  std::int64_t max_batch = 8;
  std::int64_t step_tokens = 0;  // 0 = max_batch * context (request-level) / context (others)
  std::int64_t chunk_tokens = 64;
  std::int64_t row_capacity = 0;
  std::int64_t block_size = 16;
  std::int64_t n_blocks = 0;
  std::int64_t context = 0;
  double peak_gflops = 0, bandwidth_gbps = 0, overhead_us = 20;
  std::uint64_t seed = 1;
  std::size_t threads = 0;  // 0 = llmkit_examples::default_threads(the model's weight bytes)
  std::string clock = "cpu";
  std::int64_t check = 0;
  // The burst workload: long prompts arriving while the trace decodes.
  std::int64_t burst = 0;
  std::size_t shared_prefix = 0;
  std::string prefix_reuse = "on";
  std::size_t burst_prompt = 1500, burst_output = 16;
  double burst_start = 1.0, burst_interval = 0.5;
  std::vector<std::string> policies = {"request-level", "continuous", "continuous+chunked", "continuous+prepacked"};
};

sched::llama_config config_of(const llmkit::model::llama_config& k) {
  return {.n_layers = static_cast<std::int64_t>(k.n_layers), .dim = static_cast<std::int64_t>(k.dim),
          .n_heads = static_cast<std::int64_t>(k.n_heads), .n_kv_heads = static_cast<std::int64_t>(k.n_kv_heads),
          .head_dim = static_cast<std::int64_t>(k.head_dim), .ffn_dim = static_cast<std::int64_t>(k.ffn_dim),
          .vocab = static_cast<std::int64_t>(k.n_vocab), .bytes_per_weight = 4, .bytes_per_kv = 4};
}

// Any architecture llama_model runs (its `<arch>.*` keys); the reference
// forward pass computes in f32.
sched::llama_config config_from_gguf(const std::string& path) {
  return config_of(llmkit::model::llama_config::from_gguf(llmkit::model::gguf_file::open(path)));
}

sched::llama_config synthetic_100m() {
  return {.n_layers = 12, .dim = 768, .n_heads = 12, .n_kv_heads = 4, .head_dim = 64, .ffn_dim = 2048,
          .vocab = 32000, .bytes_per_weight = 4, .bytes_per_kv = 4};
}

// Machine limits: flags, else build/roofline.json, else conservative guesses.
sched::machine_limits machine(const options& o, std::string& source) {
  sched::machine_limits m{.peak_flops = 50e9, .bandwidth = 5e9, .step_overhead_s = o.overhead_us * 1e-6};
  source = "defaults (50 GFLOP/s, 5 GB/s)";
  std::string path;
  if (const char* p = std::getenv("LLMKIT_ROOFLINE_JSON"); p != nullptr && *p != '\0') path = p;
#if defined(LLMKIT_SOURCE_DIR)
  if (path.empty()) path = std::string(LLMKIT_SOURCE_DIR) + "/build/roofline.json";
#endif
  if (!path.empty()) source += ": no " + path + " (bench_roofline --short writes it in seconds)";
  if (std::ifstream in(path); !path.empty() && in) {
    try {
      const auto j = nlohmann::json::parse(in);
      m.peak_flops = j.at("fma_gflops_all").get<double>() * 1e9;
      m.bandwidth = j.at("read_gbps_all").get<double>() * 1e9;
      source = path;
    } catch (const std::exception&) {
    }
  }
  if (o.peak_gflops > 0) m.peak_flops = o.peak_gflops * 1e9;
  if (o.bandwidth_gbps > 0) m.bandwidth = o.bandwidth_gbps * 1e9;
  if (o.peak_gflops > 0 || o.bandwidth_gbps > 0) source += " (overridden by flags)";
  return m;
}

sched::policy make_policy(const std::string& name, const options& o, std::int64_t context) {
  const std::int64_t whole = std::max(o.step_tokens, context);
  if (name == "request-level")
    return {.mode = sched::batching::request_level, .max_batch_seqs = o.max_batch,
            .max_step_tokens = std::max(o.step_tokens, o.max_batch * context)};
  if (name == "continuous")
    return {.max_batch_seqs = o.max_batch, .max_step_tokens = std::max(whole, o.max_batch * context),
            .layout = sched::prefill_layout::padded};
  if (name == "continuous+chunked")
    return {.max_batch_seqs = o.max_batch, .max_step_tokens = o.chunk_tokens, .chunked_prefill = true};
  if (name == "continuous+prepacked") {
    const std::int64_t row = o.row_capacity;  // 0 = the longest prompt of the step
    return {.max_batch_seqs = o.max_batch, .max_step_tokens = std::max(whole, o.max_batch * context),
            .layout = sched::prefill_layout::packed, .row_capacity = row};
  }
  llmkit::detail::throw_error("--policies: unknown policy '", name,
                              "' (request-level, continuous, continuous+chunked, continuous+prepacked)");
}

constexpr std::size_t engine_block_size = 16;
using engine_cache = llmkit::kv::prefix_cache<float, engine_block_size>;
using serve_engine = llmkit::serve::engine<llmkit::model::llama_model, engine_cache, llmkit::thread_pool>;

double process_cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// Replays a trace through llmkit::serve::engine on the reference forward
// pass: requests are submitted when the virtual clock passes their arrival,
// each engine step advances the clock by its measured time. Greedy tokens,
// each request stops at its drawn length; prompts are random token ids (the
// trace fixes their lengths).
class replay {
 public:
  // Every prompt starts with the same `shared_prefix` tokens (a system prompt).
  replay(llmkit::model::llama_model& model, llmkit::thread_pool& pool, const std::vector<sched::trace_request>& trace,
         const sched::engine_limits& limits, const sched::policy& policy, std::uint64_t seed, const sched::cost_model& cm,
         bool cpu_clock, std::size_t shared_prefix, llmkit::serve::prefix_reuse reuse)
      : model_(model),
        pool_(pool),
        trace_(trace),
        limits_(limits),
        policy_(policy),
        cm_(cm),
        cpu_clock_(cpu_clock),
        reuse_(reuse) {
    std::mt19937_64 rng(seed);
    std::uniform_int_distribution<llmkit::token_id> tok(3, static_cast<llmkit::token_id>(model.vocab_size()) - 1);
    std::vector<llmkit::token_id> shared(shared_prefix);
    for (auto& t : shared) t = tok(rng);
    for (const auto& r : trace_) {
      auto& prompt = prompt_[r.id];
      for (std::int64_t i = 0; i < r.n_prompt; ++i)
        prompt.push_back(static_cast<std::size_t>(i) < shared.size() ? shared[static_cast<std::size_t>(i)] : tok(rng));
    }
    std::stable_sort(trace_.begin(), trace_.end(), [](const auto& a, const auto& b) { return a.arrival_s < b.arrival_s; });
  }

  sched::run_result run(const sched::run_options& ro) {
    engine_cache cache(model_.kv_shape(), {.n_blocks = static_cast<std::size_t>(limits_.n_blocks)});
    std::optional<sched::step_plan> plan;
    std::int64_t kv_used = 0;
    std::map<llmkit::request_id, llmkit::request_id> trace_id;  // engine handle -> trace id
    serve_engine eng(model_, cache, pool_,
                     {.max_context = limits_.max_context,
                      .policy = policy_,
                      .max_queued = trace_.size() + 1,
                      .reuse = reuse_,
                      .on_step =
                          [&](const llmkit::serve::step_report& r) {
                            plan = r.plan;  // in trace ids, for the recorder
                            for (auto& it : plan->items) it.id = trace_id.at(it.id);
                            for (auto* moves : {&plan->admitted, &plan->preempted, &plan->swapped_out, &plan->swapped_in})
                              for (auto& m : *moves) m.id = trace_id.at(m.id);
                            kv_used = static_cast<std::int64_t>(r.kv_blocks_used);
                          }});
    sched::detail::run_recorder rec(ro.record_steps);
    std::vector<sched::seq_record> finished;
    std::string error;
    double t = trace_.empty() ? 0.0 : trace_.front().arrival_s;
    const double t0 = t;
    std::size_t next = 0;
    std::int64_t n_live = 0;
    while (next < trace_.size() || n_live > 0) {
      while (next < trace_.size() && trace_[next].arrival_s <= t) {
        const sched::trace_request& r = trace_[next++];
        const llmkit::request_id id = r.id;
        const auto res = eng.submit(
            {.prompt = prompt_.at(id),
             .sampling = "greedy",
             .stop = {.max_new_tokens = static_cast<std::size_t>(r.max_new_tokens)},
             .on_event = [&, id](const llmkit::serve::stream_event& e) {
               if (e.type == llmkit::serve::event_type::token) {
                 output_[id].push_back(e.token);
                 return;
               }
               --n_live;
               if (e.finish == llmkit::serve::finish_kind::error) error = e.error;
               finished.push_back({.id = id, .n_preemptions = static_cast<std::int64_t>(e.usage.n_preemptions)});
             }});
        if (!res.accepted()) llmkit::detail::throw_error("request ", id, ": ", res.message);
        trace_id[res.handle] = id;
        ++n_live;
        rec.arrive(r);
      }
      if (n_live == 0) {
        t = trace_[next].arrival_s;
        continue;
      }
      finished.clear();
      plan.reset();
      const auto start = std::chrono::steady_clock::now();
      const double cpu_start = process_cpu_s();
      eng.step();
      const double duration = cpu_clock_ ? (process_cpu_s() - cpu_start) / static_cast<double>(pool_.concurrency())
                                         : std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (!error.empty()) llmkit::detail::throw_error("engine: ", error);
      if (!plan) continue;  // a step that only took submissions in
      rec.step(*plan, finished, t, duration,
               static_cast<double>(kv_used) / static_cast<double>(limits_.n_blocks), kv_used);
      t += duration;
      if (plan->n_prefill_tokens() == 0) {
        decode_s_ += duration;
        decode_tokens_ += plan->n_samples();
      }
      const sched::step_cost c = cm_(*plan);
      samples_.push_back({c.flops(), c.bytes(), duration});
      if (ro.on_progress) ro.on_progress(rec.n_done(), static_cast<std::int64_t>(trace_.size()));
    }
    reused_tokens_ = eng.stats().n_prompt_tokens_reused;
    return rec.summary(t0, t);
  }

  /// Prompt tokens the prefix cache spared over the run.
  std::uint64_t reused_tokens() const noexcept { return reused_tokens_; }

  /// Measured / predicted step time over the run's steps: p10, p50, p90 and
  /// the fraction within 25% with the roofline limits; then the median and
  /// the fraction within 25% over the odd steps once the limits are
  /// calibrated (fit_machine_limits) on the even steps.
  std::array<double, 6> cost_model_fit() const {
    auto ratios = [](std::span<const sched::step_sample> s, const sched::machine_limits& m) {
      std::vector<double> r;
      for (const auto& x : s) r.push_back(x.time_s / (m.step_overhead_s + m.busy_s(x.flops, x.bytes)));
      return r;
    };
    auto within = [](const std::vector<double>& r) {
      std::size_t n = 0;
      for (double x : r) n += (x >= 0.75 && x <= 1.25) ? 1 : 0;
      return r.empty() ? 0.0 : static_cast<double>(n) / static_cast<double>(r.size());
    };
    const auto raw = ratios(samples_, cm_.machine);
    std::array<double, 6> out{sched::percentile(raw, 0.1), sched::percentile(raw, 0.5), sched::percentile(raw, 0.9),
                              within(raw), 0.0, 0.0};
    if (samples_.size() >= 4) {
      std::vector<sched::step_sample> even, odd;  // calibrate on even steps, evaluate on odd ones
      for (std::size_t k = 0; k < samples_.size(); ++k) (k % 2 ? odd : even).push_back(samples_[k]);
      const auto fit = sched::fit_machine_limits(even, {.peak_flops = cm_.machine.peak_flops,
                                                        .bandwidth = cm_.machine.bandwidth});
      const auto held_out = ratios(odd, fit);
      out[4] = sched::percentile(held_out, 0.5);
      out[5] = within(held_out);
    }
    return out;
  }

  /// Tokens sampled by steps without prefill work, per second of those steps.
  double decode_tokens_per_s() const { return decode_s_ > 0 ? static_cast<double>(decode_tokens_) / decode_s_ : 0.0; }

  /// Generated tokens of request `id`.
  const std::vector<llmkit::token_id>& output(llmkit::request_id id) const { return output_.at(id); }
  /// Runs request `id`'s prompt alone, greedily, for as many tokens.
  std::vector<llmkit::token_id> solo(llmkit::request_id id) {
    engine_cache cache(model_.kv_shape(), {.n_blocks = static_cast<std::size_t>(limits_.n_blocks)});
    const auto s = *cache.add_sequence();
    std::vector<llmkit::token_id> ctx = prompt_.at(id);
    std::vector<llmkit::token_id> out;
    const std::size_t n = output_.at(id).size();
    std::size_t done = 0;
    llmkit::model::batch_builder b;
    while (out.size() < n) {
      b.clear();
      b.add(s, std::span<const llmkit::token_id>(ctx).subspan(done), static_cast<std::int32_t>(done));
      done = ctx.size();
      const auto row = model_.forward(b.view(), cache, pool_).row(0);
      out.push_back(static_cast<llmkit::token_id>(std::max_element(row.begin(), row.end()) - row.begin()));
      ctx.push_back(out.back());
    }
    return out;
  }

 private:
  llmkit::model::llama_model& model_;
  llmkit::thread_pool& pool_;
  std::vector<sched::trace_request> trace_;
  sched::engine_limits limits_;
  sched::policy policy_;
  const sched::cost_model& cm_;
  bool cpu_clock_;
  llmkit::serve::prefix_reuse reuse_;
  std::uint64_t reused_tokens_ = 0;
  std::map<llmkit::request_id, std::vector<llmkit::token_id>> prompt_, output_;
  std::vector<sched::step_sample> samples_;
  double decode_s_ = 0;
  std::int64_t decode_tokens_ = 0;
};

// Redraws only when the count moves (a step that finishes no request
// changes nothing on screen).
void progress(const std::string& name, std::int64_t done, std::int64_t total, std::int64_t& shown) {
  if (done == shown) return;
  shown = done;
  const int width = 30;
  const int filled = total > 0 ? static_cast<int>(width * done / total) : width;
  std::fprintf(stderr, "\r%-22s [%.*s%*s] %lld/%lld", name.c_str(), filled, "##############################",
               width - filled, "", static_cast<long long>(done), static_cast<long long>(total));
  if (done == total) std::fprintf(stderr, "\n");
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  llmkit_examples::command_line cli{"llmkit-serve: compare scheduling policies on a stream of requests"};
  cli.show_defaults();
  const auto model_option = cli.add_option(
      "--model", o.model,
      "GGUF model (an architecture of model/architecture.hpp: llama, qwen2, qwen3, gemma2, gemma3, phi3, qwen3moe, gpt-oss); without it, "
      "the synthetic ~100M Llama");
  cli.add_flag("--synthetic", o.synthetic, "serve the synthetic ~100M Llama (seeded random weights; the default)")
      .excludes(model_option);
  cli.add_flag("--simulate", o.simulate, "virtual time with the roofline cost model (no forward pass)");
  cli.add_flag("--json", o.json, "one JSON object per policy on stdout");
  cli.add_flag("--quiet", o.quiet, "no progress bar (there is none unless stderr is a terminal)");
  cli.add_option("-n,--requests", o.n_requests, "number of requests").count_at_least(1, "no request to serve");
  cli.add_option("--rate", o.rate, "Poisson arrival rate, requests/s (0 = all at once)").non_negative();
  cli.add_option("--prompt-shape", o.prompt_shape, "uniform | lognormal | constant");
  cli.add_option("--prompt-min", o.prompt_min, "shortest prompt (uniform; floor for all)");
  cli.add_option("--prompt-max", o.prompt_max, "longest prompt (cap for all; the constant length)");
  cli.add_option("--prompt-median", o.prompt_median, "lognormal median prompt length");
  cli.add_option("--prompt-p99", o.prompt_p99, "lognormal 99th percentile prompt length");
  cli.add_option("--output-shape", o.output_shape, "uniform | lognormal (long tail) | constant (output-max)");
  cli.add_option("--output-min", o.output_min, "shortest output (uniform; floor for all)");
  cli.add_option("--output-max", o.output_max, "longest output (cap; also every request's max_new_tokens)");
  cli.add_option("--output-median", o.output_median, "lognormal median output length");
  cli.add_option("--output-p99", o.output_p99, "lognormal 99th percentile output length (before the cap)");
  cli.add_option("--max-batch", o.max_batch, "most concurrent sequences, equal for every policy")
      .count_at_least(1, "a batch holds at least one sequence");
  cli.add_option("--step-tokens", o.step_tokens, "token budget per step of the unchunked policies (0 = enough)");
  cli.add_option("--chunk-tokens", o.chunk_tokens, "token budget per step of continuous+chunked")
      .count_at_least(1, "a step must make progress");
  cli.add_option("--row-capacity", o.row_capacity, "prepacked row length (0 = the longest prompt of each step)");
  cli.add_option("--block-size", o.block_size, "tokens per KV block").count_at_least(1, "a block holds at least one token");
  cli.add_option("--blocks", o.n_blocks, "KV blocks in the pool (0 = max-batch full contexts)");
  cli.add_option("--context", o.context, "max tokens per sequence (0 = prompt-max + output-max)");
  cli.add_option("--peak-gflops", o.peak_gflops, "override the FMA peak");
  cli.add_option("--bandwidth-gbps", o.bandwidth_gbps, "override the read bandwidth");
  cli.add_option("--step-overhead-us", o.overhead_us, "fixed cost per step in the cost model");
  cli.add_option("--seed", o.seed, "workload seed");
  cli.add_option("--threads", o.threads, "threads of the forward pass (0 = by the model's size: one per 8 MiB of weights)");
  cli.add_option("--clock", o.clock,
                 "step time: wall (steady clock) or cpu (process CPU time / threads: robust on a loaded machine, "
                 "exact with --threads 1)")
      .one_of({"wall", "cpu"});
  cli.add_option("--check", o.check, "rerun the first N requests alone and compare their greedy tokens");
  cli.add_option("--policies", o.policies, "policies to run").delimiter(',');
  cli.add_option("--shared-prefix", o.shared_prefix,
                 "every prompt starts with the same this many tokens (a system prompt), added to its drawn length");
  cli.add_option("--prefix-reuse", o.prefix_reuse, "reuse cached prompt prefixes (the engine's prefix cache)")
      .one_of({"on", "off"});
  cli.add_option("--burst", o.burst, "add this many long-prompt requests arriving during decoding (the burst workload)")
      .non_negative();
  cli.add_option("--burst-prompt", o.burst_prompt, "prompt length of a burst request");
  cli.add_option("--burst-output", o.burst_output, "output length of a burst request");
  cli.add_option("--burst-start", o.burst_start, "arrival of the first burst request, s").non_negative();
  cli.add_option("--burst-interval", o.burst_interval, "s between burst arrivals").non_negative();
  if (const auto exit_code = cli.parse(argc, argv)) return *exit_code;
  if (o.model.empty()) o.synthetic = true;

  try {
    if (!o.simulate && o.block_size != static_cast<std::int64_t>(engine_block_size))
      llmkit::detail::throw_error("--block-size: the engine's paged cache uses ", engine_block_size,
                                  "-token blocks, got ", o.block_size);
    std::optional<llmkit::model::llama_model> llama;
    std::optional<llmkit::thread_pool> pool;
    if (!o.simulate) {
      if (o.synthetic) {
        if (!o.quiet) std::fprintf(stderr, "generating the synthetic ~100M model...\n");
        const auto image = llmkit::model::synthetic_llama({.config = llmkit::model::synthetic_100m_config(),
                                                           .weight_type = llmkit::model::ggml_type::f16, .seed = 1})
                               .bytes();
        llama.emplace(llmkit::model::gguf_file(image));
      } else {
        llama.emplace(llmkit::model::llama_model::load(o.model));
      }
      if (o.threads == 0) o.threads = llmkit_examples::default_threads(llama->weight_bytes_per_step());
      pool.emplace(o.threads);
    }
    const sched::llama_config model =
        llama ? config_of(llama->config()) : o.synthetic ? synthetic_100m() : config_from_gguf(o.model);
    std::string limits_source;
    const sched::cost_model cm{.model = model, .machine = machine(o, limits_source), .block_size = o.block_size};
    cm.validate();

    sched::workload w;
    w.n_requests = o.n_requests;
    w.rate = o.rate;
    w.seed = o.seed;
    w.prompt_lengths = {.min_length = o.prompt_min, .max_length = o.prompt_max, .median = o.prompt_median,
                        .p99 = o.prompt_p99, .constant = o.prompt_max};
    if (o.prompt_shape == "lognormal")
      w.prompt_lengths.shape = llmkit::pack::length_shape::lognormal;
    else if (o.prompt_shape == "constant")
      w.prompt_lengths.shape = llmkit::pack::length_shape::constant;
    else if (o.prompt_shape != "uniform")
      llmkit::detail::throw_error("--prompt-shape: unknown shape '", o.prompt_shape, "' (uniform, lognormal, constant)");
    w.output_lengths = {.min_length = o.output_min, .max_length = o.output_max, .median = o.output_median,
                        .p99 = o.output_p99, .constant = o.output_max};
    if (o.output_shape == "lognormal")
      w.output_lengths.shape = llmkit::pack::length_shape::lognormal;
    else if (o.output_shape == "constant")
      w.output_lengths.shape = llmkit::pack::length_shape::constant;
    else if (o.output_shape != "uniform")
      llmkit::detail::throw_error("--output-shape: unknown shape '", o.output_shape, "' (uniform, lognormal, constant)");
    auto trace = sched::make_trace(w);
    for (std::int64_t i = 0; i < o.burst; ++i)
      trace.push_back({.id = o.n_requests + i,
                       .arrival_s = o.burst_start + o.burst_interval * static_cast<double>(i),
                       .n_prompt = static_cast<std::int64_t>(o.burst_prompt),
                       .n_output = static_cast<std::int64_t>(o.burst_output),
                       .max_new_tokens = static_cast<std::int64_t>(o.burst_output)});
    for (auto& r : trace) r.n_prompt += static_cast<std::int64_t>(o.shared_prefix);
    std::stable_sort(trace.begin(), trace.end(), [](const auto& a, const auto& b) { return a.arrival_s < b.arrival_s; });
    if (!o.simulate)  // a real run stops at the drawn length
      for (auto& r : trace) r.max_new_tokens = r.n_output;

    const std::int64_t context =
        o.context > 0 ? o.context
                      : static_cast<std::int64_t>(std::max(o.shared_prefix + o.prompt_max + o.output_max,
                                                           o.burst > 0 ? o.burst_prompt + o.burst_output : 0));
    const sched::engine_limits limits{
        .max_context = context,
        .block_size = o.block_size,
        .n_blocks = o.n_blocks > 0 ? o.n_blocks : o.max_batch * sched::blocks_for(context, o.block_size)};

    if (!o.json) {
      std::printf("model: %s  (%lld layers, dim %lld, %lld heads / %lld KV, ffn %lld, vocab %lld)\n",
                  o.synthetic ? "synthetic ~100M (seeded random weights)" : o.model.c_str(), static_cast<long long>(model.n_layers),
                  static_cast<long long>(model.dim), static_cast<long long>(model.n_heads),
                  static_cast<long long>(model.n_kv_heads), static_cast<long long>(model.ffn_dim),
                  static_cast<long long>(model.vocab));
      std::printf("machine: %.1f GFLOP/s, %.2f GB/s, %.0f us/step  [%s]%s\n", cm.machine.peak_flops / 1e9,
                  cm.machine.bandwidth / 1e9, cm.machine.step_overhead_s * 1e6, limits_source.c_str(),
                  o.simulate ? "" : ("; " + std::to_string(o.threads) + " thread(s)").c_str());
      char arrivals[48] = "all at once";
      if (o.rate > 0) std::snprintf(arrivals, sizeof arrivals, "%.1f req/s", o.rate);
      std::printf("workload: %lld requests, %s, prompts %s [%zu, %zu], outputs %s [%zu, %zu], max batch %lld, "
                  "KV pool %lld blocks of %lld  (%s)\n\n",
                  static_cast<long long>(o.n_requests), arrivals, o.prompt_shape.c_str(), o.prompt_min, o.prompt_max,
                  o.output_shape.c_str(), o.output_min, o.output_max, static_cast<long long>(o.max_batch),
                  static_cast<long long>(limits.n_blocks), static_cast<long long>(limits.block_size),
                  o.simulate ? "simulated time"
                  : o.clock == "cpu" ? "measured steps (process CPU time / threads), greedy, reference forward pass"
                                     : "measured steps (wall time), greedy, reference forward pass");
      std::printf("%-22s %10s %10s %10s %10s %10s %8s %8s %7s %8s\n", "policy", "tok/s", "TTFT p50", "TTFT p99",
                  "TPOT p50", "TPOT p99", "KV mean", "KV peak", "preempt", "padding");
    }
    if (llama) {
      LLMKIT_CHECK(static_cast<std::size_t>(context) <= llama->config().context_length, "--context: ", context,
                   " tokens exceed the model's context of ", llama->config().context_length);
    }
    for (const std::string& name : o.policies) {
      const sched::policy p = make_policy(name, o, context);
      sched::run_options ro;
      std::int64_t shown = -1;
      if (!o.quiet && llmkit_examples::stderr_is_terminal())
        ro.on_progress = [&](std::int64_t d, std::int64_t t) { progress(name, d, t, shown); };
      sched::run_result r;
      std::array<double, 6> fit{};
      double decode_rate = 0;
      std::uint64_t reused = 0;
      if (o.simulate) {
        r = sched::simulate(trace, limits, p, cm, ro);
      } else {
        replay e(*llama, *pool, trace, limits, p, o.seed, cm, o.clock == "cpu", o.shared_prefix,
                 o.prefix_reuse == "on" ? llmkit::serve::prefix_reuse::enabled : llmkit::serve::prefix_reuse::disabled);
        r = e.run(ro);
        reused = e.reused_tokens();
        fit = e.cost_model_fit();
        decode_rate = e.decode_tokens_per_s();
        for (std::int64_t id = 0; id < std::min<std::int64_t>(o.check, o.n_requests); ++id)
          if (e.output(id) != e.solo(id))
            llmkit::detail::throw_error("--check: request ", id, " under ", name, " differs from its solo run");
      }
      if (o.json) {
        nlohmann::json j{{"policy", name},
                         {"mode", o.simulate ? "simulated" : "measured"},
                         {"tokens_per_s", r.tokens_per_s},
                         {"total_tokens_per_s", r.total_tokens_per_s},
                         {"ttft_mean_ms", r.ttft_mean_s * 1e3},
                         {"ttft_p50_ms", r.ttft_p50_s * 1e3},
                         {"ttft_p99_ms", r.ttft_p99_s * 1e3},
                         {"tpot_p50_ms", r.tpot_p50_s * 1e3},
                         {"tpot_p99_ms", r.tpot_p99_s * 1e3},
                         {"itl_p50_ms", r.itl_p50_s * 1e3},
                         {"itl_p99_ms", r.itl_p99_s * 1e3},
                         {"requests_done", r.requests_done},
                         {"generated_tokens", r.generated_tokens},
                         {"makespan_s", r.makespan_s},
                         {"kv_use_mean", r.kv_use_mean},
                         {"kv_use_peak", r.kv_use_peak},
                         {"preemptions", r.n_preemptions},
                         {"padding_overhead", r.padding_overhead},
                         {"steps", r.n_steps},
                         {"rate", o.rate}};
        if (!o.simulate) {
          j["threads"] = o.threads;
          j["decode_tokens_per_s"] = decode_rate;
          j["prompt_tokens_reused"] = reused;
          j["step_time_measured_over_model_p10"] = fit[0];
          j["step_time_measured_over_model_p50"] = fit[1];
          j["step_time_measured_over_model_p90"] = fit[2];
          j["step_time_within_25pct"] = fit[3];
          j["calibrated_held_out_ratio_p50"] = fit[4];
          j["calibrated_held_out_within_25pct"] = fit[5];
        }
        std::printf("%s\n", j.dump().c_str());
      } else {
        std::printf("%-22s %10.1f %8.2fms %8.2fms %8.3fms %8.3fms %7.1f%% %7.1f%% %7lld %7.2fx\n", name.c_str(),
                    r.tokens_per_s, r.ttft_p50_s * 1e3, r.ttft_p99_s * 1e3, r.tpot_p50_s * 1e3, r.tpot_p99_s * 1e3,
                    100 * r.kv_use_mean, 100 * r.kv_use_peak, static_cast<long long>(r.n_preemptions),
                    r.padding_overhead);
        if (!o.simulate)
          std::printf("%-22s decode rate (steps without prefill): %.1f tok/s; prompt tokens reused from the prefix cache: "
                      "%llu\n",
                      "", decode_rate, static_cast<unsigned long long>(reused));
        if (!o.simulate)
          std::printf("%-22s step time measured / cost model: p10 %.2f  p50 %.2f  p90 %.2f  (%.0f%% of steps within 25%%); "
                      "calibrated on even steps: p50 %.2f, %.0f%% of odd steps within 25%%\n",
                      "", fit[0], fit[1], fit[2], 100 * fit[3], fit[4], 100 * fit[5]);
      }
      std::fflush(stdout);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "llmkit-serve: %s\n", e.what());
    return 1;
  }
  return 0;
}
