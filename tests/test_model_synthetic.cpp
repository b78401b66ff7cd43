// SPDX-License-Identifier: MIT
// model/synthetic.hpp round trips, and model/llama.hpp against the
// double-precision oracle on random synthetic models of every weight type.
#include <llmkit/core/executor.hpp>
#include <llmkit/kv/contiguous_cache.hpp>
#include <llmkit/model/architecture.hpp>
#include <llmkit/model/gguf_writer.hpp>
#include <llmkit/model/batch.hpp>
#include <llmkit/model/llama.hpp>
#include <llmkit/model/synthetic.hpp>
#include <llmkit/model/tokenizer.hpp>

#include <catch2/catch.hpp>

#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "model_checks.hpp"
#include "reference/model_reference.hpp"

using namespace llmkit;
using namespace llmkit::model;

namespace {
llama_config small_config(std::size_t dim, std::size_t n_heads, std::size_t n_kv_heads, std::size_t ffn,
                          std::size_t vocab) {
  llama_config c;
  c.n_vocab = vocab;
  c.dim = dim;
  c.n_layers = 2;
  c.n_heads = n_heads;
  c.n_kv_heads = n_kv_heads;
  c.head_dim = dim / n_heads;
  c.ffn_dim = ffn;
  c.context_length = 64;
  return c;
}

// (test::exact: int8 activations are tested in test_model_weights.)
using test::as_span;
using test::exact;

// Max |model - oracle| over all positions of `tokens`, relative to max(1, |oracle|).
double max_error(llama_model& m, const reference::llama_reference& oracle, const std::vector<std::int32_t>& tokens) {
  kv::contiguous_cache<float> cache(m.kv_shape(), {.max_sequences = 1, .max_tokens = 128});
  batch_builder b;
  b.add(*cache.add_sequence(), tokens, 0, last_logits::skip);
  for (std::size_t i = 0; i < tokens.size(); ++i) b.request_logits(static_cast<std::int32_t>(i));
  const auto logits = m.forward(b.view(), cache);
  const auto ref = oracle.logits(tokens);
  double worst = 0;
  for (std::size_t t = 0; t < tokens.size(); ++t)
    for (std::size_t v = 0; v < m.vocab_size(); ++v)
      worst = std::max(worst, std::abs(double(logits(t, v)) - ref[t][v]) / std::max(1.0, std::abs(ref[t][v])));
  return worst;
}

double max_error(llama_model& m, const gguf_file& f, const std::vector<std::int32_t>& tokens) {
  return max_error(m, reference::llama_reference(f), tokens);
}
}  // namespace

TEST_CASE("synthetic: writes a loadable GGUF with metadata, tokenizer and weights") {
  synthetic_options o{.config = small_config(64, 4, 2, 96, 320), .weight_type = ggml_type::f16, .seed = 7};
  o.config.rope.theta = 500000.0f;
  const auto image = synthetic_llama(o).bytes();
  const gguf_file f(as_span(image));
  const auto c = llama_config::from_gguf(f);
  REQUIRE(c.n_vocab == 320);
  REQUIRE(c.dim == 64);
  REQUIRE(c.n_layers == 2);
  REQUIRE(c.n_heads == 4);
  REQUIRE(c.n_kv_heads == 2);
  REQUIRE(c.head_dim == 16);
  REQUIRE(c.ffn_dim == 96);
  REQUIRE(c.context_length == 64);
  REQUIRE(c.rope.theta == 500000.0f);
  REQUIRE_FALSE(c.tied_output);
  REQUIRE(f.tensor("blk.1.ffn_down.weight").type == ggml_type::f16);
  REQUIRE(f.tensor("blk.1.ffn_norm.weight").type == ggml_type::f32);
  REQUIRE(f.tensors().size() == 3 + 2 * 9);

  const auto tok = tokenizer::from_gguf(f);
  REQUIRE(tok.vocab_size() == 320);
  REQUIRE(tok.bos() == 1);
  REQUIRE(tok.type(3) == token_type::byte);
  const auto ids = tok.encode("hello world \xc3\xa9", {.add_bos = true});
  REQUIRE(tok.decode(ids, {.strip_prefix_space = true}) == "hello world \xc3\xa9");

  // Same seed, same bytes; another seed, other weights.
  REQUIRE(synthetic_llama(o).bytes() == image);
  o.seed = 8;
  REQUIRE(synthetic_llama(o).bytes() != image);

  // Through a file (streamed, one tensor at a time: the same bytes) and
  // llama_model::load.
  const std::string path = "test_model_synthetic_tmp.gguf";
  o.tied_output = true;
  write_synthetic_llama(path, o);
  {
    std::ifstream file(path, std::ios::binary);
    const std::vector<char> bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
    const auto in_memory = synthetic_llama(o).bytes();
    REQUIRE(bytes.size() == in_memory.size());
    REQUIRE(std::memcmp(bytes.data(), in_memory.data(), bytes.size()) == 0);
  }
  auto m = llama_model::load(path, exact);
  std::remove(path.c_str());
  REQUIRE(m.config().tied_output);
  REQUIRE(m.vocab_size() == 320);
}

TEST_CASE("llama: forward matches the double-precision oracle on random models of every weight type") {
  struct shape {
    std::size_t dim, heads, kv_heads, ffn, vocab;
  };
  // GQA, MHA, MQA (group 3); head dims 16, 8 (narrower than an AVX-512
  // register), 64, 32; vocabularies without byte tokens (40) and with them.
  // The last shape is a multiple of the K-quants' 256-value blocks.
  const std::vector<shape> shapes{{64, 4, 2, 96, 300}, {48, 6, 6, 80, 40},  {64, 1, 1, 64, 290},
                                  {96, 3, 1, 160, 37}, {256, 4, 2, 512, 300}};
  std::mt19937 rng(99);
  for (const ggml_type type : {ggml_type::f32, ggml_type::f16, ggml_type::bf16, ggml_type::q8_0, ggml_type::q4_0,
                               ggml_type::q4_1, ggml_type::q5_0, ggml_type::q5_1, ggml_type::q4_k, ggml_type::q5_k,
                               ggml_type::q6_k, ggml_type::q2_k, ggml_type::q3_k, ggml_type::iq4_nl,
                               ggml_type::iq4_xs, ggml_type::mxfp4}) {
    for (std::size_t si = 0; si < shapes.size(); ++si) {
      const shape sh = shapes[si];
      const std::size_t block = ggml_block_elements(type);
      if (sh.dim % block || sh.ffn % block) continue;
      synthetic_options o{.config = small_config(sh.dim, sh.heads, sh.kv_heads, sh.ffn, sh.vocab),
                          .weight_type = type,
                          .seed = 100 + si,
                          .tied_output = si % 2 == 1};
      if (si == 2) o.config.rope.freq_scale = 0.25f;  // linear RoPE scaling
      const auto image = synthetic_llama(o).bytes();
      const gguf_file f(as_span(image));
      llama_model m(f, exact);
      for (std::size_t n : {1u, 7u, 17u}) {
        std::uniform_int_distribution<std::int32_t> token(0, static_cast<std::int32_t>(sh.vocab) - 1);
        std::vector<std::int32_t> tokens(n);
        for (auto& t : tokens) t = token(rng);
        INFO("type " << ggml_type_name(std::uint32_t(type)) << " shape " << si << " n " << n);
        REQUIRE(max_error(m, f, tokens) <= 2e-5);
      }
    }
  }
}

TEST_CASE("synthetic: bad options raise llmkit::error") {
  synthetic_options o{.config = small_config(48, 3, 3, 80, 64), .weight_type = ggml_type::q8_0};
  REQUIRE_THROWS_WITH(synthetic_llama(o),
                      "synthetic_llama: weight type Q8_0 needs dim (48), ffn_dim (80) and n_heads * head_dim (48) to "
                      "be multiples of 32");
  o.weight_type = ggml_type::f32;
  o.config.n_kv_heads = 2;
  REQUIRE_THROWS_WITH(synthetic_llama(o), "llama_config: n_heads = 3 is not a positive multiple of n_kv_heads = 2");
  o.config = small_config(48, 4, 4, 80, 64);  // head_dim 12
  REQUIRE_THROWS_WITH(synthetic_llama(o), "llama_config: head_dim = 12 is not supported by the attention kernels "
                                          "(supported: " + attention::supported_head_dims_text() + ")");
  o.config.dim = 64;
  o.config.head_dim = 16;
  REQUIRE_NOTHROW(synthetic_llama(o));
  o.config.n_vocab = 2;
  REQUIRE_THROWS_WITH(synthetic_llama(o), "synthetic_llama: n_vocab must be >= 3 (control tokens), got 2");
}

namespace {
// Per-pair frequency divisors in [0.25, 4), far from 1 so that ignoring them
// (or applying them to the wrong pair) moves the logits.
std::vector<float> test_freq_factors(std::size_t n) {
  std::vector<float> f(n);
  for (std::size_t i = 0; i < n; ++i) f[i] = 0.25f + float((i * 7) % 11) * 0.35f;
  return f;
}

// `image` read back and written again as `arch` (its `<old arch>.*` keys
// renamed), without the tensor `drop` and with the F32 vectors `extra`
// added: malformed variants of valid synthetic files.
// A `keys` value that removes the key.
constexpr std::uint32_t drop_key = 0xffffffffu;

// `keys` sets (or adds) `<arch>.<key>` = a u32 value (drop_key: removes it).
std::vector<std::byte> rewrite(const gguf_file& f, std::string_view arch, std::string_view drop,
                               const std::vector<std::pair<std::string, std::vector<float>>>& extra = {},
                               const std::vector<std::pair<std::string, std::uint32_t>>& keys = {}) {
  const std::string old_prefix = std::string(f.get<std::string_view>("general.architecture")) + ".";
  gguf_writer w;
  w.add("general.architecture", arch);
  for (const auto& [key, value] : keys)
    if (value != drop_key) w.add(std::string(arch) + "." + key, value);
  for (const auto& [key, value] : f.metadata()) {
    if (!key.starts_with(old_prefix)) continue;
    const std::string renamed = std::string(arch) + "." + std::string(key.substr(old_prefix.size()));
    if (std::ranges::any_of(keys, [&](const auto& k) { return std::string(arch) + "." + k.first == renamed; }))
      continue;
    std::visit(
        [&](const auto& v) {
          if constexpr (!std::is_same_v<std::decay_t<decltype(v)>, gguf_array>) w.add(renamed, v);
        },
        value);
  }
  for (const gguf_tensor& t : f.tensors())
    if (t.name != drop)
      w.add_tensor(t.name, t.type, std::span<const std::uint64_t>(t.dims.data(), t.n_dims),
                   std::span<const std::byte>(t.data, static_cast<std::size_t>(t.n_bytes)));
  for (const auto& [name, values] : extra)
    w.add_tensor(name, ggml_type::f32, {values.size()}, std::as_bytes(std::span<const float>(values)));
  return w.bytes();
}
}  // namespace

TEST_CASE("architectures: qwen2 and llama with rope_freqs match the double-precision oracle") {
  struct shape {
    std::size_t dim, heads, kv_heads, ffn, vocab, rotary;  // rotary 0 = the whole head
  };
  // GQA, MHA, MQA (group 3), and partial rotary dims (half the head): the
  // split-half pairs of qwen2 are then (i, i + rotary / 2), not head_dim / 2.
  const std::vector<shape> shapes{{64, 4, 2, 96, 300, 0}, {48, 6, 6, 80, 40, 0}, {96, 3, 1, 160, 37, 16},
                                  {64, 2, 1, 64, 290, 16}};
  std::mt19937 rng(7);
  for (const architecture arch : {architecture::qwen2, architecture::llama}) {
    for (const bool with_factors : {false, true}) {
      if (arch == architecture::llama && !with_factors) continue;  // covered by the test above
      for (std::size_t si = 0; si < shapes.size(); ++si) {
        const shape sh = shapes[si];
        synthetic_options o{.config = small_config(sh.dim, sh.heads, sh.kv_heads, sh.ffn, sh.vocab),
                            .seed = 300 + si,
                            .tied_output = si % 2 == 0};
        o.config.arch = arch;
        o.config.rope.theta = 500000.0f;
        const std::size_t rotary = sh.rotary == 0 ? sh.dim / sh.heads : sh.rotary;
        o.config.rope.rotary_dim = rotary;
        if (with_factors) o.config.rope.freq_factors = test_freq_factors(rotary / 2);
        const auto image = synthetic_llama(o).bytes();
        const gguf_file f(as_span(image));
        REQUIRE(f.get<std::string_view>("general.architecture") == traits(arch).name);
        REQUIRE((f.find_tensor("blk.1.attn_k.bias") != nullptr) == (arch == architecture::qwen2));
        REQUIRE((f.find_tensor("rope_freqs.weight") != nullptr) == with_factors);
        llama_model m(f, exact);
        REQUIRE(m.config().arch == arch);
        REQUIRE(m.config().rope.layout == traits(arch).rope_layout);
        REQUIRE(m.config().rope.freq_factors.size() == (with_factors ? rotary / 2 : 0));
        for (std::size_t n : {1u, 9u, 20u}) {
          std::uniform_int_distribution<std::int32_t> token(0, static_cast<std::int32_t>(sh.vocab) - 1);
          std::vector<std::int32_t> tokens(n);
          for (auto& t : tokens) t = token(rng);
          INFO("arch " << traits(arch).name << " factors " << with_factors << " shape " << si << " n " << n);
          REQUIRE(max_error(m, f, tokens) <= 2e-5);
        }
      }
    }
  }
}

TEST_CASE("architectures: a Q4_K_M-style mix loads and matches the oracle") {
  for (const architecture arch : {architecture::llama, architecture::qwen2}) {
    synthetic_options o{.config = small_config(256, 4, 2, 512, 300), .seed = 5};
    o.config.n_layers = 9;  // use_more_bits: layers 0 and 7, 8 (last eighth), and 3, 6 (every third)
    o.config.arch = arch;
    o.tensor_types = q4_k_m_types(o);
    const auto image = synthetic_llama(o).bytes();
    const gguf_file f(as_span(image));
    REQUIRE(f.tensor("output.weight").type == ggml_type::q6_k);
    REQUIRE(f.tensor("token_embd.weight").type == ggml_type::q4_k);
    for (std::size_t l = 0; l < 9; ++l) {
      const std::string b = "blk." + std::to_string(l) + ".";
      const bool more_bits = l == 0 || l == 3 || l == 6 || l == 7 || l == 8;
      INFO("layer " << l);
      REQUIRE(f.tensor(b + "attn_v.weight").type == (more_bits ? ggml_type::q6_k : ggml_type::q4_k));
      REQUIRE(f.tensor(b + "ffn_down.weight").type == (more_bits ? ggml_type::q6_k : ggml_type::q4_k));
      REQUIRE(f.tensor(b + "attn_q.weight").type == ggml_type::q4_k);
      REQUIRE(f.tensor(b + "attn_output.weight").type == ggml_type::q4_k);
      REQUIRE(f.tensor(b + "ffn_gate.weight").type == ggml_type::q4_k);
    }
    llama_model m(f, exact);
    INFO("arch " << traits(arch).name);
    // Layer 0 (more bits): Q4_K attn_q/attn_k and Q6_K attn_v stay in their
    // own blocks, as do the Q4_K gate/up and the Q6_K down and output.
    REQUIRE(m.weight_types() == std::array{weight_type::q4_k, weight_type::q4_k, weight_type::q4_k,
                                           weight_type::q6_k, weight_type::q6_k});
    REQUIRE(max_error(m, f, {1, 17, 299, 3, 42, 42, 8}) <= 2e-5);

    // Two threads split the rows of each part: the same bits as one thread.
    const std::vector<std::int32_t> prompt{5, 9, 200, 7, 7, 1, 150, 33};
    std::vector<float> serial;
    for (const int threads : {1, 2}) {
      kv::contiguous_cache<float> cache(m.kv_shape(), {.max_sequences = 1, .max_tokens = 16});
      batch_builder b;
      b.add(*cache.add_sequence(), prompt, 0);
      thread_pool pool(static_cast<std::size_t>(threads));
      const auto l = m.forward(b.view(), cache, pool);
      if (threads == 1) {
        serial.assign(l.row(0).begin(), l.row(0).end());
        continue;
      }
      for (std::size_t v = 0; v < 300; ++v) REQUIRE(l(0, v) == serial[v]);
    }

    // Int8 activations (per 256 values into the K-quants' integer products):
    // close to the exact logits; a sequence's logits do not depend on its
    // batch or on the threads.
    llama_model mi(f, {.activations = activation_type::q8_0});
    auto last_logits = [&](const std::vector<std::vector<std::int32_t>>& seqs, std::size_t threads) {
      kv::contiguous_cache<float> cache(mi.kv_shape(), {.max_sequences = 2, .max_tokens = 16});
      batch_builder b;
      for (const auto& s : seqs) b.add(*cache.add_sequence(), s, 0);
      thread_pool pool(threads);
      const auto l = mi.forward(b.view(), cache, pool);
      return std::vector<float>(l.row(0).begin(), l.row(0).end());
    };
    const auto alone = last_logits({prompt}, 1);
    REQUIRE(last_logits({prompt, {3, 4, 5, 6, 250}}, 1) == alone);
    REQUIRE(last_logits({prompt, {3, 4, 5, 6, 250}}, 2) == alone);
    double max_diff = 0.0, max_abs = 0.0;
    for (std::size_t v = 0; v < 300; ++v) {
      max_diff = std::max(max_diff, double(std::abs(alone[v] - serial[v])));
      max_abs = std::max(max_abs, double(std::abs(serial[v])));
    }
    INFO("int8 activations: max logit difference " << max_diff << " of max |logit| " << max_abs);
    REQUIRE(max_diff > 0.0);
    REQUIRE(max_diff <= 0.05 * max_abs);
  }

  // Tied output: the embedding is the output, so it gets Q6_K; rows of 64
  // values fall back to Q5_0 (Q4_K) and Q8_0 (Q6_K) as llama-quantize does.
  synthetic_options o{.config = small_config(64, 4, 2, 96, 300), .seed = 6, .tied_output = true};
  o.config.arch = architecture::qwen2;
  o.tensor_types = q4_k_m_types(o);
  const auto image = synthetic_llama(o).bytes();
  const gguf_file f(as_span(image));
  REQUIRE(f.tensor("token_embd.weight").type == ggml_type::q8_0);
  REQUIRE(f.tensor("blk.0.attn_q.weight").type == ggml_type::q5_0);
  REQUIRE(f.tensor("blk.1.attn_v.weight").type == ggml_type::q8_0);
  REQUIRE(f.tensor("blk.0.attn_v.weight").type == ggml_type::q5_0);
  llama_model m(f, exact);
  REQUIRE(max_error(m, f, {1, 17, 299, 3, 42}) <= 2e-5);

  // Rows of 48 values fit no 32-value block either.
  o.config = small_config(48, 3, 3, 80, 64);
  o.tensor_types = q4_k_m_types(o);
  REQUIRE_THROWS_WITH(synthetic_llama(o), "synthetic_llama: tensor 'token_embd.weight' has rows of 48 values, not a "
                                          "multiple of the 32-value blocks of Q8_0 (the fallback of Q6_K)");
  o.tensor_types = [](std::string_view) { return ggml_type::q4_0; };
  REQUIRE_THROWS_WITH(synthetic_llama(o), "synthetic_llama: tensor 'token_embd.weight' has rows of 48 values, not a "
                                          "multiple of the 32-value blocks of Q4_0");
}

TEST_CASE("architectures: Q/K/V of different tensor types each keep their storage") {
  // Q8_0 attn_q next to F16 attn_k/attn_v: not fused, so neither is
  // re-rounded to the other's storage.
  synthetic_options o{.config = small_config(64, 4, 2, 96, 300), .seed = 9};
  o.config.arch = architecture::qwen2;
  o.tensor_types = [](std::string_view name) {
    return name.ends_with("attn_k.weight") || name.ends_with("attn_v.weight") ? ggml_type::f16 : ggml_type::q8_0;
  };
  const auto image = synthetic_llama(o).bytes();
  const gguf_file f(as_span(image));
  llama_model m(f, exact);
  const auto types = m.weight_types();
  REQUIRE(types[0] == weight_type::q8_0);  // the Q part of Q|K|V
  REQUIRE(types[1] == weight_type::q8_0);  // attn_output
  REQUIRE(max_error(m, f, {1, 17, 299, 3, 42}) <= 2e-5);
}

TEST_CASE("architectures: Llama 3.1 frequency factors") {
  // Llama 3.1 8B: theta 500000, head 128, factor 8, low 1, high 4, context 8192.
  const auto f = llama3_rope_freq_factors({}, 500000.0f, 128);
  REQUIRE(f.size() == 64);
  // Wavelength 2 pi 500000^(2i/128): below 8192 / 4 = 2048 for i <= 28
  // (kept), above 8192 for i >= 35 (divided by 8), blended in between.
  for (std::size_t i = 0; i <= 28; ++i) REQUIRE(f[i] == 1.0f);
  for (std::size_t i = 35; i < 64; ++i) REQUIRE(f[i] == 8.0f);
  for (std::size_t i = 29; i < 35; ++i) {
    INFO("pair " << i);
    REQUIRE(f[i] > f[i - 1]);
    REQUIRE(f[i] < 8.0f);
  }
  // Pair 31: smooth = (8192 / wavelen - 1) / 3, f = 1 / ((1 - smooth) / 8 + smooth).
  const double wavelen = 2.0 * 3.14159265358979323846 * std::pow(500000.0, 62.0 / 128.0);
  const double smooth = (8192.0 / wavelen - 1.0) / 3.0;
  REQUIRE(std::abs(f[31] - 1.0 / ((1.0 - smooth) / 8.0 + smooth)) <= 1e-6);
  REQUIRE_THROWS_WITH(llama3_rope_freq_factors({.low_freq_factor = 4.0f}, 500000.0f, 128),
                      Catch::Contains("high_freq_factor (4) > low_freq_factor (4)"));
}

TEST_CASE("architectures: a 128256-token vocabulary with tied output") {
  synthetic_options o{.config = small_config(64, 4, 2, 64, 128256), .seed = 11, .tied_output = true};
  o.config.n_layers = 1;
  o.config.rope.theta = 500000.0f;
  // Llama 3.1's factors with a context short enough that they matter here.
  o.config.rope.freq_factors = llama3_rope_freq_factors({.original_context_length = 64}, 500000.0f, 16);
  REQUIRE(o.config.rope.freq_factors.back() == 8.0f);
  const auto image = synthetic_llama(o).bytes();
  const gguf_file f(as_span(image));
  llama_model m(f, exact);
  REQUIRE(m.vocab_size() == 128256);
  REQUIRE(m.config().tied_output);
  REQUIRE(tokenizer::from_gguf(f).vocab_size() == 128256);
  REQUIRE(max_error(m, f, {128255, 0, 128000, 70000, 32767, 32768, 65535, 65536}) <= 2e-5);
}

TEST_CASE("architectures: qwen2 prefill equals decode, and packed sequences equal sequences alone") {
  synthetic_options o{.config = small_config(64, 4, 2, 96, 300), .seed = 21};
  o.config.arch = architecture::qwen2;
  const auto image = synthetic_llama(o).bytes();
  const gguf_file f(as_span(image));
  llama_model m(f, exact);
  const std::vector<std::vector<std::int32_t>> prompts{{5, 9, 200, 7, 7, 1}, {42}, {3, 299, 8, 100}};
  std::vector<std::vector<float>> last(prompts.size());
  for (std::size_t p = 0; p < prompts.size(); ++p) {
    kv::contiguous_cache<float> cache(m.kv_shape(), {.max_sequences = 1, .max_tokens = 16});
    const kv::seq_id s = *cache.add_sequence();
    batch_builder b;
    b.add(s, prompts[p], 0);
    const auto l = m.forward(b.view(), cache);
    last[p].assign(l.row(0).begin(), l.row(0).end());
    kv::contiguous_cache<float> step(m.kv_shape(), {.max_sequences = 1, .max_tokens = 16});
    const kv::seq_id q = *step.add_sequence();
    for (std::size_t i = 0; i < prompts[p].size(); ++i) {
      batch_builder one;
      one.add(q, {&prompts[p][i], 1}, static_cast<std::int32_t>(i));
      const auto d = m.forward(one.view(), step);
      if (i + 1 == prompts[p].size())
        for (std::size_t v = 0; v < 300; ++v) REQUIRE(std::abs(d(0, v) - last[p][v]) <= 1e-4f);
    }
  }
  kv::contiguous_cache<float> cache(m.kv_shape(), {.max_sequences = 4, .max_tokens = 16});
  batch_builder b;
  std::vector<kv::seq_id> ids;
  for (std::size_t p = 0; p < prompts.size(); ++p) ids.push_back(*cache.add_sequence());
  for (std::size_t p : {2u, 0u, 1u}) b.add(ids[p], prompts[p], 0);
  const auto l = m.forward(b.view(), cache);
  std::size_t r = 0;
  for (std::size_t p : {2u, 0u, 1u}) {
    for (std::size_t v = 0; v < 300; ++v) REQUIRE(l(r, v) == last[p][v]);  // batch invariant: bit-identical
    ++r;
  }
}

TEST_CASE("architectures: bad files raise llmkit::error naming the architecture, key or tensor") {
  gguf_writer w;
  w.add("general.architecture", std::string_view("gpt2"));
  const auto unknown = w.bytes();
  REQUIRE_THROWS_WITH(llama_model(gguf_file(as_span(unknown))),
                      "model: unsupported general.architecture 'gpt2' (supported: llama, qwen2, qwen3, gemma2, gemma3, phi3, qwen3moe, gpt-oss, qwen2moe)");

  synthetic_options o{.config = small_config(64, 4, 2, 96, 300), .seed = 3};
  o.config.arch = architecture::qwen2;
  const auto qwen = synthetic_llama(o).bytes();
  const gguf_file qf(as_span(qwen));
  REQUIRE_NOTHROW(llama_model(gguf_file(as_span(rewrite(qf, "qwen2", "")))));
  REQUIRE_THROWS_WITH(llama_model(gguf_file(as_span(rewrite(qf, "qwen2", "blk.1.attn_k.bias")))),
                      "gguf: missing tensor 'blk.1.attn_k.bias'");
  // The same tensors read as llama ignore the biases (llama has none).
  REQUIRE_NOTHROW(llama_model(gguf_file(as_span(rewrite(qf, "llama", "blk.1.attn_k.bias")))));
  const std::vector<float> short_bias(7, 0.0f);
  REQUIRE_THROWS_WITH(
      llama_model(gguf_file(as_span(rewrite(qf, "qwen2", "blk.0.attn_v.bias", {{"blk.0.attn_v.bias", short_bias}})))),
      Catch::Contains("tensor 'blk.0.attn_v.bias' has dims [7,") && Catch::Contains("expected [32, 1]"));

  // rope_freqs.weight must hold rotary_dim / 2 = 8 positive F32 values.
  o.config.arch = architecture::llama;
  const auto llama = synthetic_llama(o).bytes();
  const gguf_file lf(as_span(llama));
  REQUIRE_NOTHROW(llama_model(gguf_file(as_span(rewrite(lf, "llama", "", {{"rope_freqs.weight", test_freq_factors(8)}})))));
  REQUIRE_THROWS_WITH(
      llama_model(gguf_file(as_span(rewrite(lf, "llama", "", {{"rope_freqs.weight", test_freq_factors(7)}})))),
      "llama_config: tensor 'rope_freqs.weight' has 7 values in 1 dims, expected [rotary_dim / 2 = 8]");
  std::vector<float> bad = test_freq_factors(8);
  bad[3] = 0.0f;
  REQUIRE_THROWS_WITH(llama_model(gguf_file(as_span(rewrite(lf, "llama", "", {{"rope_freqs.weight", bad}})))),
                      "llama_config: tensor 'rope_freqs.weight' value 3 = 0 must be finite and > 0");
  synthetic_options wrong = o;
  wrong.config.rope.freq_factors = test_freq_factors(5);
  REQUIRE_THROWS_WITH(synthetic_llama(wrong),
                      "llama_config: rope.freq_factors has 5 values, expected rotary_dim / 2 = 8");
}

TEST_CASE("architectures: the fuzzer's qwen2 seed is synthetic_llama's output, and loads") {
  // One layer of qwen2 with rope_freqs.weight and Q/K/V of two storages.
  synthetic_options o{.config = small_config(16, 2, 1, 32, 40), .seed = 35};
  o.config.n_layers = 1;
  o.config.arch = architecture::qwen2;
  o.config.rope.freq_factors = {1.0f, 2.0f, 3.0f, 8.0f};
  o.tensor_types = [](std::string_view name) { return name.ends_with("attn_v.weight") ? ggml_type::bf16 : ggml_type::f16; };
  const auto expected = synthetic_llama(o).bytes();
  const gguf_file f(as_span(expected));
  llama_model m(f, exact);
  REQUIRE(max_error(m, f, {1, 7, 39, 3}) <= 2e-5);

  test::require_fuzz_seed(o, expected, "tiny_qwen2_rope_freqs.gguf");
}

TEST_CASE("architectures: qwen3 (per-head Q/K norms, wide heads) matches the double-precision oracle") {
  struct shape {
    std::size_t dim, heads, kv_heads, head_dim, ffn, vocab;
  };
  // Heads as wide as dim / heads, and wider (Qwen3 0.6B: dim 1024, 16 heads
  // of 128), in GQA, MHA and MQA.
  const std::vector<shape> shapes{{64, 4, 2, 16, 96, 300}, {64, 4, 2, 32, 96, 300}, {48, 3, 1, 32, 80, 40},
                                  {32, 2, 2, 32, 64, 37}};
  std::mt19937 rng(11);
  for (std::size_t si = 0; si < shapes.size(); ++si) {
    const shape sh = shapes[si];
    synthetic_options o{.config = small_config(sh.dim, sh.heads, sh.kv_heads, sh.ffn, sh.vocab),
                        .seed = 400 + si,
                        .tied_output = si % 2 == 1};
    o.config.arch = architecture::qwen3;
    o.config.head_dim = sh.head_dim;
    o.config.rope.theta = 1000000.0f;
    o.config.rms_eps = 1e-6f;
    const auto image = synthetic_llama(o).bytes();
    const gguf_file f(as_span(image));
    REQUIRE(f.find_tensor("blk.1.attn_q_norm.weight") != nullptr);
    REQUIRE(f.find_tensor("blk.1.attn_k_norm.weight") != nullptr);
    REQUIRE(f.find_tensor("blk.1.attn_q.bias") == nullptr);
    llama_model m(f, exact);
    REQUIRE(m.config().arch == architecture::qwen3);
    REQUIRE(m.config().head_dim == sh.head_dim);
    REQUIRE(m.config().rope.layout == simd::rope_layout::half_split);
    for (std::size_t n : {1u, 9u, 20u}) {
      std::uniform_int_distribution<std::int32_t> token(0, static_cast<std::int32_t>(sh.vocab) - 1);
      std::vector<std::int32_t> tokens(n);
      for (auto& t : tokens) t = token(rng);
      INFO("shape " << si << " n " << n);
      REQUIRE(max_error(m, f, tokens) <= 2e-5);
    }
  }

  // Q4_K_M mix (Q6_K attn_v / ffn_down in some layers), head_dim 128.
  synthetic_options q{.config = small_config(256, 2, 1, 512, 300), .seed = 12};
  q.config.arch = architecture::qwen3;
  q.config.head_dim = 128;
  q.config.n_layers = 3;
  q.tensor_types = q4_k_m_types(q);
  const auto qimage = synthetic_llama(q).bytes();
  const gguf_file qf(as_span(qimage));
  llama_model qm(qf, exact);
  REQUIRE(qm.weight_types()[0] == weight_type::q4_k);
  REQUIRE(max_error(qm, qf, {1, 17, 299, 3, 42, 42, 8}) <= 2e-5);
}

TEST_CASE("architectures: qwen3 prefill equals decode, and packed sequences equal sequences alone") {
  synthetic_options o{.config = small_config(64, 4, 2, 96, 300), .seed = 23};
  o.config.arch = architecture::qwen3;
  o.config.head_dim = 32;
  const auto image = synthetic_llama(o).bytes();
  const gguf_file f(as_span(image));
  llama_model m(f, exact);
  test::check_prefill_equals_decode(m, {{5, 9, 200, 7, 7, 1}, {42}, {3, 299, 8, 100}}, {1, 2, 0});
}

TEST_CASE("architectures: bad qwen3 files raise llmkit::error naming the tensor or key") {
  synthetic_options o{.config = small_config(64, 4, 2, 96, 300), .seed = 3};
  o.config.arch = architecture::qwen3;
  o.config.head_dim = 32;
  const auto image = synthetic_llama(o).bytes();
  const gguf_file f(as_span(image));
  REQUIRE_NOTHROW(llama_model(gguf_file(as_span(rewrite(f, "qwen3", "")))));
  REQUIRE_THROWS_WITH(llama_model(gguf_file(as_span(rewrite(f, "qwen3", "blk.1.attn_k_norm.weight")))),
                      "gguf: missing tensor 'blk.1.attn_k_norm.weight'");
  REQUIRE_THROWS_WITH(llama_model(gguf_file(as_span(rewrite(f, "qwen3", "blk.0.attn_q_norm.weight")))),
                      "gguf: missing tensor 'blk.0.attn_q_norm.weight'");
  const std::vector<float> short_norm(16, 1.0f);
  REQUIRE_THROWS_WITH(llama_model(gguf_file(as_span(
                          rewrite(f, "qwen3", "blk.0.attn_q_norm.weight", {{"blk.0.attn_q_norm.weight", short_norm}})))),
                      Catch::Contains("tensor 'blk.0.attn_q_norm.weight' has dims [16,") &&
                          Catch::Contains("expected [32, 1]"));
  REQUIRE_THROWS_WITH(llama_model(gguf_file(as_span(rewrite(f, "qwen3", "", {}, {{"attention.value_length", 16}})))),
                      "llama_config: qwen3.attention.value_length = 16 differs from the key length 32 (unsupported)");
  // A key length that does not match the projections' rows.
  REQUIRE_THROWS_WITH(llama_model(gguf_file(as_span(rewrite(f, "qwen3", "", {}, {{"attention.key_length", 16},
                                                                                {"attention.value_length", 16},
                                                                                {"rope.dimension_count", 16}})))),
                      Catch::Contains("tensor 'blk.0.attn_q.weight' has dims [64, 128"));
}

TEST_CASE("architectures: the fuzzer's qwen3 seed is synthetic_llama's output, and loads") {
  synthetic_options o{.config = small_config(16, 2, 1, 32, 40), .seed = 36};
  o.config.n_layers = 1;
  o.config.arch = architecture::qwen3;
  o.config.head_dim = 16;
  o.weight_type = ggml_type::f16;
  const auto expected = synthetic_llama(o).bytes();
  const gguf_file f(as_span(expected));
  llama_model m(f, exact);
  REQUIRE(max_error(m, f, {1, 7, 39, 3}) <= 2e-5);
  test::require_fuzz_seed(o, expected, "tiny_qwen3.gguf");
}

namespace {
// A Gemma config: tied output, a window of 4 so that sequences of 9-20
// tokens reach past it, ffn wider than dim.
llama_config gemma_config(architecture arch, std::size_t n_layers) {
  llama_config c = small_config(64, 4, 2, 128, 300);
  c.arch = arch;
  c.n_layers = n_layers;
  c.sliding_window = 4;
  c.rms_eps = 1e-6f;
  return c;
}
}  // namespace

TEST_CASE("architectures: gemma3 and gemma2 match the double-precision oracle") {
  struct variant {
    architecture arch;
    std::size_t n_layers;
    float freq_scale, scale, attention_softcap, final_softcap;
    bool explicit_pattern;
  };
  // gemma3: layers 0-4 local, 5 global, 6 local (6 on 7 layers), linear RoPE
  // scaling on the global layers only, base 10000 on the local ones; gemma2:
  // even layers local, soft-capping with caps small enough to bite.
  const std::vector<variant> variants{
      {architecture::gemma3, 7, 0.125f, 0.0f, 0.0f, 0.0f, false},
      {architecture::gemma3, 3, 1.0f, 0.3f, 0.0f, 0.0f, true},
      {architecture::gemma2, 4, 1.0f, 0.0f, 1.5f, 3.0f, false},
      {architecture::gemma2, 3, 1.0f, 0.2f, 4.0f, 0.0f, true},
  };
  std::mt19937 rng(13);
  for (std::size_t vi = 0; vi < variants.size(); ++vi) {
    const variant& va = variants[vi];
    synthetic_options o{.config = gemma_config(va.arch, va.n_layers), .seed = 500 + vi, .tied_output = true};
    o.config.rope.theta = 1000000.0f;
    o.config.rope.freq_scale = va.freq_scale;
    o.config.attention_scale = va.scale;
    o.config.attention_softcap = va.attention_softcap;
    o.config.final_softcap = va.final_softcap;
    if (va.explicit_pattern) o.config.local_layers = {0, 1, 0};
    const auto image = synthetic_llama(o).bytes();
    const gguf_file f(as_span(image));
    llama_model m(f, exact);
    const llama_config& c = m.config();
    REQUIRE(c.arch == va.arch);
    REQUIRE(c.sliding_window == 4);
    REQUIRE(c.tied_output);
    if (va.explicit_pattern) {
      REQUIRE(c.local_layers == std::vector<std::uint8_t>{0, 1, 0});
    } else if (va.arch == architecture::gemma3) {
      REQUIRE(c.local_layers == std::vector<std::uint8_t>{1, 1, 1, 1, 1, 0, 1});
    } else {
      REQUIRE(c.local_layers == std::vector<std::uint8_t>{1, 0, 1, 0});
    }
    if (va.arch == architecture::gemma3) {
      REQUIRE(c.local_rope.theta == 10000.0f);
      REQUIRE(c.local_rope.freq_scale == 1.0f);
      REQUIRE(c.rope.freq_scale == va.freq_scale);
    } else {
      REQUIRE(c.local_rope.theta == c.rope.theta);
    }
    REQUIRE(c.attention_softcap == va.attention_softcap);
    REQUIRE(c.final_softcap == va.final_softcap);
    for (std::size_t n : {1u, 9u, 20u}) {
      std::uniform_int_distribution<std::int32_t> token(0, 299);
      std::vector<std::int32_t> tokens(n);
      for (auto& t : tokens) t = token(rng);
      INFO("variant " << vi << " n " << n);
      REQUIRE(max_error(m, f, tokens) <= 2e-5);
    }
  }
}

TEST_CASE("architectures: gemma3 decode through the window equals prefill, and packs bit-identically") {
  synthetic_options o{.config = gemma_config(architecture::gemma3, 7), .seed = 31, .tied_output = true};
  const auto image = synthetic_llama(o).bytes();
  const gguf_file f(as_span(image));
  llama_model m(f, exact);
  test::check_prefill_equals_decode(m, {{5, 9, 200, 7, 7, 1, 3, 44, 12, 250}, {42}, {3, 299, 8, 100}}, {2, 0, 1});
}

TEST_CASE("architectures: a gemma3 file with the 262144-token vocabulary") {
  synthetic_options o{.config = gemma_config(architecture::gemma3, 1), .seed = 37, .tied_output = true};
  o.config.dim = 32;
  o.config.n_heads = 2;
  o.config.n_kv_heads = 1;
  o.config.head_dim = 16;
  o.config.ffn_dim = 64;
  o.config.n_vocab = 262144;
  const auto image = synthetic_llama(o).bytes();
  const gguf_file f(as_span(image));
  llama_model m(f, exact);
  REQUIRE(m.vocab_size() == 262144);
  REQUIRE(tokenizer::from_gguf(f).vocab_size() == 262144);
  REQUIRE(max_error(m, f, {262143, 0, 131072, 65536, 262000}) <= 2e-5);
}

TEST_CASE("architectures: bad gemma files raise llmkit::error naming the key or tensor") {
  synthetic_options o{.config = gemma_config(architecture::gemma3, 3), .seed = 41, .tied_output = true};
  const auto image = synthetic_llama(o).bytes();
  const gguf_file f(as_span(image));
  REQUIRE_NOTHROW(llama_model(gguf_file(as_span(rewrite(f, "gemma3", "")))));
  REQUIRE_THROWS_WITH(llama_model(gguf_file(as_span(rewrite(f, "gemma3", "blk.2.post_ffw_norm.weight")))),
                      "gguf: missing tensor 'blk.2.post_ffw_norm.weight'");
  REQUIRE_THROWS_WITH(llama_model(gguf_file(as_span(rewrite(f, "gemma3", "blk.0.post_attention_norm.weight")))),
                      "gguf: missing tensor 'blk.0.post_attention_norm.weight'");
  REQUIRE_THROWS_WITH(llama_model(gguf_file(as_span(rewrite(f, "gemma3", "blk.1.attn_k_norm.weight")))),
                      "gguf: missing tensor 'blk.1.attn_k_norm.weight'");
  // gemma2 has no Q/K norms: the same tensors load without them.
  REQUIRE_NOTHROW(llama_model(gguf_file(as_span(rewrite(f, "gemma2", "blk.1.attn_k_norm.weight")))));
  REQUIRE_THROWS_WITH(llama_model(gguf_file(as_span(rewrite(f, "gemma3", "", {}, {{"attention.sliding_window", drop_key}})))),
                      "llama_config: missing gemma3.attention.sliding_window (gemma3 has sliding-window layers)");
  REQUIRE_THROWS_WITH(llama_model(gguf_file(as_span(rewrite(f, "gemma3", "", {}, {{"attention.sliding_window", 0}})))),
                      "llama_config: gemma3.attention.sliding_window must be > 0");
  REQUIRE_THROWS_WITH(llama_model(gguf_file(as_span(rewrite(f, "gemma3", "", {}, {{"attention.sliding_window", 65}})))),
                      "llama_config: gemma3.attention.sliding_window = 65 exceeds the context_length 64");
  REQUIRE_THROWS_WITH(
      llama_model(gguf_file(as_span(rewrite(f, "gemma3", "", {}, {{"attention.sliding_window_pattern", 0}})))),
      "llama_config: unknown layer pattern gemma3.attention.sliding_window_pattern = 0 (expected every n-th layer "
      "global, n >= 1, or one flag per layer)");
  // A pattern of 1: every layer global.
  const llama_model every(gguf_file(as_span(rewrite(f, "gemma3", "", {}, {{"attention.sliding_window_pattern", 1}}))), exact);
  REQUIRE(every.config().local_layers == std::vector<std::uint8_t>{0, 0, 0});

  // Pattern arrays: one flag per layer.
  synthetic_options wrong = o;
  wrong.config.local_layers = {1, 0};
  REQUIRE_THROWS_WITH(synthetic_llama(wrong), "llama_config: local_layers has 2 entries for 3 layers");
  gguf_writer w = synthetic_llama(o);
  const std::array<bool, 2> two{true, false};
  w.add_array("gemma3.attention.sliding_window_pattern", std::span<const bool>(two));
  const auto short_pattern = w.bytes();
  REQUIRE_THROWS_WITH(llama_model(gguf_file(as_span(short_pattern))),
                      "llama_config: gemma3.attention.sliding_window_pattern has 2 entries for 3 layers");
  gguf_writer w2 = synthetic_llama(o);
  const std::array<std::uint32_t, 3> non_flags{1, 2, 0};
  w2.add_array("gemma3.attention.sliding_window_pattern", std::span<const std::uint32_t>(non_flags));
  const auto non_flag = w2.bytes();
  REQUIRE_THROWS_WITH(llama_model(gguf_file(as_span(non_flag))),
                      "llama_config: gemma3.attention.sliding_window_pattern[1] = 2 is not a flag (0 or 1)");
  synthetic_options no_window = o;
  no_window.config.sliding_window = 0;
  REQUIRE_THROWS_WITH(synthetic_llama(no_window), "synthetic_llama: gemma3 needs config.sliding_window > 0");
}

TEST_CASE("architectures: the fuzzer's gemma3 seed is synthetic_llama's output, and loads") {
  synthetic_options o{.config = small_config(16, 2, 1, 32, 40), .seed = 38, .tied_output = true};
  o.config.n_layers = 2;
  o.config.arch = architecture::gemma3;
  o.config.sliding_window = 2;
  o.config.final_softcap = 10.0f;
  o.weight_type = ggml_type::f16;
  const auto expected = synthetic_llama(o).bytes();
  const gguf_file f(as_span(expected));
  llama_model m(f, exact);
  REQUIRE(max_error(m, f, {1, 7, 39, 3}) <= 2e-5);
  test::require_fuzz_seed(o, expected, "tiny_gemma3.gguf");
}

TEST_CASE("architectures: a sliding window in a llama file's metadata is honoured") {
  // Mistral 7B v0.1 style: every layer sees the last `window` positions.
  for (const std::size_t window : {1u, 3u, 8u}) {
    synthetic_options o{.config = small_config(64, 4, 2, 96, 300), .seed = 600 + window};
    o.config.sliding_window = window;
    const auto image = synthetic_llama(o).bytes();
    const gguf_file f(as_span(image));
    REQUIRE(f.get<std::size_t>("llama.attention.sliding_window") == window);
    llama_model m(f, exact);
    REQUIRE(m.config().sliding_window == window);
    REQUIRE(m.config().local_layers == std::vector<std::uint8_t>{1, 1});
    REQUIRE(m.config().local_rope.theta == m.config().rope.theta);
    const std::vector<std::int32_t> tokens{5, 9, 200, 7, 7, 1, 3, 44, 12, 250, 17, 2};
    INFO("window " << window);
    REQUIRE(max_error(m, f, tokens) <= 2e-5);
    // The same weights without the key attend to everything: the last
    // position's logits move once the sequence is longer than the window.
    llama_model full(gguf_file(as_span(rewrite(f, "llama", "", {}, {{"attention.sliding_window", drop_key}}))), exact);
    REQUIRE(full.config().sliding_window == 0);
    auto last = [&](llama_model& model) {
      kv::contiguous_cache<float> cache(model.kv_shape(), {.max_sequences = 1, .max_tokens = 16});
      batch_builder b;
      b.add(*cache.add_sequence(), tokens, 0);
      const auto l = model.forward(b.view(), cache);
      return std::vector<float>(l.row(0).begin(), l.row(0).end());
    };
    REQUIRE(last(m) != last(full));
  }
  // A window wider than the context is refused, by the writer and the reader.
  synthetic_options o{.config = small_config(64, 4, 2, 96, 300), .seed = 7};
  o.config.sliding_window = 65;
  REQUIRE_THROWS_WITH(synthetic_llama(o), "llama_config: sliding_window = 65 exceeds context_length = 64");
  o.config.sliding_window = 4;
  const auto image = synthetic_llama(o).bytes();
  const gguf_file f(as_span(image));
  REQUIRE_THROWS_WITH(llama_model(gguf_file(as_span(rewrite(f, "llama", "", {}, {{"context_length", 3}})))),
                      "llama_config: llama.attention.sliding_window = 4 exceeds the context_length 3");
}

namespace {
// LongRoPE-like divisors: short ones near 1, long ones growing with the pair.
std::vector<float> longrope_factors(std::size_t n, bool long_set) {
  std::vector<float> f(n);
  for (std::size_t i = 0; i < n; ++i) f[i] = long_set ? 1.0f + 3.0f * float(i) : 1.0f + 0.05f * float(i % 5);
  return f;
}
}  // namespace

TEST_CASE("architectures: phi3 (fused Q|K|V and gate|up, partial rotary, LongRoPE) matches the oracle") {
  struct shape {
    std::size_t dim, heads, kv_heads, head_dim, rotary;
    bool longrope;
  };
  // Phi-3.5-mini: MHA, rotary = head; Phi-4-mini: GQA, rotary 3/4 of the head.
  const std::vector<shape> shapes{{64, 4, 4, 16, 16, false}, {64, 4, 4, 16, 16, true}, {64, 2, 1, 32, 24, true},
                                  {96, 3, 1, 32, 16, true}};
  std::mt19937 rng(17);
  for (std::size_t si = 0; si < shapes.size(); ++si) {
    const shape sh = shapes[si];
    synthetic_options o{.config = small_config(sh.dim, sh.heads, sh.kv_heads, 96, 300),
                        .seed = 700 + si,
                        .tied_output = si % 2 == 1};
    o.config.arch = architecture::phi3;
    o.config.head_dim = sh.head_dim;
    o.config.rope.rotary_dim = sh.rotary;
    if (sh.longrope) {
      o.config.rope_long_factors = longrope_factors(sh.rotary / 2, true);
      o.config.rope_short_factors = longrope_factors(sh.rotary / 2, false);
      o.config.original_context_length = 16;
      o.config.rope_attn_factor = 1.19f;
    }
    const auto image = synthetic_llama(o).bytes();
    const gguf_file f(as_span(image));
    REQUIRE(f.find_tensor("blk.0.attn_qkv.weight") != nullptr);
    REQUIRE(f.find_tensor("blk.0.attn_q.weight") == nullptr);
    REQUIRE(f.find_tensor("blk.0.ffn_gate.weight") == nullptr);
    REQUIRE(f.tensor("blk.0.ffn_up.weight").rows() == 2 * 96);
    // The file's context (64) is past the original 16: the long factors;
    // a 16-token run takes the short ones.
    for (const std::size_t context : {0u, 16u}) {
      llama_model m(f, {.activations = activation_type::f32, .context_length = context});
      INFO("shape " << si << " context " << context);
      if (sh.longrope)
        REQUIRE(m.config().rope.freq_factors == (context == 0 ? o.config.rope_long_factors : o.config.rope_short_factors));
      reference::llama_reference ref(f);
      if (context != 0) ref.context = context;
      for (std::size_t n : {1u, 9u, 20u}) {
        std::uniform_int_distribution<std::int32_t> token(0, 299);
        std::vector<std::int32_t> tokens(n);
        for (auto& t : tokens) t = token(rng);
        INFO("n " << n);
        REQUIRE(max_error(m, ref, tokens) <= 2e-5);
      }
    }
  }
  // Q4_K_M: the fused tensors are Q4_K (layer 0 is not one of the two
  // layers' "more bits" ones), the output Q6_K.
  synthetic_options q{.config = small_config(256, 2, 2, 256, 300), .seed = 13};
  q.config.arch = architecture::phi3;
  q.tensor_types = q4_k_m_types(q);
  const auto qimage = synthetic_llama(q).bytes();
  const gguf_file qf(as_span(qimage));
  REQUIRE(qf.tensor("blk.1.ffn_down.weight").type == ggml_type::q6_k);
  llama_model qm(qf, exact);
  REQUIRE(qm.weight_types() == std::array{weight_type::q4_k, weight_type::q4_k, weight_type::q4_k,
                                          weight_type::q4_k, weight_type::q6_k});
  REQUIRE(max_error(qm, qf, {1, 17, 299, 3, 42, 42, 8}) <= 2e-5);
}

TEST_CASE("architectures: phi3 sliding windows, and bad phi3 files") {
  synthetic_options o{.config = small_config(64, 4, 4, 96, 300), .seed = 43};
  o.config.arch = architecture::phi3;
  o.config.sliding_window = 3;  // Phi-3-mini-4k: 2047 of 4096
  o.config.rope_long_factors = longrope_factors(8, true);
  o.config.rope_short_factors = longrope_factors(8, false);
  const auto image = synthetic_llama(o).bytes();
  const gguf_file f(as_span(image));
  llama_model m(f, exact);
  REQUIRE(m.config().sliding_window == 3);
  REQUIRE(max_error(m, f, {5, 9, 200, 7, 7, 1, 3, 44, 12, 250}) <= 2e-5);
  // Phi-3.5-mini / Phi-4-mini files: window 262144 > context 131072, full attention.
  for (const std::uint32_t window : {64u, 100u}) {
    const llama_model full(gguf_file(as_span(rewrite(f, "phi3", "", {}, {{"attention.sliding_window", window}}))), exact);
    REQUIRE(full.config().sliding_window == 0);
  }

  REQUIRE_THROWS_WITH(llama_model(gguf_file(as_span(rewrite(f, "phi3", "blk.1.attn_qkv.weight")))),
                      "gguf: missing tensor 'blk.1.attn_qkv.weight'");
  REQUIRE_THROWS_WITH(llama_model(gguf_file(as_span(rewrite(f, "phi3", "rope_factors_short.weight")))),
                      "llama_config: tensor 'rope_factors_long.weight' without 'rope_factors_short.weight'");
  REQUIRE_THROWS_WITH(
      llama_model(gguf_file(as_span(rewrite(f, "phi3", "rope_factors_long.weight",
                                            {{"rope_factors_long.weight", longrope_factors(7, true)}})))),
      "llama_config: tensor 'rope_factors_long.weight' has 7 values in 1 dims, expected [rotary_dim / 2 = 8]");
  std::vector<float> zero = longrope_factors(8, false);
  zero[2] = 0.0f;
  REQUIRE_THROWS_WITH(
      llama_model(gguf_file(as_span(rewrite(f, "phi3", "rope_factors_short.weight", {{"rope_factors_short.weight", zero}})))),
      "llama_config: tensor 'rope_factors_short.weight' value 2 = 0 must be finite and > 0");
  // The projections as llama's separate tensors are not phi3's.
  synthetic_options split = o;
  split.config.arch = architecture::llama;
  const auto llama_image = synthetic_llama(split).bytes();
  REQUIRE_THROWS_WITH(llama_model(gguf_file(as_span(rewrite(gguf_file(as_span(llama_image)), "phi3", "")))),
                      "gguf: missing tensor 'blk.0.attn_qkv.weight'");
  synthetic_options bad = o;
  bad.config.rope_attn_factor = 0.0f;
  REQUIRE_THROWS_WITH(synthetic_llama(bad), "llama_config: rope_attn_factor = 0 must be finite and > 0");
  bad = o;
  bad.config.rope_short_factors.pop_back();
  REQUIRE_THROWS_WITH(synthetic_llama(bad), "llama_config: LongRoPE factors have 8 (long) and 7 (short) values, "
                                            "expected rotary_dim / 2 = 8 each");
}

TEST_CASE("architectures: the fuzzer's phi3 seed is synthetic_llama's output, and loads") {
  synthetic_options o{.config = small_config(16, 2, 1, 32, 40), .seed = 39};
  o.config.n_layers = 1;
  o.config.arch = architecture::phi3;
  o.config.rope.rotary_dim = 4;
  o.config.rope_long_factors = {1.0f, 4.0f};
  o.config.rope_short_factors = {1.0f, 1.5f};
  o.config.original_context_length = 16;
  o.config.rope_attn_factor = 1.2f;
  o.weight_type = ggml_type::f16;
  const auto expected = synthetic_llama(o).bytes();
  const gguf_file f(as_span(expected));
  llama_model m(f, exact);
  REQUIRE(max_error(m, f, {1, 7, 39, 3}) <= 2e-5);
  test::require_fuzz_seed(o, expected, "tiny_phi3.gguf");
}

TEST_CASE("architectures: the fuzzer's gemma2 seed is synthetic_llama's output, and loads") {
  // Gemma 2's soft-caps and an explicit flag pattern, Q8_0 matrices.
  synthetic_options o{.config = small_config(32, 2, 1, 64, 40), .seed = 40, .tied_output = true};
  o.config.n_layers = 2;
  o.config.arch = architecture::gemma2;
  o.config.sliding_window = 2;
  o.config.local_layers = {1, 0};
  o.config.attention_softcap = 3.0f;
  o.config.final_softcap = 5.0f;
  o.weight_type = ggml_type::q8_0;
  const auto expected = synthetic_llama(o).bytes();
  const gguf_file f(as_span(expected));
  llama_model m(f, exact);
  REQUIRE(m.config().attention_softcap == 3.0f);
  REQUIRE(max_error(m, f, {1, 7, 39, 3}) <= 2e-5);
  test::require_fuzz_seed(o, expected, "tiny_gemma2.gguf");
}

TEST_CASE("architectures: YaRN RoPE scaling matches the oracle on qwen3 and windowed llama files") {
  // Heads of 16 (8 pairs), theta 10000, original context 4096: the
  // correction range is pairs [2, 6], so some pairs keep the extrapolated
  // angle, some the interpolated one and some blend.
  simd::rope_config r{.rotary_dim = 16, .freq_scale = 0.25f};
  r.yarn = {.ext_factor = 1.0f, .beta_fast = 32.0f, .beta_slow = 1.0f, .original_context = 4096};
  double lo = 0, hi = 0;
  simd::detail::yarn_correction_range(r, 16, lo, hi);
  REQUIRE(lo == 2.0);
  REQUIRE(hi == 6.0);
  // Pair 0 turns as unscaled RoPE, pair 7 as linear scaling, both times
  // 1 + 0.1 ln 4.
  const simd::rope_table table(r, 16, 40);
  const double magnitude = 1.0 + 0.1 * std::log(4.0);
  REQUIRE(std::abs(table.cos_row(37)[0] - std::cos(37.0) * magnitude) <= 1e-6);
  const double inv7 = std::pow(10000.0, -14.0 / 16.0);
  REQUIRE(std::abs(table.cos_row(37)[14] - std::cos(37.0 * 0.25 * inv7) * magnitude) <= 1e-6);
  for (const architecture arch : {architecture::qwen3, architecture::llama}) {
    synthetic_options o{.config = small_config(64, 4, 2, 96, 300), .seed = 900};
    o.config.arch = arch;
    o.config.rope = r;
    if (arch == architecture::llama) o.config.sliding_window = 5;  // YaRN on local layers too (gpt-oss)
    const auto image = synthetic_llama(o).bytes();
    const gguf_file f(as_span(image));
    const std::string p = std::string(traits(arch).name) + ".";
    REQUIRE(f.get<std::string_view>(p + "rope.scaling.type") == "yarn");
    llama_model m(f, exact);
    REQUIRE(m.config().rope.yarn.original_context == 4096);
    REQUIRE(m.config().rope.freq_scale == 0.25f);
    std::vector<std::int32_t> tokens(30);
    for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = std::int32_t((i * 37 + 11) % 300);
    INFO(traits(arch).name);
    REQUIRE(max_error(m, f, tokens) <= 2e-5);
    // Without the key, a "yarn" file has ext_factor 1 (llama.cpp's default).
    const llama_model defaulted(gguf_file(as_span(rewrite(f, traits(arch).name, "", {},
                                                          {{"rope.scaling.yarn_ext_factor", drop_key}}))),
                                exact);
    REQUIRE(defaulted.config().rope.yarn.ext_factor == 1.0f);
  }
  // Bad YaRN fields are refused by name.
  synthetic_options bad{.config = small_config(64, 4, 2, 96, 300), .seed = 901};
  bad.config.rope = r;
  bad.config.rope.yarn.ext_factor = 2.0f;
  REQUIRE_THROWS_WITH(synthetic_llama(bad), Catch::Contains("yarn.ext_factor = 2"));
  bad.config.rope.yarn.ext_factor = 1.0f;
  bad.config.rope.yarn.beta_slow = 0.0f;
  REQUIRE_THROWS_WITH(synthetic_llama(bad), Catch::Contains("yarn.beta_slow = 0"));
  bad.config.rope.yarn.beta_slow = 1.0f;
  const auto image = synthetic_llama(bad).bytes();
  const gguf_file f(as_span(image));
  REQUIRE_THROWS_WITH(llama_model(gguf_file(as_span(rewrite(f, "llama", "", {},
                                                            {{"rope.scaling.original_context_length", drop_key}})))),
                      Catch::Contains("rope.scaling.original_context_length"));
}
