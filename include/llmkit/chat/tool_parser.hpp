// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/chat/tool_parser.hpp
/// Generated text back to calls: `tool_call_stream` splits an answer, piece
/// by piece, into content and calls as OpenAI streams them (a call's id and
/// name once the name is complete, then its arguments in chunks), and
/// `parse_tool_calls` does the same for a whole answer.
///
/// ```cpp
/// chat::tool_call_stream s(chat::tool_syntax::hermes, seed);
/// for (auto piece : pieces) {
///   auto d = s.feed(piece);   // d.content: text; d.calls[i]: {index, id, name, arguments chunk}
/// }
/// auto last = s.finish();
/// ```
///
/// What is a call (tool_grammar.hpp has the grammar of each syntax):
/// hermes: a `<tool_call>` block holding `{"name": N, "arguments": A}` (the
/// closing `</tool_call>` may be missing at the end); llama3_json: a
/// `{"name": N, "parameters": A}` object (a leading `<|python_tag|>` is
/// dropped); mistral: the array after `[TOOL_CALLS]` of `{"name": N,
/// "arguments": A, ...}` objects. Keys may come in any order, and other keys
/// are skipped. `arguments` is A's JSON text as generated, whitespace
/// trimmed, so what a stream sends adds up to what a whole parse returns.
/// Call ids are `make_tool_call_id(seed, index)` (a model's own `id` is
/// ignored: a stream announces the id before the model writes it).
/// harmony (gpt-oss) answers are split by harmony_call_stream
/// (harmony_parser.hpp), which also returns their reasoning.
///
/// Content is the text outside calls, without the whitespace that
/// separates calls from it or from each other and without trailing
/// whitespace; text that may be the start of a marker is held back until
/// it is known not to be one.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "llmkit/chat/harmony_parser.hpp"
#include "llmkit/chat/tools.hpp"
#include "llmkit/model/detail/python_strip.hpp"

namespace llmkit::chat {

namespace detail {

inline bool is_json_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

inline std::size_t skip_space(std::string_view s, std::size_t p) {
  while (p < s.size() && is_json_space(s[p])) ++p;
  return p;
}

inline constexpr std::size_t incomplete = static_cast<std::size_t>(-1);

// The end of the JSON value starting at s[p] (p after any whitespace), or
// `incomplete` when s ends first. Only the lexical structure is checked;
// malformed text is found later by json::parse.
inline std::size_t scan_value(std::string_view s, std::size_t p) {
  if (p >= s.size()) return incomplete;
  if (s[p] == '"') {
    for (std::size_t i = p + 1; i < s.size(); ++i) {
      if (s[i] == '\\') ++i;
      else if (s[i] == '"') return i + 1;
    }
    return incomplete;
  }
  if (s[p] == '{' || s[p] == '[') {
    std::size_t depth = 0;
    bool in_string = false;
    for (std::size_t i = p; i < s.size(); ++i) {
      const char c = s[i];
      if (in_string) {
        if (c == '\\') ++i;
        else if (c == '"') in_string = false;
      } else if (c == '"') {
        in_string = true;
      } else if (c == '{' || c == '[') {
        ++depth;
      } else if (c == '}' || c == ']') {
        if (--depth == 0) return i + 1;
      }
    }
    return incomplete;
  }
  std::size_t i = p;
  while (i < s.size() && !is_json_space(s[i]) && s[i] != ',' && s[i] != '}' && s[i] != ']') ++i;
  return i < s.size() ? i : incomplete;
}

// How far a call object starting at s[p] has been read.
struct call_scan {
  bool malformed = false;
  bool complete = false;          // its closing brace was read
  std::size_t end = 0;            // after the closing brace, when complete
  std::optional<std::string> name{};
  std::size_t args_begin = incomplete;  // where the arguments value starts, once its key was read
  std::size_t args_end = incomplete;    // its end, once complete
};

inline call_scan scan_call(std::string_view s, std::size_t p, std::string_view args_key) {
  call_scan r;
  p = skip_space(s, p);
  if (p >= s.size()) return r;
  if (s[p] != '{') return r.malformed = true, r;
  ++p;
  for (;;) {
    p = skip_space(s, p);
    if (p >= s.size()) return r;
    if (s[p] == '}') {
      r.complete = true;
      r.end = p + 1;
      return r;
    }
    if (s[p] == ',') {
      ++p;
      continue;
    }
    if (s[p] != '"') return r.malformed = true, r;
    const std::size_t key_end = scan_value(s, p);
    if (key_end == incomplete) return r;
    std::string key;
    try {
      key = json::parse(s.substr(p, key_end - p)).get<std::string>();
    } catch (const json::exception&) {
      return r.malformed = true, r;
    }
    p = skip_space(s, key_end);
    if (p >= s.size()) return r;
    if (s[p] != ':') return r.malformed = true, r;
    p = skip_space(s, p + 1);
    const bool is_args = key == args_key || key == "arguments" || key == "parameters";
    if (is_args && p < s.size()) r.args_begin = p;
    const std::size_t value_end = scan_value(s, p);
    if (value_end == incomplete) return r;
    if (is_args) r.args_end = value_end;
    if (key == "name") {
      try {
        const json v = json::parse(s.substr(p, value_end - p));
        if (!v.is_string()) return r.malformed = true, r;
        r.name = v.get<std::string>();
      } catch (const json::exception&) {
        return r.malformed = true, r;
      }
    }
    p = value_end;
  }
}

}  // namespace detail

/// See the file comment.
class tool_call_stream {
 public:
  /// @param seed  of the call ids (make_tool_call_id)
  explicit tool_call_stream(tool_syntax syntax, std::uint64_t seed = 0)
      : syntax_(syntax), seed_(seed), harmony_(seed) {}

  /// The content and call deltas that `text`, the next piece of the answer,
  /// makes known.
  answer_delta feed(std::string_view text) {
    if (syntax_ == tool_syntax::harmony) return harmony_.feed(text);
    buffer_ += text;
    answer_delta d;
    step(d, false);
    return d;
  }

  /// The rest, at the end of the answer: held-back text that turned out
  /// not to start a marker.
  answer_delta finish() {
    if (syntax_ == tool_syntax::harmony) return harmony_.finish();
    answer_delta d;
    step(d, true);
    return d;
  }

  /// The calls so far, arguments as sent.
  const std::vector<tool_call>& calls() const noexcept {
    return syntax_ == tool_syntax::harmony ? harmony_.calls() : calls_;
  }
  /// True unless the answer so far ends inside a call.
  bool calls_complete() const noexcept { return mode_ == mode::text || mode_ == mode::close; }
  /// True when text after an opening marker did not have the shape of a
  /// call (it went out as content).
  bool malformed() const noexcept { return malformed_; }

 private:
  enum class mode : std::uint8_t {
    text,   // content, looking for the opening marker
    array,  // mistral: inside [TOOL_CALLS] [ ... ]
    call,   // inside a call object
    close,  // hermes: after a call object, before </tool_call>
  };

  static constexpr std::string_view python_tag = "<|python_tag|>";
  static constexpr std::string_view hermes_close = "</tool_call>";

  std::string_view opener() const {
    switch (syntax_) {
      case tool_syntax::hermes: return "<tool_call>";
      case tool_syntax::llama3_json: return "{\"name\"";
      case tool_syntax::mistral: return "[TOOL_CALLS]";
      case tool_syntax::harmony: break;  // harmony_ parses those
    }
    return {};
  }
  std::string_view args_key() const { return syntax_ == tool_syntax::llama3_json ? "parameters" : "arguments"; }

  // Content [pos_, end): leading whitespace of a segment skipped, trailing
  // whitespace held back (dropped when a marker or the end follows).
  void emit_text(answer_delta& d, std::size_t end) {
    if (!segment_started_)
      while (pos_ < end && detail::is_json_space(buffer_[pos_])) ++pos_;
    std::size_t keep = end;
    while (keep > pos_ && detail::is_json_space(buffer_[keep - 1])) --keep;
    if (keep > pos_) {
      d.content.append(buffer_, pos_, keep - pos_);
      segment_started_ = true;
      pos_ = keep;
    }
  }

  // The first opener at or after pos_, or npos. llama3.1 opens a call with
  // `{` and then `"name"`, whitespace allowed between them; `partial` is set
  // to where such a `{` starts when the buffer ends before `"name"` does.
  std::size_t find_opener(std::size_t& partial) const {
    const std::string_view s = buffer_;
    if (syntax_ != tool_syntax::llama3_json) return s.find(opener(), pos_);
    constexpr std::string_view key = "\"name\"";
    for (std::size_t i = s.find('{', pos_); i != std::string::npos; i = s.find('{', i + 1)) {
      const std::string_view rest = s.substr(detail::skip_space(s, i + 1));
      if (rest.starts_with(key)) return i;
      if (rest.size() < key.size() && key.starts_with(rest)) {
        partial = i;
        return std::string::npos;
      }
    }
    return std::string::npos;
  }

  // The longest suffix of the buffer that is a proper prefix of `marker`.
  std::size_t partial_marker(std::string_view marker) const {
    const std::string_view s = buffer_;
    for (std::size_t n = std::min(marker.size() - 1, s.size() - pos_); n > 0; --n)
      if (s.substr(s.size() - n) == marker.substr(0, n)) return n;
    return 0;
  }

  void start_text(std::size_t p) {
    pos_ = p;
    mode_ = mode::text;
    segment_started_ = false;
  }

  // The text from `p` on does not have a call's shape: it is content.
  void fail(std::size_t p) {
    malformed_ = true;
    announced_ = false;
    start_text(p);
    segment_started_ = true;
  }

  void step(answer_delta& d, bool at_end) {
    const std::string_view s = buffer_;
    for (;;) {
      switch (mode_) {
        case mode::text: {
          const std::string_view open = opener();
          std::size_t partial = std::string::npos;  // where a possible opener starts, when s ends inside it
          const std::size_t at = find_opener(partial);
          const std::size_t tag = syntax_ == tool_syntax::llama3_json ? s.find(python_tag, pos_) : std::string::npos;
          if (tag != std::string::npos && tag < at) {
            emit_text(d, tag);
            start_text(tag + python_tag.size());
            continue;
          }
          if (at == std::string::npos) {
            std::size_t hold = partial != std::string::npos ? s.size() - partial : partial_marker(open);
            if (syntax_ == tool_syntax::llama3_json) hold = std::max(hold, partial_marker(python_tag));
            if (at_end) hold = 0;
            emit_text(d, s.size() - hold);
            return;
          }
          emit_text(d, at);
          if (syntax_ == tool_syntax::llama3_json) {
            pos_ = at;
            mode_ = mode::call;
          } else {
            pos_ = at + open.size();
            mode_ = syntax_ == tool_syntax::mistral ? mode::array : mode::call;
            array_open_ = false;
          }
          continue;
        }
        case mode::array: {
          const std::size_t p = detail::skip_space(s, pos_);
          if (p >= s.size()) return;
          if (!array_open_) {
            if (s[p] != '[') return fail(p);
            array_open_ = true;
            pos_ = p + 1;
          } else if (s[p] == ',') {
            pos_ = p + 1;
          } else if (s[p] == ']') {
            start_text(p + 1);
          } else {
            pos_ = p;
            mode_ = mode::call;
          }
          continue;
        }
        case mode::call: {
          const detail::call_scan c = detail::scan_call(s, pos_, args_key());
          if (c.malformed || (c.complete && !c.name)) return fail(pos_);
          if (c.name && !announced_) {
            calls_.push_back({make_tool_call_id(seed_, calls_.size()), *c.name, {}});
            d.calls.push_back({calls_.size() - 1, calls_.back().id, *c.name, {}});
            announced_ = true;
            args_sent_ = c.args_begin;
          }
          if (announced_ && c.args_begin != detail::incomplete) {
            if (args_sent_ == detail::incomplete) args_sent_ = c.args_begin;
            std::size_t until = c.args_end != detail::incomplete ? c.args_end : s.size();
            // Whitespace after an unfinished value may turn out to follow it.
            if (c.args_end == detail::incomplete)
              while (until > args_sent_ && detail::is_json_space(s[until - 1])) --until;
            if (until > args_sent_) {
              const std::string_view chunk = s.substr(args_sent_, until - args_sent_);
              calls_.back().arguments += chunk;
              if (!d.calls.empty() && d.calls.back().index == calls_.size() - 1) d.calls.back().arguments += chunk;
              else d.calls.push_back({calls_.size() - 1, {}, {}, std::string(chunk)});
              args_sent_ = until;
            }
          }
          if (!c.complete) return;
          announced_ = false;
          args_sent_ = detail::incomplete;
          pos_ = c.end;
          if (syntax_ == tool_syntax::mistral) mode_ = mode::array;
          else if (syntax_ == tool_syntax::hermes) mode_ = mode::close;
          else start_text(pos_);
          continue;
        }
        case mode::close: {
          const std::size_t p = detail::skip_space(s, pos_);
          const std::string_view rest = s.substr(p);
          if (!at_end && rest.size() < hermes_close.size() && hermes_close.starts_with(rest)) return;
          start_text(rest.starts_with(hermes_close) ? p + hermes_close.size() : p);
          continue;
        }
      }
    }
  }

  tool_syntax syntax_;
  std::uint64_t seed_;
  std::string buffer_{};
  std::size_t pos_ = 0;  // the buffer before pos_ has been handled
  mode mode_ = mode::text;
  std::size_t args_sent_ = detail::incomplete;  // arguments of the current call sent up to here
  bool announced_ = false;        // the current call's id and name were sent
  bool array_open_ = false;       // mistral: the '[' after [TOOL_CALLS] was read
  bool segment_started_ = false;  // the current content segment has had text other than whitespace
  bool malformed_ = false;
  std::vector<tool_call> calls_{};
  harmony_call_stream harmony_;
};

/// Splits a whole answer in `syntax` into content and calls, as
/// tool_call_stream would stream it. When the answer does not hold
/// well-formed calls (a call cut off, text after a marker that is not a
/// call, arguments that are not JSON), it is all content and there are no
/// calls. harmony answers are split by parse_harmony_answer.
inline parsed_answer parse_tool_calls(tool_syntax syntax, std::string_view text, std::uint64_t seed = 0) {
  if (syntax == tool_syntax::harmony) return parse_harmony_answer(text, seed);
  tool_call_stream stream(syntax, seed);
  parsed_answer out;
  out.content = stream.feed(text).content;
  const bool ended_in_call = !stream.calls_complete();
  out.content += stream.finish().content;
  bool ok = !ended_in_call && !stream.malformed();
  for (const auto& c : stream.calls()) {
    try {
      ok = ok && json::parse(c.arguments).is_object();
    } catch (const json::exception&) {
      ok = false;
    }
  }
  if (!ok) return {std::string(model::detail::python_strip(text)), {}};
  out.calls = stream.calls();
  return out;
}

}  // namespace llmkit::chat
