// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/pack/prefill.hpp
/// Drives a prefill over rows (prepacked `packed_row`s or baseline
/// `padded_batch`es) and returns the last-token logits in request order,
/// ready for decoding.
///
/// The model is the caller's: `forward(row)` runs one row and returns the
/// logits of `row.logit_rows`. With llmkit's reference model the adapter is
/// one line, because a row already is a ragged batch whose tokens continue
/// their own cache sequences:
/// ```
/// auto forward = [&](const auto& row) {
///   return model.forward(model::batch{row.token_ids, row.positions, row.seq_ids, row.logit_rows}, cache, exec);
/// };
/// pack::run_prefill(std::span(batch.rows), forward, logits);  // logits: [n_requests, vocab]
/// ```
/// Each prompt's K/V goes straight into its own sequence of the cache
/// (contiguous or paged) as the row runs; nothing is unpacked afterwards.

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "llmkit/core/error.hpp"
#include "llmkit/core/ids.hpp"
#include "llmkit/core/views.hpp"

namespace llmkit::pack {

/// What `run_prefill` needs of a row: token ids, positions, cache sequences,
/// the rows whose logits to keep and the request each belongs to.
template <class R>
concept prefill_row = requires(const R& r) {
  { std::span<const token_id>(r.token_ids) };
  { std::span<const std::int32_t>(r.positions) };
  { std::span<const std::int32_t>(r.seq_ids) };
  { std::span<const std::int32_t>(r.logit_rows) };
  { std::span<const std::int32_t>(r.logit_requests) };
};

/// Runs every row through `forward` in order and copies each request's
/// last-token logits into row `request` of `logits`.
/// @param rows rows in processing order (a chunked prompt's chunks in order).
/// @param forward `matrix_view<const float>(const Row&)`, returning
///   `[row.logit_rows.size(), vocab]` logits of that row.
/// @param logits `[n_requests, vocab]` output, row q = request q.
/// @throws llmkit::error when forward returns the wrong shape, a request is
///   out of range or appears twice, or some request gets no logits.
template <prefill_row Row, class Forward>
void run_prefill(std::span<const Row> rows, Forward&& forward, matrix_view<float> logits) {
  std::vector<std::uint8_t> written(logits.rows(), 0);
  for (std::size_t r = 0; r < rows.size(); ++r) {
    const Row& row = rows[r];
    const matrix_view<const float> out = forward(row);
    LLMKIT_CHECK(out.rows() == row.logit_rows.size() && out.cols() == logits.cols(), "run_prefill: forward of row ", r,
                 " returned [", out.rows(), ", ", out.cols(), "] logits, expected [", row.logit_rows.size(), ", ",
                 logits.cols(), "]");
    for (std::size_t k = 0; k < out.rows(); ++k) {
      const std::int32_t q = row.logit_requests[k];
      LLMKIT_CHECK(q >= 0 && static_cast<std::size_t>(q) < logits.rows(), "run_prefill: row ", r, " names request ", q,
                   " outside the ", logits.rows(), " rows of logits");
      LLMKIT_CHECK(!written[static_cast<std::size_t>(q)], "run_prefill: request ", q, " has logits in two rows");
      written[static_cast<std::size_t>(q)] = 1;
      std::copy_n(out.row(k).data(), logits.cols(), logits.row(static_cast<std::size_t>(q)).data());
    }
  }
  for (std::size_t q = 0; q < written.size(); ++q)
    LLMKIT_CHECK(written[q], "run_prefill: request ", q, " received no logits");
}

}  // namespace llmkit::pack
