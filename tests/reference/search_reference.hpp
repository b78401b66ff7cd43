// SPDX-License-Identifier: MIT
#pragma once

// Oracles for the search/ tests:
// - toy_lm: a hand-built order-2 Markov language model with known next-token
//   probabilities that satisfies model::language_model. It writes every token
//   into a real KV cache (K row = {token, position}, V row = {position,
//   token}) and reads its whole context back from the cache's chunks, so a
//   broken fork / copy-on-write / rollback (a stale or foreign row visible to
//   "attention") changes its logits or raises an error.
// - exact double-precision distributions, an independent reference beam
//   search and exhaustive search (the chi-square test is in statistics.hpp).

#include <llmkit/core/error.hpp>
#include <llmkit/core/executor.hpp>
#include <llmkit/core/views.hpp>
#include <llmkit/kv/kv_view.hpp>
#include <llmkit/model/batch.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <span>
#include <vector>
#include "statistics.hpp"

namespace search_reference {

/// Next-token logits depend on (last token, the token before it, parity of
/// the sum of all context tokens), looked up in a seeded random table.
class toy_lm {
 public:
  /// @param scale standard deviation of the random logits
  toy_lm(std::size_t vocab, std::uint32_t seed, double scale = 1.5, bool use_parity = true)
      : vocab_(vocab), use_parity_(use_parity), table_(n_keys() * vocab) {
    std::mt19937 rng(seed);
    std::normal_distribution<double> normal(0.0, scale);
    for (float& x : table_) x = static_cast<float>(normal(rng));
  }

  std::size_t vocab_size() const noexcept { return vocab_; }
  llmkit::kv::kv_shape kv_shape() const noexcept { return {1, 1, 2}; }
  std::size_t n_forward_passes() const noexcept { return n_forward_; }
  std::size_t n_tokens_processed() const noexcept { return n_tokens_; }

  /// Sets the next-token probabilities after (.., prev2, prev1) to `probs`
  /// (both parities); prev2 = -1 means "no token before prev1".
  void set_probs(std::int32_t prev1, std::int32_t prev2, const std::vector<double>& probs) {
    for (int parity = 0; parity < 2; ++parity) {
      float* row = table_.data() + key(prev1, prev2, parity) * vocab_;
      for (std::size_t v = 0; v < vocab_; ++v)
        row[v] = probs[v] > 0 ? static_cast<float>(std::log(probs[v])) : -std::numeric_limits<float>::infinity();
    }
  }

  /// The float logits after `[n >= 1] context`.
  std::span<const float> logits(std::span<const std::int32_t> context) const {
    const std::int32_t prev1 = context.back();
    const std::int32_t prev2 = context.size() >= 2 ? context[context.size() - 2] : -1;
    long sum = 0;
    for (std::int32_t t : context) sum += t;
    return {table_.data() + key(prev1, prev2, static_cast<int>(sum & 1)) * vocab_, vocab_};
  }

  /// Exact next-token distribution (double softmax of the float logits).
  std::vector<double> probs(std::span<const std::int32_t> context) const {
    const auto l = logits(context);
    double m = -std::numeric_limits<double>::infinity();
    for (float x : l) m = std::max(m, static_cast<double>(x));
    std::vector<double> p(vocab_);
    double z = 0;
    for (std::size_t v = 0; v < vocab_; ++v) z += p[v] = std::exp(static_cast<double>(l[v]) - m);
    for (double& x : p) x /= z;
    return p;
  }

  /// The executor of the latest forward (its address), so tests can check
  /// that strategies pass theirs through.
  const void* last_executor() const noexcept { return last_executor_; }

  template <class Cache, llmkit::executor Exec>
  llmkit::matrix_view<const float> forward(const llmkit::model::batch& b, Cache& cache, Exec& exec) {
    ++n_forward_;
    last_executor_ = &exec;
    const std::size_t n = b.n_tokens();
    n_tokens_ += n;
    LLMKIT_CHECK(b.positions.size() == n && b.seq_ids.size() == n, "toy_lm: ragged batch");
    for (std::size_t i = 0; i < n;) {
      const llmkit::kv::seq_id s = b.seq_ids[i];
      std::size_t j = i;
      const std::size_t base = cache.n_tokens(s);
      while (j < n && b.seq_ids[j] == s) {
        LLMKIT_CHECK(b.positions[j] == static_cast<std::int32_t>(base + (j - i)), "toy_lm: position ", b.positions[j],
                     " of sequence ", s, " does not continue its ", base, " cached tokens");
        LLMKIT_CHECK(b.token_ids[j] >= 0 && static_cast<std::size_t>(b.token_ids[j]) < vocab_, "toy_lm: token ",
                     b.token_ids[j], " outside the vocabulary");
        ++j;
      }
      LLMKIT_CHECK(cache.grow(s, j - i), "toy_lm: the cache has no room for ", j - i, " tokens of sequence ", s);
      std::vector<float> k, v;
      for (std::size_t t = i; t < j; ++t) {
        k.insert(k.end(), {static_cast<float>(b.token_ids[t]), static_cast<float>(b.positions[t])});
        v.insert(v.end(), {static_cast<float>(b.positions[t]), static_cast<float>(b.token_ids[t])});
      }
      cache.store(s, 0, base, k, v);
      i = j;
    }
    out_.resize(b.n_logits() * vocab_);
    for (std::size_t r = 0; r < b.n_logits(); ++r) {
      const auto t = static_cast<std::size_t>(b.logit_rows[r]);
      const llmkit::kv::seq_id s = b.seq_ids[t];
      const auto pos = static_cast<std::size_t>(b.positions[t]);
      // "Attention": read the context back from the cache, checking every row.
      context_.clear();
      for (std::size_t c = 0; c < cache.n_chunks(s) && context_.size() <= pos; ++c) {
        const auto ch = cache.chunk(s, 0, 0, c);
        for (std::size_t row = 0; row < ch.n_tokens && context_.size() <= pos; ++row) {
          const float* kr = ch.k + row * ch.row_stride;
          const float* vr = ch.v + row * ch.row_stride;
          const auto expected_pos = static_cast<float>(ch.first_pos + static_cast<std::int32_t>(row));
          LLMKIT_CHECK(kr[1] == expected_pos && vr[0] == expected_pos && kr[0] == vr[1],
                       "toy_lm: stale or corrupt KV row at position ", expected_pos, " of sequence ", s);
          context_.push_back(static_cast<std::int32_t>(kr[0]));
        }
      }
      LLMKIT_CHECK(context_.size() == pos + 1, "toy_lm: sequence ", s, " shows ", context_.size(),
                   " rows up to position ", pos);
      LLMKIT_CHECK(context_.back() == b.token_ids[t], "toy_lm: the cached token at position ", pos,
                   " differs from the batch's");
      const auto l = logits(context_);
      std::copy(l.begin(), l.end(), out_.begin() + static_cast<std::ptrdiff_t>(r * vocab_));
    }
    return {out_.data(), b.n_logits(), vocab_};
  }

 private:
  std::size_t n_keys() const noexcept { return (vocab_ + 1) * (vocab_ + 1) * 2; }
  std::size_t key(std::int32_t prev1, std::int32_t prev2, int parity) const noexcept {
    const auto p1 = static_cast<std::size_t>(prev1);
    const std::size_t p2 = prev2 < 0 ? vocab_ : static_cast<std::size_t>(prev2);
    return (p1 * (vocab_ + 1) + p2) * 2 + static_cast<std::size_t>(use_parity_ ? parity : 0);
  }

  std::size_t vocab_;
  bool use_parity_;
  std::vector<float> table_;
  std::vector<float> out_;
  std::vector<std::int32_t> context_;
  std::size_t n_forward_ = 0;
  std::size_t n_tokens_ = 0;
  const void* last_executor_ = nullptr;
};

/// A finished hypothesis of the reference searches.
struct ref_hypothesis {
  std::vector<std::int32_t> tokens;
  double logprob = 0;
  double score = 0;
};

inline double ref_score(double logprob, std::size_t n, double alpha) {
  return logprob / std::pow(static_cast<double>(n), alpha);
}

/// `probs(context)` -> next-token distribution; the model of the searches.
using distribution_fn = std::function<std::vector<double>(std::span<const std::int32_t>)>;

/// Every sequence of at most max_new tokens that ends at an EOS token or at
/// max_new, with its exact log-probability; the n best by score (ties by
/// logprob, then tokens), via depth-first enumeration.
inline std::vector<ref_hypothesis> exhaustive_search(const distribution_fn& probs, std::vector<std::int32_t> prompt,
                                                     std::size_t max_new, const std::vector<std::int32_t>& eos,
                                                     double alpha, std::size_t n_best) {
  std::vector<ref_hypothesis> all;
  std::vector<std::int32_t> tokens;
  std::function<void(double)> dfs = [&](double logprob) {
    std::vector<std::int32_t> context = prompt;
    context.insert(context.end(), tokens.begin(), tokens.end());
    const std::vector<double> p = probs(context);
    for (std::size_t v = 0; v < p.size(); ++v) {
      if (p[v] <= 0) continue;
      const double lp = logprob + std::log(p[v]);
      tokens.push_back(static_cast<std::int32_t>(v));
      const bool is_eos = std::find(eos.begin(), eos.end(), static_cast<std::int32_t>(v)) != eos.end();
      if (is_eos || tokens.size() == max_new) all.push_back({tokens, lp, ref_score(lp, tokens.size(), alpha)});
      else dfs(lp);
      tokens.pop_back();
    }
  };
  dfs(0.0);
  std::sort(all.begin(), all.end(), [](const ref_hypothesis& a, const ref_hypothesis& b) {
    if (a.score != b.score) return a.score > b.score;
    if (a.logprob != b.logprob) return a.logprob > b.logprob;
    return a.tokens < b.tokens;
  });
  if (all.size() > n_best) all.resize(n_best);
  return all;
}

/// Reference beam search (no KV cache, no pruning): at each step every
/// (beam, token) candidate, best first by (score, beam, token); a candidate
/// ending at EOS becomes a hypothesis if ranked < B, others become live
/// until B; hypotheses kept: the B best; stop rules as in search::early_stopping
/// (0 = when_n_done, 1 = when_no_better, 2 = never).
inline std::vector<ref_hypothesis> reference_beam_search(const distribution_fn& probs,
                                                         const std::vector<std::int32_t>& prompt, std::size_t B,
                                                         std::size_t max_new, const std::vector<std::int32_t>& eos,
                                                         double alpha, int stopping, std::size_t n_best) {
  struct beam {
    std::vector<std::int32_t> tokens;
    double logprob;
  };
  std::vector<beam> live{{{}, 0.0}};
  std::vector<ref_hypothesis> done;
  auto add_done = [&](ref_hypothesis h) {
    if (done.size() < B) {
      done.push_back(std::move(h));
      return;
    }
    auto worst = std::min_element(done.begin(), done.end(),
                                  [](const ref_hypothesis& a, const ref_hypothesis& b) { return a.score < b.score; });
    if (h.score > worst->score) *worst = std::move(h);
  };
  auto worst_done = [&] {
    double w = std::numeric_limits<double>::infinity();
    for (const auto& h : done) w = std::min(w, h.score);
    return w;
  };
  for (std::size_t step = 1;; ++step) {
    struct cand {
      double score;
      std::size_t beam;
      std::int32_t token;
    };
    std::vector<cand> cands;
    for (std::size_t i = 0; i < live.size(); ++i) {
      std::vector<std::int32_t> context = prompt;
      context.insert(context.end(), live[i].tokens.begin(), live[i].tokens.end());
      const auto p = probs(context);
      for (std::size_t v = 0; v < p.size(); ++v)
        if (p[v] > 0) cands.push_back({live[i].logprob + std::log(p[v]), i, static_cast<std::int32_t>(v)});
    }
    std::sort(cands.begin(), cands.end(), [](const cand& a, const cand& b) {
      if (a.score != b.score) return a.score > b.score;
      if (a.beam != b.beam) return a.beam < b.beam;
      return a.token < b.token;
    });
    std::vector<beam> next;
    for (std::size_t r = 0; r < cands.size() && next.size() < B; ++r) {
      std::vector<std::int32_t> t = live[cands[r].beam].tokens;
      t.push_back(cands[r].token);
      if (std::find(eos.begin(), eos.end(), cands[r].token) != eos.end()) {
        if (r < B) add_done({t, cands[r].score, ref_score(cands[r].score, t.size(), alpha)});
        continue;
      }
      next.push_back({t, cands[r].score});
    }
    if (next.empty()) break;
    if (step >= max_new) {
      for (auto& bm : next) add_done({bm.tokens, bm.logprob, ref_score(bm.logprob, bm.tokens.size(), alpha)});
      break;
    }
    if (stopping == 0 && done.size() >= B) break;
    if (stopping == 1 && done.size() >= B) {
      double best = -std::numeric_limits<double>::infinity();
      for (auto& bm : next) best = std::max(best, ref_score(bm.logprob, alpha > 0 ? max_new : bm.tokens.size() + 1, alpha));
      if (best <= worst_done()) break;
    }
    live = std::move(next);
  }
  std::sort(done.begin(), done.end(), [](const ref_hypothesis& a, const ref_hypothesis& b) {
    if (a.score != b.score) return a.score > b.score;
    if (a.logprob != b.logprob) return a.logprob > b.logprob;
    return a.tokens < b.tokens;
  });
  if (done.size() > n_best) done.resize(n_best);
  return done;
}

using llmkit::test::chi_square_p_value;
using llmkit::test::gamma_q;

}  // namespace search_reference
