// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/attention/detail/prefill_kernels.hpp
/// The micro-kernels of the tiled (flash-attention style) prefill, for one
/// block of query rows against one tile of at most `key_tile` keys. They
/// depend only on (Arch, D), not on the cache or mask, so every cache type
/// and mask shares one instantiation.
///
/// Layouts (qld = query rows rounded up to whole registers):
///   qt  [D, qld]       queries, transposed, pre-multiplied by the scale
///   st  [key_tile, qld] scores, transposed: keys x query rows; softmax then
///                       runs down columns with whole registers of rows
///   o   [rows, D]      un-normalised output rows
///   k   [n_keys, D]    the key tile's f32 rows, contiguous
///   v   [n_keys]       pointers to f32 rows of D elements
/// Transposing Q (once per query block) instead of K (once per key tile)
/// lets the key tile be read in place from an f32 cache whose rows are
/// adjacent (else a plain copy of its rows, converted to f32 on the way for
/// 16-bit and int8 storage) and V rows be read in place from any f32 cache.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "llmkit/attention/detail/kernel_simd.hpp"
#include "llmkit/attention/detail/vec.hpp"
#include "llmkit/simd/detail/diagnostics.hpp"

LLMKIT_SIMD_DIAGNOSTICS_BEGIN

namespace llmkit::attention::detail {

template <class Arch, std::size_t D>
struct prefill_kernels {
  using V = vec<Arch>;
  static constexpr std::size_t L = lanes<Arch>;
  static constexpr std::size_t key_tile = 32;
  static_assert(D % L == 0, "prefill_kernels: head_dim must be a multiple of the register width");
  static constexpr std::size_t DV = D / L;

  /// qt[d, r] = scale * row(r)[d] for r < n_rows, 0 for n_rows <= r < qld
  /// (qld a multiple of L): one query block laid out as columns. `row(r)`
  /// returns the address of query row r (D floats).
  template <class RowFn>
  static void load_q(RowFn&& row, std::size_t n_rows, float scale, float* qt, std::size_t qld) noexcept {
    load_q(row, n_rows, scale, qt, qld, simd::kernel_arch<Arch>{});
  }

  template <class RowFn>
  static void load_q(RowFn&& row, std::size_t n_rows, float scale, float* qt, std::size_t qld,
                     requires_arch<xsimd::generic>) noexcept {
    for (std::size_t r = 0; r < n_rows; ++r) {
      const float* src = row(r);
      for (std::size_t d = 0; d < D; ++d) qt[d * qld + r] = src[d] * scale;
    }
    for (std::size_t d = 0; d < D; ++d)
      for (std::size_t r = n_rows; r < qld; ++r) qt[d * qld + r] = 0.0f;
  }

#if defined(__AVX512F__)
  /// load_q on AVX-512: 16 x 16 blocks transposed in registers.
  template <class RowFn>
  static void load_q(RowFn&& row, std::size_t n_rows, float scale, float* qt, std::size_t qld,
                     requires_arch<xsimd::avx512f>) noexcept {
    const __m512 sc = _mm512_set1_ps(scale);
    for (std::size_t r0 = 0; r0 < qld; r0 += 16) {
      const std::size_t nr = r0 < n_rows ? std::min<std::size_t>(16, n_rows - r0) : 0;
      const float* src[16];
      for (std::size_t i = 0; i < nr; ++i) src[i] = row(r0 + i);
      for (std::size_t d0 = 0; d0 < D; d0 += 16) {
        __m512 x[16];
        for (std::size_t i = 0; i < 16; ++i)
          x[i] = i < nr ? _mm512_mul_ps(_mm512_loadu_ps(src[i] + d0), sc) : _mm512_setzero_ps();
        transpose16(x);
        for (std::size_t c = 0; c < 16; ++c) _mm512_storeu_ps(qt + (d0 + c) * qld + r0, x[c]);
      }
    }
  }
#endif

  /// st[j, r] = sum_d qt[d, r] * k[j * D + d] for j < n_keys, r < n_rv * L.
  /// @param k [n_keys, D] the key tile's rows, contiguous (one base register
  ///          addresses every key of a register tile: with a pointer per key
  ///          the 12 pointers spill and their reloads compete with the FMAs)
  /// @param rv_keys [n_rv] per row register, the keys its rows can see
  ///        are among the first rv_keys[rv], or null (all n_keys): blocks
  ///        of keys past them are skipped (st left as is there).
  static void scores(const float* qt, std::size_t qld, std::size_t n_rv, const float* k, std::size_t n_keys,
                     float* st, const std::uint32_t* rv_keys) noexcept {
    // Keys outer, row registers inner: the JR key rows of a block (JR * D
    // floats) stay in L1 while the query panel qt streams past once per key
    // block, each loaded row register feeding JR FMAs.
    std::size_t j = 0;
    for (; j + key_block <= n_keys; j += key_block)
      scores_keys<key_block>(qt, qld, n_rv, k + j * D, st + j * qld, rv_keys, j);
    // A 32-key tile is 12 + 12 + 8 (an 8-key tail block runs 16 accumulators
    // where two 4-key blocks ran 8 each and read the query panel twice).
    if constexpr (key_block > 8)
      for (; j + 8 <= n_keys; j += 8) scores_keys<8>(qt, qld, n_rv, k + j * D, st + j * qld, rv_keys, j);
    for (; j + 4 <= n_keys; j += 4) scores_keys<4>(qt, qld, n_rv, k + j * D, st + j * qld, rv_keys, j);
    for (; j < n_keys; ++j) scores_keys<1>(qt, qld, n_rv, k + j * D, st + j * qld, rv_keys, j);
  }

  /// x = cap * tanh(x / cap) on st[j, r], j < n_keys, r < n_rv * L.
  static void soft_cap(float* st, std::size_t qld, std::size_t n_rv, std::size_t n_keys, float cap) noexcept {
    const V c(cap), inv(1.0f / cap);
    for (std::size_t j = 0; j < n_keys; ++j)
      for (std::size_t rv = 0; rv < n_rv; ++rv) {
        float* p = st + j * qld + rv * L;
        vstore<Arch>(p, c * vtanh<Arch>(vload<Arch>(p) * inv));
      }
  }

  /// Online softmax step over one key tile. Per query row r: m[r] becomes
  /// max(m[r], max_j st[j, r]); alpha[r] = exp(m_old - m_new) rescales the
  /// previous sums; st[j, r] becomes exp(st[j, r] - m_new); l[r] is
  /// rescaled and increased by the new row sum. Rows that have seen only
  /// hidden keys (-inf) keep m = -inf and get p = 0, never NaN.
  static void softmax_update(float* st, std::size_t qld, std::size_t n_rv, std::size_t n_keys, float* m, float* l,
                             float* alpha) noexcept {
    const V ninf(-std::numeric_limits<float>::infinity());
    for (std::size_t rv = 0; rv < n_rv; ++rv) {
      float* col = st + rv * L;
      V mx[4] = {ninf, ninf, ninf, ninf};  // four independent vmax chains
      std::size_t jm = 0;
      for (; jm + 4 <= n_keys; jm += 4)
        for (std::size_t u = 0; u < 4; ++u) mx[u] = vmax<Arch>(mx[u], vload<Arch>(col + (jm + u) * qld));
      for (; jm < n_keys; ++jm) mx[0] = vmax<Arch>(mx[0], vload<Arch>(col + jm * qld));
      const V tile_max = vmax<Arch>(vmax<Arch>(mx[0], mx[1]), vmax<Arch>(mx[2], mx[3]));
      const V m_old = vload<Arch>(m + rv * L);
      const V m_new = vmax<Arch>(m_old, tile_max);
      const V shift = vfinite_or_zero<Arch>(m_new);
      const V a = vexp_softmax<Arch>(m_old - shift);
      V sum0(0.0f), sum1(0.0f);
      std::size_t j = 0;
      for (; j + 2 <= n_keys; j += 2) {
        const V p0 = vexp_softmax<Arch>(vload<Arch>(col + j * qld) - shift);
        const V p1 = vexp_softmax<Arch>(vload<Arch>(col + (j + 1) * qld) - shift);
        vstore<Arch>(col + j * qld, p0);
        vstore<Arch>(col + (j + 1) * qld, p1);
        sum0 = sum0 + p0;
        sum1 = sum1 + p1;
      }
      if (j < n_keys) {
        const V p0 = vexp_softmax<Arch>(vload<Arch>(col + j * qld) - shift);
        vstore<Arch>(col + j * qld, p0);
        sum0 = sum0 + p0;
      }
      vstore<Arch>(m + rv * L, m_new);
      vstore<Arch>(alpha + rv * L, a);
      vstore<Arch>(l + rv * L, vfma<Arch>(vload<Arch>(l + rv * L), a, sum0 + sum1));
    }
  }

  /// o[r, :] = alpha[r] * o[r, :] + sum_j pt[j, r] * v[j][:] for r < n_rows.
  /// @param row_keys [n_rows] per row, the keys it can see are among the
  ///        first row_keys[r] (pt[j, r] = 0 for j >= row_keys[r]), or null
  ///        (all n_keys): a block of rows stops at the largest count of its
  ///        rows, so the far side of the diagonal is not multiplied by 0.
  static void accumulate(float* o, std::size_t n_rows, const float* alpha, const float* pt, std::size_t qld,
                         const float* const* v, std::size_t n_keys, const std::uint32_t* row_keys) noexcept {
    auto keys = [&](std::size_t r, std::size_t n) -> std::size_t {
      if (row_keys == nullptr) return n_keys;
      return std::min<std::size_t>(n_keys, *std::max_element(row_keys + r, row_keys + r + n));
    };
    std::size_t r = 0;
    for (; r + pv_rows <= n_rows; r += pv_rows)
      accumulate_rows<pv_rows>(o + r * D, alpha + r, pt + r, qld, v, keys(r, pv_rows));
    if (r < n_rows)
      accumulate_tail<pv_rows - 1>(n_rows - r, o + r * D, alpha + r, pt + r, qld, v, keys(r, n_rows - r));
  }

  /// out[r] = o[r] / l[r] (zeros where l[r] == 0: a fully masked row).
  static void finish_row(const float* o, float l, float* out) noexcept {
    const V inv(l > 0.0f ? 1.0f / l : 0.0f);
    for (std::size_t c = 0; c < DV; ++c) vstore<Arch>(out + c * L, vload<Arch>(o + c * L) * inv);
  }

 private:
  // The register tile of both products: acc[b][c] = init(b, c) + sum_{i < n}
  // bcast(i, b) * vload(row(i) + c * L) for b < NB, c < NC, then
  // store(b, c, acc[b][c]). Scores: NB keys x NC row registers of qt, i
  // over D; P.V: NB query rows x NC column registers of O, i over the keys.
  // Fully unrolled so the NB x NC accumulators live in registers (GCC
  // otherwise keeps the array in memory: a load and a store per FMA).
  template <std::size_t NB, std::size_t NC, class N, class Init, class Row, class Bcast, class Store>
  static void fma_tile(N n, Init init, Row row, Bcast bcast, Store store) noexcept {
    V acc[NB][NC];
#pragma GCC unroll 16
    for (std::size_t b = 0; b < NB; ++b)
#pragma GCC unroll 8
      for (std::size_t c = 0; c < NC; ++c) acc[b][c] = init(b, c);
    for (std::size_t i = 0; i < n; ++i) {
      const float* x = row(i);
      V xv[NC];
#pragma GCC unroll 8
      for (std::size_t c = 0; c < NC; ++c) xv[c] = vload<Arch>(x + c * L);
#pragma GCC unroll 16
      for (std::size_t b = 0; b < NB; ++b) {
        const V s(bcast(i, b));
#pragma GCC unroll 8
        for (std::size_t c = 0; c < NC; ++c) acc[b][c] = vfma<Arch>(s, xv[c], acc[b][c]);
      }
    }
#pragma GCC unroll 16
    for (std::size_t b = 0; b < NB; ++b)
#pragma GCC unroll 8
      for (std::size_t c = 0; c < NC; ++c) store(b, c, acc[b][c]);
  }

  // A scores tile of JR keys x RV row registers (D a compile-time trip count).
  template <std::size_t RV, std::size_t JR>
  static void scores_block(const float* qt, std::size_t qld, const float* k, float* st) noexcept {
    fma_tile<JR, RV>(
        std::integral_constant<std::size_t, D>{}, [](std::size_t, std::size_t) { return V(0.0f); },
        [=](std::size_t d) { return qt + d * qld; }, [=](std::size_t d, std::size_t j) { return k[j * D + d]; },
        [=](std::size_t j, std::size_t r, V x) { vstore<Arch>(st + j * qld + r * L, x); });
  }

  // Keys per scores register tile: 12 keys x 2 row registers = 24
  // accumulators of AVX-512's 32 registers; 6 x 2 = 12 of AVX2's 16.
  static constexpr std::size_t key_block = has_avx512<Arch> ? 12 : (simd::is_scalar_v<Arch> ? 4 : 6);

  // Keys [j0, j0 + JR) against every row register that sees any of them.
  template <std::size_t JR>
  static void scores_keys(const float* qt, std::size_t qld, std::size_t n_rv, const float* k, float* st,
                          const std::uint32_t* rv_keys, std::size_t j0) noexcept {
    auto sees = [&](std::size_t rv) { return rv_keys == nullptr || rv_keys[rv] > j0; };
    std::size_t rv = 0;
    for (; rv + 2 <= n_rv; rv += 2)
      if (sees(rv) || sees(rv + 1)) scores_block<2, JR>(qt + rv * L, qld, k, st + rv * L);
    if (rv < n_rv && sees(rv)) scores_block<1, JR>(qt + rv * L, qld, k, st + rv * L);
  }

  // A P.V tile of MR query rows x CB column registers of O from column c0.
  template <std::size_t MR, std::size_t CB>
  static void accumulate_block(float* o, const float* alpha, const float* pt, std::size_t qld,
                               const float* const* v, std::size_t n_keys, std::size_t c0) noexcept {
    float* const oc = o + c0;
    fma_tile<MR, CB>(
        n_keys, [=](std::size_t r, std::size_t c) { return vload<Arch>(oc + r * D + c * L) * V(alpha[r]); },
        [=](std::size_t j) { return v[j] + c0; }, [=](std::size_t j, std::size_t r) { return pt[j * qld + r]; },
        [=](std::size_t r, std::size_t c, V x) { vstore<Arch>(oc + r * D + c * L, x); });
  }

  // P.V register tile: pv_rows query rows x pv_cols column registers of O,
  // 24 accumulators on AVX-512 (6 rows x 4 registers: per key 4 loads of V
  // and 6 broadcasts of P feed 24 FMAs, and the 24 + 4 + 1 registers fit in
  // 32, where 3 rows x 8 registers needed 33 and spilled), 12 on AVX2.
  static constexpr std::size_t pv_cols = std::min<std::size_t>(DV, 4);
  static constexpr std::size_t pv_rows = std::max<std::size_t>(1, (has_avx512<Arch> ? 24 : 12) / pv_cols);

  // The last n_rows < pv_rows rows in one tile of exactly that many rows.
  template <std::size_t MR>
  static void accumulate_tail(std::size_t n_rows, float* o, const float* alpha, const float* pt, std::size_t qld,
                              const float* const* v, std::size_t n_keys) noexcept {
    if constexpr (MR > 0) {
      if (n_rows == MR) accumulate_rows<MR>(o, alpha, pt, qld, v, n_keys);
      else accumulate_tail<MR - 1>(n_rows, o, alpha, pt, qld, v, n_keys);
    }
  }

  template <std::size_t MR>
  static void accumulate_rows(float* o, const float* alpha, const float* pt, std::size_t qld, const float* const* v,
                              std::size_t n_keys) noexcept {
    // MR rows x pv_cols column registers; the remainder of D / L in one narrower block.
    constexpr std::size_t full = DV / pv_cols;
    constexpr std::size_t rest = DV % pv_cols;
    for (std::size_t cb = 0; cb < full; ++cb)
      accumulate_block<MR, pv_cols>(o, alpha, pt, qld, v, n_keys, cb * pv_cols * L);
    if constexpr (rest > 0) accumulate_block<MR, rest>(o, alpha, pt, qld, v, n_keys, full * pv_cols * L);
  }
};

}  // namespace llmkit::attention::detail

LLMKIT_SIMD_DIAGNOSTICS_END
