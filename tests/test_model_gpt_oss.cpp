// SPDX-License-Identifier: MIT
// The gpt-oss architecture (model/llama.hpp): Q/K/V and output biases,
// attention sinks, sliding-window layers alternating with full ones, YaRN,
// a biased router taking the k largest logits then their softmax, and
// experts with biases and the clamped SwiGLU; synthetic files against the
// double-precision oracle in F32, MXFP4 and Q8_0, prefill against decode,
// batch invariance, and bad files.
#include <llmkit/core/executor.hpp>
#include <llmkit/kv/contiguous_cache.hpp>
#include <llmkit/model/architecture.hpp>
#include <llmkit/model/batch.hpp>
#include <llmkit/model/gguf_writer.hpp>
#include <llmkit/model/llama.hpp>
#include <llmkit/model/synthetic.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <span>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "model_checks.hpp"
#include "reference/model_reference.hpp"

using namespace llmkit;
using namespace llmkit::model;
using namespace llmkit::test;
using Catch::Matchers::Contains;

namespace {

// gpt-oss's shape in miniature: heads wider than dim / n_heads, a window of
// `window` tokens on the even layers, YaRN when `yarn`.
llama_config gpt_oss_config(std::size_t dim, std::size_t n_expert, std::size_t k, std::size_t expert_ffn,
                            std::size_t window, bool yarn) {
  llama_config c;
  c.arch = architecture::gpt_oss;
  c.n_vocab = 300;
  c.dim = dim;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 32;
  c.ffn_dim = expert_ffn;
  c.n_expert = n_expert;
  c.n_expert_used = k;
  c.expert_ffn_dim = expert_ffn;
  c.context_length = 64;
  c.rope.theta = 150000.0f;
  c.rms_eps = 1e-5f;
  c.sliding_window = window;
  if (yarn) {
    c.rope.freq_scale = 1.0f / 4.0f;
    c.rope.yarn = {.ext_factor = 1.0f, .beta_fast = 32.0f, .beta_slow = 1.0f, .original_context = 16};
  }
  return c;
}

}  // namespace

TEST_CASE("gpt-oss: biases, sinks, alternating windows, YaRN, top-k softmax and clamped SwiGLU match the oracle") {
  struct shape {
    std::size_t dim, n_expert, k, expert_ffn, window;
    bool yarn;
  };
  const std::vector<shape> shapes{{64, 4, 2, 64, 4, true}, {96, 8, 1, 32, 7, false}, {64, 3, 3, 96, 5, true}};
  std::mt19937 rng(20);
  for (std::size_t si = 0; si < shapes.size(); ++si) {
    const shape sh = shapes[si];
    const synthetic_options o{.config = gpt_oss_config(sh.dim, sh.n_expert, sh.k, sh.expert_ffn, sh.window, sh.yarn),
                              .seed = 700 + si};
    const auto image = synthetic_llama(o).bytes();
    const gguf_file f(as_span(image));
    REQUIRE(f.get<std::string_view>("general.architecture") == "gpt-oss");
    REQUIRE(f.find_tensor("blk.1.attn_sinks.weight") != nullptr);
    REQUIRE(f.find_tensor("blk.0.post_attention_norm.weight") != nullptr);
    REQUIRE(f.find_tensor("blk.0.ffn_norm.weight") == nullptr);
    llama_model m(f, exact);
    const llama_config& c = m.config();
    REQUIRE(c.arch == architecture::gpt_oss);
    REQUIRE(c.rope.layout == simd::rope_layout::half_split);
    REQUIRE(c.sliding_window == sh.window);
    REQUIRE(c.is_local(0));
    REQUIRE_FALSE(c.is_local(1));
    REQUIRE((c.rope.yarn.ext_factor != 0.0f) == sh.yarn);
    for (std::size_t n : {1u, 9u, 20u}) {
      INFO("shape " << si << " n " << n);
      REQUIRE(max_error(m, f, random_tokens(n, 300, rng)) <= 2e-5);
    }
  }
}

TEST_CASE("gpt-oss: MXFP4 and Q8_0 experts match the oracle, and int8 activations stay close") {
  std::mt19937 rng(21);
  for (const ggml_type type : {ggml_type::mxfp4, ggml_type::q8_0}) {
    INFO(ggml_type_name(std::uint32_t(type)));
    const synthetic_options o{.config = gpt_oss_config(64, 4, 4, 64, 4, true), .weight_type = type, .seed = 31};
    const auto image = synthetic_llama(o).bytes();
    const gguf_file f(as_span(image));
    REQUIRE(f.tensor("blk.0.ffn_up_exps.weight").type == type);
    llama_model m(f, exact);
    const auto tokens = random_tokens(11, 300, rng);
    REQUIRE(max_error(m, f, tokens) <= 2e-5);
    // int8 activations, every expert used (k = n_expert) so rounding cannot change the routing.
    llama_model int8(f);
    require_int8_close(all_logits(m, tokens), all_logits(int8, tokens), 0.05);
  }
}

TEST_CASE("gpt-oss: prefill equals decode, packed sequences equal sequences alone, on 1 and 2 threads") {
  const synthetic_options o{.config = gpt_oss_config(64, 4, 2, 64, 3, true), .weight_type = ggml_type::mxfp4,
                            .seed = 41};
  const auto image = synthetic_llama(o).bytes();
  const gguf_file f(as_span(image));
  llama_model m(f);
  thread_pool pool(2);
  check_prefill_equals_decode(m, {{5, 9, 200, 7, 7, 1, 33}, {42}, {3, 299, 8, 100}}, {2, 0, 1}, &pool);
}

TEST_CASE("gpt-oss: bad files raise llmkit::error naming the tensor") {
  const synthetic_options o{.config = gpt_oss_config(64, 4, 2, 32, 4, false), .seed = 1};
  const auto image = synthetic_llama(o).bytes();
  const gguf_file f(as_span(image));
  REQUIRE_NOTHROW(llama_model(f));
  for (const char* dropped : {"blk.1.attn_sinks.weight", "blk.0.attn_output.bias", "blk.0.ffn_gate_inp.bias",
                              "blk.1.ffn_down_exps.bias", "blk.0.post_attention_norm.weight"}) {
    gguf_writer w;
    for (const auto& [key, value] : f.metadata())
      std::visit(
          [&](const auto& v) {
            if constexpr (!std::is_same_v<std::decay_t<decltype(v)>, gguf_array>) w.add(key, v);  // no tokenizer
          },
          value);
    for (const gguf_tensor& t : f.tensors())
      if (t.name != dropped)
        w.add_tensor(t.name, t.type, std::span<const std::uint64_t>(t.dims.data(), t.n_dims),
                     std::span<const std::byte>(t.data, static_cast<std::size_t>(t.n_bytes)));
    const auto bytes = w.bytes();
    INFO(dropped);
    REQUIRE_THROWS_WITH(llama_model(gguf_file(as_span(bytes))), Contains(std::string("'") + dropped + "'"));
  }
  // A window is required: gpt-oss alternates windowed and full layers.
  llama_config c = o.config;
  c.sliding_window = 0;
  REQUIRE_THROWS_AS(synthetic_llama({.config = c}), llmkit::error);
}

TEST_CASE("gpt-oss: the fuzzer's gpt-oss seed is synthetic_llama's output, and loads") {
  // One layer (windowed), 4 experts of which 2 are used, MXFP4 matrices (biases, sinks and router F32).
  synthetic_options o{.config = gpt_oss_config(32, 4, 2, 32, 3, true), .weight_type = ggml_type::mxfp4, .seed = 49};
  o.config.n_layers = 1;
  o.config.n_vocab = 40;
  o.config.n_heads = 2;
  o.config.n_kv_heads = 1;
  o.config.head_dim = 16;
  const auto expected = synthetic_llama(o).bytes();
  const gguf_file f(as_span(expected));
  llama_model m(f, exact);
  const auto got = all_logits(m, {1, 7, 39, 3});
  const auto want = reference::llama_reference(f).logits({1, 7, 39, 3});
  for (std::size_t t = 0; t < 4; ++t)
    for (std::size_t v = 0; v < 40; ++v) REQUIRE(std::abs(double(got[t][v]) - want[t][v]) <= 2e-5 * std::max(1.0, std::abs(want[t][v])));

  test::require_fuzz_seed(o, expected, "tiny_gpt_oss.gguf");
}
