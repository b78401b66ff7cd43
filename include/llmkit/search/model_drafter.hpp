// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/search/model_drafter.hpp
/// Drafting with a (smaller) model of the same vocabulary, in its own KV
/// cache. Each round it rolls its cache back to the longest prefix it shares
/// with the committed history (`truncate`: the guesses the target rejected
/// disappear), feeds the missing tokens in one packed forward, then guesses
/// k tokens one forward each. Its logits go through its own processor chain
/// (a copy of the request's chain is the usual choice), then:
/// - greedy verification: the guess is the arg-max (lowest id on ties);
/// - stochastic verification: the guess is drawn from q = softmax of the
///   processed logits with the request's seed on a stream of its own, and q
///   is reported for the rejection test.
///
/// A draft model made from the target itself (its first layers, or its
/// weights stored as int8) is built by llmkit/search/self_draft.hpp.

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "llmkit/core/error.hpp"
#include "llmkit/core/executor.hpp"
#include "llmkit/core/ids.hpp"
#include "llmkit/model/batch.hpp"
#include "llmkit/model/language_model.hpp"
#include "llmkit/sampling/candidates.hpp"
#include "llmkit/sampling/chain.hpp"
#include "llmkit/sampling/concepts.hpp"
#include "llmkit/sampling/context.hpp"
#include "llmkit/sampling/greedy.hpp"
#include "llmkit/sampling/rng.hpp"
#include "llmkit/search/detail/log_softmax.hpp"
#include "llmkit/search/drafter.hpp"
#include "llmkit/search/sequence_cache.hpp"

namespace llmkit::search {

/// A draft model in its own cache; satisfies `drafter`. Holds references to
/// the model, the cache and the executor its forward passes run on, which
/// must outlive it. One request at a time.
template <class Model, sequence_cache Cache, sampling::logits_processor Chain = sampling::processor_chain<>,
          executor Exec = serial_executor>
  requires model::language_model<Model, Cache, Exec>
class model_drafter {
 public:
  /// Drafts on the calling thread.
  /// @param name what reports call this drafter ("model", "layers2", "int8", ...)
  model_drafter(Model& model, Cache& cache, Chain chain = {}, std::string name = "model")
    requires std::same_as<Exec, serial_executor>
      : model_drafter(model, cache, serial_, std::move(chain), std::move(name)) {}
  /// Drafts with every forward pass on `exec`.
  model_drafter(Model& model, Cache& cache, Exec& exec, Chain chain = {}, std::string name = "model")
      : model_(&model), cache_(&cache), exec_(&exec), chain_(std::move(chain)), name_(std::move(name)) {}
  model_drafter(const model_drafter&) = delete;
  model_drafter& operator=(const model_drafter&) = delete;
  ~model_drafter() { reset(); }

  std::string_view name() const noexcept { return name_; }
  /// Forward passes of the draft model so far (catch-up passes included).
  std::size_t n_forward_passes() const noexcept { return n_forward_passes_; }

  /// Frees the draft sequence; the next propose starts from scratch.
  void reset() {
    if (seq_ && cache_->contains(*seq_)) cache_->free(*seq_);
    seq_.reset();
    cached_.clear();
  }

  /// Guesses up to r.max_tokens tokens (exactly that many).
  /// @throws llmkit::error for an empty history, a cache without room, or
  /// what the model and the chain raise.
  void propose(const draft_request& r, draft& out) {
    out.clear();
    if (r.max_tokens == 0) return;
    LLMKIT_CHECK(!r.history.empty(), "model_drafter::propose: history is empty");
    if (!seq_) seq_ = detail::add_sequence_or_throw(*cache_, "model_drafter");
    const std::size_t vocab = model_->vocab_size();
    // Keep the longest agreeing prefix, but re-feed at least the last token to get its logits.
    std::size_t keep = 0;
    while (keep < cached_.size() && keep < r.history.size() && cached_[keep] == r.history[keep]) ++keep;
    keep = std::min(keep, r.history.size() - 1);
    cache_->truncate(*seq_, keep);
    cached_.resize(keep);
    context_.assign(r.history.begin(), r.history.end());
    feed_.assign(r.history.begin() + static_cast<std::ptrdiff_t>(keep), r.history.end());
    if (r.sample) {
      row_.resize(vocab);
      q_.resize(vocab);
    }
    for (std::size_t j = 0; j < r.max_tokens; ++j) {
      model::batch_builder b;
      b.add(*seq_, feed_, static_cast<std::int32_t>(cached_.size()));
      const matrix_view<const float> logits = model_->forward(b.view(), *cache_, *exec_);
      ++n_forward_passes_;
      LLMKIT_CHECK(logits.rows() == 1 && logits.cols() == vocab, "model_drafter: the model returned a [",
                   logits.rows(), ", ", logits.cols(), "] logits matrix, expected [1, ", vocab, "]");
      cached_.insert(cached_.end(), feed_.begin(), feed_.end());
      const std::size_t position = context_.size();  // absolute index of the guessed token
      const sampling::sampling_context ctx{.seed = r.seed, .request_id = r.request_id ^ draft_stream_salt,
                                           .step = position - r.n_prompt, .history = context_,
                                           .n_prompt = r.n_prompt};
      token_id token;
      if (!r.sample) {
        token = sampling::sample_row(logits.row(0), ctx, chain_, sampling::greedy{.with_logprob = false}, workspace_).token;
      } else {
        sampling::process_row(logits.row(0), ctx, chain_, workspace_, std::span<float>(row_));
        detail::softmax(row_, q_, "model_drafter");
        const double u = sampling::philox_uniform(r.seed, r.request_id ^ draft_stream_salt, position,
                                                  static_cast<std::uint32_t>(r.round));
        double total = 0.0;
        for (double v : q_) total += v;
        token = static_cast<token_id>(detail::inverse_cdf(q_, total, u));
        out.probs.insert(out.probs.end(), q_.begin(), q_.end());
      }
      out.tokens.push_back(token);
      context_.push_back(token);
      feed_.assign(1, token);
    }
  }

 private:
  Model* model_;
  Cache* cache_;
  [[no_unique_address]] serial_executor serial_;  // what exec_ points to when no executor is given
  Exec* exec_;
  Chain chain_;
  std::string name_;
  std::optional<kv::seq_id> seq_;
  std::vector<token_id> cached_;   // tokens whose K/V the draft cache holds
  std::vector<token_id> context_;  // history + guesses of this round
  std::vector<token_id> feed_;
  std::vector<float> row_;
  std::vector<double> q_;
  sampling::candidates workspace_;
  std::size_t n_forward_passes_ = 0;
};

}  // namespace llmkit::search
