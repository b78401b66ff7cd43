// SPDX-License-Identifier: MIT
// search/ on the vendored stories260K model: speculative decoding against
// plain decoding (greedy: token for token; sampled: token statistics), beam
// search against greedy and teacher-forced scores, KV accounting.
#include <llmkit/kv/contiguous_cache.hpp>
#include <llmkit/kv/paged_cache.hpp>
#include <llmkit/model/llama.hpp>
#include <llmkit/model/tokenizer.hpp>
#include <llmkit/sampling/categorical.hpp>
#include <llmkit/sampling/chain.hpp>
#include <llmkit/sampling/greedy.hpp>
#include <llmkit/sampling/temperature.hpp>
#include <llmkit/sampling/top_k.hpp>
#include <llmkit/search/search.hpp>
#include <llmkit/search/self_draft.hpp>

#include <catch2/catch.hpp>

#include "reference/search_reference.hpp"

#include <cmath>
#include <map>
#include <string>
#include <vector>

using namespace llmkit;
using namespace llmkit::search;

namespace {
using paged = kv::paged_cache<float, 16>;

struct stories {
  model::gguf_file file = model::gguf_file::open(LLMKIT_DEFAULT_MODEL);
  model::tokenizer tok = model::tokenizer::from_gguf(file);
  model::llama_model target{file};
  std::vector<std::byte> four_layer_bytes = self_draft_gguf(file, {.n_layers = 4});
  model::llama_model four_layers{model::gguf_file(four_layer_bytes)};
  std::vector<std::byte> int8_bytes = self_draft_gguf(file, {.int8_weights = true});
  model::llama_model int8{model::gguf_file(int8_bytes)};
};
stories& loaded() {
  static stories s;
  return s;
}

paged make_cache(std::size_t n_blocks = 256, kv::kv_shape shape = loaded().target.kv_shape()) {
  return paged(shape, {.n_blocks = n_blocks, .max_sequences = 64});
}

void require_pool_full(const paged& cache) {
  REQUIRE(cache.n_sequences() == 0);
  REQUIRE(cache.pool().n_free() == cache.pool().n_total());
}

const std::vector<std::string> prompts{"Once upon a time",
                                       "Lily and Tom went to the park. Lily saw a big red ball. Tom saw a big red",
                                       "The cat sat on the mat. The cat was happy. The dog",
                                       "One day, a little boy named Tim",
                                       "She said, \"I want to play!\" Her mom said, \"You can play",
                                       "The sun was hot",
                                       "Ben had a toy car. He liked his toy car. One day his toy car",
                                       "Sue",
                                       "The bird flew to the tree. The bird sang a song. The bird",
                                       "They were best friends"};
}  // namespace

TEST_CASE("self_draft_gguf: truncated and int8 copies of stories260K load and stay close to the target") {
  auto& s = loaded();
  REQUIRE(s.four_layers.config().n_layers == 4);
  REQUIRE(s.four_layers.vocab_size() == 512);
  REQUIRE(s.int8.config().n_layers == 5);
  const model::gguf_file q(s.int8_bytes);
  REQUIRE(q.tensor("blk.0.attn_q.weight").type == model::ggml_type::q8_0);
  REQUIRE(q.tensor("blk.0.attn_norm.weight").type == model::ggml_type::f32);
  REQUIRE(q.find_tensor("blk.2.attn_q.weight") != nullptr);
  const model::gguf_file t(s.four_layer_bytes);
  REQUIRE(t.find_tensor("blk.3.attn_q.weight") != nullptr);
  REQUIRE(t.find_tensor("blk.4.attn_q.weight") == nullptr);
  REQUIRE(t.get<std::uint32_t>("llama.block_count") == 4);
  REQUIRE_THROWS_WITH(self_draft_gguf(s.file, {.n_layers = 6}),
                      "self_draft_gguf: n_layers = 6 is outside [1, 5] (llama.block_count)");
}

TEST_CASE("speculative on stories260K: greedy verification equals plain greedy for every prompt and drafter") {
  auto& s = loaded();
  auto cache = make_cache();
  auto draft_cache = make_cache();                                  // 5 layers: the int8 copy
  auto short_cache = make_cache(256, s.four_layers.kv_shape());      // 4 layers
  const sampling::processor_chain<> none;
  std::map<std::string, speculative_stats> totals;
  for (const auto& text : prompts) {
    const auto prompt = s.tok.encode(text, {.add_bos = true});
    const auto plain = generate(s.target, cache, prompt, none, sampling::greedy{}, {.stop = {.max_new_tokens = 40}});
    for (std::size_t k : {2u, 5u}) {
      ngram_drafter ngram;
      model_drafter layers(s.four_layers, short_cache, none, "layers4");
      model_drafter int8(s.int8, draft_cache, none, "int8");
      const speculative_options opt{.stop = {.max_new_tokens = 40}, .draft_length = k};
      const auto a = speculative_generate(s.target, cache, ngram, prompt, opt);
      const auto b = speculative_generate(s.target, cache, layers, prompt, opt);
      const auto c = speculative_generate(s.target, cache, int8, prompt, opt);
      const auto d = speculative_generate(s.target, cache, layers, prompt,
                                          {.stop = {.max_new_tokens = 40}, .draft_length = 8, .adaptive = true});
      INFO(text << " k " << k);
      REQUIRE(a.tokens == plain.tokens);
      REQUIRE(b.tokens == plain.tokens);
      REQUIRE(c.tokens == plain.tokens);
      REQUIRE(d.tokens == plain.tokens);
      for (auto [name, r] : {std::pair{"ngram", &a}, std::pair{"layers4", &b}, std::pair{"int8", &c}}) {
        auto& t = totals[std::string(name) + " k" + std::to_string(k)];
        t.n_drafted += r->stats.n_drafted;
        t.n_accepted += r->stats.n_accepted;
        t.n_rejected += r->stats.n_rejected;
        t.n_rounds += r->stats.n_rounds;
        t.n_generated += r->stats.n_generated;
      }
      require_pool_full(cache);
      require_pool_full(draft_cache);
      require_pool_full(short_cache);
    }
  }
  // The int8 copy agrees with the target far more often than the 4-layer one; all beat chance (1/512).
  REQUIRE(totals["int8 k2"].acceptance_rate() > 0.9);
  REQUIRE(totals["layers4 k2"].acceptance_rate() > 0.2);
  REQUIRE(totals["ngram k2"].acceptance_rate() > 0.1);
  REQUIRE(totals["int8 k5"].tokens_per_target_pass() > 3.0);
  for (const auto& [name, t] : totals)
    UNSCOPED_INFO(name << ": acceptance " << t.acceptance_rate() << ", tokens/pass " << t.tokens_per_target_pass());
}

TEST_CASE("speculative on stories260K: sampled tokens follow the same distribution as plain sampling") {
  // Requests are independent, so the token at a fixed position is an i.i.d.
  // draw from the target's marginal there in both methods: a two-sample
  // chi-square homogeneity test (cells pooled until both expected counts are
  // >= 5) that fails only when p < 1e-6.
  auto& s = loaded();
  auto cache = make_cache();
  auto draft_cache = make_cache(256, s.four_layers.kv_shape());
  const sampling::processor_chain chain{sampling::top_k{20}, sampling::temperature{1.0f}};
  const auto prompt = s.tok.encode("Once upon a time, there was a", {.add_bos = true});
  model_drafter layers(s.four_layers, draft_cache, chain, "layers4");
  const std::size_t n = 700, position = 2;
  std::map<std::int32_t, std::size_t> plain_counts, spec_counts;
  speculative_stats total;
  for (std::size_t i = 0; i < n; ++i) {
    const auto a = generate(s.target, cache, prompt, chain, sampling::categorical{},
                            {.stop = {.max_new_tokens = position + 1}, .seed = 1, .request_id = i});
    const auto b = speculative_generate(s.target, cache, layers, prompt,
                                        {.stop = {.max_new_tokens = position + 1}, .verify = verification::stochastic,
                                         .draft_length = 3, .seed = 2, .request_id = i},
                                        chain);
    ++plain_counts[a.tokens[position]];
    ++spec_counts[b.tokens[position]];
    total.n_drafted += b.stats.n_drafted;
    total.n_accepted += b.stats.n_accepted;
    total.n_rejected += b.stats.n_rejected;
  }
  // Pool small cells (sorted by token) into one bin.
  std::map<std::int32_t, std::pair<double, double>> cells;
  for (auto [t, c] : plain_counts) cells[t].first = static_cast<double>(c);
  for (auto [t, c] : spec_counts) cells[t].second = static_cast<double>(c);
  std::vector<std::pair<double, double>> bins;
  std::pair<double, double> pooled{0, 0};
  for (auto [t, c] : cells) {
    if ((c.first + c.second) / 2 >= 5) bins.push_back(c);
    else {
      pooled.first += c.first;
      pooled.second += c.second;
    }
  }
  if (pooled.first + pooled.second > 0) bins.push_back(pooled);
  double x2 = 0;
  for (auto [a, b] : bins) {
    const double e = (a + b) / 2;  // equal sample sizes
    x2 += (a - e) * (a - e) / e + (b - e) * (b - e) / e;
  }
  REQUIRE(bins.size() >= 5);
  const double p = search_reference::gamma_q(static_cast<double>(bins.size() - 1) / 2, x2 / 2);
  INFO("bins " << bins.size() << " chi2 " << x2 << " p " << p << " acceptance " << total.acceptance_rate());
  REQUIRE(p > 1e-6);
  REQUIRE(total.acceptance_rate() > 0.1);
  require_pool_full(cache);
  require_pool_full(draft_cache);
}

TEST_CASE("beam search on stories260K: width 1 is greedy, scores are the model's teacher-forced log-probabilities") {
  auto& s = loaded();
  auto cache = make_cache(512);
  kv::paged_cache<float, 4> small_blocks(s.target.kv_shape(), {.n_blocks = 1024, .max_sequences = 64});
  const sampling::processor_chain<> none;
  for (const auto& text : {prompts[1], prompts[2], prompts[5]}) {
    const auto prompt = s.tok.encode(text, {.add_bos = true});
    const auto plain = generate(s.target, cache, prompt, none, sampling::greedy{}, {.stop = {.max_new_tokens = 24}});
    const auto one = beam_search(s.target, cache, prompt, {.beam_width = 1, .stop = {.max_new_tokens = 24}});
    REQUIRE(one.hypotheses[0].tokens == plain.tokens);
    const auto r = beam_search(s.target, small_blocks, prompt,
                               {.beam_width = 4, .length_penalty = 1.0f, .stop = {.max_new_tokens = 24, .eos_tokens = {s.tok.eos()}}});
    REQUIRE(r.hypotheses.size() == 4);
    for (const auto& h : r.hypotheses) {
      // Teacher-forced: one prefill of prompt + tokens, logits of every position.
      kv::contiguous_cache<float> dense(s.target.kv_shape(), {.max_sequences = 1, .max_tokens = 128});
      const kv::seq_id seq = *dense.add_sequence();
      std::vector<std::int32_t> all = prompt;
      all.insert(all.end(), h.tokens.begin(), h.tokens.end());
      model::batch_builder b;
      b.add(seq, all, 0, model::last_logits::skip);
      for (std::size_t i = prompt.size() - 1; i + 1 < all.size(); ++i) b.request_logits(static_cast<std::int32_t>(i));
      const auto logits = s.target.forward(b.view(), dense);
      double lp = 0;
      for (std::size_t i = 0; i < h.tokens.size(); ++i) {
        const auto row = logits.row(i);
        double m = -1e300, z = 0;
        for (float x : row) m = std::max(m, double(x));
        for (float x : row) z += std::exp(double(x) - m);
        lp += double(row[static_cast<std::size_t>(h.tokens[i])]) - m - std::log(z);
      }
      REQUIRE(h.logprob == Approx(lp).epsilon(1e-4));
      REQUIRE(h.score == Approx(lp / static_cast<double>(h.tokens.size())).epsilon(1e-4));
    }
    // Shared blocks: far fewer rows than 4 private copies.
    INFO("blocks " << r.memory.peak_blocks_in_use << " distinct " << r.memory.peak_distinct_tokens << " held "
                   << r.memory.peak_tokens_held);
    REQUIRE(r.memory.peak_blocks_in_use * 4 < r.memory.peak_tokens_held * 3 / 4);
    REQUIRE(r.memory.peak_blocks_in_use * 4 <= r.memory.peak_distinct_tokens + 6 * 7);
    require_pool_full(cache);
    REQUIRE(small_blocks.pool().n_free() == small_blocks.pool().n_total());
  }
}
