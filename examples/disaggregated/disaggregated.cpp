// SPDX-License-Identifier: MIT
// llmkit-disaggregated: prefill/decode disaggregation across MPI ranks.
//
//   mpirun -np 2 llmkit-disaggregated [--requests N] [--model PATH] ...
//
// Rank 0 is the prefill worker: it prepacks the prompts into rows (first-fit
// decreasing, llmkit/pack), prefills each row with the reference Llama
// forward pass into a paged KV cache, samples every request's first token
// (greedy) and ships the request -- prompt, first token, and the sequence's
// KV as the paged cache's versioned, checksummed export buffer
// (kv::paged_cache::export_sequence) -- to rank 1 as soon as its row is done.
//
// Rank 1 is the decode worker: a sched::scheduler with continuous batching
// takes each request with submit_prefilled (the buffer waits in the staging
// area, with back-pressure when it is full), imports the KV when the plan
// lists the request in swapped_in, and decodes greedily in ragged batches
// until every request has its tokens; then it sends the outputs back.
//
// Meanwhile rank 0 runs every request alone in one process (prefill, then
// greedy decoding, its own cache) and compares: the program exits with 1
// when any request's tokens differ, 0 when all equal.
//
// With one rank (`mpirun -np 1`, or run directly) both workers run in the
// same process, handing the buffers over in memory: the same check without
// a second process.
#include <mpi.h>

#include <llmkit/core/executor.hpp>
#include <llmkit/kv/paged_cache.hpp>
#include <llmkit/model/batch.hpp>
#include <llmkit/model/llama.hpp>
#include <llmkit/pack/packed_batch.hpp>
#include <llmkit/pack/packers.hpp>
#include <llmkit/pack/prefill.hpp>
#include <llmkit/sched/policy.hpp>
#include <llmkit/sched/scheduler.hpp>

#include "../example_cli.hpp"


#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <map>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <vector>

namespace sched = llmkit::sched;
namespace model = llmkit::model;

namespace {

constexpr std::size_t block_size = 16;
using cache_t = llmkit::kv::paged_cache<float, block_size>;

struct options {
  std::string model_path;
  std::int64_t n_requests = 12;
  std::int64_t prompt_min = 8, prompt_max = 96;
  std::int64_t max_new_tokens = 32;
  std::int64_t max_batch = 8;
  std::int64_t staging_seqs = 4;
  std::int64_t decode_blocks = 0;  // 0 = max_batch full contexts
  bool wait_all = false;           // decode worker: receive everything before the first step
  std::uint64_t seed = 7;
  bool verbose = false;
  bool fault = false;
};

/// One request with its first token and KV, as rank 0 ships it.
struct handoff {
  sched::request req;
  std::int32_t first_token = 0;
  std::vector<std::byte> kv;
};

std::int32_t argmax(std::span<const float> row) {
  return static_cast<std::int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
}

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

std::vector<sched::request> make_requests(const options& o, std::size_t vocab) {
  std::mt19937_64 rng(o.seed);
  std::uniform_int_distribution<std::int64_t> len(o.prompt_min, o.prompt_max);
  std::uniform_int_distribution<std::int32_t> tok(3, static_cast<std::int32_t>(vocab) - 1);
  std::vector<sched::request> out;
  for (std::int64_t i = 0; i < o.n_requests; ++i) {
    sched::request r{.id = i, .prompt = {}, .sampling = "greedy", .seed = 0,
                     .stop = {.max_new_tokens = static_cast<std::size_t>(o.max_new_tokens)}};
    const std::int64_t n = len(rng);
    for (std::int64_t t = 0; t < n; ++t) r.prompt.push_back(tok(rng));
    out.push_back(std::move(r));
  }
  return out;
}

// ---- prefill worker -------------------------------------------------------

/// Prepacks every prompt into rows and prefills row by row; after each row,
/// `ship(handoff)` receives each request whose prompt ended in it.
template <class Ship>
void prefill_worker(model::llama_model& m, llmkit::serial_executor& exec, const std::vector<sched::request>& reqs,
                    Ship&& ship) {
  std::vector<std::span<const std::int32_t>> prompts;
  std::size_t total = 0, longest = 0;
  for (const auto& r : reqs) {
    prompts.emplace_back(r.prompt);
    total += r.prompt.size();
    longest = std::max(longest, r.prompt.size());
  }
  const auto lengths = llmkit::pack::prompt_lengths(prompts);
  // Row capacity: the longest prompt (the prepacking paper's choice).
  const auto layout = llmkit::pack::pack_items(lengths, llmkit::pack::packer::first_fit_decreasing,
                                               llmkit::pack::pack_options{.capacity = longest});
  cache_t cache(m.kv_shape(), {.n_blocks = total / block_size + reqs.size() + 1, .max_sequences = reqs.size()});
  std::vector<std::int32_t> seqs;
  for (std::size_t q = 0; q < reqs.size(); ++q) seqs.push_back(*cache.add_sequence());
  const auto batch = llmkit::pack::build_packed_batch(prompts, layout, seqs);
  for (const auto& row : batch.rows) {
    const auto logits = m.forward(model::batch{row.token_ids, row.positions, row.seq_ids, row.logit_rows}, cache, exec);
    for (std::size_t k = 0; k < row.logit_requests.size(); ++k) {
      const auto q = static_cast<std::size_t>(row.logit_requests[k]);
      handoff h{reqs[q], argmax(logits.row(k)), cache.export_sequence(seqs[q])};
      cache.free(seqs[q]);
      ship(std::move(h));
    }
  }
}

// ---- decode worker --------------------------------------------------------

/// Continuous-batching greedy decoder over imported sequences.
class decode_worker {
 public:
  decode_worker(model::llama_model& m, llmkit::serial_executor& exec, const options& o)
      : model_(m),
        exec_(exec),
        limits_{.max_context = o.prompt_max + o.max_new_tokens,
                .block_size = static_cast<std::int64_t>(block_size),
                .n_blocks = o.decode_blocks > 0
                                ? o.decode_blocks
                                : o.max_batch * sched::blocks_for(o.prompt_max + o.max_new_tokens,
                                                                  static_cast<std::int64_t>(block_size)),
                .n_swap_blocks = o.staging_seqs * sched::blocks_for(o.prompt_max + o.max_new_tokens, static_cast<std::int64_t>(block_size))},
        sched_(limits_, sched::policy{.max_batch_seqs = o.max_batch,
                                      .max_step_tokens = std::max<std::int64_t>(o.max_batch, limits_.max_context)}),
        cache_(m.kv_shape(), {.n_blocks = static_cast<std::size_t>(limits_.n_blocks)}) {}

  /// Offers a received request; false (nothing taken) when staging is full.
  bool offer(handoff& h) {
    if (h.req.stop.max_new_tokens == 1) {  // done on the prefill worker
      done_[h.req.id] = {h.first_token};
      return true;
    }
    const llmkit::request_id id = h.req.id;
    if (!sched_.submit_prefilled(h.req, {h.first_token})) return false;
    host_[id] = std::move(h.kv);
    return true;
  }
  bool idle() const { return sched_.idle(); }

  /// One engine step.
  void step() {
    const sched::step_plan& plan = sched_.next_step();
    n_preempted_ += static_cast<std::int64_t>(plan.preempted.size() + plan.swapped_out.size());
    for (const auto& mv : plan.preempted) drop(mv.id);
    for (const auto& mv : plan.swapped_out) {
      host_[mv.id] = cache_.export_sequence(seq_.at(mv.id));
      drop(mv.id);
    }
    for (const auto& mv : plan.swapped_in) {
      const auto s = cache_.import_sequence(host_.at(mv.id));
      LLMKIT_CHECK(s.has_value(), "decode worker: no room to import request ", mv.id);
      seq_[mv.id] = *s;
      host_.erase(mv.id);
    }
    batch_.clear();
    ctx_.clear();
    for (const sched::step_item& it : plan.items) {
      if (!seq_.contains(it.id)) seq_[it.id] = *cache_.add_sequence();  // recompute after preemption
      const sched::request& r = sched_.get(it.id);
      const auto out = sched_.output(it.id);
      std::vector<std::int32_t>& tokens = ctx_.emplace_back();
      for (std::int64_t p = it.first_pos; p < it.first_pos + it.n_tokens; ++p) {
        const auto n_prompt = static_cast<std::int64_t>(r.prompt.size());
        tokens.push_back(p < n_prompt ? r.prompt[static_cast<std::size_t>(p)]
                                      : out[static_cast<std::size_t>(p - n_prompt)]);
      }
      batch_.add(seq_.at(it.id), tokens, static_cast<std::int32_t>(it.first_pos),
                 it.samples ? model::last_logits::keep : model::last_logits::skip);
    }
    std::vector<llmkit::token_id> sampled;
    if (!plan.items.empty()) {
      const auto logits = model_.forward(batch_.view(), cache_, exec_);
      for (std::size_t k = 0; k < logits.rows(); ++k) sampled.push_back(argmax(logits.row(k)));
    }
    n_tokens_ += static_cast<std::int64_t>(sampled.size());
    for (auto& f : sched_.complete_step(sampled)) {
      drop(f.id);
      done_[f.id] = std::move(f.output);
    }
  }

  const std::map<llmkit::request_id, std::vector<std::int32_t>>& outputs() const { return done_; }
  std::int64_t n_decoded() const { return n_tokens_; }
  std::int64_t n_preempted() const { return n_preempted_; }

 private:
  void drop(llmkit::request_id id) {
    if (auto it = seq_.find(id); it != seq_.end()) {
      cache_.free(it->second);
      seq_.erase(it);
    }
  }
  model::llama_model& model_;
  llmkit::serial_executor& exec_;
  sched::engine_limits limits_;
  sched::scheduler sched_;
  cache_t cache_;
  model::batch_builder batch_;
  std::deque<std::vector<std::int32_t>> ctx_;  // token storage of the batch (stable addresses)
  std::map<llmkit::request_id, llmkit::kv::seq_id> seq_;
  std::map<llmkit::request_id, std::vector<std::byte>> host_;
  std::map<llmkit::request_id, std::vector<std::int32_t>> done_;
  std::int64_t n_tokens_ = 0, n_preempted_ = 0;
};

// ---- the single-process reference ------------------------------------------

/// Runs `r` alone: prefill, then greedy decoding, in its own cache.
std::vector<std::int32_t> solo(model::llama_model& m, llmkit::serial_executor& exec, const sched::request& r) {
  const std::size_t n = r.prompt.size() + r.stop.max_new_tokens;
  cache_t cache(m.kv_shape(), {.n_blocks = n / block_size + 2});
  const auto s = *cache.add_sequence();
  model::batch_builder b;
  std::vector<std::int32_t> ctx = r.prompt, out;
  std::size_t done = 0;
  while (out.size() < r.stop.max_new_tokens) {
    b.clear();
    b.add(s, std::span<const std::int32_t>(ctx).subspan(done), static_cast<std::int32_t>(done));
    done = ctx.size();
    out.push_back(argmax(m.forward(b.view(), cache, exec).row(0)));
    ctx.push_back(out.back());
  }
  return out;
}

// ---- MPI transport ---------------------------------------------------------

constexpr int tag_header = 1, tag_prompt = 2, tag_kv = 3, tag_result = 4;

void send_handoff(const handoff& h) {
  const std::int64_t header[5] = {h.req.id, static_cast<std::int64_t>(h.req.prompt.size()),
                                  static_cast<std::int64_t>(h.req.stop.max_new_tokens),
                                  h.first_token, static_cast<std::int64_t>(h.kv.size())};
  MPI_Send(header, 5, MPI_INT64_T, 1, tag_header, MPI_COMM_WORLD);
  MPI_Send(h.req.prompt.data(), static_cast<int>(h.req.prompt.size()), MPI_INT32_T, 1, tag_prompt, MPI_COMM_WORLD);
  MPI_Send(h.kv.data(), static_cast<int>(h.kv.size()), MPI_BYTE, 1, tag_kv, MPI_COMM_WORLD);
}

handoff recv_handoff() {
  std::int64_t header[5];
  MPI_Recv(header, 5, MPI_INT64_T, 0, tag_header, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  handoff h;
  h.req = {.id = header[0], .prompt = std::vector<std::int32_t>(static_cast<std::size_t>(header[1])),
           .sampling = "greedy", .seed = 0, .stop = {.max_new_tokens = static_cast<std::size_t>(header[2])}};
  h.first_token = static_cast<std::int32_t>(header[3]);
  h.kv.resize(static_cast<std::size_t>(header[4]));
  MPI_Recv(h.req.prompt.data(), static_cast<int>(header[1]), MPI_INT32_T, 0, tag_prompt, MPI_COMM_WORLD,
           MPI_STATUS_IGNORE);
  MPI_Recv(h.kv.data(), static_cast<int>(header[4]), MPI_BYTE, 0, tag_kv, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  return h;
}

/// Decodes everything offered by `poll(blocking)`, `n` requests in all;
/// with `wait_all`, receives all of them before the first step.
template <class Poll>
void decode_all(decode_worker& d, std::int64_t n, bool wait_all, Poll&& poll) {
  std::deque<handoff> pending;  // received, waiting for staging room
  std::int64_t received = 0;
  while (received < n || !pending.empty() || !d.idle()) {
    // Take what has arrived; block only when there is nothing else to do.
    while (received < n) {
      auto h = poll(wait_all || (d.idle() && pending.empty()));
      if (!h) break;
      pending.push_back(std::move(*h));
      ++received;
    }
    while (!pending.empty() && d.offer(pending.front())) pending.pop_front();
    if (!d.idle()) d.step();
  }
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  options o;
#if defined(LLMKIT_DEFAULT_MODEL)
  o.model_path = LLMKIT_DEFAULT_MODEL;
#endif
  llmkit_examples::command_line cli{"llmkit-disaggregated: prefill on rank 0, KV hand-off, decode on rank 1 (MPI)"};
  cli.show_defaults();
  cli.add_option("--model", o.model_path, "GGUF model (llama or qwen2 architecture)");
  cli.add_option("-n,--requests", o.n_requests, "number of requests").count_at_least(1, "no request to serve");
  cli.add_option("--prompt-min", o.prompt_min, "shortest prompt").count_at_least(1, "a prompt has a token");
  cli.add_option("--prompt-max", o.prompt_max, "longest prompt").count_at_least(1, "a prompt has a token");
  cli.add_option("--tokens", o.max_new_tokens, "tokens generated per request")
      .count_at_least(1, "nothing to generate");
  cli.add_option("--max-batch", o.max_batch, "decode worker: most sequences per step")
      .count_at_least(1, "a batch holds at least one sequence");
  cli.add_option("--staging", o.staging_seqs, "decode worker: staging area, in full-context sequences")
      .count_at_least(1, "the decode worker needs room for one sequence");
  cli.add_option("--decode-blocks", o.decode_blocks,
                 "decode worker: KV blocks of 16 tokens (0 = max-batch full contexts; fewer forces preemption)");
  cli.add_flag("--wait-all", o.wait_all,
               "decode worker: receive every request before the first step (the same batches whatever the timing)");
  cli.add_option("--seed", o.seed, "prompt seed");
  cli.add_flag("--fault", o.fault, "change one decoded token of request 0 (shows that the comparison catches it)");
  cli.add_flag("-v,--verbose", o.verbose, "print every request's tokens");
  // Rank 0 alone prints help and errors, and returns their exit code.
  using llmkit_examples::parse_output;
  if (const auto exit_code = cli.parse(argc, argv, rank == 0 ? parse_output::print : parse_output::suppress)) {
    MPI_Finalize();
    return rank == 0 ? *exit_code : 0;
  }
  int status = 0;
  try {
    LLMKIT_CHECK(size <= 2, "run with 1 or 2 MPI ranks (prefill, decode), got ", size);
    LLMKIT_CHECK(o.prompt_min <= o.prompt_max, "--prompt-min ", o.prompt_min, " exceeds --prompt-max ", o.prompt_max);
    auto m = model::llama_model::load(o.model_path);
    LLMKIT_CHECK(static_cast<std::size_t>(o.prompt_max + o.max_new_tokens) <= m.config().context_length,
                 "--prompt-max + --tokens = ", o.prompt_max + o.max_new_tokens, " exceed the model's context of ",
                 m.config().context_length);
    llmkit::serial_executor exec;
    const auto reqs = make_requests(o, m.vocab_size());
    std::map<llmkit::request_id, std::vector<std::int32_t>> outputs;
    std::int64_t kv_bytes = 0;
    const double t0 = now();
    double t_prefill = 0, t_decode = 0;
    std::int64_t n_decoded = 0, n_preempted = 0;

    if (size == 1) {  // both workers here, buffers handed over in memory
      std::deque<handoff> link;
      prefill_worker(m, exec, reqs, [&](handoff&& h) {
        kv_bytes += static_cast<std::int64_t>(h.kv.size());
        link.push_back(std::move(h));
      });
      t_prefill = now() - t0;
      decode_worker d(m, exec, o);
      decode_all(d, o.n_requests, o.wait_all, [&](bool) -> std::optional<handoff> {
        if (link.empty()) return std::nullopt;
        handoff h = std::move(link.front());
        link.pop_front();
        return h;
      });
      t_decode = now() - t0 - t_prefill;
      outputs = d.outputs();
      if (o.fault) outputs.at(0).back() ^= 1;
      n_decoded = d.n_decoded();
      n_preempted = d.n_preempted();
    } else if (rank == 0) {
      prefill_worker(m, exec, reqs, [&](handoff&& h) {
        kv_bytes += static_cast<std::int64_t>(h.kv.size());
        send_handoff(h);
      });
      t_prefill = now() - t0;
    } else {
      decode_worker d(m, exec, o);
      decode_all(d, o.n_requests, o.wait_all, [&](bool block) -> std::optional<handoff> {
        int ready = 0;
        if (block)
          ready = 1;
        else
          MPI_Iprobe(0, tag_header, MPI_COMM_WORLD, &ready, MPI_STATUS_IGNORE);
        if (!ready) return std::nullopt;
        return recv_handoff();
      });
      t_decode = now() - t0;
      auto decoded = d.outputs();
      if (o.fault) decoded.at(0).back() ^= 1;
      for (const auto& [id, out] : decoded) {
        std::vector<std::int64_t> msg{id, static_cast<std::int64_t>(out.size())};
        msg.insert(msg.end(), out.begin(), out.end());
        MPI_Send(msg.data(), static_cast<int>(msg.size()), MPI_INT64_T, 0, tag_result, MPI_COMM_WORLD);
      }
      const double stats[3] = {t_decode, static_cast<double>(d.n_decoded()), static_cast<double>(d.n_preempted())};
      MPI_Send(stats, 3, MPI_DOUBLE, 0, tag_result + 1, MPI_COMM_WORLD);
    }

    if (rank == 0) {
      // The single-process reference, while rank 1 decodes.
      std::vector<std::vector<std::int32_t>> expected;
      for (const auto& r : reqs) expected.push_back(solo(m, exec, r));
      if (size == 2) {
        for (std::int64_t i = 0; i < o.n_requests; ++i) {
          MPI_Status st;
          MPI_Probe(1, tag_result, MPI_COMM_WORLD, &st);
          int count = 0;
          MPI_Get_count(&st, MPI_INT64_T, &count);
          std::vector<std::int64_t> msg(static_cast<std::size_t>(count));
          MPI_Recv(msg.data(), count, MPI_INT64_T, 1, tag_result, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
          outputs[msg[0]] = std::vector<std::int32_t>(msg.begin() + 2, msg.end());
        }
        double stats[3];
        MPI_Recv(stats, 3, MPI_DOUBLE, 1, tag_result + 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        t_decode = stats[0];
        n_decoded = static_cast<std::int64_t>(stats[1]);
        n_preempted = static_cast<std::int64_t>(stats[2]);
      }
      std::int64_t n_prompt = 0, n_equal = 0;
      for (const auto& r : reqs) {
        n_prompt += static_cast<std::int64_t>(r.prompt.size());
        const auto it = outputs.find(r.id);
        const bool equal = it != outputs.end() && it->second == expected[static_cast<std::size_t>(r.id)];
        n_equal += equal ? 1 : 0;
        if (o.verbose || !equal) {
          std::printf("request %lld (%zu prompt tokens): %s\n  disaggregated:", static_cast<long long>(r.id),
                      r.prompt.size(), equal ? "equal" : "DIFFERS");
          if (it != outputs.end())
            for (auto t : it->second) std::printf(" %d", t);
          std::printf("\n  alone:        ");
          for (auto t : expected[static_cast<std::size_t>(r.id)]) std::printf(" %d", t);
          std::printf("\n");
        }
      }
      std::printf("%d rank(s): %lld requests, %lld prompt tokens prefilled (prepacked) in %.3f s on rank 0, "
                  "%lld KV bytes shipped, %lld tokens decoded in %.3f s on rank %d (%lld preemptions)\n",
                  size, static_cast<long long>(o.n_requests), static_cast<long long>(n_prompt), t_prefill,
                  static_cast<long long>(kv_bytes), static_cast<long long>(n_decoded), t_decode, size - 1, static_cast<long long>(n_preempted));
      std::printf("%lld of %lld requests equal their single-process run: %s\n", static_cast<long long>(n_equal),
                  static_cast<long long>(o.n_requests), n_equal == o.n_requests ? "OK" : "MISMATCH");
      status = n_equal == o.n_requests ? 0 : 1;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "llmkit-disaggregated (rank %d): %s\n", rank, e.what());
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  MPI_Finalize();
  return status;
}
