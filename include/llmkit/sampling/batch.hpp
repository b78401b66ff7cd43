// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/sampling/batch.hpp
/// Sampling many rows at once through an executor: one task per row, each
/// thread reusing its own `candidates` workspace (thread-local, so no call
/// allocates after the first at a given vocabulary size). Row r draws with
/// contexts[r] only, so its token does not depend on the other rows, the
/// batch size or the number of threads.

#include <cstddef>
#include <span>

#include "llmkit/core/error.hpp"
#include "llmkit/core/executor.hpp"
#include "llmkit/core/views.hpp"
#include "llmkit/sampling/candidates.hpp"
#include "llmkit/sampling/chain.hpp"
#include "llmkit/sampling/concepts.hpp"
#include "llmkit/sampling/context.hpp"

namespace llmkit::sampling {

namespace detail {
inline candidates& thread_workspace() {
  thread_local candidates workspace;
  return workspace;
}

/// sample_batch() on `[n_rows, vocab] logits` of either constness (a
/// read-only row is copied into the thread's workspace by sample_row).
template <class T, class Chain, class Sampler, class Exec>
void sample_rows(matrix_view<T> logits, std::span<const sampling_context> contexts, const Chain& chain,
                 const Sampler& pick, std::span<sample_result> out, Exec& exec) {
  LLMKIT_CHECK(contexts.size() == logits.rows(), "sample_batch: contexts.size() = ", contexts.size(),
               " differs from logits.rows() = ", logits.rows());
  LLMKIT_CHECK(out.size() == logits.rows(), "sample_batch: out.size() = ", out.size(),
               " differs from logits.rows() = ", logits.rows());
  exec.parallel_for(logits.rows(), [&](std::size_t r) {
    out[r] = sample_row(logits.row(r), contexts[r], chain, pick, thread_workspace());
  });
}
}  // namespace detail

/// Samples one token per row.
/// `[n_rows, vocab] logits` (processed in place), `[n_rows] contexts`,
/// `[n_rows] out`. The first llmkit::error raised by any row is rethrown.
template <logits_processor Chain, sampler Sampler, executor Exec = serial_executor>
void sample_batch(matrix_view<float> logits, std::span<const sampling_context> contexts, const Chain& chain,
                  const Sampler& pick, std::span<sample_result> out, Exec&& exec = {}) {
  detail::sample_rows(logits, contexts, chain, pick, out, exec);
}

/// sample_batch() on read-only `[n_rows, vocab] logits` (each row copied into
/// its thread's workspace), e.g. what a model's forward returns.
template <logits_processor Chain, sampler Sampler, executor Exec = serial_executor>
void sample_batch(matrix_view<const float> logits, std::span<const sampling_context> contexts, const Chain& chain,
                  const Sampler& pick, std::span<sample_result> out, Exec&& exec = {}) {
  detail::sample_rows(logits, contexts, chain, pick, out, exec);
}

}  // namespace llmkit::sampling
