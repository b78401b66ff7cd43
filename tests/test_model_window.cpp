// SPDX-License-Identifier: MIT
// Local (sliding-window) layers on a ring (model/window_cache.hpp,
// kv/hybrid_cache.hpp): Gemma 3 and gpt-oss synthetic models give the same
// logits, bit for bit, on a cache whose local layers keep only the window
// as on one that keeps every layer's history, for prompts longer than the
// window, prefill chunks that straddle it, decode far past it, packed
// batches, forks and speculative rollbacks; the cache's memory is the
// global layers' history plus one ring per local layer; bad input is
// refused by name.
#include <llmkit/attention/detail/prefill_kernels.hpp>
#include <llmkit/core/executor.hpp>
#include <llmkit/kv/contiguous_cache.hpp>
#include <llmkit/kv/hybrid_cache.hpp>
#include <llmkit/kv/paged_cache.hpp>
#include <llmkit/model/architecture.hpp>
#include <llmkit/model/batch.hpp>
#include <llmkit/model/llama.hpp>
#include <llmkit/model/synthetic.hpp>
#include <llmkit/model/window_cache.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

using namespace llmkit;
using namespace llmkit::model;

namespace {

std::span<const std::byte> as_span(const std::vector<std::byte>& v) { return {v.data(), v.size()}; }

const llama_options exact{.activations = activation_type::f32};

static_assert(kv::kv_cache<window_cache<float>> && kv::kv_cache<window_cache<std::int8_t>>);
static_assert(kv::kv_cache<paged_window_cache<float, 16>>);
// The ring's alignment is a multiple of every tile the kernels group keys by.
static_assert(local_ring_align % attention::detail::prefill_kernels<simd::default_arch, 64>::key_tile == 0);
static_assert(local_ring_align % 32 == 0);  // decode blocks: 16 rows, 32 with VNNI (decode_layout.hpp)

// Gemma 3 in miniature: layers 0-4 local, 5 global, 6 local; a window of
// `window` positions.
llama_config gemma3_config(std::size_t window) {
  llama_config c;
  c.arch = architecture::gemma3;
  c.n_vocab = 300;
  c.dim = 64;
  c.n_layers = 7;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 16;
  c.ffn_dim = 128;
  c.context_length = 1024;
  c.rms_eps = 1e-6f;
  c.sliding_window = window;
  c.rope.theta = 1000000.0f;
  c.rope.freq_scale = 0.125f;
  c.local_layers = local_layer_pattern(c.n_layers, 6);
  return c;
}

// gpt-oss in miniature: even layers local with sinks, 4 experts.
llama_config gpt_oss_config(std::size_t window) {
  llama_config c;
  c.arch = architecture::gpt_oss;
  c.n_vocab = 300;
  c.dim = 64;
  c.n_layers = 4;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 32;
  c.ffn_dim = 64;
  c.n_expert = 4;
  c.n_expert_used = 2;
  c.expert_ffn_dim = 64;
  c.context_length = 1024;
  c.rope.theta = 150000.0f;
  c.rms_eps = 1e-5f;
  c.sliding_window = window;
  c.local_layers = local_layer_pattern(c.n_layers, 2);
  return c;
}

std::vector<std::int32_t> random_tokens(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<std::int32_t> token(0, 299);
  std::vector<std::int32_t> tokens(n);
  for (auto& t : tokens) t = token(rng);
  return tokens;
}

// Runs `tokens` through sequence s of `cache` in forward() calls of the
// given sizes (the rest one token at a time) and returns each call's
// last-token logits.
template <class Cache, class Exec>
std::vector<std::vector<float>> run(llama_model& m, Cache& cache, kv::seq_id s, std::span<const std::int32_t> tokens,
                                    const std::vector<std::size_t>& chunks, Exec& exec) {
  std::vector<std::vector<float>> out;
  std::size_t pos = 0, c = 0;
  while (pos < tokens.size()) {
    const std::size_t n = std::min(c < chunks.size() ? chunks[c++] : std::size_t{1}, tokens.size() - pos);
    batch_builder b;
    b.add(s, tokens.subspan(pos, n), static_cast<std::int32_t>(pos));
    const auto l = m.forward(b.view(), cache, exec);
    out.emplace_back(l.row(0).begin(), l.row(0).end());
    pos += n;
  }
  return out;
}

template <class Exec>
void require_same_logits(llama_model& m, std::span<const std::int32_t> tokens, const std::vector<std::size_t>& chunks,
                         std::size_t max_grow, Exec& exec, float tolerance) {
  kv::contiguous_cache<float> full(m.kv_shape(), {.max_sequences = 1, .max_tokens = tokens.size()});
  auto window = make_window_cache<float>(m.config(), {.max_tokens = tokens.size(), .max_grow = max_grow});
  const auto want = run(m, full, *full.add_sequence(), tokens, chunks, exec);
  const auto got = run(m, window, *window.add_sequence(), tokens, chunks, exec);
  REQUIRE(got.size() == want.size());
  for (std::size_t r = 0; r < got.size(); ++r)
    for (std::size_t v = 0; v < m.vocab_size(); ++v) {
      INFO("call " << r << " token " << v);
      if (tolerance == 0.0f)
        REQUIRE(got[r][v] == want[r][v]);
      else
        REQUIRE(std::abs(got[r][v] - want[r][v]) <= tolerance * std::max(1.0f, std::abs(want[r][v])));
    }
}

}  // namespace

TEST_CASE("window cache: gemma3 logits equal the full cache's bit for bit, through and far past the window") {
  for (std::size_t window : {40u, 64u, 5u}) {
    const synthetic_options o{.config = gemma3_config(window), .seed = 71, .tied_output = true};
    const auto image = synthetic_llama(o).bytes();
    llama_model m(gguf_file(as_span(image)), exact);
    REQUIRE(m.config().local_layers == std::vector<std::uint8_t>{1, 1, 1, 1, 1, 0, 1});
    const auto tokens = random_tokens(260, 5 + static_cast<std::uint32_t>(window));
    serial_executor serial;
    INFO("window " << window);
    SECTION("one prefill longer than the window, then decode") {
      require_same_logits(m, tokens, {200}, 200, serial, 0.0f);
    }
    SECTION("prefill chunks that straddle the window, then decode") {
      require_same_logits(m, tokens, {37, 37, 37, 1, 37, 64}, 64, serial, 0.0f);
    }
    SECTION("decode from the first token") { require_same_logits(m, tokens, {}, 1, serial, 0.0f); }
  }
}

TEST_CASE("window cache: gpt-oss logits (sinks, alternating windows) equal the full cache's bit for bit") {
  const synthetic_options o{.config = gpt_oss_config(3), .seed = 29};
  const auto image = synthetic_llama(o).bytes();
  llama_model m(gguf_file(as_span(image)), exact);
  REQUIRE(m.config().local_layers == std::vector<std::uint8_t>{1, 0, 1, 0});
  const auto tokens = random_tokens(150, 3);
  serial_executor serial;
  require_same_logits(m, tokens, {70, 9}, 70, serial, 0.0f);
}

TEST_CASE("window cache: on two threads the logits stay within the kernels' split-KV rounding") {
  const synthetic_options o{.config = gemma3_config(40), .seed = 72, .tied_output = true};
  const auto image = synthetic_llama(o).bytes();
  llama_model m(gguf_file(as_span(image)), exact);
  const auto tokens = random_tokens(300, 9);
  thread_pool pool(2);
  require_same_logits(m, tokens, {100, 45}, 100, pool, 1e-5f);
}

TEST_CASE("window cache: packed sequences, forks and speculative rollbacks equal the full cache's") {
  const synthetic_options o{.config = gemma3_config(40), .seed = 73, .tied_output = true};
  const auto image = synthetic_llama(o).bytes();
  llama_model m(gguf_file(as_span(image)), exact);
  const auto a = random_tokens(120, 1), b = random_tokens(90, 2), guess = random_tokens(5, 3);
  kv::contiguous_cache<float> full(m.kv_shape(), {.max_sequences = 3, .max_tokens = 200});
  auto window = make_window_cache<float>(m.config(),
                                         {.max_sequences = 3, .max_tokens = 200, .max_grow = 128, .max_rollback = 5});

  int stage = 0;
  auto both = [&](auto&& fn) {
    const auto want = fn(full);
    const auto got = fn(window);
    INFO("stage " << stage++);
    REQUIRE(got.size() == want.size());
    std::size_t differ = 0;
    std::size_t first = got.size();
    for (std::size_t i = 0; i < got.size(); ++i)
      if (got[i] != want[i]) {
        ++differ;
        first = std::min(first, i);
      }
    INFO("first " << first << " of " << got.size());
    REQUIRE(differ == 0);
  };
  // Two prompts prefilled in one batch, then decoded side by side.
  std::vector<kv::seq_id> full_ids{*full.add_sequence(), *full.add_sequence()};
  std::vector<kv::seq_id> window_ids{*window.add_sequence(), *window.add_sequence()};
  auto ids = [&](const auto& cache) -> const std::vector<kv::seq_id>& {
    if constexpr (std::is_same_v<std::decay_t<decltype(cache)>, kv::contiguous_cache<float>>)
      return full_ids;
    else
      return window_ids;
  };
  both([&](auto& cache) {
    batch_builder bb;
    bb.add(ids(cache)[0], a, 0);
    bb.add(ids(cache)[1], b, 0);
    const auto l = m.forward(bb.view(), cache);
    return std::vector<float>(l.data(), l.data() + 2 * m.vocab_size());
  });
  for (std::int32_t step = 0; step < 30; ++step)
    both([&](auto& cache) {
      batch_builder bb;
      const std::int32_t ta = a[std::size_t(step)], tb = b[std::size_t(step)];
      bb.add(ids(cache)[0], {&ta, 1}, 120 + step);
      bb.add(ids(cache)[1], {&tb, 1}, 90 + step);
      const auto l = m.forward(bb.view(), cache);
      return std::vector<float>(l.data(), l.data() + 2 * m.vocab_size());
    });
  // A fork of sequence 0 continues on its own.
  both([&](auto& cache) {
    const kv::seq_id f = *cache.fork(ids(cache)[0]);
    std::vector<float> out;
    for (std::int32_t step = 0; step < 50; ++step) {
      batch_builder bb;
      const std::int32_t t = b[std::size_t(step)];
      bb.add(f, {&t, 1}, 150 + step);
      const auto l = m.forward(bb.view(), cache);
      out.insert(out.end(), l.row(0).begin(), l.row(0).end());
    }
    cache.free(f);
    return out;
  });
  // Speculative verification: 5 guesses scored stepwise, 3 rolled back, decode on.
  both([&](auto& cache) {
    const kv::seq_id s = ids(cache)[1];
    batch_builder bb;
    bb.add_stepwise(s, guess, 120);
    for (std::int32_t r = 0; r < 5; ++r) bb.request_logits(r);
    const auto l = m.forward(bb.view(), cache);
    std::vector<float> out(l.data(), l.data() + 5 * m.vocab_size());
    cache.truncate(s, 122);
    for (std::int32_t step = 0; step < 10; ++step) {
      batch_builder d;
      const std::int32_t t = a[std::size_t(step)];
      d.add(s, {&t, 1}, 122 + step);
      const auto dl = m.forward(d.view(), cache);
      out.insert(out.end(), dl.row(0).begin(), dl.row(0).end());
    }
    return out;
  });
}

TEST_CASE("window cache: memory is the global layers' history plus one ring per local layer") {
  const llama_config c = gemma3_config(40);
  auto window = make_window_cache<float>(c, {.max_sequences = 2, .max_tokens = 1000, .max_grow = 64});
  kv::contiguous_cache<float> full(c.kv_shape(), {.max_sequences = 2, .max_tokens = 1000});
  // Ring: window 40 + 63 grown rows + 31 of alignment, rounded up to 32 rows.
  REQUIRE(window.local_cache().ring_capacity() == 160);
  REQUIRE(window.global_cache().shape().n_layers == 1);
  REQUIRE(window.local_cache().shape().n_layers == 6);
  for (int i = 0; i < 2; ++i) {
    REQUIRE(window.add_sequence().has_value());
    REQUIRE(full.add_sequence().has_value());
  }
  const std::size_t row = 2 * c.n_kv_heads * c.head_dim * sizeof(float);  // K + V of one layer and position
  REQUIRE(full.usage().bytes_allocated == 2 * 1000 * 7 * row);
  REQUIRE(window.usage().bytes_allocated == 2 * (1000 * 1 + 160 * 6) * row);
  REQUIRE(window.usage().n_sequences == 2);
  // Grown past the window the ring holds no more rows; the global layer's history grows.
  REQUIRE(window.grow(0, 64));
  REQUIRE(window.grow(0, 64));
  REQUIRE(window.grow(0, 64));
  REQUIRE(window.n_tokens(0) == 192);
  REQUIRE(window.usage().n_tokens == 192);
  REQUIRE(window.usage().token_bytes == (192 * 1 + 160 * 6) * row);
  REQUIRE(window.n_chunks(0) == 2);  // the global layer: 1; the ring: wrapped into 2
  REQUIRE(window.chunk(0, 5, 0, 1).n_tokens == 0);  // past the global layer's single chunk
  REQUIRE(window.chunk(0, 0, 0, 0).first_pos % 32 == 0);
}

TEST_CASE("window cache: bad input raises llmkit::error naming the argument") {
  const llama_config c = gemma3_config(40);
  using Catch::Matchers::Contains;
  const std::vector<std::uint8_t> all_local(7, 1), wrong_size(6, 1);
  const kv::contiguous_cache_options g{.max_tokens = 10};
  const kv::sliding_window_options l{.window = 40};
  REQUIRE_THROWS_WITH((window_cache<float>(c.kv_shape(), all_local, g, l)),
                      Contains("hybrid_cache: local_layers marks 7 of 7 layers local"));
  REQUIRE_THROWS_WITH((window_cache<float>(c.kv_shape(), wrong_size, g, l)),
                      "hybrid_cache: local_layers.size() = 6 differs from shape.n_layers = 7");
  llama_config global_only = c;
  global_only.sliding_window = 0;
  REQUIRE_THROWS_WITH(make_window_cache<float>(global_only, {.max_tokens = 10}),
                      Contains("local_ring_options: the model has no sliding window"));
  REQUIRE_THROWS_WITH((kv::sliding_window_cache<float>(c.kv_shape(), {.window = 4, .align = 0})),
                      "sliding_window_cache: options.align must be > 0, got 0");

  const synthetic_options o{.config = c, .seed = 74, .tied_output = true};
  const auto image = synthetic_llama(o).bytes();
  llama_model m(gguf_file(as_span(image)), exact);
  const auto tokens = random_tokens(70, 4);
  batch_builder b;
  b.add(0, tokens, 0);
  {  // A grow beyond max_grow: the ring refuses, the global layers are rolled back.
    auto cache = make_window_cache<float>(c, {.max_tokens = 100, .max_grow = 64});
    REQUIRE(*cache.add_sequence() == 0);
    REQUIRE_THROWS_WITH(m.forward(b.view(), cache), Contains("grow: n = 70 exceeds options.max_grow = 64"));
    REQUIRE(cache.n_tokens(0) == 0);
    REQUIRE(cache.global_cache().n_tokens(0) == 0);
  }
  {  // A global layer of the model kept in a ring.
    std::vector<std::uint8_t> shifted{1, 1, 1, 1, 1, 1, 0};
    window_cache<float> cache(c.kv_shape(), shifted, g, local_ring_options(c, 64, 1));
    REQUIRE(*cache.add_sequence() == 0);
    REQUIRE_THROWS_WITH(m.forward(b.view(), cache),
                        "llama_model::forward: the cache keeps a window of 40 positions in layer 5, a global layer of "
                        "the model");
  }
  {  // A ring narrower than the model's window.
    window_cache<float> cache(c.kv_shape(), c.local_layers, g, kv::sliding_window_options{.window = 39, .max_grow = 70});
    REQUIRE(*cache.add_sequence() == 0);
    REQUIRE_THROWS_WITH(m.forward(b.view(), cache),
                        "llama_model::forward: the cache keeps a window of 39 positions in layer 0, narrower than the "
                        "model's sliding_window = 40");
  }
  auto cache = make_window_cache<float>(c, {.max_tokens = 10});
  REQUIRE_THROWS_WITH(cache.n_tokens(3), "n_tokens: unknown sequence id 3");
  REQUIRE(*cache.add_sequence() == 0);
  REQUIRE_THROWS_WITH(cache.chunk(0, 7, 0, 0), "chunk: layer 7 is out of range [0, 7)");
  REQUIRE_FALSE(cache.grow(0, 11));  // the global layers' 10 positions
  REQUIRE(cache.n_tokens(0) == 0);
}
