// SPDX-License-Identifier: MIT
// llmkit-serve: serves a stream of requests (Poisson arrivals, mixed prompt
// and output lengths) under four scheduling policies in the same run and
// prints throughput, TTFT, TPOT and KV pool use for each:
//   request-level            static batches, padded prefill, KV reserved up front
//   continuous               iteration-level batching, prefills of a step padded to the longest
//   continuous+chunked       prefills split under a per-step token budget (ragged)
//   continuous+prepacked     prefills of a step bin-packed into rows (llmkit/pack FFD)
//
// --simulate runs the policies in virtual time with the roofline cost model
// (model shapes from the GGUF file or the synthetic ~100M config, machine
// limits from build/roofline.json written by bench_roofline).
#include <llmkit/model/gguf.hpp>
#include <llmkit/sched/cost_model.hpp>
#include <llmkit/sched/policy.hpp>
#include <llmkit/sched/simulator.hpp>
#include <llmkit/sched/trace.hpp>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstdlib>
#include <fstream>
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
  std::int64_t n_requests = 64;
  double rate = 50.0;
  std::string prompt_shape = "uniform";
  std::size_t prompt_min = 16, prompt_max = 128;
  double prompt_median = 48, prompt_p99 = 120;
  std::size_t output_min = 16, output_max = 64;
  std::int64_t max_batch = 8;
  std::int64_t step_tokens = 0;  // 0 = max_batch * context (request-level) / context (others)
  std::int64_t chunk_tokens = 64;
  std::int64_t row_capacity = 0;
  std::int64_t block_size = 16;
  std::int64_t n_blocks = 0;
  std::int64_t context = 0;
  double peak_gflops = 0, bandwidth_gbps = 0, overhead_us = 20;
  std::uint64_t seed = 1;
  std::vector<std::string> policies = {"request-level", "continuous", "continuous+chunked", "continuous+prepacked"};
};

sched::llama_config config_from_gguf(const std::string& path) {
  const auto file = llmkit::model::gguf_file::open(path);
  sched::llama_config c;
  c.n_layers = static_cast<std::int64_t>(file.get<std::size_t>("llama.block_count"));
  c.dim = static_cast<std::int64_t>(file.get<std::size_t>("llama.embedding_length"));
  c.n_heads = static_cast<std::int64_t>(file.get<std::size_t>("llama.attention.head_count"));
  c.n_kv_heads = static_cast<std::int64_t>(
      file.get_optional<std::size_t>("llama.attention.head_count_kv").value_or(static_cast<std::size_t>(c.n_heads)));
  c.head_dim = c.dim / c.n_heads;
  c.ffn_dim = static_cast<std::int64_t>(file.get<std::size_t>("llama.feed_forward_length"));
  c.vocab = static_cast<std::int64_t>(file.tensor("token_embd.weight").rows());
  c.bytes_per_weight = 4;  // the reference forward pass computes in f32
  c.bytes_per_kv = 4;
  return c;
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

void progress(const std::string& name, std::int64_t done, std::int64_t total) {
  const int width = 30;
  const int filled = total > 0 ? static_cast<int>(width * done / total) : width;
  std::fprintf(stderr, "\r%-22s [%.*s%*s] %lld/%lld", name.c_str(), filled, "##############################",
               width - filled, "", static_cast<long long>(done), static_cast<long long>(total));
  if (done == total) std::fprintf(stderr, "\n");
}

}  // namespace

int main(int argc, char** argv) {
  options o;
#if defined(LLMKIT_DEFAULT_MODEL)
  o.model = LLMKIT_DEFAULT_MODEL;
#endif
  CLI::App app{"llmkit-serve: compare scheduling policies on a stream of requests"};
  app.add_option("--model", o.model, "GGUF model (Llama architecture)");
  app.add_flag("--synthetic", o.synthetic, "use the synthetic ~100M Llama config instead of --model");
  app.add_flag("--simulate", o.simulate, "virtual time with the roofline cost model (no forward pass)");
  app.add_flag("--json", o.json, "one JSON object per policy on stdout");
  app.add_flag("--quiet", o.quiet, "no progress bar");
  app.add_option("-n,--requests", o.n_requests, "number of requests")->check(CLI::PositiveNumber);
  app.add_option("--rate", o.rate, "Poisson arrival rate, requests/s (0 = all at once)")->check(CLI::NonNegativeNumber);
  app.add_option("--prompt-shape", o.prompt_shape, "uniform | lognormal | constant");
  app.add_option("--prompt-min", o.prompt_min, "shortest prompt (uniform; floor for all)");
  app.add_option("--prompt-max", o.prompt_max, "longest prompt (cap for all; the constant length)");
  app.add_option("--prompt-median", o.prompt_median, "lognormal median prompt length");
  app.add_option("--prompt-p99", o.prompt_p99, "lognormal 99th percentile prompt length");
  app.add_option("--output-min", o.output_min, "shortest output");
  app.add_option("--output-max", o.output_max, "longest output (also every request's max_new_tokens)");
  app.add_option("--max-batch", o.max_batch, "most concurrent sequences, equal for every policy")->check(CLI::PositiveNumber);
  app.add_option("--step-tokens", o.step_tokens, "token budget per step of the unchunked policies (0 = enough)");
  app.add_option("--chunk-tokens", o.chunk_tokens, "token budget per step of continuous+chunked")->check(CLI::PositiveNumber);
  app.add_option("--row-capacity", o.row_capacity, "prepacked row length (0 = the longest prompt of each step)");
  app.add_option("--block-size", o.block_size, "tokens per KV block")->check(CLI::PositiveNumber);
  app.add_option("--blocks", o.n_blocks, "KV blocks in the pool (0 = max-batch full contexts)");
  app.add_option("--context", o.context, "max tokens per sequence (0 = prompt-max + output-max)");
  app.add_option("--peak-gflops", o.peak_gflops, "override the FMA peak");
  app.add_option("--bandwidth-gbps", o.bandwidth_gbps, "override the read bandwidth");
  app.add_option("--step-overhead-us", o.overhead_us, "fixed cost per step in the cost model");
  app.add_option("--seed", o.seed, "workload seed");
  app.add_option("--policies", o.policies, "policies to run")->delimiter(',');
  CLI11_PARSE(app, argc, argv);

  try {
    if (!o.simulate) {
      std::fprintf(stderr,
                   "llmkit-serve: the model-driven run is not available in this build (it needs the reference Llama "
                   "forward pass wired to the scheduler); running --simulate\n");
      o.simulate = true;
    }
    const sched::llama_config model = o.synthetic ? synthetic_100m() : config_from_gguf(o.model);
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
    w.output_lengths = {.min_length = o.output_min, .max_length = o.output_max};
    const auto trace = sched::make_trace(w);

    const std::int64_t context =
        o.context > 0 ? o.context : static_cast<std::int64_t>(o.prompt_max + o.output_max);
    const sched::engine_limits limits{
        .max_context = context,
        .block_size = o.block_size,
        .n_blocks = o.n_blocks > 0 ? o.n_blocks : o.max_batch * sched::blocks_for(context, o.block_size)};

    if (!o.json) {
      std::printf("model: %s  (%lld layers, dim %lld, %lld heads / %lld KV, ffn %lld, vocab %lld)\n",
                  o.synthetic ? "synthetic ~100M" : o.model.c_str(), static_cast<long long>(model.n_layers),
                  static_cast<long long>(model.dim), static_cast<long long>(model.n_heads),
                  static_cast<long long>(model.n_kv_heads), static_cast<long long>(model.ffn_dim),
                  static_cast<long long>(model.vocab));
      std::printf("machine: %.1f GFLOP/s, %.2f GB/s, %.0f us/step  [%s]\n", cm.machine.peak_flops / 1e9,
                  cm.machine.bandwidth / 1e9, cm.machine.step_overhead_s * 1e6, limits_source.c_str());
      std::printf("workload: %lld requests, %.1f req/s, prompts %s [%zu, %zu], outputs [%zu, %zu], max batch %lld, "
                  "KV pool %lld blocks of %lld  (simulated time)\n\n",
                  static_cast<long long>(o.n_requests), o.rate, o.prompt_shape.c_str(), o.prompt_min, o.prompt_max,
                  o.output_min, o.output_max, static_cast<long long>(o.max_batch),
                  static_cast<long long>(limits.n_blocks), static_cast<long long>(limits.block_size));
      std::printf("%-22s %10s %10s %10s %10s %10s %8s %8s %7s %8s\n", "policy", "tok/s", "TTFT p50", "TTFT p99",
                  "TPOT p50", "TPOT p99", "KV mean", "KV peak", "preempt", "padding");
    }
    for (const std::string& name : o.policies) {
      const sched::policy p = make_policy(name, o, context);
      sched::run_options ro;
      if (!o.quiet) ro.on_progress = [&](std::int64_t d, std::int64_t t) { progress(name, d, t); };
      const sched::run_result r = sched::simulate(trace, limits, p, cm, ro);
      if (o.json) {
        nlohmann::json j{{"policy", name},
                         {"mode", "simulated"},
                         {"tokens_per_s", r.tokens_per_s},
                         {"total_tokens_per_s", r.total_tokens_per_s},
                         {"ttft_p50_ms", r.ttft_p50_s * 1e3},
                         {"ttft_p99_ms", r.ttft_p99_s * 1e3},
                         {"tpot_p50_ms", r.tpot_p50_s * 1e3},
                         {"tpot_p99_ms", r.tpot_p99_s * 1e3},
                         {"itl_p99_ms", r.itl_p99_s * 1e3},
                         {"requests_done", r.requests_done},
                         {"generated_tokens", r.generated_tokens},
                         {"makespan_s", r.makespan_s},
                         {"kv_use_mean", r.kv_use_mean},
                         {"kv_use_peak", r.kv_use_peak},
                         {"preemptions", r.n_preemptions},
                         {"padding_overhead", r.padding_overhead},
                         {"steps", r.n_steps}};
        std::printf("%s\n", j.dump().c_str());
      } else {
        std::printf("%-22s %10.1f %8.2fms %8.2fms %8.3fms %8.3fms %7.1f%% %7.1f%% %7lld %7.2fx\n", name.c_str(),
                    r.tokens_per_s, r.ttft_p50_s * 1e3, r.ttft_p99_s * 1e3, r.tpot_p50_s * 1e3, r.tpot_p99_s * 1e3,
                    100 * r.kv_use_mean, 100 * r.kv_use_peak, static_cast<long long>(r.n_preemptions),
                    r.padding_overhead);
      }
      std::fflush(stdout);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "llmkit-serve: %s\n", e.what());
    return 1;
  }
  return 0;
}
