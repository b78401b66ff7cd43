// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/search/speculative.hpp
/// Speculative decoding: a drafter guesses k tokens, the target model
/// scores the last committed token and all k guesses in one packed forward
/// (k + 1 logits rows), the verifier keeps the longest acceptable prefix
/// and adds one token of its own (the correction, or a bonus token when
/// every guess passed); rejected guesses are rolled back in the target cache
/// with `truncate` (the drafter rolls back its own cache on the next round).
///
/// Verification runs on the target's logits after the request's processor
/// chain, with the history each position would have had:
/// - greedy: keep guesses while they equal the arg-max (lowest id on ties);
///   the output is token for token that of `generate` with the same chain
///   and `sampling::greedy`.
/// - stochastic (exact rejection sampling, Leviathan et al. 2023, Chen et
///   al. 2023): accept guess x with probability min(1, p(x) / q(x)), else
///   draw from the normalised residual max(0, p - q) and stop the round; a
///   bonus token is drawn from p. The output then follows the target's
///   processed distribution p exactly, whatever the drafter's q.
///   Draws: uniform number 1 (acceptance) and 2 (residual / bonus) of
///   `sampling::philox_uniform(seed, request_id, position, draw)`, position
///   = index of the generated token, so runs are reproducible.
///
/// Draft length: fixed k, or adaptive in [1, k]: with alpha estimated from
/// the acceptances so far (exponentially weighted counts, Laplace prior), the
/// round drafts the largest j <= k whose expected acceptance alpha^j is at
/// least `adaptive_min_gain` (a cheap drafter wants a low threshold, a
/// costly one a threshold near its cost relative to the target).

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "llmkit/core/error.hpp"
#include "llmkit/core/executor.hpp"
#include "llmkit/core/ids.hpp"
#include "llmkit/core/stop.hpp"
#include "llmkit/model/batch.hpp"
#include "llmkit/model/language_model.hpp"
#include "llmkit/sampling/candidates.hpp"
#include "llmkit/sampling/chain.hpp"
#include "llmkit/sampling/concepts.hpp"
#include "llmkit/sampling/context.hpp"
#include "llmkit/sampling/greedy.hpp"
#include "llmkit/sampling/rng.hpp"
#include "llmkit/search/detail/log_softmax.hpp"
#include "llmkit/search/detail/streaming.hpp"
#include "llmkit/search/drafter.hpp"
#include "llmkit/search/sequence_cache.hpp"

namespace llmkit::search {

/// How guesses are verified.
enum class verification : std::uint8_t {
  greedy,      ///< keep guesses equal to the target's arg-max
  stochastic,  ///< exact rejection sampling against the target's distribution
};

/// Options of `speculative_generate`.
struct speculative_options {
  stop_criteria stop{};
  verification verify = verification::greedy;
  std::size_t draft_length = 4;     ///< k: guesses per round (0: plain decoding); the maximum when adaptive
  bool adaptive = false;            ///< adapt the draft length to the observed acceptance
  double adaptive_min_gain = 0.3;   ///< adaptive: draft the j-th guess only while alpha^j >= this, in (0, 1]
  std::uint64_t seed = 0;           ///< the request's seed
  std::uint64_t request_id = 0;     ///< the request's id
};

/// Counters of one speculative run.
struct speculative_stats {
  std::size_t n_rounds = 0;         ///< draft + verify rounds (= target forward passes)
  std::size_t n_drafted = 0;        ///< guesses verified
  std::size_t n_accepted = 0;       ///< guesses kept
  std::size_t n_rejected = 0;       ///< guesses rejected (at most one per round; later guesses are not tested)
  std::size_t n_generated = 0;      ///< tokens output
  /// alpha: the probability that a tested guess is accepted,
  /// n_accepted / (n_accepted + n_rejected) (0 when nothing was tested). With
  /// k guesses per round, expected tokens per pass = (1 - alpha^(k+1)) / (1 - alpha).
  double acceptance_rate() const noexcept {
    const std::size_t tested = n_accepted + n_rejected;
    return tested ? static_cast<double>(n_accepted) / static_cast<double>(tested) : 0.0;
  }
  /// Fraction of all guesses kept, n_accepted / n_drafted (untested guesses count as lost).
  double kept_fraction() const noexcept {
    return n_drafted ? static_cast<double>(n_accepted) / static_cast<double>(n_drafted) : 0.0;
  }
  /// Output tokens per target forward pass.
  double tokens_per_target_pass() const noexcept {
    return n_rounds ? static_cast<double>(n_generated) / static_cast<double>(n_rounds) : 0.0;
  }
  /// Mean guesses per round.
  double mean_draft_length() const noexcept {
    return n_rounds ? static_cast<double>(n_drafted) / static_cast<double>(n_rounds) : 0.0;
  }
  /// `[max guesses + 1]` rounds_by_draft_length[j]: rounds that verified j guesses
  /// (fewer than k near the token budget, or when the drafter had no idea).
  std::vector<std::size_t> rounds_by_draft_length{};
  /// Expected tokens per pass for the guesses actually verified: the mean over
  /// rounds of (1 - alpha^(j+1)) / (1 - alpha) with j that round's guesses
  /// (equals expected_tokens_per_pass(alpha, k) when every round had k).
  double expected_tokens_per_pass_as_drafted() const;
  /// Adds another run's counters (to report several requests together).
  speculative_stats& operator+=(const speculative_stats& other) {
    n_rounds += other.n_rounds;
    n_drafted += other.n_drafted;
    n_accepted += other.n_accepted;
    n_rejected += other.n_rejected;
    n_generated += other.n_generated;
    if (rounds_by_draft_length.size() < other.rounds_by_draft_length.size())
      rounds_by_draft_length.resize(other.rounds_by_draft_length.size(), 0);
    for (std::size_t j = 0; j < other.rounds_by_draft_length.size(); ++j)
      rounds_by_draft_length[j] += other.rounds_by_draft_length[j];
    return *this;
  }
};

/// (1 - alpha^(k+1)) / (1 - alpha): expected tokens per target pass with
/// acceptance rate alpha and k guesses per round (k + 1 when alpha = 1).
inline double expected_tokens_per_pass(double alpha, std::size_t k) noexcept {
  if (alpha >= 1.0) return static_cast<double>(k + 1);
  return (1.0 - std::pow(alpha, static_cast<double>(k + 1))) / (1.0 - alpha);
}

inline double speculative_stats::expected_tokens_per_pass_as_drafted() const {
  if (n_rounds == 0) return 0.0;
  const double alpha = acceptance_rate();
  double sum = 0.0;
  for (std::size_t j = 0; j < rounds_by_draft_length.size(); ++j)
    sum += static_cast<double>(rounds_by_draft_length[j]) * expected_tokens_per_pass(alpha, j);
  return sum / static_cast<double>(n_rounds);
}

/// What `speculative_generate` produced.
struct speculative_result {
  std::vector<token_id> tokens;  ///< [n_generated] generated tokens (stop tokens included)
  finish_reason reason = finish_reason::max_tokens;
  speculative_stats stats{};
};

/// Generates a continuation of `[n_prompt] prompt` with the target `model`
/// in a new sequence of `cache` (freed before returning, also on error),
/// guesses coming from `draft_source` (reset before and after). `chain`
/// processes the target's logits; `on_token` streams as in `generate`.
/// @throws llmkit::error for an empty prompt, bad options (naming the
/// field), a drafter answer that breaks its contract, a cache without room,
/// or what the models and the chain raise.
template <class Model, sequence_cache Cache, drafter Drafter,
          sampling::logits_processor Chain = sampling::processor_chain<>, class OnToken = detail::no_callback,
          class Exec = serial_executor>
  requires model::language_model<Model, Cache, std::remove_cvref_t<Exec>>
speculative_result speculative_generate(Model& model, Cache& cache, Drafter& draft_source,
                                        std::span<const token_id> prompt, const speculative_options& options,
                                        const Chain& chain = {}, OnToken&& on_token = {}, Exec&& exec = Exec{}) {
  LLMKIT_CHECK(!prompt.empty(), "speculative_generate: prompt is empty (give at least one token, e.g. BOS)");
  options.stop.validate("speculative_generate");
  LLMKIT_CHECK(options.adaptive_min_gain > 0.0 && options.adaptive_min_gain <= 1.0,
               "speculative_generate: adaptive_min_gain must be in (0, 1], got ", options.adaptive_min_gain);
  const std::size_t vocab = model.vocab_size();
  const bool stochastic = options.verify == verification::stochastic;

  struct drafter_reset {
    Drafter& d;
    ~drafter_reset() { d.reset(); }
  } reset_at_exit{draft_source};
  draft_source.reset();
  detail::sequence_guard<Cache> seq(cache, detail::add_sequence_or_throw(cache, "speculative_generate"));

  speculative_result out;
  std::vector<token_id> committed(prompt.begin(), prompt.end());
  std::vector<token_id> context, feed;
  std::vector<float> row(vocab);
  std::vector<double> p(vocab), residual(vocab);
  sampling::candidates workspace;
  draft guesses;
  model::batch_builder b;
  std::size_t in_cache = 0;           // target cache holds committed[0, in_cache)
  double accepted_w = 0.0, rejected_w = 0.0;  // adaptive: weighted acceptance counts
  constexpr double decay = 0.9;

  for (std::uint64_t round = 0;; ++round) {
    const std::size_t generated = committed.size() - prompt.size();
    std::size_t k = std::min(options.draft_length, options.stop.max_new_tokens - generated - 1);
    if (options.adaptive && k > 1) {
      const double alpha = (accepted_w + 1.0) / (accepted_w + rejected_w + 2.0);
      std::size_t j = 1;
      while (j < k && std::pow(alpha, static_cast<double>(j + 1)) >= options.adaptive_min_gain) ++j;
      k = j;
    }
    guesses.clear();
    if (k > 0) {
      draft_source.propose(draft_request{.history = committed, .n_prompt = prompt.size(), .max_tokens = k,
                                         .sample = stochastic, .seed = options.seed,
                                         .request_id = options.request_id, .round = round},
                           guesses);
    }
    const std::size_t n = guesses.tokens.size();
    LLMKIT_CHECK(n <= k, "speculative_generate: drafter '", draft_source.name(), "' proposed ", n,
                 " tokens, more than the ", k, " asked for");
    LLMKIT_CHECK(guesses.probs.empty() || guesses.probs.size() == n * vocab, "speculative_generate: drafter '",
                 draft_source.name(), "' returned ", guesses.probs.size(), " probabilities for ", n,
                 " tokens of vocab ", vocab, " (expected 0 or ", n * vocab, ")");
    for (std::size_t i = 0; i < n; ++i)
      LLMKIT_CHECK(guesses.tokens[i] >= 0 && static_cast<std::size_t>(guesses.tokens[i]) < vocab,
                   "speculative_generate: drafter '", draft_source.name(), "' proposed token ", guesses.tokens[i],
                   " outside the vocabulary of ", vocab);

    // One target pass: the tokens not yet in the cache, then the guesses; logits from the last committed token on.
    feed.assign(committed.begin() + static_cast<std::ptrdiff_t>(in_cache), committed.end());
    const std::size_t first_row = feed.size() - 1;
    feed.insert(feed.end(), guesses.tokens.begin(), guesses.tokens.end());
    b.clear();
    b.add(seq.get(), feed, static_cast<std::int32_t>(in_cache), model::last_logits::skip);
    for (std::size_t r = first_row; r < feed.size(); ++r) b.request_logits(static_cast<std::int32_t>(r));
    const matrix_view<const float> logits = model.forward(b.view(), cache, exec);
    ++out.stats.n_rounds;
    LLMKIT_CHECK(logits.rows() == n + 1 && logits.cols() == vocab, "speculative_generate: the model returned a [",
                 logits.rows(), ", ", logits.cols(), "] logits matrix, expected [", n + 1, ", ", vocab, "]");

    // Verify position by position; position i follows the committed history and guesses [0, i).
    const std::size_t n_committed_before = committed.size();
    context.assign(committed.begin(), committed.end());
    std::size_t accepted = 0;
    token_id own = -1;
    for (std::size_t i = 0; i <= n; ++i) {
      const std::size_t position = generated + i;
      const sampling::sampling_context ctx{.seed = options.seed, .request_id = options.request_id, .step = position,
                                           .history = context, .n_prompt = prompt.size()};
      if (!stochastic) {
        const token_id best =
            sampling::sample_row(logits.row(i), ctx, chain, sampling::greedy{.with_logprob = false}, workspace).token;
        if (i < n && best == guesses.tokens[i]) {
          ++accepted;
          context.push_back(best);
          continue;
        }
        own = best;
        break;
      }
      sampling::process_row(logits.row(i), ctx, chain, workspace, std::span<float>(row));
      detail::softmax(row, p, "speculative_generate");
      const double u_draw = sampling::philox_uniform(options.seed, options.request_id, position, 2);
      if (i == n) {  // bonus token
        double total = 0.0;
        for (double v : p) total += v;
        own = static_cast<token_id>(detail::inverse_cdf(p, total, u_draw));
        break;
      }
      const token_id x = guesses.tokens[i];
      const double* q = guesses.probs.empty() ? nullptr : guesses.probs.data() + i * vocab;
      const double qx = q ? q[x] : 1.0;
      LLMKIT_CHECK(qx > 0.0, "speculative_generate: drafter '", draft_source.name(), "' proposed token ", x,
                   " to which its own distribution gives probability 0");
      const double u_accept = sampling::philox_uniform(options.seed, options.request_id, position, 1);
      if (u_accept * qx < p[static_cast<std::size_t>(x)]) {
        ++accepted;
        context.push_back(x);
        continue;
      }
      double total = 0.0;
      for (std::size_t t = 0; t < vocab; ++t) {
        const double qt = q ? q[t] : (static_cast<token_id>(t) == x ? 1.0 : 0.0);
        residual[t] = std::max(0.0, p[t] - qt);
        total += residual[t];
      }
      // p <= q everywhere can only come from rounding (p(x) < q(x) forces mass elsewhere): fall back to p.
      if (!(total > 0.0)) {
        residual = p;
        total = 0.0;
        for (double v : p) total += v;
      }
      own = static_cast<token_id>(detail::inverse_cdf(residual, total, u_draw));
      break;
    }
    LLMKIT_ASSERT(own >= 0);
    out.stats.n_drafted += n;
    if (out.stats.rounds_by_draft_length.size() <= n) out.stats.rounds_by_draft_length.resize(n + 1, 0);
    ++out.stats.rounds_by_draft_length[n];
    out.stats.n_accepted += accepted;
    out.stats.n_rejected += accepted < n ? 1 : 0;
    accepted_w = decay * accepted_w + static_cast<double>(accepted);
    rejected_w = decay * rejected_w + (accepted < n ? 1.0 : 0.0);

    // Roll the target cache back to the committed tokens (the own token is fed next round).
    in_cache = n_committed_before + accepted;
    cache.truncate(seq.get(), in_cache);

    // Commit accepted guesses and the own token, one by one, honouring stop rules and the callback.
    for (std::size_t i = 0; i <= accepted; ++i) {
      const token_id t = i < accepted ? guesses.tokens[i] : own;
      committed.push_back(t);
      out.tokens.push_back(t);
      ++out.stats.n_generated;
      if (!detail::notify(on_token, t)) {
        out.reason = finish_reason::cancelled;
        return out;
      }
      if (const auto why = options.stop.check(out.tokens)) {
        out.reason = *why;
        return out;
      }
    }
  }
}

}  // namespace llmkit::search
