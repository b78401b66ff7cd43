// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/serve/detail/output.hpp
/// What an engine streams to a request's callback: a token event per
/// accepted token (with its text delta from the request's `text_stream`),
/// one finish event at the end, and the finish events of a request
/// rejected at submit; and the guarded call of the callback itself.

#include <cstddef>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "llmkit/core/ids.hpp"
#include "llmkit/model/tokenizer.hpp"
#include "llmkit/sampling/concepts.hpp"
#include "llmkit/sampling/logprobs.hpp"
#include "llmkit/serve/detail/live_set.hpp"
#include "llmkit/serve/request.hpp"
#include "llmkit/serve/text_stream.hpp"

namespace llmkit::serve::detail {

/// One token for a request: drawn from its row (with its log-probability
/// and `[k] top` alternatives), given with a prefilled request (token only),
/// or the error its chain raised on the row (then `sample` is empty).
struct row_result {
  sampling::sample_result sample;
  std::vector<sampling::token_logprob> top;
  std::string error;
};

/// Whether a token was sampled by the engine or given with a prefilled request.
enum class origin : bool { sampled, given };

/// Calls `r.on_event(e)` when set; false when it threw (the request is then
/// ended with an error by the caller).
inline bool deliver(const generation_request& r, const stream_event& e) {
  if (!r.on_event) return true;
  try {
    r.on_event(e);
    return true;
  } catch (...) {
    return false;
  }
}

/// Appends the token of `r` (no error) to request `l` (handle `h`): its
/// context and usage grow by one, its text stream decodes it with
/// `tokenizer` (none = no text). Returns the token event, moving `r.top`
/// into it; `stop_string` tells whether the text completed a stop string.
inline stream_event append_token(request_id h, live_request& l, row_result& r, origin from,
                                 const model::tokenizer* tokenizer, bool& stop_string) {
  const token_id token = r.sample.token;
  l.context.push_back(token);
  ++l.usage.n_generated_tokens;
  stream_event e;
  e.handle = h;
  e.index = l.index;
  e.type = event_type::token;
  e.prefilled = from == origin::given;
  e.token = token;
  e.logprob = r.sample.logprob;
  e.top_logprobs = std::move(r.top);
  stop_string = false;
  if (tokenizer != nullptr) {
    text_stream::delta d = l.text.push(*tokenizer, token, l.request.stop);
    e.text = std::move(d.text);
    stop_string = d.stop_string;
  }
  return e;
}

/// The finish event of request `l` (handle `h`): the text its stream held
/// back (none after an error or a stop string) and its usage.
inline stream_event finish_event(request_id h, live_request& l, finish_kind kind, std::optional<finish_reason> reason,
                                 std::string error) {
  stream_event e;
  e.handle = h;
  e.index = l.index;
  e.type = event_type::finish;
  e.finish = kind;
  e.reason = reason;
  e.error = std::move(error);
  if (kind != finish_kind::error && reason != finish_reason::stop_string) e.text = l.text.flush();
  e.usage = l.usage;
  return e;
}

/// Sends the finish events (kind error, `out.message`) of a request
/// rejected by submit: one per sample, handles `out.handle` .. +
/// `n_samples` - 1.
inline void send_rejection(const generation_request& request, const submit_result& out, std::size_t n_samples) {
  for (std::size_t i = 0; i < n_samples; ++i) {
    stream_event e;
    e.handle = out.handle + static_cast<request_id>(i);
    e.index = i;
    e.type = event_type::finish;
    e.finish = finish_kind::error;
    e.error = out.message;
    e.usage.n_prompt_tokens = request.prompt.size();
    deliver(request, e);  // the request is over either way
  }
}

}  // namespace llmkit::serve::detail
