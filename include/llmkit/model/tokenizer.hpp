// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/model/tokenizer.hpp
/// `tokenizer`: the one tokenizer type engines use, whatever the model
/// file's algorithm. `tokenizer::from_gguf` reads `tokenizer.ggml.model`
/// and builds
/// - "llama": SentencePiece BPE (`sentencepiece_tokenizer`,
///   model/sentencepiece_tokenizer.hpp; Llama 1/2, Mistral, TinyLlama);
/// - "gpt2": byte-level BPE (`bpe_tokenizer`, model/bpe_tokenizer.hpp;
///   Llama 3, Qwen2), with the pre-tokenizer `tokenizer.ggml.pre` names.
///
/// ```
/// auto tok = tokenizer::from_gguf(gguf_file::open(path));
/// auto ids = tok.encode(prompt, {.add_bos = tok.add_bos_token()});
/// auto chat = tok.encode("<|eot_id|>", {.parse_special = true});  // one id
/// std::string text = tok.decode(ids);
/// ```
///
/// Both algorithms, and `tokenizer` itself, satisfy the `text_tokenizer`
/// concept. Copies are cheap and share the (immutable) vocabulary.

#include <concepts>
#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "llmkit/core/config.hpp"
#include "llmkit/core/error.hpp"
#include "llmkit/core/ids.hpp"
#include "llmkit/model/bpe_tokenizer.hpp"
#include "llmkit/model/gguf.hpp"
#include "llmkit/model/sentencepiece_tokenizer.hpp"
#include "llmkit/model/tokenizer_types.hpp"

namespace llmkit::model {

/// What engines need from a tokenizer: text to ids and back, the special
/// ids and the vocabulary.
template <class T>
concept text_tokenizer = requires(const T& t, std::string_view text, std::span<const token_id> ids, token_id id,
                                  std::string& out) {
  { t.vocab_size() } -> std::convertible_to<std::size_t>;
  { t.bos() } -> std::same_as<token_id>;
  { t.eos() } -> std::same_as<token_id>;
  { t.add_bos_token() } -> std::same_as<bool>;
  { t.encode(text, encode_options{}) } -> std::same_as<std::vector<token_id>>;
  { t.decode(ids, decode_options{}) } -> std::same_as<std::string>;
  t.decode_token(id, out, decode_options{});
  { t.token_text(id) } -> std::same_as<std::string_view>;
  { t.type(id) } -> std::same_as<token_type>;
  { t.find(text) } -> std::same_as<std::optional<token_id>>;
};

/// The algorithm behind a `tokenizer`.
enum class tokenizer_kind {
  sentencepiece,   ///< `tokenizer.ggml.model = "llama"`
  byte_level_bpe,  ///< `tokenizer.ggml.model = "gpt2"`
};

/// A tokenizer of either algorithm; see the file comment.
class tokenizer {
  // Calls f on the algorithm (defined first: the members below deduce their type from it).
  template <class F>
  decltype(auto) visit(F&& f) const {
    return std::visit(std::forward<F>(f), impl_);
  }

 public:
  using special_ids = model::special_ids;

  tokenizer(sentencepiece_tokenizer t) : impl_(std::move(t)) {}
  tokenizer(bpe_tokenizer t) : impl_(std::move(t)) {}
  /// A SentencePiece tokenizer from `[n_vocab] tokens`, `[n_vocab] scores`
  /// and `[n_vocab] types` (see `sentencepiece_tokenizer`).
  tokenizer(std::vector<std::string> tokens, std::vector<float> scores, std::vector<token_type> types,
            special_ids ids, bool add_space_prefix = true)
      : impl_(sentencepiece_tokenizer(std::move(tokens), std::move(scores), std::move(types), ids, add_space_prefix)) {}

  /// Reads `tokenizer.ggml.*` from a GGUF file; `tokenizer.ggml.model`
  /// picks the algorithm ("llama" or "gpt2"; anything else raises
  /// `llmkit::error` naming it).
  static tokenizer from_gguf(const gguf_file& file);

  tokenizer_kind kind() const noexcept {
    return impl_.index() == 0 ? tokenizer_kind::sentencepiece : tokenizer_kind::byte_level_bpe;
  }
  /// The algorithm itself, or nullptr when the tokenizer is of the other kind.
  const sentencepiece_tokenizer* sentencepiece() const noexcept { return std::get_if<sentencepiece_tokenizer>(&impl_); }
  const bpe_tokenizer* bpe() const noexcept { return std::get_if<bpe_tokenizer>(&impl_); }

  std::size_t vocab_size() const noexcept { return visit([](const auto& t) { return t.vocab_size(); }); }
  token_id bos() const noexcept { return visit([](const auto& t) { return t.bos(); }); }
  token_id eos() const noexcept { return visit([](const auto& t) { return t.eos(); }); }
  token_id unk() const noexcept { return visit([](const auto& t) { return t.unk(); }); }
  /// Whether the model expects BOS in front of a prompt
  /// (`tokenizer.ggml.add_bos_token`; when absent true for SentencePiece,
  /// false for byte-level BPE).
  bool add_bos_token() const noexcept { return visit([](const auto& t) { return t.add_bos_token(); }); }
  /// SentencePiece's dummy prefix (false for byte-level BPE).
  bool add_space_prefix() const noexcept {
    const auto* s = sentencepiece();
    return s != nullptr && s->add_space_prefix();
  }

  /// The vocabulary entry of `id` as stored ("▁the", "<0x41>", "Ġthe").
  std::string_view token_text(token_id id) const { return visit([&](const auto& t) { return t.token_text(id); }); }
  /// The SentencePiece score of `id` (0 for byte-level BPE, which ranks merges instead).
  float score(token_id id) const {
    if (const auto* s = sentencepiece()) return s->score(id);
    static_cast<void>(bpe()->type(id));  // checks the id
    return 0.0f;
  }
  token_type type(token_id id) const { return visit([&](const auto& t) { return t.type(id); }); }
  /// The id of the vocabulary entry `text` (as stored), if any.
  std::optional<token_id> find(std::string_view text) const { return visit([&](const auto& t) { return t.find(text); }); }

  /// Encodes UTF-8 `text`, e.g. `encode(prompt, {.add_bos = true})`.
  std::vector<token_id> encode(std::string_view text, encode_options options = {}) const {
    return visit([&](const auto& t) { return t.encode(text, options); });
  }
  /// Appends the text (bytes) of `id` to `out`, for streaming.
  void decode_token(token_id id, std::string& out, decode_options options = {}) const {
    visit([&](const auto& t) { t.decode_token(id, out, options); });
  }
  /// Decodes `[n] ids` into text.
  std::string decode(std::span<const token_id> ids, decode_options options = {}) const {
    return visit([&](const auto& t) { return t.decode(ids, options); });
  }

 private:
  std::variant<sentencepiece_tokenizer, bpe_tokenizer> impl_;
};

static_assert(text_tokenizer<sentencepiece_tokenizer>);
static_assert(text_tokenizer<bpe_tokenizer>);
static_assert(text_tokenizer<tokenizer>);

}  // namespace llmkit::model

#if !defined(LLMKIT_SEPARATE_COMPILATION)
#include "llmkit/model/impl/tokenizer.ipp"
#endif
