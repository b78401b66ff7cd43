// SPDX-License-Identifier: MIT
#pragma once

/// @file tests/reference/statistics.hpp
/// The goodness-of-fit test the statistical sampler checks share: Pearson's
/// chi-square and its survival function, in double precision.

#include <cmath>
#include <cstddef>
#include <vector>

namespace llmkit::test {

/// Regularised upper incomplete gamma Q(a, x) (Numerical Recipes' gammq:
/// the series for P below a + 1, the continued fraction for Q above).
inline double gamma_q(double a, double x) {
  if (x <= 0) return 1.0;
  const double gln = std::lgamma(a);
  if (x < a + 1) {
    double ap = a, sum = 1.0 / a, del = sum;
    for (int n = 0; n < 10000; ++n) {
      ap += 1;
      del *= x / ap;
      sum += del;
      if (std::fabs(del) < std::fabs(sum) * 1e-15) break;
    }
    return 1.0 - sum * std::exp(-x + a * std::log(x) - gln);
  }
  // Modified Lentz.
  double b = x + 1 - a, c = 1.0 / 1e-300, d = 1.0 / b, h = d;
  for (int i = 1; i < 10000; ++i) {
    const double an = -i * (i - a);
    b += 2;
    d = an * d + b;
    if (std::fabs(d) < 1e-300) d = 1e-300;
    c = b + an / c;
    if (std::fabs(c) < 1e-300) c = 1e-300;
    d = 1.0 / d;
    const double del = d * c;
    h *= del;
    if (std::fabs(del - 1.0) < 1e-15) break;
  }
  return std::exp(-x + a * std::log(x) - gln) * h;
}

/// Pearson chi-square p-value P(X^2 >= observed) of `[n] counts` from `total`
/// draws against `[n] prob` (summing to 1). Cells with expected count < 5 are
/// pooled into one; a draw in a cell of probability 0 gives 0.
inline double chi_square_p_value(const std::vector<std::size_t>& counts, const std::vector<double>& prob,
                                 std::size_t total) {
  double x2 = 0, pooled_e = 0, pooled_o = 0;
  std::size_t cells = 0;
  for (std::size_t i = 0; i < counts.size(); ++i) {
    const double e = prob[i] * static_cast<double>(total), o = static_cast<double>(counts[i]);
    if (prob[i] <= 0) {
      if (counts[i] > 0) return 0.0;
      continue;
    }
    if (e < 5) {
      pooled_e += e;
      pooled_o += o;
      continue;
    }
    x2 += (o - e) * (o - e) / e;
    ++cells;
  }
  if (pooled_e > 0) {
    x2 += (pooled_o - pooled_e) * (pooled_o - pooled_e) / pooled_e;
    ++cells;
  }
  if (cells < 2) return 1.0;
  return gamma_q(0.5 * static_cast<double>(cells - 1), 0.5 * x2);
}

/// The same, with `total` the sum of `counts`.
inline double chi_square_p_value(const std::vector<std::size_t>& counts, const std::vector<double>& prob) {
  std::size_t total = 0;
  for (const std::size_t c : counts) total += c;
  return chi_square_p_value(counts, prob, total);
}

}  // namespace llmkit::test
