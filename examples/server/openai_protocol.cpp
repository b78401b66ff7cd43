// SPDX-License-Identifier: MIT
/// @file examples/server/openai_protocol.cpp
/// openai_protocol.hpp on nlohmann/json: the one translation unit of
/// llmkit-server and its tests that parses and writes the OpenAI JSON.

#include "openai_protocol.hpp"

#include <nlohmann/json.hpp>

#include <llmkit/core/error.hpp>
#include <llmkit/grammar/gbnf.hpp>
#include <llmkit/grammar/json_schema.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <exception>
#include <limits>
#include <system_error>
#include <utility>

namespace llmkit_server {

namespace {

using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;

// Dumps as UTF-8; bytes that are not valid UTF-8 (a token that ends inside
// a character) become U+FFFD instead of throwing.
template <class J>
std::string dump(const J& j) {
  return j.dump(-1, ' ', false, J::error_handler_t::replace);
}

// The first `max_bytes` of `text` (cut before a UTF-8 character that does
// not fit), then "..." when anything was cut.
std::string cut(std::string_view text, std::size_t max_bytes = max_quoted_bytes) {
  if (text.size() <= max_bytes) return std::string(text);
  std::size_t n = max_bytes;
  while (n > 0 && (static_cast<unsigned char>(text[n]) & 0xC0u) == 0x80u) --n;
  return std::string(text.substr(0, n)) + "...";
}

// Writes JSON text of `v` to `out` until `out` holds `budget` bytes: strings
// are cut first, containers stop at the budget. The recursion is bounded
// by `budget` (each level writes a bracket) as well as by max_json_depth.
void write_bounded(const json& v, std::string& out, std::size_t budget) {
  if (out.size() >= budget) return;
  switch (v.type()) {
    case json::value_t::string: out += dump(json(cut(v.get_ref<const std::string&>(), budget))); return;
    case json::value_t::array: {
      out += '[';
      for (std::size_t i = 0; i < v.size() && out.size() < budget; ++i) {
        if (i > 0) out += ',';
        write_bounded(v[i], out, budget);
      }
      out += ']';
      return;
    }
    case json::value_t::object: {
      out += '{';
      bool first = true;
      for (auto it = v.begin(); it != v.end() && out.size() < budget; ++it) {
        if (!first) out += ',';
        first = false;
        out += dump(json(cut(it.key(), budget)));
        out += ':';
        write_bounded(it.value(), out, budget);
      }
      out += '}';
      return;
    }
    default: out += dump(v); return;
  }
}

// A value quoted in an error message: its JSON text, at most
// max_quoted_bytes of it (then "..."), whatever the value's size.
std::string quote(const json& v) {
  std::string text;
  write_bounded(v, text, max_quoted_bytes + 1);
  return cut(text);
}

// A key or other client text quoted in an error message or a `param`.
std::string quote_text(std::string_view text) { return dump(json(cut(text))); }

// Shortest text that reads back as the same float (for the chain string).
std::string format_float(float v) {
  char buf[32];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  return ec == std::errc() ? std::string(buf, end) : std::to_string(v);
}

// Shortest fixed-point text of `v` (Prometheus values and bucket bounds, error ranges).
std::string format_double(double v) {
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (std::isnan(v)) return "NaN";
  if (std::fabs(v) >= 1e15) return std::to_string(v);
  char buf[64];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::fixed);
  return ec == std::errc() ? std::string(buf, end) : std::to_string(v);
}

// Thrown inside the parser, turned into its 400 answer by parse_request.
struct rejection {
  api_error error;
};

[[noreturn]] void reject(std::string param, std::string message) {
  throw rejection{invalid_request(std::move(param), std::move(message))};
}

const char* type_name(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned: return "an integer";
    case json::value_t::number_float: return "a number";
    case json::value_t::string: return "a string";
    case json::value_t::array: return "an array";
    case json::value_t::object: return "an object";
    default: return "a value of another type";
  }
}

[[noreturn]] void wrong_type(const std::string& param, const char* expected, const json& v) {
  reject(param, "'" + param + "' must be " + expected + ", got " + type_name(v) + " (" + quote(v) + ")");
}

// The field `name` of `body`, or nullptr when absent or null (OpenAI treats
// null as "use the default").
const json* field(const json& body, const char* name) {
  const auto it = body.find(name);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

// Range endpoints: closed or open.
enum class bound : std::uint8_t { closed, open };

std::string range_text(double lo, bound lo_kind, double hi, bound hi_kind) {
  return (lo_kind == bound::closed ? "[" : "(") + format_double(lo) + ", " + format_double(hi) +
         (hi_kind == bound::closed ? "]" : ")");
}

// `x` as the float the sampler computes with, refusing a nonzero value that
// float rounds to 0 or to a subnormal (slow, and a divisor that overflows).
float to_sampler_float(const std::string& param, double x, const json& v) {
  const auto f = static_cast<float>(x);
  if (x != 0.0 && !std::isnormal(f))
    reject(param, "'" + param + "' is too close to 0 to compute with (a nonzero value must be at least 1.2e-38 "
                  "in magnitude), got " + quote(v));
  return f;
}

// A number of `body` in the range, as the sampler's float.
std::optional<float> number_field(const json& body, const char* name, double lo, bound lo_kind, double hi,
                                  bound hi_kind) {
  const json* v = field(body, name);
  if (!v) return std::nullopt;
  if (!v->is_number()) wrong_type(name, "a number", *v);
  const double x = v->get<double>();
  const bool lo_ok = lo_kind == bound::closed ? x >= lo : x > lo;
  const bool hi_ok = hi_kind == bound::closed ? x <= hi : x < hi;
  if (!std::isfinite(x) || !lo_ok || !hi_ok)
    reject(name, std::string("'") + name + "' must be in " + range_text(lo, lo_kind, hi, hi_kind) + ", got " +
                     quote(*v));
  return to_sampler_float(name, x, *v);
}

std::optional<std::int64_t> integer_field(const json& body, const char* name, std::int64_t lo, std::int64_t hi) {
  const json* v = field(body, name);
  if (!v) return std::nullopt;
  if (!v->is_number_integer()) wrong_type(name, "an integer", *v);
  // JSON text parses non-negative integers as unsigned: compare those as unsigned (they may exceed int64).
  const bool fits = v->is_number_unsigned()
                        ? v->get<std::uint64_t>() <= static_cast<std::uint64_t>(hi) &&
                              (lo <= 0 || v->get<std::uint64_t>() >= static_cast<std::uint64_t>(lo))
                        : v->get<std::int64_t>() >= lo && v->get<std::int64_t>() <= hi;
  if (!fits)
    reject(name, std::string("'") + name + "' must be an integer in [" + std::to_string(lo) + ", " +
                     std::to_string(hi) + "], got " + quote(*v));
  return v->is_number_unsigned() ? static_cast<std::int64_t>(v->get<std::uint64_t>()) : v->get<std::int64_t>();
}

std::optional<bool> bool_field(const json& body, const char* name) {
  const json* v = field(body, name);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) wrong_type(name, "a boolean", *v);
  return v->get<bool>();
}

constexpr std::int64_t max_int64 = std::numeric_limits<std::int64_t>::max();

token_id token_in_vocab(const json& v, const std::string& param, const model_limits& model) {
  if (!v.is_number_integer()) wrong_type(param, "an integer token id", v);
  const bool ok = v.is_number_unsigned() ? v.get<std::uint64_t>() < model.n_vocab
                                         : v.get<std::int64_t>() >= 0 &&
                                               static_cast<std::uint64_t>(v.get<std::int64_t>()) < model.n_vocab;
  if (!ok)
    reject(param, "'" + param + "' must be a token id in [0, " + std::to_string(model.n_vocab) + "), got " + quote(v));
  return static_cast<token_id>(v.get<std::int64_t>());
}

void parse_prompt(const json& body, generation_request& r, const model_limits& model) {
  const json* p = field(body, "prompt");
  if (!p) reject("prompt", "'prompt' is required (a string, or an array of token ids)");
  if (p->is_string()) {
    r.prompt_text = p->get<std::string>();
    return;
  }
  if (!p->is_array()) wrong_type("prompt", "a string or an array of token ids", *p);
  if (p->empty()) reject("prompt", "'prompt' is an empty array");
  const json& first = p->front();
  if (first.is_number()) {
    r.prompt_is_tokens = true;
    r.prompt_tokens.reserve(p->size());
    for (std::size_t i = 0; i < p->size(); ++i)
      r.prompt_tokens.push_back(token_in_vocab((*p)[i], "prompt[" + std::to_string(i) + "]", model));
    return;
  }
  if (p->size() > 1)
    reject("prompt", "'prompt' holds " + std::to_string(p->size()) +
                         " prompts; this server takes one prompt per request (send one request each)");
  if (first.is_string()) {
    r.prompt_text = first.get<std::string>();
  } else if (first.is_array()) {
    if (first.empty()) reject("prompt", "'prompt[0]' is an empty array");
    for (std::size_t i = 0; i < first.size(); ++i)
      r.prompt_tokens.push_back(token_in_vocab(first[i], "prompt[0][" + std::to_string(i) + "]", model));
    r.prompt_is_tokens = true;
  } else {
    wrong_type("prompt[0]", "a string or an array of token ids", first);
  }
}

// A message's content: a string, or an array of {"type": "text", "text": ...} parts.
std::string message_content(const json& m, const std::string& where) {
  const json* c = field(m, "content");
  if (!c) return {};
  if (c->is_string()) return c->get<std::string>();
  if (!c->is_array()) wrong_type(where + ".content", "a string or an array of text parts", *c);
  std::string text;
  for (std::size_t i = 0; i < c->size(); ++i) {
    const json& part = (*c)[i];
    const std::string pw = where + ".content[" + std::to_string(i) + "]";
    if (!part.is_object()) wrong_type(pw, "an object", part);
    const json* type = field(part, "type");
    if (!type || !type->is_string() || type->get<std::string>() != "text")
      reject(pw + ".type", "'" + pw + ".type' must be \"text\" (only text parts are supported), got " +
                               (type ? quote(*type) : std::string("nothing")));
    const json* t = field(part, "text");
    if (!t) reject(pw + ".text", "'" + pw + ".text' is required");
    if (!t->is_string()) wrong_type(pw + ".text", "a string", *t);
    text += t->get<std::string>();
  }
  return text;
}

// A tool field's error (tool_calls.hpp): its message starts with the field.
[[noreturn]] void reject_tool_error(const llmkit::error& e) {
  const std::string what = e.what();
  const std::size_t end = what.find_first_of(".[:");
  reject(what.substr(0, end == std::string::npos ? 0 : end), cut(what, 512));
}

void parse_messages(const json& body, generation_request& r) {
  const json* ms = field(body, "messages");
  if (!ms) reject("messages", "'messages' is required (an array of {\"role\", \"content\"})");
  if (!ms->is_array()) wrong_type("messages", "an array", *ms);
  if (ms->empty()) reject("messages", "'messages' is an empty array");
  for (std::size_t i = 0; i < ms->size(); ++i) {
    const json& m = (*ms)[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) wrong_type(where, "an object", m);
    const json* role = field(m, "role");
    if (!role) reject(where + ".role", "'" + where + ".role' is required");
    if (!role->is_string()) wrong_type(where + ".role", "a string", *role);
    std::string name = role->get<std::string>();
    if (name == "developer") name = "system";
    if (name != "system" && name != "user" && name != "assistant" && name != "tool")
      reject(where + ".role", "'" + where + ".role' must be \"system\", \"user\", \"assistant\" or \"tool\", got " +
                                  quote(*role));
    chat_message message{.role = name, .content = message_content(m, where)};
    // An earlier answer's reasoning, as this server returns it; the template decides whether it is kept.
    if (const json* r = field(m, "reasoning_content"); r && !r->is_null()) {
      if (name != "assistant")
        reject(where + ".reasoning_content", "'" + where + ".reasoning_content' is only for assistant messages");
      if (!r->is_string()) wrong_type(where + ".reasoning_content", "a string", *r);
      message.reasoning = r->get<std::string>();
    }
    try {
      auto extra = parse_message_tool_fields(m, name, where);
      message.tool_calls = std::move(extra.tool_calls);
      message.tool_call_id = std::move(extra.tool_call_id);
    } catch (const llmkit::error& e) {
      reject_tool_error(e);
    }
    r.messages.push_back(std::move(message));
  }
}

void parse_stop(const json& body, generation_request& r, const request_limits& limits) {
  const json* s = field(body, "stop");
  if (!s) return;
  auto add = [&](const json& v, const std::string& where) {
    if (!v.is_string()) wrong_type(where, "a string", v);
    std::string text = v.get<std::string>();
    if (text.empty()) reject(where, "'" + where + "' is an empty string");
    if (text.size() > limits.max_stop_bytes)
      reject(where, "'" + where + "' is " + std::to_string(text.size()) + " bytes long; at most " +
                        std::to_string(limits.max_stop_bytes) + " are allowed");
    r.stop.push_back(std::move(text));
  };
  if (s->is_string()) {
    add(*s, "stop");
    return;
  }
  if (!s->is_array()) wrong_type("stop", "a string or an array of strings", *s);
  if (s->size() > limits.max_stop)
    reject("stop", "'stop' holds " + std::to_string(s->size()) + " strings; at most " +
                       std::to_string(limits.max_stop) + " are allowed");
  for (std::size_t i = 0; i < s->size(); ++i) add((*s)[i], "stop[" + std::to_string(i) + "]");
}

void parse_logit_bias(const json& body, sampling_params& p, const model_limits& model, const request_limits& limits) {
  const json* lb = field(body, "logit_bias");
  if (!lb) return;
  if (!lb->is_object()) wrong_type("logit_bias", "an object of token id -> bias", *lb);
  if (lb->size() > limits.max_logit_bias)
    reject("logit_bias", "'logit_bias' holds " + std::to_string(lb->size()) + " entries; at most " +
                             std::to_string(limits.max_logit_bias) + " are allowed");
  for (const auto& [key, value] : lb->items()) {
    std::int64_t token = -1;
    const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), token);
    if (key.empty() || ec != std::errc() || end != key.data() + key.size() || token < 0 ||
        static_cast<std::uint64_t>(token) >= model.n_vocab)
      reject("logit_bias", "'logit_bias' keys must be token ids in [0, " + std::to_string(model.n_vocab) + "), got " +
                               quote_text(key));
    const std::string where = "logit_bias[\"" + std::to_string(token) + "\"]";  // not the key: "007" is 7
    if (!value.is_number()) wrong_type(where, "a number", value);
    const double bias = value.get<double>();
    if (!(bias >= -100.0 && bias <= 100.0))
      reject(where, "'" + where + "' must be in [-100, 100], got " + quote(value));
    p.logit_bias.emplace_back(static_cast<token_id>(token), to_sampler_float(where, bias, value));
  }
}

void parse_unsupported(const json& body, api_kind kind) {
  if (kind == api_kind::completions) {
    if (const auto echo = bool_field(body, "echo"); echo && *echo)
      reject("echo", "'echo': true is not supported");
    if (const json* suffix = field(body, "suffix"); suffix && !(suffix->is_string() && suffix->get<std::string>().empty()))
      reject("suffix", "'suffix' is not supported");
  } else {
  }
}

// --- structured outputs ---

// The GBNF limits of `limits` as the grammar parser takes them.
llmkit::grammar::compile_limits gbnf_limits(const grammar_limits& limits) {
  return {.max_rules = limits.max_rules,
          .max_elements = limits.max_elements,
          .max_repetition = static_cast<std::uint32_t>(std::min<std::size_t>(limits.max_repetition, std::numeric_limits<std::uint32_t>::max())),
          .max_source_bytes = limits.max_gbnf_bytes,
          .max_nesting = limits.max_nesting};
}

// Checks GBNF `text` (from field `param`) against `limits` by parsing it:
// a 400 naming the line and column, or the limit, otherwise.
grammar_request checked_gbnf(std::string text, std::string param, const grammar_limits& limits) {
  if (text.size() > limits.max_gbnf_bytes)
    reject(param, "'" + param + "' gives a grammar of " + std::to_string(text.size()) + " bytes; at most " +
                      std::to_string(limits.max_gbnf_bytes) + " are allowed");
  try {
    (void)llmkit::grammar::parse_gbnf(text, gbnf_limits(limits));
  } catch (const llmkit::error& e) {
    reject(param, "'" + param + "': " + cut(e.what(), 400));
  }
  return {std::move(text), std::move(param)};
}

// The grammar of JSON Schema `schema` (field `param`): keywords it cannot
// enforce are a 400 when `strict`, ignored otherwise; where the schema is
// wrong is named by its JSON pointer.
grammar_request schema_grammar(const ordered_json& schema, bool strict, std::string param,
                               const grammar_limits& limits) {
  if (!schema.is_object()) reject(param, "'" + param + "' must be a JSON Schema object, got " + quote(json(schema)));
  std::string gbnf;
  try {
    gbnf = llmkit::grammar::schema_to_gbnf(
        schema, {.strict = strict, .max_rules = limits.max_rules, .max_depth = limits.max_schema_depth});
  } catch (const llmkit::error& e) {
    reject(param, "'" + param + "': " + cut(e.what(), 400));
  }
  return checked_gbnf(std::move(gbnf), std::move(param), limits);
}

// `response_format` (both APIs): {"type": "text"} (nothing), {"type":
// "json_object"} (any JSON object), or {"type": "json_schema", "json_schema":
// {"name", "schema", "strict"}}. `ordered` is the same body with its keys in
// their order (a schema's properties are generated in it).
std::optional<grammar_request> parse_response_format(const json& body, const ordered_json& ordered,
                                                     const grammar_limits& limits) {
  const json* rf = field(body, "response_format");
  if (rf == nullptr) return std::nullopt;
  if (!rf->is_object()) wrong_type("response_format", "an object", *rf);
  const json* type = field(*rf, "type");
  if (type == nullptr) reject("response_format.type", "'response_format.type' is required");
  if (!type->is_string()) wrong_type("response_format.type", "a string", *type);
  const std::string t = type->get<std::string>();
  if (t == "text") return std::nullopt;
  if (t == "json_object")
    return checked_gbnf(llmkit::grammar::json_object_gbnf(), "response_format", limits);
  if (t != "json_schema")
    reject("response_format.type",
           "'response_format.type' must be \"text\", \"json_object\" or \"json_schema\", got " + quote(*type));
  const json* js = field(*rf, "json_schema");
  if (js == nullptr) reject("response_format.json_schema", "'response_format.json_schema' is required with type \"json_schema\"");
  if (!js->is_object()) wrong_type("response_format.json_schema", "an object", *js);
  if (const json* name = field(*js, "name"); name && !name->is_string())
    wrong_type("response_format.json_schema.name", "a string", *name);
  const auto strict = bool_field(*js, "strict");
  if (field(*js, "schema") == nullptr)
    reject("response_format.json_schema.schema", "'response_format.json_schema.schema' is required");
  return schema_grammar(ordered.at("response_format").at("json_schema").at("schema"), strict.value_or(false),
                        "response_format.json_schema.schema", limits);
}

// The grammar a request body (`body`, parsed from `body_text`) asks for,
// from `response_format`, llama-server's `grammar` (GBNF) or its
// `json_schema`; at most one of them.
std::optional<grammar_request> grammar_from_request(const json& body, std::string_view body_text,
                                                    const grammar_limits& limits) {
  const bool any = field(body, "response_format") || field(body, "grammar") || field(body, "json_schema");
  if (!any) return std::nullopt;
  const ordered_json ordered = ordered_json::parse(body_text.begin(), body_text.end());
  std::optional<grammar_request> out = parse_response_format(body, ordered, limits);
  auto one_only = [&](const char* name) {
    if (out) reject(name, std::string("'") + name + "' and '" + out->param +
                              "' both constrain the output; send one of response_format, grammar, json_schema");
  };
  if (const json* g = field(body, "grammar")) {
    if (!g->is_string()) wrong_type("grammar", "a string (GBNF)", *g);
    one_only("grammar");
    out = checked_gbnf(g->get<std::string>(), "grammar", limits);
  }
  if (field(body, "json_schema") != nullptr) {
    one_only("json_schema");
    out = schema_grammar(ordered.at("json_schema"), false, "json_schema", limits);
  }
  return out;
}

// `use_beam_search: true` (vLLM's shape): `best_of` beams (default n, at
// least n), `length_penalty`; never streamed, and no field that only
// sampling reads (beam search scores the model's own log-probabilities).
void parse_beam(const json& body, generation_request& r, std::optional<std::int64_t> best_of) {
  beam_params b{.width = best_of ? static_cast<std::size_t>(*best_of) : r.n};
  if (b.width < r.n)
    reject("best_of", "'best_of' (the beam width) must be at least 'n' = " + std::to_string(r.n) + ", got " +
                          std::to_string(b.width));
  if (const auto v = number_field(body, "length_penalty", -10, bound::closed, 10, bound::closed)) b.length_penalty = *v;
  if (r.stream)
    reject("stream", "beam search cannot be streamed: its hypotheses are known only when the search ends; send "
                     "'stream': false");
  const sampling_params& p = r.sampling;
  const sampling_params neutral{};
  auto sampling_only = [](const char* name) {
    reject(name, std::string("'") + name + "' is a sampling parameter; 'use_beam_search' takes none");
  };
  if (const json* t = field(body, "temperature"); t != nullptr && p.temperature != 0.0f)
    reject("temperature", "'temperature' must be 0 or absent with 'use_beam_search', got " + quote(*t));
  if (p.top_p != neutral.top_p) sampling_only("top_p");
  if (p.top_k != neutral.top_k) sampling_only("top_k");
  if (p.min_p != neutral.min_p) sampling_only("min_p");
  if (p.typical_p != neutral.typical_p) sampling_only("typical_p");
  if (p.repetition_penalty != neutral.repetition_penalty) sampling_only("repetition_penalty");
  if (p.frequency_penalty != neutral.frequency_penalty) sampling_only("frequency_penalty");
  if (p.presence_penalty != neutral.presence_penalty) sampling_only("presence_penalty");
  if (!p.logit_bias.empty()) sampling_only("logit_bias");
  if (r.logprobs) reject("logprobs", "'logprobs' is not supported with 'use_beam_search'");
  if (!r.stop.empty())
    reject("stop", "'stop' strings are not supported with 'use_beam_search' (hypotheses end on the model's EOS)");
  r.beam = b;
}

// Where a body nests deeper than allowed: the byte offset, and the
// top-level field it happens in (empty when outside any).
struct too_deep {
  std::size_t offset = 0;
  std::string_view field{};
};

// Scans JSON text without parsing it: the depth of [ and { outside
// strings (escapes skipped), and the key of the top-level member being
// read. Malformed text is scanned as well as it goes; the parser refuses it later.
std::optional<too_deep> find_too_deep(std::string_view text, std::size_t max_depth) {
  std::size_t depth = 0;
  std::size_t string_start = 0;           // of the last string read (after its quote)
  std::string_view last_string{}, key{};  // at depth 1
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '"') {
      string_start = ++i;
      while (i < text.size() && text[i] != '"') i += text[i] == '\\' ? 2 : 1;
      if (depth == 1) last_string = text.substr(string_start, std::min(i, text.size()) - string_start);
    } else if (c == ':') {
      if (depth == 1) key = last_string;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) return too_deep{.offset = i, .field = key};
    } else if (c == ']' || c == '}') {
      if (depth > 0) --depth;
      if (depth <= 1) key = {};
    }
  }
  return std::nullopt;
}

// A request body as a JSON object, after the depth pre-scan (every route's first check).
json parse_object(std::string_view text) {
  if (const auto deep = find_too_deep(text, max_json_depth)) {
    const std::string in = deep->field.empty() ? std::string() : " (in " + quote_text(deep->field) + ")";
    reject(cut(deep->field), "the request body nests arrays and objects more than " + std::to_string(max_json_depth) +
                                 " levels deep" + in + " at byte " + std::to_string(deep->offset) + "; at most " +
                                 std::to_string(max_json_depth) + " levels are allowed");
  }
  json body = json::parse(text.begin(), text.end(), nullptr, false);
  if (body.is_discarded()) reject("", "the request body is not valid JSON");
  if (!body.is_object()) reject("", std::string("the request body must be a JSON object, got ") + type_name(body));
  return body;
}

// Runs a parser, turning its rejection (or a JSON accessor's exception) into the 400.
template <class Parse>
auto parse_or_reject(Parse&& parse) -> std::variant<decltype(parse()), api_error> {
  try {
    return parse();
  } catch (const rejection& r) {
    return r.error;
  } catch (const std::exception& e) {
    // A JSON accessor that disagrees with a check above: still the client's
    // request that is wrong, not the server.
    return invalid_request("", "the request could not be read: " + cut(e.what(), 256));
  }
}

generation_request parse_body(api_kind kind, std::string_view text, const model_limits& model,
                              const request_limits& limits) {
  const json body = parse_object(text);
  generation_request r;
  r.kind = kind;
  if (const json* m = field(body, "model")) {
    if (m->is_string()) r.model = m->get<std::string>();
  }
  if (kind == api_kind::completions) parse_prompt(body, r, model);
  else parse_messages(body, r);
  parse_unsupported(body, kind);
  if (kind == api_kind::chat_completions) {
    try {
      r.tools = parse_tool_request(text);
    } catch (const llmkit::error& e) {
      reject_tool_error(e);
    }
  }

  const auto ctx = static_cast<std::int64_t>(model.n_ctx);
  if (const auto m = integer_field(body, "max_tokens", 1, ctx)) r.max_tokens = static_cast<std::size_t>(*m);
  if (kind == api_kind::chat_completions)
    if (const auto m = integer_field(body, "max_completion_tokens", 1, ctx)) r.max_tokens = static_cast<std::size_t>(*m);

  // Ranges: OpenAI's, and where a value in range could still overflow a
  // logit (a divisor near 0), a floor that keeps every factor at most 100.
  sampling_params& p = r.sampling;
  if (const json* t = field(body, "temperature"); t && t->is_number()) {
    const double x = t->get<double>();
    if (x > 0.0 && x < min_temperature)
      reject("temperature", "'temperature' must be 0 (greedy) or in [" + format_double(min_temperature) +
                                ", 2] (logits are divided by it), got " + quote(*t));
  }
  if (const auto v = number_field(body, "temperature", 0, bound::closed, 2, bound::closed)) p.temperature = *v;
  if (const auto v = number_field(body, "top_p", 0, bound::open, 1, bound::closed)) p.top_p = *v;
  if (const auto v = integer_field(body, "top_k", 0, max_int64)) p.top_k = *v;
  if (const auto v = number_field(body, "min_p", 0, bound::closed, 1, bound::closed)) p.min_p = *v;
  if (const auto v = number_field(body, "typical_p", 0, bound::open, 1, bound::closed)) p.typical_p = *v;
  if (const auto v = number_field(body, "repetition_penalty", min_repetition_penalty, bound::closed, 10, bound::closed))
    p.repetition_penalty = *v;
  if (const auto v = number_field(body, "frequency_penalty", -2, bound::closed, 2, bound::closed))
    p.frequency_penalty = *v;
  if (const auto v = number_field(body, "presence_penalty", -2, bound::closed, 2, bound::closed))
    p.presence_penalty = *v;
  if (const auto v = integer_field(body, "repeat_last_n", -1, ctx)) p.penalty_last_n = *v;
  parse_logit_bias(body, p, model, limits);
  if (const json* s = field(body, "seed")) {
    if (!s->is_number_integer()) wrong_type("seed", "an integer", *s);
    p.seed = s->is_number_unsigned() ? s->get<std::uint64_t>() : static_cast<std::uint64_t>(s->get<std::int64_t>());
  }

  parse_stop(body, r, limits);
  if (const auto n = integer_field(body, "n", 1, static_cast<std::int64_t>(limits.max_n)))
    r.n = static_cast<std::size_t>(*n);
  const auto best_of = integer_field(body, "best_of", 1, static_cast<std::int64_t>(limits.max_n));
  const bool beam = bool_field(body, "use_beam_search").value_or(false);
  if (!beam && kind == api_kind::completions && best_of && static_cast<std::size_t>(*best_of) != r.n)
    reject("best_of", "'best_of' different from 'n' is not supported without 'use_beam_search', got " +
                          std::to_string(*best_of));
  if (!beam && field(body, "length_penalty") != nullptr)
    reject("length_penalty", "'length_penalty' needs 'use_beam_search': true");
  if (const auto s = bool_field(body, "stream")) r.stream = *s;
  if (const json* kw = field(body, "chat_template_kwargs"); kw && kind == api_kind::chat_completions) {
    if (!kw->is_object()) wrong_type("chat_template_kwargs", "an object", *kw);
    if (const json* t = field(*kw, "enable_thinking")) {
      if (!t->is_boolean()) wrong_type("chat_template_kwargs.enable_thinking", "a boolean", *t);
      r.enable_thinking = t->get<bool>();
    }
  }
  if (kind == api_kind::chat_completions) {
    // chat_template_kwargs.reasoning_effort (vLLM's and llama-server's way to gpt-oss's template) wins over
    // the top-level reasoning_effort of OpenAI's API.
    const json* kw = field(body, "chat_template_kwargs");
    for (const auto& [param, value] : {std::pair{std::string("chat_template_kwargs.reasoning_effort"),
                                                 kw ? field(*kw, "reasoning_effort") : nullptr},
                                       std::pair{std::string("reasoning_effort"), field(body, "reasoning_effort")}}) {
      if (value == nullptr) continue;
      if (!value->is_string()) wrong_type(param, "a string", *value);
      const std::string effort = value->get<std::string>();
      if (effort != "low" && effort != "medium" && effort != "high")
        reject(param, "'" + param + "' must be \"low\", \"medium\" or \"high\", got \"" + effort.substr(0, 32) + "\"");
      r.reasoning_effort = effort;
      break;
    }
  }
  if (const json* so = field(body, "stream_options")) {
    if (!so->is_object()) wrong_type("stream_options", "an object", *so);
    if (const auto u = bool_field(*so, "include_usage")) r.include_usage = *u;
  }

  if (const auto sp = bool_field(body, "speculative")) r.speculative = *sp;
  if (const auto k = integer_field(body, "speculative.n_max", 1, static_cast<std::int64_t>(limits.max_draft_tokens)))
    r.speculative_n_max = static_cast<std::size_t>(*k);

  if (kind == api_kind::completions) {
    if (const auto k = integer_field(body, "logprobs", 0, static_cast<std::int64_t>(limits.max_logprobs)))
      r.logprobs = static_cast<std::size_t>(*k);
  } else {
    const bool want = bool_field(body, "logprobs").value_or(false);
    const auto top = integer_field(body, "top_logprobs", 0, static_cast<std::int64_t>(limits.max_top_logprobs));
    if (top && !want) reject("top_logprobs", "'top_logprobs' needs 'logprobs': true");
    if (want) r.logprobs = top ? static_cast<std::size_t>(*top) : 0;
  }
  if (beam) parse_beam(body, r, best_of);
  r.grammar = grammar_from_request(body, text, limits.grammar);
  return r;
}

// Whether a response is sent whole or as one chunk of a stream.
enum class response_part : bool { whole, chunk };

const char* object_name(api_kind kind, response_part part) {
  if (kind == api_kind::completions) return "text_completion";
  return part == response_part::chunk ? "chat.completion.chunk" : "chat.completion";
}

ordered_json chunk_head(api_kind kind, const response_header& h) {
  ordered_json j;
  j["id"] = h.id;
  j["object"] = object_name(kind, response_part::chunk);
  j["created"] = h.created;
  j["model"] = h.model;
  return j;
}

ordered_json usage_json(const usage_counts& u) {
  ordered_json j;
  j["prompt_tokens"] = u.prompt_tokens;
  j["completion_tokens"] = u.completion_tokens;
  j["total_tokens"] = u.prompt_tokens + u.completion_tokens;
  j["prompt_tokens_details"] = {{"cached_tokens", u.cached_tokens}};
  return j;
}

// Whether `text` is well-formed UTF-8 (no overlong forms, surrogates or code points above U+10FFFF).
bool valid_utf8(std::string_view text) {
  std::size_t i = 0;
  while (i < text.size()) {
    const auto c = static_cast<unsigned char>(text[i]);
    const std::size_t len = c < 0x80u ? 1 : (c & 0xE0u) == 0xC0u ? 2 : (c & 0xF0u) == 0xE0u ? 3 : (c & 0xF8u) == 0xF0u ? 4 : 0;
    if (len == 0 || i + len > text.size()) return false;
    std::uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1Fu) : len == 3 ? (c & 0x0Fu) : (c & 0x07u);
    for (std::size_t k = 1; k < len; ++k) {
      const auto d = static_cast<unsigned char>(text[i + k]);
      if ((d & 0xC0u) != 0x80u) return false;
      cp = (cp << 6) | (d & 0x3Fu);
    }
    constexpr std::uint32_t min_of_length[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min_of_length[len] || cp > 0x10FFFFu || (cp >= 0xD800u && cp <= 0xDFFFu)) return false;
    i += len;
  }
  return true;
}

ordered_json bytes_of(std::string_view text) {
  ordered_json b = ordered_json::array();
  for (const char c : text) b.push_back(static_cast<unsigned char>(c));
  return b;
}

// A log-probability as replies carry it: masked_logprob for probability 0
// (-inf), for anything below it, and for NaN; 0 (not -0) for certainty.
float reported_logprob(float logprob) {
  if (!(logprob >= masked_logprob)) return masked_logprob;  // NaN too
  return logprob < 0.0f ? logprob : 0.0f;
}

// Chat: {"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}.
ordered_json chat_logprob_entry(const token_piece& p) {
  ordered_json e;
  e["token"] = p.token_text;
  e["logprob"] = reported_logprob(p.logprob);
  e["bytes"] = bytes_of(p.token_text);
  ordered_json top = ordered_json::array();
  for (const auto& a : p.top) {
    ordered_json t;
    t["token"] = a.text;
    t["logprob"] = reported_logprob(a.logprob);
    t["bytes"] = bytes_of(a.text);
    top.push_back(std::move(t));
  }
  e["top_logprobs"] = std::move(top);
  return e;
}

// Completions: {"tokens", "token_logprobs", "top_logprobs": [{text: logprob}], "text_offset"}.
ordered_json completion_logprobs(const std::vector<token_piece>& pieces, std::size_t first_offset) {
  ordered_json tokens = ordered_json::array(), lps = ordered_json::array(), tops = ordered_json::array(),
               offsets = ordered_json::array();
  std::size_t offset = first_offset;
  for (const auto& p : pieces) {
    tokens.push_back(p.token_text);
    lps.push_back(reported_logprob(p.logprob));
    ordered_json top = ordered_json::object();
    for (const auto& a : p.top) top[a.text] = reported_logprob(a.logprob);
    tops.push_back(std::move(top));
    offsets.push_back(offset);
    offset += p.token_text.size();
  }
  ordered_json j;
  j["tokens"] = std::move(tokens);
  j["token_logprobs"] = std::move(lps);
  j["top_logprobs"] = std::move(tops);
  j["text_offset"] = std::move(offsets);
  return j;
}

void write_gauge(std::string& out, const char* name, const char* help, double value) {
  out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " gauge\n" + name + " " +
         format_double(value) + "\n";
}

void write_counter(std::string& out, const char* name, const char* help, double value) {
  out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " counter\n" + name + " " +
         format_double(value) + "\n";
}

void write_histogram(std::string& out, const char* name, const char* help, const fixed_histogram& h) {
  out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " histogram\n";
  const auto bounds = h.upper_bounds();
  for (std::size_t i = 0; i <= bounds.size(); ++i)
    out += std::string(name) + "_bucket{le=\"" + (i < bounds.size() ? format_double(bounds[i]) : "+Inf") + "\"} " +
           std::to_string(h.cumulative(i)) + "\n";
  out += std::string(name) + "_sum " + format_double(h.sum()) + "\n";
  out += std::string(name) + "_count " + std::to_string(h.count()) + "\n";
}

}  // namespace

// --- errors ------------------------------------------------------------------------

api_error invalid_request(std::string param, std::string message) {
  return {.status = 400, .message = std::move(message), .type = "invalid_request_error", .param = std::move(param)};
}

api_error unauthorized() {
  return {.status = 401,
          .message = "missing or wrong API key: send the header 'Authorization: Bearer <key>'",
          .type = "authentication_error",
          .code = "invalid_api_key"};
}

api_error not_found(std::string_view method, std::string_view path) {
  return {.status = 404,
          .message = "no route " + cut(method) + " " + cut(path, 256) +
                     " (routes: POST /v1/completions, POST /v1/chat/completions, GET /v1/models, GET /health, "
                     "GET /metrics)",
          .type = "not_found_error",
          .code = "unknown_route"};
}

api_error payload_too_large(std::size_t max_bytes) {
  return {.status = 413,
          .message = "the request body is larger than " + std::to_string(max_bytes) + " bytes",
          .type = "invalid_request_error",
          .code = "request_too_large"};
}

api_error queue_full(std::size_t max_queue) {
  return {.status = 429,
          .message = "the server's request queue is full (" + std::to_string(max_queue) + " waiting); retry later",
          .type = "rate_limit_error",
          .code = "queue_full"};
}

api_error draining() {
  return {.status = 503,
          .message = "the server is shutting down and takes no new requests",
          .type = "server_error",
          .code = "draining"};
}

api_error internal_error(std::string_view what) {
  return {.status = 500, .message = "internal error: " + cut(what, 256), .type = "server_error"};
}

std::string error_body(const api_error& e) {
  ordered_json err;
  err["message"] = e.message;
  err["type"] = e.type;
  err["param"] = e.param.empty() ? ordered_json(nullptr) : ordered_json(e.param);
  err["code"] = e.code.empty() ? ordered_json(nullptr) : ordered_json(e.code);
  ordered_json j;
  j["error"] = std::move(err);
  return dump(j);
}

std::optional<api_error> check_authorization(std::string_view authorization, std::string_view api_key) {
  if (api_key.empty()) return std::nullopt;
  constexpr std::string_view scheme = "Bearer ";
  if (authorization.size() == scheme.size() + api_key.size() && authorization.substr(0, scheme.size()) == scheme) {
    // Compare every byte, whatever the first mismatch (no early exit to time).
    unsigned char diff = 0;
    for (std::size_t i = 0; i < api_key.size(); ++i)
      diff |= static_cast<unsigned char>(authorization[scheme.size() + i] ^ api_key[i]);
    if (diff == 0) return std::nullopt;
  }
  return unauthorized();
}

// --- requests ------------------------------------------------------------------------

parse_result parse_request(api_kind kind, std::string_view body, const model_limits& model,
                           const request_limits& limits) {
  return parse_or_reject([&] { return parse_body(kind, body, model, limits); });
}

// --- tokenizer routes ------------------------------------------------------------------

std::variant<tokenize_request, api_error> parse_tokenize_request(std::string_view text) {
  return parse_or_reject([&] {
    const json body = parse_object(text);
    tokenize_request r;
    const json* content = field(body, "content");
    if (!content) reject("content", "'content' is required (the text to tokenize)");
    if (!content->is_string()) wrong_type("content", "a string", *content);
    r.content = content->get<std::string>();
    r.add_special = bool_field(body, "add_special").value_or(false);
    r.parse_special = bool_field(body, "parse_special");
    r.with_pieces = bool_field(body, "with_pieces").value_or(false);
    return r;
  });
}

std::variant<detokenize_request, api_error> parse_detokenize_request(std::string_view text,
                                                                     const model_limits& model) {
  return parse_or_reject([&] {
    const json body = parse_object(text);
    const json* tokens = field(body, "tokens");
    if (!tokens) reject("tokens", "'tokens' is required (an array of token ids)");
    if (!tokens->is_array()) wrong_type("tokens", "an array of token ids", *tokens);
    detokenize_request r;
    r.tokens.reserve(tokens->size());
    for (std::size_t i = 0; i < tokens->size(); ++i)
      r.tokens.push_back(token_in_vocab((*tokens)[i], "tokens[" + std::to_string(i) + "]", model));
    return r;
  });
}

std::string tokenize_response(const std::vector<token_id>& tokens) {
  ordered_json j;
  j["tokens"] = tokens;
  return dump(j);
}

std::string tokenize_response(const std::vector<token_with_piece>& tokens) {
  ordered_json list = ordered_json::array();
  for (const auto& t : tokens) {
    ordered_json o;
    o["id"] = t.id;
    if (valid_utf8(t.piece)) o["piece"] = t.piece;
    else o["piece"] = bytes_of(t.piece);
    list.push_back(std::move(o));
  }
  ordered_json j;
  j["tokens"] = std::move(list);
  return dump(j);
}

std::string detokenize_response(std::string_view content) {
  ordered_json j;
  j["content"] = content;
  return dump(j);
}

std::string chain_config(const sampling_params& p) {
  std::string c;
  if (p.repetition_penalty != 1.0f || p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f)
    c += "penalties(repeat=" + format_float(p.repetition_penalty) + ",frequency=" + format_float(p.frequency_penalty) +
         ",presence=" + format_float(p.presence_penalty) + ",last_n=" + std::to_string(p.penalty_last_n) + ");";
  if (!p.logit_bias.empty()) {
    c += "logit_bias(";
    for (std::size_t i = 0; i < p.logit_bias.size(); ++i) {
      if (i > 0) c += ',';
      c += std::to_string(p.logit_bias[i].first);
      c += '=';
      c += format_float(p.logit_bias[i].second);
    }
    c += ");";
  }
  if (p.temperature <= 0.0f) return c + "greedy";
  if (p.top_k > 0) c += "top_k(" + std::to_string(p.top_k) + ");";
  if (p.typical_p < 1.0f) c += "typical(" + format_float(p.typical_p) + ");";
  if (p.top_p < 1.0f) c += "top_p(" + format_float(p.top_p) + ");";
  if (p.min_p > 0.0f) c += "min_p(" + format_float(p.min_p) + ");";
  if (p.temperature != 1.0f) c += "temperature(" + format_float(p.temperature) + ");";
  return c + "sample";
}

std::variant<std::size_t, api_error> completion_budget(const generation_request& r, std::size_t n_prompt,
                                                       const model_limits& model) {
  const std::string prompt_param = r.kind == api_kind::completions ? "prompt" : "messages";
  if (n_prompt == 0) return invalid_request(prompt_param, "the prompt is empty (0 tokens)");
  if (n_prompt >= model.n_ctx) {
    api_error e = invalid_request(prompt_param, "the prompt has " + std::to_string(n_prompt) +
                                                    " tokens; the context holds " + std::to_string(model.n_ctx) +
                                                    " (prompt and completion together)");
    e.code = "context_length_exceeded";
    return e;
  }
  const std::size_t room = model.n_ctx - n_prompt;
  if (!r.max_tokens) return r.kind == api_kind::completions ? std::min<std::size_t>(16, room) : room;
  if (*r.max_tokens > room) {
    api_error e = invalid_request("max_tokens", "the prompt (" + std::to_string(n_prompt) + " tokens) plus max_tokens (" +
                                                    std::to_string(*r.max_tokens) + ") exceed the context of " +
                                                    std::to_string(model.n_ctx) + " tokens");
    e.code = "context_length_exceeded";
    return e;
  }
  return *r.max_tokens;
}

llmkit::stop_criteria stop_rules(const generation_request& r, std::size_t max_new_tokens,
                                 std::vector<token_id> eos_tokens) {
  return {.max_new_tokens = max_new_tokens, .eos_tokens = std::move(eos_tokens), .stop_strings = r.stop};
}

// --- responses -------------------------------------------------------------------------

std::string completion_response(api_kind kind, const response_header& h, const std::vector<choice_result>& choices,
                                const usage_counts& usage, bool with_logprobs) {
  ordered_json j;
  j["id"] = h.id;
  j["object"] = object_name(kind, response_part::whole);
  j["created"] = h.created;
  j["model"] = h.model;
  ordered_json list = ordered_json::array();
  for (std::size_t i = 0; i < choices.size(); ++i) {
    const auto& c = choices[i];
    ordered_json choice;
    choice["index"] = i;
    if (kind == api_kind::completions) {
      choice["text"] = c.text;
      choice["logprobs"] = with_logprobs ? completion_logprobs(c.pieces, 0) : ordered_json(nullptr);
    } else {
      ordered_json message;
      message["role"] = "assistant";
      message["content"] = c.text;
      if (!c.tool_calls.empty()) {
        if (c.text.empty()) message["content"] = nullptr;
        message["tool_calls"] = tool_calls_json(c.tool_calls);
      }
      if (c.reasoning) message["reasoning_content"] = *c.reasoning;
      choice["message"] = std::move(message);
      if (with_logprobs) {
        ordered_json content = ordered_json::array();
        for (const auto& p : c.pieces) content.push_back(chat_logprob_entry(p));
        ordered_json lp;
        lp["content"] = std::move(content);
        choice["logprobs"] = std::move(lp);
      } else {
        choice["logprobs"] = nullptr;
      }
    }
    choice["finish_reason"] =
        !c.tool_calls.empty() && c.finish == serve::finish_kind::stop ? std::string_view("tool_calls") : serve::to_string(c.finish);
    list.push_back(std::move(choice));
  }
  j["choices"] = std::move(list);
  j["usage"] = usage_json(usage);
  return dump(j);
}

std::string sse_event(std::string_view json_text) {
  std::string out;
  out.reserve(json_text.size() + 8);
  out += "data: ";
  out += json_text;
  out += "\n\n";
  return out;
}

std::string sse_done() { return "data: [DONE]\n\n"; }

std::string chat_role_chunk(const response_header& h, std::size_t index) {
  ordered_json j = chunk_head(api_kind::chat_completions, h);
  ordered_json choice;
  choice["index"] = index;
  ordered_json delta;
  delta["role"] = "assistant";
  delta["content"] = "";
  choice["delta"] = std::move(delta);
  choice["logprobs"] = nullptr;
  choice["finish_reason"] = nullptr;
  j["choices"] = ordered_json::array({std::move(choice)});
  return dump(j);
}

std::string piece_chunk(api_kind kind, const response_header& h, std::size_t index, const token_piece& piece,
                        bool with_logprobs) {
  ordered_json j = chunk_head(kind, h);
  ordered_json choice;
  choice["index"] = index;
  if (kind == api_kind::completions) {
    choice["text"] = piece.text;
    choice["logprobs"] = with_logprobs ? completion_logprobs({piece}, 0) : ordered_json(nullptr);
  } else {
    ordered_json delta;
    delta["content"] = piece.text;
    choice["delta"] = std::move(delta);
    if (with_logprobs) {
      ordered_json lp;
      lp["content"] = ordered_json::array({chat_logprob_entry(piece)});
      choice["logprobs"] = std::move(lp);
    } else {
      choice["logprobs"] = nullptr;
    }
  }
  choice["finish_reason"] = nullptr;
  j["choices"] = ordered_json::array({std::move(choice)});
  return dump(j);
}

std::string reasoning_chunk(const response_header& h, std::size_t index, std::string_view text) {
  ordered_json j = chunk_head(api_kind::chat_completions, h);
  ordered_json choice;
  choice["index"] = index;
  ordered_json delta;
  delta["reasoning_content"] = std::string(text);
  choice["delta"] = std::move(delta);
  choice["logprobs"] = nullptr;
  choice["finish_reason"] = nullptr;
  j["choices"] = ordered_json::array({std::move(choice)});
  return dump(j);
}

namespace {
// The length of the longest suffix of `s` that is a proper prefix of `marker`.
std::size_t partial_marker(std::string_view s, std::string_view marker) {
  for (std::size_t n = std::min(s.size(), marker.size() - 1); n > 0; --n)
    if (marker.starts_with(s.substr(s.size() - n))) return n;
  return 0;
}
}  // namespace

reasoning_stream::parts reasoning_stream::feed(std::string_view text) {
  held_ += text;
  parts out;
  if (!opened_) {  // a leading "<think>" (after newlines) is the block's marker, not reasoning
    const std::size_t start = held_.find_first_not_of('\n');
    if (start == std::string::npos) return out;
    const std::string_view rest = std::string_view(held_).substr(start);
    if (rest.size() < 7 && std::string_view("<think>").starts_with(rest)) return out;
    // An answer that does not open with "<think>" has no thinking block (as
    // llama-server parses Qwen3's): all of it is content.
    thinking_ = rest.starts_with("<think>");
    answered_ = !thinking_;  // its text is kept as generated, leading newlines too
    held_.erase(0, thinking_ ? start + 7 : 0);
    opened_ = true;
  }
  if (thinking_) {
    const std::size_t close = held_.find("</think>");
    if (close == std::string::npos) {
      const std::size_t keep = partial_marker(held_, "</think>");
      out.reasoning = held_.substr(0, held_.size() - keep);
      held_.erase(0, held_.size() - keep);
    } else {
      out.reasoning = held_.substr(0, close);
      held_.erase(0, close + 8);
      thinking_ = false;
    }
    if (!reasoned_) {  // newlines right after "<think>" are the block's layout
      const std::size_t start = out.reasoning.find_first_not_of('\n');
      out.reasoning.erase(0, start == std::string::npos ? out.reasoning.size() : start);
      reasoned_ = !out.reasoning.empty();
    }
  }
  if (!thinking_) {
    if (!answered_) {
      const std::size_t start = held_.find_first_not_of('\n');
      held_.erase(0, start == std::string::npos ? held_.size() : start);
      answered_ = !held_.empty();
    }
    out.content = std::move(held_);
    held_.clear();
  }
  return out;
}

reasoning_stream::parts reasoning_stream::finish() {
  parts out;
  (thinking_ ? out.reasoning : out.content) = std::move(held_);
  held_.clear();
  return out;
}

std::string finish_chunk(api_kind kind, const response_header& h, std::size_t index, serve::finish_kind finish,
                         bool made_tool_calls) {
  ordered_json j = chunk_head(kind, h);
  ordered_json choice;
  choice["index"] = index;
  if (kind == api_kind::completions) choice["text"] = "";
  else choice["delta"] = ordered_json::object();
  choice["logprobs"] = nullptr;
  choice["finish_reason"] =
      made_tool_calls && finish == serve::finish_kind::stop ? std::string_view("tool_calls") : serve::to_string(finish);
  j["choices"] = ordered_json::array({std::move(choice)});
  return dump(j);
}

std::string usage_chunk(api_kind kind, const response_header& h, const usage_counts& usage) {
  ordered_json j = chunk_head(kind, h);
  j["choices"] = ordered_json::array();
  j["usage"] = usage_json(usage);
  return dump(j);
}

std::string stream_error_chunk(const api_error& e) { return error_body(e); }

std::string models_response(std::string_view model_id, std::int64_t created) {
  ordered_json m;
  m["id"] = model_id;
  m["object"] = "model";
  m["created"] = created;
  m["owned_by"] = "llmkit";
  ordered_json j;
  j["object"] = "list";
  j["data"] = ordered_json::array({std::move(m)});
  return dump(j);
}

std::string health_response(bool is_draining, std::size_t queue_depth, std::size_t running) {
  ordered_json j;
  j["status"] = is_draining ? "draining" : "ok";
  j["queue_depth"] = queue_depth;
  j["running"] = running;
  return dump(j);
}

// --- metrics -----------------------------------------------------------------------------

std::string prometheus_text(const metrics_snapshot& s) {
  std::string out;
  out += "# HELP llmkit_requests_total Completions (choices) finished, by finish reason.\n"
         "# TYPE llmkit_requests_total counter\n";
  const std::pair<const char*, std::uint64_t> reasons[] = {{"stop", s.finished_stop},
                                                           {"length", s.finished_length},
                                                           {"cancelled", s.finished_cancelled},
                                                           {"error", s.finished_error}};
  for (const auto& [name, n] : reasons)
    out += std::string("llmkit_requests_total{finish_reason=\"") + name + "\"} " + std::to_string(n) + "\n";
  write_counter(out, "llmkit_requests_rejected_total", "Requests answered with an error status.",
                double(s.rejected));
  write_counter(out, "llmkit_prompt_tokens_total", "Prompt tokens of admitted requests.", double(s.prompt_tokens));
  write_counter(out, "llmkit_generated_tokens_total", "Tokens generated.", double(s.generated_tokens));
  write_gauge(out, "llmkit_queue_depth", "Requests waiting for admission.", double(s.queue_depth));
  write_gauge(out, "llmkit_running_requests", "Requests in the running batch.", double(s.running));
  write_gauge(out, "llmkit_kv_blocks_used", "KV-cache blocks in use.", double(s.kv_blocks_used));
  write_gauge(out, "llmkit_kv_blocks_free", "KV-cache blocks free.", double(s.kv_blocks_free));
  write_histogram(out, "llmkit_time_to_first_token_seconds", "Time from a request's arrival to its first token.",
                  s.ttft);
  write_histogram(out, "llmkit_inter_token_seconds", "Time between two consecutive tokens of a stream.",
                  s.inter_token);
  return out;
}

}  // namespace llmkit_server
