// SPDX-License-Identifier: MIT
// llmkit-disaggregated: prefill/decode disaggregation across MPI ranks.
//
//   mpirun -np 2 llmkit-disaggregated [--requests N] [--model PATH] ...
//
// Rank 0 is the prefill worker: it prepacks the prompts into rows (first-fit
// decreasing, llmkit/pack), prefills each row with the reference Llama
// forward pass into a paged KV cache, samples every request's first token
// (greedy by default; --sampling sets a chain, drawn with serve::sample_token
// as the engine draws) and ships the request -- prompt, first token, and the sequence's
// KV as the paged cache's versioned, checksummed export buffer
// (kv::paged_cache::export_sequence) -- to rank 1 as soon as its row is done.
//
// Rank 1 is the decode worker: the serving engine (llmkit::serve::engine,
// continuous batching, stepped from this program's loop) on a paged KV cache
// takes each request with submit_prefilled (the buffer waits in the engine's
// staging area; `staging_full` is the back-pressure, and the request is
// offered again after the next step), imports the KV when the scheduler
// swaps the request in, and decodes with each request's chain until every
// request has its tokens; then it sends the outputs back.
//
// Meanwhile rank 0 runs every request alone in one process (prefill, then
// token-by-token decoding with the same chain, seed and stream, its own
// cache) and compares: the program exits with 1 when any request's tokens
// differ, 0 when all equal.
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
#include <llmkit/sched/request.hpp>
#include <llmkit/serve/serve.hpp>

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
namespace serve = llmkit::serve;

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
  std::string sampling = "greedy";
  bool verbose = false;
  bool fault = false;
};

/// One request with its first token and KV, as rank 0 ships it.
struct handoff {
  sched::request req;
  llmkit::token_id first_token = 0;
  std::vector<std::byte> kv;
};

/// `r` as the engine takes it: request i draws from stream i of the seed.
serve::generation_request as_generation(const sched::request& r) {
  serve::generation_request g;
  g.prompt = r.prompt;
  g.sampling = r.sampling;
  g.seed = r.seed;
  g.stream = static_cast<std::uint64_t>(r.id);
  g.stop = r.stop;
  return g;
}

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

std::vector<sched::request> make_requests(const options& o, std::size_t vocab) {
  std::mt19937_64 rng(o.seed);
  std::uniform_int_distribution<std::int64_t> len(o.prompt_min, o.prompt_max);
  std::uniform_int_distribution<llmkit::token_id> tok(3, static_cast<llmkit::token_id>(vocab) - 1);
  std::vector<sched::request> out;
  for (std::int64_t i = 0; i < o.n_requests; ++i) {
    sched::request r{.id = i, .prompt = {}, .sampling = o.sampling, .seed = o.seed,
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
  std::vector<std::span<const llmkit::token_id>> prompts;
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
      handoff h{reqs[q], serve::sample_first_token(as_generation(reqs[q]), logits.row(k)),
                cache.export_sequence(seqs[q])};
      cache.free(seqs[q]);
      ship(std::move(h));
    }
  }
}

// ---- decode worker --------------------------------------------------------

/// The serving engine on a paged cache with a staging area for received
/// KV buffers. Collects every request's tokens (the given first one
/// included) from its events.
class decode_worker {
 public:
  decode_worker(model::llama_model& m, llmkit::serial_executor& exec, const options& o)
      : cache_(m.kv_shape(), {.n_blocks = static_cast<std::size_t>(n_blocks(o))}),
        engine_(m, cache_, exec, options_of(o)) {}

  /// A received request as the engine takes it.
  serve::prefilled_request prefilled(handoff&& h) {
    const llmkit::request_id id = h.req.id;
    serve::generation_request r = as_generation(h.req);
    r.on_event = [this, id](const serve::stream_event& e) { on_event(id, e); };
    return {.request = std::move(r), .generated = {h.first_token}, .kv = std::move(h.kv)};
  }

  /// Offers a received request; false (`p` left as it was) when the
  /// staging area is full.
  bool offer(serve::prefilled_request& p) {
    const serve::submit_result r = engine_.submit_prefilled(p);
    if (r.status == serve::submit_status::staging_full) return false;
    LLMKIT_CHECK(r.accepted(), "decode worker: the engine refused a request: ", r.message);
    return true;
  }
  bool idle() const { return engine_.idle(); }
  void step() { engine_.step(); }

  /// Tokens of every finished request; a request that ended with an error
  /// has none (and its error is on stderr).
  const std::map<llmkit::request_id, std::vector<llmkit::token_id>>& outputs() const { return done_; }
  std::int64_t n_decoded() const { return static_cast<std::int64_t>(engine_.stats().n_generated_tokens); }
  std::int64_t n_preempted() const { return static_cast<std::int64_t>(engine_.stats().n_preemptions); }
  /// Offers refused because the staging area was full (retried after a step).
  std::int64_t n_staging_full() const { return static_cast<std::int64_t>(engine_.stats().n_rejected_staging_full); }

 private:
  static std::int64_t max_context(const options& o) { return o.prompt_max + o.max_new_tokens; }
  static std::int64_t n_blocks(const options& o) {
    return o.decode_blocks > 0 ? o.decode_blocks
                               : o.max_batch * sched::blocks_for(max_context(o), static_cast<std::int64_t>(block_size));
  }
  static serve::engine_options options_of(const options& o) {
    const std::int64_t ctx = max_context(o);
    return {.max_context = ctx,
            .policy = {.max_batch_seqs = o.max_batch, .max_step_tokens = std::max<std::int64_t>(o.max_batch, ctx)},
            .max_queued = static_cast<std::size_t>(o.n_requests),
            .staging_blocks = o.staging_seqs * sched::blocks_for(ctx, static_cast<std::int64_t>(block_size))};
  }

  void on_event(llmkit::request_id id, const serve::stream_event& e) {
    if (e.type == serve::event_type::token) {
      tokens_[id].push_back(e.token);
      return;
    }
    if (e.finish == serve::finish_kind::error)
      std::fprintf(stderr, "llmkit-disaggregated: request %lld failed on the decode worker: %s\n",
                   static_cast<long long>(id), e.error.c_str());
    else
      done_[id] = std::move(tokens_[id]);
    tokens_.erase(id);
  }

  cache_t cache_;
  serve::engine<model::llama_model, cache_t, llmkit::serial_executor> engine_;
  std::map<llmkit::request_id, std::vector<llmkit::token_id>> tokens_;  // of running requests
  std::map<llmkit::request_id, std::vector<llmkit::token_id>> done_;
};

// ---- the single-process reference ------------------------------------------

/// Runs `r` alone: prefill, then one token at a time, in its own cache,
/// each drawn with r's chain at step t of its stream.
std::vector<llmkit::token_id> solo(model::llama_model& m, llmkit::serial_executor& exec, const sched::request& r) {
  const std::size_t n = r.prompt.size() + r.stop.max_new_tokens;
  cache_t cache(m.kv_shape(), {.n_blocks = n / block_size + 2});
  const auto s = *cache.add_sequence();
  const serve::generation_request g = as_generation(r);
  const auto chain = llmkit::sampling::runtime_chain::parse(g.sampling);
  llmkit::sampling::candidates ws;
  model::batch_builder b;
  std::vector<llmkit::token_id> ctx = r.prompt, out;
  std::size_t done = 0;
  while (out.size() < r.stop.max_new_tokens) {
    b.clear();
    b.add(s, std::span<const llmkit::token_id>(ctx).subspan(done), static_cast<std::int32_t>(done));
    done = ctx.size();
    out.push_back(serve::sample_token(chain, g, ctx, m.forward(b.view(), cache, exec).row(0), ws).token);
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

handoff recv_handoff(const options& o) {
  std::int64_t header[5];
  MPI_Recv(header, 5, MPI_INT64_T, 0, tag_header, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  handoff h;
  h.req = {.id = header[0], .prompt = std::vector<llmkit::token_id>(static_cast<std::size_t>(header[1])),
           .sampling = o.sampling, .seed = o.seed, .stop = {.max_new_tokens = static_cast<std::size_t>(header[2])}};
  h.first_token = static_cast<llmkit::token_id>(header[3]);
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
  std::deque<serve::prefilled_request> pending;  // received, waiting for staging room
  std::int64_t received = 0;
  while (received < n || !pending.empty() || !d.idle()) {
    // Take what has arrived; block only when there is nothing else to do.
    while (received < n) {
      auto h = poll(wait_all || (d.idle() && pending.empty()));
      if (!h) break;
      pending.push_back(d.prefilled(std::move(*h)));
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
  cli.add_option("--model", o.model_path, "GGUF model (an architecture of model/architecture.hpp: llama, qwen2, qwen3, gemma2, gemma3, phi3, qwen3moe, gpt-oss)");
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
  cli.add_option("--seed", o.seed, "seed of the prompts and of every request's draws (request i: stream i)");
  cli.add_option("--sampling", o.sampling,
                 "sampling chain of every request (see docs/sampling.md), e.g. \"top_k(40);temperature(0.8);sample\"");
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
    (void)llmkit::sampling::runtime_chain::parse(o.sampling);  // a bad --sampling fails here, on every rank
    auto m = model::llama_model::load(o.model_path);
    LLMKIT_CHECK(static_cast<std::size_t>(o.prompt_max + o.max_new_tokens) <= m.config().context_length,
                 "--prompt-max + --tokens = ", o.prompt_max + o.max_new_tokens, " exceed the model's context of ",
                 m.config().context_length);
    llmkit::serial_executor exec;
    const auto reqs = make_requests(o, m.vocab_size());
    std::map<llmkit::request_id, std::vector<llmkit::token_id>> outputs;
    std::int64_t kv_bytes = 0;
    const double t0 = now();
    double t_prefill = 0, t_decode = 0;
    std::int64_t n_decoded = 0, n_preempted = 0, n_staging_full = 0;
    // Changes the last token of request 0 (--fault), when it has one.
    auto inject_fault = [&](std::map<llmkit::request_id, std::vector<llmkit::token_id>>& out) {
      if (const auto it = out.find(0); o.fault && it != out.end() && !it->second.empty()) it->second.back() ^= 1;
    };

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
      inject_fault(outputs);
      n_decoded = d.n_decoded();
      n_preempted = d.n_preempted();
      n_staging_full = d.n_staging_full();
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
        return recv_handoff(o);
      });
      t_decode = now() - t0;
      auto decoded = d.outputs();
      inject_fault(decoded);
      // One answer per request; one that failed here has no tokens (rank 0 reports it).
      for (std::int64_t id = 0; id < o.n_requests; ++id) {
        const auto it = decoded.find(id);
        std::vector<std::int64_t> msg{id, it == decoded.end() ? 0 : static_cast<std::int64_t>(it->second.size())};
        if (it != decoded.end()) msg.insert(msg.end(), it->second.begin(), it->second.end());
        MPI_Send(msg.data(), static_cast<int>(msg.size()), MPI_INT64_T, 0, tag_result, MPI_COMM_WORLD);
      }
      const double stats[4] = {t_decode, static_cast<double>(d.n_decoded()), static_cast<double>(d.n_preempted()),
                               static_cast<double>(d.n_staging_full())};
      MPI_Send(stats, 4, MPI_DOUBLE, 0, tag_result + 1, MPI_COMM_WORLD);
    }

    if (rank == 0) {
      // The single-process reference, while rank 1 decodes.
      std::vector<std::vector<llmkit::token_id>> expected;
      for (const auto& r : reqs) expected.push_back(solo(m, exec, r));
      if (size == 2) {
        for (std::int64_t i = 0; i < o.n_requests; ++i) {
          MPI_Status st;
          MPI_Probe(1, tag_result, MPI_COMM_WORLD, &st);
          int count = 0;
          MPI_Get_count(&st, MPI_INT64_T, &count);
          std::vector<std::int64_t> msg(static_cast<std::size_t>(count));
          MPI_Recv(msg.data(), count, MPI_INT64_T, 1, tag_result, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
          outputs[msg[0]] = std::vector<llmkit::token_id>(msg.begin() + 2, msg.end());
        }
        double stats[4];
        MPI_Recv(stats, 4, MPI_DOUBLE, 1, tag_result + 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        t_decode = stats[0];
        n_decoded = static_cast<std::int64_t>(stats[1]);
        n_preempted = static_cast<std::int64_t>(stats[2]);
        n_staging_full = static_cast<std::int64_t>(stats[3]);
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
                  "%lld KV bytes shipped, %lld tokens decoded in %.3f s on rank %d (%lld offers refused while the "
                  "staging area was full, %lld preemptions)\n",
                  size, static_cast<long long>(o.n_requests), static_cast<long long>(n_prompt), t_prefill,
                  static_cast<long long>(kv_bytes), static_cast<long long>(n_decoded), t_decode, size - 1,
                  static_cast<long long>(n_staging_full), static_cast<long long>(n_preempted));
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
