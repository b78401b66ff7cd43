// SPDX-License-Identifier: MIT
#pragma once

/// @file tests/reference/sampling_reference.hpp
/// Straightforward double-precision oracles of the sampling module: every
/// truncation sorts the whole vocabulary (logit descending, token ascending),
/// as the textbook definitions read. A row is a `std::vector<double>` of
/// logits; removed tokens are -inf.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <utility>
#include <vector>
#include "statistics.hpp"

namespace llmkit::sampling::reference {

inline constexpr double neg_inf = -std::numeric_limits<double>::infinity();
using row = std::vector<double>;

inline row from_float(const std::vector<float>& v) {
  row r(v.begin(), v.end());
  for (double& x : r)
    if (std::isnan(x)) x = neg_inf;
  return r;
}

/// softmax in double (0 for -inf).
inline std::vector<double> softmax(const row& logits) {
  const double m = *std::max_element(logits.begin(), logits.end());
  std::vector<double> p(logits.size());
  double z = 0;
  for (std::size_t i = 0; i < logits.size(); ++i) z += p[i] = std::exp(logits[i] - m);
  for (double& x : p) x /= z;
  return p;
}

/// Token ids sorted by (logit descending, token ascending).
inline std::vector<std::size_t> order_desc(const row& logits) {
  std::vector<std::size_t> idx(logits.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](std::size_t a, std::size_t b) { return logits[a] > logits[b]; });
  return idx;
}

inline row keep_only(const row& logits, const std::vector<std::size_t>& kept) {
  row out(logits.size(), neg_inf);
  for (std::size_t i : kept) out[i] = logits[i];
  return out;
}

inline row temperature(row logits, double t) {
  if (t == 1.0) return logits;
  if (t <= 0) {
    const auto idx = order_desc(logits);
    return keep_only(logits, {idx[0]});
  }
  for (double& x : logits) x /= t;
  return logits;
}

inline row top_k(const row& logits, std::int64_t k) {
  if (k <= 0 || static_cast<std::size_t>(k) >= logits.size()) return logits;
  const auto idx = order_desc(logits);
  return keep_only(logits, {idx.begin(), idx.begin() + k});
}

/// Keeps the shortest prefix of `order` whose summed `prob` reaches p.
inline row keep_mass_prefix(const row& logits, const std::vector<double>& prob, const std::vector<std::size_t>& order,
                            double p) {
  std::vector<std::size_t> kept;
  double cum = 0;
  for (std::size_t i : order) {
    kept.push_back(i);
    cum += prob[i];
    if (cum >= p) break;
  }
  return keep_only(logits, kept);
}

inline row top_p(const row& logits, double p) {
  if (p >= 1.0) return logits;
  return keep_mass_prefix(logits, softmax(logits), order_desc(logits), p);
}

inline row min_p(const row& logits, double min_p) {
  if (min_p <= 0) return logits;
  const auto prob = softmax(logits);
  const double pmax = *std::max_element(prob.begin(), prob.end());
  row out = logits;
  for (std::size_t i = 0; i < out.size(); ++i)
    if (prob[i] < min_p * pmax) out[i] = neg_inf;
  return out;
}

inline row typical(const row& logits, double p) {
  if (p >= 1.0) return logits;
  const auto prob = softmax(logits);
  double entropy = 0;
  for (double q : prob)
    if (q > 0) entropy -= q * std::log(q);
  std::vector<std::size_t> idx(logits.size());
  std::iota(idx.begin(), idx.end(), 0);
  auto score = [&](std::size_t i) {
    return prob[i] > 0 ? std::fabs(-std::log(prob[i]) - entropy) : std::numeric_limits<double>::infinity();
  };
  std::stable_sort(idx.begin(), idx.end(), [&](std::size_t a, std::size_t b) { return score(a) < score(b); });
  return keep_mass_prefix(logits, prob, idx, p);
}

inline row penalties(row logits, const std::vector<std::int32_t>& history, double repeat, double frequency,
                     double presence, std::int64_t last_n) {
  if (last_n == 0) return logits;
  const std::size_t window = last_n < 0 ? history.size() : std::min<std::size_t>(history.size(), last_n);
  std::map<std::int32_t, int> count;
  for (std::size_t i = history.size() - window; i < history.size(); ++i) ++count[history[i]];
  for (const auto& [t, n] : count) {
    double& x = logits[static_cast<std::size_t>(t)];
    x = x > 0 ? x / repeat : x * repeat;
    x -= n * frequency + presence;
  }
  return logits;
}

inline row logit_bias(row logits, const std::vector<std::pair<std::int32_t, double>>& biases) {
  for (const auto& [t, b] : biases) logits[static_cast<std::size_t>(t)] += b;
  return logits;
}

inline row no_repeat_ngram(row logits, const std::vector<std::int32_t>& h, std::size_t n) {
  if (n == 0 || h.size() < n) return logits;
  for (std::size_t j = 0; j + n <= h.size(); ++j) {
    bool match = true;
    for (std::size_t q = 0; q + 1 < n; ++q) match = match && h[j + q] == h[h.size() - (n - 1) + q];
    if (match) logits[static_cast<std::size_t>(h[j + n - 1])] = neg_inf;
  }
  return logits;
}

inline row banned_sequences(row logits, const std::vector<std::int32_t>& h,
                            const std::vector<std::vector<std::int32_t>>& sequences) {
  for (const auto& s : sequences) {
    const std::size_t prefix = s.size() - 1;
    if (prefix > h.size()) continue;
    if (std::equal(s.begin(), s.end() - 1, h.end() - static_cast<std::ptrdiff_t>(prefix)))
      logits[static_cast<std::size_t>(s.back())] = neg_inf;
  }
  return logits;
}

inline row min_length(row logits, std::size_t n_generated, std::size_t min_new, const std::vector<std::int32_t>& eos) {
  if (n_generated < min_new)
    for (std::int32_t t : eos) logits[static_cast<std::size_t>(t)] = neg_inf;
  return logits;
}

/// The set of tokens with a finite logit.
inline std::set<std::size_t> support(const row& logits) {
  std::set<std::size_t> s;
  for (std::size_t i = 0; i < logits.size(); ++i)
    if (logits[i] != neg_inf) s.insert(i);
  return s;
}

/// Arg-max, lowest index on ties.
inline std::size_t argmax(const row& logits) { return order_desc(logits)[0]; }

using llmkit::test::chi_square_p_value;
using llmkit::test::gamma_q;

}  // namespace llmkit::sampling::reference

/// Random logits rows for the sampling tests (fixed seeds).
namespace llmkit::sampling::test_data {

/// Kinds of rows: Gaussian (scale 3), few distinct values (many ties), with
/// -inf entries, with NaN entries, flat uniform in [-1, 1].
enum class kind { gaussian, ties, with_neg_inf, with_nan, uniform };
inline constexpr kind all_kinds[] = {kind::gaussian, kind::ties, kind::with_neg_inf, kind::with_nan, kind::uniform};

inline std::vector<float> logits(std::size_t n, kind k, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::uniform_real_distribution<float> flat(-1.0f, 1.0f);
  std::uniform_real_distribution<float> coin(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) {
    switch (k) {
      case kind::gaussian: x = normal(rng); break;
      case kind::ties: x = std::round(normal(rng) * 0.5f) * 0.5f + 0.0f; break;
      case kind::with_neg_inf: x = coin(rng) < 0.3f ? -std::numeric_limits<float>::infinity() : normal(rng); break;
      case kind::with_nan: x = coin(rng) < 0.1f ? std::numeric_limits<float>::quiet_NaN() : normal(rng); break;
      case kind::uniform: x = flat(rng); break;
    }
    if (x == 0.0f) x = 0.0f;  // no negative zero
  }
  // Keep at least one finite entry.
  if (n > 0 && !(std::isfinite(v[0]))) v[0] = 1.0f;
  return v;
}

}  // namespace llmkit::sampling::test_data
