// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/model/impl/quants.ipp
/// The row encoders and decoders of model/quants.hpp: compiled inline by the
/// header, or once by <llmkit/src.hpp> with LLMKIT_SEPARATE_COMPILATION.

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "llmkit/core/config.hpp"
#include "llmkit/core/dtype.hpp"
#include "llmkit/core/error.hpp"
#include "llmkit/model/quants.hpp"

namespace llmkit::model {

LLMKIT_DECL void dequantize_row(ggml_type type, const std::byte* p, float* out, std::size_t n) {
  LLMKIT_CHECK(n % ggml_block_elements(type) == 0, "dequantize_row: ", n, " values are not whole blocks of ",
               ggml_type_name(std::uint32_t(type)));
  switch (type) {
    case ggml_type::f32: std::memcpy(out, p, n * sizeof(float)); return;
    case ggml_type::f16:
    case ggml_type::bf16:
      for (std::size_t i = 0; i < n; ++i) {
        std::uint16_t b;
        std::memcpy(&b, p + 2 * i, 2);
        out[i] = type == ggml_type::f16 ? f16_bits_to_f32(b) : bf16_bits_to_f32(b);
      }
      return;
    default:
      visit_block(type, [&](auto block) {
        constexpr std::size_t k = block_values<decltype(block)>;
        for (std::size_t i = 0; i < n / k; ++i) {
          std::memcpy(&block, p + i * sizeof(block), sizeof(block));
          dequantize_block(block, out + i * k);
        }
      });
  }
}

LLMKIT_DECL void quantize_row(ggml_type type, const float* x, std::byte* out, std::size_t n) {
  LLMKIT_CHECK(n % ggml_block_elements(type) == 0, "quantize_row: ", n, " values are not whole blocks of ",
               ggml_type_name(std::uint32_t(type)));
  switch (type) {
    case ggml_type::f32: std::memcpy(out, x, n * sizeof(float)); return;
    case ggml_type::f16:
    case ggml_type::bf16:
      for (std::size_t i = 0; i < n; ++i) {
        const std::uint16_t b = type == ggml_type::f16 ? f32_to_f16_bits(x[i]) : f32_to_bf16_bits(x[i]);
        std::memcpy(out + 2 * i, &b, 2);
      }
      return;
    default:
      visit_block(type, [&](auto block) {
        constexpr std::size_t k = block_values<decltype(block)>;
        for (std::size_t i = 0; i < n / k; ++i) {
          quantize_block(x + i * k, block);
          std::memcpy(out + i * sizeof(block), &block, sizeof(block));
        }
      });
  }
}

}  // namespace llmkit::model
