// SPDX-License-Identifier: MIT
// model/quants.hpp: ggml's quantised block formats. Decoding must equal the
// byte-offset oracle (tests/reference/quants_reference.hpp) bit for bit on
// random blocks and edge cases; encoding must round within a step; GGUF
// files of every type load, and a model written in each type runs against
// the double-precision oracle.
#include <llmkit/core/error.hpp>
#include <llmkit/core/executor.hpp>
#include <llmkit/model/gguf.hpp>
#include <llmkit/model/gguf_writer.hpp>
#include <llmkit/model/quants.hpp>
#include <llmkit/model/weights.hpp>
#include <llmkit/model/detail/gemm_blocks32_vnni.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "reference/quants_reference.hpp"

using namespace llmkit;
using namespace llmkit::model;

namespace {

constexpr ggml_type quant_types[] = {ggml_type::q4_0, ggml_type::q4_1, ggml_type::q5_0, ggml_type::q5_1,
                                     ggml_type::q8_0, ggml_type::q4_k, ggml_type::q5_k, ggml_type::q6_k,
                                     ggml_type::q2_k, ggml_type::q3_k, ggml_type::iq4_nl, ggml_type::iq4_xs,
                                     ggml_type::mxfp4};

std::string type_name(ggml_type t) { return std::string(ggml_type_name(std::uint32_t(t))); }

// Offsets of the f16 scales of each block format (to plant chosen values).
std::vector<std::size_t> scale_offsets(ggml_type t) {
  switch (t) {
    case ggml_type::q4_0: case ggml_type::q5_0: case ggml_type::q8_0: case ggml_type::iq4_nl:
    case ggml_type::iq4_xs: return {0};
    case ggml_type::q2_k: return {80, 82};
    case ggml_type::q3_k: return {108};
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

// The int8-activation product of one token row `[cols] x` by w in block
// format gt, in double: per output row, the product over the activations as
// the kernels round them (e), its f32 summation bound, the product over the
// exact activations and how far their rounding can move it.
struct int8_oracle {
  std::vector<double> e, bound, exact, moved;

  int8_oracle(ggml_type gt, const weight_matrix& w, const float* x) {
    const std::size_t rows = w.rows(), cols = w.cols();
    // The activations as the product rounds them: per 32 values (per 256
    // for the K-quants, ggml's Q8_K), scale amax / 127, round to nearest
    // (ties away from zero).
    const std::size_t ab = ggml_block_elements(gt) == 256 ? 256 : 32;
    std::vector<double> xq(cols);
    double x_abs = 0.0;
    for (std::size_t b = 0; b < cols / ab; ++b) {
      float amax = 0.0f;
      for (std::size_t j = 0; j < ab; ++j) amax = std::max(amax, std::abs(x[ab * b + j]));
      const float d = amax / 127.0f, inv = d != 0.0f ? 1.0f / d : 0.0f;
      for (std::size_t j = 0; j < ab; ++j) {
        xq[ab * b + j] = double(d) * std::round(x[ab * b + j] * inv);
        x_abs += std::abs(xq[ab * b + j]);
      }
    }
    for (std::size_t o = 0; o < rows; ++o) {
      double eo = 0.0, mag = 0.0, ex = 0.0, mv = 0.0, wmax = 0.0;
      for (std::size_t i = 0; i < cols; ++i) {
        const double wi = reference::quant_value(gt, w.block_data() + o * w.row_bytes(), i);
        wmax = std::max(wmax, std::abs(wi));
        eo += wi * xq[i];
        mag += std::abs(wi * xq[i]);
        ex += wi * double(x[i]);
        mv += std::abs(wi) * std::abs(xq[i] - double(x[i]));
      }
      e.push_back(eo);
      // f32 sums over cols / 4 lane terms whose scaled parts (and the
      // minimums they cancel) are at most ~2 max|w| per value.
      bound.push_back(1e-6 + double(cols / 4 + 16) * 1.2e-7 * (mag + 2.0 * wmax * x_abs));
      exact.push_back(ex);
      moved.push_back(mv);
    }
  }
};

// `[n, rows] y = quantise([n, cols] x) * w^T` on Arch's int8 kernel, through
// the entry linear() uses for block formats.
template <class Arch>
std::vector<float> int8_product(const weight_matrix& w, const std::vector<float>& x, std::size_t n) {
  serial_executor serial;
  model::detail::q8_activations xa;
  std::vector<float> y(n * w.rows(), 7.0f);
  model::detail::matmul_blocks_q8<Arch>(serial, x.data(), n,
                                 model::detail::block_weights{stored_block_type(w.type()), w.block_data(), w.cols()},
                                 w.rows(), y.data(), w.rows(), false, xa);
  return y;
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
  REQUIRE(ggml_block_bytes(ggml_type::q2_k) == sizeof(block_q2_k));
  REQUIRE(ggml_block_bytes(ggml_type::q3_k) == sizeof(block_q3_k));
  REQUIRE(ggml_block_bytes(ggml_type::iq4_nl) == sizeof(block_iq4_nl));
  REQUIRE(ggml_block_bytes(ggml_type::iq4_xs) == sizeof(block_iq4_xs));
  REQUIRE(ggml_block_bytes(ggml_type::mxfp4) == sizeof(block_mxfp4));
  REQUIRE(std::uint32_t(ggml_type::mxfp4) == 39);
  REQUIRE(ggml_type_name(39) == "MXFP4");
  REQUIRE(offsetof(block_q2_k, d) == 80);
  REQUIRE(offsetof(block_q3_k, d) == 108);
  REQUIRE(offsetof(block_iq4_xs, qs) == 8);
  REQUIRE(ggml_type_name(std::uint32_t(ggml_type::q2_k)) == "Q2_K");
  REQUIRE(ggml_type_name(std::uint32_t(ggml_type::q3_k)) == "Q3_K");
  REQUIRE(ggml_type_name(std::uint32_t(ggml_type::iq4_nl)) == "IQ4_NL");
  REQUIRE(ggml_type_name(std::uint32_t(ggml_type::iq4_xs)) == "IQ4_XS");
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
  // Q3_K: scale 14 has low nibble 0xB (high nibble of scales[6]) and high
  // bits 0b10 (bits 6-7 of scales[10]): 0x2B - 32 = 11; value 128 + 96 + 0
  // (half 1, crumb row 3, sub-block 14) with crumb 2 and its hmask bit 7
  // clear is 2 - 4.
  block_q3_k q3{};
  q3.d = f16{f32_to_f16_bits(0.5f)};
  q3.scales[6] = 0xB0;
  q3.scales[10] = 0x80;
  REQUIRE(q3_k_scale(q3.scales, 14) == 0x2B);
  REQUIRE(q3_k_scale(q3.scales, 13) == 0);
  q3.qs[32] = 2 << 6;
  float out3[256];
  dequantize_block(q3, out3);
  REQUIRE(out3[224] == 0.5f * 11.0f * -2.0f);
  q3.hmask[0] = 0x80;  // bit 4h + r = 7 set: the crumb as is
  dequantize_block(q3, out3);
  REQUIRE(out3[224] == 0.5f * 11.0f * 2.0f);
  // Q2_K: value 16 is sub-block 1 (scales[1]: sc 3, m 5), crumb 0 of qs[16].
  block_q2_k q2{};
  q2.d = f16{f32_to_f16_bits(0.25f)};
  q2.dmin = f16{f32_to_f16_bits(0.5f)};
  q2.scales[1] = 0x53;
  q2.qs[16] = 3;
  float out2[256];
  dequantize_block(q2, out2);
  REQUIRE(out2[16] == 0.25f * 3.0f * 3.0f - 0.5f * 5.0f);
  REQUIRE(out2[17] == -0.5f * 5.0f);
  // IQ4_XS: sub-block 3's scale is the high nibble of scales_l[1] and bits
  // 6-7 of scales_h; index 0 is the level -127, index 8 the level 1.
  block_iq4_xs x4{};
  x4.d = f16{f32_to_f16_bits(1.0f)};
  x4.scales_l[1] = 0x70;
  x4.scales_h = 0b11 << 6;
  REQUIRE(iq4_xs_scale(x4, 3) == 0x37);
  for (auto& q : x4.qs) q = 0x80;
  float out4[256];
  dequantize_block(x4, out4);
  REQUIRE(out4[96] == float(0x37 - 32) * -127.0f);
  REQUIRE(out4[96 + 16] == float(0x37 - 32) * 1.0f);
  REQUIRE(out4[0] == -32.0f * -127.0f);  // scale field 0 is -32
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
                        : t == ggml_type::q6_k ? 6 : t == ggml_type::q3_k ? 3 : t == ggml_type::q2_k ? 2 : 4;
      const double step = double(hi - lo) / (std::pow(2.0, bits) - 1);
      // IQ4's widest gap between levels (24 of the 240 from -127 to 113)
      // is 1.5 uniform 4-bit steps.
      const bool k_scaled = t == ggml_type::q4_k || t == ggml_type::q5_k || t == ggml_type::q6_k ||
                            t == ggml_type::q2_k || t == ggml_type::q3_k || t == ggml_type::iq4_xs;
      // MXFP4 puts amax / d in [8, 16) and rounds to levels 4 d apart above
      // 8 d (clipping at 12 d): at most amax / 2.
      const double amax = std::max(-double(lo), double(hi));
      const double bound = t == ggml_type::mxfp4 ? 0.5 * amax
                          : k_scaled             ? 2.0 * step
                          : t == ggml_type::iq4_nl ? 1.5 * step
                                                   : 1.01 * step;
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

TEST_CASE("quants: int8-activation products of every block format match the double oracle, batch and thread invariant") {
  std::mt19937 rng(37);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  thread_pool pool(2);
  serial_executor serial;
  for (const weight_type wt : {weight_type::q4_0, weight_type::q4_1, weight_type::q5_0, weight_type::q5_1,
                               weight_type::q4_k, weight_type::q5_k, weight_type::q6_k, weight_type::q2_k,
                               weight_type::q3_k, weight_type::iq4_nl, weight_type::iq4_xs, weight_type::mxfp4}) {
    const ggml_type gt = stored_block_type(wt);
    const std::size_t k = ggml_block_elements(gt);
    // Odd block counts (a half-filled last 64-value group), one and several
    // super-blocks; rows around the 4-row tiles and the 64-row thread split.
    const std::vector<std::pair<std::size_t, std::size_t>> shapes =
        k == 32 ? std::vector<std::pair<std::size_t, std::size_t>>{{1, 32}, {5, 96}, {67, 160}, {130, 512}}
                : std::vector<std::pair<std::size_t, std::size_t>>{{1, 256}, {6, 768}, {67, 512}};
    for (const auto& [rows, cols] : shapes) {
      weight_matrix w(wt, rows, cols);
      std::vector<float> values(cols);
      for (std::size_t r = 0; r < rows; ++r) {
        for (auto& v : values) v = normal(rng) * (r % 3 == 0 ? 0.02f : 1.5f) + (r % 2 == 0 ? 0.3f : 0.0f);
        if (r == 1) std::fill(values.begin(), values.end(), 0.0f);  // all-zero blocks (scale 0)
        w.set_row(r, values);
      }
      for (const std::size_t n : {1u, 2u, 3u, 5u, 9u, 33u}) {
        INFO(weight_type_name(wt) << " rows " << rows << " cols " << cols << " n " << n);
        std::vector<float> x(n * cols);
        for (auto& v : x) v = normal(rng) * 2.0f;
        std::fill_n(x.begin(), 32, 0.0f);  // an all-zero activation block
        const std::size_t stride = rows + 3;
        std::vector<float> y(n * stride, 7.0f), yp(n * stride, 7.0f), acc(n * stride, 0.5f);
        linear(serial, x, n, w, y, stride, output_mode::overwrite, activation_type::q8_0);
        linear(pool, x, n, w, yp, stride, output_mode::overwrite, activation_type::q8_0);
        linear(serial, x, n, w, acc, stride, output_mode::accumulate, activation_type::q8_0);
        for (std::size_t t = 0; t < n; ++t) {
          const int8_oracle expected(gt, w, &x[t * cols]);
          for (std::size_t o = 0; o < rows; ++o) {
            const float got = y[t * stride + o];
            REQUIRE(std::abs(double(got) - expected.e[o]) <= expected.bound[o]);
            REQUIRE(yp[t * stride + o] == got);  // threads do not change the result
            REQUIRE(std::abs(double(acc[t * stride + o]) - (double(got) + 0.5)) <= 1e-6 * (1.0 + std::abs(got)));
            // Against the exact activations: only their rounding moves the result.
            REQUIRE(std::abs(double(got) - expected.exact[o]) <= expected.moved[o] + expected.bound[o]);
          }
          for (std::size_t o = rows; o < stride; ++o) REQUIRE(y[t * stride + o] == 7.0f);  // padding untouched
          std::vector<float> one(rows);  // batch invariance: each token alone gives the same bits
          linear(serial, std::span<const float>(x).subspan(t * cols, cols), 1, w, one, rows, output_mode::overwrite,
                 activation_type::q8_0);
          for (std::size_t o = 0; o < rows; ++o) REQUIRE(one[o] == y[t * stride + o]);
        }
      }
      // A NaN activation makes every output NaN, as the exact product does.
      std::vector<float> xn(cols, 1.0f), yn(rows);
      xn[cols - 1] = std::numeric_limits<float>::quiet_NaN();
      linear(serial, xn, 1, w, yn, rows, output_mode::overwrite, activation_type::q8_0);
      for (float v : yn) REQUIRE(std::isnan(v));
    }
  }
}

TEST_CASE("quants: int8-activation products pick their kernel by the arch tag, every arch within the oracle") {
  // matmul_kernels<Arch> overloads each int8 kernel on the xsimd arch tag:
  // scalar runs the strip kernel (matmul_blocks_q8.hpp), fma3<avx2> the AVX2
  // kernel, the default arch its best one (AVX-512 VNNI where the build has
  // it), whatever flags the build was compiled with.
  std::mt19937 rng(41);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const bool avx2 = xsimd::available_architectures().fma3_avx2;
  std::size_t scalar_differs = 0, avx2_differs = 0, avx2_scalar_differs = 0;
  for (const weight_type wt : {weight_type::q4_0, weight_type::q4_1, weight_type::q5_0, weight_type::q5_1,
                               weight_type::q4_k, weight_type::q5_k, weight_type::q6_k, weight_type::q2_k,
                               weight_type::q3_k, weight_type::iq4_nl, weight_type::iq4_xs, weight_type::mxfp4}) {
    const ggml_type gt = stored_block_type(wt);
    const std::size_t k = ggml_block_elements(gt);
    for (const auto& [rows, blocks, n] : {std::tuple<std::size_t, std::size_t, std::size_t>{5, 1, 1}, {7, 3, 2},
                                          {9, 2, 5}}) {
      const std::size_t cols = blocks * k;
      INFO(weight_type_name(wt) << " rows " << rows << " cols " << cols << " n " << n);
      weight_matrix w(wt, rows, cols);
      std::vector<float> values(cols);
      for (std::size_t r = 0; r < rows; ++r) {
        for (auto& v : values) v = normal(rng) * (r % 3 == 0 ? 0.02f : 1.5f) + (r % 2 == 0 ? 0.3f : 0.0f);
        w.set_row(r, values);
      }
      std::vector<float> x(n * cols);
      for (auto& v : x) v = normal(rng) * 2.0f;
      const std::vector<float> scalar = int8_product<simd::scalar>(w, x, n);
      const std::vector<float> best = int8_product<simd::default_arch>(w, x, n);
      std::vector<float> fma_avx2 = scalar;
#if defined(__AVX2__) && defined(__FMA__)
      if (avx2) fma_avx2 = int8_product<xsimd::fma3<xsimd::avx2>>(w, x, n);
#endif
      for (std::size_t t = 0; t < n; ++t) {
        const int8_oracle expected(gt, w, &x[t * cols]);
        for (std::size_t o = 0; o < rows; ++o) {
          const std::size_t i = t * rows + o;
          REQUIRE(std::abs(double(scalar[i]) - expected.e[o]) <= expected.bound[o]);
          REQUIRE(std::abs(double(fma_avx2[i]) - expected.e[o]) <= expected.bound[o]);
          REQUIRE(std::abs(double(best[i]) - expected.e[o]) <= expected.bound[o]);
        }
      }
      for (std::size_t i = 0; i < n * rows; ++i) {
        scalar_differs += scalar[i] != best[i];
        avx2_differs += fma_avx2[i] != best[i];
        avx2_scalar_differs += fma_avx2[i] != scalar[i];
      }
    }
  }
  // The kernels are not bit-identical to each other (the strip kernel sums
  // the lanes in sequence, the AVX2 and VNNI kernels in vector lanes and a
  // tree): each is held to the oracle's bound above, and some outputs
  // differ where the arch tag reached a different kernel (with the build's
  // flags choosing the kernel, they would not).
#if defined(__AVX2__) && defined(__FMA__)
  CHECK(scalar_differs > 0);
  if (avx2) CHECK(avx2_scalar_differs > 0);
#endif
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__) && defined(__AVX512VL__)
  if (avx2) CHECK(avx2_differs > 0);
#endif
  (void)avx2;
  (void)avx2_differs;
  (void)avx2_scalar_differs;
}

TEST_CASE("quants: IQ4_NL and MXFP4 int8 products at 1 to 9 blocks per row match the oracle, batch invariant") {
  // Their VNNI kernel steps four blocks at a time: every remainder (1-3
  // blocks, a row of one block), row counts around its 4- and 2-row tiles,
  // token counts of each tile shape, and block scales far from 1 (MXFP4's
  // exponents applied by VSCALEFPS).
  std::mt19937 rng(53);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  serial_executor serial;
  for (const weight_type wt : {weight_type::iq4_nl, weight_type::mxfp4}) {
    const ggml_type gt = stored_block_type(wt);
    for (std::size_t blocks = 1; blocks <= 9; ++blocks) {
      const std::size_t cols = 32 * blocks;
      for (const std::size_t rows : {1u, 3u, 6u, 9u}) {
        weight_matrix w(wt, rows, cols);
        std::vector<float> values(cols);
        for (std::size_t r = 0; r < rows; ++r) {
          const float magnitude = wt == weight_type::mxfp4 ? std::ldexp(1.0f, int(r % 3) * 40 - 40) : 1.0f;
          for (auto& v : values) v = normal(rng) * magnitude;
          w.set_row(r, values);
        }
        for (const std::size_t n : {1u, 2u, 3u, 5u}) {
          INFO(weight_type_name(wt) << " rows " << rows << " blocks " << blocks << " n " << n);
          std::vector<float> x(n * cols);
          for (auto& v : x) v = normal(rng) * 2.0f;
          std::vector<float> y(n * rows, 7.0f);
          linear(serial, x, n, w, y, rows, output_mode::overwrite, activation_type::q8_0);
          for (std::size_t t = 0; t < n; ++t) {
            const int8_oracle expected(gt, w, &x[t * cols]);
            std::vector<float> one(rows);
            linear(serial, std::span<const float>(x).subspan(t * cols, cols), 1, w, one, rows, output_mode::overwrite,
                   activation_type::q8_0);
            for (std::size_t o = 0; o < rows; ++o) {
              REQUIRE(std::abs(double(y[t * rows + o]) - expected.e[o]) <= expected.bound[o]);
              REQUIRE(one[o] == y[t * rows + o]);
            }
          }
        }
      }
    }
  }
}


TEST_CASE("quants: K-quant and IQ4_XS int8 products equal the f32-order oracle bit for bit, GEMM tiles and edges, threads") {
  // Every VNNI kernel of these formats sums each super-block exactly in
  // int32 and adds it with two f32 FMAs (gemm_kquants_vnni.hpp): the GEMM's
  // 6-token x 32-row tiles and their edges (rows around 16 and 32, token
  // counts 4-7 and beyond a tile, one super-block), the register-decoding
  // kernel under 4 tokens, and two threads must all give
  // reference::kquant_product_f32.
  // Other arches run the strip kernel, held to the oracle's bound above.
  std::mt19937 rng(53);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> scale(0.0005f, 0.02f);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  thread_pool pool(2);
  serial_executor serial;
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__) && defined(__AVX512VL__)
  constexpr bool exact = true;
#else
  constexpr bool exact = false;  // the strip kernel: its bound is checked by the tests above
#endif
  for (const ggml_type gt :
       {ggml_type::q4_k, ggml_type::q5_k, ggml_type::q6_k, ggml_type::q2_k, ggml_type::q3_k, ggml_type::iq4_xs}) {
    const std::size_t block_bytes = ggml_block_bytes(gt);
    for (const auto& [rows, cols] : std::vector<std::pair<std::size_t, std::size_t>>{
             {1, 256}, {15, 512}, {16, 256}, {17, 768}, {33, 512}, {48, 256}, {70, 2048}, {130, 1024}}) {
      // Random bytes: every 6-bit scale and minimum, every value; f16 scales in range.
      std::vector<std::byte> w(rows * cols / 256 * block_bytes);
      for (auto& b : w) b = std::byte(byte(rng));
      for (std::size_t b = 0; b < w.size(); b += block_bytes)
        for (std::size_t at : scale_offsets(gt)) put_f16(w, b + at, scale(rng));
      const model::detail::block_weights bw{gt, w.data(), cols};
      for (const std::size_t n : {1u, 2u, 3u, 4u, 5u, 6u, 7u, 8u, 13u, 67u}) {
        INFO(type_name(gt) << " rows " << rows << " cols " << cols << " n " << n);
        std::vector<float> x(n * cols);
        for (auto& v : x) v = normal(rng) * 2.0f;
        std::fill_n(x.begin() + std::ptrdiff_t((n - 1) * cols), 256, 0.0f);  // a zero super-block
        const std::vector<float> expected = reference::kquant_product_f32(gt, x, n, cols, w.data(), rows);
        const std::size_t stride = rows + 1;
        std::vector<float> best(n * stride, 7.0f), threaded(n * stride, 7.0f), acc(n * stride, 0.25f);
        model::detail::q8_activations xa;
        model::detail::matmul_blocks_q8(serial, x.data(), n, bw, rows, best.data(), stride, false, xa);
        model::detail::matmul_blocks_q8(pool, x.data(), n, bw, rows, threaded.data(), stride, false, xa);
        model::detail::matmul_blocks_q8(serial, x.data(), n, bw, rows, acc.data(), stride, true, xa);
        for (std::size_t t = 0; t < n; ++t) {
          for (std::size_t o = 0; o < rows; ++o) {
            const float e = expected[t * rows + o], got = best[t * stride + o];
            REQUIRE(threaded[t * stride + o] == got);
            REQUIRE(acc[t * stride + o] == 0.25f + got);
            if (exact) REQUIRE(got == e);
          }
          REQUIRE(best[t * stride + rows] == 7.0f);  // the row padding untouched
          REQUIRE(acc[t * stride + rows] == 0.25f);
        }
      }
    }
  }
}

TEST_CASE("quants: the Q4_0, IQ4_NL and MXFP4 panel-source GEMM and direct kernel equal the f32-order oracle bit for bit, GEMM tiles and edges, row splits") {
  // On AVX-512 VNNI these formats' panel source of the Q8_0 GEMM (4 tokens
  // and more) and register-decoding kernel under 4 tokens
  // (gemm_blocks32_vnni.hpp) must give reference::block32_product_f32:
  // rows around the 16-row panels and 32-row strips, block counts around
  // the 4-block groups, token counts around the 6-token tiles, two threads,
  // accumulation, and each token alone equal to its place in the batch.
  std::mt19937 rng(59);
  std::uniform_int_distribution<int> byte(0, 255), wobble(-3, 3);
  std::uniform_real_distribution<float> scale(0.0005f, 0.02f);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  thread_pool pool(2);
  serial_executor serial;
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__) && defined(__AVX512VL__)
  constexpr bool exact = true;
#else
  constexpr bool exact = false;  // the strip kernel: its bound is checked by the tests above
#endif
  // Infinities from MXFP4's largest exponents may meet and make NaN.
  auto same = [](float a, float b) { return a == b || (std::isnan(a) && std::isnan(b)); };
  for (const ggml_type gt : {ggml_type::q4_0, ggml_type::iq4_nl, ggml_type::mxfp4}) {
    const std::size_t block_bytes = ggml_block_bytes(gt);
    for (const auto& [rows, cols] : std::vector<std::pair<std::size_t, std::size_t>>{
             {1, 32}, {15, 64}, {16, 96}, {17, 160}, {33, 224}, {48, 128}, {70, 2048}, {130, 416}}) {
      // Random bytes: every nibble; f16 scales in range, MXFP4 exponents
      // around a centre that moves with the row (0 and 254 included), the
      // last row every exponent in turn.
      std::vector<std::byte> w(rows * cols / 32 * block_bytes);
      for (auto& b : w) b = std::byte(byte(rng));
      for (std::size_t b = 0; b < w.size(); b += block_bytes) {
        const std::size_t row = b / block_bytes / (cols / 32), block = b / block_bytes % (cols / 32);
        if (gt != ggml_type::mxfp4) {
          put_f16(w, b, scale(rng));
        } else if (row + 1 == rows && rows > 1) {
          w[b] = std::byte(block * 7 % 255);
        } else {
          const int centre = row % 3 == 0 ? 0 : row % 3 == 1 ? 254 : int(row * 37 % 255);
          w[b] = std::byte(std::clamp(centre + wobble(rng), 0, 254));
        }
      }
      const model::detail::block_weights bw{gt, w.data(), cols};
      for (const std::size_t n : {1u, 2u, 3u, 4u, 5u, 6u, 7u, 8u, 13u, 67u}) {
        INFO(type_name(gt) << " rows " << rows << " cols " << cols << " n " << n);
        std::vector<float> x(n * cols);
        for (auto& v : x) v = normal(rng) * 2.0f;
        std::fill_n(x.begin() + std::ptrdiff_t((n - 1) * cols), 32, 0.0f);  // a zero block
        const std::vector<float> expected = reference::block32_product_f32(gt, x, n, cols, w.data(), rows);
        const std::size_t stride = rows + 1;
        std::vector<float> best(n * stride, 7.0f), threaded(n * stride, 7.0f), acc(n * stride, 0.25f);
        model::detail::q8_activations xa;
        // The products do not route these formats here (has_block32_gemm),
        // so the kernels are called directly, rows split in two as two
        // threads would split them.
        auto product = [&](auto& exec, const float* xs, std::size_t tokens, float* out, std::size_t out_stride,
                           bool accumulate) {
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__) && defined(__AVX512VL__)
          xa.assign<xsimd::avx512bw>(xs, tokens, cols);
          model::visit_block(gt, [&](auto block) {
            using B = decltype(block);
            if constexpr (model::detail::is_block32_panel_source<B>) {
              const std::size_t half = std::is_same_v<std::decay_t<decltype(exec)>, thread_pool> ? rows / 2 : 0;
              model::detail::block32_gemm_rows<B>(xa, bw, out, out_stride, accumulate, 0, half);
              model::detail::block32_gemm_rows<B>(xa, bw, out, out_stride, accumulate, half, rows);
            }
          });
#else
          model::detail::matmul_blocks_q8(exec, xs, tokens, bw, rows, out, out_stride, accumulate, xa);
#endif
        };
        product(serial, x.data(), n, best.data(), stride, false);
        product(pool, x.data(), n, threaded.data(), stride, false);
        product(serial, x.data(), n, acc.data(), stride, true);
        for (std::size_t t = 0; t < n; ++t) {
          std::vector<float> one(rows);
          product(serial, x.data() + t * cols, 1, one.data(), rows, false);
          for (std::size_t o = 0; o < rows; ++o) {
            const float e = expected[t * rows + o], got = best[t * stride + o];
            REQUIRE(same(threaded[t * stride + o], got));
            REQUIRE(same(acc[t * stride + o], 0.25f + got));
            REQUIRE(same(one[o], got));  // batch invariance
            if (exact) REQUIRE(same(got, e));
          }
          REQUIRE(best[t * stride + rows] == 7.0f);  // the row padding untouched
          REQUIRE(acc[t * stride + rows] == 0.25f);
        }
      }
    }
  }
}

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__) && defined(__AVX512VL__)
// Every byte of a 9 x 768 `gt` matrix set to `fill` (the f16 scales 0.01),
// every activation at +-127 (equal values quantise to 127 * sign): the int8
// product of 1, 2, 3 and 6 tokens equals the f32-order oracle bit for bit.
static void check_extreme_blocks(ggml_type gt, std::byte fill) {
  serial_executor serial;
  constexpr std::size_t rows = 9, cols = 768;
  const std::size_t block_bytes = ggml_block_bytes(gt);
  std::vector<std::byte> w(rows * cols / 256 * block_bytes, fill);
  for (std::size_t b = 0; b < w.size(); b += block_bytes)
    for (std::size_t at : scale_offsets(gt)) put_f16(w, b + at, 0.01f);
  const model::detail::block_weights bw{gt, w.data(), cols};
  for (const float sign : {1.0f, -1.0f}) {
    for (const std::size_t n : {1u, 2u, 3u, 6u}) {
      INFO(type_name(gt) << " fill " << int(fill) << " sign " << sign << " n " << n);
      std::vector<float> x(n * cols, 3.0f * sign);
      const std::vector<float> expected = reference::kquant_product_f32(gt, x, n, cols, w.data(), rows);
      std::vector<float> y(n * rows);
      model::detail::q8_activations xa;
      model::detail::matmul_blocks_q8(serial, x.data(), n, bw, rows, y.data(), rows, false, xa);
      for (std::size_t i = 0; i < n * rows; ++i) REQUIRE(y[i] == expected[i]);
    }
  }
}
#endif

TEST_CASE("quants: Q4_K and Q5_K int8 products at their largest values, scales and activations equal the f32-order oracle bit for bit") {
  // Every value, scale and minimum at its maximum (all bits set) and every
  // activation at +-127: the one-token kernel's int16 packing of its sums of
  // 4 (at most 4 * 31 * 127) and the GEMM must still give the oracle's bits.
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__) && defined(__AVX512VL__)
  for (const ggml_type gt : {ggml_type::q4_k, ggml_type::q5_k}) check_extreme_blocks(gt, std::byte{0xFF});
#endif
}

TEST_CASE("quants: Q2_K, Q3_K and IQ4_XS int8 products at their extreme values, scales and activations equal the f32-order oracle bit for bit") {
  // Every byte all ones (values, scales and minimums at their maximum:
  // Q2_K's crumb * scale 45 in the one-token table, Q3_K's sums of 4 at
  // 4 * 7 * 127) or all zeros (Q3_K's value -4 by scale -32, IQ4_XS's level
  // -127 by scale -32), activations at +-127: the one-token decoders and
  // the GEMM must still give the oracle's bits.
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__) && defined(__AVX512VL__)
  for (const ggml_type gt : {ggml_type::q2_k, ggml_type::q3_k, ggml_type::iq4_xs})
    for (const std::byte fill : {std::byte{0xFF}, std::byte{0x00}}) check_extreme_blocks(gt, fill);
#endif
}

TEST_CASE("quants: every block format has an int8-activation product, Q8_0 blocks are refused by name") {
  for (const ggml_type t : quant_types)
    REQUIRE(model::detail::has_int8_product_for(t) == (t != ggml_type::q8_0));
  // Q8_0 weights multiply int8 activations through matmul_q8, not the block entry point.
  serial_executor serial;
  model::detail::q8_activations xa;
  std::vector<float> x(64, 1.0f), y(2);
  REQUIRE_THROWS_WITH(model::detail::matmul_blocks_q8(serial, x.data(), 1,
                                                      model::detail::block_weights{ggml_type::q8_0, nullptr, 64}, 2,
                                                      y.data(), 2, false, xa),
                      "matmul_blocks_q8: Q8_0 weights have no int8-activation product");
}

TEST_CASE("quants: Q2_K, Q3_K, IQ4_NL and IQ4_XS tensors with non-finite scales are refused by name") {
  // d (and Q2_K's dmin) of the second block of a 2-block row made NaN / Inf.
  for (const ggml_type t : {ggml_type::q2_k, ggml_type::q3_k, ggml_type::iq4_nl, ggml_type::iq4_xs}) {
    for (const std::size_t at : scale_offsets(t)) {
      const std::size_t k = ggml_block_elements(t), cols = 2 * k;
      std::vector<float> x(cols, 0.25f);
      std::vector<std::byte> bytes(2 * ggml_block_bytes(t));
      quantize_row(t, x.data(), bytes.data(), cols);
      const std::uint16_t inf = 0x7C00;
      std::memcpy(bytes.data() + ggml_block_bytes(t) + at, &inf, 2);
      gguf_writer w;
      w.add_tensor("blk.0.ffn_up.weight", t, {cols, 1}, bytes);
      const auto image = w.bytes();
      const gguf_file f(std::span<const std::byte>(image.data(), image.size()));
      for (const weight_type wt : {weight_type::native, weight_type::f32}) {
        weight_matrix m(resolve_weight_type(wt, t, cols), 1, cols);
        INFO(type_name(t) << " scale at " << at);
        REQUIRE_THROWS_WITH(m.copy_from(f.tensor("blk.0.ffn_up.weight"), 0),
                            Catch::Contains("tensor 'blk.0.ffn_up.weight' (" + type_name(t) +
                                            ") has a non-finite scale in the block of column " + std::to_string(k) +
                                            " at byte " + std::to_string(ggml_block_bytes(t))));
      }
    }
  }
}

TEST_CASE("quants: MXFP4 decodes E8M0 scales and E2M1 values as the spec defines, and refuses the NaN scale") {
  // e = 127 is the scale 1 (2^(e - 127)); the nibbles 0..15 are 0, 0.5, 1,
  // 1.5, 2, 3, 4, 6 and their negatives (8 is -0, decoded as 0 as ggml does).
  block_mxfp4 b{};
  b.d = e8m0{127};
  for (std::size_t j = 0; j < 16; ++j) b.qs[j] = static_cast<std::uint8_t>(j | ((15 - j) << 4));
  float out[32];
  dequantize_block(b, out);
  const float e2m1[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  for (std::size_t j = 0; j < 16; ++j) {
    REQUIRE(out[j] == (j < 8 ? e2m1[j] : -e2m1[j - 8]));
    REQUIRE(out[16 + j] == (15 - j < 8 ? e2m1[15 - j] : -e2m1[7 - j]));
  }
  // The extremes of the scale byte: 2^-127 (a subnormal f32) and 2^127.
  b.d = e8m0{0};
  dequantize_block(b, out);
  REQUIRE(out[2] == std::ldexp(1.0f, -127));
  b.d = e8m0{254};
  dequantize_block(b, out);
  REQUIRE(out[3] == std::ldexp(1.5f, 127));
  // The encoder never writes 255, even for huge or non-finite inputs.
  std::vector<float> x(32, 3.0e38f);
  x[1] = std::numeric_limits<float>::infinity();
  quantize_block(x.data(), b);
  REQUIRE(b.d.bits <= 254);
  // A tensor whose second block has the NaN scale 255 is refused by name.
  const std::size_t cols = 64;
  std::vector<float> v(cols, 0.25f);
  std::vector<std::byte> bytes(2 * sizeof(block_mxfp4));
  quantize_row(ggml_type::mxfp4, v.data(), bytes.data(), cols);
  bytes[sizeof(block_mxfp4)] = std::byte{255};
  gguf_writer w;
  w.add_tensor("blk.0.ffn_up_exps.weight", ggml_type::mxfp4, {cols, 1}, bytes);
  const auto image = w.bytes();
  const gguf_file f(std::span<const std::byte>(image.data(), image.size()));
  weight_matrix m(weight_type::mxfp4, 1, cols);
  REQUIRE_THROWS_WITH(m.copy_from(f.tensor("blk.0.ffn_up_exps.weight"), 0),
                      Catch::Contains("tensor 'blk.0.ffn_up_exps.weight' (MXFP4) has a non-finite scale in the block "
                                      "of column 32 at byte 17"));
}
