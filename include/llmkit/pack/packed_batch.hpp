// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/pack/packed_batch.hpp
/// A prepacked prefill batch: prompts (token id sequences) laid back to back
/// in rows as a `packing` says, with what a model needs to run each row as if
/// every prompt were alone: positions restarting at 0 per prompt, a sequence
/// id per token, `cu_seqlens`, and each prompt's last-token index. Attention
/// over a row is block-diagonal causal: token i sees token j iff both belong
/// to the same segment and j <= i (see `packed_row::visible`); no dense mask
/// is ever built. A row can be handed to an attention kernel as
/// (cu_seqlens, positions), which is all a varlen / ragged kernel reads.

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <ranges>
#include <span>
#include <vector>

#include "llmkit/core/error.hpp"
#include "llmkit/core/ids.hpp"
#include "llmkit/pack/packing.hpp"

namespace llmkit::pack {

/// A range of prompts: each element is a contiguous range of int32 token ids
/// (std::vector<token_id>, std::span<const token_id>, ...).
template <class P>
concept prompt_range = std::ranges::random_access_range<P> && std::ranges::sized_range<P> &&
                       std::convertible_to<std::ranges::range_reference_t<P>, std::span<const token_id>>;

/// One row of a packed batch: `n_segments` prompts or prompt chunks back to
/// back, `n_tokens` tokens in all (at most the packing's capacity).
struct packed_row {
  std::vector<token_id> token_ids;            ///< [n_tokens]
  std::vector<std::int32_t> positions;        ///< [n_tokens] position inside the token's own prompt
  std::vector<std::int32_t> seq_ids;          ///< [n_tokens] cache sequence of the token's prompt (default: its request index)
  std::vector<std::int32_t> cu_seqlens;       ///< [n_segments + 1] segment s is tokens [cu[s], cu[s+1])
  std::vector<std::int32_t> last_token;       ///< [n_segments] row index of each segment's last token
  std::vector<std::int32_t> segment_request;  ///< [n_segments] request index of each segment
  std::vector<std::uint8_t> segment_is_final; ///< [n_segments] 1 when the segment ends its prompt
  std::vector<std::int32_t> logit_rows;       ///< [n_final] last token of each final segment: the rows whose logits start decoding
  std::vector<std::int32_t> logit_requests;   ///< [n_final] request of each of `logit_rows`

  std::size_t n_tokens() const noexcept { return token_ids.size(); }
  std::size_t n_segments() const noexcept { return segment_request.size(); }
  /// The block-diagonal causal mask, element-wise: may the query at row index
  /// q attend to the key at row index k (both < n_tokens)?
  bool visible(std::size_t q, std::size_t k) const noexcept { return k <= q && seq_ids[k] == seq_ids[q]; }
};

/// Where a request's last prompt token (the one whose logits start decoding) lies.
struct last_token_ref {
  std::int32_t row = -1;      ///< row of the batch
  std::int32_t segment = -1;  ///< segment inside the row
  std::int32_t index = -1;    ///< token index inside the row
  std::int32_t logit = -1;    ///< index into the row's `logit_rows`
};

/// Rows of packed prompts plus the map back to request order.
struct packed_batch {
  std::vector<packed_row> rows;          ///< [n_rows], in the packing's bin order
  std::vector<last_token_ref> requests;  ///< [n_requests] where each request's last token is
  std::size_t row_capacity = 0;          ///< capacity of the packing (tokens per row at most)
  std::size_t n_tokens = 0;              ///< real tokens in all rows

  std::size_t n_rows() const noexcept { return rows.size(); }
  /// n_rows * row_capacity / n_tokens: the padding a dense [n_rows, capacity]
  /// layout (the paper's) would carry; llmkit runs rows ragged, without it.
  double slot_ratio() const noexcept {
    return n_tokens == 0 ? 1.0 : static_cast<double>(rows.size() * row_capacity) / static_cast<double>(n_tokens);
  }
};

/// Lays the prompts out as `layout` packed them.
/// @param prompts `[n_requests]` prompts, each `[length >= 1]` token ids;
///   request q is prompts[q].
/// @param layout a packing of the prompt lengths (any packer; chunked or not).
/// @param seq_ids `[n_requests]` the cache sequence of each request, written
///   into `packed_row::seq_ids` so a row is ready for a model whose KV cache
///   holds one sequence per prompt (each prompt's K/V goes straight into its
///   own sequence: no unpack copy); empty = the request indices.
/// @return rows in bin order; a request split into chunks has its chunks in
///   rows of increasing index and positions continuing across them.
/// @throws llmkit::error when a prompt is empty, or `layout` is not a packing
///   of exactly these prompt lengths (every token covered exactly once).
template <prompt_range P>
packed_batch build_packed_batch(const P& prompts, const packing& layout,
                                std::span<const std::int32_t> seq_ids = {}) {
  const std::size_t n = std::ranges::size(prompts);
  LLMKIT_CHECK(seq_ids.empty() || seq_ids.size() == n, "build_packed_batch: seq_ids.size() = ", seq_ids.size(),
               " differs from the ", n, " prompts");
  LLMKIT_CHECK(layout.n_items() == n, "build_packed_batch: the packing is of ", layout.n_items(), " items but ", n,
               " prompts were given");
  std::vector<std::size_t> covered(n, 0);  // tokens placed so far, pieces must come in offset order
  packed_batch batch;
  batch.row_capacity = layout.capacity();
  batch.requests.resize(n);
  for (std::size_t q = 0; q < n; ++q) {
    const std::span<const token_id> prompt = prompts[q];
    LLMKIT_CHECK(!prompt.empty(), "build_packed_batch: prompt ", q, " is empty (a prompt needs at least one token)");
    LLMKIT_CHECK(prompt.size() < static_cast<std::size_t>(INT32_MAX), "build_packed_batch: prompt ", q,
                 " has ", prompt.size(), " tokens, more than int32 positions can hold");
  }
  batch.rows.resize(layout.n_bins());
  for (std::size_t b = 0; b < layout.n_bins(); ++b) {
    packed_row& row = batch.rows[b];
    const auto bin = layout.bin(b);
    const std::size_t n_tokens = layout.load(b);
    LLMKIT_CHECK(n_tokens < static_cast<std::size_t>(INT32_MAX), "build_packed_batch: bin ", b, " holds ", n_tokens,
                 " tokens, more than int32 indices can hold");
    row.token_ids.reserve(n_tokens);
    row.positions.reserve(n_tokens);
    row.seq_ids.reserve(n_tokens);
    row.cu_seqlens.reserve(bin.size() + 1);
    row.cu_seqlens.push_back(0);
    for (const piece& p : bin) {
      LLMKIT_CHECK(p.item < n, "build_packed_batch: bin ", b, " holds item ", p.item, " but there are ", n,
                   " prompts");
      const std::span<const token_id> prompt = prompts[p.item];
      LLMKIT_CHECK(p.offset == covered[p.item] && p.size <= prompt.size() - p.offset && p.size > 0,
                   "build_packed_batch: bin ", b, " holds tokens [", p.offset, ", ", p.offset + p.size,
                   ") of prompt ", p.item, " (", prompt.size(), " tokens, ", covered[p.item],
                   " placed before): the packing does not match the prompts");
      covered[p.item] += p.size;
      const auto request = static_cast<std::int32_t>(p.item);
      const std::int32_t seq = seq_ids.empty() ? request : seq_ids[p.item];
      const auto first = prompt.begin() + static_cast<std::ptrdiff_t>(p.offset);
      row.token_ids.insert(row.token_ids.end(), first, first + static_cast<std::ptrdiff_t>(p.size));
      const std::size_t begin = row.positions.size();
      row.positions.resize(begin + p.size);
      std::iota(row.positions.begin() + static_cast<std::ptrdiff_t>(begin), row.positions.end(),
                static_cast<std::int32_t>(p.offset));
      row.seq_ids.resize(begin + p.size, seq);
      const auto end = static_cast<std::int32_t>(row.token_ids.size());
      row.cu_seqlens.push_back(end);
      row.last_token.push_back(end - 1);
      row.segment_request.push_back(request);
      const bool is_final = covered[p.item] == prompt.size();
      row.segment_is_final.push_back(is_final ? 1 : 0);
      if (is_final) {
        batch.requests[p.item] = {static_cast<std::int32_t>(b), static_cast<std::int32_t>(row.n_segments() - 1),
                                  end - 1, static_cast<std::int32_t>(row.logit_rows.size())};
        row.logit_rows.push_back(end - 1);
        row.logit_requests.push_back(request);
      }
    }
    batch.n_tokens += row.n_tokens();
  }
  for (std::size_t q = 0; q < n; ++q) {
    const std::size_t length = std::span<const token_id>(prompts[q]).size();
    LLMKIT_CHECK(covered[q] == length, "build_packed_batch: the packing places ", covered[q], " of the ", length,
                 " tokens of prompt ", q);
  }
  return batch;
}

/// Lengths of the prompts, the item sizes to pack: `[n_requests]`.
template <prompt_range P>
std::vector<std::size_t> prompt_lengths(const P& prompts) {
  std::vector<std::size_t> lengths;
  lengths.reserve(std::ranges::size(prompts));
  for (std::size_t q = 0; q < std::ranges::size(prompts); ++q)
    lengths.push_back(std::span<const token_id>(prompts[q]).size());
  return lengths;
}

}  // namespace llmkit::pack
