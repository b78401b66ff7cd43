// SPDX-License-Identifier: MIT
#pragma once

/// @file examples/server/engine_backend_impl.hpp
/// llmkit-server's backend on llmkit::serve::engine: continuous batching
/// with chunked prefill, prefix reuse through a `kv::prefix_cache` of
/// element type T, n samples forking their prompt's blocks. `backend`
/// follows the engine's contract, so every call maps one to one. Included
/// only by engine_backend_{f32,f16,bf16,int8}.cpp (one engine per
/// translation unit); programs use engine_backend.hpp's factory.

#include <llmkit/core/executor.hpp>
#include <llmkit/kv/prefix_cache.hpp>
#include <llmkit/model/llama.hpp>
#include <llmkit/serve/engine.hpp>

#include <algorithm>

#include "engine_backend.hpp"
#include "gguf_backend.hpp"

namespace llmkit_server {

/// See the file comment.
template <llmkit::kv::kv_storage T>
class engine_backend final : public gguf_backend {
 public:
  static constexpr std::size_t block_tokens = 16;
  using cache_type = llmkit::kv::prefix_cache<T, block_tokens>;
  using engine_type = llmkit::serve::engine<llmkit::model::llama_model, cache_type, llmkit::thread_pool>;

  explicit engine_backend(const engine_backend_options& o)
      : gguf_backend(o.model_path, o.chat_template,
                     o.parse_special ? user_special_tokens::parsed : user_special_tokens::text),
        model_(file_, o.model),
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

  serve::submit_result submit(serve::generation_request r) override { return engine_.submit(std::move(r)); }

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
