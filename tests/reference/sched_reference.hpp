// SPDX-License-Identifier: MIT
#pragma once

// Oracles for the sched tests: an invariant checker for scheduler states and
// plans, a fake engine whose "model" is a hash of the cached context (so a
// token is right only if every position was computed exactly once, in
// order), and a double-precision cost oracle written term by term.

#include <llmkit/sched/cost_model.hpp>
#include <llmkit/sched/policy.hpp>
#include <llmkit/sched/state.hpp>
#include <llmkit/sched/step_plan.hpp>

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace sched_reference {

using namespace llmkit::sched;
using llmkit::request_id;

// Returns "" when the state is consistent, else what is wrong.
inline std::string check_state(const sched_state& s) {
  std::set<request_id> ids;
  std::int64_t dev = 0, swp = 0;
  auto visit = [&](const std::vector<seq_record>& list, const char* name, bool device, bool swapped) -> std::string {
    for (const seq_record& r : list) {
      if (!ids.insert(r.id).second) return std::string("request in two places: ") + std::to_string(r.id);
      if (!s.seen_ids.contains(r.id)) return "live request never submitted";
      if (r.n_cached < 0 || r.n_cached > r.context()) return std::string(name) + ": n_cached out of range";
      if (r.n_generated < 0 || r.n_generated >= r.max_new_tokens) return std::string(name) + ": n_generated out of range";
      if (r.n_blocks < r.width * blocks_for(r.n_cached, s.limits.block_size)) return std::string(name) + ": too few blocks";
      if (!device && !swapped && (r.n_blocks != 0 || r.n_cached != 0)) return "waiting request holds KV";
      if (device) dev += r.n_blocks;
      if (swapped) swp += r.n_blocks;
    }
    return "";
  };
  for (auto m : {visit(s.waiting, "waiting", false, false), visit(s.running, "running", true, false),
                 visit(s.swapped, "swapped", false, true)})
    if (!m.empty()) return m;
  if (dev + s.n_free_blocks != s.limits.n_blocks) return "device blocks leaked";
  if (swp + s.n_free_swap_blocks != s.limits.n_swap_blocks) return "swap blocks leaked";
  if (s.n_free_blocks < 0 || s.n_free_swap_blocks < 0) return "negative free blocks";
  return "";
}

// Returns "" when `plan` obeys the policy's promises for state `s`.
inline std::string check_plan(const sched_state& s, const policy& p, const step_plan& plan) {
  if (plan.n_computed_tokens() > p.max_step_tokens) return "budget exceeded";
  if (static_cast<std::int64_t>(plan.items.size()) > p.max_batch_seqs) return "too many sequences";
  std::set<request_id> in_items;
  for (const step_item& it : plan.items) {
    if (!in_items.insert(it.id).second) return "sequence twice in one step";
    if (it.n_tokens < 1) return "empty item";
  }
  if (n_live(s) > 0 && plan.items.empty() && plan.preempted.empty() && plan.swapped_out.empty())
    return "no progress";
  // Padded/packed rows cover each prefill piece exactly once.
  if (plan.layout != prefill_layout::ragged) {
    std::multiset<std::size_t> seen;
    for (const auto& row : plan.prefill_rows) {
      std::int64_t load = 0;
      for (std::size_t k : row) {
        seen.insert(k);
        load += plan.items[k].n_tokens;
      }
      if (load > plan.row_length) return "row overflows";
    }
    for (std::size_t k = 0; k < plan.items.size(); ++k)
      if (seen.count(k) != (plan.items[k].is_prefill ? 1u : 0u)) return "prefill piece not in exactly one row";
  }
  // Committing a copy must not run out of blocks.
  sched_state copy = s;
  commit_step(copy, plan);
  if (auto m = check_state(copy); !m.empty()) return "after commit: " + m;
  return "";
}

// A fake model: the "KV" of a sequence is the list of tokens computed; a
// sampled token is a hash of that list, so it differs as soon as any
// position was skipped, duplicated or reordered.
struct fake_engine {
  std::int32_t vocab = 1000;
  std::map<request_id, std::vector<std::int32_t>> kv, host;

  static std::int32_t next_token(const std::vector<std::int32_t>& ctx, std::int32_t vocab) {
    std::uint64_t h = 1469598103934665603ull;
    for (std::int32_t t : ctx) h = (h ^ static_cast<std::uint64_t>(t)) * 1099511628211ull;
    return static_cast<std::int32_t>(h % static_cast<std::uint64_t>(vocab));
  }

  // Runs `plan`; `context(id)` gives prompt + output so far. Returns one
  // token per sampled item, or throws std::logic_error on a bad position.
  template <class Context>
  std::vector<std::int32_t> run(const step_plan& plan, Context&& context) {
    for (const auto& m : plan.preempted) kv.erase(m.id);
    for (const auto& m : plan.swapped_out) {
      host[m.id] = kv[m.id];
      kv.erase(m.id);
    }
    for (const auto& m : plan.swapped_in) {
      kv[m.id] = host[m.id];
      host.erase(m.id);
    }
    std::vector<std::int32_t> out;
    for (const step_item& it : plan.items) {
      auto& cache = kv[it.id];
      const std::vector<std::int32_t> ctx = context(it.id);
      if (static_cast<std::int64_t>(cache.size()) != it.first_pos) throw std::logic_error("wrong first_pos");
      if (it.first_pos + it.n_tokens > static_cast<std::int64_t>(ctx.size())) throw std::logic_error("past context");
      cache.insert(cache.end(), ctx.begin() + it.first_pos, ctx.begin() + it.first_pos + it.n_tokens);
      if (it.samples) {
        if (cache.size() != ctx.size()) throw std::logic_error("samples before the context is cached");
        out.push_back(next_token(cache, vocab));
      }
    }
    return out;
  }
};

// The cost of a plan counted one token slot and one (query, key) pair at a
// time, straight from the definitions in cost_model.hpp.
struct reference_cost {
  double flops = 0, bytes = 0;
};

inline reference_cost cost_by_enumeration(const llama_config& m, const step_plan& plan, std::int64_t block_size) {
  reference_cost c;
  const double q = static_cast<double>(m.n_heads) * m.head_dim, kv = static_cast<double>(m.n_kv_heads) * m.head_dim;
  const double d = static_cast<double>(m.dim);
  double per_token_flops = 0;  // one token through one layer's matrices
  per_token_flops += 2 * d * q;       // wq
  per_token_flops += 2 * 2 * d * kv;  // wk, wv
  per_token_flops += 2 * q * d;       // wo
  per_token_flops += 3 * 2 * d * static_cast<double>(m.ffn_dim);
  const double per_pair_flops = 2 * q + 2 * q;  // q.k over all heads, then p * v
  const double kv_bytes_token_layer = 2 * kv * m.bytes_per_kv;
  auto add_token = [&](double visible_keys) {
    for (std::int64_t l = 0; l < m.n_layers; ++l) {
      c.flops += per_token_flops;
      for (double k = 0; k < visible_keys; ++k) c.flops += per_pair_flops;
    }
  };
  std::vector<char> padded(plan.items.size(), 0);
  if (plan.layout == prefill_layout::padded) {
    for (const auto& row : plan.prefill_rows) {
      std::int64_t first = 0;
      for (std::size_t k : row) {
        padded[k] = 1;
        first = std::max(first, plan.items[k].first_pos);
      }
      for (std::int64_t t = 0; t < plan.row_length; ++t) add_token(static_cast<double>(first + t + 1));
    }
  }
  for (std::size_t i = 0; i < plan.items.size(); ++i) {
    const step_item& it = plan.items[i];
    for (std::int64_t t = 0; t < it.n_tokens; ++t) {
      if (!padded[i]) add_token(static_cast<double>(it.first_pos + t + 1));
      c.bytes += kv_bytes_token_layer * m.n_layers;  // write
    }
    c.bytes += static_cast<double>(it.first_pos + it.n_tokens) * kv_bytes_token_layer * m.n_layers;  // read
    if (it.samples) c.flops += 2 * d * m.vocab;
  }
  // Padding slots of packed rows: matrices only.
  if (plan.layout == prefill_layout::packed) {
    std::int64_t packed_real = 0;
    for (const auto& row : plan.prefill_rows)
      for (std::size_t k : row) packed_real += plan.items[k].n_tokens;
    const std::int64_t pad = static_cast<std::int64_t>(plan.prefill_rows.size()) * plan.row_length - packed_real;
    for (std::int64_t t = 0; t < pad; ++t) add_token(0);
  }
  for (std::int64_t t = 0; t < plan.n_idle_slots; ++t) {
    add_token(0);
    c.flops += 2 * d * m.vocab;
  }
  if (!plan.items.empty()) {
    double weights = 0;
    for (std::int64_t l = 0; l < m.n_layers; ++l) weights += d * q + 2 * d * kv + q * d + 3 * d * m.ffn_dim;
    weights += static_cast<double>(m.vocab) * d;
    c.bytes += weights * m.bytes_per_weight;
  }
  for (const auto* list : {&plan.swapped_out, &plan.swapped_in})
    for (const block_move& b : *list) c.bytes += 2.0 * b.n_blocks * block_size * kv_bytes_token_layer * m.n_layers;
  return c;
}

}  // namespace sched_reference
