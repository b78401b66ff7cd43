// SPDX-License-Identifier: MIT
// bench_model: the reference Llama (model/llama.hpp) end to end.
//
//   prefill/<model>/<weights>/threads:N  a 128-token prompt into an empty
//                                        sequence: tokens/s, GOPs of the
//                                        layers' projections, frac_int8_roof
//   prefill512/<tinyllama>/...           the same with a 512-token prompt
//   decode/<model>/<weights>/threads:N   one token per step after the prompt
//                                        (context 128..255): tokens/s, bytes/s
//                                        of weights + KV read per step, and
//                                        frac_read_roof = that / the roofline
//                                        read bandwidth of N threads
//   decode_dram/...                      the same, rotating through copies of
//                                        the model (>= 1 GiB of weights) so
//                                        every step reads its weights from
//                                        DRAM, not from the 480 MiB L3
//
// Models: stories260K (models/stories260K.gguf, F32 file), the synthetic
// ~100M Llama (dim 768, 12 layers, 12/4 heads, ffn 2048, vocab 32000),
// written as an F32 GGUF to <source>/build/bench-model-synthetic-100m.gguf on
// the first run, and the synthetic TinyLlama1.1B shape (dim 2048, 22 layers,
// 32/4 heads, ffn 5632, vocab 32000), written once per storage as the GGUF
// files people run (<source>/build/bench-model-tinyllama-<type>.gguf: Q8_0,
// Q4_0, Q6_K, llama-quantize's Q4_K_M mix, and all-Q4_K, Q2_K, Q3_K, IQ4_NL
// and IQ4_XS files). Under LLMKIT_BENCH_SMOKE=1
// all synthetic models are small.
//
// Weights of the F32 files: f32, q8_0 (llama_options::weight_type; exact
// product with f32 activations), q4_0, q4_k or q6_k (GGUF blocks, exact
// product through decoded strips; matrices narrower than a block stay f32,
// e.g. all of stories260K under q4_k). A name ending in "xq8" multiplies
// int8-quantised activations instead (llama_options::activations = q8_0:
// the VNNI integer products). TinyLlama's files load as they are stored.
//
//   arch_prefill/<shape>/<arch>/threads:N, arch_decode/...  the same on the
//   synthetic Gemma 3 1B shape (dim 1152, 26 layers, 4/1 heads of 256, ffn
//   6912, vocab 262144 tied, window 512 on 5 of 6 layers) and Qwen3 1.7B
//   shape (dim 2048, 28 layers, 16/8 heads of 128, ffn 6144, vocab 151936
//   tied), each as its architecture and as `llama` with the same matrices
//   (the same weight bytes and FLOPs without the architecture's extra
//   pieces: norms, window, GELU, embedding scale), Q4_K_M files
//   (<source>/build/bench-model-<shape>-<arch>-q4_k_m.gguf), int8
//   activations. The ratio of the two is the cost of the extra pieces.
//
//   constrained/tinyllama1B/q4_k_mxq8/<schema>  decode steps with and without
//   a JSON-schema grammar, alternated token by token in one run: each step
//   is the forward of one token (Q4_K_M, int8 activations, 1 thread), then
//   the row of logits spread over a Llama 3-sized row (128,256 tokens: the
//   mask costs what it costs on the largest vocabulary the grammar benches
//   use), then the grammar processor (constrained steps only) and greedy.
//   Both follow the schema's document of bench/grammar_cases.hpp (a fresh
//   grammar per document, built outside the timed steps, so every document
//   pays its cold positions): tokens/s of each, and ratio = constrained /
//   unconstrained tokens/s (issue goal: at least 0.95).
//
// vs_llamacpp compares with llama.cpp on stories260K on this machine
// (2 threads: 11.8k prompt tokens/s, 1.75k generated tokens/s). One thread
// is timed by the thread's CPU time, two by wall time.
#include <benchmark/benchmark.h>

#include <llmkit/core/executor.hpp>
#include <llmkit/grammar/json_schema.hpp>
#include <llmkit/grammar/processor.hpp>
#include <llmkit/kv/contiguous_cache.hpp>
#include <llmkit/model/batch.hpp>
#include <llmkit/model/llama.hpp>
#include <llmkit/model/synthetic.hpp>
#include <llmkit/sampling/candidates.hpp>
#include <llmkit/sampling/greedy.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "grammar_cases.hpp"
#include "roofline.hpp"

namespace {

using namespace llmkit;

using llmkit_bench::smoke;

constexpr std::size_t prompt_tokens = 128;
constexpr double llamacpp_prefill_tps = 11800.0;
constexpr double llamacpp_decode_tps = 1750.0;

std::string build_dir() {
#if defined(LLMKIT_SOURCE_DIR)
  return std::string(LLMKIT_SOURCE_DIR) + "/build/";
#else
  return {};
#endif
}

std::string synthetic_path() {
  return build_dir() + (smoke() ? "bench-model-synthetic-smoke.gguf" : "bench-model-synthetic-100m.gguf");
}

model::llama_config synthetic_config() {
  model::llama_config c = model::synthetic_100m_config();
  if (smoke()) {
    c.n_vocab = 1000;
    c.dim = 128;
    c.n_layers = 2;
    c.n_heads = 4;
    c.n_kv_heads = 2;
    c.head_dim = 32;
    c.ffn_dim = 256;
    c.rope.rotary_dim = 32;
  }
  return c;
}

/// The synthetic TinyLlama1.1B shape (smoke: a small one whose widths are
/// whole 256-value super-blocks).
model::llama_config tinyllama_config() {
  if (smoke()) {
    model::llama_config c = synthetic_config();
    c.dim = 256;
    c.head_dim = 64;
    c.rope.rotary_dim = 64;
    c.ffn_dim = 512;
    return c;
  }
  model::llama_config c = model::synthetic_100m_config();
  c.dim = 2048;
  c.n_layers = 22;
  c.n_heads = 32;
  c.n_kv_heads = 4;
  c.head_dim = 64;
  c.ffn_dim = 5632;
  return c;
}

/// The GGUF file a model runs from.
enum class file_kind {
  stories, synthetic_f32, tiny_q8_0, tiny_q4_0, tiny_q6_k, tiny_q4_k_m,
  tiny_q4_k, tiny_q2_k, tiny_q3_k, tiny_iq4_nl, tiny_iq4_xs,
};

/// Writes the synthetic model `o` to `p` once (through a temporary file).
const std::string& write_once(const std::string& p, const model::synthetic_options& o) {
  if (!std::filesystem::exists(p)) {
    const std::string tmp = p + ".tmp";
    // A fresh checkout configured elsewhere (cmake -B /tmp/x) has no <source>/build yet.
    if (const auto dir = std::filesystem::path(p).parent_path(); !dir.empty()) std::filesystem::create_directories(dir);
    model::write_synthetic_llama(tmp, o);
    std::filesystem::rename(tmp, p);
  }
  return p;
}

const std::string& model_path(file_kind f) {
  static std::map<file_kind, std::string> paths;
  if (auto it = paths.find(f); it != paths.end()) return it->second;
  if (f == file_kind::stories) return paths[f] = LLMKIT_DEFAULT_MODEL;
  if (f == file_kind::synthetic_f32)
    return paths[f] = write_once(synthetic_path(), {.config = synthetic_config(), .weight_type = model::ggml_type::f32, .seed = 1});
  model::synthetic_options o{.config = tinyllama_config(), .seed = 2};
  std::string name;
  switch (f) {
    case file_kind::tiny_q8_0: o.weight_type = model::ggml_type::q8_0; name = "q8_0"; break;
    case file_kind::tiny_q4_0: o.weight_type = model::ggml_type::q4_0; name = "q4_0"; break;
    case file_kind::tiny_q6_k: o.weight_type = model::ggml_type::q6_k; name = "q6_k"; break;
    case file_kind::tiny_q4_k: o.weight_type = model::ggml_type::q4_k; name = "q4_k"; break;
    case file_kind::tiny_q2_k: o.weight_type = model::ggml_type::q2_k; name = "q2_k"; break;
    case file_kind::tiny_q3_k: o.weight_type = model::ggml_type::q3_k; name = "q3_k"; break;
    case file_kind::tiny_iq4_nl: o.weight_type = model::ggml_type::iq4_nl; name = "iq4_nl"; break;
    case file_kind::tiny_iq4_xs: o.weight_type = model::ggml_type::iq4_xs; name = "iq4_xs"; break;
    default: o.tensor_types = model::q4_k_m_types(o); name = "q4_k_m"; break;
  }
  const std::string p = build_dir() + "bench-model-tinyllama-" + name + (smoke() ? "-smoke" : "") + ".gguf";
  return paths[f] = write_once(p, o);
}

/// The models: a name and how its variants choose their file.
struct model_kind {
  const char* name;
  bool tiny;  ///< TinyLlama: each variant brings its own file
};
const model_kind model_kinds[] = {{"stories260K", false}, {"synthetic100M", false}, {"tinyllama1B", true}};

/// How the weight matrices are stored and multiplied.
struct weights_variant {
  const char* name;
  model::llama_options options;
  file_kind tiny_file = file_kind::tiny_q8_0;  ///< the TinyLlama file (loaded as stored)
};
// Variants without the xq8 suffix ask for the exact product (the library's
// default is int8 activations).
constexpr auto int8_act = model::activation_type::q8_0, exact_act = model::activation_type::f32;
const weights_variant variants[] = {
    {"f32", {.weight_type = model::weight_type::f32}},
    {"q8_0", {.weight_type = model::weight_type::q8_0, .activations = exact_act}},
    {"q8_0xq8", {.weight_type = model::weight_type::q8_0, .activations = int8_act}},
    {"q4_0", {.weight_type = model::weight_type::q4_0, .activations = exact_act}},
    {"q4_0xq8", {.weight_type = model::weight_type::q4_0, .activations = int8_act}},
    {"q4_k", {.weight_type = model::weight_type::q4_k, .activations = exact_act}},
    {"q4_kxq8", {.weight_type = model::weight_type::q4_k, .activations = int8_act}},
    {"q6_k", {.weight_type = model::weight_type::q6_k, .activations = exact_act}},
    {"q6_kxq8", {.weight_type = model::weight_type::q6_k, .activations = int8_act}},
};
const weights_variant tiny_variants[] = {
    {"q8_0", {.activations = exact_act}, file_kind::tiny_q8_0},
    {"q8_0xq8", {.activations = int8_act}, file_kind::tiny_q8_0},
    {"q4_k_m", {.activations = exact_act}, file_kind::tiny_q4_k_m},
    {"q4_k_mxq8", {.activations = int8_act}, file_kind::tiny_q4_k_m},
    {"q4_0xq8", {.activations = int8_act}, file_kind::tiny_q4_0},
    {"q6_kxq8", {.activations = int8_act}, file_kind::tiny_q6_k},
    // Every matrix in one format (the output projection too): the new formats against Q4_K.
    {"q4_kxq8", {.activations = int8_act}, file_kind::tiny_q4_k},
    {"q2_kxq8", {.activations = int8_act}, file_kind::tiny_q2_k},
    {"q3_kxq8", {.activations = int8_act}, file_kind::tiny_q3_k},
    {"iq4_nlxq8", {.activations = int8_act}, file_kind::tiny_iq4_nl},
    {"iq4_xsxq8", {.activations = int8_act}, file_kind::tiny_iq4_xs},
};

/// The architecture benchmarks' shapes (smoke: small stand-ins).
model::llama_config arch_shape(std::string_view shape) {
  model::llama_config c = model::synthetic_100m_config();
  if (shape == "gemma3_1B") {
    c.dim = 1152, c.n_layers = 26, c.n_heads = 4, c.n_kv_heads = 1, c.head_dim = 256, c.ffn_dim = 6912;
    c.n_vocab = 262144, c.context_length = 32768, c.sliding_window = 512;
    c.rope.theta = 1000000.0f;
  } else {  // qwen3_1.7B
    c.dim = 2048, c.n_layers = 28, c.n_heads = 16, c.n_kv_heads = 8, c.head_dim = 128, c.ffn_dim = 6144;
    c.n_vocab = 151936, c.context_length = 40960;
    c.rope.theta = 1000000.0f;
  }
  if (smoke()) c.n_layers = 2, c.n_vocab = 4096, c.ffn_dim = 512;
  c.rope.rotary_dim = c.head_dim;
  c.rms_eps = 1e-6f;
  return c;
}

/// The loaded model of `shape` as `arch` (its own architecture, or llama).
model::llama_model& arch_model(std::string_view shape, std::string_view arch) {
  static std::map<std::string, std::unique_ptr<model::llama_model>> cache;
  const std::string key = std::string(shape) + "-" + std::string(arch);
  if (auto it = cache.find(key); it != cache.end()) return *it->second;
  model::synthetic_options o{.config = arch_shape(shape), .seed = 3, .tied_output = true};
  o.config.arch = model::architecture_from_name(arch);
  if (arch == "llama") o.config.sliding_window = 0;
  o.tensor_types = model::q4_k_m_types(o);
  const std::string p = build_dir() + "bench-model-" + key + "-q4_k_m" + (smoke() ? "-smoke" : "") + ".gguf";
  write_once(p, o);
  return *(cache[key] = std::make_unique<model::llama_model>(
               model::llama_model::load(p, {.activations = model::activation_type::q8_0})));
}

/// Loaded models, kept for the process: (model, variant) -> copies.
std::vector<std::unique_ptr<model::llama_model>>& models(int which, const weights_variant& wt, std::size_t copies) {
  static std::map<std::string, std::vector<std::unique_ptr<model::llama_model>>> cache;
  auto& v = cache[std::string(model_kinds[which].name) + "/" + wt.name];
  const file_kind f = model_kinds[which].tiny ? wt.tiny_file : which == 0 ? file_kind::stories : file_kind::synthetic_f32;
  if (v.empty()) v.push_back(std::make_unique<model::llama_model>(model::llama_model::load(model_path(f), wt.options)));
  while (v.size() < copies) v.push_back(std::make_unique<model::llama_model>(*v.front()));
  return v;
}

std::vector<std::int32_t> prompt(std::size_t vocab, std::size_t length = prompt_tokens) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<std::int32_t> tok(3, static_cast<std::int32_t>(vocab) - 1);
  std::vector<std::int32_t> p(length);
  p[0] = 1;
  for (std::size_t i = 1; i < p.size(); ++i) p[i] = tok(rng);
  return p;
}

/// Seconds as the benchmark itself times them: the calling thread's CPU
/// time for one thread, wall time for more.
struct stopwatch {
  std::size_t threads;
  double start = now();
  double now() const {
    if (threads <= 1) return llmkit_bench::thread_cpu_seconds();
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  }
  double seconds() const { return now() - start; }
};

double roof_gbps(std::size_t threads) {
  const auto& r = llmkit_bench::roofline::get();
  return r.read_gbps(threads);
}

void bm_prefill(benchmark::State& state, int which, const weights_variant& wt, std::size_t threads,
                std::size_t length = prompt_tokens) {
  auto& m = *models(which, wt, 1).front();
  thread_pool pool(threads);
  kv::contiguous_cache<float> cache(m.kv_shape(), {.max_sequences = 1, .max_tokens = std::max(2 * prompt_tokens, length)});
  const auto seq = *cache.add_sequence();
  const auto p = prompt(m.vocab_size(), length);
  model::batch_builder b;
  b.add(seq, p, 0);
  const stopwatch clock{threads};
  for (auto _ : state) {
    cache.truncate(seq, 0);
    benchmark::DoNotOptimize(m.forward(b.view(), cache, pool).data());
  }
  const double seconds = clock.seconds();
  const double tokens = double(state.iterations()) * double(length);
  state.counters["tokens"] = benchmark::Counter(tokens, benchmark::Counter::kIsRate);
  if (which == 0) state.counters["vs_llamacpp"] = tokens / seconds / llamacpp_prefill_tps;
  // The projections' multiply-adds (2 operations each) against the roof of
  // the arithmetic they run on: int8 dot products or f32 FMAs.
  const auto& c = m.config();
  const double qd = double(c.n_heads * c.head_dim), kvd = double(c.n_kv_heads * c.head_dim);
  const double ops_per_token =
      2.0 * double(c.n_layers) * double(c.dim) * (qd + 2 * kvd + qd + 3.0 * double(c.ffn_dim));
  const double gops = ops_per_token * tokens / seconds * 1e-9;
  state.counters["GOPs"] = gops;
  const auto& roof = llmkit_bench::roofline::get();
  const bool int8 = wt.options.activations == int8_act && m.weight_types()[0] != model::weight_type::f32 &&
                    m.weight_types()[0] != model::weight_type::f16;
  if (int8 && roof.int8_gops(threads) > 0)
    state.counters["frac_int8_roof"] = gops / roof.int8_gops(threads);
  else if (!int8)
    state.counters["frac_fma_roof"] = gops / roof.fma_gflops(threads);
}

void bm_decode(benchmark::State& state, int which, const weights_variant& wt, std::size_t threads, bool dram) {
  // Enough copies that one pass over them is >= 1 GiB: each step's weights
  // were evicted from the L3 by the steps before it.
  std::size_t copies = 1;
  if (dram) {
    const std::size_t bytes = models(which, wt, 1).front()->weight_bytes_per_step();
    copies = ((std::size_t{1} << 30) + bytes - 1) / bytes;
  }
  auto& ms = models(which, wt, copies);
  const auto& m = *ms.front();
  const auto& c = m.config();
  thread_pool pool(threads);
  kv::contiguous_cache<float> cache(m.kv_shape(), {.max_sequences = 1, .max_tokens = 2 * prompt_tokens});
  const auto seq = *cache.add_sequence();
  const auto p = prompt(m.vocab_size());
  {
    model::batch_builder b;
    b.add(seq, p, 0);
    ms.front()->forward(b.view(), cache, pool);
  }
  const std::size_t kv_row_bytes = 2 * c.n_layers * c.n_kv_heads * c.head_dim * sizeof(float);
  const double weight_bytes = double(m.weight_bytes_per_step());
  std::int32_t token = p.back();
  std::size_t step = 0;
  double bytes = 0;
  model::batch_builder b;
  const stopwatch clock{threads};
  for (auto _ : state) {
    if (cache.n_tokens(seq) == 2 * prompt_tokens) cache.truncate(seq, prompt_tokens);
    const std::size_t pos = cache.n_tokens(seq);
    b.clear();
    b.add(seq, {&token, 1}, static_cast<std::int32_t>(pos));
    // The same weights in every copy, so the copies share one KV cache.
    const auto logits = ms[step++ % ms.size()]->forward(b.view(), cache, pool);
    token = static_cast<std::int32_t>(3 + (step * 7919) % (m.vocab_size() - 3));
    benchmark::DoNotOptimize(logits.data());
    bytes += weight_bytes + double(pos + 1) * double(kv_row_bytes);
  }
  const double seconds = clock.seconds();
  const double tokens = double(state.iterations());
  state.counters["tokens"] = benchmark::Counter(tokens, benchmark::Counter::kIsRate);
  state.SetBytesProcessed(static_cast<std::int64_t>(bytes));
  state.counters["GBps"] = bytes * 1e-9 / seconds;
  state.counters["frac_read_roof"] = bytes * 1e-9 / seconds / roof_gbps(threads);
  state.counters["weight_MB"] = weight_bytes * 1e-6;
  state.counters["copies"] = double(copies);
  if (which == 0) state.counters["vs_llamacpp"] = tokens / seconds / llamacpp_decode_tps;
}

void bm_arch_prefill(benchmark::State& state, const std::string& shape, const std::string& arch,
                     std::size_t threads) {
  auto& m = arch_model(shape, arch);
  thread_pool pool(threads);
  kv::contiguous_cache<float> cache(m.kv_shape(), {.max_sequences = 1, .max_tokens = 2 * prompt_tokens});
  const auto seq = *cache.add_sequence();
  const auto p = prompt(m.vocab_size());
  model::batch_builder b;
  b.add(seq, p, 0);
  for (auto _ : state) {
    cache.truncate(seq, 0);
    benchmark::DoNotOptimize(m.forward(b.view(), cache, pool).data());
  }
  state.counters["tokens"] =
      benchmark::Counter(double(state.iterations()) * double(prompt_tokens), benchmark::Counter::kIsRate);
  state.counters["weight_MB"] = double(m.weight_bytes_per_step()) * 1e-6;
}

void bm_arch_decode(benchmark::State& state, const std::string& shape, const std::string& arch,
                    std::size_t threads) {
  auto& m = arch_model(shape, arch);
  thread_pool pool(threads);
  kv::contiguous_cache<float> cache(m.kv_shape(), {.max_sequences = 1, .max_tokens = 2 * prompt_tokens});
  const auto seq = *cache.add_sequence();
  const auto p = prompt(m.vocab_size());
  {
    model::batch_builder b;
    b.add(seq, p, 0);
    m.forward(b.view(), cache, pool);
  }
  std::int32_t token = p.back();
  std::size_t step = 0;
  model::batch_builder b;
  for (auto _ : state) {
    if (cache.n_tokens(seq) == 2 * prompt_tokens) cache.truncate(seq, prompt_tokens);
    b.clear();
    b.add(seq, {&token, 1}, static_cast<std::int32_t>(cache.n_tokens(seq)));
    benchmark::DoNotOptimize(m.forward(b.view(), cache, pool).data());
    token = static_cast<std::int32_t>(3 + (++step * 7919) % (m.vocab_size() - 3));
  }
  state.counters["tokens"] = benchmark::Counter(double(state.iterations()), benchmark::Counter::kIsRate);
  state.counters["weight_MB"] = double(m.weight_bytes_per_step()) * 1e-6;
}

/// Constrained against unconstrained decoding, alternated per token (see the
/// header comment): thread CPU time of each kind of step.
void bm_constrained(benchmark::State& state, const weights_variant& wt, const llmkit_bench::bench_case& c) {
  auto& m = *models(2, wt, 1).front();
  thread_pool pool(1);
  const auto& tok = llmkit_bench::llama3();
  std::vector<token_id> doc = tok.encode(c.document);
  doc.push_back(tok.eos());
  const grammar::compiled_grammar g = grammar::parse_gbnf(grammar::schema_to_gbnf(std::string_view(c.schema)));
  kv::contiguous_cache<float> cache(m.kv_shape(), {.max_sequences = 1, .max_tokens = prompt_tokens + doc.size() + 1});
  const auto seq = *cache.add_sequence();
  const auto p = prompt(m.vocab_size());
  std::vector<float> row(tok.vocab_size());
  sampling::candidates cand;
  const sampling::greedy pick{.with_logprob = false};
  model::batch_builder b;
  double free_s = 0, constrained_s = 0;
  std::size_t steps = 0;
  for (auto _ : state) {
    cache.truncate(seq, 0);
    b.clear();
    b.add(seq, p, 0);
    m.forward(b.view(), cache, pool);
    const auto masker =
        std::make_shared<const grammar::token_masker>(std::make_shared<const grammar::automaton>(g), llmkit_bench::llama3_vocab());
    const grammar::grammar_processor grammar(masker);
    std::vector<token_id> history{tok.bos()};
    std::int32_t token = p.back();
    for (const token_id next : doc) {
      const std::size_t pos = cache.n_tokens(seq);
      for (const bool constrained : {false, true}) {
        const double t0 = llmkit_bench::thread_cpu_seconds();
        cache.truncate(seq, pos);
        b.clear();
        b.add(seq, {&token, 1}, static_cast<std::int32_t>(pos));
        const auto logits = m.forward(b.view(), cache, pool);
        for (std::size_t i = 0; i < row.size(); ++i) row[i] = logits.data()[i % logits.cols()];
        cand.reset_copy(row);
        if (constrained) grammar.apply(cand, {.history = history, .n_prompt = 1});
        benchmark::DoNotOptimize(pick.sample(cand, {.history = history, .n_prompt = 1}).token);
        (constrained ? constrained_s : free_s) += llmkit_bench::thread_cpu_seconds() - t0;
      }
      history.push_back(next);  // the document, whatever greedy picked
      token = static_cast<std::int32_t>(next % m.vocab_size());
      ++steps;
    }
  }
  state.counters["free_tokens_per_s"] = double(steps) / free_s;
  state.counters["constrained_tokens_per_s"] = double(steps) / constrained_s;
  state.counters["ratio"] = free_s / constrained_s;
  state.counters["steps"] = double(doc.size());
}

void timing(benchmark::internal::Benchmark* b, std::size_t threads) {
  if (threads > 1) b->UseRealTime();
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  for (int which : {0, 1, 2}) {
    const model_kind& mk = model_kinds[which];
    const std::span<const weights_variant> list = mk.tiny ? std::span<const weights_variant>(tiny_variants)
                                                          : std::span<const weights_variant>(variants);
    for (const weights_variant& wt : list)
      for (const auto t : llmkit_bench::thread_counts()) {
        const auto threads = static_cast<std::size_t>(t);
        const std::string suffix = std::string(mk.name) + "/" + wt.name + "/threads:" + std::to_string(threads);
        timing(benchmark::RegisterBenchmark(("prefill/" + suffix).c_str(),
                                            [=](benchmark::State& s) { bm_prefill(s, which, wt, threads); })
                   ->Unit(benchmark::kMillisecond),
               threads);
        if (mk.tiny && !smoke())
          timing(benchmark::RegisterBenchmark(("prefill512/" + suffix).c_str(),
                                              [=](benchmark::State& s) { bm_prefill(s, which, wt, threads, 512); })
                     ->Unit(benchmark::kMillisecond),
                 threads);
        // TinyLlama's weights (>= 0.6 GB) come from DRAM at every step; the
        // smoke run's tiny stand-ins would need thousands of copies.
        if (!mk.tiny || smoke())
          timing(benchmark::RegisterBenchmark(("decode/" + suffix).c_str(),
                                              [=](benchmark::State& s) { bm_decode(s, which, wt, threads, false); })
                     ->Unit(benchmark::kMicrosecond),
                 threads);
        if (which != 0 && !smoke())
          timing(benchmark::RegisterBenchmark(("decode_dram/" + suffix).c_str(),
                                              [=](benchmark::State& s) { bm_decode(s, which, wt, threads, true); })
                     ->Unit(benchmark::kMicrosecond),
                 threads);
      }
  }
  // Each architecture next to its llama twin, so that a run alternates them.
  for (const std::string shape : {"gemma3_1B", "qwen3_1.7B"}) {
    const std::string arch = shape.starts_with("gemma3") ? "gemma3" : "qwen3";
    for (const auto t : llmkit_bench::thread_counts()) {
      const auto threads = static_cast<std::size_t>(t);
      for (const std::string& a : {arch, std::string("llama")}) {
        const std::string suffix = shape + "/" + a + "/threads:" + std::to_string(threads);
        timing(benchmark::RegisterBenchmark(("arch_prefill/" + suffix).c_str(),
                                            [=](benchmark::State& s) { bm_arch_prefill(s, shape, a, threads); })
                   ->Unit(benchmark::kMillisecond),
               threads);
        timing(benchmark::RegisterBenchmark(("arch_decode/" + suffix).c_str(),
                                            [=](benchmark::State& s) { bm_arch_decode(s, shape, a, threads); })
                   ->Unit(benchmark::kMillisecond),
               threads);
      }
    }
  }
  // Grammar-constrained decoding against free decoding on the same steps.
  for (const auto& c : llmkit_bench::grammar_cases)
    benchmark::RegisterBenchmark((std::string("constrained/tinyllama1B/q4_k_mxq8/") + c.name).c_str(),
                                 [&c](benchmark::State& s) { bm_constrained(s, tiny_variants[3], c); })
        ->Unit(benchmark::kMillisecond)
        ->Iterations(1);
  llmkit_bench::add_roofline_context();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
