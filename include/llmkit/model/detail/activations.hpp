// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/model/detail/activations.hpp
/// The gated feed-forward activations h = act(gate) * up, shared by the
/// dense forward pass (model/detail/llama_forward.hpp) and the routed
/// experts (moe/routed_ffn.hpp).

#include <algorithm>
#include <cstddef>

#include "llmkit/model/architecture.hpp"
#include "llmkit/simd/arch.hpp"
#include "llmkit/simd/exp.hpp"

#include "llmkit/simd/detail/diagnostics.hpp"

LLMKIT_SIMD_DIAGNOSTICS_BEGIN

namespace llmkit::model::detail {

/// SwiGLU: h[j] = silu(g[j]) * u[j] = g[j] / (1 + e^-g[j]) * u[j]. ([f] g, u, h)
template <class Arch = simd::default_arch>
inline void swiglu(const float* g, const float* u, float* h, std::size_t f) noexcept {
  std::size_t j = 0;
  if constexpr (!simd::is_scalar_v<Arch>) {
    using vf = xsimd::batch<float, Arch>;
    for (; j + vf::size <= f; j += vf::size) {
      const vf gv = vf::load_unaligned(g + j);
      const vf e = simd::detail::exp_batch<Arch>(-gv);
      (gv / (vf(1.0f) + e) * vf::load_unaligned(u + j)).store_unaligned(h + j);
    }
  }
  for (; j < f; ++j) h[j] = g[j] / (1.0f + simd::detail::exp_scalar<Arch>(-g[j])) * u[j];
}

/// GeGLU with GELU's tanh approximation: h[j] = gelu(g[j]) * u[j], where
/// gelu(x) = x / 2 (1 + tanh(y)) = x / (1 + e^(-2y)), y = sqrt(2 / pi)
/// (x + 0.044715 x^3). ([f] g, u, h)
template <class Arch = simd::default_arch>
inline void geglu(const float* g, const float* u, float* h, std::size_t f) noexcept {
  constexpr float c1 = -2.0f * 0.7978845608028654f, c3 = c1 * 0.044715f;
  std::size_t j = 0;
  if constexpr (!simd::is_scalar_v<Arch>) {
    using vf = xsimd::batch<float, Arch>;
    for (; j + vf::size <= f; j += vf::size) {
      const vf x = vf::load_unaligned(g + j);
      const vf e = simd::detail::exp_batch<Arch>(x * xsimd::fma(x * x, vf(c3), vf(c1)));
      (x / (vf(1.0f) + e) * vf::load_unaligned(u + j)).store_unaligned(h + j);
    }
  }
  for (; j < f; ++j) {
    const float x = g[j];
    h[j] = x / (1.0f + simd::detail::exp_scalar<Arch>(x * std::fma(x * x, c3, c1))) * u[j];
  }
}

/// gpt-oss's clamped SwiGLU (ggml's swiglu_oai): with x = min(g, limit)
/// and y = clamp(u, -limit, limit), h = x / (1 + e^(-alpha x)) * (y + 1).
inline constexpr float swiglu_oai_alpha = 1.702f, swiglu_oai_limit = 7.0f;

/// The clamped SwiGLU above. ([f] g, u, h)
template <class Arch = simd::default_arch>
inline void swiglu_oai(const float* g, const float* u, float* h, std::size_t f) noexcept {
  constexpr float alpha = swiglu_oai_alpha, limit = swiglu_oai_limit;
  std::size_t j = 0;
  if constexpr (!simd::is_scalar_v<Arch>) {
    using vf = xsimd::batch<float, Arch>;
    for (; j + vf::size <= f; j += vf::size) {
      const vf x = xsimd::min(vf::load_unaligned(g + j), vf(limit));
      const vf y = xsimd::clip(vf::load_unaligned(u + j), vf(-limit), vf(limit));
      const vf e = simd::detail::exp_batch<Arch>(x * vf(-alpha));
      (x / (vf(1.0f) + e) * (y + vf(1.0f))).store_unaligned(h + j);
    }
  }
  for (; j < f; ++j) {
    const float x = std::min(g[j], limit), y = std::clamp(u[j], -limit, limit);
    h[j] = x / (1.0f + simd::detail::exp_scalar<Arch>(x * -alpha)) * (y + 1.0f);
  }
}

/// The gated activation of `a` over `[f]` gate and up values.
template <class Arch = simd::default_arch>
inline void gated_activation(ffn_activation a, const float* g, const float* u, float* h, std::size_t f) noexcept {
  switch (a) {
    case ffn_activation::gelu_tanh: return geglu<Arch>(g, u, h, f);
    case ffn_activation::swiglu_oai: return swiglu_oai<Arch>(g, u, h, f);
    case ffn_activation::silu: break;
  }
  swiglu<Arch>(g, u, h, f);
}

}  // namespace llmkit::model::detail

LLMKIT_SIMD_DIAGNOSTICS_END
