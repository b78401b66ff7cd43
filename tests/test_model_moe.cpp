// SPDX-License-Identifier: MIT
// The qwen3moe architecture (model/llama.hpp with routed experts): synthetic
// files against the double-precision oracle, quantised and in place, batch
// invariance, the bytes a decode step reads, and bad files.
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
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "model_checks.hpp"
#include "reference/model_reference.hpp"

using namespace llmkit;
using namespace llmkit::model;
using namespace llmkit::test;
using Catch::Matchers::Contains;

namespace {

llama_config moe_config(std::size_t dim, std::size_t n_expert, std::size_t k, std::size_t expert_ffn,
                        std::size_t vocab) {
  llama_config c;
  c.arch = architecture::qwen3moe;
  c.n_vocab = vocab;
  c.dim = dim;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = dim >= 256 ? 64 : 32;  // whole 256-value blocks for the K-quants at dim 256
  c.ffn_dim = 3 * expert_ffn;  // the files' feed_forward_length, unused by a mixture
  c.n_expert = n_expert;
  c.n_expert_used = k;
  c.expert_ffn_dim = expert_ffn;
  c.context_length = 64;
  c.rope.theta = 1000000.0f;
  c.rms_eps = 1e-6f;
  return c;
}

// A key value that removes the key.
constexpr std::uint32_t drop_key = 0xffffffffu;

// f's image with qwen3moe.<key> set to (or, drop_key, without) the values in
// `keys`, and without tensor `drop` (scalar keys and tensors only: no tokenizer).
std::vector<std::byte> with_keys(const gguf_file& f, const std::vector<std::pair<std::string, std::uint32_t>>& keys,
                                 std::string_view drop = "") {
  gguf_writer w;
  for (const auto& [key, value] : keys)
    if (value != drop_key) w.add("qwen3moe." + key, value);
  for (const auto& [key, value] : f.metadata()) {
    if (std::ranges::any_of(keys, [&](const auto& k) { return "qwen3moe." + k.first == key; })) continue;
    std::visit(
        [&](const auto& v) {
          if constexpr (!std::is_same_v<std::decay_t<decltype(v)>, gguf_array>) w.add(key, v);
        },
        value);
  }
  for (const gguf_tensor& t : f.tensors())
    if (t.name != drop)
      w.add_tensor(t.name, t.type, std::span<const std::uint64_t>(t.dims.data(), t.n_dims),
                   std::span<const std::byte>(t.data, static_cast<std::size_t>(t.n_bytes)));
  return w.bytes();
}

// The fuzzer's seed `name`: a one-layer mixture of config `c` (2 heads of
// 16, 1 KV head, F16 matrices, the router F32), checked against the oracle
// and against the committed file.
void check_fuzz_seed(llama_config c, std::uint64_t seed, const std::string& name) {
  c.n_layers = 1;
  c.n_heads = 2;
  c.n_kv_heads = 1;
  c.head_dim = 16;
  const synthetic_options o{.config = c, .weight_type = ggml_type::f16, .seed = seed};
  const auto expected = synthetic_llama(o).bytes();
  const gguf_file f(as_span(expected));
  llama_model m(f, exact);
  REQUIRE(max_error(m, f, {1, 7, 39, 3}) <= 2e-5);
  test::require_fuzz_seed(o, expected, name);
}

}  // namespace

TEST_CASE("qwen3moe: routed experts match the double-precision oracle, k = 1 to all experts") {
  struct shape {
    std::size_t dim, n_expert, k, expert_ffn;
    bool norm;
  };
  const std::vector<shape> shapes{{64, 4, 2, 32, true}, {64, 8, 1, 64, true}, {96, 6, 6, 32, true},
                                  {64, 5, 3, 96, false}};
  std::mt19937 rng(48);
  for (std::size_t si = 0; si < shapes.size(); ++si) {
    const shape sh = shapes[si];
    synthetic_options o{.config = moe_config(sh.dim, sh.n_expert, sh.k, sh.expert_ffn, 300),
                        .seed = 900 + si,
                        .tied_output = si % 2 == 1};
    o.config.expert_weights_norm = sh.norm;
    const auto image = synthetic_llama(o).bytes();
    const gguf_file f(as_span(image));
    REQUIRE(f.tensor("blk.1.ffn_gate_exps.weight").n_dims == 3);
    REQUIRE(f.find_tensor("blk.1.ffn_gate.weight") == nullptr);
    llama_model m(f, exact);
    const llama_config& c = m.config();
    REQUIRE(c.arch == architecture::qwen3moe);
    REQUIRE(c.has_experts());
    REQUIRE(c.n_expert == sh.n_expert);
    REQUIRE(c.n_expert_used == sh.k);
    REQUIRE(c.expert_ffn_dim == sh.expert_ffn);
    REQUIRE(c.expert_weights_norm == sh.norm);
    REQUIRE(c.rope.layout == simd::rope_layout::half_split);
    for (std::size_t n : {1u, 9u, 20u}) {
      INFO("shape " << si << " n " << n);
      REQUIRE(max_error(m, f, random_tokens(n, 300, rng)) <= 2e-5);
    }
  }
}

TEST_CASE("qwen3moe: Q4_K_M and Q8_0 experts, in place or copied, match the oracle") {
  std::mt19937 rng(5);
  synthetic_options q{.config = moe_config(256, 8, 2, 256, 300), .seed = 12};
  q.config.n_layers = 3;
  q.tensor_types = q4_k_m_types(q);
  const auto qimage = synthetic_llama(q).bytes();
  const gguf_file qf(as_span(qimage));
  REQUIRE(qf.tensor("blk.0.ffn_gate_exps.weight").type == ggml_type::q4_k);
  REQUIRE(qf.tensor("blk.0.ffn_down_exps.weight").type == ggml_type::q4_k);
  REQUIRE(qf.tensor("blk.2.ffn_down_exps.weight").type == ggml_type::q6_k);  // a "more bits" layer
  REQUIRE(qf.tensor("blk.0.ffn_gate_inp.weight").type == ggml_type::f32);
  llama_model copied(qf, {.activations = activation_type::f32, .weights_in_place = false});
  REQUIRE(copied.weight_types()[2] == weight_type::q4_k);
  REQUIRE(copied.weight_types()[3] == weight_type::q4_k);
  const auto tokens = random_tokens(7, 300, rng);
  REQUIRE(max_error(copied, qf, tokens) <= 2e-5);

  // In place needs a mapping: write the file and open it.
  const std::string path = "test_model_moe_q4_k_m.gguf";
  synthetic_llama(q).write(path);
  {
    const gguf_file mapped = gguf_file::open(path);
    llama_model in_place(mapped, exact);
    REQUIRE(in_place.weight_bytes_in_place() > 0);
    REQUIRE(all_logits(in_place, tokens) == all_logits(copied, tokens));  // the same bytes, the same kernels
    // int8 activations: the same in place or copied.
    llama_model int8(mapped), int8_copied(mapped, {.weights_in_place = false});
    REQUIRE(all_logits(int8, tokens) == all_logits(int8_copied, tokens));
  }
  std::remove(path.c_str());

  // int8 activations against the exact product, every expert used (k = n_expert), so
  // that the activations' rounding cannot change which experts a token takes.
  synthetic_options all = q;
  all.config.n_expert = all.config.n_expert_used = 4;
  const auto all_image = synthetic_llama(all).bytes();
  const gguf_file af(as_span(all_image));
  llama_model all_exact(af, exact), all_int8(af);
  // ~2% here: 256-value int8 blocks over 3 layers.
  require_int8_close(all_logits(all_exact, tokens), all_logits(all_int8, tokens), 0.05);

  synthetic_options q8{.config = moe_config(64, 4, 2, 96, 300), .weight_type = ggml_type::q8_0, .seed = 3};
  const auto image = synthetic_llama(q8).bytes();
  const gguf_file f(as_span(image));
  llama_model m(f, exact);
  REQUIRE(m.weight_types()[2] == weight_type::q8_0);
  REQUIRE(max_error(m, f, random_tokens(9, 300, rng)) <= 2e-5);
}

TEST_CASE("qwen3moe: prefill equals decode, packed sequences equal sequences alone, on 1 and 2 threads") {
  synthetic_options o{.config = moe_config(256, 8, 2, 256, 300), .weight_type = ggml_type::q4_k, .seed = 23};
  const auto image = synthetic_llama(o).bytes();
  const gguf_file f(as_span(image));
  llama_model m(f);  // int8 activations, the default
  thread_pool pool(2);
  check_prefill_equals_decode(m, {{5, 9, 200, 7, 7, 1}, {42}, {3, 299, 8, 100}}, {2, 0, 1}, &pool);
}

TEST_CASE("qwen3moe: a decode step reads the router and k experts per layer") {
  synthetic_options o{.config = moe_config(256, 8, 2, 256, 300), .weight_type = ggml_type::q4_k, .seed = 2};
  const auto image = synthetic_llama(o).bytes();
  const gguf_file f(as_span(image));
  llama_model m(f);
  const std::size_t expert_bytes = 3 * 256 * 256 / 256 * ggml_block_bytes(ggml_type::q4_k);  // gate, up, down
  // The F32 router's 8 rows fill one panel of 64 (model/detail/matmul_panels.hpp), which its product reads.
  const std::size_t router_bytes = 64 * 256 * sizeof(float);
  std::size_t dense = f.tensor("output.weight").n_bytes + 256 * sizeof(float);
  for (std::size_t l = 0; l < 2; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    for (const char* t : {"attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight"})
      dense += f.tensor(b + t).n_bytes;
    dense += (2 * 256 + 2 * 64) * sizeof(float);  // attn and ffn norms, Q/K head norms
  }
  REQUIRE(m.weight_bytes_per_step() == dense + 2 * (router_bytes + 2 * expert_bytes));
}

TEST_CASE("qwen3moe: bad files raise llmkit::error naming the key or tensor") {
  synthetic_options o{.config = moe_config(64, 4, 2, 32, 300), .seed = 1};
  {
    llama_config c = o.config;
    c.n_expert_used = 5;
    REQUIRE_THROWS_WITH(c.validate(), Contains("n_expert_used = 5 must be in [1, n_expert = 4]"));
    c.n_expert_used = 0;
    REQUIRE_THROWS_WITH(c.validate(), Contains("n_expert_used = 0"));
    c = o.config;
    c.n_expert = 0;
    REQUIRE_THROWS_WITH(c.validate(), Contains("n_expert = 0 must be in [1, 4096]"));
    c = o.config;
    c.arch = architecture::qwen3;
    REQUIRE_THROWS_WITH(c.validate(), Contains("n_expert = 4 for qwen3, which has no routed experts"));
  }
  // Files whose keys or tensors disagree.
  const auto image = synthetic_llama(o).bytes();
  const gguf_file f(as_span(image));
  REQUIRE_NOTHROW(llama_model(gguf_file(as_span(with_keys(f, {})))));
  REQUIRE_THROWS_WITH(llama_model(gguf_file(as_span(with_keys(f, {{"expert_used_count", 9}})))),
                      Contains("n_expert_used = 9 must be in [1, n_expert = 4]"));
  REQUIRE_THROWS_WITH(llama_model(gguf_file(as_span(with_keys(f, {{"expert_feed_forward_length", 48}})))),
                      Contains("tensor 'blk.0.ffn_gate_exps.weight' has dims [64, 32, 4, 1], expected [64, 48, 4]"));
  REQUIRE_THROWS_WITH(llama_model(gguf_file(as_span(with_keys(f, {{"expert_count", 3}})))),
                      Contains("tensor 'blk.0.ffn_gate_inp.weight' has dims [64, 4, 1, 1], expected [64, 3]"));
  REQUIRE_THROWS_WITH(llama_model(gguf_file(as_span(with_keys(f, {{"expert_count", drop_key}})))),
                      Contains("qwen3moe.expert_count"));
  REQUIRE_THROWS_WITH(llama_model(gguf_file(as_span(with_keys(f, {}, "blk.1.ffn_down_exps.weight")))),
                      Contains("missing tensor 'blk.1.ffn_down_exps.weight'"));
}

TEST_CASE("qwen3moe: the fuzzer's qwen3moe seed is synthetic_llama's output, and loads") {
  check_fuzz_seed(moe_config(32, 4, 2, 32, 40), 48, "tiny_qwen3moe.gguf");  // 4 experts, 2 used
}

namespace {

// Qwen2-MoE: Qwen2's attention (Q/K/V biases) and a shared expert of its own
// width; no expert_weights_norm key, so the routing weights are not
// renormalised (the architecture's default).
llama_config qwen2moe_config(std::size_t dim, std::size_t n_expert, std::size_t k, std::size_t expert_ffn,
                             std::size_t shared_ffn) {
  llama_config c = moe_config(dim, n_expert, k, expert_ffn, 300);
  c.arch = architecture::qwen2moe;
  c.expert_weights_norm = false;
  c.shared_expert_ffn_dim = shared_ffn;
  return c;
}

}  // namespace

TEST_CASE("qwen2moe: routed experts and the gated shared expert match the double-precision oracle") {
  struct shape {
    std::size_t dim, n_expert, k, expert_ffn, shared_ffn;
    bool norm;
  };
  const std::vector<shape> shapes{{64, 4, 2, 32, 96, false}, {64, 6, 4, 64, 32, false}, {96, 5, 5, 32, 64, true}};
  std::mt19937 rng(52);
  for (std::size_t si = 0; si < shapes.size(); ++si) {
    const shape sh = shapes[si];
    synthetic_options o{.config = qwen2moe_config(sh.dim, sh.n_expert, sh.k, sh.expert_ffn, sh.shared_ffn),
                        .seed = 700 + si,
                        .tied_output = si == 1};
    o.config.expert_weights_norm = sh.norm;
    const auto image = synthetic_llama(o).bytes();
    const gguf_file f(as_span(image));
    REQUIRE((f.contains("qwen2moe.expert_weights_norm")) == sh.norm);  // written only when not the default
    REQUIRE(f.tensor("blk.1.ffn_gate_inp_shexp.weight").n_dims == 1);
    llama_model m(f, exact);
    const llama_config& c = m.config();
    REQUIRE(c.arch == architecture::qwen2moe);
    REQUIRE(c.expert_weights_norm == sh.norm);
    REQUIRE(c.shared_expert_ffn_dim == sh.shared_ffn);
    REQUIRE(c.rope.layout == simd::rope_layout::half_split);
    for (std::size_t n : {1u, 9u, 20u}) {
      INFO("shape " << si << " n " << n);
      REQUIRE(max_error(m, f, random_tokens(n, 300, rng)) <= 2e-5);
    }
  }
  // Q8_0 matrices (the shared expert's too): the exact product matches the
  // oracle, int8 activations stay close to it.
  synthetic_options o{.config = qwen2moe_config(64, 4, 2, 32, 32), .weight_type = ggml_type::q8_0, .seed = 9};
  const auto image = synthetic_llama(o).bytes();
  const gguf_file f(as_span(image));
  llama_model int8(f), exact_model(f, exact);
  const auto tokens = random_tokens(6, 300, rng);
  REQUIRE(max_error(exact_model, f, tokens) <= 2e-5);
  require_int8_close(all_logits(exact_model, tokens), all_logits(int8, tokens), 0.05);
}

TEST_CASE("qwen2moe: prefill equals decode, packed sequences equal sequences alone, and a step reads the shared expert") {
  synthetic_options o{.config = qwen2moe_config(256, 8, 2, 256, 512), .weight_type = ggml_type::q4_k, .seed = 29};
  const auto image = synthetic_llama(o).bytes();
  const gguf_file f(as_span(image));
  llama_model m(f);
  thread_pool pool(2);
  check_prefill_equals_decode(m, {{5, 9, 200, 7, 7, 1}, {42}, {3, 299, 8, 100}}, {2, 0, 1}, &pool);

  // Per layer: Q/K/V/O, norms and biases, the router and 2 experts, the
  // shared expert's three matrices and its gate vector.
  const std::size_t q4k_row = 256 / 256 * ggml_block_bytes(ggml_type::q4_k);
  const std::size_t expert_bytes = (256 + 256 + 256) * q4k_row;
  const std::size_t router_bytes = 64 * 256 * sizeof(float);  // 8 rows fill one 64-row panel
  std::size_t dense = f.tensor("output.weight").n_bytes + 256 * sizeof(float);
  for (std::size_t l = 0; l < 2; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    for (const char* t : {"attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight",
                          "ffn_gate_shexp.weight", "ffn_up_shexp.weight", "ffn_down_shexp.weight"})
      dense += f.tensor(b + t).n_bytes;
    dense += (2 * 256 + 256 + 2 * 128 + 256) * sizeof(float);  // norms, Q/K/V biases, the shared gate
  }
  REQUIRE(m.weight_bytes_per_step() == dense + 2 * (router_bytes + 2 * expert_bytes));
}

TEST_CASE("qwen2moe: bad shared experts raise llmkit::error naming the key or tensor") {
  synthetic_options o{.config = qwen2moe_config(64, 4, 2, 32, 48), .seed = 3};
  {
    llama_config c = o.config;
    c.shared_expert_ffn_dim = 0;
    REQUIRE_THROWS_WITH(c.validate(), Contains("shared_expert_ffn_dim = 0 must be in [1, "));
    c = moe_config(64, 4, 2, 32, 300);
    c.shared_expert_ffn_dim = 8;
    REQUIRE_THROWS_WITH(c.validate(), Contains("shared_expert_ffn_dim = 8 for qwen3moe, which has no shared expert"));
  }
  const auto image = synthetic_llama(o).bytes();
  const gguf_file f(as_span(image));
  REQUIRE_NOTHROW(llama_model(gguf_file(as_span(with_keys(f, {})))));
  for (const char* t : {"blk.0.ffn_gate_inp_shexp.weight", "blk.1.ffn_down_shexp.weight", "blk.1.ffn_up_shexp.weight"})
    REQUIRE_THROWS_WITH(llama_model(gguf_file(as_span(with_keys(f, {}, t)))),
                        Contains(std::string("missing tensor '") + t + "'"));
}

TEST_CASE("qwen2moe: the fuzzer's qwen2moe seed is synthetic_llama's output, and loads") {
  llama_config c = qwen2moe_config(32, 4, 2, 32, 32);
  c.n_vocab = 40;
  check_fuzz_seed(c, 49, "tiny_qwen2moe.gguf");
}
