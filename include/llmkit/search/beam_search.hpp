// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/search/beam_search.hpp
/// Beam search over a KV cache whose forks share memory.
///
/// Each step expands every live beam by the vocabulary, scores a candidate
/// by the beam's summed log-probability plus the token's (log-softmax of the
/// logits after the optional processor chain, in double), and walks the
/// candidates best first (score, then beam index, then token id, all
/// deterministic): a candidate that ends its sequence (EOS or a stop
/// sequence) becomes a finished hypothesis when it ranks among the first
/// `beam_width` candidates (and is dropped otherwise, as Hugging Face does);
/// the others become the next live beams until there are `beam_width` of
/// them. A finished hypothesis of n generated tokens (its EOS / stop tokens
/// included) scores `logprob / n^length_penalty`; the `beam_width` best are
/// kept and the `n_best` best returned.
///
/// KV: a beam chosen by several children is forked (`cache.fork`), a beam
/// chosen by none is freed, and all children's tokens run in one packed
/// forward. With `kv::paged_cache` a fork shares every block and only the
/// partly filled last block is copied on the next write, so memory follows
/// the distinct tokens of the beam tree, not beam_width x length; with
/// `kv::contiguous_cache` every fork copies the whole sequence (the naive
/// baseline). `beam_result::memory` reports both quantities.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
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
#include "llmkit/search/detail/row_select.hpp"
#include "llmkit/search/sequence_cache.hpp"

namespace llmkit::search {

/// When beam search stops before the token budget.
enum class early_stopping : std::uint8_t {
  when_n_done,     ///< as soon as beam_width hypotheses are finished (Hugging Face early_stopping=True)
  when_no_better,  ///< when beam_width are finished and no live beam can beat the worst of them, whatever
                   ///< its future tokens (an exact bound: log-probabilities only decrease)
  never,           ///< only at the token budget or when no live beam is left
};

/// Printable name ("when_n_done", "when_no_better", "never").
constexpr std::string_view early_stopping_name(early_stopping e) noexcept {
  switch (e) {
    case early_stopping::when_n_done: return "when_n_done";
    case early_stopping::when_no_better: return "when_no_better";
    case early_stopping::never: return "never";
  }
  return "?";
}

/// Options of `beam_search`.
struct beam_options {
  std::size_t beam_width = 4;      ///< live beams per step, B (>= 1)
  std::size_t n_best = 0;          ///< hypotheses returned (1..B; 0 means B)
  float length_penalty = 1.0f;     ///< alpha in score = logprob / n^alpha (finite)
  early_stopping stopping = early_stopping::when_no_better;
  stop_criteria stop{};            ///< EOS tokens, stop sequences, max_new_tokens
  /// Naive baseline for measurements: every step each child beam gets its
  /// own fork of its parent and all parents are freed (a dense cache
  /// reordered by beam index, as frameworks without shared KV do). Same
  /// hypotheses, more copying; needs room for 2 x beam_width sequences.
  bool copy_all_beams = false;
  /// A sequence of the cache that already holds the K/V of the prompt's first
  /// n_tokens(prefix) tokens (a cached prefix, or a prompt prefilled once for
  /// several searches): the search forks it (left untouched) and prefills
  /// only the rest of the prompt, at least its last token (for its logits).
  /// @pre its rows are those of prompt[0, n_tokens(prefix)) (not checkable).
  std::optional<kv::seq_id> prefix{};
};

/// One finished sequence.
struct beam_hypothesis {
  std::vector<token_id> tokens;  ///< [n] generated tokens (EOS / stop tokens included)
  double logprob = 0.0;              ///< sum of the tokens' log-probabilities
  double score = 0.0;                ///< logprob / n^length_penalty
  finish_reason reason = finish_reason::max_tokens;
};

/// KV memory of the beams, sampled after every forward pass (maxima over the run).
struct beam_memory_stats {
  std::size_t bytes_per_token = 0;       ///< the cache's K+V bytes per token
  std::size_t peak_bytes_in_use = 0;     ///< cache memory backing sequences (blocks in use x block bytes for paged)
  std::size_t peak_blocks_in_use = 0;    ///< blocks in use (caches with a block pool; else 0)
  std::size_t peak_distinct_tokens = 0;  ///< prompt + distinct nodes of the live beams' token tree
  std::size_t peak_tokens_held = 0;      ///< sum over live beams of their lengths (what B private copies hold)
  std::size_t distinct_tokens_at_peak = 0;  ///< distinct tokens when bytes in use peaked
  /// peak_bytes_in_use / (distinct_tokens_at_peak x bytes_per_token): memory per distinct token at the
  /// peak (1 = no waste; block tails and copied rows of partly shared blocks add to it).
  double memory_ratio = 0.0;
};

/// What `beam_search` found.
struct beam_result {
  std::vector<beam_hypothesis> hypotheses;  ///< up to n_best, best score first
  beam_memory_stats memory{};
  std::size_t n_steps = 0;           ///< expansion steps (tokens generated by the longest beam)
  std::size_t n_forward_passes = 0;  ///< packed forwards (1 prefill + 1 per further step)
  std::size_t n_forks = 0;           ///< cache.fork calls
};

namespace detail {

struct beam_candidate {
  double score;        // beam logprob + token logprob
  std::size_t beam;
  token_id token;
};

/// Best first: score descending, then beam ascending, then token ascending.
inline bool better(const beam_candidate& a, const beam_candidate& b) noexcept {
  if (a.score != b.score) return a.score > b.score;
  if (a.beam != b.beam) return a.beam < b.beam;
  return a.token < b.token;
}

/// Kept finished hypotheses (at most `capacity`, the best by score).
class hypothesis_set {
 public:
  explicit hypothesis_set(std::size_t capacity) : capacity_(capacity) {}
  std::size_t size() const noexcept { return items_.size(); }
  bool full() const noexcept { return items_.size() >= capacity_; }
  /// The lowest kept score (-inf when empty).
  double worst() const noexcept {
    double w = std::numeric_limits<double>::infinity();
    for (const auto& h : items_) w = std::min(w, h.score);
    return items_.empty() ? -std::numeric_limits<double>::infinity() : w;
  }
  void add(beam_hypothesis h) {
    if (!full()) {
      items_.push_back(std::move(h));
      return;
    }
    auto worst_it = items_.begin();
    for (auto it = items_.begin(); it != items_.end(); ++it)
      if (it->score < worst_it->score) worst_it = it;
    if (h.score > worst_it->score) *worst_it = std::move(h);
  }
  /// Best first (score, then logprob descending, then tokens lexicographic).
  std::vector<beam_hypothesis> take_sorted() {
    std::sort(items_.begin(), items_.end(), [](const beam_hypothesis& a, const beam_hypothesis& b) {
      if (a.score != b.score) return a.score > b.score;
      if (a.logprob != b.logprob) return a.logprob > b.logprob;
      return a.tokens < b.tokens;
    });
    return std::move(items_);
  }

 private:
  std::size_t capacity_;
  std::vector<beam_hypothesis> items_;
};

inline double length_normalised(double logprob, std::size_t n, double alpha) {
  return alpha == 0.0 ? logprob : logprob / std::pow(static_cast<double>(n), alpha);
}

/// Frees every listed sequence that is still live (exception safety).
template <class Cache>
struct beam_sequences {
  Cache& cache;
  std::vector<kv::seq_id> ids;
  ~beam_sequences() {
    for (kv::seq_id s : ids)
      if (cache.contains(s)) cache.free(s);
  }
};

}  // namespace detail

/// Beam search from `[n_prompt] prompt` (see the file comment). Sequences
/// are created in `cache` and all freed before returning (also on error).
/// `chain` processes each beam's logits (with that beam's history) before
/// the log-softmax; tokens it removes are never chosen. Every forward pass
/// runs on `exec` (serial by default).
/// @throws llmkit::error for an empty prompt, bad options (naming the
/// field), a cache without room or sequence slots, or what the model raises.
template <class Model, sequence_cache Cache, sampling::logits_processor Chain = sampling::processor_chain<>,
          class Exec = serial_executor>
  requires model::language_model<Model, Cache, std::remove_cvref_t<Exec>>
beam_result beam_search(Model& model, Cache& cache, std::span<const token_id> prompt, const beam_options& options,
                        const Chain& chain = {}, Exec&& exec = Exec{}) {
  LLMKIT_CHECK(!prompt.empty(), "beam_search: prompt is empty (give at least one token, e.g. BOS)");
  LLMKIT_CHECK(options.beam_width >= 1, "beam_search: beam_width must be >= 1, got ", options.beam_width);
  const std::size_t n_best = options.n_best == 0 ? options.beam_width : options.n_best;
  LLMKIT_CHECK(n_best <= options.beam_width, "beam_search: n_best = ", options.n_best,
               " exceeds beam_width = ", options.beam_width);
  LLMKIT_CHECK(std::isfinite(options.length_penalty), "beam_search: length_penalty must be finite, got ",
               options.length_penalty);
  options.stop.validate("beam_search");

  const std::size_t B = options.beam_width;
  const std::size_t vocab = model.vocab_size();
  const std::size_t max_new = options.stop.max_new_tokens;
  const double alpha = options.length_penalty;

  struct beam {
    kv::seq_id seq;
    std::ptrdiff_t node;  // token-tree node of the last token (-1: the prompt)
    double logprob;
    std::vector<token_id> tokens;
  };
  struct tree_node {
    std::ptrdiff_t parent;
  };

  beam_result result;
  detail::beam_sequences<Cache> owned{cache, {}};
  detail::hypothesis_set done(B);
  std::vector<tree_node> tree;
  std::vector<std::size_t> stamp;
  std::vector<beam> live, next;
  // Rows of the last forward: the model's logits when there is no processor chain, else processed copies.
  constexpr bool plain_rows = std::is_same_v<Chain, sampling::processor_chain<>>;
  matrix_view<const float> logits;
  std::vector<float> processed;                   // [n_live, vocab] (with a chain)
  std::vector<double> lse;                        // [n_live] log-sum-exp of each row
  std::vector<detail::row_entry> top;             // one beam's best tokens
  std::vector<token_id> history;              // prompt + a beam's tokens, or a candidate's tokens
  std::vector<detail::beam_candidate> cands;
  std::vector<beam_hypothesis> finished;
  std::vector<std::size_t> n_children;
  std::vector<unsigned char> taken;
  sampling::candidates workspace;
  model::batch_builder b;
  result.memory.bytes_per_token = [&] {
    if constexpr (requires { cache.bytes_per_token(); }) return static_cast<std::size_t>(cache.bytes_per_token());
    else return std::size_t{0};
  }();

  std::size_t n_cached = 0;  // prompt tokens whose K/V the first beam starts with
  kv::seq_id first;
  if (options.prefix) {
    LLMKIT_CHECK(cache.contains(*options.prefix), "beam_search: prefix sequence ", *options.prefix,
                 " is not in the cache");
    const std::size_t n_prefix = cache.n_tokens(*options.prefix);
    LLMKIT_CHECK(n_prefix <= prompt.size(), "beam_search: prefix sequence ", *options.prefix, " holds ", n_prefix,
                 " tokens, more than the ", prompt.size(), " of the prompt");
    const std::optional<kv::seq_id> s = cache.fork(*options.prefix);
    LLMKIT_CHECK(s.has_value(), "beam_search: the cache has no free sequence slot to fork the prefix");
    first = *s;
    n_cached = std::min(n_prefix, prompt.size() - 1);
    owned.ids.push_back(first);
    cache.truncate(first, n_cached);
  } else {
    first = detail::add_sequence_or_throw(cache, "beam_search");
    owned.ids.push_back(first);
  }
  live.push_back({first, -1, 0.0, {}});
  b.add(first, prompt.subspan(n_cached), static_cast<std::int32_t>(n_cached));

  auto row_of = [&](std::size_t i) -> std::span<const float> {
    if constexpr (plain_rows) return {logits.row(i).data(), vocab};
    else return {processed.data() + i * vocab, vocab};
  };
  auto run_forward = [&] {
    logits = model.forward(b.view(), cache, exec);
    ++result.n_forward_passes;
    LLMKIT_CHECK(logits.rows() == live.size() && logits.cols() == vocab, "beam_search: the model returned a [",
                 logits.rows(), ", ", logits.cols(), "] logits matrix, expected [", live.size(), ", ", vocab, "]");
    lse.resize(live.size());
    if constexpr (!plain_rows) processed.resize(live.size() * vocab);
    for (std::size_t i = 0; i < live.size(); ++i) {
      if constexpr (!plain_rows) {
        const std::span<float> row(processed.data() + i * vocab, vocab);
        history.assign(prompt.begin(), prompt.end());
        history.insert(history.end(), live[i].tokens.begin(), live[i].tokens.end());
        const sampling::sampling_context ctx{.seed = 0, .request_id = 0, .step = live[i].tokens.size(),
                                             .history = history, .n_prompt = prompt.size()};
        sampling::process_row(logits.row(i), ctx, chain, workspace, row);
      }
      lse[i] = detail::log_sum_exp(row_of(i), "beam_search");
    }
    // Memory: the cache's own figure against the distinct tokens of the beam tree.
    std::size_t held = 0, distinct = prompt.size();
    stamp.resize(tree.size(), 0);
    for (const beam& bm : live) {
      held += prompt.size() + bm.tokens.size();
      for (std::ptrdiff_t n = bm.node; n >= 0 && stamp[static_cast<std::size_t>(n)] != result.n_forward_passes;
           n = tree[static_cast<std::size_t>(n)].parent) {
        stamp[static_cast<std::size_t>(n)] = result.n_forward_passes;
        ++distinct;
      }
    }
    auto& m = result.memory;
    m.peak_tokens_held = std::max(m.peak_tokens_held, held);
    m.peak_distinct_tokens = std::max(m.peak_distinct_tokens, distinct);
    if constexpr (requires { cache.usage().bytes_in_use; }) {
      const std::size_t in_use = cache.usage().bytes_in_use;
      if (in_use >= m.peak_bytes_in_use) {  // the latest step among equal peaks (the most distinct tokens)
        m.peak_bytes_in_use = in_use;
        m.distinct_tokens_at_peak = distinct;
        if (m.bytes_per_token > 0)
          m.memory_ratio = static_cast<double>(in_use) / static_cast<double>(distinct * m.bytes_per_token);
      }
    }
    if constexpr (requires { cache.pool().n_used(); })
      m.peak_blocks_in_use = std::max(m.peak_blocks_in_use, static_cast<std::size_t>(cache.pool().n_used()));
  };
  run_forward();

  // Whether a beam's tokens followed by `token` end the sequence by EOS or a stop sequence.
  auto ends_sequence = [&](const beam& parent, token_id token) -> std::optional<finish_reason> {
    if (options.stop.is_eos(token)) return finish_reason::eos;
    if (options.stop.stop_sequences.empty()) return std::nullopt;
    history.assign(parent.tokens.begin(), parent.tokens.end());
    history.push_back(token);
    const auto why = options.stop.check(history);
    if (why && *why != finish_reason::max_tokens) return why;
    return std::nullopt;
  };

  for (;;) {
    // Candidates: each beam's best `per_beam` tokens hold the global best 2B; widen to the whole
    // vocabulary in the rare case that more than B of those end their sequence.
    std::size_t n_next = 0;
    for (std::size_t per_beam = std::min(vocab, 2 * B);; per_beam = vocab) {
      cands.clear();
      for (std::size_t i = 0; i < live.size(); ++i) {
        detail::top_entries(row_of(i), per_beam, top);
        for (const detail::row_entry& e : top)
          cands.push_back({live[i].logprob + (static_cast<double>(e.value) - lse[i]), i, e.index});
      }
      std::sort(cands.begin(), cands.end(), detail::better);
      n_next = 0;
      finished.clear();
      for (std::size_t rank = 0; rank < cands.size() && n_next < B; ++rank) {
        const detail::beam_candidate& c = cands[rank];
        const beam& parent = live[c.beam];
        if (const auto why = ends_sequence(parent, c.token)) {
          if (rank < B) {
            std::vector<token_id> tokens(parent.tokens);
            tokens.push_back(c.token);
            const std::size_t len = tokens.size();
            finished.push_back({std::move(tokens), c.score, detail::length_normalised(c.score, len, alpha), *why});
          }
          continue;
        }
        // `node` holds the parent's index until the KV step below; token vectors are reused across steps.
        if (next.size() <= n_next) next.emplace_back();
        beam& child = next[n_next++];
        child.seq = parent.seq;
        child.node = static_cast<std::ptrdiff_t>(c.beam);
        child.logprob = c.score;
        child.tokens.assign(parent.tokens.begin(), parent.tokens.end());
        child.tokens.push_back(c.token);
      }
      if (n_next == B || per_beam == vocab) break;
    }
    next.resize(n_next);
    for (beam_hypothesis& h : finished) done.add(std::move(h));
    ++result.n_steps;

    const std::size_t n_generated = result.n_steps;
    if (next.empty()) break;
    if (n_generated >= max_new) {
      for (beam& bm : next)
        done.add({bm.tokens, bm.logprob, detail::length_normalised(bm.logprob, bm.tokens.size(), alpha),
                  finish_reason::max_tokens});
      break;
    }
    if (options.stopping == early_stopping::when_n_done && done.full()) break;
    if (options.stopping == early_stopping::when_no_better && done.full()) {
      double best_possible = -std::numeric_limits<double>::infinity();
      for (const beam& bm : next) {
        const std::size_t n = alpha > 0.0 ? max_new : bm.tokens.size() + 1;
        best_possible = std::max(best_possible, detail::length_normalised(bm.logprob, n, alpha));
      }
      if (best_possible <= done.worst()) break;
    }

    // KV: reuse each chosen parent's sequence once, fork it for further children, free the rest.
    n_children.assign(live.size(), 0);
    for (const beam& bm : next) ++n_children[static_cast<std::size_t>(bm.node)];
    if (!options.copy_all_beams)
      for (std::size_t i = 0; i < live.size(); ++i)
        if (n_children[i] == 0) cache.free(live[i].seq);
    taken.assign(live.size(), options.copy_all_beams ? 1 : 0);
    for (beam& bm : next) {
      const auto parent = static_cast<std::size_t>(bm.node);
      if (!taken[parent]) {
        taken[parent] = 1;
      } else {
        const std::optional<kv::seq_id> child = cache.fork(live[parent].seq);
        LLMKIT_CHECK(child.has_value(), "beam_search: the cache has no free sequence slot to fork beam ", parent,
                     " (beam_width ", B, ")");
        ++result.n_forks;
        owned.ids.push_back(*child);
        bm.seq = *child;
      }
      tree.push_back({live[parent].node});
      bm.node = static_cast<std::ptrdiff_t>(tree.size() - 1);
    }
    if (options.copy_all_beams)
      for (const beam& bm : live) cache.free(bm.seq);
    std::erase_if(owned.ids, [&](kv::seq_id s) { return !cache.contains(s); });
    live.swap(next);
    b.clear();
    for (const beam& bm : live)
      b.add(bm.seq, {&bm.tokens.back(), 1}, static_cast<std::int32_t>(cache.n_tokens(bm.seq)));
    run_forward();
  }

  result.hypotheses = done.take_sorted();
  if (result.hypotheses.size() > n_best) result.hypotheses.resize(n_best);
  return result;
}

}  // namespace llmkit::search
