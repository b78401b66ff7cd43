// SPDX-License-Identifier: MIT
// pack/: packed-batch builder and the padded / length-sorted baselines.
#include <llmkit/pack/packed_batch.hpp>
#include <llmkit/pack/packers.hpp>
#include <llmkit/pack/padded_batch.hpp>
#include <llmkit/pack/prefill.hpp>

#include <catch2/catch.hpp>

#include <cstdint>
#include <random>
#include <span>
#include <vector>

using namespace llmkit;
using namespace llmkit::pack;

namespace {

std::vector<std::vector<std::int32_t>> random_prompts(std::mt19937_64& rng, std::size_t n, std::size_t max_len) {
  std::vector<std::vector<std::int32_t>> prompts(n);
  for (auto& p : prompts) {
    p.resize(1 + rng() % max_len);
    for (auto& t : p) t = static_cast<std::int32_t>(rng() % 512);
  }
  return prompts;
}

// Checks every invariant of a packed batch against the prompts, by brute force.
void check_batch(const packed_batch& batch, const std::vector<std::vector<std::int32_t>>& prompts,
                 std::size_t capacity) {
  REQUIRE(batch.requests.size() == prompts.size());
  std::vector<std::vector<std::int32_t>> rebuilt(prompts.size());
  std::size_t n_tokens = 0;
  for (std::size_t r = 0; r < batch.n_rows(); ++r) {
    const packed_row& row = batch.rows[r];
    const std::size_t n = row.n_tokens();
    REQUIRE(n <= capacity);
    REQUIRE(row.positions.size() == n);
    REQUIRE(row.seq_ids.size() == n);
    REQUIRE(row.cu_seqlens.size() == row.n_segments() + 1);
    REQUIRE(row.last_token.size() == row.n_segments());
    REQUIRE(row.segment_is_final.size() == row.n_segments());
    REQUIRE(row.cu_seqlens.front() == 0);
    REQUIRE(static_cast<std::size_t>(row.cu_seqlens.back()) == n);
    std::vector<std::int32_t> segment_of(n, -1);
    std::size_t n_final = 0;
    for (std::size_t s = 0; s < row.n_segments(); ++s) {
      const auto first = row.cu_seqlens[s], last = row.cu_seqlens[s + 1];
      REQUIRE(first < last);
      const auto q = row.segment_request[s];
      REQUIRE(row.last_token[s] == last - 1);
      // Positions continue where the request's previous chunk ended (0 for a whole prompt).
      REQUIRE(row.positions[first] == static_cast<std::int32_t>(rebuilt[q].size()));
      for (auto t = first; t < last; ++t) {
        REQUIRE(row.seq_ids[t] == q);
        REQUIRE(row.positions[t] == row.positions[first] + (t - first));
        rebuilt[q].push_back(row.token_ids[t]);
        segment_of[t] = static_cast<std::int32_t>(s);
      }
      const bool is_final = rebuilt[q].size() == prompts[q].size();
      REQUIRE(row.segment_is_final[s] == (is_final ? 1 : 0));
      if (is_final) {
        REQUIRE(batch.requests[q].row == static_cast<std::int32_t>(r));
        REQUIRE(batch.requests[q].segment == static_cast<std::int32_t>(s));
        REQUIRE(batch.requests[q].index == last - 1);
        const auto logit = static_cast<std::size_t>(batch.requests[q].logit);
        REQUIRE(logit < row.logit_rows.size());
        REQUIRE(row.logit_rows[logit] == last - 1);
        REQUIRE(row.logit_requests[logit] == q);
        ++n_final;
      }
    }
    REQUIRE(row.logit_rows.size() == n_final);
    REQUIRE(row.logit_requests.size() == n_final);
    // The mask: block-diagonal causal, element by element.
    for (std::size_t qi = 0; qi < n; ++qi)
      for (std::size_t ki = 0; ki < n; ++ki)
        REQUIRE(row.visible(qi, ki) == (ki <= qi && segment_of[ki] == segment_of[qi]));
    n_tokens += n;
  }
  REQUIRE(rebuilt == prompts);
  REQUIRE(batch.n_tokens == n_tokens);
}

}  // namespace

TEST_CASE("build_packed_batch lays out every packer's bins with restarting positions and the request map") {
  std::mt19937_64 rng(2404);
  for (packer p : all_packers) {
    for (std::size_t n : {1u, 2u, 5u, 33u}) {
      const auto prompts = random_prompts(rng, n, 40);
      const auto lengths = prompt_lengths(prompts);
      INFO(packer_name(p) << " n " << n);
      // The paper's capacity: the longest prompt.
      const packing by_longest = pack_items(lengths, p);
      const packed_batch batch = build_packed_batch(prompts, by_longest);
      REQUIRE(batch.row_capacity == *std::max_element(lengths.begin(), lengths.end()));
      check_batch(batch, prompts, batch.row_capacity);
      REQUIRE(batch.slot_ratio() >= 1.0);
      // A token budget below some prompts: chunks, positions continue across rows.
      for (std::size_t budget : {1u, 7u, 16u}) {
        const packing chunked = pack_items(lengths, p, {.capacity = budget, .split_oversized = true});
        check_batch(build_packed_batch(prompts, chunked), prompts, budget);
      }
    }
  }
}

TEST_CASE("build_packed_batch on a hand example") {
  const std::vector<std::vector<std::int32_t>> prompts{{10, 11, 12}, {20}, {30, 31, 32, 33, 34}, {40, 41}};
  const packed_batch batch = build_packed_batch(prompts, first_fit_decreasing(prompt_lengths(prompts)));
  // capacity 5, FFD: [p2] [p0, p3] [p1]
  REQUIRE(batch.n_rows() == 3);
  REQUIRE(batch.rows[1].token_ids == std::vector<std::int32_t>{10, 11, 12, 40, 41});
  REQUIRE(batch.rows[1].positions == std::vector<std::int32_t>{0, 1, 2, 0, 1});
  REQUIRE(batch.rows[1].seq_ids == std::vector<std::int32_t>{0, 0, 0, 3, 3});
  REQUIRE(batch.rows[1].cu_seqlens == std::vector<std::int32_t>{0, 3, 5});
  REQUIRE(batch.rows[1].last_token == std::vector<std::int32_t>{2, 4});
  REQUIRE(batch.rows[1].segment_request == std::vector<std::int32_t>{0, 3});
  REQUIRE(batch.rows[2].token_ids == std::vector<std::int32_t>{20});
  REQUIRE(batch.requests[0].row == 1);
  REQUIRE(batch.requests[0].index == 2);
  REQUIRE(batch.requests[1].row == 2);
  REQUIRE(batch.requests[2].row == 0);
  REQUIRE(batch.requests[3].row == 1);
  REQUIRE(batch.requests[3].segment == 1);
  REQUIRE(batch.requests[3].index == 4);
  REQUIRE(batch.requests[3].logit == 1);
  REQUIRE(batch.rows[1].logit_rows == std::vector<std::int32_t>{2, 4});
  REQUIRE(batch.rows[1].logit_requests == std::vector<std::int32_t>{0, 3});
  // Cache sequences other than the request indices.
  const std::vector<std::int32_t> seqs{7, 5, 9, 2};
  const packed_batch mapped = build_packed_batch(prompts, first_fit_decreasing(prompt_lengths(prompts)), seqs);
  REQUIRE(mapped.rows[1].seq_ids == std::vector<std::int32_t>{7, 7, 7, 2, 2});
  REQUIRE(mapped.rows[1].segment_request == std::vector<std::int32_t>{0, 3});
  REQUIRE_THROWS_WITH(build_packed_batch(prompts, first_fit_decreasing(prompt_lengths(prompts)),
                                         std::vector<std::int32_t>{1, 2}),
                      "build_packed_batch: seq_ids.size() = 2 differs from the 4 prompts");
  REQUIRE(batch.n_tokens == 11);
  REQUIRE(batch.slot_ratio() == Approx(15.0 / 11.0));
  REQUIRE(batch.rows[1].visible(4, 3));
  REQUIRE_FALSE(batch.rows[1].visible(3, 2));
  REQUIRE_FALSE(batch.rows[1].visible(3, 4));
}

TEST_CASE("build_packed_batch rejects input that does not match") {
  const std::vector<std::vector<std::int32_t>> prompts{{1, 2, 3}, {4}, {}};
  REQUIRE_THROWS_WITH(build_packed_batch(prompts, first_fit_decreasing(std::vector<int>{3, 1, 1})),
                      "build_packed_batch: prompt 2 is empty (a prompt needs at least one token)");
  const std::vector<std::vector<std::int32_t>> good{{1, 2, 3}, {4}};
  REQUIRE_THROWS_WITH(build_packed_batch(good, first_fit_decreasing(std::vector<int>{3, 1, 1})),
                      "build_packed_batch: the packing is of 3 items but 2 prompts were given");
  REQUIRE_THROWS_WITH(build_packed_batch(good, first_fit_decreasing(std::vector<int>{2, 1})),
                      "build_packed_batch: the packing places 2 of the 3 tokens of prompt 0");
  REQUIRE_THROWS_WITH(build_packed_batch(good, first_fit_decreasing(std::vector<int>{4, 1})),
                      "build_packed_batch: bin 0 holds tokens [0, 4) of prompt 0 (3 tokens, 0 placed before): "
                      "the packing does not match the prompts");
  // A hand-made packing that places prompt 1 twice.
  const packing twice(8, 2, {{0, 0, 3}, {1, 0, 1}, {1, 0, 1}}, {0, 3});
  REQUIRE_THROWS_WITH(build_packed_batch(good, twice),
                      "build_packed_batch: bin 0 holds tokens [0, 1) of prompt 1 (1 tokens, 1 placed before): the "
                      "packing does not match the prompts");
  const packing out_of_range(8, 2, {{0, 0, 3}, {5, 0, 1}}, {0, 2});
  REQUIRE_THROWS_WITH(build_packed_batch(good, out_of_range),
                      "build_packed_batch: bin 0 holds item 5 but there are 2 prompts");
  REQUIRE_THROWS_WITH(packing(2, 1, {{0, 0, 3}}, {0, 1}), "packing: bin 0 holds 3 > capacity 2");
  REQUIRE_THROWS_WITH(packing(8, 1, {{0, 0, 3}}, {0, 2}),
                      "packing: bin_offsets must run from 0 to the number of pieces 1");
  // No prompts: an empty batch.
  const std::vector<std::vector<std::int32_t>> none;
  const packed_batch empty = build_packed_batch(none, first_fit_decreasing(std::vector<int>{}));
  REQUIRE(empty.n_rows() == 0);
  REQUIRE(empty.slot_ratio() == 1.0);
}

TEST_CASE("with constant lengths the prepacked rows are the padded batches, forward call for forward call") {
  // The no-padding control: packing at the padded batches' slot count must
  // hand the model exactly the batches padding does (same tokens, positions,
  // sequences, logit rows, in the same order), so prepacking adds no model work.
  std::mt19937_64 rng(31);
  for (const std::size_t length : {1u, 7u, 128u}) {
    for (const std::size_t batch_size : {1u, 3u, 8u}) {
      const std::size_t n = 2 * batch_size + (length % 3);  // a last, partial batch for some
      std::vector<std::vector<std::int32_t>> prompts(n, std::vector<std::int32_t>(length));
      for (auto& p : prompts)
        for (auto& t : p) t = static_cast<std::int32_t>(rng() % 512);
      const auto padded = make_padded_batches(prompts, batch_size, batch_order::request);
      for (packer pk : all_packers) {
        INFO("length " << length << " batch " << batch_size << " packer " << packer_name(pk));
        const auto batch =
            build_packed_batch(prompts, pack_items(prompt_lengths(prompts), pk, {.capacity = batch_size * length}));
        REQUIRE(batch.n_rows() == padded.size());
        for (std::size_t r = 0; r < padded.size(); ++r) {
          REQUIRE(batch.rows[r].token_ids == padded[r].token_ids);
          REQUIRE(batch.rows[r].positions == padded[r].positions);
          REQUIRE(batch.rows[r].seq_ids == padded[r].seq_ids);
          REQUIRE(batch.rows[r].logit_rows == padded[r].logit_rows);
          REQUIRE(batch.rows[r].logit_requests == padded[r].logit_requests);
        }
      }
    }
  }
}

TEST_CASE("padded and length-sorted batching") {
  const std::vector<std::vector<std::int32_t>> prompts{{1}, {2, 2, 2, 2}, {3, 3}, {4, 4, 4}, {5}};
  const auto padded = make_padded_batches(prompts, 2, batch_order::request, -1);
  REQUIRE(padded.size() == 3);
  REQUIRE(padded[0].n_rows == 2);
  REQUIRE(padded[0].row_length == 4);
  REQUIRE(padded[0].token_ids == std::vector<std::int32_t>{1, -1, -1, -1, 2, 2, 2, 2});
  REQUIRE(padded[0].positions == std::vector<std::int32_t>{0, 1, 2, 3, 0, 1, 2, 3});
  REQUIRE(padded[0].lengths == std::vector<std::int32_t>{1, 4});
  REQUIRE(padded[0].seq_ids == std::vector<std::int32_t>{0, 0, 0, 0, 1, 1, 1, 1});
  REQUIRE(padded[0].logit_rows == std::vector<std::int32_t>{0, 7});
  REQUIRE(padded[0].logit_requests == std::vector<std::int32_t>{0, 1});
  REQUIRE(padded[1].logit_rows == std::vector<std::int32_t>{1, 5});
  REQUIRE(padded[1].requests == std::vector<std::int32_t>{2, 3});
  REQUIRE(padded[1].row_length == 3);
  REQUIRE(padded[2].n_rows == 1);
  REQUIRE(padded[2].n_slots() == 1);
  // slots 8 + 6 + 1 = 15 for 11 real tokens.
  REQUIRE(padding_ratio(padded) == Approx(15.0 / 11.0));
  REQUIRE(padded[0].visible(0, 0, 0));
  REQUIRE_FALSE(padded[0].visible(0, 2, 1));  // a pad key is hidden
  REQUIRE(padded[0].visible(1, 2, 1));
  REQUIRE_FALSE(padded[0].visible(1, 1, 2));  // causal

  const auto sorted = make_padded_batches(prompts, 2, batch_order::by_length, 0);
  REQUIRE(sorted.size() == 3);
  REQUIRE(sorted[0].requests == std::vector<std::int32_t>{1, 3});
  REQUIRE(sorted[1].requests == std::vector<std::int32_t>{2, 0});  // ties by request index
  REQUIRE(sorted[2].requests == std::vector<std::int32_t>{4});
  // slots 8 + 4 + 1 = 13.
  REQUIRE(padding_ratio(sorted) == Approx(13.0 / 11.0));
  REQUIRE(sorted[1].token_ids == std::vector<std::int32_t>{3, 3, 1, 0});
  REQUIRE(sorted[1].logit_rows == std::vector<std::int32_t>{1, 2});
  const std::vector<std::int32_t> seqs{10, 11, 12, 13, 14};
  const auto mapped = make_padded_batches(prompts, 2, batch_order::by_length, 0, seqs);
  REQUIRE(mapped[1].seq_ids == std::vector<std::int32_t>{12, 12, 10, 10});
  REQUIRE_THROWS_WITH(make_padded_batches(prompts, 2, batch_order::request, 0, std::vector<std::int32_t>{1}),
                      "make_padded_batches: seq_ids.size() = 1 differs from the 5 prompts");

  // Random: every request exactly once, real tokens first in their row.
  std::mt19937_64 rng(8);
  const auto many = random_prompts(rng, 57, 30);
  for (auto order : {batch_order::request, batch_order::by_length}) {
    for (std::size_t batch_size : {1u, 4u, 57u, 100u}) {
      const auto batches = make_padded_batches(many, batch_size, order);
      std::vector<int> seen(many.size(), 0);
      for (const auto& b : batches) {
        REQUIRE(b.n_rows <= batch_size);
        for (std::size_t r = 0; r < b.n_rows; ++r) {
          const auto& prompt = many[b.requests[r]];
          ++seen[b.requests[r]];
          REQUIRE(std::equal(prompt.begin(), prompt.end(), b.token_ids.begin() + r * b.row_length));
          REQUIRE(prompt.size() <= b.row_length);
        }
      }
      REQUIRE(std::all_of(seen.begin(), seen.end(), [](int s) { return s == 1; }));
      if (batch_size == 1) REQUIRE(padding_ratio(batches) == 1.0);
    }
  }
  REQUIRE_THROWS_WITH(make_padded_batches(prompts, 0, batch_order::request),
                      "make_padded_batches: batch_size must be >= 1, got 0");
  const std::vector<std::vector<std::int32_t>> with_empty{{1}, {}};
  REQUIRE_THROWS_WITH(make_padded_batches(with_empty, 2, batch_order::request),
                      "make_padded_batches: prompt 1 is empty (a prompt needs at least one token)");
}

namespace {
// A stand-in causal "model": the logits of token i are a function of the
// tokens and positions of i's own sequence up to i (what attention with the
// right mask can see), so a prompt's logits are the same alone, packed or
// padded exactly when the row layout and the request map are right.
struct fake_model {
  std::size_t vocab = 6;
  std::vector<float> out;
  template <class Row>
  matrix_view<const float> operator()(const Row& row) {
    out.assign(row.logit_rows.size() * vocab, 0.0f);
    for (std::size_t k = 0; k < row.logit_rows.size(); ++k) {
      const auto i = static_cast<std::size_t>(row.logit_rows[k]);
      double acc = 0;
      for (std::size_t j = 0; j <= i; ++j)
        if (row.seq_ids[j] == row.seq_ids[i]) acc += row.token_ids[j] * (1.0 + row.positions[j]) + 0.5 * row.positions[j];
      for (std::size_t v = 0; v < vocab; ++v) out[k * vocab + v] = static_cast<float>(acc * (v + 1));
    }
    return matrix_view<const float>(out.data(), row.logit_rows.size(), vocab);
  }
};
float expected_logit(const std::vector<std::int32_t>& prompt, std::size_t v) {
  double acc = 0;
  for (std::size_t j = 0; j < prompt.size(); ++j) acc += prompt[j] * (1.0 + j) + 0.5 * j;
  return static_cast<float>(acc * (v + 1));
}
}  // namespace

TEST_CASE("run_prefill returns last-token logits in request order for packed and padded rows") {
  std::mt19937_64 rng(31);
  const auto prompts = random_prompts(rng, 23, 50);
  fake_model model;
  auto check = [&](const std::vector<float>& logits) {
    for (std::size_t q = 0; q < prompts.size(); ++q)
      for (std::size_t v = 0; v < model.vocab; ++v) REQUIRE(logits[q * model.vocab + v] == expected_logit(prompts[q], v));
  };
  for (packer p : all_packers) {
    // (No chunking here: the stand-in has no cache to carry a prompt across rows.)
    for (std::size_t capacity : {0u, 50u, 64u, 1000u}) {
      const packed_batch batch = build_packed_batch(prompts, pack_items(prompt_lengths(prompts), p, {.capacity = capacity}));
      std::vector<float> logits(prompts.size() * model.vocab, -1.0f);
      run_prefill(std::span<const packed_row>(batch.rows), model,
                  matrix_view<float>(logits.data(), prompts.size(), model.vocab));
      check(logits);
    }
  }
  for (auto order : {batch_order::request, batch_order::by_length}) {
    const auto batches = make_padded_batches(prompts, 4, order, 3);
    std::vector<float> logits(prompts.size() * model.vocab, -1.0f);
    run_prefill(std::span<const padded_batch>(batches), model,
                matrix_view<float>(logits.data(), prompts.size(), model.vocab));
    check(logits);
  }
  // Bad forward results and maps.
  const packed_batch batch = build_packed_batch(prompts, first_fit_decreasing(prompt_lengths(prompts)));
  std::vector<float> logits(prompts.size() * model.vocab);
  const matrix_view<float> out(logits.data(), prompts.size(), model.vocab);
  std::vector<float> wrong(100);
  REQUIRE_THROWS_WITH(run_prefill(std::span<const packed_row>(batch.rows),
                                  [&](const packed_row&) { return matrix_view<const float>(wrong.data(), 0, 6); }, out),
                      "run_prefill: forward of row 0 returned [0, 6] logits, expected [1, 6]");
  REQUIRE_THROWS_WITH(run_prefill(std::span<const packed_row>(batch.rows.data(), 1), model, out),
                      Catch::Matches("run_prefill: request [0-9]+ received no logits"));
  auto twice = batch.rows;
  twice.push_back(twice[0]);
  REQUIRE_THROWS_WITH(run_prefill(std::span<const packed_row>(twice), model, out),
                      Catch::Matches("run_prefill: request [0-9]+ has logits in two rows"));
  REQUIRE_THROWS_WITH(run_prefill(std::span<const packed_row>(batch.rows), model, out.sub_rows(0, 3)),
                      Catch::Matches("run_prefill: row [0-9]+ names request [0-9]+ outside the 3 rows of logits"));
}
