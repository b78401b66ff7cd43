// SPDX-License-Identifier: MIT
#pragma once

/// @file examples/server/serial_backend.hpp
/// The interim backend of llmkit-server: one request at a time on one
/// thread, with llmkit's existing pieces (llama_model, a contiguous KV cache
/// per request, the run-time sampling chain with Philox per request, the
/// tokenizer and chat templates, serve::text_stream for the text deltas and
/// stop strings). It keeps the HTTP layer runnable end to end with the
/// fewest moving parts, behind the same `backend` interface as the serving
/// engine, and its events are the engine's. Its "KV blocks" are the running
/// request's cache counted in 16-token units.

#include <llmkit/core/executor.hpp>
#include <llmkit/kv/contiguous_cache.hpp>
#include <llmkit/model/batch.hpp>
#include <llmkit/model/llama.hpp>
#include <llmkit/sampling/candidates.hpp>
#include <llmkit/sampling/context.hpp>
#include <llmkit/sampling/logprobs.hpp>
#include <llmkit/sampling/runtime_chain.hpp>
#include <llmkit/serve/text_stream.hpp>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <set>
#include <thread>

#include "gguf_backend.hpp"

namespace llmkit_server {

/// Options of `serial_backend`.
struct serial_backend_options {
  std::string model_path;
  std::size_t n_ctx = 0;      ///< 0: the model's context length
  std::size_t threads = 1;    ///< forward-pass threads
  std::size_t max_queue = 64; ///< waiting requests before submit answers queue_full
  std::string chat_template{};  ///< built-in template name; empty: the model's own, if any
  /// Special-token texts in prompts and message contents become control
  /// tokens (`--parse-special`; trusted callers only). Default: they stay text.
  bool parse_special = false;
  /// How the model is loaded (activations, weights in place, mlock).
  llmkit::model::llama_options model{};
};

/// See the file comment.
class serial_backend final : public gguf_backend {
 public:
  explicit serial_backend(const serial_backend_options& o)
      : gguf_backend(o.model_path, o.chat_template,
                     o.parse_special ? user_special_tokens::parsed : user_special_tokens::text),
        options_(o),
        model_(file_, o.model),
        pool_(std::max<std::size_t>(o.threads, 1)),
        info_(describe(o.model_path, o.n_ctx, model_.config())) {
    worker_ = std::thread([this] { loop(); });
  }
  ~serial_backend() override {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    cancel_all();
    wake_.notify_all();
    worker_.join();
  }

  const backend_model_info& info() const override { return info_; }

  serve::submit_result submit(serve::generation_request r) override {
    using serve::submit_status;
    job j;
    serve::submit_result out;
    if (r.prompt.empty() || r.prompt.size() + r.stop.max_new_tokens > info_.n_ctx)
      out = {.status = submit_status::invalid, .message = "the prompt and max_new_tokens must fit the context"};
    if (r.beam)
      out = {.status = submit_status::invalid,
             .message = "beam search ('use_beam_search') needs the engine backend (--backend engine)"};
    if (r.grammar)
      out = {.status = submit_status::invalid,
             .message = "structured output (response_format, grammar, json_schema) needs the engine backend "
                        "(--backend engine)"};
    for (const token_id t : r.prompt)
      if (out.accepted() && (t < 0 || static_cast<std::size_t>(t) >= info_.n_vocab))
        out = {.status = submit_status::invalid,
               .message = "prompt token " + std::to_string(t) + " is not in the vocabulary"};
    if (out.accepted()) {
      try {
        r.stop.validate("stop");
        j.chain = llmkit::sampling::runtime_chain::parse(r.sampling);
      } catch (const std::exception& e) {
        out = {.status = submit_status::invalid, .message = e.what()};
      }
    }
    const std::size_t n = std::max<std::size_t>(r.n, 1);
    {
      std::lock_guard lock(mutex_);
      out.handle = last_handle_ + 1;
      last_handle_ += static_cast<request_id>(n);
      if (out.accepted() && stopping_) out.status = submit_status::shutting_down;
      if (out.accepted() && n_queued_ + n > options_.max_queue) out.status = submit_status::queue_full;
      if (out.accepted()) {
        j.handle = out.handle;
        j.request = std::move(r);
        queue_.push_back(std::move(j));
        n_queued_ += n;
        wake_.notify_one();
        return out;
      }
    }
    // Rejected: each sample's error finish, on this thread, before returning.
    j.handle = out.handle;
    j.request = std::move(r);
    for (std::size_t i = 0; i < n; ++i) finish(j, i, serve::finish_kind::error, {}, 0, out.message);
    return out;
  }

  void cancel(request_id handle) override {
    std::unique_lock lock(mutex_);
    const auto it = std::find_if(queue_.begin(), queue_.end(), [&](const job& j) { return j.contains(handle); });
    if (it == queue_.end()) {
      if (running_.contains(handle)) cancelled_.insert(handle);
      return;
    }
    cancelled_.insert(handle);
    // A queued request whose samples are all cancelled ends now.
    for (std::size_t i = 0; i < it->n(); ++i)
      if (!cancelled_.contains(it->handle + static_cast<request_id>(i))) return;
    job j = std::move(*it);
    queue_.erase(it);
    n_queued_ -= j.n();
    for (std::size_t i = 0; i < j.n(); ++i) cancelled_.erase(j.handle + static_cast<request_id>(i));
    lock.unlock();
    for (std::size_t i = 0; i < j.n(); ++i)
      finish(j, i, serve::finish_kind::cancelled, llmkit::finish_reason::cancelled, 0);
  }

  void cancel_all() override {
    std::deque<job> dropped;
    {
      std::lock_guard lock(mutex_);
      dropped.swap(queue_);
      n_queued_ = 0;
      for (const auto& j : dropped)
        for (std::size_t i = 0; i < j.n(); ++i) cancelled_.erase(j.handle + static_cast<request_id>(i));
      for (std::size_t i = 0; i < running_.n(); ++i) cancelled_.insert(running_.handle + static_cast<request_id>(i));
    }
    for (auto& j : dropped)
      for (std::size_t i = 0; i < j.n(); ++i)
        finish(j, i, serve::finish_kind::cancelled, llmkit::finish_reason::cancelled, 0);
  }

  backend_stats stats() const override {
    std::lock_guard lock(mutex_);
    const std::size_t total = (info_.n_ctx + block_tokens - 1) / block_tokens;
    return {.n_queued = n_queued_ + running_waiting_,
            .n_running = running_.handle != 0 ? 1u : 0u,
            .kv_blocks_used = kv_blocks_used_,
            .kv_blocks_free = total - std::min(total, kv_blocks_used_)};
  }

 private:
  static constexpr std::size_t block_tokens = 16;

  struct job {
    request_id handle = 0;  // of sample 0
    serve::generation_request request;
    llmkit::sampling::runtime_chain chain;
    std::size_t n() const { return std::max<std::size_t>(request.n, 1); }
    bool contains(request_id h) const {
      return handle != 0 && h >= handle && h < handle + static_cast<request_id>(n());
    }
  };

  /// Handles of the job on the worker (handle 0: none).
  struct running_span {
    request_id handle = 0;
    std::size_t count = 0;
    std::size_t n() const { return count; }
    bool contains(request_id h) const {
      return handle != 0 && h >= handle && h < handle + static_cast<request_id>(count);
    }
  };

  // Sample `index`'s finish event; `text` is the rest of its output, if any.
  static void finish(const job& j, std::size_t index, serve::finish_kind kind,
                     std::optional<llmkit::finish_reason> reason, std::size_t n_generated, std::string error = {},
                     std::string text = {}) {
    serve::stream_event e;
    e.handle = j.handle + static_cast<request_id>(index);
    e.index = index;
    e.type = serve::event_type::finish;
    e.text = std::move(text);
    e.finish = kind;
    e.reason = reason;
    e.error = std::move(error);
    e.usage.n_prompt_tokens = j.request.prompt.size();
    e.usage.n_generated_tokens = n_generated;
    if (j.request.on_event) j.request.on_event(e);
  }

  void loop() {
    while (true) {
      job j;
      {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;
        j = std::move(queue_.front());
        queue_.pop_front();
        n_queued_ -= j.n();
        running_ = {j.handle, j.n()};
        running_waiting_ = j.n();
      }
      // The samples one after another, each from its own random stream.
      for (std::size_t i = 0; i < j.n(); ++i) {
        {
          std::lock_guard lock(mutex_);
          --running_waiting_;
        }
        run(j, i);
        std::lock_guard lock(mutex_);
        cancelled_.erase(j.handle + static_cast<request_id>(i));
        kv_blocks_used_ = 0;
      }
      std::lock_guard lock(mutex_);
      running_ = {};
    }
  }

  void set_kv_tokens(std::size_t n_tokens) {
    std::lock_guard lock(mutex_);
    kv_blocks_used_ = (n_tokens + block_tokens - 1) / block_tokens;
  }

  bool cancelled(request_id h) {
    std::lock_guard lock(mutex_);
    return cancelled_.contains(h);
  }

  void run(const job& j, std::size_t index) {
    const serve::generation_request& r = j.request;
    const request_id handle = j.handle + static_cast<request_id>(index);
    std::size_t n_generated = 0;
    if (cancelled(handle)) return finish(j, index, serve::finish_kind::cancelled, llmkit::finish_reason::cancelled, 0);
    try {
      llmkit::kv::contiguous_cache<float> cache(model_.kv_shape(),
                                                {.max_sequences = 1, .max_tokens = r.prompt.size() + r.stop.max_new_tokens});
      const llmkit::kv::seq_id seq = *cache.add_sequence();
      llmkit::sampling::sampling_state state(r.seed, r.stream + index, r.prompt);
      llmkit::sampling::candidates cands;
      std::vector<llmkit::sampling::token_logprob> top(r.top_logprobs);
      std::vector<token_id> generated;
      serve::text_stream text;

      llmkit::model::batch_builder b;
      b.add(seq, r.prompt, 0);
      auto logits = model_.forward(b.view(), cache, pool_);
      while (true) {
        set_kv_tokens(cache.n_tokens(seq));
        cands.reset_copy(logits.row(0));
        const auto ctx = state.context();
        j.chain.apply(cands, ctx);
        serve::stream_event e;
        e.handle = handle;
        e.index = index;
        if (!top.empty()) {
          const std::size_t n_top = llmkit::sampling::top_logprobs(cands, top);
          e.top_logprobs.assign(top.begin(), top.begin() + static_cast<std::ptrdiff_t>(n_top));
        }
        const auto drawn = j.chain.sample(cands, ctx);
        state.accept(drawn.token);
        generated.push_back(drawn.token);
        ++n_generated;
        // The engine's rules: a token rule (EOS, stop sequence) wins over a
        // stop string, which wins over the budget.
        std::optional<llmkit::finish_reason> reason = r.stop.check(generated);
        if (!r.stop.is_eos(drawn.token)) {
          serve::text_stream::delta d = text.push(tok_, drawn.token, r.stop);
          e.text = std::move(d.text);
          if (d.stop_string && (!reason || *reason == llmkit::finish_reason::max_tokens))
            reason = llmkit::finish_reason::stop_string;
        }
        e.token = drawn.token;
        e.logprob = drawn.logprob;
        if (r.on_event) r.on_event(e);
        if (!reason && cancelled(handle)) reason = llmkit::finish_reason::cancelled;
        if (reason) {
          // Held-back text is final unless a stop string cut it.
          std::string rest = *reason == llmkit::finish_reason::stop_string ? std::string() : text.flush();
          return finish(j, index, serve::kind_of(*reason), reason, n_generated, {}, std::move(rest));
        }
        b.clear();
        b.add(seq, {&drawn.token, 1}, static_cast<std::int32_t>(cache.n_tokens(seq)));
        logits = model_.forward(b.view(), cache, pool_);
      }
    } catch (const std::exception& e) {
      finish(j, index, serve::finish_kind::error, std::nullopt, n_generated, e.what());
    }
  }

  serial_backend_options options_;
  llmkit::model::llama_model model_;
  llmkit::thread_pool pool_;
  backend_model_info info_;

  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<job> queue_;
  std::size_t n_queued_ = 0;        // samples in queue_
  std::size_t running_waiting_ = 0; // samples of the running job not started yet
  request_id last_handle_ = 0;
  running_span running_;
  std::set<request_id> cancelled_;  // cancelled samples not finished yet
  bool stopping_ = false;
  std::size_t kv_blocks_used_ = 0;
  std::thread worker_;
};

}  // namespace llmkit_server
