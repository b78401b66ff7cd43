// SPDX-License-Identifier: MIT
// model/weights.hpp: weight_matrix storage (f32, f16, Q8_0) and the linear()
// kernel against a double-precision oracle (also the Q8_0 x int8-activation
// product); llama_options::weight_type and ::activations.
#include <llmkit/core/executor.hpp>
#include <llmkit/kv/contiguous_cache.hpp>
#include <llmkit/model/batch.hpp>
#include <llmkit/model/gguf_writer.hpp>
#include <llmkit/model/llama.hpp>
#include <llmkit/model/synthetic.hpp>
#include <llmkit/model/weights.hpp>
#include <llmkit/simd/convert.hpp>

#include <catch2/catch.hpp>

#include "reference/model_reference.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <span>
#include <vector>

using namespace llmkit;
using namespace llmkit::model;
using Catch::Matchers::Contains;

namespace {
std::vector<float> random_values(std::size_t n, std::mt19937& rng, float range = 1.0f) {
  std::uniform_real_distribution<float> u(-range, range);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

weight_matrix random_matrix(weight_type t, std::size_t rows, std::size_t cols, std::mt19937& rng) {
  weight_matrix w(t, rows, cols);
  for (std::size_t r = 0; r < rows; ++r) w.set_row(r, random_values(cols, rng));
  return w;
}

// y = x * W^T in double over the stored (decoded) weights; also sum |x||w|
// per output for the error bound.
void oracle(const std::vector<float>& x, std::size_t n, const weight_matrix& w, std::vector<double>& y,
            std::vector<double>& mag) {
  y.assign(n * w.rows(), 0.0);
  mag.assign(n * w.rows(), 0.0);
  std::vector<float> row(w.cols());
  for (std::size_t o = 0; o < w.rows(); ++o) {
    w.row(o, row);
    for (std::size_t t = 0; t < n; ++t)
      for (std::size_t k = 0; k < w.cols(); ++k) {
        y[t * w.rows() + o] += double(x[t * w.cols() + k]) * double(row[k]);
        mag[t * w.rows() + o] += std::abs(double(x[t * w.cols() + k]) * double(row[k]));
      }
  }
}
}  // namespace

TEST_CASE("weights: stored rows decode to the f32 values, rounded per storage type") {
  std::mt19937 rng(1);
  const auto v = random_values(64, rng, 3.0f);
  weight_matrix f(weight_type::f32, 2, 64), h(weight_type::f16, 2, 64), q(weight_type::q8_0, 2, 64);
  for (weight_matrix* m : {&f, &h, &q}) m->set_row(1, v);
  std::vector<float> out(64);
  f.row(1, out);
  REQUIRE(out == v);
  h.row(1, out);
  for (std::size_t i = 0; i < 64; ++i) REQUIRE(out[i] == f16_bits_to_f32(f32_to_f16_bits(v[i])));
  q.row(1, out);
  std::vector<block_q8_0> blocks(2);
  simd::quantize_q8_0<simd::scalar>(v, blocks);
  for (std::size_t i = 0; i < 64; ++i) REQUIRE(out[i] == to_f32(blocks[i / 32].scale) * float(blocks[i / 32].qs[i % 32]));
  q.row(0, out);
  for (float x : out) REQUIRE(x == 0.0f);  // untouched rows stay zero
  REQUIRE(f.bytes() == model::detail::panel_storage_size(2, 64) * 4);  // f32: whole 64-row panels
  REQUIRE(model::detail::panel_storage_size(2, 64) == 64 * 64);
  REQUIRE(h.bytes() == 2 * 64 * 2);
  REQUIRE(q.bytes() == 2 * 64 + 2 * 2 * 4);
  REQUIRE(q.type() == weight_type::q8_0);
  REQUIRE(weight_type_name(weight_type::q8_0) == "q8_0");
}

TEST_CASE("weights: linear() matches the double oracle for every storage, shape and batch size") {
  std::mt19937 rng(2);
  thread_pool pool(2);
  serial_executor serial;
  struct shape {
    std::size_t rows, cols;
  };
  // Output rows around the 4- and 6-row tiles and the 96-row block; token
  // counts on every path (1-4, 5-8, 9-32 streaming, 37 blocked); inputs around the
  // 16-lane register (f32/f16 also odd widths and widths below a register).
  const std::vector<shape> shapes{{1, 32}, {3, 64}, {5, 96}, {64, 32}, {65, 160}, {130, 256}, {257, 512},
                                  {7, 1},  {9, 17}, {33, 15}, {63, 47}, {66, 300}, {5, 8448}};
  for (const weight_type t : {weight_type::f32, weight_type::f16, weight_type::q8_0, weight_type::q4_0,
                              weight_type::q4_1, weight_type::q5_0, weight_type::q5_1, weight_type::q4_k,
                              weight_type::q5_k, weight_type::q6_k, weight_type::q2_k, weight_type::q3_k,
                              weight_type::iq4_nl, weight_type::iq4_xs, weight_type::mxfp4}) {
    for (const shape sh : shapes) {
      if (sh.cols % weight_block_size(t) != 0) continue;
      const weight_matrix w = random_matrix(t, sh.rows, sh.cols, rng);
      for (const std::size_t n : {0u, 1u, 2u, 3u, 4u, 5u, 8u, 9u, 14u, 37u}) {
        INFO("type " << weight_type_name(t) << " rows " << sh.rows << " cols " << sh.cols << " n " << n);
        const auto x = random_values(n * sh.cols, rng);
        std::vector<double> ref, mag;
        oracle(x, n, w, ref, mag);
        const std::size_t stride = sh.rows + 3;  // y rows wider than the product
        std::vector<float> y(n * stride, 7.0f), yp(n * stride, 7.0f), acc(n * stride, 0.5f);
        linear(serial, x, n, w, y, stride);
        linear(pool, x, n, w, yp, stride);
        linear(serial, x, n, w, acc, stride, output_mode::accumulate);
        for (std::size_t i = 0; i < n; ++i) {
          for (std::size_t o = 0; o < sh.rows; ++o) {
            const double e = ref[i * sh.rows + o];
            // f32 accumulation over cols terms: |error| <= cols * 2^-24 * sum |x w| (loose bound).
            const double bound = 1e-6 + double(sh.cols) * 6e-8 * mag[i * sh.rows + o];
            REQUIRE(std::abs(double(y[i * stride + o]) - e) <= bound);
            REQUIRE(yp[i * stride + o] == y[i * stride + o]);  // threads do not change the result
            REQUIRE(std::abs(double(acc[i * stride + o]) - (e + 0.5)) <= bound + 1e-6);
          }
          for (std::size_t o = sh.rows; o < stride; ++o) REQUIRE(y[i * stride + o] == 7.0f);  // padding untouched
        }
        // Batch invariance: each token alone gives the bit-identical row.
        for (std::size_t i = 0; i < n; ++i) {
          std::vector<float> one(sh.rows);
          linear(serial, std::span<const float>(x).subspan(i * sh.cols, sh.cols), 1, w, one, sh.rows);
          for (std::size_t o = 0; o < sh.rows; ++o) REQUIRE(one[o] == y[i * stride + o]);
        }
      }
    }
  }
}

TEST_CASE("weights: q8_0 activations give ggml's Q8_0 x Q8_0 product, exactly rounded, batch invariant") {
  std::mt19937 rng(12);
  thread_pool pool(2);
  serial_executor serial;
  struct shape {
    std::size_t rows, cols;
  };
  // Odd block counts (1, 3, 5, 9: a last half-filled pair), rows around the
  // 4-row strip and the 64-row thread split.
  const std::vector<shape> shapes{{1, 32}, {3, 64}, {5, 96}, {64, 160}, {67, 288}, {130, 256}, {9, 512}};
  for (const shape sh : shapes) {
    weight_matrix w(weight_type::q8_0, sh.rows, sh.cols);
    std::uniform_int_distribution<int> qv(-128, 127);  // -128 too: GGUF files may hold it
    std::uniform_real_distribution<float> scale(0.001f, 0.05f);
    for (std::size_t r = 0; r < sh.rows; ++r) {
      std::vector<block_q8_0> blocks(sh.cols / 32);
      for (auto& b : blocks) {
        b.scale = f16{f32_to_f16_bits(scale(rng))};
        for (auto& q : b.qs) q = static_cast<std::int8_t>(qv(rng));
      }
      if (r == 0) blocks[0].qs[0] = -128;
      w.set_row_q8_0(r, blocks.data());
    }
    for (const std::size_t n : {0u, 1u, 2u, 3u, 4u, 5u, 8u, 9u, 33u}) {
      INFO("rows " << sh.rows << " cols " << sh.cols << " n " << n);
      auto x = random_values(n * sh.cols, rng, 3.0f);
      if (n > 0) std::fill_n(x.begin(), 32, 0.0f);  // an all-zero block (scale 0)
      std::vector<double> ref, mag;
      reference::q8_q8_product(x, n, sh.cols, w.q8_data(), w.q8_scales(), sh.rows, ref, mag);
      const std::size_t stride = sh.rows + 2;
      std::vector<float> y(n * stride, 7.0f), yp(n * stride, 7.0f), acc(n * stride, 0.5f), exact(n * stride);
      linear(serial, x, n, w, y, stride, output_mode::overwrite, activation_type::q8_0);
      linear(pool, x, n, w, yp, stride, output_mode::overwrite, activation_type::q8_0);
      linear(serial, x, n, w, acc, stride, output_mode::accumulate, activation_type::q8_0);
      linear(serial, x, n, w, exact, stride);
      std::vector<double> eref, emag;
      oracle(x, n, w, eref, emag);
      for (std::size_t i = 0; i < n; ++i) {
        for (std::size_t o = 0; o < sh.rows; ++o) {
          const double e = ref[i * sh.rows + o];
          // The integer dots are exact; f32 sums over cols / 32 scaled terms.
          const double bound = 1e-6 + double(sh.cols / 32 + 2) * 1.2e-7 * mag[i * sh.rows + o];
          REQUIRE(std::abs(double(y[i * stride + o]) - e) <= bound);
          REQUIRE(yp[i * stride + o] == y[i * stride + o]);  // threads do not change the result
          REQUIRE(std::abs(double(acc[i * stride + o]) - (e + 0.5)) <= bound + 1e-6);
          // Against the exact product: each activation moves by at most half
          // its block's scale (amax / 254), so |error| <= sum |w| amax / 254.
          double wsum = 0.0;
          std::vector<float> row(sh.cols);
          w.row(o, row);
          for (std::size_t k = 0; k < sh.cols; ++k) {
            float amax = 0.0f;
            for (std::size_t j = 0; j < 32; ++j) amax = std::max(amax, std::abs(x[i * sh.cols + k / 32 * 32 + j]));
            wsum += std::abs(double(row[k])) * amax / 254.0;
          }
          REQUIRE(std::abs(double(y[i * stride + o]) - eref[i * sh.rows + o]) <= wsum * 1.001 + bound);
        }
        for (std::size_t o = sh.rows; o < stride; ++o) REQUIRE(y[i * stride + o] == 7.0f);  // padding untouched
      }
      for (std::size_t i = 0; i < n; ++i) {  // batch invariance
        std::vector<float> one(sh.rows);
        linear(serial, std::span<const float>(x).subspan(i * sh.cols, sh.cols), 1, w, one, sh.rows,
               output_mode::overwrite, activation_type::q8_0);
        for (std::size_t o = 0; o < sh.rows; ++o) REQUIRE(one[o] == y[i * stride + o]);
      }
    }
  }
  // f32 and f16 weights ignore the option; a NaN activation gives NaN outputs.
  const weight_matrix f = random_matrix(weight_type::f32, 5, 64, rng);
  const auto x = random_values(64, rng);
  std::vector<float> a(5), b(5);
  linear(serial, x, 1, f, a, 5);
  linear(serial, x, 1, f, b, 5, output_mode::overwrite, activation_type::q8_0);
  REQUIRE(a == b);
  weight_matrix q = random_matrix(weight_type::q8_0, 5, 64, rng);
  auto xn = x;
  xn[40] = std::numeric_limits<float>::quiet_NaN();
  linear(serial, xn, 1, q, a, 5, output_mode::overwrite, activation_type::q8_0);
  for (float v : a) REQUIRE(std::isnan(v));
}

TEST_CASE("weights: the Q8_0 x int8 GEMM equals the f32-order oracle bit for bit, every arch, edge shapes") {
  // matmul_q8.hpp fixes each output's arithmetic (exact block dots, one f32
  // FMA per block, blocks ascending), so every kernel must give exactly
  // reference::q8_q8_product_f32: the VNNI GEMM's 6-token x 32-row tiles
  // and their edges (rows not a multiple of 16 or 32, token counts around
  // 6, one block, odd block counts), the scalar fallback, threads.
  std::mt19937 rng(77);
  thread_pool pool(2);
  serial_executor serial;
  const std::vector<std::pair<std::size_t, std::size_t>> shapes{{1, 32},   {15, 96},  {16, 64},  {17, 160},
                                                                {33, 288}, {48, 64},  {70, 2048}, {200, 224}};
  for (const auto& [rows, cols] : shapes) {
    weight_matrix w(weight_type::q8_0, rows, cols);
    std::uniform_int_distribution<int> qv(-128, 127);
    std::uniform_real_distribution<float> scale(0.001f, 0.05f);
    for (std::size_t r = 0; r < rows; ++r) {
      std::vector<block_q8_0> blocks(cols / 32);
      for (auto& b : blocks) {
        b.scale = f16{f32_to_f16_bits(scale(rng))};
        for (auto& q : b.qs) q = static_cast<std::int8_t>(qv(rng));
      }
      w.set_row_q8_0(r, blocks.data());
    }
    for (const std::size_t n : {1u, 2u, 5u, 6u, 7u, 12u, 13u, 40u, 67u}) {
      INFO("rows " << rows << " cols " << cols << " n " << n);
      auto x = random_values(n * cols, rng, 2.0f);
      std::fill_n(x.begin() + std::ptrdiff_t((n - 1) * cols), 32, 0.0f);  // a zero block
      const std::vector<float> expected = reference::q8_q8_product_f32(x, n, cols, w.q8_data(), w.q8_scales(), rows);
      const std::size_t stride = rows + 1;
      std::vector<float> best(n * stride, 7.0f), threaded(n * stride, 7.0f), scalar(n * stride, 7.0f),
          acc(n * stride, 0.25f);
      linear(serial, x, n, w, best, stride, output_mode::overwrite, activation_type::q8_0);
      linear(pool, x, n, w, threaded, stride, output_mode::overwrite, activation_type::q8_0);
      model::detail::q8_activations xa;
      model::detail::matmul_q8<simd::scalar>(serial, x.data(), n, cols,
                                             model::detail::q8_weights{w.q8_data(), w.q8_scales(), cols}, rows,
                                             scalar.data(), stride, false, xa);
      linear(serial, x, n, w, acc, stride, output_mode::accumulate, activation_type::q8_0);
      for (std::size_t t = 0; t < n; ++t) {
        for (std::size_t o = 0; o < rows; ++o) {
          const float e = expected[t * rows + o];
          REQUIRE(best[t * stride + o] == e);
          REQUIRE(threaded[t * stride + o] == e);
          REQUIRE(scalar[t * stride + o] == e);
          REQUIRE(acc[t * stride + o] == 0.25f + e);
        }
        REQUIRE(best[t * stride + rows] == 7.0f);  // the row padding untouched
        REQUIRE(acc[t * stride + rows] == 0.25f);
      }
    }
  }
}

TEST_CASE("weights: identical weights give bit-identical products in f16 and Q8_0 storage, f32 within rounding") {
  // Values exactly representable in f16 and in Q8_0 (scale 1/64... via
  // integers times a power of two) decode identically from every storage,
  // and the f16 and Q8_0 products share one kernel and its summation order.
  std::mt19937 rng(3);
  std::uniform_int_distribution<int> q(-127, 127);
  const std::size_t rows = 37, cols = 96;
  weight_matrix f(weight_type::f32, rows, cols), h(weight_type::f16, rows, cols), b(weight_type::q8_0, rows, cols);
  for (std::size_t r = 0; r < rows; ++r) {
    std::vector<block_q8_0> blocks(cols / 32);
    std::vector<float> v(cols);
    for (std::size_t k = 0; k < cols; ++k) {
      blocks[k / 32].scale = f16{f32_to_f16_bits(0.0078125f)};
      blocks[k / 32].qs[k % 32] = static_cast<std::int8_t>(q(rng));
      v[k] = 0.0078125f * float(blocks[k / 32].qs[k % 32]);
    }
    f.set_row(r, v);
    h.set_row(r, v);
    b.set_row_q8_0(r, blocks.data());
  }
  const auto x = random_values(5 * cols, rng);
  std::vector<float> yf(5 * rows), yh(5 * rows), yb(5 * rows);
  serial_executor serial;
  linear(serial, x, 5, f, yf, rows);
  linear(serial, x, 5, h, yh, rows);
  linear(serial, x, 5, b, yb, rows);
  REQUIRE(yh == yb);  // one kernel, one summation order
  // f32 panels sum the same products in another order (outer product).
  for (std::size_t i = 0; i < yf.size(); ++i) REQUIRE(std::abs(yf[i] - yh[i]) <= 1e-5f * std::max(1.0f, std::abs(yh[i])));
}

TEST_CASE("weights: bad shapes raise llmkit::error naming the argument") {
  REQUIRE_THROWS_WITH(weight_matrix(weight_type::q8_0, 2, 48), "weight_matrix: q8_0 needs cols (48) to be a multiple of 32");
  REQUIRE_THROWS_WITH(weight_matrix(weight_type::q4_k, 2, 96), "weight_matrix: q4_k needs cols (96) to be a multiple of 256");
  REQUIRE_THROWS_WITH(weight_matrix(weight_type::native, 2, 32), "weight_matrix: type must be a storage type, not native");
  REQUIRE(weight_type_from_name("q6_k") == weight_type::q6_k);
  REQUIRE(weight_type_from_name("iq4_xs") == weight_type::iq4_xs);
  REQUIRE_THROWS_WITH(weight_type_from_name("iq3_s"), "weight type 'iq3_s' is not one of native, f32, f16, q8_0, q4_0, "
                                                      "q4_1, q5_0, q5_1, q4_k, q5_k, q6_k, q2_k, q3_k, iq4_nl, iq4_xs, mxfp4");
  REQUIRE(resolve_weight_type(weight_type::native, ggml_type::q4_k, 512) == weight_type::q4_k);
  REQUIRE(resolve_weight_type(weight_type::q4_k, ggml_type::f32, 96) == weight_type::f32);
  REQUIRE(weight_matrix(weight_type::q6_k, 3, 512).bytes() == 3 * 2 * 210);
  weight_matrix w(weight_type::f32, 4, 8);
  std::vector<float> x(16), y(8);
  serial_executor serial;
  REQUIRE_THROWS_WITH(linear(serial, x, 3, w, y, 4), "linear: x.size() = 16 must be n * cols = 3 * 8");
  REQUIRE_THROWS_WITH(linear(serial, x, 2, w, y, 3), "linear: y_stride = 3 is less than the 4 rows of w");
  REQUIRE_THROWS_WITH(linear(serial, x, 2, w, std::span<float>(y).first(7), 4),
                      "linear: y.size() = 7 is too small for 2 rows of stride 4");
  REQUIRE_THROWS_WITH(w.set_row(4, std::vector<float>(8)), "weight_matrix::set_row: row 4 of 4, 8 values for 8 columns");
  std::vector<float> nan_row(32, 0.0f);
  nan_row[3] = std::nanf("");
  weight_matrix q(weight_type::q8_0, 1, 32);
  REQUIRE_THROWS_AS(q.set_row(0, nan_row), llmkit::error);
  REQUIRE(resolve_weight_type(weight_type::native, ggml_type::bf16, 64) == weight_type::f32);
  REQUIRE(resolve_weight_type(weight_type::native, ggml_type::q8_0, 64) == weight_type::q8_0);
  REQUIRE(resolve_weight_type(weight_type::q8_0, ggml_type::f32, 172) == weight_type::f32);
  REQUIRE(resolve_weight_type(weight_type::f16, ggml_type::q8_0, 172) == weight_type::f16);
}

namespace {
llama_config small_config() {
  llama_config c;
  c.n_vocab = 96;
  c.dim = 64;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 16;
  c.ffn_dim = 96;
  c.context_length = 64;
  return c;
}

std::vector<float> logits_of(llama_model& m, const std::vector<std::int32_t>& tokens) {
  kv::contiguous_cache<float> cache(m.kv_shape(), {.max_sequences = 1, .max_tokens = 64});
  batch_builder b;
  b.add(*cache.add_sequence(), tokens, 0, last_logits::skip);
  for (std::size_t i = 0; i < tokens.size(); ++i) b.request_logits(static_cast<std::int32_t>(i));
  const auto l = m.forward(b.view(), cache);
  return {l.data(), l.data() + l.rows() * l.cols()};
}
}  // namespace

TEST_CASE("llama: weight_type keeps or converts the file's weights") {
  const std::vector<std::int32_t> tokens{1, 5, 9, 77, 3, 41, 2};
  synthetic_options o{.config = small_config(), .weight_type = ggml_type::q8_0, .seed = 5};
  const auto q8_image = synthetic_llama(o).bytes();
  o.weight_type = ggml_type::f16;
  const auto f16_image = synthetic_llama(o).bytes();
  o.weight_type = ggml_type::f32;
  const auto f32_image = synthetic_llama(o).bytes();
  const gguf_file q8_file(std::span<const std::byte>(q8_image.data(), q8_image.size()));
  const gguf_file f16_file(std::span<const std::byte>(f16_image.data(), f16_image.size()));
  const gguf_file f32_file(std::span<const std::byte>(f32_image.data(), f32_image.size()));

  // Quantised matrices times f32 activations: the exact products compared here.
  constexpr activation_type f32_act = activation_type::f32;
  llama_model q8_native(q8_file, {.activations = f32_act}), q8_as_f32(q8_file, {.weight_type = weight_type::f32});
  llama_model f16_native(f16_file), f16_as_f32(f16_file, {.weight_type = weight_type::f32});
  for (weight_type t : q8_native.weight_types()) REQUIRE(t == weight_type::q8_0);
  for (weight_type t : f16_native.weight_types()) REQUIRE(t == weight_type::f16);
  for (weight_type t : q8_as_f32.weight_types()) REQUIRE(t == weight_type::f32);
  // Same values; f32 sums in the outer-product order of its panels, f16 and
  // Q8_0 in the dot-product order: equal up to f32 rounding.
  auto close = [](const std::vector<float>& a, const std::vector<float>& b) {
    REQUIRE(a.size() == b.size());
    for (std::size_t i = 0; i < a.size(); ++i) REQUIRE(std::abs(a[i] - b[i]) <= 1e-4f * std::max(1.0f, std::abs(a[i])));
  };
  close(logits_of(q8_native, tokens), logits_of(q8_as_f32, tokens));
  close(logits_of(f16_native, tokens), logits_of(f16_as_f32, tokens));
  // Q8_0 -> f16 rounds (scale * q needs up to 18 significant bits, f16 has 11): close, not equal.
  llama_model q8_as_f16(q8_file, {.weight_type = weight_type::f16});
  const auto a = logits_of(q8_native, tokens), b = logits_of(q8_as_f16, tokens);
  for (std::size_t i = 0; i < a.size(); ++i) REQUIRE(std::abs(a[i] - b[i]) <= 2e-2f * std::max(1.0f, std::abs(a[i])));

  // f32 -> q8_0 at load quantises like the synthetic writer: same logits as the Q8_0 file.
  llama_model f32_as_q8(f32_file, {.weight_type = weight_type::q8_0, .activations = f32_act});
  for (weight_type t : f32_as_q8.weight_types()) REQUIRE(t == weight_type::q8_0);
  const auto c = logits_of(f32_as_q8, tokens);
  for (std::size_t i = 0; i < a.size(); ++i) REQUIRE(std::abs(a[i] - c[i]) <= 1e-5f * std::max(1.0f, std::abs(a[i])));

  // Bytes per step follow the storage: q8_0 ~ 1.125 / 4 of f32.
  llama_model f32_native(f32_file);
  const double ratio = double(f32_as_q8.weight_bytes_per_step()) / double(f32_native.weight_bytes_per_step());
  REQUIRE(ratio > 0.27);
  REQUIRE(ratio < 0.30);
}

TEST_CASE("llama: q8_0 on stories260K keeps the 172-wide ffn_down in f32 and tells the same story start") {
  for (const activation_type act : {activation_type::f32, activation_type::q8_0}) {
    INFO("activations " << (act == activation_type::q8_0 ? "q8_0" : "f32"));
    auto f = gguf_file::open(LLMKIT_DEFAULT_MODEL);
    llama_model ref(f), q8(f, {.weight_type = weight_type::q8_0, .activations = act});
    const auto types = q8.weight_types();
    REQUIRE(types[0] == weight_type::q8_0);
    REQUIRE(types[3] == weight_type::f32);  // ffn_down: 172 columns
    // Greedy from BOS: the int8 copy follows the f32 model for the first tokens.
    kv::contiguous_cache<float> c1(ref.kv_shape(), {.max_sequences = 1, .max_tokens = 64});
    kv::contiguous_cache<float> c2(ref.kv_shape(), {.max_sequences = 1, .max_tokens = 64});
    const auto s1 = *c1.add_sequence();
    const auto s2 = *c2.add_sequence();
    std::int32_t t1 = 1, t2 = 1;
    std::size_t same = 0;
    for (std::int32_t pos = 0; pos < 8; ++pos) {
      batch_builder b1, b2;
      b1.add(s1, {&t1, 1}, pos);
      b2.add(s2, {&t2, 1}, pos);
      const auto l1 = ref.forward(b1.view(), c1);
      const auto l2 = q8.forward(b2.view(), c2);
      auto argmax = [](matrix_view<const float> l) {
        std::size_t best = 0;
        for (std::size_t v = 1; v < l.cols(); ++v)
          if (l(0, v) > l(0, best)) best = v;
        return static_cast<std::int32_t>(best);
      };
      t1 = argmax(l1);
      t2 = argmax(l2);
      same += t1 == t2;
      t2 = t1;  // teacher-force the reference path
    }
    REQUIRE(same >= 6);
  }
}

namespace {
// This process's resident memory by kind (/proc/self/status, bytes): anonymous
// (heap copies) and file-backed (mapped pages).
struct resident {
  std::size_t anon = 0, file = 0;
};
resident resident_now() {
  std::ifstream in("/proc/self/status");
  resident r;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("RssAnon:", 0) == 0) r.anon = std::stoull(line.substr(8)) * 1024;
    if (line.rfind("RssFile:", 0) == 0) r.file = std::stoull(line.substr(8)) * 1024;
  }
  return r;
}

std::string temp_gguf(const std::string& stem, const synthetic_options& o) {
  const std::string path = (std::filesystem::temp_directory_path() / (stem + ".gguf")).string();
  write_synthetic_llama(path, o);
  return path;
}

// K-quant rows need 256 columns: dim and ffn_dim multiples of 256.
llama_config k_quant_config(std::size_t dim, std::size_t ffn, std::size_t vocab, std::size_t layers) {
  llama_config c = small_config();
  c.dim = dim;
  c.ffn_dim = ffn;
  c.n_vocab = vocab;
  c.n_layers = layers;
  c.n_heads = dim / 64;
  c.n_kv_heads = dim / 128;
  c.head_dim = 64;
  return c;
}
}  // namespace

TEST_CASE("llama: weights used in place read the mapped file, copy nothing and give the copies' logits") {
  const std::vector<std::int32_t> tokens{1, 5, 9, 77, 3, 41, 2};
  synthetic_options o{.config = k_quant_config(256, 512, 320, 2), .seed = 8};
  o.tensor_types = q4_k_m_types(o);
  const std::string path = temp_gguf("llmkit_test_in_place_q4_k_m", o);
  o.tensor_types = {};
  o.weight_type = ggml_type::f16;
  const std::string f16_path = temp_gguf("llmkit_test_in_place_f16", o);
  llama_model reference = llama_model::load(path);
  const std::vector<float> expected = logits_of(reference, tokens);

  for (const std::string& p : {path, f16_path}) {
    INFO(p);
    llama_model mapped = llama_model::load(p);  // the gguf_file is gone once load returns
    llama_model copied(gguf_file::open(p), {.weights_in_place = false});
    CHECK(copied.weight_bytes_in_place() == 0);
    // Every matrix keeps its file layout here; only the norms are copies.
    CHECK(mapped.weight_bytes_in_place() > mapped.weight_bytes_per_step() * 99 / 100);
    CHECK(mapped.weight_types() == copied.weight_types());
    // The same products over the same bytes: bit-identical logits (in place
    // the Q|K|V and gate|up parts run as separate products of the same rows).
    CHECK(logits_of(mapped, tokens) == logits_of(copied, tokens));
    llama_model exact(gguf_file::open(p), {.activations = activation_type::f32});
    llama_model exact_copy(gguf_file::open(p), {.activations = activation_type::f32, .weights_in_place = false});
    CHECK(logits_of(exact, tokens) == logits_of(exact_copy, tokens));
  }
  // A conversion at load is a copy: nothing stays in place.
  llama_model converted(gguf_file::open(path), {.weight_type = weight_type::q8_0});
  CHECK(converted.weight_bytes_in_place() == 0);
  // A file parsed from the caller's bytes (no mapping) is copied.
  std::ifstream in(path, std::ios::binary);
  const std::vector<char> raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  llama_model from_bytes(gguf_file(std::as_bytes(std::span<const char>(raw))));
  CHECK(from_bytes.weight_bytes_in_place() == 0);
  CHECK(logits_of(from_bytes, tokens) == expected);

  // An in-place matrix is read-only; a tensor whose layout is converted cannot be viewed.
  const auto file = gguf_file::open(path);
  weight_matrix m = weight_matrix::in_place(file.tensor("blk.0.attn_q.weight"), file.mapping_owner());
  CHECK(m.is_in_place());
  std::vector<float> row(m.cols());
  REQUIRE_THROWS_WITH(m.set_row(0, row), Contains("read-only"));
  REQUIRE_THROWS_WITH(m.copy_from(file.tensor("blk.0.attn_q.weight"), 0), Contains("read-only"));
  REQUIRE_THROWS_WITH(weight_matrix::in_place(file.tensor("output_norm.weight"), file.mapping_owner()),
                      Contains("'output_norm.weight' (F32") && Contains("not in the file's layout"));
  REQUIRE_THROWS_WITH(weight_matrix::in_place(file.tensor("blk.0.attn_q.weight"), nullptr),
                      Contains("needs the owner of its mapping"));

  // --mlock: either the pages are locked, or loading says why and how to allow it.
  try {
    llama_model locked = llama_model::load(path, {.lock_weights = true});
    CHECK(logits_of(locked, tokens) == expected);
  } catch (const llmkit::error& e) {
    CHECK_THAT(e.what(), Contains("cannot lock tensor") && Contains("ulimit -l"));
  }
  std::remove(path.c_str());
  std::remove(f16_path.c_str());
}

TEST_CASE("llama: a model used in place holds about the file in memory, a copied one drops the mapped pages") {
  synthetic_options o{.config = k_quant_config(768, 2048, 8192, 4), .seed = 9};
  o.tensor_types = q4_k_m_types(o);
  const std::string path = temp_gguf("llmkit_test_resident_q4_k_m", o);
  const auto file_bytes = static_cast<double>(std::filesystem::file_size(path));
  const std::vector<std::int32_t> tokens{1, 5, 9, 77, 3, 41, 2};
  for (const bool in_place : {true, false}) {
    INFO("weights_in_place " << in_place);
    const resident before = resident_now();
    llama_model m = llama_model::load(path, {.weights_in_place = in_place});
    (void)logits_of(m, tokens);  // every weight read once
    const resident after = resident_now();
    const double anon = double(after.anon) - double(before.anon), mapped = double(after.file) - double(before.file);
    INFO("file " << file_bytes / 1e6 << " MB; resident growth: anon " << anon / 1e6 << " MB, file-backed "
                 << mapped / 1e6 << " MB");
#if !defined(__SANITIZE_ADDRESS__)  // ASan's shadow and quarantine grow the anonymous memory
    // The workspace of a 7-token forward is a few MB; the rest is weights, held once.
    CHECK(anon + mapped <= 1.05 * file_bytes + 16e6);
    if (in_place)
      CHECK(anon <= 16e6);
    else
      CHECK(mapped <= 0.05 * file_bytes + 1e6);  // the copied tensors' pages were dropped
#endif
    CHECK((m.weight_bytes_in_place() > 0) == in_place);
  }
  std::remove(path.c_str());
}
