// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/sampling/detail/mass_select.hpp
/// The selection shared by top-p and typical-p: with a per-token *score*
/// (top-p: -logit; typical: |logit - mean logit|) and p_i = softmax_i, keep
/// the shortest prefix of the order (score ascending, token ascending) whose
/// summed probability reaches `fraction`. No sort of the row:
///
/// 1. a strided sample of 1024 (score, exp) pairs, radix-sorted, estimates
///    the crossing score and brackets it by 4 standard errors of the
///    sample's mass estimate, between +-48 and +-112 sample ranks;
/// 2. one vector pass over the row (fused with the exponentials for top-p)
///    sums the mass below the bracket and compresses the entries inside it
///    (AVX-512: in-register compression, no branch per lane) into a compact
///    set of ~10% of the row; when the estimated kept set is small (<= 1/8 of
///    the row) the bracket is one-sided and the compact set holds every
///    candidate for keeping, so the result is built from it; if the
///    crossing lies outside the bracket (heavy-tailed rows can fool the
///    sample), one more pass brackets the side it lies on;
/// 3. threshold refinement on the compact set: 15 thresholds taken from a
///    64-entry sample of the set, one SIMD pass of masked sums finds the
///    bucket where the running mass reaches the goal, one compressing pass
///    keeps that bucket (~1/16 of the set); repeated while the set has more
///    than 32 entries and shrinks;
/// 4. the few remaining entries are sorted by (score, token) and scanned.
///
/// Masses are float lanes flushed to double every 256 (row pass) or 1024
/// (refinement) entries, so the cut matches the exact order up to ~1e-6 of
/// the total mass. A three-level radix select over the whole row
/// (detail/select.hpp) finds the same boundary when a bracket holds over 1/4
/// of the row (heavy tie groups, p near 1), when both passes miss, on rows
/// under 16384 entries and on the scalar arch.

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <utility>

#include "llmkit/core/error.hpp"
#include "llmkit/sampling/candidates.hpp"
#include "llmkit/sampling/detail/kernels.hpp"
#include "llmkit/sampling/detail/select.hpp"
#include "llmkit/simd/arch.hpp"
#include "llmkit/simd/detail/diagnostics.hpp"

LLMKIT_SIMD_DIAGNOSTICS_BEGIN

namespace llmkit::sampling::detail {

/// Score of top-p: the negated logit (larger logits first).
struct top_p_score {
  static constexpr bool keeps_max = true;
  float operator()(float v) const noexcept { return -v; }
  template <class B>
  B operator()(const B& v) const noexcept {
    return -v;
  }
  /// Radix key ascending in the score; -0 and +0 share a key.
  std::uint32_t key(float v) const noexcept { return descending_key(v + 0.0f); }
  float score_of_key(std::uint32_t key) const noexcept { return -value_of_descending_key(key); }
};

/// Score of typical-p: the distance |v - center|, smaller first.
struct typical_score {
  static constexpr bool keeps_max = false;
  float center_ = 0.0f;
  float operator()(float v) const noexcept { return std::fabs(v - center_); }
  template <class B>
  B operator()(const B& v) const noexcept {
    return xsimd::abs(v - B(center_));
  }
  std::uint32_t key(float v) const noexcept { return std::bit_cast<std::uint32_t>((*this)(v)); }
  float score_of_key(std::uint32_t key) const noexcept { return std::bit_cast<float>(key); }
};

/// The last kept entry of a mass selection: entries with score < score_, and
/// those with score == score_ and token <= tie_cutoff_, are kept (n_keep_).
struct mass_boundary {
  float score_ = 0.0f;
  std::int32_t tie_cutoff_ = 0;
  std::size_t n_keep_ = 0;
  /// Some entries with score == score_ are dropped (token above tie_cutoff_).
  bool partial_ties_ = false;
};

/// Order-preserving map of a float to uint32 ascending in the value.
inline std::uint32_t ascending_key(float v) noexcept {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(v);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/// exp(v - m) into `[n] exps` for `[n] values`; returns {sum of exp, sum of
/// exp * (v - m)} (entries with exp = 0 add 0), in double.
template <class Arch = simd::default_arch>
std::pair<double, double> exp_weighted_sums(std::span<const float> values, float m, std::span<float> exps) {
  const std::size_t n = values.size();
  const float* v = values.data();
  float* out = exps.data();
  double total = 0.0, weighted = 0.0;
  std::size_t i = 0;
  if constexpr (!simd::is_scalar_v<Arch>) {
    using fb = xsimd::batch<float, Arch>;
    constexpr std::size_t L = fb::size;
    const fb mb(m), zero(0.0f);
    while (i + L <= n) {
      fb acc_t(0.0f), acc_w(0.0f);
      const std::size_t end = std::min(n - n % L, i + sum_block);
      for (; i < end; i += L) {
        const fb d = fb::load_unaligned(v + i) - mb;
        const fb e = exp_canonical<Arch>(d);
        e.store_unaligned(out + i);
        acc_t += e;
        acc_w += xsimd::select(e > zero, e * d, zero);
      }
      total += xsimd::hadd(acc_t);
      weighted += xsimd::hadd(acc_w);
    }
  }
  for (; i < n; ++i) {
    const float d = v[i] - m;
    const float e = exp_canonical(d);
    out[i] = e;
    total += e;
    if (e > 0.0f) weighted += static_cast<double>(e) * static_cast<double>(d);
  }
  return {total, weighted};
}

/// Result of `bracket_pass`.
struct bracket_result {
  double total = 0.0;  ///< mass of the row (when computed)
  double below = 0.0;  ///< mass of score < lo
  std::size_t n_below = 0, n_inside = 0;
  bool overflow = false;  ///< more than `cap` entries inside
};

/// bracket_pass from entry i on, one entry at a time, with n_in entries
/// written inside so far: the tail every overload ends with.
template <bool LoadWeights, class Score>
bracket_result bracket_tail(std::span<const float> values, const float* weights, float m, const Score& score,
                            float lo, float hi, float* out_v, std::uint32_t* out_i, std::size_t cap, std::size_t i,
                            std::size_t n_in, bracket_result r) {
  const std::size_t n = values.size();
  const float* v = values.data();
  auto weight = [&](std::size_t j) { return LoadWeights ? weights[j] : exp_canonical(v[j] - m); };
  for (; i < n; ++i) {
    const float e = weight(i);
    const float s = score(v[i]);
    r.total += e;
    if (s < lo) {
      r.below += e;
      ++r.n_below;
    } else if (s < hi) {
      out_v[n_in] = v[i];
      out_i[n_in] = static_cast<std::uint32_t>(i);
      ++n_in;
    }
  }
  r.n_inside = n_in;
  r.overflow = n_in > cap;
  return r;
}

/// One pass over `[n] values`: with weights e = `weights[i]` (LoadWeights)
/// or exp(v - m), sums all e, sums and counts e over score < lo, and writes
/// the entries with lo <= score < hi, in order, to `out_v` / `out_i` (their
/// values and indices; capacity cap + 272: the check runs every 256
/// entries). Stops with overflow past `cap`. One overload per instruction
/// set (`bracket_pass<Arch, LoadWeights>(..., kernel_arch<Arch>{})`): here
/// xsimd registers, where a lane inside is written one by one.
template <class Arch, bool LoadWeights, class Score>
bracket_result bracket_pass(std::span<const float> values, const float* weights, float m, const Score& score,
                            float lo, float hi, float* out_v, std::uint32_t* out_i, std::size_t cap,
                            simd::requires_arch<xsimd::generic>) {
  const std::size_t n = values.size();
  const float* v = values.data();
  bracket_result r;
  std::size_t i = 0, n_in = 0;
  if constexpr (!simd::is_scalar_v<Arch>) {
    using fb = xsimd::batch<float, Arch>;
    constexpr std::size_t L = fb::size;
    const fb lo_b(lo), hi_b(hi), mb(m), zero(0.0f), one(1.0f);
    const std::size_t nl = n - n % L;
    while (i < nl) {
      fb tot(0.0f), bel(0.0f), cnt(0.0f);
      const std::size_t end = std::min(nl, i + sum_block);
      for (; i < end; i += L) {
        const fb x = fb::load_unaligned(v + i);
        fb e;
        if constexpr (LoadWeights) e = fb::load_unaligned(weights + i);
        else e = exp_canonical<Arch>(x - mb);
        tot += e;
        const fb s = score(x);
        const auto below = s < lo_b;
        bel += xsimd::select(below, e, zero);
        cnt += xsimd::select(below, one, zero);
        if (xsimd::any((s >= lo_b) & (s < hi_b))) {
          for (std::size_t l = 0; l < L; ++l) {
            const float sl = score(v[i + l]);
            out_v[n_in] = v[i + l];
            out_i[n_in] = static_cast<std::uint32_t>(i + l);
            n_in += (sl >= lo && sl < hi) ? 1 : 0;
          }
        }
      }
      if (n_in > cap) {
        r.overflow = true;
        return r;
      }
      r.total += xsimd::hadd(tot);
      r.below += xsimd::hadd(bel);
      r.n_below += static_cast<std::size_t>(xsimd::hadd(cnt));
    }
  }
  return bracket_tail<LoadWeights>(values, weights, m, score, lo, hi, out_v, out_i, cap, i, n_in, r);
}

#if defined(__AVX512F__)
/// The entries inside compressed in registers (no branch per lane), the
/// sums kept in double lanes.
template <class Arch, bool LoadWeights, class Score>
bracket_result bracket_pass(std::span<const float> values, const float* weights, float m, const Score& score,
                            float lo, float hi, float* out_v, std::uint32_t* out_i, std::size_t cap,
                            simd::requires_arch<xsimd::avx512f>) {
  using fb = xsimd::batch<float, Arch>;
  const std::size_t n = values.size();
  const float* v = values.data();
  bracket_result r;
  std::size_t i = 0, n_in = 0;
  const __m512 lo_v = _mm512_set1_ps(lo), hi_v = _mm512_set1_ps(hi), m_v = _mm512_set1_ps(m);
  __m512i index = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i step = _mm512_set1_epi32(16);
  __m512d total_d = _mm512_setzero_pd(), below_d = _mm512_setzero_pd();
  const std::size_t n16 = n - n % 16;
  while (i < n16) {
    __m512 tot = _mm512_setzero_ps(), bel = _mm512_setzero_ps();
    const std::size_t end = std::min(n16, i + sum_block);
    for (; i < end; i += 16) {
      const __m512 x = _mm512_loadu_ps(v + i);
      __m512 e;
      if constexpr (LoadWeights) e = _mm512_loadu_ps(weights + i);
      else e = exp_canonical<Arch>(fb(_mm512_sub_ps(x, m_v)));
      if constexpr (!LoadWeights) tot = _mm512_add_ps(tot, e);
      const __m512 s = score(fb(x));
      const __mmask16 below = _mm512_cmp_ps_mask(s, lo_v, _CMP_LT_OQ);
      const __mmask16 inside = _mm512_mask_cmp_ps_mask(static_cast<__mmask16>(~below), s, hi_v, _CMP_LT_OQ);
      bel = _mm512_mask_add_ps(bel, below, bel, e);
      r.n_below += static_cast<std::size_t>(std::popcount(static_cast<unsigned>(below)));
      // Unconditional compressed stores: cheaper than a mispredicted branch per vector.
      _mm512_storeu_ps(out_v + n_in, _mm512_maskz_compress_ps(inside, x));
      _mm512_storeu_si512(out_i + n_in, _mm512_maskz_compress_epi32(inside, index));
      n_in += static_cast<std::size_t>(std::popcount(static_cast<unsigned>(inside)));
      index = _mm512_add_epi32(index, step);
    }
    if (n_in > cap) {
      r.overflow = true;
      return r;
    }
    total_d = _mm512_add_pd(total_d, _mm512_cvtps_pd(_mm512_castps512_ps256(tot)));
    total_d = _mm512_add_pd(total_d, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(tot), 1))));
    below_d = _mm512_add_pd(below_d, _mm512_cvtps_pd(_mm512_castps512_ps256(bel)));
    below_d = _mm512_add_pd(below_d, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(bel), 1))));
  }
  r.total = _mm512_reduce_add_pd(total_d);
  r.below = _mm512_reduce_add_pd(below_d);
  return bracket_tail<LoadWeights>(values, weights, m, score, lo, hi, out_v, out_i, cap, i, n_in, r);
}
#endif

/// exp(v - m) of `[k] v` into `[k] out`; returns their sum (float lanes
/// over at most 1024 entries, then double).
template <class Arch>
double exp_of(const float* v, std::size_t k, float m, float* out) noexcept {
  std::size_t i = 0;
  double sum = 0.0;
  if constexpr (!simd::is_scalar_v<Arch>) {
    using fb = xsimd::batch<float, Arch>;
    const fb mb(m);
    const std::size_t kl = k - k % fb::size;
    while (i < kl) {
      fb acc(0.0f);
      for (const std::size_t end = std::min(kl, i + 1024); i < end; i += fb::size) {
        const fb e = exp_canonical<Arch>(fb::load_unaligned(v + i) - mb);
        e.store_unaligned(out + i);
        acc += e;
      }
      sum += xsimd::hadd(acc);
    }
  }
  for (; i < k; ++i) sum += out[i] = exp_canonical(v[i] - m);
  return sum;
}

inline constexpr std::size_t n_refine_thresholds = 15;

/// sums[j] = sum of e over the entries with score < t[j] (j < 15), and
/// sums[15] = sum of all e. `[k] v`, `[k] e`.
template <class Arch, class Score>
void threshold_sums(const float* v, const float* e, std::size_t k, const Score& score,
                    const std::array<float, n_refine_thresholds>& t, std::array<double, n_refine_thresholds + 1>& sums) {
  constexpr std::size_t T = n_refine_thresholds;
  sums.fill(0.0);
  std::size_t i = 0;
  if constexpr (!simd::is_scalar_v<Arch>) {
    using fb = xsimd::batch<float, Arch>;
    constexpr std::size_t L = fb::size;
    const fb zero(0.0f);
    const std::size_t kl = k - k % L;
    while (i < kl) {
      // Float lanes over at most 1024 entries, then double.
      fb acc[T + 1];
      for (auto& a : acc) a = zero;
      const std::size_t end = std::min(kl, i + 1024);
      for (; i < end; i += L) {
        const fb x = fb::load_unaligned(v + i), w = fb::load_unaligned(e + i);
        const fb s = score(x);
        for (std::size_t j = 0; j < T; ++j) acc[j] += xsimd::select(s < fb(t[j]), w, zero);
        acc[T] += w;
      }
      for (std::size_t j = 0; j <= T; ++j) sums[j] += xsimd::hadd(acc[j]);
    }
  }
  for (; i < k; ++i) {
    const float s = score(v[i]);
    for (std::size_t j = 0; j < T; ++j)
      if (s < t[j]) sums[j] += e[i];
    sums[T] += e[i];
  }
}

/// compress_range's loop over whole registers, one overload per instruction
/// set (`compress_range_lanes<Arch>(..., w, n_below, kernel_arch<Arch>{})`):
/// returns the entry it stopped at, having advanced w and n_below. The
/// fallback has no such loop.
template <class Arch, class Score>
std::size_t compress_range_lanes(const float*, const float*, const std::uint32_t*, std::size_t, const Score&, float,
                                 float, float*, float*, std::uint32_t*, std::size_t&, std::size_t&,
                                 simd::requires_arch<xsimd::generic>) {
  return 0;
}

#if defined(__AVX512F__)
/// In-register compression, no branch per lane.
template <class Arch, class Score>
std::size_t compress_range_lanes(const float* v, const float* e, const std::uint32_t* idx, std::size_t k,
                                 const Score& score, float lo, float hi, float* ov, float* oe, std::uint32_t* oi,
                                 std::size_t& w, std::size_t& n_below, simd::requires_arch<xsimd::avx512f>) {
  using fb = xsimd::batch<float, Arch>;
  const __m512 lo_v = _mm512_set1_ps(lo), hi_v = _mm512_set1_ps(hi);
  std::size_t i = 0;
  // In place, the 16-lane store at w <= i only covers entries already loaded.
  for (; i + 16 <= k; i += 16) {
    const __m512 x = _mm512_loadu_ps(v + i), ex = _mm512_loadu_ps(e + i);
    const __m512i ix = _mm512_loadu_si512(idx + i);
    const __m512 s = score(fb(x));
    const __mmask16 below = _mm512_cmp_ps_mask(s, lo_v, _CMP_LT_OQ);
    const __mmask16 keep = _mm512_mask_cmp_ps_mask(static_cast<__mmask16>(~below), s, hi_v, _CMP_LT_OQ);
    _mm512_storeu_ps(ov + w, _mm512_maskz_compress_ps(keep, x));
    _mm512_storeu_ps(oe + w, _mm512_maskz_compress_ps(keep, ex));
    _mm512_storeu_si512(oi + w, _mm512_maskz_compress_epi32(keep, ix));
    w += static_cast<std::size_t>(std::popcount(static_cast<unsigned>(keep)));
    n_below += static_cast<std::size_t>(std::popcount(static_cast<unsigned>(below)));
  }
  return i;
}
#endif

/// Keeps the entries with lo <= score < hi of `[k] (v, e, idx)`, in order,
/// writing them to (ov, oe, oi) (which may be the inputs); adds the count of
/// score < lo to n_below; returns how many were kept.
template <class Arch, class Score>
std::size_t compress_range(const float* v, const float* e, const std::uint32_t* idx, std::size_t k,
                           const Score& score, float lo, float hi, float* ov, float* oe, std::uint32_t* oi,
                           std::size_t& n_below) {
  std::size_t w = 0;
  std::size_t i =
      compress_range_lanes<Arch>(v, e, idx, k, score, lo, hi, ov, oe, oi, w, n_below, simd::kernel_arch<Arch>{});
  for (; i < k; ++i) {
    const float s = score(v[i]);
    const float x = v[i], ex = e[i];
    const std::uint32_t ix = idx[i];
    const bool keep = s >= lo && s < hi;
    n_below += s < lo ? 1 : 0;
    ov[w] = x;
    oe[w] = ex;
    oi[w] = ix;
    w += keep ? 1 : 0;
  }
  return w;
}

/// Keeps the entries the boundary keeps (see mass_boundary) with a
/// vectorised threshold pass, then trims partial ties.
template <class Arch = simd::default_arch, class Score>
void keep_up_to(candidates& c, const Score& score, const mass_boundary& b) {
  const float s_b = b.score_;
  c.template retain_values<Arch>([score, s_b](const auto& x) { return score(x) <= decltype(x)(s_b); },
                                 [score, s_b](float x) { return score(x) <= s_b; }, b.n_keep_, Score::keeps_max);
  if (b.partial_ties_) {
    const auto kept = c.values();
    const std::int32_t cut = b.tie_cutoff_;
    c.retain([&](std::size_t i) { return score(kept[i]) < s_b || c.token(i) <= cut; }, b.n_keep_, Score::keeps_max);
  }
}

/// Sorts `[N] items` by their top 24 bits (LSD radix, 3 passes of 8 bits).
/// Only the sample is sorted this way: its order need not be exact below
/// 2^-15 relative, as the bracket it yields is verified.
template <std::size_t N>
void sort_sample(std::array<std::uint64_t, N>& items) noexcept {
  std::array<std::uint64_t, N> tmp;
  std::uint64_t* from = items.data();
  std::uint64_t* to = tmp.data();
  for (int shift = 40; shift < 64; shift += 8) {
    std::array<std::uint32_t, 257> start{};
    for (std::size_t j = 0; j < N; ++j) ++start[((from[j] >> shift) & 0xffu) + 1];
    for (std::size_t b = 1; b < 257; ++b) start[b] += start[b - 1];
    for (std::size_t j = 0; j < N; ++j) to[start[(from[j] >> shift) & 0xffu]++] = from[j];
    std::swap(from, to);
  }
  // Three passes: the result is in tmp.
  std::copy(from, from + N, items.data());
}

/// gather_kept's loop over whole registers, one overload per instruction set
/// (`gather_kept_lanes<Arch>(..., w, kernel_arch<Arch>{})`): returns the
/// entry it stopped at, having advanced w. The fallback has no such loop.
template <class Arch, class Score>
std::size_t gather_kept_lanes(const candidates&, const Score&, const mass_boundary&, std::span<const float>,
                              const std::uint32_t*, std::int32_t*, float*, std::size_t&,
                              simd::requires_arch<xsimd::generic>) {
  return 0;
}

#if defined(__AVX512F__)
/// In-register compression where the tokens are the indices (a dense row)
/// and no tie is split.
template <class Arch, class Score>
std::size_t gather_kept_lanes(const candidates& c, const Score& score, const mass_boundary& b,
                              std::span<const float> values, const std::uint32_t* index, std::int32_t* out_tokens,
                              float* out_values, std::size_t& w, simd::requires_arch<xsimd::avx512f>) {
  const std::size_t k = values.size();
  const float* v = values.data();
  std::size_t i = 0;
  if (c.is_dense() && !b.partial_ties_) {
    using fb = xsimd::batch<float, Arch>;
    const __m512 s_b = _mm512_set1_ps(b.score_);
    for (; i + 16 <= k; i += 16) {
      const __m512 x = _mm512_loadu_ps(v + i);
      const __mmask16 keep = _mm512_cmp_ps_mask(score(fb(x)), s_b, _CMP_LE_OQ);
      _mm512_storeu_ps(out_values + w, _mm512_maskz_compress_ps(keep, x));
      _mm512_storeu_si512(out_tokens + w, _mm512_maskz_compress_epi32(keep, _mm512_loadu_si512(index + i)));
      w += static_cast<std::size_t>(std::popcount(static_cast<unsigned>(keep)));
    }
  }
  return i;
}
#endif

/// Writes the tokens and values of the entries of `[k] (values, index)` the
/// boundary keeps to out_tokens / out_values (capacity k + 16), in order;
/// returns how many. `index` are indices into c.values().
template <class Arch, class Score>
std::size_t gather_kept(const candidates& c, const Score& score, const mass_boundary& b,
                        std::span<const float> values, const std::uint32_t* index, std::int32_t* out_tokens,
                        float* out_values) {
  const std::size_t k = values.size();
  const float* v = values.data();
  std::size_t w = 0;
  std::size_t i = gather_kept_lanes<Arch>(c, score, b, values, index, out_tokens, out_values, w,
                                          simd::kernel_arch<Arch>{});
  for (; i < k; ++i) {
    const float s = score(v[i]);
    const std::int32_t token = c.token(index[i]);
    const bool keep = s < b.score_ || (s == b.score_ && (!b.partial_ties_ || token <= b.tie_cutoff_));
    out_tokens[w] = token;
    out_values[w] = v[i];
    w += keep ? 1 : 0;
  }
  return w;
}

/// Fast path (see the file comment). `[n] weights` = exp(v - max) with sum
/// `total` when given, else computed on the fly. Returns false, leaving `c`
/// unchanged, when it does not apply or the bracket misses.
template <class Arch, class Score>
bool truncate_by_mass_fast(candidates& c, const Score& score, double fraction, const float* weights, double total) {
  constexpr std::size_t n_sample = 1024, margin = 48, max_margin = 112, n_final = 32;
  constexpr float inf = std::numeric_limits<float>::infinity();
  const auto values = c.values();
  const std::size_t n = values.size();
  if (n < 16 * n_sample) return false;
  const float m = c.max();
  auto& s = c.scratch();

  // 1. Strided sample: (score key, exp) sorted by score.
  const std::size_t stride = n / n_sample;
  std::array<std::uint64_t, n_sample> sample;
  double sample_total = 0.0;
  for (std::size_t j = 0; j < n_sample; ++j) {
    const float x = values[j * stride];
    const float e = weights != nullptr ? weights[j * stride] : exp_canonical(x - m);
    sample[j] = (static_cast<std::uint64_t>(ascending_key(score(x))) << 32) | std::bit_cast<std::uint32_t>(e);
    sample_total += e;
  }
  sort_sample(sample);
  auto sample_score = [&](std::size_t j) {
    const std::uint32_t key = static_cast<std::uint32_t>(sample[j] >> 32);
    return std::bit_cast<float>((key & 0x80000000u) ? (key & 0x7fffffffu) : ~key);
  };
  // The crossing rank in the sample, and a margin of 4 standard errors of
  // the sample's mass estimate there (at least `margin` ranks each side).
  auto sample_weight = [&](std::size_t j) {
    return static_cast<double>(std::bit_cast<float>(static_cast<std::uint32_t>(sample[j])));
  };
  const double sample_goal = fraction * sample_total;
  std::size_t rank = n_sample - 1;
  double cum = 0.0;
  for (std::size_t j = 0; j < n_sample; ++j) {
    cum += sample_weight(j);
    if (cum >= sample_goal) {
      rank = j;
      break;
    }
  }
  double variance = 0.0;
  for (std::size_t j = 0; j < n_sample; ++j) {
    const double d = sample_weight(j) * ((j <= rank ? 1.0 : 0.0) - fraction);
    variance += d * d;
  }
  const double spread = 4.0 * std::sqrt(variance);
  // Sample ranks where the running mass first reaches goal -/+ spread.
  std::size_t mass_lo = 0, mass_hi = 0;
  cum = 0.0;
  for (std::size_t j = 0; j < n_sample; ++j) {
    cum += sample_weight(j);
    mass_lo += cum < sample_goal - spread ? 1 : 0;
    mass_hi += cum < sample_goal + spread ? 1 : 0;
  }
  // ... but within +-max_margin ranks, so the compact set stays under n / 4.
  const std::size_t rank_lo =
      std::max(std::min(mass_lo, rank >= margin ? rank - margin : 0), rank >= max_margin ? rank - max_margin : 0);
  const std::size_t rank_hi = std::min({n_sample - 1, std::max(mass_hi, rank + margin), rank + max_margin});
  bool one_sided = (rank_hi + 1) * 8 <= n_sample;
  float lo = !one_sided && rank_lo > 0 ? sample_score(rank_lo - 1) : -inf;
  float hi = rank_hi + 1 < n_sample ? std::nextafter(sample_score(rank_hi), inf) : inf;

  // 2. Bracket pass: mass below, compact set inside. When the crossing turns
  // out to lie outside the bracket and the side it lies on is small enough,
  // one more pass brackets that side (heavy-tailed rows fool the sample).
  const std::size_t cap = n / 4;
  grow(s.compact_values, cap + sum_block + 16);
  grow(s.compact_weights, cap + sum_block + 16);
  grow(s.compact_index, cap + sum_block + 16);
  bracket_result r;
  double goal = 0.0;
  for (int attempt = 0;; ++attempt) {
    r = weights != nullptr ? bracket_pass<Arch, true>(values, weights, m, score, lo, hi, s.compact_values.data(),
                                                      s.compact_index.data(), cap, simd::kernel_arch<Arch>{})
                           : bracket_pass<Arch, false>(values, nullptr, m, score, lo, hi, s.compact_values.data(),
                                                       s.compact_index.data(), cap, simd::kernel_arch<Arch>{});
    if (r.overflow) return false;
    if (weights == nullptr) total = r.total;
    goal = fraction * total;
    const bool retry = attempt == 0;
    if (!(r.below < goal * (1 - 1e-6))) {
      // Below the bracket: retry on score < lo, one-sided.
      if (!retry || r.n_below > cap || lo == -inf) return false;
      hi = lo;
      lo = -inf;
      one_sided = true;
      continue;
    }
    const double inside = exp_of<Arch>(s.compact_values.data(), r.n_inside, m, s.compact_weights.data());
    // (with a little room for rounding)
    if (r.below + inside < goal * (1 + 1e-6)) {
      // Above the bracket: retry on score >= hi (the pass stops if that is too many).
      if (!retry || hi == inf) return false;
      lo = hi;
      hi = inf;
      one_sided = false;
      continue;
    }
    break;
  }
  const std::size_t n_compact = r.n_inside;

  // 3. Refinement: the first round reads the compact set, later ones work in place.
  grow(s.undecided_values, n_compact + 16);
  grow(s.undecided_weights, n_compact + 16);
  grow(s.undecided_index, n_compact + 16);
  const float* src_v = s.compact_values.data();
  const float* src_e = s.compact_weights.data();
  const std::uint32_t* src_i = s.compact_index.data();
  float* uv = s.undecided_values.data();
  float* ue = s.undecided_weights.data();
  std::uint32_t* ui = s.undecided_index.data();
  std::size_t k = n_compact, n_below = r.n_below;
  double below = r.below;
  for (int round = 0; round < 16 && k > n_final; ++round) {
    std::array<float, 64> pick;
    const std::size_t n_pick = std::min<std::size_t>(k, pick.size());
    for (std::size_t j = 0; j < n_pick; ++j) pick[j] = score(src_v[(j * k) / n_pick]);
    std::sort(pick.begin(), pick.begin() + static_cast<std::ptrdiff_t>(n_pick));
    std::array<float, n_refine_thresholds> t;
    for (std::size_t j = 0; j < t.size(); ++j) t[j] = pick[((j + 1) * n_pick) / (t.size() + 1)];
    std::array<double, n_refine_thresholds + 1> sums;
    threshold_sums<Arch>(src_v, src_e, k, score, t, sums);
    std::size_t b = t.size();
    for (std::size_t j = 0; j < t.size(); ++j)
      if (below + sums[j] >= goal) {
        b = j;
        break;
      }
    const float new_lo = b > 0 ? t[b - 1] : lo, new_hi = b < t.size() ? t[b] : hi;
    const std::size_t k_new =
        compress_range<Arch>(src_v, src_e, src_i, k, score, new_lo, new_hi, uv, ue, ui, n_below);
    if (k_new == 0) return false;
    if (b > 0) below += sums[b - 1];
    lo = new_lo;
    hi = new_hi;
    src_v = uv;
    src_e = ue;
    src_i = ui;
    const bool progress = k_new < k;
    k = k_new;
    if (!progress) break;
  }

  // 4. Sort the few undecided entries by (score, token) and scan.
  grow(s.index, k);
  std::uint32_t* order = s.index.data();
  for (std::size_t j = 0; j < k; ++j) order[j] = static_cast<std::uint32_t>(j);
  std::sort(order, order + k, [&](std::uint32_t a, std::uint32_t b) {
    const float sa = score(src_v[a]), sb = score(src_v[b]);
    if (sa != sb) return sa < sb;
    return c.token(src_i[a]) < c.token(src_i[b]);
  });
  std::size_t last = k - 1;
  double running = below;
  for (std::size_t j = 0; j < k; ++j) {
    running += src_e[order[j]];
    if (running >= goal) {
      last = j;
      break;
    }
  }
  mass_boundary bound;
  bound.score_ = score(src_v[order[last]]);
  bound.tie_cutoff_ = c.token(src_i[order[last]]);
  bound.n_keep_ = n_below + last + 1;
  bound.partial_ties_ = last + 1 < k && score(src_v[order[last + 1]]) == bound.score_;

  if (!one_sided) {
    keep_up_to<Arch>(c, score, bound);
    return true;
  }
  // One-sided: every kept entry is in the compact set (index order).
  grow(s.tokens2, n_compact + 16);
  grow(s.weights2, n_compact + 16);
  const std::size_t w = gather_kept<Arch>(c, score, bound, {s.compact_values.data(), n_compact},
                                          s.compact_index.data(), s.tokens2.data(), s.weights2.data());
  LLMKIT_ASSERT(w == bound.n_keep_);
  c.assign_sparse({s.tokens2.data(), w}, {s.weights2.data(), w}, candidates::order::any);
  return true;
}

/// Keeps the shortest prefix of (score ascending, token ascending) with mass
/// >= fraction of the total (0 < fraction < 1). `[size] weights` =
/// exp(v - max) of c.values() with sum `total`, if the caller has them
/// (empty otherwise).
template <class Arch = simd::default_arch, class Score>
void truncate_by_mass(candidates& c, const Score& score, double fraction, std::span<const float> weights = {},
                      double total = 0.0) {
  if constexpr (!simd::is_scalar_v<Arch>) {
    if (truncate_by_mass_fast<Arch>(c, score, fraction, weights.empty() ? nullptr : weights.data(), total)) return;
  }
  // Radix select over the whole row.
  auto& s = c.scratch();
  const auto values = c.values();
  const std::size_t n = values.size();
  if (weights.empty()) {
    grow(s.weights, n);
    grow(s.block_sums, n_sum_blocks(n));
    exp_block_sums<Arch>(values, c.max(), s.block_sums, {s.weights.data(), n});
    weights = {s.weights.data(), n};
  }
  grow(s.keys, n);
  for (std::size_t i = 0; i < n; ++i) s.keys[i] = score.key(values[i]);
  const selection sel = weighted_select({s.keys.data(), n}, weights, [&](std::size_t i) { return c.token(i); },
                                        fraction, select_target::fraction_of_total, s);
  if (sel.keep_all_) return;
  keep_up_to<Arch>(c, score,
                   mass_boundary{.score_ = score.score_of_key(sel.key_),
                                 .tie_cutoff_ = sel.tie_cutoff_,
                                 .n_keep_ = sel.n_keep_,
                                 .partial_ties_ = sel.partial_ties_});
}

}  // namespace llmkit::sampling::detail

LLMKIT_SIMD_DIAGNOSTICS_END
