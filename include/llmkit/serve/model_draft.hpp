// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/serve/model_draft.hpp
/// A draft model for an engine (`engine_options::draft_model`): a model of
/// the same vocabulary (a smaller GGUF, or the target's own int8 or
/// layer-skip self-draft, search/self_draft.hpp) in a KV cache of its own,
/// one sequence per drafting request, that guesses greedily (arg-max of
/// its raw logits, lowest id on ties) for all the step's drafting requests
/// in batched forwards: one that catches every request up with its
/// context, then one per further guess.
///
/// Each call rolls a request's draft sequence back to the longest prefix
/// it shares with the request's context (its rejected guesses go; at least
/// the newest token is fed again, for its logits), so the draft cache
/// follows the accepted tokens without being told. A request whose draft
/// sequence does not fit the draft cache's free blocks gets no guesses in
/// that step and gives its sequence up (its plain decode goes on); every
/// request of a step whose draft forward fails gets none either.
///
/// ```
/// model::llama_model draft(model::gguf_file(search::self_draft_gguf(target_file, {.int8_weights = true})));
/// kv::paged_cache<float, 16> draft_cache(draft.kv_shape(), {.n_blocks = 1024});
/// serve::model_draft drafter(draft, draft_cache, pool);
/// serve::engine eng(model, cache, pool, {.draft_model = &drafter});
/// ```

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <limits>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "llmkit/core/executor.hpp"
#include "llmkit/core/ids.hpp"
#include "llmkit/core/views.hpp"
#include "llmkit/model/batch.hpp"
#include "llmkit/model/language_model.hpp"
#include "llmkit/serve/draft.hpp"

namespace llmkit::serve {

/// See the file comment. Holds references to the model, its cache and the
/// executor, which must outlive it.
template <class Model, class Cache, executor Exec = serial_executor>
  requires model::language_model<Model, Cache, Exec> && requires(Cache& c, kv::seq_id s, std::size_t n) {
    { c.add_sequence() } -> std::same_as<std::optional<kv::seq_id>>;
    c.truncate(s, n);
    c.free(s);
  }
class model_draft final : public batch_drafter {
 public:
  model_draft(Model& model, Cache& cache, Exec& exec) : model_(model), cache_(cache), exec_(exec) {}
  model_draft(const model_draft&) = delete;
  model_draft& operator=(const model_draft&) = delete;
  ~model_draft() override {
    for (auto& [h, s] : seqs_) cache_.free(s.seq);
  }

  void propose(std::span<const draft_job> jobs) noexcept override {
    active_.clear();
    batch_.clear();
    std::size_t free = free_blocks();
    for (const draft_job& job : jobs) {
      job.out->clear();
      if (job.max_tokens == 0 || job.context.empty()) continue;
      auto it = seqs_.find(job.handle);
      if (it == seqs_.end()) {
        const std::optional<kv::seq_id> seq = cache_.add_sequence();
        if (!seq) continue;
        it = seqs_.emplace(job.handle, state{*seq, {}}).first;
      }
      state& s = it->second;
      std::size_t keep = 0;
      while (keep < s.cached.size() && keep < job.context.size() && s.cached[keep] == job.context[keep]) ++keep;
      keep = std::min(keep, job.context.size() - 1);
      cache_.truncate(s.seq, keep);
      // The blocks its guesses take (the last guess is never fed); a job that does not fit gives up its sequence.
      const std::size_t need = blocks(job.context.size() + job.max_tokens - 1) - blocks(keep);
      if (need > free) {
        drop(job.handle);
        continue;
      }
      free -= need;
      s.cached.assign(job.context.begin(), job.context.end());  // cached once this round's forward ran
      batch_.add(s.seq, job.context.subspan(keep), static_cast<std::int32_t>(keep));
      active_.push_back({&job, &s});
    }
    // Round j feeds every active request's newest token and guesses the next.
    while (!active_.empty()) {
      matrix_view<const float> logits;
      try {
        logits = model_.forward(batch_.view(), cache_, exec_);
      } catch (const std::exception&) {
        for (const auto& a : active_) {
          a.job->out->clear();
          drop(a.job->handle);
        }
        return;
      }
      batch_.clear();
      std::size_t n = 0;
      for (std::size_t r = 0; r < active_.size(); ++r) {
        const auto row = logits.row(r);
        const auto token = static_cast<token_id>(std::max_element(row.begin(), row.end()) - row.begin());
        auto [job, s] = active_[r];
        job->out->push_back(token);
        if (job->out->size() == job->max_tokens) continue;
        batch_.add(s->seq, std::span<const token_id>(&job->out->back(), 1), static_cast<std::int32_t>(s->cached.size()));
        s->cached.push_back(token);
        active_[n++] = active_[r];
      }
      active_.resize(n);
    }
  }

  void release(request_id handle) noexcept override { drop(handle); }

  /// Draft sequences held (one per drafting request that has not ended).
  std::size_t n_sequences() const noexcept { return seqs_.size(); }

 private:
  struct state {
    kv::seq_id seq;
    std::vector<token_id> cached;  // tokens whose K/V the sequence holds (after the pending forward)
  };
  struct active {
    const draft_job* job;
    state* s;
  };
  // Free blocks of a paged draft cache (or "plenty" for another cache: a
  // forward without room then fails and the step's drafts are dropped).
  std::size_t free_blocks() const {
    if constexpr (requires { cache_.pool().n_free(); })
      return cache_.pool().n_free();
    else
      return std::numeric_limits<std::size_t>::max();
  }
  static std::size_t blocks(std::size_t n_tokens) {
    if constexpr (requires { Cache::block_size; })
      return (n_tokens + Cache::block_size - 1) / Cache::block_size;
    else
      return 0;
  }
  void drop(request_id handle) noexcept {
    const auto it = seqs_.find(handle);
    if (it == seqs_.end()) return;
    cache_.free(it->second.seq);
    seqs_.erase(it);
  }

  Model& model_;
  Cache& cache_;
  Exec& exec_;
  std::unordered_map<request_id, state> seqs_;
  std::vector<active> active_;
  model::batch_builder batch_;
};

}  // namespace llmkit::serve
