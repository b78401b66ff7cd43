// SPDX-License-Identifier: MIT
#pragma once

/// @file examples/server/engine_backend_impl.hpp
/// llmkit-server's backend on llmkit::serve::engine: continuous batching
/// with chunked prefill, prefix reuse through a `kv::prefix_cache` of
/// element type T (or, for a model with local layers, their KV in rings of
/// the window beside a paged cache of the global layers, without prefix
/// reuse: a reused prefix would need the local layers' rows at the cut,
/// which a ring has overwritten), n samples forking their prompt's blocks, and
/// speculative decoding (`--draft`) with prompt lookup or a draft model in
/// a paged cache of its own. `backend`
/// follows the engine's contract, so every call maps one to one. Included
/// only by engine_backend_{f32,f16,bf16,int8}.cpp (one engine per
/// translation unit); programs use engine_backend.hpp's factory.

#include <llmkit/core/executor.hpp>
#include <llmkit/kv/paged_cache.hpp>
#include <llmkit/kv/prefix_cache.hpp>
#include <llmkit/model/llama.hpp>
#include <llmkit/model/window_cache.hpp>
#include <llmkit/serve/engine.hpp>
#include <llmkit/serve/model_draft.hpp>

#include <algorithm>
#include <atomic>
#include <concepts>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>

#include "engine_backend.hpp"
#include "gguf_backend.hpp"

namespace llmkit_server {

/// Tokens per KV block of the engine backend's caches.
inline constexpr std::size_t engine_block_tokens = 16;

/// See the file comment. `Cache`: `kv::prefix_cache<T, 16>` or
/// `model::paged_window_cache<T, 16>`.
template <llmkit::kv::kv_storage T, class Cache = llmkit::kv::prefix_cache<T, engine_block_tokens>>
class engine_backend final : public gguf_backend {
 public:
  static constexpr std::size_t block_tokens = engine_block_tokens;
  using cache_type = Cache;
  /// Local layers in rings (no prefix reuse).
  static constexpr bool windowed = std::same_as<Cache, llmkit::model::paged_window_cache<T, block_tokens>>;
  /// Tokens one engine step prefills at most (a ring's max_grow).
  static constexpr std::size_t max_step_tokens = 512;
  using engine_type = llmkit::serve::engine<llmkit::model::llama_model, cache_type, llmkit::thread_pool>;

  explicit engine_backend(const engine_backend_options& o)
      : gguf_backend(o.model_path, o.chat_template,
                     o.parse_special ? user_special_tokens::parsed : user_special_tokens::text),
        model_(file_, o.model),
        pool_(std::max<std::size_t>(o.threads, 1)),
        info_(describe(o.model_path, o.n_ctx, model_.config())),
        cache_(make_cache(model_.config(), o.kv_blocks != 0 ? o.kv_blocks
                                                            : std::max<std::size_t>(o.max_batch, 1) *
                                                                  ((info_.n_ctx + block_tokens - 1) / block_tokens))),
        draft_(make_draft(o)),
        engine_(model_, cache_, pool_,
                {.max_context = static_cast<std::int64_t>(info_.n_ctx),
                 .policy = {.max_batch_seqs = static_cast<std::int64_t>(std::max<std::size_t>(o.max_batch, 1)),
                            .max_step_tokens = static_cast<std::int64_t>(max_step_tokens),
                            .chunked_prefill = true},
                 .max_queued = o.max_queue,
                 .on_step = [this](const serve::step_report&) { note_kv_bytes(); },
                 .draft_model = draft_ ? &draft_->drafter : nullptr,
                 .max_draft_tokens = max_draft_tokens,
                 .max_drafting_decodes = o.draft_max_decodes.value_or(serve::engine_options{}.max_drafting_decodes),
                 .max_model_drafting_decodes =
                     o.draft_max_decodes.value_or(serve::engine_options{}.max_model_drafting_decodes)},
                &tok_) {
    info_.kv_layout = windowed ? "local layers in rings of " + std::to_string(model_.config().sliding_window) +
                                     " positions, no prefix reuse"
                               : std::string("paged, prefix reuse");
    engine_.start();
  }
  ~engine_backend() override { engine_.stop(llmkit::serve::shutdown_mode::cancel); }

  const backend_model_info& info() const override { return info_; }

  serve::submit_result submit(serve::generation_request r) override { return engine_.submit(std::move(r)); }

  /// Most guesses a request may ask for (`speculative.n_max`).
  static constexpr std::size_t max_draft_tokens = 16;

  void cancel(request_id handle) override { engine_.cancel(handle); }
  void cancel_all() override { engine_.cancel_all(); }

  backend_stats stats() const override {
    const auto s = engine_.stats();
    return {.n_queued = s.n_queued,
            .n_running = s.n_running,
            .kv_blocks_used = s.kv_blocks_used,
            .kv_blocks_free = s.kv_blocks_free + s.kv_blocks_cached,
            .kv_bytes_peak = kv_bytes_peak_.load(std::memory_order_relaxed)};
  }

 private:
  // Rings are allocated per live sequence, so their count needs no bound
  // beyond the engine's own; a rollback of speculative decoding is at most
  // max_draft_tokens.
  static Cache make_cache(const llmkit::model::llama_config& c, std::size_t n_blocks) {
    if constexpr (windowed)
      return llmkit::model::make_paged_window_cache<T, block_tokens>(
          c, n_blocks, std::numeric_limits<std::int32_t>::max(), max_step_tokens, max_draft_tokens);
    else
      return Cache(c.kv_shape(), {.n_blocks = n_blocks});
  }

  using draft_cache_type = llmkit::kv::paged_cache<float, block_tokens>;
  // A draft model, its cache and the engine's drafter on them.
  struct draft_parts {
    std::optional<llmkit::model::gguf_file> file;  // a separate GGUF draft; none for the self-draft
    llmkit::model::llama_model model;
    draft_cache_type cache;
    llmkit::serve::model_draft<llmkit::model::llama_model, draft_cache_type, llmkit::thread_pool> drafter;
    draft_parts(std::optional<llmkit::model::gguf_file> f, const llmkit::model::gguf_file& weights,
                const llmkit::model::llama_options& lo, std::size_t n_blocks, llmkit::thread_pool& pool)
        : file(std::move(f)), model(file ? *file : weights, lo), cache(model.kv_shape(), {.n_blocks = n_blocks}),
          drafter(model, cache, pool) {}
  };
  // "self": the target's weights as Q8_0 with int8 activations; a path: that GGUF as stored.
  std::unique_ptr<draft_parts> make_draft(const engine_backend_options& o) {
    if (o.draft.empty() || o.draft == "ngram") return nullptr;
    const std::size_t n_blocks = std::max<std::size_t>(o.max_batch, 1) * ((info_.n_ctx + block_tokens - 1) / block_tokens);
    if (o.draft == "self")
      return std::make_unique<draft_parts>(
          std::nullopt, file_,
          llmkit::model::llama_options{.weight_type = llmkit::model::weight_type::q8_0,
                                       .activations = llmkit::model::activation_type::q8_0},
          n_blocks, pool_);
    auto d = std::make_unique<draft_parts>(llmkit::model::gguf_file::open(o.draft), file_,
                                           llmkit::model::llama_options{}, n_blocks, pool_);
    LLMKIT_CHECK(d->model.vocab_size() == model_.vocab_size(), "--draft ", o.draft, ": its vocabulary has ",
                 d->model.vocab_size(), " tokens, the model's ", model_.vocab_size());
    return d;
  }

  // On the step thread, which alone touches the cache.
  void note_kv_bytes() {
    const std::size_t bytes = cache_.usage().bytes_allocated;
    if (bytes > kv_bytes_peak_.load(std::memory_order_relaxed)) kv_bytes_peak_.store(bytes, std::memory_order_relaxed);
  }

  llmkit::model::llama_model model_;
  llmkit::thread_pool pool_;
  backend_model_info info_;
  cache_type cache_;
  std::unique_ptr<draft_parts> draft_;
  std::atomic<std::size_t> kv_bytes_peak_{0};
  engine_type engine_;
};

/// The engine backend of element type T for `o`: on a paged_window_cache
/// when the model has local and global layers and `o.window` is ring, on a
/// prefix_cache otherwise. @throws llmkit::error for an unreadable model file
template <llmkit::kv::kv_storage T>
std::unique_ptr<backend> make_engine_backend_for(const engine_backend_options& o) {
  const auto config = llmkit::model::llama_config::from_gguf(llmkit::model::gguf_file::open(o.model_path));
  if (llmkit_examples::kv_layout_of(config, o.window) == llmkit_examples::kv_layout::hybrid)
    return std::make_unique<engine_backend<T, llmkit::model::paged_window_cache<T, engine_block_tokens>>>(o);
  return std::make_unique<engine_backend<T>>(o);
}

}  // namespace llmkit_server
