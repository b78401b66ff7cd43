// SPDX-License-Identifier: MIT
// model/llama.hpp on the vendored stories260K model: greedy text, packed
// batches equal to single sequences, bad input.
#include <llmkit/kv/contiguous_cache.hpp>
#include <llmkit/kv/paged_cache.hpp>
#include <llmkit/model/language_model.hpp>
#include <llmkit/model/llama.hpp>
#include <llmkit/model/tokenizer.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

using namespace llmkit;
using namespace llmkit::model;

static_assert(language_model<llama_model, kv::contiguous_cache<float>>);
static_assert(language_model<llama_model, kv::paged_cache<f16, 16>>);
static_assert(language_model<llama_model, kv::paged_cache<f16, 16>, thread_pool>);
static_assert(!language_model<int, kv::contiguous_cache<float>>);

// Logits and K/V reached through different kernel paths (prefill vs decode
// attention, packed vs alone tiles) sum in different orders: they agree to
// ~1e-5 (the products themselves are batch invariant, bit for bit).
constexpr float path_tolerance = 2e-5f;

namespace {
struct stories {
  gguf_file file = gguf_file::open(LLMKIT_DEFAULT_MODEL);
  tokenizer tok = tokenizer::from_gguf(file);
  llama_model model{file};
};
stories& loaded() {
  static stories s;
  return s;
}

std::int32_t argmax(std::span<const float> row) {
  return static_cast<std::int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
}
}  // namespace

TEST_CASE("llama: config of stories260K from GGUF metadata") {
  const auto& c = loaded().model.config();
  REQUIRE(c.n_vocab == 512);
  REQUIRE(c.dim == 64);
  REQUIRE(c.n_layers == 5);
  REQUIRE(c.n_heads == 8);
  REQUIRE(c.n_kv_heads == 4);
  REQUIRE(c.head_dim == 8);
  REQUIRE(c.ffn_dim == 172);
  REQUIRE(c.rope.theta == 10000.0f);
  REQUIRE(c.rope.rotary_dim == 8);
  REQUIRE_FALSE(c.tied_output);
  REQUIRE(loaded().model.kv_shape() == kv::kv_shape{5, 4, 8});
}

TEST_CASE("llama: greedy decoding from BOS tells the Lily story") {
  auto& s = loaded();
  kv::contiguous_cache<float> cache(s.model.kv_shape(), {.max_sequences = 1, .max_tokens = 64});
  const kv::seq_id seq = *cache.add_sequence();
  std::vector<std::int32_t> out;
  std::int32_t token = s.tok.bos();
  for (int step = 0; step < 40; ++step) {
    batch_builder b;
    b.add(seq, {&token, 1}, static_cast<std::int32_t>(cache.n_tokens(seq)));
    const auto logits = s.model.forward(b.view(), cache);
    REQUIRE(logits.rows() == 1);
    REQUIRE(logits.cols() == 512);
    token = argmax(logits.row(0));
    out.push_back(token);
  }
  const std::string text = s.tok.decode(out);
  INFO(text);
  REQUIRE(text.rfind(" Once upon a time, there was a little girl named Lily. She loved to play outside in the park.",
                     0) == 0);
}

TEST_CASE("llama: prefill equals token-by-token decode, and packed prompts equal prompts alone") {
  auto& s = loaded();
  const std::vector<std::string> texts{"Once upon a time", "Lily saw a big red ball in the park and", "Tom",
                                       "The cat sat on the mat. It was happy and warm."};
  std::vector<std::vector<std::int32_t>> prompts;
  for (const auto& t : texts) prompts.push_back(s.tok.encode(t, {.add_bos = true}));

  // Each prompt alone: logits of every position.
  std::vector<std::vector<std::vector<float>>> alone(prompts.size());
  for (std::size_t p = 0; p < prompts.size(); ++p) {
    kv::contiguous_cache<float> cache(s.model.kv_shape(), {.max_sequences = 1, .max_tokens = 64});
    const kv::seq_id seq = *cache.add_sequence();
    batch_builder b;
    b.add(seq, prompts[p], 0, last_logits::skip);
    for (std::size_t i = 0; i < prompts[p].size(); ++i) b.request_logits(static_cast<std::int32_t>(i));
    const auto logits = s.model.forward(b.view(), cache);
    for (std::size_t i = 0; i < prompts[p].size(); ++i)
      alone[p].emplace_back(logits.row(i).begin(), logits.row(i).end());
    // Token-by-token on a fresh cache gives the same logits.
    kv::contiguous_cache<float> step_cache(s.model.kv_shape(), {.max_sequences = 1, .max_tokens = 64});
    const kv::seq_id q = *step_cache.add_sequence();
    for (std::size_t i = 0; i < prompts[p].size(); ++i) {
      batch_builder one;
      one.add(q, {&prompts[p][i], 1}, static_cast<std::int32_t>(i));
      const auto l = s.model.forward(one.view(), step_cache);
      for (std::size_t v = 0; v < 512; ++v) REQUIRE(std::abs(l(0, v) - alone[p][i][v]) <= path_tolerance);
    }
  }
  // All prompts packed in one batch (sequence ids in a shuffled order).
  kv::contiguous_cache<float> cache(s.model.kv_shape(), {.max_sequences = 8, .max_tokens = 64});
  std::vector<kv::seq_id> ids;
  for (std::size_t p = 0; p < prompts.size(); ++p) ids.push_back(*cache.add_sequence());
  batch_builder b;
  std::vector<std::int32_t> row_of;
  for (std::size_t p : {2u, 0u, 3u, 1u}) {
    b.add(ids[p], prompts[p], 0, last_logits::skip);
    for (std::size_t i = 0; i < prompts[p].size(); ++i) {
      b.request_logits(static_cast<std::int32_t>(b.n_tokens() - prompts[p].size() + i));
    }
  }
  const auto logits = s.model.forward(b.view(), cache);
  std::size_t r = 0;
  float worst = 0.0f;
  for (std::size_t p : {2u, 0u, 3u, 1u})
    for (std::size_t i = 0; i < prompts[p].size(); ++i, ++r)
      for (std::size_t v = 0; v < 512; ++v) worst = std::max(worst, std::abs(logits(r, v) - alone[p][i][v]));
  REQUIRE(r == logits.rows());
  REQUIRE(worst <= path_tolerance);

  // A mixed step: one decode token for two sequences plus a new prompt.
  const kv::seq_id fresh = *cache.add_sequence();
  batch_builder mixed;
  const std::int32_t next0 = argmax(alone[0].back()), next1 = argmax(alone[1].back());
  mixed.add(ids[0], {&next0, 1}, static_cast<std::int32_t>(prompts[0].size()));
  mixed.add(fresh, prompts[2], 0);
  mixed.add(ids[1], {&next1, 1}, static_cast<std::int32_t>(prompts[1].size()));
  const auto ml = s.model.forward(mixed.view(), cache);
  REQUIRE(ml.rows() == 3);
  for (std::size_t v = 0; v < 512; ++v) REQUIRE(std::abs(ml(1, v) - alone[2].back()[v]) <= path_tolerance);
  // Against the same continuation run alone.
  kv::contiguous_cache<float> solo(s.model.kv_shape(), {.max_sequences = 1, .max_tokens = 64});
  const kv::seq_id q = *solo.add_sequence();
  std::vector<std::int32_t> cont = prompts[1];
  cont.push_back(next1);
  batch_builder sb;
  sb.add(q, cont, 0);
  const auto sl = s.model.forward(sb.view(), solo);
  for (std::size_t v = 0; v < 512; ++v) REQUIRE(std::abs(ml(2, v) - sl(0, v)) <= path_tolerance);
}

TEST_CASE("llama: a stepwise segment gives the bits of one-token decodes, beside decodes and prefills") {
  auto& s = loaded();
  const auto tokens = s.tok.encode("Lily saw a big red ball in the park and she ran to it", {.add_bos = true});
  const auto other = s.tok.encode("Once upon a time", {.add_bos = true});
  const std::size_t head = 6, n = tokens.size() - head;  // prefilled, then n tokens at once
  auto run = [&](auto& exec, bool stepwise) {
    kv::paged_cache<float, 16> cache(s.model.kv_shape(), {.n_blocks = 16});
    const kv::seq_id a = *cache.add_sequence(), b = *cache.add_sequence(), c = *cache.add_sequence();
    batch_builder pre;
    pre.add(a, std::span(tokens).first(head), 0, last_logits::skip);
    pre.add(b, std::span(other).first(3), 0, last_logits::skip);
    s.model.forward(pre.view(), cache, exec);
    std::vector<std::vector<float>> rows;
    if (stepwise) {  // a's n tokens in one segment beside b's decode and c's prefill
      batch_builder step;
      step.add(b, std::span(other).subspan(3, 1), 3);
      step.add_stepwise(a, std::span(tokens).subspan(head), static_cast<std::int32_t>(head));
      for (std::size_t i = 0; i < n; ++i) step.request_logits(static_cast<std::int32_t>(1 + i));
      step.add(c, other, 0);
      const auto l = s.model.forward(step.view(), cache, exec);
      REQUIRE(l.rows() == n + 2);
      for (std::size_t i = 0; i < n; ++i) rows.emplace_back(l.row(1 + i).begin(), l.row(1 + i).end());
    } else {
      for (std::size_t i = 0; i < n; ++i) {
        batch_builder one;
        one.add(a, std::span(tokens).subspan(head + i, 1), static_cast<std::int32_t>(head + i));
        const auto l = s.model.forward(one.view(), cache, exec);
        rows.emplace_back(l.row(0).begin(), l.row(0).end());
      }
    }
    REQUIRE(cache.n_tokens(a) == tokens.size());
    return rows;
  };
  serial_executor serial;
  thread_pool pool(2);
  const auto decoded = run(serial, false);
  REQUIRE(run(serial, true) == decoded);
  REQUIRE(run(pool, true) == decoded);
  // The same tokens as a plain segment go through prefill attention: close, not the same bits.
  kv::paged_cache<float, 16> cache(s.model.kv_shape(), {.n_blocks = 16});
  const kv::seq_id a = *cache.add_sequence();
  batch_builder plain;
  plain.add(a, tokens, 0, last_logits::skip);
  for (std::size_t i = 0; i < n; ++i) plain.request_logits(static_cast<std::int32_t>(head + i));
  const auto l = s.model.forward(plain.view(), cache, serial);
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t v = 0; v < 512; ++v) REQUIRE(std::abs(l(i, v) - decoded[i][v]) <= path_tolerance);
}

TEST_CASE("llama: paged and reduced-precision caches serve the same forward") {
  auto& s = loaded();
  const auto prompt = s.tok.encode("Lily went to the park with her mom and dad. They saw a big tree.", {.add_bos = true});
  REQUIRE(prompt.size() > 20);
  auto run = [&](auto& cache, llama_model& model) {
    const kv::seq_id seq = *cache.add_sequence();
    std::vector<std::vector<float>> rows;
    batch_builder b;
    b.add(seq, std::span(prompt).first(prompt.size() - 3), 0);
    auto l = model.forward(b.view(), cache);
    rows.emplace_back(l.row(0).begin(), l.row(0).end());
    for (std::size_t i = prompt.size() - 3; i < prompt.size(); ++i) {  // decode across block edges
      b.clear();
      b.add(seq, {&prompt[i], 1}, static_cast<std::int32_t>(i));
      l = model.forward(b.view(), cache);
      rows.emplace_back(l.row(0).begin(), l.row(0).end());
    }
    return rows;
  };
  kv::contiguous_cache<float> dense(s.model.kv_shape(), {.max_sequences = 1, .max_tokens = 64});
  kv::paged_cache<float, 4> paged(s.model.kv_shape(), {.n_blocks = 32});
  kv::paged_cache<f16, 16> half(s.model.kv_shape(), {.n_blocks = 8});
  kv::contiguous_cache<std::int8_t> q8(s.model.kv_shape(), {.max_sequences = 1, .max_tokens = 64});
  kv::contiguous_cache<std::int8_t> q8q(s.model.kv_shape(), {.max_sequences = 1, .max_tokens = 64});
  kv::contiguous_cache<std::int8_t> q8qp(s.model.kv_shape(), {.max_sequences = 1, .max_tokens = 64});
  kv::contiguous_cache<bf16> brain(s.model.kv_shape(), {.max_sequences = 1, .max_tokens = 64});
  kv::contiguous_cache<bf16> brain_q(s.model.kv_shape(), {.max_sequences = 1, .max_tokens = 64});
  kv::contiguous_cache<bf16> brain_qp(s.model.kv_shape(), {.max_sequences = 1, .max_tokens = 64});
  llama_model int8_queries(s.file, {.int8_attention_queries = true});
  llama_model int8_products(s.file, {.int8_attention_queries = true, .int8_attention_probabilities = true});
  llama_model bf16_queries(s.file, {.bf16_attention_queries = true});
  llama_model bf16_products(s.file, {.bf16_attention_queries = true, .bf16_attention_probabilities = true});
  const auto ref = run(dense, s.model), p = run(paged, s.model), h = run(half, s.model), q = run(q8, s.model);
  const auto qq = run(q8q, int8_queries), qqp = run(q8qp, int8_products);
  const auto b = run(brain, s.model), bq = run(brain_q, bf16_queries), bqp = run(brain_qp, bf16_products);
  for (std::size_t r = 0; r < ref.size(); ++r)
    for (std::size_t v = 0; v < 512; ++v) {
      REQUIRE(std::abs(p[r][v] - ref[r][v]) <= path_tolerance);
      REQUIRE(std::abs(h[r][v] - ref[r][v]) <= 0.05f);
      REQUIRE(std::abs(q[r][v] - ref[r][v]) <= 0.5f);
      REQUIRE(std::abs(qq[r][v] - ref[r][v]) <= 0.5f);
      REQUIRE(std::abs(qqp[r][v] - ref[r][v]) <= 0.5f);
      REQUIRE(std::abs(b[r][v] - ref[r][v]) <= 0.25f);
      REQUIRE(std::abs(bq[r][v] - ref[r][v]) <= 0.25f);
      REQUIRE(std::abs(bqp[r][v] - ref[r][v]) <= 0.25f);
    }
  // The options reach decode: the first row is prefill (the same), the
  // decoded ones move.
  REQUIRE(qq[0] == q[0]);
  REQUIRE(qq.back() != q.back());
  REQUIRE(qqp[0] == q[0]);
  REQUIRE(qqp.back() != qq.back());
  REQUIRE(bq[0] == b[0]);
  REQUIRE(bq.back() != b.back());
  REQUIRE(bqp[0] == b[0]);
  REQUIRE(bqp.back() != bq.back());
  // Reduced precision changes the numbers, not the argmax here.
  REQUIRE(argmax(h.back()) == argmax(ref.back()));
}

TEST_CASE("llama: the thread pool gives the serial result") {
  auto& s = loaded();
  const auto prompt = s.tok.encode("Once upon a time, there was a little dog named Max who liked to run.", {.add_bos = true});
  std::vector<float> ref;
  {
    kv::contiguous_cache<float> cache(s.model.kv_shape(), {.max_sequences = 1, .max_tokens = 64});
    batch_builder b;
    b.add(*cache.add_sequence(), prompt, 0);
    const auto l = s.model.forward(b.view(), cache);
    ref.assign(l.row(0).begin(), l.row(0).end());
  }
  thread_pool pool(2);
  kv::contiguous_cache<float> cache(s.model.kv_shape(), {.max_sequences = 1, .max_tokens = 64});
  batch_builder b;
  b.add(*cache.add_sequence(), prompt, 0);
  const auto l = s.model.forward(b.view(), cache, pool);
  for (std::size_t v = 0; v < 512; ++v) REQUIRE(std::abs(l(0, v) - ref[v]) <= path_tolerance);
}

TEST_CASE("llama: bad batches raise llmkit::error naming the argument") {
  auto& s = loaded();
  kv::contiguous_cache<float> cache(s.model.kv_shape(), {.max_sequences = 2, .max_tokens = 8});
  const kv::seq_id a = *cache.add_sequence(), c = *cache.add_sequence();
  const std::vector<std::int32_t> tokens{1, 512, 5};
  batch_builder b;
  b.add(a, tokens, 0);
  REQUIRE_THROWS_WITH(s.model.forward(b.view(), cache),
                      "llama_model::forward: token_ids[1] = 512 is outside the vocabulary of 512 tokens");
  const std::vector<std::int32_t> neg{-3};
  b.clear();
  b.add(a, neg, 0);
  REQUIRE_THROWS_WITH(s.model.forward(b.view(), cache), Catch::Contains("token_ids[0] = -3 is outside"));
  const std::vector<std::int32_t> ok{1, 2, 3};
  b.clear();
  b.add(a, ok, 1);
  REQUIRE_THROWS_WITH(s.model.forward(b.view(), cache),
                      "llama_model::forward: positions[0] = 1 but sequence " + std::to_string(a) +
                          " continues at position 0");
  b.clear();
  b.add(a, {ok.data(), 1}, 0);
  b.add(c, {ok.data(), 1}, 0);
  b.add(a, {ok.data(), 1}, 1);
  REQUIRE_THROWS_WITH(s.model.forward(b.view(), cache), Catch::Contains("appears in more than one run"));
  b.clear();
  b.add(a, ok, 0);
  b.request_logits(2);
  batch bad = b.view();
  const std::vector<std::int32_t> rows{3};
  bad.logit_rows = rows;
  REQUIRE_THROWS_WITH(s.model.forward(bad, cache), "llama_model::forward: logit_rows[0] = 3 is outside the 3 tokens");
  bad = b.view();
  bad.positions = bad.positions.first(2);
  REQUIRE_THROWS_WITH(s.model.forward(bad, cache), Catch::Contains("positions.size() = 2 differs"));
  REQUIRE(cache.n_tokens(a) == 0);
  // The cache is full: nothing stays grown.
  const std::vector<std::int32_t> many(6, 5);
  b.clear();
  b.add(c, many, 0);
  b.add(a, many, 0);
  REQUIRE_NOTHROW(s.model.forward(b.view(), cache));
  b.clear();
  b.add(c, many, 6);
  b.add(a, {many.data(), 1}, 6);
  REQUIRE_THROWS_WITH(s.model.forward(b.view(), cache),
                      "llama_model::forward: the cache has no room for 6 more tokens of sequence " + std::to_string(c));
  b.clear();
  b.add(a, {many.data(), 1}, 6);
  b.add(c, many, 6);
  REQUIRE_THROWS_AS(s.model.forward(b.view(), cache), llmkit::error);
  REQUIRE(cache.n_tokens(a) == 6);
  REQUIRE(cache.n_tokens(c) == 6);
  kv::contiguous_cache<float> wrong({5, 2, 8}, {.max_sequences = 1, .max_tokens = 8});
  b.clear();
  b.add(*wrong.add_sequence(), ok, 0);
  REQUIRE_THROWS_WITH(s.model.forward(b.view(), wrong), Catch::Contains("the cache's shape {5, 2, 8} differs"));
  // An empty batch is a no-op.
  REQUIRE(s.model.forward(batch{}, cache).rows() == 0);
}
