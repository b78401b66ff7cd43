// SPDX-License-Identifier: MIT
#pragma once

/// @file examples/server/engine_backend.hpp
/// llmkit-server's backend on llmkit::serve::engine, as the HTTP layer
/// sees it: its options and a factory. The engine is instantiated once per
/// KV element type, each in its own translation unit
/// (engine_backend_{f32,f16,bf16,int8}.cpp on engine_backend_impl.hpp), so
/// a program that includes this header compiles none of them.

#include <llmkit/core/dtype.hpp>
#include <llmkit/model/llama.hpp>
#include <llmkit/serve/draft.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "../kv_window.hpp"
#include "backend.hpp"

namespace llmkit_server {

/// The element type of the engine's KV cache (`--kv-type`).
enum class kv_type : std::uint8_t {
  f32,   ///< float: exact
  f16,   ///< IEEE half: half the memory of f32
  bf16,  ///< bfloat16: half the memory, f32's range with 8 bits of mantissa
  int8,  ///< int8 rows with one float scale each: about a quarter of f32's memory
};

/// `--kv-type` names, in the order of `kv_type`.
inline constexpr std::array<std::string_view, 4> kv_type_names{"f32", "f16", "bf16", "int8"};

/// The kv_type called `name`, or nullopt.
constexpr std::optional<kv_type> kv_type_of(std::string_view name) noexcept {
  for (std::size_t i = 0; i < kv_type_names.size(); ++i)
    if (kv_type_names[i] == name) return static_cast<kv_type>(i);
  return std::nullopt;
}

/// Options of the engine backend.
struct engine_backend_options {
  std::string model_path;
  std::size_t n_ctx = 0;         ///< 0: the model's context length
  std::size_t threads = 1;       ///< forward-pass threads
  std::size_t max_queue = 64;    ///< waiting samples before submit answers queue_full
  std::size_t max_batch = 8;     ///< samples running at once
  std::size_t kv_blocks = 0;     ///< 16-token KV blocks in the pool; 0 = max_batch full contexts
  kv_type kv = kv_type::f16;     ///< element type of the KV cache
  /// Where a model's local (sliding-window) layers keep their KV
  /// (`--kv-window`): ring = a ring of the window per sequence
  /// (model::paged_window_cache; no prefix reuse), full = every position in
  /// the prefix cache as the global layers.
  llmkit_examples::kv_window window = llmkit_examples::kv_window::ring;
  std::string chat_template{};   ///< built-in template name; empty: the model's own, if any
  /// Special-token texts in prompts and message contents become control
  /// tokens (`--parse-special`; trusted callers only). Default: they stay text.
  bool parse_special = false;
  /// How the model is loaded (activations, weights in place, mlock).
  llmkit::model::llama_options model{};
  /// Draft source of speculative decoding (`--draft`): empty = none,
  /// "ngram" (prompt lookup), "self" (the model's own weights as int8 with
  /// int8 activations), or the path of a GGUF draft model of the same
  /// vocabulary.
  std::string draft{};
  /// Most guesses per request and step (`--draft-max`).
  std::size_t draft_max = 4;
  /// Drafting is off in steps with more decodes than this
  /// (`--draft-max-decodes`); empty: the engine's default for the drafter
  /// (`engine_options::max_drafting_decodes` for prompt lookup,
  /// `max_model_drafting_decodes` for a draft model).
  std::optional<std::size_t> draft_max_decodes{};
};

/// What a request drafts under `--draft D --draft-max k`: none for an
/// empty D, prompt lookup for "ngram", the backend's draft model otherwise.
inline llmkit::serve::speculation speculation_of(const std::string& draft, std::size_t draft_max) {
  if (draft.empty()) return {};
  return {.drafter = draft == "ngram" ? llmkit::serve::draft_source::ngram : llmkit::serve::draft_source::model,
          .max_tokens = draft_max};
}

/// The engine backend on a `kv::prefix_cache<T, 16>`, or for a model with
/// local and global layers under `kv_window::ring` on a
/// `model::paged_window_cache<T, 16>`; defined for float, llmkit::f16,
/// llmkit::bf16 and std::int8_t (one translation unit each).
template <class T>
std::unique_ptr<backend> make_engine_backend_of(const engine_backend_options& o);
template <>
std::unique_ptr<backend> make_engine_backend_of<float>(const engine_backend_options& o);
template <>
std::unique_ptr<backend> make_engine_backend_of<llmkit::f16>(const engine_backend_options& o);
template <>
std::unique_ptr<backend> make_engine_backend_of<llmkit::bf16>(const engine_backend_options& o);
template <>
std::unique_ptr<backend> make_engine_backend_of<std::int8_t>(const engine_backend_options& o);

/// The engine backend with `o.kv`'s element type.
/// @throws llmkit::error for an unreadable model file
inline std::unique_ptr<backend> make_engine_backend(const engine_backend_options& o) {
  switch (o.kv) {
    case kv_type::f32: return make_engine_backend_of<float>(o);
    case kv_type::f16: return make_engine_backend_of<llmkit::f16>(o);
    case kv_type::bf16: return make_engine_backend_of<llmkit::bf16>(o);
    case kv_type::int8: return make_engine_backend_of<std::int8_t>(o);
  }
  return nullptr;
}

}  // namespace llmkit_server
