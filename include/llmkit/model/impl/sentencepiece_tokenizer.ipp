// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/model/impl/sentencepiece_tokenizer.ipp
/// sentencepiece_tokenizer's loading, encoding and decoding
/// (model/sentencepiece_tokenizer.hpp): compiled inline by the header, or
/// once by <llmkit/src.hpp> with LLMKIT_SEPARATE_COMPILATION.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <queue>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "llmkit/core/config.hpp"
#include "llmkit/core/error.hpp"
#include "llmkit/core/ids.hpp"
#include "llmkit/model/detail/tokenizer_gguf.hpp"
#include "llmkit/model/gguf.hpp"
#include "llmkit/model/sentencepiece_tokenizer.hpp"

namespace llmkit::model {

LLMKIT_DECL sentencepiece_tokenizer::sentencepiece_tokenizer(std::vector<std::string> tokens, std::vector<float> scores,
                                                             std::vector<token_type> types, special_ids ids,
                                                             bool add_space_prefix, bool add_bos_token) {
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

LLMKIT_DECL sentencepiece_tokenizer sentencepiece_tokenizer::from_gguf(const gguf_file& file) {
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

LLMKIT_DECL std::vector<token_id> sentencepiece_tokenizer::encode(std::string_view text, encode_options options) const {
  std::vector<token_id> out;
  if (options.add_bos && bos() >= 0) out.push_back(bos());
  if (!options.parse_special || data_->specials.empty()) {
    encode_text(text, data_->add_space_prefix, out);
    return out;
  }
  bool after_special = true;  // the dummy prefix goes at the start and after each special token
  data_->specials.split(
      text, options.literal,
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

LLMKIT_DECL void sentencepiece_tokenizer::decode_token(token_id id, std::string& out, decode_options options) const {
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

LLMKIT_DECL std::string sentencepiece_tokenizer::decode(std::span<const token_id> ids, decode_options options) const {
  std::string out;
  for (token_id id : ids) decode_token(id, out, options);
  if (options.strip_prefix_space && !out.empty() && out.front() == ' ') out.erase(0, 1);
  return out;
}

LLMKIT_DECL void sentencepiece_tokenizer::encode_text(std::string_view text, bool dummy_prefix,
                                                      std::vector<token_id>& out) const {
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
    // Plain text never merges into a control token (`</s>` typed stays text).
    if (it == d.index.end() || d.types[static_cast<std::size_t>(it->second)] == token_type::control) return;
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
    if (auto it = d.index.find(text_piece);
        it != d.index.end() && d.types[static_cast<std::size_t>(it->second)] != token_type::control) {
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

LLMKIT_DECL std::optional<int> sentencepiece_tokenizer::parse_byte_token(std::string_view t) {
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

}  // namespace llmkit::model
