// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/model/impl/bpe_tokenizer.ipp
/// bpe_tokenizer's loading, encoding and decoding (model/bpe_tokenizer.hpp):
/// compiled inline by the header, or once by <llmkit/src.hpp> with
/// LLMKIT_SEPARATE_COMPILATION.

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
#include "llmkit/model/bpe_tokenizer.hpp"
#include "llmkit/model/detail/bpe_pretokenizer.hpp"
#include "llmkit/model/detail/tokenizer_gguf.hpp"
#include "llmkit/model/detail/unicode.hpp"
#include "llmkit/model/gguf.hpp"

namespace llmkit::model {

LLMKIT_DECL std::optional<bpe_pre_tokenizer> bpe_pre_tokenizer_from_name(std::string_view name) {
  if (name == "llama-bpe" || name == "llama3" || name == "llama-v3") return bpe_pre_tokenizer::llama3;
  if (name == "qwen2" || name == "deepseek-r1-qwen") return bpe_pre_tokenizer::qwen2;
  if (name == "gpt-4o") return bpe_pre_tokenizer::o200k;
  return std::nullopt;
}

// Per-call buffers and the word cache.
struct bpe_tokenizer::scratch {
  std::vector<detail::pretoken_char> chars;
  std::vector<symbol> symbols;
  std::vector<candidate> heap;
  std::unordered_map<std::string_view, std::pair<std::uint32_t, std::uint32_t>> cache;  // word -> [offset, count)
  std::vector<token_id> cached;
};

LLMKIT_DECL bpe_tokenizer::bpe_tokenizer(bpe_vocab v) {
  LLMKIT_CHECK(!v.tokens.empty(), "tokenizer: empty vocabulary (tokenizer.ggml.tokens)");
  if (v.types.empty()) v.types.assign(v.tokens.size(), token_type::normal);
  LLMKIT_CHECK(v.types.size() == v.tokens.size(), "tokenizer: types.size() = ", v.types.size(),
               " differs from tokens.size() = ", v.tokens.size());
  const auto n = static_cast<token_id>(v.tokens.size());
  LLMKIT_CHECK(static_cast<std::size_t>(n) == v.tokens.size() && v.merges.size() < (std::size_t{1} << 31),
               "tokenizer: vocabulary of ", v.tokens.size(), " tokens and ", v.merges.size(),
               " merges is too large");
  for (auto [name, id] : {std::pair{"bos", v.ids.bos}, std::pair{"eos", v.ids.eos}, std::pair{"unk", v.ids.unk}})
    LLMKIT_CHECK(id >= -1 && id < n, "tokenizer: ", name, " id ", id, " is outside the vocabulary of ", n,
                 " tokens");
  auto d = std::make_shared<data>();
  d->tokens = std::move(v.tokens);
  d->types = std::move(v.types);
  d->pre = v.pre;
  d->ids = v.ids;
  d->add_bos_token = v.add_bos_token;
  d->index.reserve(d->tokens.size());
  for (token_id i = 0; i < n; ++i) d->index.emplace(d->tokens[static_cast<std::size_t>(i)], i);  // first wins

  // Each token's bytes; the word index holds the tokens plain text can produce.
  const auto unicode_to_byte = make_unicode_to_byte();
  d->bytes.resize(d->tokens.size());
  d->byte_ids.fill(-1);
  for (token_id i = 0; i < n; ++i) {
    const auto k = static_cast<std::size_t>(i);
    const std::string& t = d->tokens[k];
    if (is_special(d->types[k])) {
      d->bytes[k] = t;
      d->specials.add(t, i);
      continue;
    }
    const auto raw = unmap(t, unicode_to_byte);
    d->bytes[k] = raw.value_or(t);
    if (!raw) continue;  // not a byte-level spelling: never produced from text
    d->word_index.emplace(d->bytes[k], i);
    if (raw->size() == 1 && d->byte_ids[static_cast<unsigned char>((*raw)[0])] < 0)
      d->byte_ids[static_cast<unsigned char>((*raw)[0])] = i;
  }
  for (int b = 0; b < 256; ++b)
    LLMKIT_CHECK(d->byte_ids[static_cast<std::size_t>(b)] >= 0, "tokenizer: tokenizer.ggml.tokens has no token for byte ",
                 b, " (a byte-level BPE vocabulary needs all 256)");

  d->merges.reserve(v.merges.size());
  for (std::size_t r = 0; r < v.merges.size(); ++r) {
    const std::string_view m = v.merges[r];
    const std::size_t space = m.find(' ', 1);
    LLMKIT_CHECK(space != std::string_view::npos && space + 1 < m.size() && m.find(' ', space + 1) == m.npos,
                 "tokenizer: tokenizer.ggml.merges[", r, "] is '", m, "', not 'left right'");
    const std::string_view left = m.substr(0, space), right = m.substr(space + 1);
    const auto l = d->index.find(left), rt = d->index.find(right);
    LLMKIT_CHECK(l != d->index.end(), "tokenizer: tokenizer.ggml.merges[", r, "] = '", m, "' names unknown token '",
                 left, "'");
    LLMKIT_CHECK(rt != d->index.end(), "tokenizer: tokenizer.ggml.merges[", r, "] = '", m,
                 "' names unknown token '", right, "'");
    std::string joined;
    joined.reserve(left.size() + right.size());
    joined.append(left).append(right);
    const auto result = d->index.find(joined);
    LLMKIT_CHECK(result != d->index.end(), "tokenizer: tokenizer.ggml.merges[", r, "] = '", m, "' makes '", joined,
                 "', which is not a token");
    d->merges.insert(l->second, rt->second, {static_cast<std::int32_t>(r), result->second});  // first rank wins
  }
  data_ = std::move(d);
}

LLMKIT_DECL bpe_tokenizer bpe_tokenizer::from_gguf(const gguf_file& file) {
  const auto model = file.get<std::string_view>("tokenizer.ggml.model");
  LLMKIT_CHECK(model == "gpt2", "tokenizer: tokenizer.ggml.model is '", model, "', not 'gpt2' (byte-level BPE)");
  bpe_vocab v;
  const auto pre = file.get_optional<std::string_view>("tokenizer.ggml.pre");
  LLMKIT_CHECK(pre.has_value(), "tokenizer: tokenizer.ggml.pre is missing (byte-level BPE needs its pre-tokenizer: ",
               "llama-bpe, qwen2 or gpt-4o)");
  const auto kind = bpe_pre_tokenizer_from_name(*pre);
  LLMKIT_CHECK(kind.has_value(), "tokenizer: tokenizer.ggml.pre is '", *pre,
               "', an unsupported pre-tokenizer (supported: llama-bpe, llama3, llama-v3, qwen2, deepseek-r1-qwen, gpt-4o)");
  v.pre = *kind;
  for (auto t : file.get_array("tokenizer.ggml.tokens").strings()) v.tokens.emplace_back(t);
  v.types = detail::read_token_types(file, v.tokens.size());
  LLMKIT_CHECK(file.contains("tokenizer.ggml.merges"),
               "tokenizer: tokenizer.ggml.merges is missing (byte-level BPE needs its merges)");
  for (auto m : file.get_array("tokenizer.ggml.merges").strings()) v.merges.emplace_back(m);
  const auto n = static_cast<std::int64_t>(v.tokens.size());
  v.ids.bos = detail::read_special_id(file, "tokenizer.ggml.bos_token_id", n, -1);
  v.ids.eos = detail::read_special_id(file, "tokenizer.ggml.eos_token_id", n, -1);
  v.ids.unk = detail::read_special_id(file, "tokenizer.ggml.unknown_token_id", n, -1);
  v.add_bos_token = file.get_optional<bool>("tokenizer.ggml.add_bos_token").value_or(false);
  return bpe_tokenizer(std::move(v));
}

LLMKIT_DECL std::vector<token_id> bpe_tokenizer::encode(std::string_view text, encode_options options) const {
  LLMKIT_CHECK(text.size() < (std::size_t{1} << 31), "tokenizer::encode: text of ", text.size(),
               " bytes; at most 2^31 - 1 at once");
  std::vector<token_id> out;
  out.reserve(text.size() / 3 + 2);
  if (options.add_bos && bos() >= 0) out.push_back(bos());
  scratch s;
  const std::size_t max_digits = data_->pre == bpe_pre_tokenizer::qwen2 ? 1 : 3;
  auto encode_text = [&](std::string_view part) {
    const auto word = [&](std::string_view w) { encode_word(w, out, s); };
    if (data_->pre == bpe_pre_tokenizer::o200k)
      detail::pre_tokenize_o200k(part, s.chars, word);
    else
      detail::pre_tokenize(part, max_digits, s.chars, word);
  };
  if (options.parse_special && !data_->specials.empty())
    data_->specials.split(text, options.literal, encode_text, [&](token_id id) { out.push_back(id); });
  else
    encode_text(text);
  return out;
}

LLMKIT_DECL void bpe_tokenizer::decode_token(token_id id, std::string& out, decode_options options) const {
  check_id(id, "decode");
  const auto i = static_cast<std::size_t>(id);
  if (data_->types[i] == token_type::control && !options.render_special) return;
  out += data_->bytes[i];
}

LLMKIT_DECL std::string bpe_tokenizer::decode(std::span<const token_id> ids, decode_options options) const {
  std::string out;
  for (token_id id : ids) decode_token(id, out, options);
  if (options.strip_prefix_space && !out.empty() && out.front() == ' ') out.erase(0, 1);
  return out;
}

LLMKIT_DECL void bpe_tokenizer::encode_word(std::string_view word, std::vector<token_id>& out, scratch& s) const {
  const data& d = *data_;
  if (word.size() == 1) {
    out.push_back(d.byte_ids[static_cast<unsigned char>(word[0])]);
    return;
  }
  // The call's cache first: it is small and warm, the vocabulary's index is neither.
  if (auto it = s.cache.find(word); it != s.cache.end()) {
    const auto [offset, count] = it->second;
    out.insert(out.end(), s.cached.begin() + offset, s.cached.begin() + offset + count);
    return;
  }
  if (d.pre == bpe_pre_tokenizer::llama3 || d.pre == bpe_pre_tokenizer::o200k) {  // tiktoken's rule
    if (auto it = d.word_index.find(word); it != d.word_index.end()) {
      s.cache.emplace(word, std::pair{static_cast<std::uint32_t>(s.cached.size()), std::uint32_t{1}});
      s.cached.push_back(it->second);
      out.push_back(it->second);
      return;
    }
  }
  auto& sym = s.symbols;
  sym.clear();
  const auto n = static_cast<std::int32_t>(word.size());
  for (std::int32_t k = 0; k < n; ++k) sym.push_back({d.byte_ids[static_cast<unsigned char>(word[static_cast<std::size_t>(k)])], k - 1, k + 1});
  sym.back().next = -1;
  auto& heap = s.heap;
  heap.clear();
  const auto later = [](const candidate& a, const candidate& b) { return a > b; };
  const auto try_pair = [&](std::int32_t left) {
    const std::int32_t right = sym[static_cast<std::size_t>(left)].next;
    if (right < 0) return;
    const token_id l = sym[static_cast<std::size_t>(left)].id, r = sym[static_cast<std::size_t>(right)].id;
    const merge_result* m = d.merges.find(l, r);
    if (!m) return;
    heap.push_back({m->rank, left, right, l, r, m->id});
    std::push_heap(heap.begin(), heap.end(), later);
  };
  for (std::int32_t k = 0; k + 1 < n; ++k) try_pair(k);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), later);
    const candidate c = heap.back();
    heap.pop_back();
    symbol& l = sym[static_cast<std::size_t>(c.left)];
    if (l.id != c.left_id || l.next != c.right) continue;  // stale: the left side changed
    symbol& r = sym[static_cast<std::size_t>(c.right)];
    if (r.id != c.right_id) continue;  // stale: the right side changed
    l.id = c.result;
    l.next = r.next;
    if (r.next >= 0) sym[static_cast<std::size_t>(r.next)].prev = c.left;
    r.id = -1;
    if (l.prev >= 0) try_pair(l.prev);
    try_pair(c.left);
  }
  const auto offset = static_cast<std::uint32_t>(s.cached.size());
  for (std::int32_t k = 0; k >= 0; k = sym[static_cast<std::size_t>(k)].next) s.cached.push_back(sym[static_cast<std::size_t>(k)].id);
  const auto count = static_cast<std::uint32_t>(s.cached.size() - offset);
  s.cache.emplace(word, std::pair{offset, count});
  out.insert(out.end(), s.cached.begin() + offset, s.cached.end());
}

LLMKIT_DECL std::array<std::int16_t, 0x144> bpe_tokenizer::make_unicode_to_byte() {
  std::array<std::int16_t, 0x144> t{};
  t.fill(-1);
  for (int b = 0; b < 256; ++b) t[byte_to_unicode(static_cast<unsigned char>(b))] = static_cast<std::int16_t>(b);
  return t;
}

LLMKIT_DECL std::optional<std::string> bpe_tokenizer::unmap(std::string_view text,
                                                          const std::array<std::int16_t, 0x144>& to_byte) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t at = 0; at < text.size();) {
    const detail::utf8_char c = detail::decode_utf8(text, at);
    if (c.code_point >= to_byte.size() || to_byte[c.code_point] < 0) return std::nullopt;
    out += static_cast<char>(to_byte[c.code_point]);
    at += c.length;
  }
  return out;
}

}  // namespace llmkit::model
