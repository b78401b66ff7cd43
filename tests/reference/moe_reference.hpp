// SPDX-License-Identifier: MIT
#pragma once

/// @file tests/reference/moe_reference.hpp
/// Mixture-of-experts routing in double precision, written for clarity: sort
/// every expert by (score descending, id ascending), take the first k.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <vector>

namespace llmkit::reference {

struct routed {
  std::vector<std::int32_t> ids;  // best first
  std::vector<double> weights;
};

/// The k best of `select` (ties to the lower id), best first.
inline std::vector<std::int32_t> best_k(const std::vector<double>& select, std::size_t k) {
  std::vector<std::int32_t> order(select.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](std::int32_t a, std::int32_t b) { return select[a] > select[b]; });
  order.resize(k);
  return order;
}

/// kind: 0 softmax then top-k (renormalised when `renorm`), 1 top-k then
/// softmax, 2 sigmoid with `bias` for selection (renormalised when `renorm`).
inline routed route_reference(const std::vector<float>& logits, std::size_t k, int kind, bool renorm, double scale,
                              const std::vector<float>& bias = {}) {
  const std::size_t n = logits.size();
  std::vector<double> p(n), select(n);
  if (kind == 0) {
    double m = logits[0], sum = 0;
    for (float x : logits) m = std::max<double>(m, x);
    for (std::size_t i = 0; i < n; ++i) sum += p[i] = std::exp(double(logits[i]) - m);
    for (double& v : p) v /= sum;
    select = p;
  } else if (kind == 1) {
    for (std::size_t i = 0; i < n; ++i) select[i] = logits[i];
  } else {
    for (std::size_t i = 0; i < n; ++i) {
      p[i] = 1 / (1 + std::exp(-double(logits[i])));
      select[i] = p[i] + (bias.empty() ? 0.0 : double(bias[i]));
    }
  }
  routed r;
  r.ids = best_k(select, k);
  if (kind == 1) {
    double m = -1e300, sum = 0;
    for (auto e : r.ids) m = std::max<double>(m, logits[e]);
    for (auto e : r.ids) sum += std::exp(double(logits[e]) - m);
    for (auto e : r.ids) r.weights.push_back(std::exp(double(logits[e]) - m) / sum);
    return r;
  }
  double sum = 0;
  for (auto e : r.ids) sum += p[e];
  for (auto e : r.ids) r.weights.push_back(p[e] * (renorm ? 1 / sum : 1.0) * scale);
  return r;
}

}  // namespace llmkit::reference

namespace llmkit::reference {

/// One expert's projections, decoded to double: gate and up `[ffn, dim]`,
/// down `[dim, ffn]`, row-major.
struct expert_weights {
  std::vector<double> gate, up, down;
};

/// What a routed feed-forward adds to SwiGLU: gpt-oss's clamped activation
/// (min(g, 7) sigmoid(1.702 min(g, 7)) (clamp(u, -7, 7) + 1)) and
/// per-expert biases, `[n_expert * ffn]` gate and up, `[n_expert * dim]`
/// down (empty: none).
struct routed_ffn_extras {
  bool clamped_swiglu = false;
  std::vector<float> gate_bias, up_bias, down_bias;
};

/// The routed gated feed-forward in double:
/// out[t] = sum_j w[t, j] * (down_e act(gate_e x[t] + bg_e, up_e x[t] + bu_e) + bd_e), e = ids[t, j],
/// act(g, u) = silu(g) * u unless `extras` says otherwise.
/// `[n, dim] x`, `[n, k] ids` and `w`; mag[t, d] gets the same sum over the
/// absolute values of every term (for error bounds).
inline std::vector<double> routed_ffn_reference(const std::vector<float>& x, std::size_t n, std::size_t dim,
                                                const std::vector<std::int32_t>& ids, const std::vector<float>& w,
                                                std::size_t k, const std::vector<expert_weights>& experts,
                                                std::size_t ffn, std::vector<double>& mag,
                                                const routed_ffn_extras& extras = {}) {
  std::vector<double> out(n * dim, 0.0), h(ffn), hm(ffn);
  mag.assign(n * dim, 0.0);
  for (std::size_t t = 0; t < n; ++t)
    for (std::size_t j = 0; j < k; ++j) {
      const std::size_t id = std::size_t(ids[t * k + j]);
      const expert_weights& e = experts[id];
      for (std::size_t r = 0; r < ffn; ++r) {
        double g = 0, u = 0, gm = 0, um = 0;
        for (std::size_t c = 0; c < dim; ++c) {
          g += e.gate[r * dim + c] * x[t * dim + c];
          u += e.up[r * dim + c] * x[t * dim + c];
          gm += std::abs(e.gate[r * dim + c] * x[t * dim + c]);
          um += std::abs(e.up[r * dim + c] * x[t * dim + c]);
        }
        if (!extras.gate_bias.empty()) g += extras.gate_bias[id * ffn + r];
        if (!extras.up_bias.empty()) u += extras.up_bias[id * ffn + r];
        if (extras.clamped_swiglu) {
          g = std::min(g, 7.0);
          u = std::clamp(u, -7.0, 7.0) + 1;
        }
        const double alpha = extras.clamped_swiglu ? 1.702 : 1.0;
        const double silu = g / (1 + std::exp(-alpha * g));
        h[r] = silu * u;
        hm[r] = (std::abs(silu) + gm) * (um + 1) + std::abs(silu * u);  // bounds how far rounding moves h[r]
      }
      for (std::size_t d = 0; d < dim; ++d) {
        double y = extras.down_bias.empty() ? 0.0 : double(extras.down_bias[id * dim + d]), ym = std::abs(y);
        for (std::size_t r = 0; r < ffn; ++r) {
          y += e.down[d * ffn + r] * h[r];
          ym += std::abs(e.down[d * ffn + r]) * hm[r];
        }
        out[t * dim + d] += double(w[t * k + j]) * y;
        mag[t * dim + d] += std::abs(double(w[t * k + j])) * ym;
      }
    }
  return out;
}

}  // namespace llmkit::reference
