// SPDX-License-Identifier: MIT
#pragma once

// Fixtures and checks shared by the model tests (Catch2): a synthetic file's
// logits against the double-precision oracle, and prefill against decode.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <llmkit/core/executor.hpp>
#include <llmkit/kv/contiguous_cache.hpp>
#include <llmkit/model/batch.hpp>
#include <llmkit/model/llama.hpp>
#include <llmkit/model/synthetic.hpp>

#include "reference/model_reference.hpp"

namespace llmkit::test {

/// A GGUF image (synthetic_llama(...).bytes()) as gguf_file reads it.
inline std::span<const std::byte> as_span(const std::vector<std::byte>& image) { return {image.data(), image.size()}; }

/// Quantised matrices times f32 activations: the product the f32 oracle
/// computes (the default, int8 activations, rounds them).
inline const model::llama_options exact{.activations = model::activation_type::f32};

/// `[n_tokens][vocab]` logits of every position of `tokens`, as one prefill.
inline std::vector<std::vector<float>> all_logits(model::llama_model& m, const std::vector<std::int32_t>& tokens) {
  kv::contiguous_cache<float> cache(m.kv_shape(), {.max_sequences = 1, .max_tokens = 64});
  model::batch_builder b;
  b.add(*cache.add_sequence(), tokens, 0, model::last_logits::skip);
  for (std::size_t i = 0; i < tokens.size(); ++i) b.request_logits(static_cast<std::int32_t>(i));
  const auto logits = m.forward(b.view(), cache);
  std::vector<std::vector<float>> out;
  for (std::size_t t = 0; t < tokens.size(); ++t) out.emplace_back(logits.row(t).begin(), logits.row(t).end());
  return out;
}

/// Max |model - oracle| over all positions of `tokens`, relative to
/// max(1, |oracle|), with the oracle read from `f`.
inline double max_error(model::llama_model& m, const model::gguf_file& f, const std::vector<std::int32_t>& tokens) {
  const auto got = all_logits(m, tokens);
  const auto want = reference::llama_reference(f).logits(tokens);
  double worst = 0;
  for (std::size_t t = 0; t < tokens.size(); ++t)
    for (std::size_t v = 0; v < m.vocab_size(); ++v)
      worst = std::max(worst, std::abs(double(got[t][v]) - want[t][v]) / std::max(1.0, std::abs(want[t][v])));
  return worst;
}

/// The int8-activation logits `int8` stay within `fraction` of the largest
/// exact logit of `exact` (both `[n_tokens][vocab]`, all_logits).
inline void require_int8_close(const std::vector<std::vector<float>>& exact, const std::vector<std::vector<float>>& int8,
                               double fraction) {
  double worst = 0, scale = 0;
  for (std::size_t t = 0; t < exact.size(); ++t)
    for (std::size_t v = 0; v < exact[t].size(); ++v) {
      worst = std::max(worst, double(std::abs(int8[t][v] - exact[t][v])));
      scale = std::max(scale, double(std::abs(exact[t][v])));
    }
  INFO("largest logit " << scale << ", largest difference " << worst);
  REQUIRE(worst <= fraction * scale);
}

/// `n` tokens uniform in [0, vocab).
inline std::vector<std::int32_t> random_tokens(std::size_t n, std::size_t vocab, std::mt19937& rng) {
  std::uniform_int_distribution<std::int32_t> token(0, static_cast<std::int32_t>(vocab) - 1);
  std::vector<std::int32_t> tokens(n);
  for (auto& t : tokens) t = token(rng);
  return tokens;
}

/// Each prompt's last logits from one prefill equal (to 1e-4) those of a
/// token-by-token decode, and the prompts packed into one batch in
/// `pack_order` give exactly (bit for bit) the logits of each alone. With a
/// `pool`, the decode steps run on it, and the packed batch runs both
/// serially and on it.
inline void check_prefill_equals_decode(model::llama_model& m, const std::vector<std::vector<std::int32_t>>& prompts,
                                        std::initializer_list<std::size_t> pack_order, thread_pool* pool = nullptr) {
  const std::size_t vocab = m.vocab_size();
  serial_executor serial;
  std::vector<std::vector<float>> last(prompts.size());
  for (std::size_t p = 0; p < prompts.size(); ++p) {
    kv::contiguous_cache<float> cache(m.kv_shape(), {.max_sequences = 1, .max_tokens = 16});
    model::batch_builder b;
    b.add(*cache.add_sequence(), prompts[p], 0);
    const auto l = m.forward(b.view(), cache);
    last[p].assign(l.row(0).begin(), l.row(0).end());
    kv::contiguous_cache<float> step(m.kv_shape(), {.max_sequences = 1, .max_tokens = 16});
    const kv::seq_id s = *step.add_sequence();
    for (std::size_t i = 0; i < prompts[p].size(); ++i) {
      model::batch_builder one;
      one.add(s, {&prompts[p][i], 1}, static_cast<std::int32_t>(i));
      const auto d = pool != nullptr ? m.forward(one.view(), step, *pool) : m.forward(one.view(), step, serial);
      if (i + 1 == prompts[p].size())
        for (std::size_t v = 0; v < vocab; ++v) REQUIRE(std::abs(d(0, v) - last[p][v]) <= 1e-4f);
    }
  }
  for (int threads = 1; threads <= (pool != nullptr ? 2 : 1); ++threads) {
    kv::contiguous_cache<float> cache(m.kv_shape(), {.max_sequences = 4, .max_tokens = 16});
    model::batch_builder b;
    std::vector<kv::seq_id> ids;
    for (std::size_t p = 0; p < prompts.size(); ++p) ids.push_back(*cache.add_sequence());
    for (std::size_t p : pack_order) b.add(ids[p], prompts[p], 0);
    const auto l = threads == 1 ? m.forward(b.view(), cache, serial) : m.forward(b.view(), cache, *pool);
    std::size_t r = 0;
    for (std::size_t p : pack_order) {
      INFO("threads " << threads << " prompt " << p);
      for (std::size_t v = 0; v < vocab; ++v) REQUIRE(l(r, v) == last[p][v]);
      ++r;
    }
  }
}

/// The fuzzer's seed tests/fuzz/gguf/`name` holds `expected`, the bytes
/// of synthetic_llama(o). When it is missing or stale, writes the fresh
/// file to the working directory and fails saying where it belongs.
inline void require_fuzz_seed(const model::synthetic_options& o, const std::vector<std::byte>& expected,
                              const std::string& name) {
  const std::string path = std::string(LLMKIT_SOURCE_DIR) + "/tests/fuzz/gguf/" + name;
  std::vector<std::byte> seed;
  if (std::FILE* in = std::fopen(path.c_str(), "rb")) {
    std::byte buf[4096];
    for (std::size_t got; (got = std::fread(buf, 1, sizeof buf, in)) > 0;) seed.insert(seed.end(), buf, buf + got);
    std::fclose(in);
  }
  if (seed != expected) {
    model::synthetic_llama(o).write(name);
    FAIL("tests/fuzz/gguf/" << name << " is missing or stale: copy the " << name
                            << " this test just wrote to its working directory there");
  }
}

}  // namespace llmkit::test
