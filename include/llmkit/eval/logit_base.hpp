// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/eval/logit_base.hpp
/// A model's saved next-token distributions over a perplexity run, and the
/// comparison of another run with them (KL divergence, top-1 agreement,
/// perplexity difference): how a user checks that a quantised file, or
/// another engine, predicts what the reference did.
///
/// The file is llama-perplexity's KL-divergence base
/// (`--kl-divergence-base`), so a base saved by either program is read by
/// the other. Little-endian:
///
/// | bytes | content |
/// |---|---|
/// | 8 | `_logits_` |
/// | 4, 4, 4 | int32 n_ctx, n_vocab, n_chunks |
/// | 4 n_chunks n_ctx | int32 token ids of the chunks (the text's, before BOS replaces each chunk's first) |
/// | 2 row_width per row | one row per scored position (chunking::n_scored per chunk), in order |
///
/// A row is `row_width = 2 ceil(n_vocab / 2) + 4` uint16: the f32 `scale`
/// and f32 `min_log_prob` (4 uint16), then n_vocab levels, then padding.
/// Token i's log-probability is `scale * level_i + min_log_prob`: levels
/// span [max(min logit, max logit - 16), max logit] in 65535 steps, so a
/// log-probability within 16 of the top one is kept to 16 / 65535 / 2, and
/// lower ones read as the floor (the comparison ignores them).

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "llmkit/core/error.hpp"
#include "llmkit/core/ids.hpp"
#include "llmkit/eval/perplexity.hpp"

namespace llmkit::eval {

/// uint16 values per saved row for a vocabulary of n_vocab.
constexpr std::size_t logit_row_width(std::size_t n_vocab) noexcept { return 2 * ((n_vocab + 1) / 2) + 4; }

/// Log-probabilities more than this below the top one are saved as the floor.
inline constexpr float logit_base_range = 16.0f;

/// Writes `[vocab] logits` as one saved row (`[logit_row_width(vocab)] row`).
/// Non-finite logits are refused: a base must describe a distribution.
/// @throws llmkit::error for a wrong row size or a non-finite logit
inline void encode_logit_row(std::span<const float> logits, std::span<std::uint16_t> row) {
  LLMKIT_CHECK(!logits.empty() && row.size() == logit_row_width(logits.size()), "encode_logit_row: ", row.size(),
               " uint16 for a vocabulary of ", logits.size(), " (need ", logit_row_width(logits.size()), ")");
  float hi = logits[0], lo = logits[0];
  for (float x : logits) {
    LLMKIT_CHECK(std::isfinite(x), "encode_logit_row: a logit is ", x);
    hi = std::max(hi, x);
    lo = std::min(lo, x);
  }
  lo = std::max(lo, hi - logit_base_range);
  double sum = 0.0;
  for (float x : logits) sum += std::exp(static_cast<double>(x) - hi);
  const auto lse = static_cast<float>(std::log(sum));
  const float min_log_prob = lo - hi - lse;
  const float scale = (hi - lo) / 65535.0f;
  std::memcpy(row.data(), &scale, sizeof scale);
  std::memcpy(row.data() + 2, &min_log_prob, sizeof min_log_prob);
  std::uint16_t* levels = row.data() + 4;
  std::fill(levels, row.data() + row.size(), std::uint16_t{0});
  if (scale == 0.0f) return;
  const float inv = 1.0f / scale;
  for (std::size_t i = 0; i < logits.size(); ++i)
    if (logits[i] > lo) levels[i] = static_cast<std::uint16_t>(std::min(std::lrintf(inv * (logits[i] - lo)), 65535L));
}

/// Token i's saved log-probability in `row` (see the file comment).
inline double saved_log_prob(std::span<const std::uint16_t> row, std::size_t i) noexcept {
  float scale = 0.0f, min_log_prob = 0.0f;
  std::memcpy(&scale, row.data(), sizeof scale);
  std::memcpy(&min_log_prob, row.data() + 2, sizeof min_log_prob);
  return static_cast<double>(scale) * row[4 + i] + static_cast<double>(min_log_prob);
}

/// What a base file holds before its rows.
struct logit_base_header {
  std::size_t n_ctx = 0;
  std::size_t n_vocab = 0;
  std::size_t n_chunks = 0;
  /// `[n_chunks * n_ctx]` the chunks' text tokens.
  std::vector<token_id> tokens;
};

/// Writes a base file row by row.
class logit_base_writer {
 public:
  /// Creates `path` and writes the header.
  /// @throws llmkit::error when the file cannot be written or the header is
  /// inconsistent (tokens.size() != n_chunks * n_ctx, sizes beyond int32).
  logit_base_writer(const std::string& path, const logit_base_header& h)
      : out_(path, std::ios::binary | std::ios::trunc), n_vocab_(h.n_vocab), row_(logit_row_width(h.n_vocab)) {
    LLMKIT_CHECK(out_.is_open(), "--save-logits: cannot create '", path, "'");
    LLMKIT_CHECK(h.tokens.size() == h.n_chunks * h.n_ctx, "logit base: ", h.tokens.size(), " tokens for ", h.n_chunks,
                 " chunks of ", h.n_ctx);
    constexpr auto int32_max = static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max());
    LLMKIT_CHECK(h.n_ctx <= int32_max && h.n_vocab <= int32_max && h.n_chunks <= int32_max && h.n_vocab > 0,
                 "logit base: n_ctx ", h.n_ctx, ", n_vocab ", h.n_vocab, ", n_chunks ", h.n_chunks,
                 " do not fit the file's int32 fields");
    out_.write("_logits_", 8);
    for (std::size_t v : {h.n_ctx, h.n_vocab, h.n_chunks}) put_i32(static_cast<std::int32_t>(v));
    for (token_id t : h.tokens) put_i32(t);
    check(path);
  }

  /// Appends the row of `[n_vocab] logits` (encode_logit_row).
  void write_row(std::span<const float> logits) {
    LLMKIT_CHECK(logits.size() == n_vocab_, "logit base: a row of ", logits.size(), " logits, the base has ",
                 n_vocab_);
    encode_logit_row(logits, row_);
    out_.write(reinterpret_cast<const char*>(row_.data()),
               static_cast<std::streamsize>(row_.size() * sizeof(std::uint16_t)));
  }

  /// Flushes; @throws llmkit::error when a write failed (e.g. disk full).
  void check(const std::string& path) {
    out_.flush();
    LLMKIT_CHECK(out_.good(), "--save-logits: writing '", path, "' failed");
  }

 private:
  void put_i32(std::int32_t v) { out_.write(reinterpret_cast<const char*>(&v), sizeof v); }

  std::ofstream out_;
  std::size_t n_vocab_;
  std::vector<std::uint16_t> row_;
};

/// Reads a base file: the header at construction, then the rows in order.
class logit_base_reader {
 public:
  /// @throws llmkit::error for a missing file, another magic, sizes out of
  /// range or a file shorter than its header and rows say.
  explicit logit_base_reader(const std::string& path) : in_(path, std::ios::binary), path_(path) {
    LLMKIT_CHECK(in_.is_open(), "--kl-base: cannot open '", path, "'");
    char magic[8] = {};
    in_.read(magic, 8);
    LLMKIT_CHECK(in_.good() && std::memcmp(magic, "_logits_", 8) == 0, "--kl-base: '", path,
                 "' is not a logit base (llama-perplexity --kl-divergence-base or llmkit-perplexity --save-logits)");
    const std::int32_t n_ctx = get_i32(), n_vocab = get_i32(), n_chunks = get_i32();
    LLMKIT_CHECK(n_ctx >= 4 && n_vocab > 0 && n_chunks > 0, "--kl-base: '", path, "' has n_ctx ", n_ctx, ", n_vocab ",
                 n_vocab, ", n_chunks ", n_chunks);
    header_.n_ctx = static_cast<std::size_t>(n_ctx);
    header_.n_vocab = static_cast<std::size_t>(n_vocab);
    header_.n_chunks = static_cast<std::size_t>(n_chunks);
    const chunking plan{header_.n_ctx, header_.n_chunks};
    const std::uint64_t expected = 20 + 4ull * header_.n_ctx * header_.n_chunks +
                                   2ull * logit_row_width(header_.n_vocab) * plan.n_scored() * header_.n_chunks;
    in_.seekg(0, std::ios::end);
    const auto size = static_cast<std::uint64_t>(in_.tellg());
    LLMKIT_CHECK(size == expected, "--kl-base: '", path, "' has ", size, " bytes; its header (n_ctx ", n_ctx,
                 ", n_vocab ", n_vocab, ", n_chunks ", n_chunks, ") says ", expected);
    in_.seekg(20);
    header_.tokens.resize(header_.n_ctx * header_.n_chunks);
    in_.read(reinterpret_cast<char*>(header_.tokens.data()),
             static_cast<std::streamsize>(header_.tokens.size() * sizeof(token_id)));
    LLMKIT_CHECK(in_.good(), "--kl-base: reading the tokens of '", path, "' failed");
    row_.resize(logit_row_width(header_.n_vocab));
  }

  const logit_base_header& header() const noexcept { return header_; }

  /// The next row (`[logit_row_width(n_vocab)]`), valid until the next call.
  std::span<const std::uint16_t> next_row() {
    in_.read(reinterpret_cast<char*>(row_.data()), static_cast<std::streamsize>(row_.size() * sizeof(std::uint16_t)));
    LLMKIT_CHECK(in_.good(), "--kl-base: '", path_, "' ends early");
    return row_;
  }

 private:
  std::int32_t get_i32() {
    std::int32_t v = 0;
    in_.read(reinterpret_cast<char*>(&v), sizeof v);
    LLMKIT_CHECK(in_.good(), "--kl-base: '", path_, "' ends inside its header");
    return v;
  }

  std::ifstream in_;
  std::string path_;
  logit_base_header header_;
  std::vector<std::uint16_t> row_;
};

/// A run compared with a base, position by position (llama-perplexity's
/// `--kl-divergence` statistics). The run's distribution is rounded as the
/// base's was (encode_logit_row) before the two are compared, so a run
/// compared with its own base gives KL 0 and the same top token exactly;
/// llama-perplexity compares the unrounded one (a difference below 1e-4
/// per position). The NLL and perplexity use the unrounded logits.
struct kl_comparison {
  running_mean nll;       ///< this run's -log p(next token)
  running_mean nll_base;  ///< the base's
  double sum_nll_nll_base = 0.0;
  running_mean kl;      ///< KL(base || this run) per position, over the base's kept tokens
  running_mean p_diff;  ///< p(next) - p_base(next)
  std::size_t n_same_top = 0;
  std::vector<double> kl_values;  ///< every position's KL, for its quantiles

  /// Adds one position: this run's `[vocab] logits`, the base's row and the
  /// token that came next. @throws llmkit::error on a size mismatch, a
  /// token outside the vocabulary or a non-finite logit.
  void add(std::span<const float> logits, std::span<const std::uint16_t> base_row, token_id next,
           std::vector<double>& scratch) {
    LLMKIT_CHECK(base_row.size() == logit_row_width(logits.size()), "kl_comparison: a base row of ", base_row.size(),
                 " for a vocabulary of ", logits.size());
    const double lp = -token_nll(logits, next, scratch);
    const double lp_base = saved_log_prob(base_row, static_cast<std::size_t>(next));
    nll.add(-lp);
    nll_base.add(-lp_base);
    sum_nll_nll_base += lp * lp_base;
    row_.resize(base_row.size());
    encode_logit_row(logits, row_);
    std::size_t top = 0, top_base = 0;
    double sum = 0.0;
    for (std::size_t i = 0; i < logits.size(); ++i) {
      if (row_[4 + i] > row_[4 + top]) top = i;
      if (base_row[4 + i] > base_row[4 + top_base]) top_base = i;
      const double b = saved_log_prob(base_row, i);
      if (b > -static_cast<double>(logit_base_range)) sum += std::exp(b) * (b - saved_log_prob(row_, i));
    }
    kl.add(sum);
    kl_values.push_back(sum);
    p_diff.add(std::exp(lp) - std::exp(lp_base));
    if (top == top_base) ++n_same_top;
  }

  std::size_t count() const noexcept { return nll.count; }
  /// Fraction of positions whose most likely token is the base's.
  estimate same_top() const noexcept {
    const auto n = static_cast<double>(count());
    const double f = n == 0 ? 0.0 : static_cast<double>(n_same_top) / n;
    return {f, n > 1 ? std::sqrt(f * (1 - f) / (n - 1)) : 0.0};
  }
  /// ln(PPL / PPL_base) with its uncertainty (the two runs' NLLs correlate).
  estimate log_ppl_ratio() const noexcept {
    const double a = nll.standard_error(), b = nll_base.standard_error();
    const auto n = static_cast<double>(count());
    const double cov =
        count() < 2 ? 0.0 : (sum_nll_nll_base / n - nll.mean() * nll_base.mean()) / (n - 1);
    return {nll.mean() - nll_base.mean(), std::sqrt(std::max(0.0, a * a + b * b - 2 * cov))};
  }
  /// PPL - PPL_base with its uncertainty.
  estimate ppl_difference() const noexcept {
    const estimate p = perplexity_of(nll), q = perplexity_of(nll_base);
    const auto n = static_cast<double>(count());
    const double cov =
        count() < 2 ? 0.0 : (sum_nll_nll_base / n - nll.mean() * nll_base.mean()) / (n - 1) * p.value * q.value;
    return {p.value - q.value,
            std::sqrt(std::max(0.0, p.uncertainty * p.uncertainty + q.uncertainty * q.uncertainty - 2 * cov))};
  }
  /// The q-quantile (0 <= q <= 1) of the positions' KL divergences; 0 when empty.
  double kl_quantile(double q) const {
    if (kl_values.empty()) return 0.0;
    std::vector<double> v = kl_values;
    const auto k = static_cast<std::size_t>(std::clamp(q, 0.0, 1.0) * static_cast<double>(v.size() - 1) + 0.5);
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
    return v[k];
  }

 private:
  std::vector<std::uint16_t> row_;  // this run's rounded row
};

}  // namespace llmkit::eval
