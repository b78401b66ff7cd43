// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/model/bpe_tokenizer.hpp
/// Byte-level BPE tokenizer as stored in GGUF metadata
/// (`tokenizer.ggml.model = "gpt2"`: Llama 3, Qwen2, GPT-2 style
/// vocabularies). Most code uses it through `llmkit::model::tokenizer`
/// (model/tokenizer.hpp).
///
/// Encoding, as in Hugging Face tokenizers and llama.cpp:
/// 1. with `encode_options::parse_special`, the text of control and
///    user-defined tokens becomes their id and the text between them is
///    encoded separately (otherwise special text is plain text);
/// 2. the pre-tokenizer named by `tokenizer.ggml.pre` splits the text into
///    words (`bpe_pre_tokenizer`; model/detail/bpe_pretokenizer.hpp);
/// 3. each word's UTF-8 bytes start as one token each (the GPT-2
///    byte-to-unicode mapping names byte b's token: printable Latin-1 bytes
///    stand for themselves, the others are U+0100 + k, so ' ' is 'Ġ');
/// 4. repeatedly the adjacent pair whose merge (`tokenizer.ggml.merges`,
///    "left right" strings) comes first in the list is merged, the leftmost
///    on ties. With Llama 3's and GPT-4o's pre-tokenizers a word that is a
///    whole token is taken as is, without merging (tiktoken's rule, which
///    both vocabularies come from; llama.cpp's `ignore_merges`).
///
/// Decoding maps each token back to its bytes (so multi-byte characters
/// split over several tokens reassemble), control tokens to nothing and
/// user-defined tokens to their text.
///
/// Copies are cheap and share the (immutable) vocabulary. `encode` keeps a
/// per-call cache of the words it has seen (a 1 MB text repeats most words).

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "llmkit/core/config.hpp"
#include "llmkit/core/error.hpp"
#include "llmkit/core/ids.hpp"
#include "llmkit/model/detail/special_tokens.hpp"
#include "llmkit/model/detail/vocabulary.hpp"
#include "llmkit/model/gguf.hpp"
#include "llmkit/model/tokenizer_types.hpp"

namespace llmkit::model {

/// The pre-tokenizers (`tokenizer.ggml.pre`) a `bpe_tokenizer` knows.
enum class bpe_pre_tokenizer {
  llama3,  ///< "llama-bpe" (also "llama3", "llama-v3"): numbers in groups of up to 3 digits, whole-word tokens kept
  qwen2,   ///< "qwen2" (also "deepseek-r1-qwen"): the same regex with single digits
  o200k,   ///< "gpt-4o" (gpt-oss): tiktoken's o200k_base regex, words split at case changes, whole-word tokens kept
};

/// The `bpe_pre_tokenizer` of a `tokenizer.ggml.pre` name, if known.
std::optional<bpe_pre_tokenizer> bpe_pre_tokenizer_from_name(std::string_view name);

/// What a byte-level BPE vocabulary is made of (as read from GGUF).
struct bpe_vocab {
  std::vector<std::string> tokens{};  ///< [n_vocab] token texts, bytes as the GPT-2 mapping spells them ("Ġthe")
  std::vector<token_type> types{};    ///< [n_vocab] (empty: all normal)
  std::vector<std::string> merges{};  ///< [n_merges] "left right", first = applied first
  bpe_pre_tokenizer pre = bpe_pre_tokenizer::llama3;
  special_ids ids{};
  bool add_bos_token = false;  ///< what `add_bos_token()` reports
};

/// A byte-level BPE vocabulary with encode and decode.
class bpe_tokenizer : public detail::vocabulary_queries<bpe_tokenizer> {
 public:
  /// Builds the tokenizer; raises `llmkit::error` naming
  /// `tokenizer.ggml.merges[i]` for a malformed merge, one naming an unknown
  /// token or one whose result is not a token, and naming the byte when no
  /// token stands for a single byte.
  explicit bpe_tokenizer(bpe_vocab v);

  /// Reads `tokenizer.ggml.*` from a GGUF file whose `tokenizer.ggml.model`
  /// is "gpt2": tokens, token_type, merges (required), pre (required; see
  /// `bpe_pre_tokenizer_from_name`), bos/eos/unknown ids and add_bos_token
  /// (false when absent).
  static bpe_tokenizer from_gguf(const gguf_file& file);

  // vocab_size, bos, eos, unk, add_bos_token, token_text, type, find:
  // detail::vocabulary_queries.
  std::size_t n_merges() const noexcept { return data_->merges.size(); }
  bpe_pre_tokenizer pre_tokenizer() const noexcept { return data_->pre; }

  /// Encodes UTF-8 `text` (see the file comment). Any bytes are accepted:
  /// invalid UTF-8 splits as single bytes of no class. @pre text.size() < 2^31
  std::vector<token_id> encode(std::string_view text, encode_options options = {}) const;

  /// Appends the bytes of `id` to `out`: control tokens give nothing (their
  /// text with `options.render_special`).
  void decode_token(token_id id, std::string& out, decode_options options = {}) const;

  /// Decodes `[n] ids` into text (bytes; UTF-8 when the ids came from
  /// UTF-8 text).
  std::string decode(std::span<const token_id> ids, decode_options options = {}) const;

  /// The character GPT-2's byte-level mapping spells byte `b` with.
  static constexpr char32_t byte_to_unicode(unsigned char b) noexcept {
    if (printable(b)) return b;
    char32_t shifted = 0;
    for (unsigned c = 0; c < b; ++c) shifted += printable(static_cast<unsigned char>(c)) ? 0 : 1;
    return 256 + shifted;
  }

 private:
  struct merge_result {
    std::int32_t rank;
    token_id id;
  };

  // Open-addressing map (left id, right id) -> merge_result: the hot lookup
  // of encoding.
  class merge_table {
   public:
    void reserve(std::size_t n) {
      std::size_t cap = 16;
      while (cap < 2 * n) cap *= 2;
      slots_.assign(cap, slot{empty_key, {}});
      mask_ = cap - 1;
    }
    std::size_t size() const noexcept { return size_; }
    void insert(token_id left, token_id right, merge_result value) {
      const std::uint64_t key = make_key(left, right);
      for (std::size_t i = hash(key);; i = (i + 1) & mask_) {
        if (slots_[i].key == key) return;
        if (slots_[i].key == empty_key) {
          slots_[i] = {key, value};
          ++size_;
          return;
        }
      }
    }
    const merge_result* find(token_id left, token_id right) const noexcept {
      if (slots_.empty()) return nullptr;
      const std::uint64_t key = make_key(left, right);
      for (std::size_t i = hash(key);; i = (i + 1) & mask_) {
        if (slots_[i].key == key) return &slots_[i].value;
        if (slots_[i].key == empty_key) return nullptr;
      }
    }

   private:
    struct slot {
      std::uint64_t key;
      merge_result value;
    };
    static constexpr std::uint64_t empty_key = ~std::uint64_t{0};
    static std::uint64_t make_key(token_id l, token_id r) noexcept {
      return (std::uint64_t(std::uint32_t(l)) << 32) | std::uint32_t(r);
    }
    std::size_t hash(std::uint64_t key) const noexcept {
      return static_cast<std::size_t>((key * 0x9e3779b97f4a7c15ull) >> 32) & mask_;
    }
    std::vector<slot> slots_;
    std::size_t mask_ = 0, size_ = 0;
  };

  friend class detail::vocabulary_queries<bpe_tokenizer>;

  struct data : detail::vocabulary {
    std::vector<std::string> bytes;  // [n_vocab] what decode appends
    bpe_pre_tokenizer pre = bpe_pre_tokenizer::llama3;
    std::unordered_map<std::string_view, token_id> word_index;  // bytes -> id, tokens plain text can produce
    std::array<token_id, 256> byte_ids{};
    merge_table merges;
    detail::special_token_matcher specials;
  };

  struct symbol {
    token_id id;  // -1 once merged into its left neighbour
    std::int32_t prev, next;
  };
  struct candidate {
    std::int32_t rank, left, right;
    token_id left_id, right_id, result;
    bool operator>(const candidate& o) const { return rank > o.rank || (rank == o.rank && left > o.left); }
  };
  // Per-call buffers and the word cache (defined in impl/bpe_tokenizer.ipp).
  struct scratch;

  void encode_word(std::string_view word, std::vector<token_id>& out, scratch& s) const;

  const detail::vocabulary& vocab() const noexcept { return *data_; }

  static constexpr bool printable(unsigned char b) noexcept {
    return (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae);
  }
  // [0x144) code point -> byte, or -1.
  static std::array<std::int16_t, 0x144> make_unicode_to_byte();
  // The bytes a token's text spells, or nullopt when a character is not in
  // the byte-level mapping.
  static std::optional<std::string> unmap(std::string_view text, const std::array<std::int16_t, 0x144>& to_byte);

  std::shared_ptr<const data> data_;
};

}  // namespace llmkit::model

#if !defined(LLMKIT_SEPARATE_COMPILATION)
#include "llmkit/model/impl/bpe_tokenizer.ipp"
#endif
