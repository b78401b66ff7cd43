// SPDX-License-Identifier: MIT
// The serving engine on a cache whose local (sliding-window) layers keep
// only their window (model::paged_window_cache: global layers in the paged
// pool the scheduler accounts, local layers in one ring per sequence):
// Gemma 3 and gpt-oss synthetic models give the same tokens as on a paged
// cache of every layer, alone, in a batch, on 1 and 2 threads, for n
// samples of a prompt (forks) and under preemption, with prompts longer
// than the window; the KV memory in use is lower. A prompt sharing a cached
// prefix gets the tokens it gets alone, whether the prefix is reused (a
// prefix cache of every layer) or not (the window cache reuses none).
#include <llmkit/core/executor.hpp>
#include <llmkit/kv/paged_cache.hpp>
#include <llmkit/kv/prefix_cache.hpp>
#include <llmkit/model/llama.hpp>
#include <llmkit/model/synthetic.hpp>
#include <llmkit/model/window_cache.hpp>
#include <llmkit/serve/serve.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <span>
#include <vector>

using namespace llmkit;

namespace {

constexpr std::size_t block = 16;
using full_cache = kv::paged_cache<float, block>;
using window_cache = model::paged_window_cache<float, block>;

static_assert(serve::engine_cache<window_cache>);
static_assert(!serve::prefix_reusing_cache<window_cache>);

model::llama_config config(model::architecture arch) {
  model::llama_config c;
  c.arch = arch;
  c.n_vocab = 300;
  c.dim = 128;
  c.n_heads = 2;
  c.n_kv_heads = 1;
  c.head_dim = 64;  // every build's attention kernels have heads of 64
  c.context_length = 256;
  c.sliding_window = 8;
  if (arch == model::architecture::gemma3) {
    c.n_layers = 6;  // layers 0-4 local, 5 global
    c.ffn_dim = 96;
  } else {  // gpt-oss: even layers local, with sinks; 4 experts
    c.n_layers = 4;
    c.ffn_dim = 64;
    c.n_expert = 4;
    c.n_expert_used = 2;
    c.expert_ffn_dim = 64;
  }
  return c;
}

/// Tokens of each request, by submission order.
class recorder {
 public:
  std::function<void(const serve::stream_event&)> sink() {
    return [this](const serve::stream_event& e) {
      std::lock_guard lock(mutex_);
      if (e.type == serve::event_type::token) tokens_[e.handle].push_back(e.token);
      else ++finishes_[e.handle];
    };
  }
  std::vector<token_id> tokens(request_id h) const {
    std::lock_guard lock(mutex_);
    const auto it = tokens_.find(h);
    return it == tokens_.end() ? std::vector<token_id>{} : it->second;
  }
  int finishes(request_id h) const {
    std::lock_guard lock(mutex_);
    const auto it = finishes_.find(h);
    return it == finishes_.end() ? 0 : it->second;
  }

 private:
  mutable std::mutex mutex_;
  std::map<request_id, std::vector<token_id>> tokens_;
  std::map<request_id, int> finishes_;
};

struct outcome {
  std::vector<std::vector<token_id>> tokens;  // [request * n + sample]
  std::size_t peak_bytes_in_use = 0;          // cache_usage::bytes_in_use, largest after any step
  std::uint64_t n_preemptions = 0;
};

std::vector<std::vector<token_id>> prompts(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<std::int32_t> token(0, 299), length(20, 60);
  std::vector<std::vector<token_id>> out(n);
  for (auto& p : out) {
    p.resize(std::size_t(length(rng)));
    for (auto& t : p) t = token(rng);
  }
  return out;
}

template <class Cache, class Exec>
outcome run(model::llama_model& m, Cache& cache, Exec& exec, const std::vector<std::vector<token_id>>& ps,
            std::size_t n_samples = 1, std::int64_t max_context = 256) {
  outcome out;
  serve::engine_options o{.max_context = max_context,
                          .policy = {.max_batch_seqs = 8, .max_step_tokens = 16, .chunked_prefill = true}};
  o.on_step = [&](const serve::step_report&) {
    out.peak_bytes_in_use = std::max(out.peak_bytes_in_use, cache.usage().bytes_in_use);
  };
  serve::engine eng(m, cache, exec, o);
  recorder rec;
  std::vector<request_id> handles;
  for (std::size_t i = 0; i < ps.size(); ++i) {
    serve::generation_request r{.prompt = ps[i], .stop = {.max_new_tokens = 40}, .on_event = rec.sink()};
    if (n_samples > 1) {
      r.sampling = "top_k(40);temperature(0.9);sample";
      r.seed = 7 + i;
      r.n = n_samples;
    }
    const auto res = eng.submit(std::move(r));
    REQUIRE(res.accepted());
    handles.push_back(res.handle);
  }
  eng.run_until_idle();
  for (request_id h : handles)
    for (std::size_t k = 0; k < n_samples; ++k) {
      REQUIRE(rec.finishes(h + static_cast<request_id>(k)) == 1);
      out.tokens.push_back(rec.tokens(h + static_cast<request_id>(k)));
    }
  out.n_preemptions = eng.stats().n_preemptions;
  REQUIRE(eng.stats().kv_blocks_used == 0);
  REQUIRE(cache.n_sequences() == 0);
  return out;
}

}  // namespace

TEST_CASE("engine on a window cache: gemma3 and gpt-oss tokens equal the full cache's, alone and in a batch") {
  for (const auto arch : {model::architecture::gemma3, model::architecture::gpt_oss}) {
    const auto image = model::synthetic_llama({.config = config(arch), .seed = 81, .tied_output = arch == model::architecture::gemma3}).bytes();
    model::llama_model m(model::gguf_file{std::span<const std::byte>(image)});  // int8 activations
    INFO(model::traits(arch).name);
    const auto batch = prompts(6, 5);
    serial_executor serial;
    thread_pool pool(2);
    full_cache full(m.kv_shape(), {.n_blocks = 256});
    const outcome want = run(m, full, serial, batch);
    for (const auto& t : want.tokens) REQUIRE(t.size() == 40);
    auto window = model::make_paged_window_cache<float, block>(m.config(), 256, 16, 16);
    const outcome got = run(m, window, serial, batch);
    REQUIRE(got.tokens == want.tokens);
    // Contexts of 60-100 tokens: 6 of the gemma3 layers' 5 (of gpt-oss's 2
    // of 4) hold a ring of 64 rows (window 8 + 15 grown + 31 of alignment,
    // rounded up to 32) instead of the whole context.
    INFO("peak bytes in use: window " << got.peak_bytes_in_use << ", full " << want.peak_bytes_in_use);
    REQUIRE(got.peak_bytes_in_use < want.peak_bytes_in_use);
    auto window2 = model::make_paged_window_cache<float, block>(m.config(), 256, 16, 16);
    REQUIRE(run(m, window2, pool, batch).tokens == want.tokens);
    for (std::size_t i : {0u, 3u}) {
      auto alone = model::make_paged_window_cache<float, block>(m.config(), 256, 16, 16);
      REQUIRE(run(m, alone, serial, {batch[i]}).tokens[0] == want.tokens[i]);
    }
  }
}

TEST_CASE("engine on a window cache: n samples fork the rings, preemption recomputes them, tokens as on the full cache") {
  const auto image =
      model::synthetic_llama({.config = config(model::architecture::gemma3), .seed = 82, .tied_output = true}).bytes();
  model::llama_model m(model::gguf_file{std::span<const std::byte>(image)});
  serial_executor serial;
  const auto ps = prompts(3, 6);
  full_cache full(m.kv_shape(), {.n_blocks = 256});
  const outcome want = run(m, full, serial, ps, 3);
  auto window = model::make_paged_window_cache<float, block>(m.config(), 256, 16, 16);
  REQUIRE(run(m, window, serial, ps, 3).tokens == want.tokens);
  // 8 blocks of the global layer: 128 positions for 9 sequences of up to 100.
  auto tight = model::make_paged_window_cache<float, block>(m.config(), 8, 16, 16);
  const outcome squeezed = run(m, tight, serial, ps, 3, 112);
  REQUIRE(squeezed.n_preemptions > 0);
  REQUIRE(squeezed.tokens == want.tokens);
}

namespace {

struct second_request {
  std::vector<token_id> tokens;
  std::size_t n_prompt_tokens_reused = 0;
};

// Serves `first` to its end, then `second` on the same engine and cache.
template <class Cache>
second_request serve_after(model::llama_model& m, Cache& cache, const std::vector<token_id>& first,
                           const std::vector<token_id>& second) {
  serial_executor serial;
  serve::engine eng(m, cache, serial,
                    {.max_context = 256, .policy = {.max_batch_seqs = 8, .max_step_tokens = 16, .chunked_prefill = true}});
  second_request out;
  for (const auto* prompt : {&first, &second}) {
    out = {};
    serve::generation_request r{.prompt = *prompt,
                                .stop = {.max_new_tokens = 40},
                                .on_event = [&out](const serve::stream_event& e) {
                                  if (e.type == serve::event_type::token) out.tokens.push_back(e.token);
                                  else out.n_prompt_tokens_reused = e.usage.n_prompt_tokens_reused;
                                }};
    REQUIRE(eng.submit(std::move(r)).accepted());
    eng.run_until_idle();
  }
  REQUIRE(cache.n_sequences() == 0);
  return out;
}

}  // namespace

TEST_CASE("engine on a window cache: a prompt that shares a served prompt's prefix gets the tokens it gets alone") {
  for (const auto arch : {model::architecture::gemma3, model::architecture::gpt_oss}) {
    INFO(model::traits(arch).name);
    const auto image = model::synthetic_llama({.config = config(arch), .seed = 83}).bytes();
    model::llama_model m(model::gguf_file{std::span<const std::byte>(image)});
    // A prefix of 48 tokens (3 blocks, six windows), then different tails.
    const auto parts = prompts(3, 9);
    std::vector<token_id> prefix(parts[0].begin(), parts[0].end());
    prefix.resize(48, 7);
    std::vector<token_id> first = prefix, second = prefix;
    first.insert(first.end(), parts[1].begin(), parts[1].begin() + 10);
    second.insert(second.end(), parts[2].begin(), parts[2].begin() + 13);

    serial_executor serial;
    full_cache alone_cache(m.kv_shape(), {.n_blocks = 256});
    const auto alone = run(m, alone_cache, serial, {second}).tokens[0];
    REQUIRE(alone.size() == 40);
    REQUIRE(std::set<token_id>(alone.begin(), alone.end()).size() > 4);  // tokens that a wrong context would change

    // Every layer in a prefix cache: the 48 tokens' blocks are reused.
    kv::prefix_cache<float, block> prefixes(m.kv_shape(), {.n_blocks = 256});
    const second_request reused = serve_after(m, prefixes, first, second);
    REQUIRE(reused.n_prompt_tokens_reused == 48);
    REQUIRE(reused.tokens == alone);

    // Local layers in rings: nothing is reused, the tokens are the same.
    auto window = model::make_paged_window_cache<float, block>(m.config(), 256, 16, 16);
    const second_request fresh = serve_after(m, window, first, second);
    REQUIRE(fresh.n_prompt_tokens_reused == 0);
    REQUIRE(fresh.tokens == alone);
  }
}
