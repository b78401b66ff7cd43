// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/model/sentencepiece_tokenizer.hpp
/// SentencePiece-BPE tokenizer as stored in GGUF metadata
/// (`tokenizer.ggml.model = "llama"`): tokens, scores and token types.
/// Most code uses it through `llmkit::model::tokenizer` (model/tokenizer.hpp).
///
/// Encoding follows SentencePiece / llama.cpp's SPM tokenizer:
/// 1. a space is prepended (the "dummy prefix", unless
///    `tokenizer.ggml.add_space_prefix` is false) and every ' ' becomes
///    U+2581 '▁';
/// 2. the text is split into UTF-8 characters;
/// 3. repeatedly, among all adjacent pairs whose concatenation is a
///    vocabulary token, the pair whose token has the highest score is merged
///    (the leftmost pair on ties);
/// 4. each remaining piece that is not in the vocabulary (an unknown
///    character) falls back to its UTF-8 bytes as `<0xXX>` tokens (or to the
///    unknown token when the vocabulary has no byte tokens).
/// With `encode_options::parse_special`, the text of control and
/// user-defined tokens (`<s>`) becomes their id first; the dummy prefix is
/// then added to the text at the start and after each special token, as
/// llama.cpp does.
///
/// Decoding maps '▁' back to ' ', byte tokens to their raw byte (so
/// multi-byte characters split over several byte tokens reassemble into
/// UTF-8) and control tokens (BOS, EOS, ...) to nothing.
///
/// Copies are cheap and share the (immutable) vocabulary.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <queue>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "llmkit/core/error.hpp"
#include "llmkit/core/ids.hpp"
#include "llmkit/model/detail/special_tokens.hpp"
#include "llmkit/model/detail/tokenizer_gguf.hpp"
#include "llmkit/model/gguf.hpp"
#include "llmkit/model/tokenizer_types.hpp"

namespace llmkit::model {

/// A SentencePiece-BPE vocabulary with encode and decode.
class sentencepiece_tokenizer {
 public:
  /// Builds a tokenizer from `[n_vocab] tokens`, `[n_vocab] scores` and
  /// `[n_vocab] types` (empty types = all normal). `add_bos_token` is what
  /// `add_bos_token()` reports (the file's `tokenizer.ggml.add_bos_token`).
  sentencepiece_tokenizer(std::vector<std::string> tokens, std::vector<float> scores, std::vector<token_type> types,
                          special_ids ids, bool add_space_prefix = true, bool add_bos_token = true) {
    LLMKIT_CHECK(!tokens.empty(), "tokenizer: empty vocabulary");
    LLMKIT_CHECK(scores.size() == tokens.size(), "tokenizer: scores.size() = ", scores.size(),
                 " differs from tokens.size() = ", tokens.size());
    if (types.empty()) types.assign(tokens.size(), token_type::normal);
    LLMKIT_CHECK(types.size() == tokens.size(), "tokenizer: types.size() = ", types.size(),
                 " differs from tokens.size() = ", tokens.size());
    const auto n = static_cast<token_id>(tokens.size());
    LLMKIT_CHECK(static_cast<std::size_t>(n) == tokens.size(), "tokenizer: vocabulary of ", tokens.size(),
                 " tokens is too large");
    for (auto [name, id] : {std::pair{"bos", ids.bos}, std::pair{"eos", ids.eos}, std::pair{"unk", ids.unk}})
      LLMKIT_CHECK(id >= -1 && id < n, "tokenizer: ", name, " id ", id, " is outside the vocabulary of ", n,
                   " tokens");
    auto d = std::make_shared<data>();
    d->tokens = std::move(tokens);
    d->scores = std::move(scores);
    d->types = std::move(types);
    d->ids = ids;
    d->add_space_prefix = add_space_prefix;
    d->add_bos_token = add_bos_token;
    d->index.reserve(d->tokens.size());
    for (token_id i = 0; i < n; ++i) d->index.emplace(d->tokens[static_cast<std::size_t>(i)], i);  // first wins
    d->byte_ids.fill(-1);
    for (token_id i = 0; i < n; ++i) {
      const auto type = d->types[static_cast<std::size_t>(i)];
      if (is_special(type)) d->specials.add(d->tokens[static_cast<std::size_t>(i)], i);
      if (type != token_type::byte) continue;
      const std::string& t = d->tokens[static_cast<std::size_t>(i)];
      const auto value = parse_byte_token(t);
      LLMKIT_CHECK(value.has_value(), "tokenizer: byte token ", i, " is '", t, "', not <0xXX>");
      d->byte_values.resize(d->tokens.size(), -1);
      d->byte_values[static_cast<std::size_t>(i)] = *value;
      if (d->byte_ids[*value] < 0) d->byte_ids[*value] = i;
    }
    data_ = std::move(d);
  }

  /// Reads `tokenizer.ggml.*` from a GGUF file whose `tokenizer.ggml.model`
  /// is "llama".
  static sentencepiece_tokenizer from_gguf(const gguf_file& file) {
    const auto model = file.get<std::string_view>("tokenizer.ggml.model");
    LLMKIT_CHECK(model == "llama", "tokenizer: tokenizer.ggml.model is '", model,
                 "', not 'llama' (SentencePiece BPE)");
    const auto tokens = file.get_array("tokenizer.ggml.tokens").strings();
    std::vector<std::string> owned(tokens.begin(), tokens.end());
    std::vector<float> scores(owned.size(), 0.0f);
    if (file.contains("tokenizer.ggml.scores")) {
      const auto& s = file.get_array("tokenizer.ggml.scores");
      LLMKIT_CHECK(s.size() == owned.size(), "tokenizer: tokenizer.ggml.scores has ", s.size(),
                   " entries for ", owned.size(), " tokens");
      for (std::size_t i = 0; i < owned.size(); ++i) scores[i] = s.get<float>(i);
    }
    auto types = detail::read_token_types(file, owned.size());
    const auto n = static_cast<std::int64_t>(owned.size());
    special_ids ids;
    ids.bos = detail::read_special_id(file, "tokenizer.ggml.bos_token_id", n, n > 1 ? 1 : -1);
    ids.eos = detail::read_special_id(file, "tokenizer.ggml.eos_token_id", n, n > 2 ? 2 : -1);
    ids.unk = detail::read_special_id(file, "tokenizer.ggml.unknown_token_id", n, 0);
    const bool prefix = file.get_optional<bool>("tokenizer.ggml.add_space_prefix").value_or(true);
    const bool bos = file.get_optional<bool>("tokenizer.ggml.add_bos_token").value_or(true);
    return sentencepiece_tokenizer(std::move(owned), std::move(scores), std::move(types), ids, prefix, bos);
  }

  std::size_t vocab_size() const noexcept { return data_->tokens.size(); }
  token_id bos() const noexcept { return data_->ids.bos; }
  token_id eos() const noexcept { return data_->ids.eos; }
  token_id unk() const noexcept { return data_->ids.unk; }
  bool add_space_prefix() const noexcept { return data_->add_space_prefix; }
  /// Whether the model expects BOS in front of a prompt
  /// (`tokenizer.ggml.add_bos_token`, true when absent).
  bool add_bos_token() const noexcept { return data_->add_bos_token; }

  /// The vocabulary entry of `id` as stored (with '▁', "<0x41>", "<s>").
  std::string_view token_text(token_id id) const {
    check_id(id, "token_text");
    return data_->tokens[static_cast<std::size_t>(id)];
  }
  float score(token_id id) const {
    check_id(id, "score");
    return data_->scores[static_cast<std::size_t>(id)];
  }
  token_type type(token_id id) const {
    check_id(id, "type");
    return data_->types[static_cast<std::size_t>(id)];
  }
  /// The id of the vocabulary entry `text`, if any.
  std::optional<token_id> find(std::string_view text) const {
    auto it = data_->index.find(text);
    if (it == data_->index.end()) return std::nullopt;
    return it->second;
  }

  /// Encodes UTF-8 `text` (see the file comment). Empty text gives no
  /// tokens (besides BOS). Invalid UTF-8 is encoded byte by byte.
  std::vector<token_id> encode(std::string_view text, encode_options options = {}) const {
    std::vector<token_id> out;
    if (options.add_bos && bos() >= 0) out.push_back(bos());
    if (!options.parse_special || data_->specials.empty()) {
      encode_text(text, data_->add_space_prefix, out);
      return out;
    }
    bool after_special = true;  // the dummy prefix goes at the start and after each special token
    data_->specials.split(
        text,
        [&](std::string_view part) {
          encode_text(part, data_->add_space_prefix && after_special, out);
          after_special = false;
        },
        [&](token_id id) {
          out.push_back(id);
          after_special = true;
        });
    return out;
  }

  /// Appends the text of `id` to `out`: '▁' -> ' ', byte tokens -> their
  /// byte, control tokens -> nothing (their text with
  /// `options.render_special`).
  void decode_token(token_id id, std::string& out, decode_options options = {}) const {
    check_id(id, "decode");
    const auto i = static_cast<std::size_t>(id);
    const data& d = *data_;
    switch (d.types[i]) {
      case token_type::control:
        if (options.render_special) out += d.tokens[i];
        return;
      case token_type::byte: out += static_cast<char>(d.byte_values[i]); return;
      default: break;
    }
    const std::string_view t = d.tokens[i];
    for (std::size_t k = 0; k < t.size();) {
      if (t.substr(k, space_marker.size()) == space_marker) {
        out += ' ';
        k += space_marker.size();
      } else {
        out += t[k++];
      }
    }
  }

  /// Decodes `[n] ids` into UTF-8 text.
  std::string decode(std::span<const token_id> ids, decode_options options = {}) const {
    std::string out;
    for (token_id id : ids) decode_token(id, out, options);
    if (options.strip_prefix_space && !out.empty() && out.front() == ' ') out.erase(0, 1);
    return out;
  }

  /// U+2581, SentencePiece's visible space.
  static constexpr std::string_view space_marker = "\xe2\x96\x81";

 private:
  struct data {
    std::vector<std::string> tokens;
    std::vector<float> scores;
    std::vector<token_type> types;
    special_ids ids;
    bool add_space_prefix = true;
    bool add_bos_token = true;
    std::unordered_map<std::string_view, token_id> index;  // views into `tokens`
    std::array<token_id, 256> byte_ids{};
    std::vector<int> byte_values;  // [n_vocab] byte of a byte token, else -1
    detail::special_token_matcher specials;
  };

  // Appends the tokens of `text` (no special tokens in it) to `out`.
  void encode_text(std::string_view text, bool dummy_prefix, std::vector<token_id>& out) const {
    if (text.empty()) return;
    const data& d = *data_;
    std::string s;
    s.reserve(text.size() * 3 + 3);
    if (dummy_prefix) s += space_marker;
    for (char c : text) {
      if (c == ' ') s += space_marker;
      else s += c;
    }
    // Pieces as a doubly linked list over s; a merged piece spans its parts.
    struct piece {
      std::size_t offset, length;
      std::ptrdiff_t prev, next;
    };
    std::vector<piece> pieces;
    for (std::size_t at = 0; at < s.size();) {
      const std::size_t len = std::min(utf8_length(static_cast<unsigned char>(s[at])), s.size() - at);
      const auto i = static_cast<std::ptrdiff_t>(pieces.size());
      pieces.push_back({at, len, i - 1, i + 1});
      at += len;
    }
    pieces.back().next = -1;
    struct bigram {
      float score;
      std::ptrdiff_t left;
      std::size_t length;  // to detect a stale entry
      token_id id;
      bool operator<(const bigram& o) const {  // max-heap: best score, then leftmost
        return score < o.score || (score == o.score && left > o.left);
      }
    };
    std::priority_queue<bigram> queue;
    auto try_pair = [&](std::ptrdiff_t left) {
      if (left < 0) return;
      const std::ptrdiff_t right = pieces[static_cast<std::size_t>(left)].next;
      if (right < 0) return;
      const piece& l = pieces[static_cast<std::size_t>(left)];
      const std::size_t length = l.length + pieces[static_cast<std::size_t>(right)].length;
      auto it = d.index.find(std::string_view(s).substr(l.offset, length));
      if (it == d.index.end()) return;
      queue.push({d.scores[static_cast<std::size_t>(it->second)], left, length, it->second});
    };
    for (std::ptrdiff_t i = 0; i + 1 < static_cast<std::ptrdiff_t>(pieces.size()); ++i) try_pair(i);
    while (!queue.empty()) {
      const bigram b = queue.top();
      queue.pop();
      piece& l = pieces[static_cast<std::size_t>(b.left)];
      if (l.length == 0 || l.next < 0) continue;
      piece& r = pieces[static_cast<std::size_t>(l.next)];
      if (l.length + r.length != b.length) continue;  // stale: one side changed
      l.length += r.length;
      r.length = 0;
      l.next = r.next;
      if (r.next >= 0) pieces[static_cast<std::size_t>(r.next)].prev = b.left;
      try_pair(l.prev);
      try_pair(b.left);
    }
    for (std::ptrdiff_t i = 0; i >= 0; i = pieces[static_cast<std::size_t>(i)].next) {
      const piece& p = pieces[static_cast<std::size_t>(i)];
      const std::string_view text_piece = std::string_view(s).substr(p.offset, p.length);
      if (auto it = d.index.find(text_piece); it != d.index.end()) {
        out.push_back(it->second);
        continue;
      }
      for (char c : text_piece) {
        const token_id b = d.byte_ids[static_cast<unsigned char>(c)];
        if (b >= 0) out.push_back(b);
        else if (d.ids.unk >= 0) out.push_back(d.ids.unk);
        else ::llmkit::detail::throw_error("tokenizer: cannot encode byte ", unsigned(static_cast<unsigned char>(c)),
                                           ": no byte token and no unknown token");
      }
    }
  }

  void check_id(token_id id, const char* what) const {
    LLMKIT_CHECK(id >= 0 && static_cast<std::size_t>(id) < data_->tokens.size(), "tokenizer::", what, ": token id ",
                 id, " is outside the vocabulary of ", data_->tokens.size(), " tokens");
  }

  static std::size_t utf8_length(unsigned char lead) noexcept {
    if (lead < 0x80) return 1;
    if ((lead & 0xe0) == 0xc0) return 2;
    if ((lead & 0xf0) == 0xe0) return 3;
    if ((lead & 0xf8) == 0xf0) return 4;
    return 1;  // continuation or invalid byte: on its own
  }

  static std::optional<int> parse_byte_token(std::string_view t) {
    if (t.size() != 6 || t.substr(0, 3) != "<0x" || t[5] != '>') return std::nullopt;
    auto hex = [](char c) -> int {
      if (c >= '0' && c <= '9') return c - '0';
      if (c >= 'A' && c <= 'F') return c - 'A' + 10;
      if (c >= 'a' && c <= 'f') return c - 'a' + 10;
      return -1;
    };
    const int hi = hex(t[3]), lo = hex(t[4]);
    if (hi < 0 || lo < 0) return std::nullopt;
    return hi * 16 + lo;
  }

  std::shared_ptr<const data> data_;
};

}  // namespace llmkit::model
