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
#include <optional>
#include <span>
#include <type_traits>
#include <utility>

#include "llmkit/sampling/candidates.hpp"
#include "llmkit/sampling/detail/kernels.hpp"
#include "llmkit/simd/arch.hpp"

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

/// Shortest prefix of (key asc, token asc) with summed weight >= target
/// (target * total weight when `relative`). `[n] keys`, `[n] weights` (empty
/// for unit weights), token(i) the token of entry i.
template <class TokenFn>
selection weighted_select(std::span<const std::uint32_t> keys, std::span<const float> weights, TokenFn&& token,
                          double target, bool relative, scratch_buffers& scratch) {
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
  double goal = relative ? target * total : target;
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
    double cum_before = 0.0;
    for (std::size_t b = 0; b < last_nonempty; ++b) {
      before += hist_c[b];
      cum_before += hist_w[b];
    }
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

/// Score of top-p: the logit, larger first (score -v; key descending_key(v)).
struct top_p_score {
  float operator()(float v) const noexcept { return -v; }
  template <class B>
  B operator()(const B& v) const noexcept {
    return -v;
  }
  std::uint32_t key(float v) const noexcept { return descending_key(v); }
};

/// Score of typical-p: the distance |v - center|, smaller first.
struct typical_score {
  float center_ = 0.0f;
  float operator()(float v) const noexcept { return std::fabs(v - center_); }
  template <class B>
  B operator()(const B& v) const noexcept {
    return xsimd::abs(v - B(center_));
  }
  std::uint32_t key(float v) const noexcept { return std::bit_cast<std::uint32_t>(std::fabs(v - center_)); }
};

/// Fast path of the mass selections (top-p, typical-p) on long rows: the
/// crossing point is estimated from a strided sample of 1024 entries and
/// bracketed by the sample's scores +-48 ranks around it (about 3.7 sigma);
/// one vector pass sums the exact mass below the bracket and gathers the
/// entries inside it, and the radix select runs on those only. Returns
/// nullopt (the caller falls back to the full radix select) when the row is
/// short or the bracket misses. `[n] values`, `[n] weights` = exp(v - max),
/// total = their sum, `fraction` in (0, 1).
template <class Score, class TokenFn, class Arch = simd::default_arch>
std::optional<selection> mass_select(std::span<const float> values, std::span<const float> weights, TokenFn&& token,
                                     const Score& score, double fraction, double total, scratch_buffers& scratch) {
  const std::size_t n = values.size();
  constexpr std::size_t n_sample = 1024, margin = 48;
  if constexpr (simd::is_scalar_v<Arch>) return std::nullopt;
  else {
    if (n < 16 * n_sample) return std::nullopt;
    const std::size_t stride = n / n_sample;
    std::array<std::pair<float, float>, n_sample> sample;
    double sample_total = 0.0;
    for (std::size_t j = 0; j < n_sample; ++j) {
      sample[j] = {score(values[j * stride]), weights[j * stride]};
      sample_total += sample[j].second;
    }
    std::sort(sample.begin(), sample.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    const double sample_goal = fraction * sample_total;
    std::size_t rank = n_sample - 1;
    double cum = 0.0;
    for (std::size_t j = 0; j < n_sample; ++j) {
      cum += sample[j].second;
      if (cum >= sample_goal) {
        rank = j;
        break;
      }
    }
    constexpr float inf = std::numeric_limits<float>::infinity();
    const float t_lo = rank >= margin ? sample[rank - margin].first : -inf;
    const float t_hi = rank + margin < n_sample ? sample[rank + margin].first : inf;

    using fb = xsimd::batch<float, Arch>;
    constexpr std::size_t L = fb::size;
    const std::size_t cap = n / 4;
    grow(scratch.index2, cap + L);
    std::uint32_t* mid = scratch.index2.data();
    std::size_t n_mid = 0, n_below = 0;
    fb mass_below(0.0f), mass_mid(0.0f);
    const fb lo(t_lo), hi(t_hi), zero(0.0f);
    const float* v = values.data();
    const float* w = weights.data();
    std::size_t i = 0;
#if XSIMD_WITH_AVX512F
    if constexpr (std::is_base_of_v<xsimd::avx512f, Arch>) {
      // AVX-512: mask registers, popcounts and in-register compression; no scalar lane loop.
      __m512 below_acc = _mm512_setzero_ps(), mid_acc = _mm512_setzero_ps();
      __m512i index = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
      const __m512i step = _mm512_set1_epi32(16);
      for (; i + 16 <= n; i += 16) {
        const __m512 e = _mm512_loadu_ps(w + i);
        const __m512 sc = score(fb(_mm512_loadu_ps(v + i)));
        const __mmask16 below = _mm512_cmp_ps_mask(sc, lo, _CMP_LT_OQ);
        const __mmask16 inside = _mm512_cmp_ps_mask(sc, lo, _CMP_GE_OQ) & _mm512_cmp_ps_mask(sc, hi, _CMP_LE_OQ);
        below_acc = _mm512_mask_add_ps(below_acc, below, below_acc, e);
        mid_acc = _mm512_mask_add_ps(mid_acc, inside, mid_acc, e);
        n_below += static_cast<std::size_t>(__builtin_popcount(below));
        _mm512_storeu_si512(mid + n_mid, _mm512_maskz_compress_epi32(inside, index));
        n_mid += static_cast<std::size_t>(__builtin_popcount(inside));
        if (n_mid > cap) return std::nullopt;
        index = _mm512_add_epi32(index, step);
      }
      mass_below = fb(below_acc);
      mass_mid = fb(mid_acc);
    }
#endif
    for (; i + L <= n; i += L) {
      const fb x = fb::load_unaligned(v + i);
      const fb e = fb::load_unaligned(w + i);
      const fb s = score(x);
      const auto below = s < lo;
      const auto inside = (s >= lo) & (s <= hi);
      mass_below += xsimd::select(below, e, zero);
      if (xsimd::any(inside)) {
        mass_mid += xsimd::select(inside, e, zero);
        for (std::size_t l = 0; l < L; ++l) {
          const float sl = score(v[i + l]);
          if (sl >= t_lo && sl <= t_hi) mid[n_mid++] = static_cast<std::uint32_t>(i + l);
        }
        if (n_mid > cap) return std::nullopt;
      }
      if (xsimd::any(below)) {
        for (std::size_t l = 0; l < L; ++l) n_below += score(v[i + l]) < t_lo ? 1 : 0;
      }
    }
    double below_total = xsimd::hadd(mass_below), mid_total = xsimd::hadd(mass_mid);
    for (; i < n; ++i) {
      const float sl = score(v[i]);
      if (sl < t_lo) {
        below_total += w[i];
        ++n_below;
      } else if (sl <= t_hi) {
        mid_total += w[i];
        mid[n_mid++] = static_cast<std::uint32_t>(i);
        if (n_mid > cap) return std::nullopt;
      }
    }
    const double goal = fraction * total;
    // The crossing must lie strictly inside the bracket (with a little room for rounding).
    if (!(below_total < goal * (1 - 1e-6) && goal * (1 + 1e-6) <= below_total + mid_total) || n_mid == 0)
      return std::nullopt;
    grow(scratch.keys, n_mid);
    grow(scratch.weights2, n_mid);
    for (std::size_t j = 0; j < n_mid; ++j) {
      scratch.keys[j] = score.key(v[mid[j]]);
      scratch.weights2[j] = w[mid[j]];
    }
    selection sel = weighted_select({scratch.keys.data(), n_mid}, {scratch.weights2.data(), n_mid},
                                    [&](std::size_t j) { return token(mid[j]); }, goal - below_total, false, scratch);
    if (sel.keep_all_) return std::nullopt;
    sel.n_keep_ += n_below;
    return sel;
  }
}

/// After keeping every logit >= v_k: removes the entries equal to v_k whose
/// token is above `cutoff` when more than `n_keep` entries remain (ties at the
/// boundary of a selection are kept in token order).
inline void trim_ties(candidates& c, float v_k, std::int32_t cutoff, std::size_t n_keep) {
  const auto v = c.values();
  std::size_t n_now = 0;
  for (float x : v) n_now += x >= v_k ? 1 : 0;
  if (n_now <= n_keep) return;
  c.retain([&](std::size_t i) { return v[i] > v_k || (v[i] == v_k && c.token(i) <= cutoff); }, n_keep);
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
                                          false, s);
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
