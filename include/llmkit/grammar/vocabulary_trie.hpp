// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/grammar/vocabulary_trie.hpp
/// A vocabulary as a byte trie laid out in preorder, for masks.
///
/// Each token's bytes are what it adds to the text: a byte-level BPE piece
/// decoded to bytes, a SentencePiece piece with U+2581 as a space, a
/// byte-fallback token `<0xXX>` as its byte (`model::tokenizer::decode_token`).
/// Tokens the caller excludes (special ones) and tokens without bytes are
/// kept out of the trie: a grammar never allows them.
///
/// Nodes are stored in preorder with the index just past each subtree, so a
/// walk that finds a prefix impossible skips its whole subtree with one jump
/// and otherwise reads memory front to back.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "llmkit/core/error.hpp"
#include "llmkit/core/ids.hpp"

namespace llmkit::grammar {

/// See the file comment.
class vocabulary_trie {
 public:
  /// One trie node: the byte on the edge from its parent, its depth (1 for
  /// children of the root), the preorder index just past its subtree, and
  /// the range of `node_tokens()` ending here.
  struct node {
    std::uint8_t byte = 0;
    std::uint16_t depth = 0;
    std::uint32_t subtree_end = 0;
    std::uint32_t tokens_begin = 0, tokens_end = 0;
  };

  vocabulary_trie() = default;

  /// Builds the trie of `[n_vocab] token_bytes`; `excluded[i]` keeps token i
  /// out (special tokens).
  /// @pre every entry shorter than 65536 bytes.
  vocabulary_trie(const std::vector<std::string>& token_bytes, const std::vector<bool>& excluded) {
    const std::size_t n = token_bytes.size();
    LLMKIT_CHECK(excluded.size() == n, "vocabulary_trie: excluded has ", excluded.size(), " entries, expected ", n);
    n_vocab_ = n;
    std::vector<token_id> order;
    for (std::size_t i = 0; i < n; ++i) {
      if (excluded[i] || token_bytes[i].empty()) continue;
      LLMKIT_CHECK(token_bytes[i].size() < 65536, "vocabulary_trie: token ", i, " has ", token_bytes[i].size(),
                   " bytes");
      order.push_back(static_cast<token_id>(i));
    }
    std::sort(order.begin(), order.end(),
              [&](token_id a, token_id b) { return token_bytes[a] < token_bytes[b] || (token_bytes[a] == token_bytes[b] && a < b); });
    std::vector<std::uint32_t> path;  // node index at each depth of the previous token
    const std::string* prev = nullptr;
    for (token_id t : order) {
      const std::string& s = token_bytes[t];
      std::size_t common = 0;
      if (prev) {
        const std::size_t m = std::min(prev->size(), s.size());
        while (common < m && (*prev)[common] == s[common]) ++common;
      }
      path.resize(common);
      for (std::size_t d = common; d < s.size(); ++d) {
        path.push_back(static_cast<std::uint32_t>(nodes_.size()));
        nodes_.push_back({static_cast<std::uint8_t>(s[d]), static_cast<std::uint16_t>(d + 1), 0, 0, 0});
      }
      // Sorted order puts equal byte strings together, so their tokens are contiguous.
      node& last = nodes_[path.back()];
      if (last.tokens_begin == last.tokens_end) last.tokens_begin = last.tokens_end = static_cast<std::uint32_t>(tokens_.size());
      tokens_.push_back(t);
      last.tokens_end = static_cast<std::uint32_t>(tokens_.size());
      prev = &s;
    }
    // subtree_end: the next node at the same or a smaller depth.
    std::vector<std::uint32_t> open;
    for (std::uint32_t i = 0; i < nodes_.size(); ++i) {
      while (!open.empty() && nodes_[open.back()].depth >= nodes_[i].depth) {
        nodes_[open.back()].subtree_end = i;
        open.pop_back();
      }
      open.push_back(i);
    }
    for (std::uint32_t i : open) nodes_[i].subtree_end = static_cast<std::uint32_t>(nodes_.size());
    // Tokens were appended in node order, so a subtree's tokens are contiguous.
    first_token_.resize(nodes_.size() + 1);
    for (std::size_t i = 0; i < nodes_.size(); ++i)
      first_token_[i + 1] = first_token_[i] + (nodes_[i].tokens_end - nodes_[i].tokens_begin);
    for (std::size_t i = 0; i < token_bytes.size(); ++i) max_depth_ = std::max(max_depth_, token_bytes[i].size());
  }

  /// `[n_nodes]` nodes in preorder.
  const std::vector<node>& nodes() const noexcept { return nodes_; }
  /// Token ids ending at the nodes, indexed by `node::tokens_begin/end`.
  const std::vector<token_id>& node_tokens() const noexcept { return tokens_; }
  /// Range `[first, last)` of `node_tokens()` holding the tokens of the
  /// subtree of node i (the node itself included).
  std::pair<std::uint32_t, std::uint32_t> subtree_tokens(std::size_t i) const noexcept {
    return {first_token_[i], first_token_[nodes_[i].subtree_end]};
  }
  /// Size of the vocabulary the trie was built from (excluded tokens included).
  std::size_t vocab_size() const noexcept { return n_vocab_; }
  /// Longest token, in bytes.
  std::size_t max_depth() const noexcept { return max_depth_; }

 private:
  std::vector<node> nodes_;
  std::vector<token_id> tokens_;
  std::vector<std::uint32_t> first_token_{0};  // [n_nodes + 1] tokens before node i
  std::size_t n_vocab_ = 0;
  std::size_t max_depth_ = 0;
};

}  // namespace llmkit::grammar
