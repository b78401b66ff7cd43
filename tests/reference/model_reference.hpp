// SPDX-License-Identifier: MIT
#pragma once
// Naive oracles for model/: an O(n^2) SentencePiece-BPE encoder and a
// double-precision Llama forward pass over whole sequences (no cache).

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace llmkit::reference {

/// BPE by rescanning all adjacent pairs after every merge: the highest-score
/// pair that is a token wins, the leftmost on ties; pieces not in the
/// vocabulary fall back to <0xXX> byte tokens, else `unk`.
inline std::vector<std::int32_t> spm_encode(const std::vector<std::string>& tokens, const std::vector<float>& scores,
                                            std::string_view text, bool add_space_prefix, std::int32_t unk) {
  std::map<std::string, std::int32_t> index;
  for (std::size_t i = 0; i < tokens.size(); ++i) index.emplace(tokens[i], static_cast<std::int32_t>(i));
  std::vector<std::int32_t> out;
  if (text.empty()) return out;
  std::string s = add_space_prefix ? "\xe2\x96\x81" : "";
  for (char c : text) s += (c == ' ') ? std::string("\xe2\x96\x81") : std::string(1, c);
  std::vector<std::string> pieces;
  for (std::size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    std::size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    if (n > s.size() - i) n = s.size() - i;
    pieces.push_back(s.substr(i, n));
    i += n;
  }
  for (;;) {
    std::size_t best = pieces.size();
    float best_score = 0;
    for (std::size_t i = 0; i + 1 < pieces.size(); ++i) {
      auto it = index.find(pieces[i] + pieces[i + 1]);
      if (it == index.end()) continue;
      const float sc = scores[static_cast<std::size_t>(it->second)];
      if (best == pieces.size() || sc > best_score) {
        best = i;
        best_score = sc;
      }
    }
    if (best == pieces.size()) break;
    pieces[best] += pieces[best + 1];
    pieces.erase(pieces.begin() + static_cast<std::ptrdiff_t>(best) + 1);
  }
  for (const auto& p : pieces) {
    if (auto it = index.find(p); it != index.end()) {
      out.push_back(it->second);
      continue;
    }
    for (unsigned char c : p) {
      char name[8];
      std::snprintf(name, sizeof name, "<0x%02X>", c);
      auto it = index.find(name);
      out.push_back(it != index.end() ? it->second : unk);
    }
  }
  return out;
}

}  // namespace llmkit::reference
