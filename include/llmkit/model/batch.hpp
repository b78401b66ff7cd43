// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/model/batch.hpp
/// The input of one forward pass: a packed (ragged) batch of tokens from any
/// number of sequences, each continuing its sequence in a KV cache.
///
/// Tokens of one sequence form one contiguous run of the batch (a segment),
/// in position order, and continue the sequence: the first token of the
/// segment of sequence s has position `cache.n_tokens(s)` (before the
/// forward), the next one that plus one, and so on. A prefill segment has
/// many tokens, a decode segment one; both mix freely in one batch
/// (continuous batching, prepacked prefill).

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "llmkit/core/error.hpp"
#include "llmkit/core/ids.hpp"
#include "llmkit/kv/kv_view.hpp"

namespace llmkit::model {

/// A non-owning view of a packed batch.
struct batch {
  std::span<const token_id> token_ids;   ///< [n_tokens] token ids (< vocab size)
  std::span<const std::int32_t> positions;   ///< [n_tokens] position of each token in its sequence
  std::span<const kv::seq_id> seq_ids;       ///< [n_tokens] cache sequence of each token
  std::span<const std::int32_t> logit_rows;  ///< [n_logits] token indices whose logits to return, in this order
  /// [n_stepwise] sequences whose segment is computed row by row: each token
  /// attends as the one-token decode at its position would, bit for bit
  /// (see `batch_builder::add_stepwise`). Empty: none.
  std::span<const kv::seq_id> stepwise_seqs{};

  std::size_t n_tokens() const noexcept { return token_ids.size(); }
  std::size_t n_logits() const noexcept { return logit_rows.size(); }
};

/// Whether batch_builder::add requests the logits of a segment's last token.
enum class last_logits : bool {
  skip,  ///< no logits for this segment (e.g. a prompt prefilled ahead of time)
  keep,  ///< the last token's logits (the next row of the forward's result)
};

/// An owning batch built segment by segment.
///
/// ```
/// batch_builder b;
/// b.add(seq_a, prompt_a, 0);              // prefill, logits of the last token
/// b.add(seq_b, {&next_token, 1}, n_past);  // one decode step
/// auto logits = model.forward(b.view(), cache);  // [2, vocab]
/// ```
class batch_builder {
 public:
  /// Appends `[n] tokens` of sequence `seq` at positions first_position,
  /// first_position + 1, ...; with `last_logits::keep` the last token's
  /// logits are requested (the next row of the forward's result).
  void add(kv::seq_id seq, std::span<const token_id> tokens, std::int32_t first_position,
           last_logits logits_of_last = last_logits::keep) {
    LLMKIT_CHECK(first_position >= 0, "batch_builder::add: first_position must be >= 0, got ", first_position);
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      token_ids_.push_back(tokens[i]);
      positions_.push_back(first_position + static_cast<std::int32_t>(i));
      seq_ids_.push_back(seq);
    }
    if (logits_of_last == last_logits::keep && !tokens.empty()) logit_rows_.push_back(static_cast<std::int32_t>(token_ids_.size() - 1));
  }
  /// Appends `[n] tokens` of sequence `seq` as `add` does (no logits
  /// requested), to be computed row by row: token i attends to the sequence
  /// up to its own position exactly as a one-token decode there would, so
  /// its logits have the bits of decoding the n tokens one step at a time
  /// (speculative decoding verifies guessed tokens this way, batched).
  void add_stepwise(kv::seq_id seq, std::span<const token_id> tokens, std::int32_t first_position) {
    add(seq, tokens, first_position, last_logits::skip);
    stepwise_.push_back(seq);
  }
  /// Requests the logits of token index `row` (already added).
  void request_logits(std::int32_t row) {
    LLMKIT_CHECK(row >= 0 && static_cast<std::size_t>(row) < token_ids_.size(), "batch_builder::request_logits: row ",
                 row, " is outside the ", token_ids_.size(), " tokens");
    logit_rows_.push_back(row);
  }
  void clear() noexcept {
    token_ids_.clear();
    positions_.clear();
    seq_ids_.clear();
    logit_rows_.clear();
    stepwise_.clear();
  }
  std::size_t n_tokens() const noexcept { return token_ids_.size(); }
  /// A view valid until the builder changes.
  batch view() const noexcept { return {token_ids_, positions_, seq_ids_, logit_rows_, stepwise_}; }

 private:
  std::vector<token_id> token_ids_;
  std::vector<std::int32_t> positions_;
  std::vector<kv::seq_id> seq_ids_;
  std::vector<std::int32_t> logit_rows_;
  std::vector<kv::seq_id> stepwise_;
};

}  // namespace llmkit::model
