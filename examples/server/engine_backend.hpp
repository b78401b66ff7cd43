// SPDX-License-Identifier: MIT
#pragma once

/// @file examples/server/engine_backend.hpp
/// llmkit-server's backend on llmkit::serve::engine: continuous batching
/// with chunked prefill, prefix reuse through a `kv::prefix_cache`, n
/// samples forking their prompt's blocks. `backend` follows the engine's
/// contract, so every call maps one to one.

#include <llmkit/core/executor.hpp>
#include <llmkit/kv/prefix_cache.hpp>
#include <llmkit/model/llama.hpp>
#include <llmkit/serve/engine.hpp>

#include <algorithm>

#include "gguf_backend.hpp"

namespace llmkit_server {

/// Options of `engine_backend`.
struct engine_backend_options {
  std::string model_path;
  std::size_t n_ctx = 0;         ///< 0: the model's context length
  std::size_t threads = 1;       ///< forward-pass threads
  std::size_t max_queue = 64;    ///< waiting samples before submit answers queue_full
  std::size_t max_batch = 8;     ///< samples running at once
  std::size_t kv_blocks = 0;     ///< 16-token KV blocks in the pool; 0 = max_batch full contexts
  std::string chat_template{};   ///< built-in template name; empty: the model's own, if any  /// Special-token texts in prompts and message contents become control
  /// tokens (`--parse-special`; trusted callers only). Default: they stay text.
  bool parse_special = false;
};

/// See the file comment.
class engine_backend final : public gguf_backend {
 public:
  static constexpr std::size_t block_tokens = 16;
  using cache_type = llmkit::kv::prefix_cache<float, block_tokens>;
  using engine_type = llmkit::serve::engine<llmkit::model::llama_model, cache_type, llmkit::thread_pool>;

  explicit engine_backend(const engine_backend_options& o)
      : gguf_backend(o.model_path, o.chat_template,
                     o.parse_special ? user_special_tokens::parsed : user_special_tokens::text),
        model_(file_),
        pool_(std::max<std::size_t>(o.threads, 1)),
        info_(describe(o.model_path, o.n_ctx, model_.config())),
        cache_(model_.kv_shape(),
               {.n_blocks = o.kv_blocks != 0 ? o.kv_blocks
                                             : std::max<std::size_t>(o.max_batch, 1) *
                                                   ((info_.n_ctx + block_tokens - 1) / block_tokens)}),
        engine_(model_, cache_, pool_,
                {.max_context = static_cast<std::int64_t>(info_.n_ctx),
                 .policy = {.max_batch_seqs = static_cast<std::int64_t>(std::max<std::size_t>(o.max_batch, 1)),
                            .max_step_tokens = 512,
                            .chunked_prefill = true},
                 .max_queued = o.max_queue},
                &tok_) {
    engine_.start();
  }
  ~engine_backend() override { engine_.stop(llmkit::serve::shutdown_mode::cancel); }

  const backend_model_info& info() const override { return info_; }

  submit_result submit(backend_request r) override {
    namespace serve = llmkit::serve;
    auto on_event = std::move(r.on_event);
    const serve::submit_result s = engine_.submit(
        {.prompt = std::move(r.prompt),
         .sampling = std::move(r.sampling),
         .seed = r.seed,
         .stream = r.stream,
         .stop = std::move(r.stop),
         .top_logprobs = r.top_logprobs,
         .n = r.n,
         .on_event = [on_event = std::move(on_event)](const serve::stream_event& e) {
           if (!on_event) return;
           backend_event b{.kind = e.type == serve::event_type::token ? backend_event::type::token
                                                                      : backend_event::type::finish,
                           .index = e.index,
                           .text = e.text,
                           .token = e.token,
                           .logprob = e.logprob};
           for (const auto& t : e.top_logprobs) b.top_logprobs.emplace_back(t.token, t.logprob);
           b.finish = static_cast<finish_kind>(static_cast<std::uint8_t>(e.finish));
           b.error = e.error;
           b.n_prompt_tokens = e.usage.n_prompt_tokens;
           b.n_generated_tokens = e.usage.n_generated_tokens;
           on_event(b);
         }});
    submit_result out{.handle = s.handle, .message = s.message};
    switch (s.status) {
      case serve::submit_status::accepted: out.status = submit_status::accepted; break;
      case serve::submit_status::queue_full:
      case serve::submit_status::staging_full: out.status = submit_status::queue_full; break;
      case serve::submit_status::invalid: out.status = submit_status::invalid; break;
      case serve::submit_status::shutting_down: out.status = submit_status::shutting_down; break;
    }
    return out;
  }

  void cancel(request_id handle) override { engine_.cancel(handle); }
  void cancel_all() override { engine_.cancel_all(); }

  backend_stats stats() const override {
    const auto s = engine_.stats();
    return {.n_queued = s.n_queued,
            .n_running = s.n_running,
            .kv_blocks_used = s.kv_blocks_used,
            .kv_blocks_free = s.kv_blocks_free + s.kv_blocks_cached};
  }

 private:
  llmkit::model::llama_model model_;
  llmkit::thread_pool pool_;
  backend_model_info info_;
  cache_type cache_;
  engine_type engine_;
};

}  // namespace llmkit_server
