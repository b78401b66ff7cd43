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
