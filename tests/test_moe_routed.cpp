// SPDX-License-Identifier: MIT
// llmkit/moe: the routed SwiGLU feed-forward against the double-precision
// reference in every weight format, against the dense products it is made
// of, under skewed routings and thread counts, a token alone vs in a batch,
// experts used in place, and bad input.
#include <llmkit/moe/routed_ffn.hpp>

#include "reference/moe_reference.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

using namespace llmkit;
using model::activation_type;
using model::weight_type;
using Catch::Matchers::Contains;

namespace {

// A layer's three expert tensors, random.
struct layer {
  moe::expert_tensor gate, up, down;
};

void fill(moe::expert_tensor& t, std::mt19937& rng, float sigma) {
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<float> row(t.cols());
  for (std::size_t e = 0; e < t.n_expert(); ++e)
    for (std::size_t r = 0; r < t.rows(); ++r) {
      for (float& v : row) v = d(rng);
      t.expert(e).set_row(r, row);
    }
}

layer random_layer(weight_type type, std::size_t n_expert, std::size_t dim, std::size_t ffn, std::mt19937& rng) {
  layer l{moe::expert_tensor(type, n_expert, ffn, dim), moe::expert_tensor(type, n_expert, ffn, dim),
          moe::expert_tensor(type, n_expert, dim, ffn)};
  fill(l.gate, rng, 1.0f / std::sqrt(float(dim)));
  fill(l.up, rng, 1.0f / std::sqrt(float(dim)));
  fill(l.down, rng, 1.0f / std::sqrt(float(ffn)));
  return l;
}

std::vector<double> decode(const model::weight_matrix& m) {
  std::vector<double> out(m.rows() * m.cols());
  std::vector<float> row(m.cols());
  for (std::size_t r = 0; r < m.rows(); ++r) {
    m.row(r, row);
    std::copy(row.begin(), row.end(), out.begin() + std::ptrdiff_t(r * m.cols()));
  }
  return out;
}

std::vector<reference::expert_weights> decode(const layer& l) {
  std::vector<reference::expert_weights> out;
  for (std::size_t e = 0; e < l.gate.n_expert(); ++e)
    out.push_back({decode(l.gate.expert(e)), decode(l.up.expert(e)), decode(l.down.expert(e))});
  return out;
}

// A routing: k distinct experts per token, random weights summing to 1.
struct routing {
  std::vector<moe::expert_id> ids;
  std::vector<float> weights;
};

routing random_routing(std::size_t n, std::size_t k, std::size_t n_expert, std::mt19937& rng) {
  routing r;
  std::vector<moe::expert_id> all(n_expert);
  std::uniform_real_distribution<float> u(0.1f, 1.0f);
  for (std::size_t t = 0; t < n; ++t) {
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng);
    float sum = 0.0f;
    std::vector<float> w(k);
    for (float& v : w) sum += v = u(rng);
    for (std::size_t j = 0; j < k; ++j) {
      r.ids.push_back(all[j]);
      r.weights.push_back(w[j] / sum);
    }
  }
  return r;
}

std::vector<float> random_x(std::size_t n, std::size_t dim, std::mt19937& rng) {
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> x(n * dim);
  for (float& v : x) v = d(rng);
  return x;
}

template <class Exec>
std::vector<float> run(Exec& exec, const layer& l, const std::vector<float>& x, std::size_t n, const routing& r,
                       std::size_t k, activation_type act, moe::routed_ffn_workspace& ws,
                       std::vector<float> out = {}) {
  const std::size_t dim = l.gate.cols();
  const bool accumulate = !out.empty();
  if (!accumulate) out.assign(n * dim, -7.0f);  // overwritten
  moe::routed_ffn(exec,
                  {.x = matrix_view<const float>(x.data(), n, dim),
                   .ids = matrix_view<const moe::expert_id>(r.ids.data(), n, k),
                   .weights = matrix_view<const float>(r.weights.data(), n, k),
                   .gate = l.gate,
                   .up = l.up,
                   .down = l.down,
                   .out = matrix_view<float>(out.data(), n, dim),
                   .mode = accumulate ? model::output_mode::accumulate : model::output_mode::overwrite,
                   .activations = act},
                  ws);
  return out;
}

// The same feed-forward composed of dense model::linear products, one token
// and one expert at a time, contributions added in slot order.
std::vector<float> composed(const layer& l, const std::vector<float>& x, std::size_t n, const routing& r,
                            std::size_t k, activation_type act) {
  const std::size_t dim = l.gate.cols(), f = l.gate.rows();
  std::vector<float> out(n * dim, 0.0f), g(f), u(f), h(f), y(dim);
  serial_executor serial;
  for (std::size_t t = 0; t < n; ++t)
    for (std::size_t j = 0; j < k; ++j) {
      const std::size_t e = std::size_t(r.ids[t * k + j]);
      const std::span<const float> xt(x.data() + t * dim, dim);
      model::linear(serial, xt, 1, l.gate.expert(e), g, f, model::output_mode::overwrite, act);
      model::linear(serial, xt, 1, l.up.expert(e), u, f, model::output_mode::overwrite, act);
      model::detail::swiglu(g.data(), u.data(), h.data(), f);
      model::linear(serial, h, 1, l.down.expert(e), y, dim, model::output_mode::overwrite, act);
      for (std::size_t d = 0; d < dim; ++d) out[t * dim + d] += r.weights[t * k + j] * y[d];
    }
  return out;
}

// Shapes whose widths are whole blocks of the format (256 for the K-quants and IQ4_XS).
std::size_t block_of(weight_type t) { return model::weight_block_size(t); }

}  // namespace

TEST_CASE("moe routed_ffn: every weight format matches the double-precision reference and its dense products") {
  std::mt19937 rng(48);
  thread_pool pool(3);
  for (const weight_type type : model::all_weight_types) {
    if (type == weight_type::native) continue;
    const std::size_t b = std::max<std::size_t>(32, block_of(type));
    for (int shape = 0; shape < 3; ++shape) {
      const std::size_t n_expert = std::size_t(std::uniform_int_distribution<int>(1, 9)(rng));
      const std::size_t k = std::size_t(std::uniform_int_distribution<int>(1, int(n_expert))(rng));
      const std::size_t dim = b * std::size_t(1 + shape % 2), ffn = b * std::size_t(1 + (shape + 1) % 3);
      const std::size_t n = shape == 0 ? 1 : shape == 1 ? 7 : 41;  // decode, streaming batch, prefill
      const layer l = random_layer(type, n_expert, dim, ffn, rng);
      const auto experts = decode(l);
      const routing r = random_routing(n, k, n_expert, rng);
      const auto x = random_x(n, dim, rng);
      std::vector<double> mag;
      const auto want = reference::routed_ffn_reference(x, n, dim, r.ids, r.weights, k, experts, ffn, mag);
      for (const activation_type act : {activation_type::f32, activation_type::q8_0}) {
        INFO(model::weight_type_name(type) << " experts " << n_expert << " k " << k << " dim " << dim << " ffn "
                                           << ffn << " tokens " << n << " int8 " << (act == activation_type::q8_0));
        moe::routed_ffn_workspace ws;
        const auto got = run(pool, l, x, n, r, k, act, ws);
        const auto dense = composed(l, x, n, r, k, act);
        // f32: rounding of f32 sums; int8: the activations' rounding (1/254 of a block's largest value) twice.
        const bool int8 = act == activation_type::q8_0 && type != weight_type::f32 && type != weight_type::f16;
        const double rel = int8 ? 3e-2 : 2e-5;
        for (std::size_t i = 0; i < n * dim; ++i) {
          INFO("element " << i);
          REQUIRE(got[i] == dense[i]);  // the same kernels, bit for bit
          REQUIRE(std::abs(double(got[i]) - want[i]) <= rel * mag[i] + 1e-6);
        }
      }
    }
  }
}

TEST_CASE("moe routed_ffn: skewed routings, k = 1 and k = n_expert, any thread count, give the same bits") {
  std::mt19937 rng(7);
  thread_pool two(2), four(4);
  serial_executor serial;
  const std::size_t n_expert = 6, dim = 256, ffn = 512;
  for (const weight_type type : {weight_type::q4_k, weight_type::q8_0, weight_type::f32}) {
    const layer l = random_layer(type, n_expert, dim, ffn, rng);
    for (std::size_t n : {1u, 3u, 40u}) {
      for (int kind = 0; kind < 3; ++kind) {
        const std::size_t k = kind == 2 ? n_expert : 1;
        routing r = random_routing(n, k, n_expert, rng);
        if (kind == 1) std::fill(r.ids.begin(), r.ids.end(), 4);  // every token to expert 4
        const auto x = random_x(n, dim, rng);
        for (const activation_type act : {activation_type::f32, activation_type::q8_0}) {
          INFO(model::weight_type_name(type) << " tokens " << n << " kind " << kind);
          moe::routed_ffn_workspace ws;
          const auto a = run(serial, l, x, n, r, k, act, ws);
          const auto b2 = run(two, l, x, n, r, k, act, ws);
          const auto b4 = run(four, l, x, n, r, k, act, ws);
          REQUIRE(a == b2);
          REQUIRE(a == b4);
          REQUIRE(a == composed(l, x, n, r, k, act));
        }
      }
    }
  }
}

TEST_CASE("moe routed_ffn: a token alone and in a batch give the same bits, accumulate adds, out may be x") {
  std::mt19937 rng(11);
  thread_pool pool(2);
  const std::size_t n_expert = 8, k = 3, dim = 256, ffn = 256, n = 37;
  for (const weight_type type : {weight_type::q6_k, weight_type::q4_0, weight_type::f16}) {
    const layer l = random_layer(type, n_expert, dim, ffn, rng);
    const routing r = random_routing(n, k, n_expert, rng);
    const auto x = random_x(n, dim, rng);
    for (const activation_type act : {activation_type::f32, activation_type::q8_0}) {
      moe::routed_ffn_workspace ws;
      const auto batch = run(pool, l, x, n, r, k, act, ws);
      for (std::size_t t = 0; t < n; ++t) {
        const std::vector<float> xt(x.begin() + std::ptrdiff_t(t * dim), x.begin() + std::ptrdiff_t((t + 1) * dim));
        const routing rt{{r.ids.begin() + std::ptrdiff_t(t * k), r.ids.begin() + std::ptrdiff_t((t + 1) * k)},
                         {r.weights.begin() + std::ptrdiff_t(t * k), r.weights.begin() + std::ptrdiff_t((t + 1) * k)}};
        const auto alone = run(pool, l, xt, 1, rt, k, act, ws);
        INFO(model::weight_type_name(type) << " token " << t);
        REQUIRE(std::equal(alone.begin(), alone.end(), batch.begin() + std::ptrdiff_t(t * dim)));
      }
      const std::vector<float> base(n * dim, 0.5f);
      const auto acc = run(pool, l, x, n, r, k, act, ws, base);
      for (std::size_t i = 0; i < n * dim; ++i) REQUIRE(acc[i] == Approx(0.5f + batch[i]).margin(1e-6));
      // In place: out is x.
      std::vector<float> io = x;
      moe::routed_ffn(pool,
                      {.x = matrix_view<const float>(io.data(), n, dim),
                       .ids = matrix_view<const moe::expert_id>(r.ids.data(), n, k),
                       .weights = matrix_view<const float>(r.weights.data(), n, k),
                       .gate = l.gate,
                       .up = l.up,
                       .down = l.down,
                       .out = matrix_view<float>(io.data(), n, dim),
                       .activations = act},
                      ws);
      REQUIRE(io == batch);
    }
  }
}

TEST_CASE("moe expert_tensor: experts used in place from a 3-D GGUF tensor equal copied ones") {
  std::mt19937 rng(3);
  const std::size_t n_expert = 4, rows = 8, cols = 256;
  // The file's bytes: the experts' Q4_K rows one after another.
  auto file = std::make_shared<model::weight_matrix>(weight_type::q4_k, n_expert * rows, cols);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> row(cols);
  for (std::size_t r = 0; r < n_expert * rows; ++r) {
    for (float& v : row) v = d(rng);
    file->set_row(r, row);
  }
  model::gguf_tensor t{.name = "blk.0.ffn_up_exps.weight",
                       .type = model::ggml_type::q4_k,
                       .n_dims = 3,
                       .dims = {cols, rows, n_expert, 1},
                       .n_elements = cols * rows * n_expert,
                       .n_bytes = file->bytes(),
                       .data = file->block_data()};
  std::vector<model::weight_matrix> views;
  moe::expert_tensor copied(weight_type::q4_k, n_expert, rows, cols);
  for (std::size_t e = 0; e < n_expert; ++e) {
    views.push_back(model::weight_matrix::in_place(moe::expert_slice(t, e), file));
    copied.expert(e).copy_from(moe::expert_slice(t, e), 0);
  }
  const moe::expert_tensor mapped(std::move(views));
  REQUIRE(mapped.n_expert() == n_expert);
  REQUIRE(mapped.rows() == rows);
  REQUIRE(mapped.cols() == cols);
  REQUIRE(mapped.expert(2).is_in_place());
  REQUIRE(mapped.bytes() == file->bytes());
  std::vector<float> a(cols), b(cols), want(cols);
  for (std::size_t e = 0; e < n_expert; ++e)
    for (std::size_t r = 0; r < rows; ++r) {
      mapped.expert(e).row(r, a);
      copied.expert(e).row(r, b);
      file->row(e * rows + r, want);
      REQUIRE(a == want);
      REQUIRE(b == want);
    }
  REQUIRE_THROWS_WITH(moe::expert_slice(t, 4), Contains("expert 4 of tensor 'blk.0.ffn_up_exps.weight' with 4"));
  t.n_dims = 2;
  REQUIRE_THROWS_WITH(moe::expert_slice(t, 0), Contains("has 2 dims"));
}

TEST_CASE("moe routed_ffn: refuses k above the expert count, wrong shapes and unknown experts") {
  std::mt19937 rng(5);
  serial_executor serial;
  const layer l = random_layer(weight_type::q8_0, 4, 64, 96, rng);
  const auto x = random_x(2, 64, rng);
  moe::routed_ffn_workspace ws;
  routing r = random_routing(2, 4, 4, rng);
  std::vector<moe::expert_id> ids5(10, 0);
  std::vector<float> w5(10, 0.2f), out(2 * 64);
  auto params = [&](const layer& w, matrix_view<const moe::expert_id> ids, matrix_view<const float> weights,
                    std::size_t out_cols) {
    return moe::routed_ffn_params{.x = matrix_view<const float>(x.data(), 2, 64),
                                  .ids = ids,
                                  .weights = weights,
                                  .gate = w.gate,
                                  .up = w.up,
                                  .down = w.down,
                                  .out = matrix_view<float>(out.data(), 2, out_cols)};
  };
  const matrix_view<const moe::expert_id> ids(r.ids.data(), 2, 4);
  const matrix_view<const float> weights(r.weights.data(), 2, 4);
  REQUIRE_NOTHROW(moe::routed_ffn(serial, params(l, ids, weights, 64), ws));
  REQUIRE_THROWS_WITH(moe::routed_ffn(serial, params(l, matrix_view<const moe::expert_id>(ids5.data(), 2, 5),
                                                     matrix_view<const float>(w5.data(), 2, 5), 64), ws),
                      Contains("k = 5 experts per token, the layer has 4"));
  REQUIRE_THROWS_WITH(moe::routed_ffn(serial, params(l, ids, matrix_view<const float>(w5.data(), 2, 3), 64), ws),
                      Contains("weights [2, 3] for 2 tokens"));
  REQUIRE_THROWS_WITH(moe::routed_ffn(serial, params(l, ids, weights, 32), ws), Contains("out is [2, 32]"));
  r.ids[5] = 4;
  REQUIRE_THROWS_WITH(moe::routed_ffn(serial, params(l, ids, weights, 64), ws),
                      Contains("ids[1, 1] = 4 is not an expert of the 4"));
  r.ids[5] = -1;
  REQUIRE_THROWS_WITH(moe::routed_ffn(serial, params(l, ids, weights, 64), ws), Contains("ids[1, 1] = -1"));
  r.ids[5] = 1;
  layer wrong = random_layer(weight_type::q8_0, 4, 64, 96, rng);
  wrong.down = moe::expert_tensor(weight_type::q8_0, 4, 64, 64);
  REQUIRE_THROWS_WITH(moe::routed_ffn(serial, params(wrong, ids, weights, 64), ws),
                      Contains("down is [4, 64, 64], must be [4, 64, 96]"));
  wrong = random_layer(weight_type::q8_0, 3, 64, 96, rng);
  wrong.gate = l.gate;
  REQUIRE_THROWS_WITH(moe::routed_ffn(serial, params(wrong, ids, weights, 64), ws), Contains("up is [3, 96, 64]"));
  std::vector<model::weight_matrix> mixed;
  mixed.emplace_back(weight_type::q8_0, 4, 64);
  mixed.emplace_back(weight_type::q4_0, 4, 64);
  REQUIRE_THROWS_WITH(moe::expert_tensor(std::move(mixed)), Contains("expert 1 is q4_0 [4, 64], expert 0 is q8_0"));
  REQUIRE_THROWS_WITH(moe::expert_tensor(weight_type::q8_0, 0, 4, 64), Contains("n_expert = 0"));
}

TEST_CASE("moe routed_ffn: gpt-oss's clamped SwiGLU and per-expert biases match the reference, alone and in a batch") {
  std::mt19937 rng(120);
  thread_pool pool(2);
  const std::size_t n_expert = 5, k = 2, dim = 256, ffn = 256, n = 19;
  for (const weight_type type : {weight_type::mxfp4, weight_type::q8_0, weight_type::f32}) {
    const layer l = random_layer(type, n_expert, dim, ffn, rng);
    const routing r = random_routing(n, k, n_expert, rng);
    auto x = random_x(n, dim, rng);
    for (float& v : x) v *= 6.0f;  // gate and up values beyond the clamp at 7
    reference::routed_ffn_extras extras{.clamped_swiglu = true};
    std::normal_distribution<float> d(0.0f, 2.0f);
    for (auto* b : {&extras.gate_bias, &extras.up_bias}) {
      b->resize(n_expert * ffn);
      for (float& v : *b) v = d(rng);
    }
    extras.down_bias.resize(n_expert * dim);
    for (float& v : extras.down_bias) v = d(rng);
    std::vector<double> mag;
    const auto want = reference::routed_ffn_reference(x, n, dim, r.ids, r.weights, k, decode(l), ffn, mag, extras);
    std::size_t clamped = 0;
    for (std::size_t t = 0; t < n; ++t)  // the clamp is exercised: some gate value of a chosen expert passes 7
      for (std::size_t j = 0; j < k; ++j) {
        std::vector<float> g(ffn);
        serial_executor serial;
        model::linear(serial, std::span<const float>(x.data() + t * dim, dim), 1,
                      l.gate.expert(std::size_t(r.ids[t * k + j])), g, ffn, model::output_mode::overwrite,
                      activation_type::f32);
        clamped += std::size_t(std::count_if(g.begin(), g.end(), [](float v) { return std::abs(v) > 7.5f; }));
      }
    REQUIRE(clamped > 0);
    for (const activation_type act : {activation_type::f32, activation_type::q8_0}) {
      INFO(model::weight_type_name(type) << " int8 " << (act == activation_type::q8_0));
      auto call = [&](const float* xs, std::size_t m, const moe::expert_id* ids, const float* w, float* out) {
        moe::routed_ffn_workspace ws;
        moe::routed_ffn(pool,
                        {.x = matrix_view<const float>(xs, m, dim),
                         .ids = matrix_view<const moe::expert_id>(ids, m, k),
                         .weights = matrix_view<const float>(w, m, k),
                         .gate = l.gate,
                         .up = l.up,
                         .down = l.down,
                         .out = matrix_view<float>(out, m, dim),
                         .activations = act,
                         .activation = model::ffn_activation::swiglu_oai,
                         .gate_bias = matrix_view<const float>(extras.gate_bias.data(), n_expert, ffn),
                         .up_bias = matrix_view<const float>(extras.up_bias.data(), n_expert, ffn),
                         .down_bias = matrix_view<const float>(extras.down_bias.data(), n_expert, dim)},
                        ws);
      };
      std::vector<float> got(n * dim);
      call(x.data(), n, r.ids.data(), r.weights.data(), got.data());
      const bool int8 = act == activation_type::q8_0 && type != weight_type::f32;
      const double rel = int8 ? 3e-2 : 2e-5;
      for (std::size_t i = 0; i < n * dim; ++i) {
        INFO("element " << i);
        REQUIRE(std::abs(double(got[i]) - want[i]) <= rel * mag[i] + 1e-5);
      }
      for (std::size_t t = 0; t < n; t += 6) {  // alone: the same bits
        std::vector<float> alone(dim);
        call(x.data() + t * dim, 1, r.ids.data() + t * k, r.weights.data() + t * k, alone.data());
        REQUIRE(std::equal(alone.begin(), alone.end(), got.begin() + std::ptrdiff_t(t * dim)));
      }
    }
  }
  // Biases of the wrong shape are refused by name.
  const layer l = random_layer(weight_type::f32, 3, 32, 32, rng);
  const routing r = random_routing(1, 1, 3, rng);
  const auto x = random_x(1, 32, rng);
  std::vector<float> out(32), bias(2 * 32);
  moe::routed_ffn_workspace ws;
  REQUIRE_THROWS_WITH(moe::routed_ffn(pool,
                                      {.x = matrix_view<const float>(x.data(), 1, 32),
                                       .ids = matrix_view<const moe::expert_id>(r.ids.data(), 1, 1),
                                       .weights = matrix_view<const float>(r.weights.data(), 1, 1),
                                       .gate = l.gate,
                                       .up = l.up,
                                       .down = l.down,
                                       .out = matrix_view<float>(out.data(), 1, 32),
                                       .down_bias = matrix_view<const float>(bias.data(), 2, 32)},
                                      ws),
                      Contains("down_bias is [2, 32], must be [3, 32] or empty"));
}

TEST_CASE("moe: gpt-oss's clamped SwiGLU on every SIMD path equals the scalar formula") {
  std::mt19937 rng(121);
  std::uniform_real_distribution<float> d(-12.0f, 12.0f);
  const std::size_t f = 301;
  std::vector<float> g(f), u(f), h(f);
  for (std::size_t i = 0; i < f; ++i) g[i] = d(rng), u[i] = d(rng);
  g[0] = 7.0f, g[1] = 7.5f, u[0] = u[1] = 2.0f, u[2] = -9.0f, u[3] = 9.0f, g[4] = -30.0f;
  model::detail::swiglu_oai(g.data(), u.data(), h.data(), f);
  for (std::size_t i = 0; i < f; ++i) {
    const double x = std::min<double>(g[i], 7.0), y = std::clamp<double>(u[i], -7.0, 7.0);
    const double want = x / (1 + std::exp(-1.702 * x)) * (y + 1);
    INFO("g " << g[i] << " u " << u[i]);
    REQUIRE(std::abs(h[i] - want) <= 1e-5 * (std::abs(want) + 1));
  }
  REQUIRE(h[1] == h[0]);  // the gate is clamped at 7
}
