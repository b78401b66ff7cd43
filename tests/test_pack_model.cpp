// SPDX-License-Identifier: MIT
// pack/ on the vendored stories260K model: prepacked prefill (every packer,
// whole prompts and chunked) and the padded baselines give each prompt the
// logits and KV of prefilling it alone, with K/V written straight into each
// prompt's own cache sequence, and identical greedy continuations.
#include <llmkit/kv/contiguous_cache.hpp>
#include <llmkit/kv/paged_cache.hpp>
#include <llmkit/model/batch.hpp>
#include <llmkit/model/llama.hpp>
#include <llmkit/pack/packed_batch.hpp>
#include <llmkit/pack/packers.hpp>
#include <llmkit/pack/padded_batch.hpp>
#include <llmkit/pack/prefill.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

using namespace llmkit;
using namespace llmkit::pack;

// Logits and K/V reached through different kernel paths (prefill vs decode
// attention, packed vs alone tiles) sum in different orders: they agree to
// ~1e-5 (the products themselves are batch invariant, bit for bit).
constexpr float path_tolerance = 2e-5f;

namespace {

model::llama_model& stories() {
  static model::llama_model m = model::llama_model::load(LLMKIT_DEFAULT_MODEL);
  return m;
}

constexpr std::size_t max_tokens = 256;
constexpr std::size_t n_decode = 6;

std::vector<std::vector<std::int32_t>> random_prompts(std::uint64_t seed, std::size_t n, std::size_t max_len) {
  std::mt19937_64 rng(seed);
  std::vector<std::vector<std::int32_t>> prompts(n);
  for (auto& p : prompts) {
    p.resize(1 + rng() % max_len);
    p[0] = 1;  // BOS
    for (std::size_t t = 1; t < p.size(); ++t) p[t] = static_cast<std::int32_t>(3 + rng() % 509);
  }
  return prompts;
}

std::int32_t argmax(std::span<const float> row) {
  return static_cast<std::int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
}

// One prompt's state after prefill: last-token logits, the K/V rows of every
// (layer, kv head) and the greedy continuation.
struct prompt_state {
  std::vector<float> logits;
  std::vector<float> kv;  // layer, head, token, [k | v] rows
  std::vector<std::int32_t> greedy;
};

template <class Cache>
std::vector<float> read_kv(const Cache& cache, kv::seq_id seq) {
  std::vector<float> out;
  const auto shape = cache.shape();
  for (std::size_t l = 0; l < shape.n_layers; ++l)
    for (std::size_t h = 0; h < shape.n_kv_heads; ++h)
      for (std::size_t c = 0; c < cache.n_chunks(seq); ++c) {
        const auto chunk = cache.chunk(seq, l, h, c);
        for (std::size_t t = 0; t < chunk.n_tokens; ++t) {
          out.insert(out.end(), chunk.k + t * chunk.row_stride, chunk.k + t * chunk.row_stride + shape.head_dim);
          out.insert(out.end(), chunk.v + t * chunk.row_stride, chunk.v + t * chunk.row_stride + shape.head_dim);
        }
      }
  return out;
}

// Greedy decoding of every sequence together, one token per sequence per step.
template <class Cache>
std::vector<std::vector<std::int32_t>> greedy_all(Cache& cache, std::span<const kv::seq_id> seqs,
                                                  std::vector<std::int32_t> next) {
  std::vector<std::vector<std::int32_t>> out(seqs.size());
  for (std::size_t step = 0; step < n_decode; ++step) {
    model::batch_builder b;
    for (std::size_t q = 0; q < seqs.size(); ++q) {
      out[q].push_back(next[q]);
      b.add(seqs[q], {&next[q], 1}, static_cast<std::int32_t>(cache.n_tokens(seqs[q])));
    }
    const auto logits = stories().forward(b.view(), cache);
    for (std::size_t q = 0; q < seqs.size(); ++q) next[q] = argmax(logits.row(q));
  }
  return out;
}

std::vector<prompt_state> prefill_alone(const std::vector<std::vector<std::int32_t>>& prompts) {
  std::vector<prompt_state> states(prompts.size());
  for (std::size_t q = 0; q < prompts.size(); ++q) {
    kv::contiguous_cache<float> cache(stories().kv_shape(), {.max_sequences = 1, .max_tokens = max_tokens});
    const kv::seq_id seq = *cache.add_sequence();
    model::batch_builder b;
    b.add(seq, prompts[q], 0);
    const auto logits = stories().forward(b.view(), cache);
    states[q].logits.assign(logits.row(0).begin(), logits.row(0).end());
    states[q].kv = read_kv(cache, seq);
    const std::vector<kv::seq_id> seqs{seq};
    states[q].greedy = greedy_all(cache, seqs, {argmax(logits.row(0))})[0];
  }
  return states;
}

float max_abs_diff(std::span<const float> a, std::span<const float> b) {
  REQUIRE(a.size() == b.size());
  float m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

// Runs `rows` (packed rows or padded batches) through the model into fresh
// sequences of `cache`, then checks logits, KV and greedy continuations.
template <class Row, class Cache>
void check_against_alone(const std::vector<Row>& rows, Cache& cache, std::span<const kv::seq_id> seqs,
                         const std::vector<std::vector<std::int32_t>>& prompts,
                         const std::vector<prompt_state>& alone) {
  const std::size_t vocab = stories().vocab_size();
  std::vector<float> logits(prompts.size() * vocab, NAN);
  auto forward = [&](const Row& row) {
    return stories().forward(model::batch{row.token_ids, row.positions, row.seq_ids, row.logit_rows}, cache);
  };
  run_prefill(std::span<const Row>(rows), forward, matrix_view<float>(logits.data(), prompts.size(), vocab));
  // Padded rows leave their pads' K/V after each prompt: drop them.
  for (std::size_t q = 0; q < prompts.size(); ++q) {
    REQUIRE(cache.n_tokens(seqs[q]) >= prompts[q].size());
    cache.truncate(seqs[q], prompts[q].size());
  }
  std::vector<std::int32_t> next(prompts.size());
  for (std::size_t q = 0; q < prompts.size(); ++q) {
    const std::span<const float> row(logits.data() + q * vocab, vocab);
    INFO("request " << q << " length " << prompts[q].size());
    REQUIRE(max_abs_diff(row, alone[q].logits) <= path_tolerance);
    REQUIRE(max_abs_diff(read_kv(cache, seqs[q]), alone[q].kv) <= path_tolerance);
    next[q] = argmax(row);
  }
  const auto greedy = greedy_all(cache, seqs, next);
  for (std::size_t q = 0; q < prompts.size(); ++q) REQUIRE(greedy[q] == alone[q].greedy);
}

}  // namespace

TEST_CASE("prepacked prefill on stories260K equals prefilling each prompt alone, for every packer") {
  for (std::uint64_t seed : {1u, 2u}) {
    const auto prompts = random_prompts(seed, 9, 70);
    const auto alone = prefill_alone(prompts);
    const auto lengths = prompt_lengths(prompts);
    for (packer p : all_packers) {
      // The paper's capacity (the longest prompt), a larger token budget, and
      // a small budget that chunks long prompts across rows.
      for (std::size_t capacity : {std::size_t{0}, std::size_t{150}, std::size_t{23}}) {
        INFO("seed " << seed << " packer " << packer_name(p) << " capacity " << capacity);
        kv::contiguous_cache<float> cache(stories().kv_shape(),
                                          {.max_sequences = prompts.size(), .max_tokens = max_tokens});
        std::vector<kv::seq_id> seqs;
        for (std::size_t q = 0; q < prompts.size(); ++q) seqs.push_back(*cache.add_sequence());
        std::reverse(seqs.begin(), seqs.end());  // cache ids differ from request indices
        const packing layout = pack_items(lengths, p, {.capacity = capacity, .split_oversized = true});
        const packed_batch batch = build_packed_batch(prompts, layout, seqs);
        if (capacity == 150) REQUIRE(batch.n_rows() < prompts.size());  // prompts really share rows
        check_against_alone(batch.rows, cache, seqs, prompts, alone);
      }
    }
  }
}

TEST_CASE("prepacked prefill into a paged cache equals prefilling alone") {
  const auto prompts = random_prompts(7, 8, 60);
  const auto alone = prefill_alone(prompts);
  kv::paged_cache<float, 16> cache(stories().kv_shape(), {.n_blocks = 64, .max_sequences = 8});
  std::vector<kv::seq_id> seqs;
  for (std::size_t q = 0; q < prompts.size(); ++q) seqs.push_back(*cache.add_sequence());
  const packed_batch batch =
      build_packed_batch(prompts, best_fit_decreasing(prompt_lengths(prompts), {.capacity = 128}), seqs);
  check_against_alone(batch.rows, cache, seqs, prompts, alone);
}

TEST_CASE("padded and length-sorted baselines on stories260K equal prefilling alone") {
  const auto prompts = random_prompts(3, 7, 50);
  const auto alone = prefill_alone(prompts);
  for (auto order : {batch_order::request, batch_order::by_length}) {
    kv::contiguous_cache<float> cache(stories().kv_shape(), {.max_sequences = prompts.size(), .max_tokens = max_tokens});
    std::vector<kv::seq_id> seqs;
    for (std::size_t q = 0; q < prompts.size(); ++q) seqs.push_back(*cache.add_sequence());
    const auto batches = make_padded_batches(prompts, 3, order, 0, seqs);
    REQUIRE(padding_ratio(batches) > 1.0);
    check_against_alone(batches, cache, seqs, prompts, alone);
  }
}
