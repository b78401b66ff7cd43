// SPDX-License-Identifier: MIT
// model/quants.hpp: ggml's quantised block formats. Decoding must equal the
// byte-offset oracle (tests/reference/quants_reference.hpp) bit for bit on
// random blocks and edge cases; encoding must round within a step; GGUF
// files of every type load, and a model written in each type runs against
// the double-precision oracle.
#include <llmkit/core/error.hpp>
#include <llmkit/model/gguf.hpp>
#include <llmkit/model/gguf_writer.hpp>
#include <llmkit/model/quants.hpp>
#include <llmkit/model/weights.hpp>

#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "reference/quants_reference.hpp"

using namespace llmkit;
using namespace llmkit::model;

namespace {

constexpr ggml_type quant_types[] = {ggml_type::q4_0, ggml_type::q4_1, ggml_type::q5_0, ggml_type::q5_1,
                                     ggml_type::q8_0, ggml_type::q4_k, ggml_type::q5_k, ggml_type::q6_k};

std::string type_name(ggml_type t) { return std::string(ggml_type_name(std::uint32_t(t))); }

// Offsets of the f16 scales of each block format (to plant chosen values).
std::vector<std::size_t> scale_offsets(ggml_type t) {
  switch (t) {
    case ggml_type::q4_0: case ggml_type::q5_0: case ggml_type::q8_0: return {0};
    case ggml_type::q4_1: case ggml_type::q5_1: case ggml_type::q4_k: case ggml_type::q5_k: return {0, 2};
    case ggml_type::q6_k: return {208};
    default: return {};
  }
}

void put_f16(std::vector<std::byte>& bytes, std::size_t at, float v) {
  const std::uint16_t b = f32_to_f16_bits(v);
  std::memcpy(bytes.data() + at, &b, 2);
}

// Decodes `blocks` blocks with the library and with the oracle; the bit
// patterns must agree everywhere.
void require_same_decoding(ggml_type t, const std::vector<std::byte>& bytes) {
  const std::size_t n = bytes.size() / ggml_block_bytes(t) * ggml_block_elements(t);
  std::vector<float> got(n);
  dequantize_row(t, bytes.data(), got.data(), n);
  for (std::size_t i = 0; i < n; ++i) {
    const float want = reference::quant_value(t, bytes.data(), i);
    INFO(type_name(t) << " value " << i << " got " << got[i] << " want " << want);
    REQUIRE(std::bit_cast<std::uint32_t>(got[i]) == std::bit_cast<std::uint32_t>(want));
  }
}

}  // namespace

TEST_CASE("quants: block sizes and type codes match GGUF") {
  REQUIRE(ggml_block_bytes(ggml_type::q4_0) == sizeof(block_q4_0));
  REQUIRE(ggml_block_bytes(ggml_type::q4_1) == sizeof(block_q4_1));
  REQUIRE(ggml_block_bytes(ggml_type::q5_0) == sizeof(block_q5_0));
  REQUIRE(ggml_block_bytes(ggml_type::q5_1) == sizeof(block_q5_1));
  REQUIRE(ggml_block_bytes(ggml_type::q4_k) == sizeof(block_q4_k));
  REQUIRE(ggml_block_bytes(ggml_type::q5_k) == sizeof(block_q5_k));
  REQUIRE(ggml_block_bytes(ggml_type::q6_k) == sizeof(block_q6_k));
  REQUIRE(ggml_type_name(std::uint32_t(ggml_type::q4_k)) == "Q4_K");
  REQUIRE(ggml_type_name(std::uint32_t(ggml_type::q6_k)) == "Q6_K");
  REQUIRE(ggml_type_name(std::uint32_t(ggml_type::q5_1)) == "Q5_1");
  for (const ggml_type t : quant_types) REQUIRE(is_quantized(t));
  REQUIRE_FALSE(is_quantized(ggml_type::bf16));
}

TEST_CASE("quants: decoding equals the byte-offset oracle on random blocks") {
  std::mt19937 rng(35);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> scale(-2.0f, 2.0f);
  for (const ggml_type t : quant_types) {
    for (std::size_t blocks : {1u, 3u, 8u}) {
      std::vector<std::byte> bytes(blocks * ggml_block_bytes(t));
      for (auto& b : bytes) b = std::byte(byte(rng));
      // Random bytes make random f16 scales, NaNs and infinities included;
      // plant finite ones in most blocks.
      for (std::size_t k = 0; k + 1 < blocks; ++k)
        for (std::size_t at : scale_offsets(t)) put_f16(bytes, k * ggml_block_bytes(t) + at, scale(rng));
      require_same_decoding(t, bytes);
    }
  }
}

TEST_CASE("quants: decoding edge cases: zero blocks, extreme values, negative zero and huge scales") {
  for (const ggml_type t : quant_types) {
    const std::size_t bb = ggml_block_bytes(t);
    for (int pattern = 0; pattern < 4; ++pattern) {
      for (float s : {0.0f, -0.0f, 65504.0f, -65504.0f, 6.1e-5f, 1.0f}) {
        std::vector<std::byte> bytes(bb, std::byte(pattern == 0 ? 0x00 : pattern == 1 ? 0xFF : pattern == 2 ? 0x0F : 0xF0));
        for (std::size_t at : scale_offsets(t)) put_f16(bytes, at, s);
        INFO(type_name(t) << " pattern " << pattern << " scale " << s);
        require_same_decoding(t, bytes);
      }
    }
  }
  // Known values: a Q4_0 block of nibbles 0 and 15 with d = 0.5 decodes to -4 and 3.5.
  block_q4_0 b{};
  b.d = f16{f32_to_f16_bits(0.5f)};
  for (auto& q : b.qs) q = 0xF0;
  float out[32];
  dequantize_block(b, out);
  REQUIRE(out[0] == -4.0f);
  REQUIRE(out[31] == 3.5f);
  // Q4_K: sub-block 5's scale and min come from the split 6-bit fields.
  block_q4_k k{};
  k.d = f16{f32_to_f16_bits(1.0f)};
  k.dmin = f16{f32_to_f16_bits(1.0f)};
  k.scales[1] = 0b11000000;       // sc5 bits 4-5
  k.scales[9] = 0x2A;             // sc5 low nibble 10, m5 low nibble 2
  k.scales[5] = 0b01000000;       // m5 bits 4-5
  std::uint8_t sc = 0, m = 0;
  k_scale_min(k.scales, 5, sc, m);
  REQUIRE(sc == 10 + 48);
  REQUIRE(m == 2 + 16);
}

TEST_CASE("quants: encoding rounds each value to within one step of its block") {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const ggml_type t : quant_types) {
    const std::size_t k = ggml_block_elements(t), n = 4 * 256;
    std::vector<float> x(n);
    for (auto& v : x) v = normal(rng);
    x[5] = 0.0f;
    std::fill(x.begin() + 256, x.begin() + 512, 0.0f);  // all-zero blocks
    std::vector<std::byte> bytes(n / k * ggml_block_bytes(t));
    quantize_row(t, x.data(), bytes.data(), n);
    std::vector<float> y(n);
    dequantize_row(t, bytes.data(), y.data(), n);
    require_same_decoding(t, bytes);
    for (std::size_t b = 0; b < n / k; ++b) {
      float lo = 0, hi = 0;
      for (std::size_t j = 0; j < k; ++j) {
        lo = std::min(lo, x[b * k + j]);
        hi = std::max(hi, x[b * k + j]);
      }
      // A step of the coarsest type (4 bits over the block's range); the
      // K-quants add the 6-bit rounding of their sub-block scales and mins.
      const double bits = t == ggml_type::q8_0 ? 8 : (t == ggml_type::q5_0 || t == ggml_type::q5_1 || t == ggml_type::q5_k) ? 5
                        : t == ggml_type::q6_k ? 6 : 4;
      const double step = double(hi - lo) / (std::pow(2.0, bits) - 1);
      const double bound = (t == ggml_type::q4_k || t == ggml_type::q5_k || t == ggml_type::q6_k) ? 2.0 * step : 1.01 * step;
      for (std::size_t j = 0; j < k; ++j) {
        INFO(type_name(t) << " block " << b << " value " << j << ": " << x[b * k + j] << " -> " << y[b * k + j]);
        REQUIRE(std::abs(double(y[b * k + j]) - double(x[b * k + j])) <= bound + 1e-7);
      }
    }
    for (std::size_t j = 256; j < 512; ++j) REQUIRE(y[j] == 0.0f);
  }
}

TEST_CASE("quants: GGUF tensors of every type load into weight matrices with their exact values") {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 0.5f);
  const std::size_t rows = 3, cols = 512;
  for (const ggml_type t : quant_types) {
    std::vector<float> x(rows * cols);
    for (auto& v : x) v = normal(rng);
    std::vector<std::byte> bytes(rows * cols / ggml_block_elements(t) * ggml_block_bytes(t));
    quantize_row(t, x.data(), bytes.data(), x.size());
    gguf_writer w;
    w.add("general.architecture", std::string_view("llama"));
    w.add_tensor("m", t, {cols, rows}, bytes);
    const auto image = w.bytes();
    const gguf_file f(std::span<const std::byte>(image.data(), image.size()));
    const gguf_tensor& g = f.tensor("m");
    REQUIRE(g.type == t);
    REQUIRE(g.n_bytes == bytes.size());
    for (const weight_type wt : {weight_type::native, weight_type::f32}) {
      weight_matrix m(resolve_weight_type(wt, t, cols), rows, cols);
      m.copy_from(g, 0);
      std::vector<float> row(cols);
      for (std::size_t r = 0; r < rows; ++r) {
        m.row(r, row);
        const std::size_t row_bytes = cols / ggml_block_elements(t) * ggml_block_bytes(t);
        for (std::size_t i = 0; i < cols; ++i)
          REQUIRE(row[i] == reference::quant_value(t, bytes.data() + r * row_bytes, i));
      }
    }
  }
}

TEST_CASE("quants: bad input raises llmkit::error naming the tensor") {
  // A NaN scale in the second block of row 1.
  const std::size_t rows = 2, cols = 64;
  std::vector<float> x(rows * cols, 0.25f);
  std::vector<std::byte> bytes(rows * cols / 32 * sizeof(block_q4_0));
  quantize_row(ggml_type::q4_0, x.data(), bytes.data(), x.size());
  const std::uint16_t nan = 0x7E00;
  std::memcpy(bytes.data() + 3 * sizeof(block_q4_0), &nan, 2);
  gguf_writer w;
  w.add_tensor("blk.0.attn_q.weight", ggml_type::q4_0, {cols, rows}, bytes);
  const auto image = w.bytes();
  const gguf_file f(std::span<const std::byte>(image.data(), image.size()));
  weight_matrix m(weight_type::f32, rows, cols);
  REQUIRE_THROWS_WITH(m.copy_from(f.tensor("blk.0.attn_q.weight"), 0),
                      Catch::Contains("tensor 'blk.0.attn_q.weight' (Q4_0) has a non-finite scale in the block of "
                                      "column 32 at byte 54"));
  // Rows that are not whole blocks.
  std::vector<float> out(40);
  REQUIRE_THROWS_WITH(dequantize_row(ggml_type::q4_k, bytes.data(), out.data(), 40),
                      "dequantize_row: 40 values are not whole blocks of Q4_K");
  REQUIRE_THROWS_WITH(quantize_row(ggml_type::q5_0, x.data(), bytes.data(), 40),
                      "quantize_row: 40 values are not whole blocks of Q5_0");
  // A K-quant tensor whose data run past the end of the file.
  gguf_writer short_file;
  std::vector<std::byte> one(sizeof(block_q6_k));
  short_file.add_tensor("t", ggml_type::q6_k, {256, 1}, one);
  auto img = short_file.bytes();
  img.resize(img.size() - 10);
  REQUIRE_THROWS_WITH(gguf_file(std::span<const std::byte>(img.data(), img.size())), Catch::Contains("'t'"));
}
