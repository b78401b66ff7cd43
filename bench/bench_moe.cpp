// SPDX-License-Identifier: MIT
// bench_moe: the routed products (moe/routed_ffn.hpp) and the qwen3moe
// model on Qwen3-30B-A3B's layer shape (dim 2048, 128 experts of FFN width
// 768, 8 active; 32 query heads of 128, 4 KV heads, vocabulary 151,936).
//
//   routed_decode/<format>/threads:N    one token through one layer's routed
//                                       FFN (8 random experts of 128): tokens/s,
//                                       routed_MB = the chosen experts' gate,
//                                       up and down bytes (what the token reads),
//                                       frac_read_roof = routed bytes/s / the
//                                       roofline read bandwidth of N threads.
//                                       Layers rotate through >= 1 GiB of
//                                       experts, so every step reads from DRAM.
//   dense_decode/<format>/threads:N     the baseline in the same run: the same
//                                       8 experts' gate, up and down as 24
//                                       dense model::linear products of one
//                                       token (no grouping, no activation).
//   routed_prefill/<format>/threads:N   512 tokens, softmax-top-8 routing of
//                                       random logits: weights/s = the
//                                       multiply-adds per second (expert rows x
//                                       cols x tokens routed to it).
//   dense_prefill/<format>/threads:N    the baseline in the same run: 512 tokens
//                                       through dense [768, 2048] gate and up and
//                                       [2048, 768] down products of the same
//                                       format (model::linear), weights/s the same way.
//   routed_decode/gpt-oss-20b/mxfp4/threads:N, dense_decode/...
//                                       the same on gpt-oss-20b's layer: 32
//                                       MXFP4 experts of 2880 x 2880, 4 active.
//   model_decode/<file>/threads:N       a whole model, one token per step after
//                                       a 64-token prompt: tokens/s, routed_MB
//                                       and weight_MB per token
//                                       (llama_model::weight_bytes_per_step),
//                                       frac_read_roof on the weight bytes.
//                                       Files: qwen3-30b-a3b-q4_k_m (qwen3moe,
//                                       Q4_K_M, 32/4 heads of 128, vocabulary
//                                       151,936) and gpt-oss-20b-mxfp4 (gpt-oss,
//                                       MXFP4 experts, Q8_0 elsewhere, 64/8
//                                       heads of 64, window 128 on every other
//                                       layer, vocabulary 201,088).
//
// The models are synthetic files with LLMKIT_BENCH_MOE_LAYERS layers
// (default 4; 48 is the full 18 GB Qwen3-30B-A3B, 24 the full gpt-oss-20b),
// written once (one tensor in memory at a time) to
// <source>/build/bench-moe-<file>-L<layers>.gguf. Under
// LLMKIT_BENCH_SMOKE=1 every shape is small. Int8 activations throughout
// (the model's default). One thread is timed by the thread's CPU time, two
// by wall time.
#include <benchmark/benchmark.h>

#include <llmkit/core/executor.hpp>
#include <llmkit/kv/contiguous_cache.hpp>
#include <llmkit/model/batch.hpp>
#include <llmkit/model/llama.hpp>
#include <llmkit/model/synthetic.hpp>
#include <llmkit/moe/routed_ffn.hpp>
#include <llmkit/moe/router.hpp>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "roofline.hpp"

namespace {

using namespace llmkit;
using llmkit_bench::smoke;
using model::activation_type;
using model::weight_type;

struct moe_shape {
  std::size_t dim, n_expert, k, expert_ffn;
};

/// The layer shapes measured: Qwen3-30B-A3B's and gpt-oss-20b's.
enum class shape_id { qwen3_30b_a3b, gpt_oss_20b };

moe_shape shape(shape_id id = shape_id::qwen3_30b_a3b) {
  if (id == shape_id::gpt_oss_20b) return smoke() ? moe_shape{256, 8, 4, 256} : moe_shape{2880, 32, 4, 2880};
  return smoke() ? moe_shape{256, 16, 4, 256} : moe_shape{2048, 128, 8, 768};
}

constexpr std::size_t prefill_tokens = 512;

std::string build_dir() {
#if defined(LLMKIT_SOURCE_DIR)
  return std::string(LLMKIT_SOURCE_DIR) + "/build/";
#else
  return {};
#endif
}

// One layer's experts: gate, up and down.
struct expert_layer {
  moe::expert_tensor gate, up, down;
};

// A [n_expert, rows, cols] tensor of `type`: a few experts quantised from
// random values, copied to the others (the bytes read are what matters).
moe::expert_tensor make_experts(weight_type type, std::size_t n_expert, std::size_t rows, std::size_t cols,
                                std::mt19937& rng) {
  constexpr std::size_t distinct = 4;
  std::normal_distribution<float> d(0.0f, 1.0f / std::sqrt(float(cols)));
  std::vector<model::weight_matrix> seeds;
  std::vector<float> row(cols);
  for (std::size_t s = 0; s < distinct; ++s) {
    seeds.emplace_back(type, rows, cols);
    for (std::size_t r = 0; r < rows; ++r) {
      for (float& v : row) v = d(rng);
      seeds.back().set_row(r, row);
    }
  }
  std::vector<model::weight_matrix> experts;
  for (std::size_t e = 0; e < n_expert; ++e) experts.push_back(seeds[e % distinct]);
  return moe::expert_tensor(std::move(experts));
}

// Layers of experts of one format, enough of them (decode) that cycling
// through them reads from DRAM.
const std::vector<expert_layer>& layers(weight_type type, bool many, shape_id id = shape_id::qwen3_30b_a3b) {
  static std::map<std::tuple<weight_type, bool, shape_id>, std::vector<expert_layer>> cache;
  auto& out = cache[{type, many, id}];
  if (!out.empty()) return out;
  const moe_shape s = shape(id);
  std::mt19937 rng(48);
  std::size_t n = 1;
  if (many && !smoke()) {
    const expert_layer one{make_experts(type, 1, s.expert_ffn, s.dim, rng), make_experts(type, 1, s.expert_ffn, s.dim, rng),
                           make_experts(type, 1, s.dim, s.expert_ffn, rng)};
    const std::size_t layer_bytes = s.n_expert * (one.gate.bytes() + one.up.bytes() + one.down.bytes());
    n = ((std::size_t{1} << 30) + layer_bytes - 1) / layer_bytes;
  }
  for (std::size_t l = 0; l < n; ++l)
    out.push_back({make_experts(type, s.n_expert, s.expert_ffn, s.dim, rng),
                   make_experts(type, s.n_expert, s.expert_ffn, s.dim, rng),
                   make_experts(type, s.n_expert, s.dim, s.expert_ffn, rng)});
  return out;
}

struct routing {
  std::vector<moe::expert_id> ids;
  std::vector<float> weights;
};

// Softmax top-k of random router logits: about n * k / n_expert tokens per expert, unevenly.
routing random_routing(std::size_t n, std::uint64_t seed, shape_id id = shape_id::qwen3_30b_a3b) {
  const moe_shape s = shape(id);
  std::mt19937 rng(static_cast<std::uint32_t>(seed));
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> logits(n * s.n_expert);
  for (float& v : logits) v = d(rng);
  routing r{std::vector<moe::expert_id>(n * s.k), std::vector<float>(n * s.k)};
  moe::route(moe::softmax_top_k{}, matrix_view<const float>(logits.data(), n, s.n_expert),
             matrix_view<moe::expert_id>(r.ids.data(), n, s.k), matrix_view<float>(r.weights.data(), n, s.k));
  return r;
}

std::vector<float> random_x(std::size_t n, std::size_t dim) {
  std::mt19937 rng(7);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> x(n * dim);
  for (float& v : x) v = d(rng);
  return x;
}

struct stopwatch {
  std::size_t threads;
  double start = now();
  double now() const {
    if (threads <= 1) return llmkit_bench::thread_cpu_seconds();
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  }
  double seconds() const { return now() - start; }
};

void bm_routed_decode(benchmark::State& state, weight_type type, std::size_t threads,
                      shape_id id = shape_id::qwen3_30b_a3b) {
  const moe_shape s = shape(id);
  const auto& ls = layers(type, true, id);
  thread_pool pool(threads);
  std::vector<routing> routes;
  for (std::size_t i = 0; i < 64; ++i) routes.push_back(random_routing(1, 1000 + i, id));
  const auto x = random_x(1, s.dim);
  std::vector<float> out(s.dim);
  moe::routed_ffn_workspace ws;
  const double routed_bytes = double(s.k) * double(ls[0].gate.expert_bytes() + ls[0].up.expert_bytes() +
                                                   ls[0].down.expert_bytes());
  std::size_t step = 0;
  const stopwatch clock{threads};
  for (auto _ : state) {
    const expert_layer& l = ls[step % ls.size()];
    const routing& r = routes[step % routes.size()];
    ++step;
    moe::routed_ffn(pool,
                    {.x = matrix_view<const float>(x.data(), 1, s.dim),
                     .ids = matrix_view<const moe::expert_id>(r.ids.data(), 1, s.k),
                     .weights = matrix_view<const float>(r.weights.data(), 1, s.k),
                     .gate = l.gate,
                     .up = l.up,
                     .down = l.down,
                     .out = matrix_view<float>(out.data(), 1, s.dim),
                     .activations = activation_type::q8_0},
                    ws);
    benchmark::DoNotOptimize(out.data());
  }
  const double seconds = clock.seconds();
  const double tokens = double(state.iterations());
  state.counters["tokens"] = benchmark::Counter(tokens, benchmark::Counter::kIsRate);
  state.counters["routed_MB"] = routed_bytes * 1e-6;
  state.counters["GBps"] = routed_bytes * tokens * 1e-9 / seconds;
  state.counters["frac_read_roof"] =
      routed_bytes * tokens * 1e-9 / seconds / llmkit_bench::roofline::get().read_gbps(threads);
  state.counters["layers"] = double(ls.size());
}

void bm_dense_decode(benchmark::State& state, weight_type type, std::size_t threads,
                     shape_id id = shape_id::qwen3_30b_a3b) {
  const moe_shape s = shape(id);
  const auto& ls = layers(type, true, id);
  thread_pool pool(threads);
  std::vector<routing> routes;
  for (std::size_t i = 0; i < 64; ++i) routes.push_back(random_routing(1, 1000 + i, id));
  const auto x = random_x(1, s.dim);
  std::vector<float> g(s.expert_ffn), u(s.expert_ffn), y(s.dim);
  const double routed_bytes = double(s.k) * double(ls[0].gate.expert_bytes() + ls[0].up.expert_bytes() +
                                                   ls[0].down.expert_bytes());
  std::size_t step = 0;
  const stopwatch clock{threads};
  for (auto _ : state) {
    const expert_layer& l = ls[step % ls.size()];
    const routing& r = routes[step % routes.size()];
    ++step;
    for (const moe::expert_id e : r.ids) {
      const auto i = static_cast<std::size_t>(e);
      model::linear(pool, x, 1, l.gate.expert(i), g, s.expert_ffn, model::output_mode::overwrite, activation_type::q8_0);
      model::linear(pool, x, 1, l.up.expert(i), u, s.expert_ffn, model::output_mode::overwrite, activation_type::q8_0);
      model::linear(pool, g, 1, l.down.expert(i), y, s.dim, model::output_mode::overwrite, activation_type::q8_0);
    }
    benchmark::DoNotOptimize(y.data());
  }
  const double seconds = clock.seconds();
  const double tokens = double(state.iterations());
  state.counters["tokens"] = benchmark::Counter(tokens, benchmark::Counter::kIsRate);
  state.counters["GBps"] = routed_bytes * tokens * 1e-9 / seconds;
  state.counters["frac_read_roof"] =
      routed_bytes * tokens * 1e-9 / seconds / llmkit_bench::roofline::get().read_gbps(threads);
}

void bm_routed_prefill(benchmark::State& state, weight_type type, std::size_t threads) {
  const moe_shape s = shape();
  const expert_layer& l = layers(type, false).front();
  thread_pool pool(threads);
  const routing r = random_routing(prefill_tokens, 5);
  const auto x = random_x(prefill_tokens, s.dim);
  std::vector<float> out(prefill_tokens * s.dim);
  moe::routed_ffn_workspace ws;
  const stopwatch clock{threads};
  for (auto _ : state) {
    moe::routed_ffn(pool,
                    {.x = matrix_view<const float>(x.data(), prefill_tokens, s.dim),
                     .ids = matrix_view<const moe::expert_id>(r.ids.data(), prefill_tokens, s.k),
                     .weights = matrix_view<const float>(r.weights.data(), prefill_tokens, s.k),
                     .gate = l.gate,
                     .up = l.up,
                     .down = l.down,
                     .out = matrix_view<float>(out.data(), prefill_tokens, s.dim),
                     .activations = activation_type::q8_0},
                    ws);
    benchmark::DoNotOptimize(out.data());
  }
  const double seconds = clock.seconds();
  const double macs = double(prefill_tokens * s.k) * 3.0 * double(s.dim * s.expert_ffn);
  state.counters["weights_per_s"] = double(state.iterations()) * macs / seconds;
  state.counters["tokens"] =
      benchmark::Counter(double(state.iterations()) * double(prefill_tokens), benchmark::Counter::kIsRate);
}

void bm_dense_prefill(benchmark::State& state, weight_type type, std::size_t threads) {
  const moe_shape s = shape();
  const expert_layer& l = layers(type, false).front();
  thread_pool pool(threads);
  const auto x = random_x(prefill_tokens, s.dim);
  std::vector<float> g(prefill_tokens * s.expert_ffn), u(g.size()), h(g.size()), y(prefill_tokens * s.dim);
  const stopwatch clock{threads};
  for (auto _ : state) {
    model::linear(pool, x, prefill_tokens, l.gate.expert(0), g, s.expert_ffn, model::output_mode::overwrite,
                  activation_type::q8_0);
    model::linear(pool, x, prefill_tokens, l.up.expert(0), u, s.expert_ffn, model::output_mode::overwrite,
                  activation_type::q8_0);
    model::linear(pool, g, prefill_tokens, l.down.expert(0), y, s.dim, model::output_mode::overwrite,
                  activation_type::q8_0);
    benchmark::DoNotOptimize(y.data());
  }
  const double seconds = clock.seconds();
  const double macs = double(prefill_tokens) * 3.0 * double(s.dim * s.expert_ffn);
  state.counters["weights_per_s"] = double(state.iterations()) * macs / seconds;
}

std::size_t model_layers() {
  if (smoke()) return 2;
  if (const char* v = std::getenv("LLMKIT_BENCH_MOE_LAYERS")) return std::max<std::size_t>(1, std::strtoul(v, nullptr, 10));
  return 4;
}

/// The whole models measured: Qwen3-30B-A3B at Q4_K_M, and gpt-oss-20b with
/// MXFP4 experts and Q8_0 elsewhere.
struct moe_file {
  const char* name;
  shape_id layer;
};
const moe_file moe_files[] = {{"qwen3-30b-a3b-q4_k_m", shape_id::qwen3_30b_a3b},
                              {"gpt-oss-20b-mxfp4", shape_id::gpt_oss_20b}};

model::synthetic_options moe_options(const moe_file& f) {
  const moe_shape s = shape(f.layer);
  const bool oss = f.layer == shape_id::gpt_oss_20b;
  model::synthetic_options o;
  model::llama_config& c = o.config;
  c.dim = s.dim;
  c.n_layers = model_layers();
  c.n_expert = s.n_expert;
  c.n_expert_used = s.k;
  c.expert_ffn_dim = s.expert_ffn;
  c.context_length = 4096;
  c.head_dim = smoke() || oss ? 64 : 128;
  c.rope.rotary_dim = c.head_dim;
  c.n_kv_heads = smoke() ? 2 : oss ? 8 : 4;
  if (oss) {
    c.arch = model::architecture::gpt_oss;
    c.n_vocab = smoke() ? 1000 : 201088;
    c.n_heads = smoke() ? 4 : 64;
    c.ffn_dim = s.expert_ffn;
    c.rope.theta = 150000.0f;
    c.rms_eps = 1e-5f;
    c.sliding_window = 128;
    o.seed = 20;
    o.tensor_types = [](std::string_view name) {
      return name.ends_with("_exps.weight") ? model::ggml_type::mxfp4 : model::ggml_type::q8_0;
    };
  } else {
    c.arch = model::architecture::qwen3moe;
    c.n_vocab = smoke() ? 1000 : 151936;
    c.n_heads = smoke() ? 4 : 32;
    c.ffn_dim = smoke() ? 512 : 6144;
    c.rope.theta = 1000000.0f;
    c.rms_eps = 1e-6f;
    o.seed = 30;
    o.tensor_types = model::q4_k_m_types(o);
  }
  return o;
}

model::llama_model& moe_model(const moe_file& f) {
  static std::map<std::string, std::unique_ptr<model::llama_model>> loaded;
  auto& m = loaded[f.name];
  if (m) return *m;
  const model::synthetic_options o = moe_options(f);
  const std::string path = build_dir() + "bench-moe-" + f.name + (smoke() ? "-smoke" : "") + "-L" +
                           std::to_string(o.config.n_layers) + ".gguf";
  if (!std::filesystem::exists(path)) {
    // Through a temporary file, so an interrupted write leaves no truncated
    // model; a checkout configured elsewhere has no <source>/build yet.
    if (const auto dir = std::filesystem::path(path).parent_path(); !dir.empty())
      std::filesystem::create_directories(dir);
    model::write_synthetic_llama(path + ".tmp", o);
    std::filesystem::rename(path + ".tmp", path);
  }
  m = std::make_unique<model::llama_model>(model::llama_model::load(path));
  return *m;
}

void bm_model_decode(benchmark::State& state, const moe_file& f, std::size_t threads) {
  auto& m = moe_model(f);
  const auto& c = m.config();
  thread_pool pool(threads);
  constexpr std::size_t prompt = 64;
  kv::contiguous_cache<float> cache(m.kv_shape(), {.max_sequences = 1, .max_tokens = 4 * prompt});
  const auto seq = *cache.add_sequence();
  std::vector<std::int32_t> p(prompt);
  for (std::size_t i = 0; i < prompt; ++i) p[i] = std::int32_t(3 + (i * 7919) % (m.vocab_size() - 3));
  {
    model::batch_builder b;
    b.add(seq, p, 0);
    m.forward(b.view(), cache, pool);
  }
  const double weight_bytes = double(m.weight_bytes_per_step());
  std::int32_t token = p.back();
  std::size_t step = 0;
  model::batch_builder b;
  const stopwatch clock{threads};
  for (auto _ : state) {
    if (cache.n_tokens(seq) == 4 * prompt) cache.truncate(seq, prompt);
    b.clear();
    b.add(seq, {&token, 1}, static_cast<std::int32_t>(cache.n_tokens(seq)));
    const auto logits = m.forward(b.view(), cache, pool);
    benchmark::DoNotOptimize(logits.data());
    token = static_cast<std::int32_t>(3 + (++step * 7919) % (m.vocab_size() - 3));
  }
  const double seconds = clock.seconds();
  const double tokens = double(state.iterations());
  // Per layer: the router (F32) and k experts' gate, up and down, each in
  // its own format.
  const moe_shape s = shape(f.layer);
  const auto types = moe_options(f).tensor_types;
  auto expert_bytes = [&](const std::string& name, std::size_t rows, std::size_t cols) {
    const auto t = types(name);
    return double(rows * cols / model::ggml_block_elements(t) * model::ggml_block_bytes(t));
  };
  double routed = 0;
  for (std::size_t l = 0; l < c.n_layers; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    routed += double(s.n_expert * s.dim * sizeof(float)) +
              double(s.k) * (expert_bytes(b + "ffn_gate_exps.weight", s.expert_ffn, s.dim) +
                             expert_bytes(b + "ffn_up_exps.weight", s.expert_ffn, s.dim) +
                             expert_bytes(b + "ffn_down_exps.weight", s.dim, s.expert_ffn));
  }
  state.counters["tokens"] = benchmark::Counter(tokens, benchmark::Counter::kIsRate);
  state.counters["routed_MB"] = routed * 1e-6;
  state.counters["weight_MB"] = weight_bytes * 1e-6;
  state.counters["frac_read_roof"] =
      weight_bytes * tokens * 1e-9 / seconds / llmkit_bench::roofline::get().read_gbps(threads);
}

void timing(benchmark::internal::Benchmark* b, std::size_t threads) {
  if (threads > 1) b->UseRealTime();
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  const std::pair<const char*, weight_type> formats[] = {{"q4_k", weight_type::q4_k}, {"q8_0", weight_type::q8_0}};
  for (const auto t : llmkit_bench::thread_counts()) {
    const auto threads = static_cast<std::size_t>(t);
    const std::string th = "/threads:" + std::to_string(threads);
    for (const auto& [name, type] : formats) {
      timing(benchmark::RegisterBenchmark((std::string("routed_decode/") + name + th).c_str(),
                                          [=](benchmark::State& s) { bm_routed_decode(s, type, threads); })
                 ->Unit(benchmark::kMicrosecond),
             threads);
      timing(benchmark::RegisterBenchmark((std::string("dense_decode/") + name + th).c_str(),
                                          [=](benchmark::State& s) { bm_dense_decode(s, type, threads); })
                 ->Unit(benchmark::kMicrosecond),
             threads);
      // The routed products next to their dense baselines, so that a run alternates them.
      timing(benchmark::RegisterBenchmark((std::string("routed_prefill/") + name + th).c_str(),
                                          [=](benchmark::State& s) { bm_routed_prefill(s, type, threads); })
                 ->Unit(benchmark::kMillisecond),
             threads);
      timing(benchmark::RegisterBenchmark((std::string("dense_prefill/") + name + th).c_str(),
                                          [=](benchmark::State& s) { bm_dense_prefill(s, type, threads); })
                 ->Unit(benchmark::kMillisecond),
             threads);
    }
    // gpt-oss-20b's layer: 32 MXFP4 experts of 2880 x 2880, 4 active.
    timing(benchmark::RegisterBenchmark(("routed_decode/gpt-oss-20b/mxfp4" + th).c_str(),
                                        [=](benchmark::State& s) {
                                          bm_routed_decode(s, weight_type::mxfp4, threads, shape_id::gpt_oss_20b);
                                        })
               ->Unit(benchmark::kMicrosecond),
           threads);
    timing(benchmark::RegisterBenchmark(("dense_decode/gpt-oss-20b/mxfp4" + th).c_str(),
                                        [=](benchmark::State& s) {
                                          bm_dense_decode(s, weight_type::mxfp4, threads, shape_id::gpt_oss_20b);
                                        })
               ->Unit(benchmark::kMicrosecond),
           threads);
    for (const moe_file& f : moe_files)
      timing(benchmark::RegisterBenchmark((std::string("model_decode/") + f.name + th).c_str(),
                                          [=, &f](benchmark::State& s) { bm_model_decode(s, f, threads); })
                 ->Unit(benchmark::kMillisecond),
             threads);
  }
  llmkit_bench::add_roofline_context();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
