// SPDX-License-Identifier: MIT
// model/synthetic.hpp round trips, and model/llama.hpp against the
// double-precision oracle on random synthetic models of every weight type.
#include <llmkit/kv/contiguous_cache.hpp>
#include <llmkit/model/batch.hpp>
#include <llmkit/model/llama.hpp>
#include <llmkit/model/synthetic.hpp>
#include <llmkit/model/tokenizer.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

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

std::span<const std::byte> as_span(const std::vector<std::byte>& v) { return {v.data(), v.size()}; }

// Max |model - oracle| over all positions of `tokens`, relative to max(1, |oracle|).
double max_error(llama_model& m, const gguf_file& f, const std::vector<std::int32_t>& tokens) {
  kv::contiguous_cache<float> cache(m.kv_shape(), {.max_sequences = 1, .max_tokens = 128});
  batch_builder b;
  b.add(*cache.add_sequence(), tokens, 0, last_logits::skip);
  for (std::size_t i = 0; i < tokens.size(); ++i) b.request_logits(static_cast<std::int32_t>(i));
  const auto logits = m.forward(b.view(), cache);
  const auto ref = reference::llama_reference(f).logits(tokens);
  double worst = 0;
  for (std::size_t t = 0; t < tokens.size(); ++t)
    for (std::size_t v = 0; v < m.vocab_size(); ++v)
      worst = std::max(worst, std::abs(double(logits(t, v)) - ref[t][v]) / std::max(1.0, std::abs(ref[t][v])));
  return worst;
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

  // Through a file and llama_model::load.
  const std::string path = "test_model_synthetic_tmp.gguf";
  o.tied_output = true;
  write_synthetic_llama(path, o);
  auto m = llama_model::load(path);
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
                               ggml_type::q6_k}) {
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
      llama_model m(f);
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
                                          "(supported: 8 16 32 64 80 96 112 128 256)");
  o.config.dim = 64;
  o.config.head_dim = 16;
  REQUIRE_NOTHROW(synthetic_llama(o));
  o.config.n_vocab = 2;
  REQUIRE_THROWS_WITH(synthetic_llama(o), "synthetic_llama: n_vocab must be >= 3 (control tokens), got 2");
}
