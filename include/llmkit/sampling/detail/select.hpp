// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/sampling/detail/select.hpp
/// Sorting-free selection of the truncation processors.
///
/// `weighted_select` finds, in the total order (key ascending, token
/// ascending), the shortest prefix whose summed weight reaches a target,
/// by a three-level radix select on the 32-bit keys (11 + 11 + 10 bits): one
/// histogram pass over all entries, then two over the few entries of the
/// crossing bucket. Cost O(n) plus a 2048-bucket scan, never a sort.
/// `top_k_indices` first tries a threshold filter (estimate the k-th largest
/// logit from a strided sample of 1024, collect the entries above it with a
/// vector compare, select among those), falling back to the radix select.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <type_traits>
#include <utility>

#include "llmkit/sampling/candidates.hpp"
#include "llmkit/sampling/detail/kernels.hpp"
#include "llmkit/simd/arch.hpp"
#include "llmkit/simd/detail/diagnostics.hpp"

LLMKIT_SIMD_DIAGNOSTICS_BEGIN

namespace llmkit::sampling::detail {

/// The boundary of a selected prefix: entries with key < key_, and those with
/// key == key_ and token <= tie_cutoff_, are kept (n_keep_ in all).
struct selection {
  std::uint32_t key_ = 0;
  std::int32_t tie_cutoff_ = 0;
  std::size_t n_keep_ = 0;
  bool keep_all_ = false;
  /// Some entries with key == key_ are dropped (token above tie_cutoff_).
  bool partial_ties_ = false;

  bool keeps(std::uint32_t key, std::int32_t token) const noexcept {
    return keep_all_ || key < key_ || (key == key_ && token <= tie_cutoff_);
  }
};

/// Writes descending_key(values[i]) to `[n] keys`.
inline void descending_keys(std::span<const float> values, std::span<std::uint32_t> keys) noexcept {
  for (std::size_t i = 0; i < values.size(); ++i) keys[i] = descending_key(values[i]);
}

/// How weighted_select reads its target.
enum class select_target : std::uint8_t {
  absolute,           ///< a summed weight (a count with unit weights)
  fraction_of_total,  ///< a fraction of the total weight
};

/// Shortest prefix of (key asc, token asc) with summed weight >= target
/// (target * total weight for `fraction_of_total`). `[n] keys`, `[n] weights`
/// (empty for unit weights), token(i) the token of entry i.
template <class TokenFn>
selection weighted_select(std::span<const std::uint32_t> keys, std::span<const float> weights, TokenFn&& token,
                          double target, select_target target_kind, scratch_buffers& scratch) {
  const std::size_t n = keys.size();
  const bool unit = weights.empty();
  auto weight = [&](std::size_t i) -> double { return unit ? 1.0 : static_cast<double>(weights[i]); };
  selection result;

  // Level 1: all entries, top 11 bits.
  std::array<double, 2048> hist_w{};
  std::array<std::uint32_t, 2048> hist_c{};
  if (unit) {
    for (std::size_t i = 0; i < n; ++i) ++hist_c[keys[i] >> 21];
    for (std::size_t b = 0; b < 2048; ++b) hist_w[b] = hist_c[b];
  } else {
    // Two interleaved histograms halve the store-to-load chains on hot buckets.
    std::array<double, 2048> hist_w2{};
    std::size_t i = 0;
    for (; i + 2 <= n; i += 2) {
      const std::uint32_t b0 = keys[i] >> 21, b1 = keys[i + 1] >> 21;
      hist_w[b0] += weights[i];
      hist_w2[b1] += weights[i + 1];
      ++hist_c[b0];
      ++hist_c[b1];
    }
    for (; i < n; ++i) {
      hist_w[keys[i] >> 21] += weights[i];
      ++hist_c[keys[i] >> 21];
    }
    for (std::size_t b = 0; b < 2048; ++b) hist_w[b] += hist_w2[b];
  }
  double total = 0.0;
  for (double w : hist_w) total += w;
  double goal = target_kind == select_target::fraction_of_total ? target * total : target;
  if (goal >= total) {
    result.keep_all_ = true;
    result.n_keep_ = n;
    return result;
  }

  // Finds the bucket where the running weight reaches `goal`; updates goal to
  // what remains inside it and counts the entries before it.
  auto pick = [&](std::size_t n_buckets, std::size_t& n_less) -> std::size_t {
    double cum = 0.0;
    std::size_t count = 0;
    std::size_t last_nonempty = 0;
    for (std::size_t b = 0; b < n_buckets; ++b) {
      if (hist_c[b] == 0) continue;
      if (hist_w[b] > 0.0) last_nonempty = b;
      if (cum + hist_w[b] >= goal && hist_w[b] > 0.0) {
        goal -= cum;
        n_less += count;
        return b;
      }
      cum += hist_w[b];
      count += hist_c[b];
    }
    // Rounding left the goal just above the level's total: keep its last bucket whole.
    std::size_t before = 0;
    for (std::size_t b = 0; b < last_nonempty; ++b) before += hist_c[b];
    n_less += before;
    goal = hist_w[last_nonempty];
    return last_nonempty;
  };

  std::size_t n_less = 0;
  const std::uint32_t b1 = static_cast<std::uint32_t>(pick(2048, n_less));
  grow(scratch.index, hist_c[b1]);
  std::size_t m = 0;
  for (std::size_t i = 0; i < n; ++i)
    if ((keys[i] >> 21) == b1) scratch.index[m++] = static_cast<std::uint32_t>(i);

  // Levels 2 and 3 on the crossing bucket only.
  const int shifts[2] = {10, 0};
  const std::uint32_t masks[2] = {0x7ffu, 0x3ffu};
  for (int level = 0; level < 2; ++level) {
    hist_w.fill(0.0);
    hist_c.fill(0);
    for (std::size_t j = 0; j < m; ++j) {
      const std::uint32_t i = scratch.index[j];
      const std::uint32_t b = (keys[i] >> shifts[level]) & masks[level];
      hist_w[b] += weight(i);
      ++hist_c[b];
    }
    const std::uint32_t b = static_cast<std::uint32_t>(pick(masks[level] + 1, n_less));
    std::size_t w = 0;
    for (std::size_t j = 0; j < m; ++j) {
      const std::uint32_t i = scratch.index[j];
      if (((keys[i] >> shifts[level]) & masks[level]) == b) scratch.index[w++] = i;
    }
    m = w;
  }
  LLMKIT_ASSERT(m >= 1);
  result.key_ = keys[scratch.index[0]];

  // Ties (equal keys): keep the lowest tokens until the goal is reached.
  std::sort(scratch.index.begin(), scratch.index.begin() + static_cast<std::ptrdiff_t>(m),
            [&](std::uint32_t a, std::uint32_t b) { return token(a) < token(b); });
  double cum = 0.0;
  std::size_t n_tie = m;
  for (std::size_t j = 0; j < m; ++j) {
    cum += weight(scratch.index[j]);
    if (cum >= goal) {
      n_tie = j + 1;
      break;
    }
  }
  result.tie_cutoff_ = token(scratch.index[n_tie - 1]);
  result.partial_ties_ = n_tie < m;
  result.n_keep_ = n_less + n_tie;
  return result;
}

/// Order of the top-k: logit descending, then token ascending.
struct by_logit_then_token {
  const float* values;
  const candidates* c;
  bool operator()(std::uint32_t a, std::uint32_t b) const noexcept {
    if (values[a] != values[b]) return values[a] > values[b];
    return c->token(a) < c->token(b);
  }
};

/// Threshold filter for small k on a dense row: fills `[k] out` with the
/// indices of the top k in order, or returns false to ask for the fallback.
template <class Arch = simd::default_arch>
bool filter_top_k(std::span<const float> values, std::size_t k, std::span<std::uint32_t> out,
                  scratch_buffers& scratch) {
  const std::size_t n = values.size();
  constexpr std::size_t n_sample = 1024;
  if (n < 8 * n_sample || k * 16 >= n) return false;
  // Rank in the sample whose value has about 4k + 4 * stride entries above it.
  const std::size_t stride = n / n_sample;
  const std::size_t rank = std::min(n_sample - 1, (4 * k * n_sample + n - 1) / n + 4);
  std::array<float, n_sample> sample;
  for (std::size_t j = 0; j < n_sample; ++j) sample[j] = values[j * stride];
  std::nth_element(sample.begin(), sample.begin() + static_cast<std::ptrdiff_t>(rank), sample.end(),
                   std::greater<float>());
  const float threshold = sample[rank];
  if (threshold == -std::numeric_limits<float>::infinity()) return false;
  const std::size_t cap = std::max<std::size_t>(64 * k, n / 16);
  grow(scratch.index2, cap + 64);
  std::uint32_t* hits = scratch.index2.data();
  std::size_t n_hits = 0;
  const float* v = values.data();
  std::size_t i = 0;
  if constexpr (!simd::is_scalar_v<Arch>) {
    using fb = xsimd::batch<float, Arch>;
    constexpr std::size_t L = fb::size;
    const fb t(threshold);
    for (; i + L <= n; i += L) {
      if (xsimd::any(fb::load_unaligned(v + i) >= t)) {
        for (std::size_t l = 0; l < L; ++l)
          if (v[i + l] >= threshold) hits[n_hits++] = static_cast<std::uint32_t>(i + l);
        if (n_hits > cap) return false;
      }
    }
  }
  for (; i < n; ++i) {
    if (v[i] >= threshold) hits[n_hits++] = static_cast<std::uint32_t>(i);
    if (n_hits > cap) return false;
  }
  if (n_hits < k) return false;
  std::partial_sort(hits, hits + k, hits + n_hits, [v](std::uint32_t a, std::uint32_t b) {
    return v[a] != v[b] ? v[a] > v[b] : a < b;
  });
  std::copy(hits, hits + k, out.begin());
  return true;
}

/// Indices into c.values() of the k best entries (logit descending, token
/// ascending), written to scratch().index2[0, k) which is returned.
/// @pre 1 <= k <= c.size()
inline std::span<const std::uint32_t> top_k_indices(candidates& c, std::size_t k) {
  auto& s = c.scratch();
  const auto values = c.values();
  const std::size_t n = values.size();
  aligned_vector<std::uint32_t>& out = s.keys;  // keys are rebuilt by the fallback anyway
  grow(out, std::max(n, k));
  if (c.is_sorted()) {
    for (std::size_t j = 0; j < k; ++j) out[j] = static_cast<std::uint32_t>(j);
  } else if (!(c.is_dense() && filter_top_k(values, k, std::span<std::uint32_t>(out.data(), k), s))) {
    descending_keys(values, std::span<std::uint32_t>(out.data(), n));
    const selection sel = weighted_select(std::span<const std::uint32_t>(out.data(), n), {},
                                          [&](std::size_t i) { return c.token(i); }, static_cast<double>(k),
                                          select_target::absolute, s);
    std::size_t w = 0;
    for (std::size_t i = 0; i < n; ++i)
      if (sel.keeps(out[i], c.token(i))) out[w++] = static_cast<std::uint32_t>(i);
    LLMKIT_ASSERT(w == k);
    std::sort(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(k), by_logit_then_token{values.data(), &c});
  }
  grow(s.index2, k);
  std::copy(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(k), s.index2.begin());
  return {s.index2.data(), k};
}

}  // namespace llmkit::sampling::detail

LLMKIT_SIMD_DIAGNOSTICS_END
