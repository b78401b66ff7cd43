// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/pack/padded_batch.hpp
/// The baselines prepacking is measured against: padded batching (groups of
/// `batch_size` prompts in request order, each row padded on the right to the
/// longest prompt of its group) and length-sorted batching (the same, but
/// groups formed from the prompts sorted by length). Every pad slot is a
/// token a standard padded forward pass computes through every layer; the
/// attention mask (causal plus key padding) only hides it.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <ranges>
#include <span>
#include <vector>

#include "llmkit/core/error.hpp"
#include "llmkit/pack/packed_batch.hpp"

namespace llmkit::pack {

/// One padded batch: `n_rows` prompts, each row `row_length` tokens long.
struct padded_batch {
  std::size_t n_rows = 0;
  std::size_t row_length = 0;           ///< the longest prompt of the batch
  std::vector<token_id> token_ids;      ///< [n_rows, row_length], pads = pad_id
  std::vector<std::int32_t> positions;  ///< [n_rows, row_length] 0 .. row_length - 1 in every row
  std::vector<std::int32_t> lengths;    ///< [n_rows] real tokens at the start of each row
  std::vector<std::int32_t> requests;   ///< [n_rows] request index of each row
  std::vector<std::int32_t> seq_ids;    ///< [n_rows, row_length] cache sequence of each slot (its row's request, or the caller's map)
  std::vector<std::int32_t> logit_rows;      ///< [n_rows] slot of each row's last real token: r * row_length + lengths[r] - 1
  std::vector<std::int32_t> logit_requests;  ///< [n_rows] == requests

  /// Slots computed, pads included.
  std::size_t n_slots() const noexcept { return n_rows * row_length; }
  /// Real prompt tokens.
  std::size_t n_tokens() const noexcept {
    return static_cast<std::size_t>(std::accumulate(lengths.begin(), lengths.end(), std::int64_t{0}));
  }
  /// The key-padding causal mask of row r: may query column q see key column k?
  bool visible(std::size_t r, std::size_t q, std::size_t k) const noexcept {
    return k <= q && k < static_cast<std::size_t>(lengths[r]);
  }
};

/// How the baseline forms its groups.
enum class batch_order {
  request,    ///< groups of consecutive requests (plain padded batching)
  by_length,  ///< groups of prompts sorted by decreasing length (length-sorted batching)
};

/// Forms padded batches of up to `batch_size` prompts.
/// @param prompts `[n_requests]` prompts of >= 1 token.
/// @param batch_size prompts per batch, >= 1.
/// @param order request order or length-sorted (ties by request index).
/// @param pad_id token id written into pad slots.
/// @param seq_ids `[n_requests]` cache sequence of each request (empty = the
///   request indices). A row is one sequence: its pads follow the prompt at
///   positions length .. row_length - 1, so a causal model computes them like
///   a padded engine does while the prompt's own outputs stay exact (right
///   padding: no real token sees a pad); the pads' K/V land in the cache
///   after the prompt's, where the caller truncates them (or masks them).
/// @throws llmkit::error for batch_size 0, an empty prompt, or a seq_ids size mismatch.
template <prompt_range P>
std::vector<padded_batch> make_padded_batches(const P& prompts, std::size_t batch_size, batch_order order,
                                              token_id pad_id = 0, std::span<const std::int32_t> seq_ids = {}) {
  LLMKIT_CHECK(batch_size > 0, "make_padded_batches: batch_size must be >= 1, got ", batch_size);
  LLMKIT_CHECK(seq_ids.empty() || seq_ids.size() == std::ranges::size(prompts), "make_padded_batches: seq_ids.size() = ",
               seq_ids.size(), " differs from the ", std::ranges::size(prompts), " prompts");
  const std::vector<std::size_t> lengths = prompt_lengths(prompts);
  for (std::size_t q = 0; q < lengths.size(); ++q)
    LLMKIT_CHECK(lengths[q] > 0, "make_padded_batches: prompt ", q, " is empty (a prompt needs at least one token)");
  std::vector<std::size_t> sequence(lengths.size());
  std::iota(sequence.begin(), sequence.end(), std::size_t{0});
  if (order == batch_order::by_length)
    std::stable_sort(sequence.begin(), sequence.end(),
                     [&](std::size_t a, std::size_t b) { return lengths[a] > lengths[b]; });
  std::vector<padded_batch> batches;
  for (std::size_t first = 0; first < sequence.size(); first += batch_size) {
    const std::size_t count = std::min(batch_size, sequence.size() - first);
    padded_batch batch;
    batch.n_rows = count;
    for (std::size_t r = 0; r < count; ++r) batch.row_length = std::max(batch.row_length, lengths[sequence[first + r]]);
    batch.token_ids.assign(batch.n_slots(), pad_id);
    batch.positions.resize(batch.n_slots());
    batch.seq_ids.resize(batch.n_slots());
    for (std::size_t r = 0; r < count; ++r) {
      const std::size_t q = sequence[first + r];
      const std::span<const token_id> prompt = prompts[q];
      std::copy(prompt.begin(), prompt.end(), batch.token_ids.begin() + static_cast<std::ptrdiff_t>(r * batch.row_length));
      const std::int32_t seq = seq_ids.empty() ? static_cast<std::int32_t>(q) : seq_ids[q];
      for (std::size_t t = 0; t < batch.row_length; ++t) {
        batch.positions[r * batch.row_length + t] = static_cast<std::int32_t>(t);
        batch.seq_ids[r * batch.row_length + t] = seq;
      }
      batch.lengths.push_back(static_cast<std::int32_t>(prompt.size()));
      batch.requests.push_back(static_cast<std::int32_t>(q));
      batch.logit_rows.push_back(static_cast<std::int32_t>(r * batch.row_length + prompt.size() - 1));
      batch.logit_requests.push_back(static_cast<std::int32_t>(q));
    }
    batches.push_back(std::move(batch));
  }
  return batches;
}

/// Slots computed over real tokens for a set of padded batches (>= 1; 1 = no
/// padding). This is the "padding ratio" set beside prepacking's speedup.
inline double padding_ratio(std::span<const padded_batch> batches) noexcept {
  std::size_t slots = 0, tokens = 0;
  for (const auto& b : batches) {
    slots += b.n_slots();
    tokens += b.n_tokens();
  }
  return tokens == 0 ? 1.0 : static_cast<double>(slots) / static_cast<double>(tokens);
}

}  // namespace llmkit::pack
