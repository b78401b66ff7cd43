// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/eval/perplexity.hpp
/// Perplexity as llama.cpp's llama-perplexity computes it, so that figures
/// compare across engines: the text's tokens are cut into non-overlapping
/// chunks of `n_ctx`, each evaluated from an empty cache with BOS as its
/// first token (when the vocabulary adds one), and scored on its second
/// half only (every scored token has at least n_ctx / 2 tokens of context).
///
/// ```
/// const auto plan = eval::chunking::of(tokens.size(), 512);
/// eval::running_mean nll;
/// for (std::size_t c = 0; c < plan.n_chunks; ++c) {
///   const auto ids = plan.chunk_tokens(tokens, c, bos);       // [n_ctx]
///   const auto logits = eval::score_chunk(model, cache, pool, plan, ids, batch);
///   for (std::size_t i = 0; i < plan.n_scored(); ++i)
///     nll.add(eval::token_nll(logits.row(i), ids[plan.first_scored() + i + 1], scratch));
///   std::printf("[%zu]%.4f,", c + 1, eval::perplexity_of(nll).value);
/// }
/// ```

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "llmkit/core/error.hpp"
#include "llmkit/core/executor.hpp"
#include "llmkit/core/ids.hpp"
#include "llmkit/core/views.hpp"
#include "llmkit/model/batch.hpp"
#include "llmkit/model/language_model.hpp"
#include "llmkit/search/detail/log_softmax.hpp"

namespace llmkit::eval {

/// Mean and standard error of a sample, kept as its sum, sum of squares
/// and count (the form llama-perplexity reports its estimates in).
struct running_mean {
  double sum = 0.0, sum2 = 0.0;  ///< of the values, of their squares
  std::size_t count = 0;

  void add(double v) noexcept {
    sum += v;
    sum2 += v * v;
    ++count;
  }
  /// 0 when empty.
  double mean() const noexcept { return count == 0 ? 0.0 : sum / static_cast<double>(count); }
  /// sqrt(var / (count - 1)) with var = E[v^2] - E[v]^2: the standard error
  /// of the mean; 0 below two values or when rounding makes var negative.
  double standard_error() const noexcept {
    if (count < 2) return 0.0;
    const double m = mean(), var = sum2 / static_cast<double>(count) - m * m;
    return var > 0.0 ? std::sqrt(var / static_cast<double>(count - 1)) : 0.0;
  }
};

/// A value and its one-sigma uncertainty.
struct estimate {
  double value = 0.0;
  double uncertainty = 0.0;
};

/// Perplexity exp(mean NLL) and its uncertainty exp(mean) * stderr (the
/// first-order propagation llama-perplexity prints as "PPL = X +/- Y").
inline estimate perplexity_of(const running_mean& nll) noexcept {
  const double ppl = std::exp(nll.mean());
  return {ppl, ppl * nll.standard_error()};
}

/// How a text of `n_tokens` tokens is cut: `n_chunks` chunks of `n_ctx`
/// tokens (the tail that fills no chunk is not scored); chunk c holds text
/// tokens [c * n_ctx, (c + 1) * n_ctx), and its logits at positions
/// [first_scored(), n_ctx - 1) predict the next token of the chunk.
struct chunking {
  std::size_t n_ctx = 0;
  std::size_t n_chunks = 0;

  /// @param max_chunks  0 = as many as the text fills
  /// @throws llmkit::error when n_ctx < 4 (nothing to score) or the text
  /// fills fewer than two chunks (llama-perplexity's rule), naming both.
  static chunking of(std::size_t n_tokens, std::size_t n_ctx, std::size_t max_chunks = 0) {
    LLMKIT_CHECK(n_ctx >= 4, "perplexity: n_ctx = ", n_ctx, " scores no token (give 4 or more)");
    LLMKIT_CHECK(n_tokens >= 2 * n_ctx, "perplexity: the text has ", n_tokens, " tokens; a context of ", n_ctx,
                 " needs at least ", 2 * n_ctx);
    std::size_t n = n_tokens / n_ctx;
    if (max_chunks != 0 && max_chunks < n) n = max_chunks;
    return {n_ctx, n};
  }

  /// The first scored position of a chunk: n_ctx / 2.
  std::size_t first_scored() const noexcept { return n_ctx / 2; }
  /// Scored positions per chunk: n_ctx - 1 - n_ctx / 2.
  std::size_t n_scored() const noexcept { return n_ctx - 1 - n_ctx / 2; }

  /// `[n_ctx]` the tokens chunk c is evaluated on: the text's, with the
  /// first replaced by `bos` when given.
  /// @pre text.size() >= n_chunks * n_ctx; @throws llmkit::error when c >= n_chunks
  std::vector<token_id> chunk_tokens(std::span<const token_id> text, std::size_t c,
                                     std::optional<token_id> bos) const {
    LLMKIT_CHECK(c < n_chunks, "perplexity: chunk ", c, " of ", n_chunks);
    LLMKIT_CHECK(text.size() >= (c + 1) * n_ctx, "perplexity: chunk ", c, " needs ", (c + 1) * n_ctx,
                 " tokens, the text has ", text.size());
    std::vector<token_id> ids(text.begin() + static_cast<std::ptrdiff_t>(c * n_ctx),
                              text.begin() + static_cast<std::ptrdiff_t>((c + 1) * n_ctx));
    if (bos) ids[0] = *bos;
    return ids;
  }
};

/// Runs one chunk (`[plan.n_ctx] ids`, from chunking::chunk_tokens) through
/// `m` in one forward pass on a fresh sequence of `cache`, freed after, and
/// returns the logits of its scored positions, `[plan.n_scored(), vocab]`:
/// row i predicts ids[plan.first_scored() + i + 1]. Valid until m's next
/// forward. @throws llmkit::error when the cache has no room for a chunk.
template <class Model, class Cache, class Exec>
  requires model::language_model<Model, Cache, Exec>
matrix_view<const float> score_chunk(Model& m, Cache& cache, Exec& exec, const chunking& plan,
                                     std::span<const token_id> ids, model::batch_builder& batch) {
  LLMKIT_CHECK(ids.size() == plan.n_ctx, "score_chunk: ", ids.size(), " tokens for a chunk of ", plan.n_ctx);
  const auto seq = cache.add_sequence();
  LLMKIT_CHECK(seq.has_value(), "score_chunk: the cache holds no more sequences");
  batch.clear();
  batch.add(*seq, ids, 0, model::last_logits::skip);
  for (std::size_t i = 0; i < plan.n_scored(); ++i)
    batch.request_logits(static_cast<std::int32_t>(plan.first_scored() + i));
  matrix_view<const float> logits;
  try {
    logits = m.forward(batch.view(), cache, exec);
  } catch (...) {
    cache.free(*seq);
    throw;
  }
  cache.free(*seq);
  return logits;
}

/// -log softmax(`[vocab] logits`)[next], in double.
/// @param scratch  reused between calls (resized to the vocabulary)
/// @throws llmkit::error when next is outside the vocabulary, or every logit
/// is -inf or NaN, or one is +inf.
inline double token_nll(std::span<const float> logits, token_id next, std::vector<double>& scratch) {
  LLMKIT_CHECK(next >= 0 && static_cast<std::size_t>(next) < logits.size(), "perplexity: token ", next,
               " is outside the vocabulary of ", logits.size());
  scratch.resize(logits.size());
  search::detail::log_softmax(logits, scratch, "perplexity");
  return -scratch[static_cast<std::size_t>(next)];
}

}  // namespace llmkit::eval
