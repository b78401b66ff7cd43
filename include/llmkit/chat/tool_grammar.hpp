// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/chat/tool_grammar.hpp
/// The grammar of a family's call syntax for a set of tools: each call's
/// arguments constrained by its tool's parameters schema (through
/// grammar::schema_to_gbnf), the name by the tools' names.
///
/// ```cpp
/// auto g = chat::tool_call_grammar(chat::tool_syntax::hermes, tools, choice, /*parallel=*/true);
/// auto masker = grammar::compile_cached(g->gbnf, vocab);
/// if (g->triggers.empty()) chain = {grammar::grammar_processor(masker), ...};   // required / named
/// else chain = {grammar::lazy_grammar_processor(masker, g->triggers, markers), ...};  // auto
/// ```
///
/// With `required` or a named function the whole answer is calls; with
/// `auto` the grammar is lazy: free text until the syntax's opening marker,
/// the calls from the marker on (to the end of the answer). The sentences:
///
/// - hermes: `<tool_call>\n{"name": N, "arguments": A}\n</tool_call>`, then
///   with parallel calls more blocks each after a `\n`; trigger `<tool_call>`;
/// - llama3_json: `{"name": N, "parameters": A}` (one call; Llama 3.1 makes
///   no parallel calls); triggers `{"name"` and `{ "name"`;
/// - mistral: `[TOOL_CALLS] [C, ...]` with C = `{"name": N, "arguments": A,
///   "id": I}`, I 9 letters or digits; one C unless parallel; trigger
///   `[TOOL_CALLS]`;
/// - harmony: an optional analysis message, then one call (`<|call|>`
///   ends the answer: it belongs in the vocabulary's end tokens):
///   `<|channel|>commentary to=functions.N <|constrain|>json<|message|>A`
///   or `<|start|>assistant`'s ` to=functions.N<|channel|>commentary json<|message|>A`
///   (the type ` <|constrain|>json`, ` json` or none); with `auto`, from the
///   trigger ` to=functions.` on. Its markers are special tokens: the
///   grammar names them as a 0x01 byte and their text, which a vocabulary
///   built with harmony_grammar_markers gives them, and which no JSON
///   string, whitespace or free text of the grammar matches.
///
/// JSON whitespace is at most one space between tokens (Python's
/// `json.dumps` writes one after `:` and `,`, none elsewhere); keys in the
/// order above. Except harmony's, markers after the first are spelled in
/// characters: those grammars never allow a special token.

#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "llmkit/chat/tools.hpp"
#include "llmkit/core/error.hpp"
#include "llmkit/grammar/json_schema.hpp"

namespace llmkit::chat {

/// A call grammar: GBNF text and, when lazy, the words that activate it.
struct tool_grammar {
  std::string gbnf{};
  /// Empty: the grammar constrains the whole answer. Otherwise free text
  /// comes first, and the grammar reads from the first trigger on
  /// (grammar::lazy_grammar_processor).
  std::vector<std::string> triggers{};
};

namespace detail {

// Renames the $ref targets of tool `prefix`'s schema so that every tool's
// definitions can live in one root `$defs`: "#" -> "#/$defs/<prefix>",
// "#/$defs/X" and "#/definitions/X" -> "#/$defs/<prefix>-X".
inline void hoist_refs(json& s, const std::string& prefix, json& defs) {
  if (s.is_array()) {
    for (auto& e : s) hoist_refs(e, prefix, defs);
    return;
  }
  if (!s.is_object()) return;
  for (const char* key : {"$defs", "definitions"}) {
    if (!s.contains(key) || !s[key].is_object()) continue;
    json moved = std::move(s[key]);
    s.erase(key);
    for (auto it = moved.begin(); it != moved.end(); ++it) {
      json d = std::move(it.value());
      hoist_refs(d, prefix, defs);
      defs[prefix + "-" + it.key()] = std::move(d);
    }
  }
  if (s.contains("$ref") && s["$ref"].is_string()) {
    const std::string ref = s["$ref"].get<std::string>();
    if (ref == "#") s["$ref"] = "#/$defs/" + prefix;
    for (const std::string p : {"#/$defs/", "#/definitions/"})
      if (ref.rfind(p, 0) == 0) s["$ref"] = "#/$defs/" + prefix + "-" + ref.substr(p.size());
  }
  for (auto it = s.begin(); it != s.end(); ++it) {
    const std::string& k = it.key();
    if (k == "const" || k == "enum" || k == "default" || k == "examples" || k == "$ref") continue;
    hoist_refs(it.value(), prefix, defs);
  }
}

// Tightens a converted schema's JSON whitespace to at most one space, as
// the templates' tojson writes calls: a model's calls look like the ones it
// was trained on, and a small model cannot wander off into runs of newlines.
inline void tighten_json_space(std::string& gbnf) {
  constexpr std::string_view loose_ws = "\nws ::= [ \\t\\n]{0,20}\n";
  if (const std::size_t at = gbnf.find(loose_ws); at != std::string::npos)
    gbnf.replace(at, loose_ws.size(), "\nws ::= \" \"?\n");
}

// A harmony marker as a grammar literal: its special token's bytes in a
// vocabulary built with harmony_grammar_markers.
inline std::string harmony_marker(std::string_view marker) { return "\"\\x01" + std::string(marker) + "\""; }

inline tool_grammar harmony_call_grammar(std::span<const tool_definition> tools, const tool_choice& choice,
                                         const grammar::json_schema_options& options) {
  json defs = json::object();
  json refs = json::array();
  std::vector<std::size_t> chosen;
  for (std::size_t i = 0; i < tools.size(); ++i) {
    if (choice.mode == tool_choice_mode::named && tools[i].name != choice.name) continue;
    const std::string prefix = "tool" + std::to_string(i);
    json params = tools[i].parameters;
    hoist_refs(params, prefix, defs);
    defs[prefix] = std::move(params);
    refs.push_back(json{{"$ref", "#/$defs/" + prefix}});
    chosen.push_back(i);
  }
  LLMKIT_CHECK(!chosen.empty(), "tool_choice: function '", choice.name.substr(0, 64), "' is not in tools");
  json root = refs.size() == 1 ? refs[0] : json{{"anyOf", std::move(refs)}};
  root["$defs"] = std::move(defs);
  std::string args = grammar::schema_to_gbnf(root, options);
  LLMKIT_ASSERT(args.rfind("root ::= ", 0) == 0);
  args.replace(0, 4, "harmony-arguments");  // the union of every tool's arguments, unused
  tighten_json_space(args);
  // Each tool's arguments rule: "ref" + the $defs name + "-" + digits.
  const auto rule_of = [&](std::size_t i) {
    const std::string head = "reftool" + std::to_string(i) + "-";
    for (std::size_t at = args.find("\n" + head); at != std::string::npos; at = args.find("\n" + head, at + 1)) {
      const std::size_t end = args.find(" ::= ", at);
      const std::string name = args.substr(at + 1, end - at - 1);
      if (name.find_first_not_of("0123456789", head.size()) == std::string::npos) return name;
    }
    LLMKIT_ASSERT(false);
    return std::string();
  };
  const std::string channel = harmony_marker("<|channel|>"), message = harmony_marker("<|message|>");
  tool_grammar g;
  // The header's recipient comes before <|channel|> (as the template writes
  // calls) or after its channel name (as the model's training format has
  // it), then the arguments' type: ` <|constrain|>json`, ` json` or none.
  g.gbnf = "harmony-type ::= (\" \" " + harmony_marker("<|constrain|>") + "? \"json\")?\n";
  std::string lazy_root = "root ::= \" to=functions.\" (", calls = "harmony-call ::= ";
  for (std::size_t k = 0; k < chosen.size(); ++k) {
    const std::string& name = tools[chosen[k]].name;
    const std::string rule = rule_of(chosen[k]);
    const std::string n = std::to_string(k);
    lazy_root += (k ? " | " : "") + std::string("\"") + name + "\" (" + channel + " \"commentary\")? harmony-type " + message +
                 " " + rule;
    calls += (k ? " | " : "") + std::string("call-") + n;
    g.gbnf += "call-" + n + " ::= (" + channel + " \"commentary to=functions." + name + "\" | \" to=functions." + name +
              "\" " + channel + " \"commentary\") harmony-type " + message + " " + rule + "\n";
  }
  if (choice.mode == tool_choice_mode::automatic) {
    g.gbnf = lazy_root + ")\n" + g.gbnf;
    g.triggers = {" to=functions."};
  } else {
    // The model may think first: one analysis message (text without
    // special tokens), then the call.
    g.gbnf = "root ::= harmony-analysis? harmony-call\nharmony-analysis ::= " + channel + " \"analysis\" " + message +
             " [^\\x01]* " + harmony_marker("<|end|>") + " " + harmony_marker("<|start|>") + " \"assistant\"\n" +
             calls + "\n" + g.gbnf;
  }
  g.gbnf += args;
  return g;
}

}  // namespace detail

/// harmony's markers, each one special token in gpt-oss's vocabulary: build
/// the vocabulary of harmony call grammars with them
/// (grammar::token_vocabulary::from_tokenizer's `named_specials`), so that
/// the grammar allows them where it names them, and nowhere else.
inline constexpr std::string_view harmony_grammar_markers[] = {"<|channel|>", "<|message|>", "<|constrain|>",
                                                               "<|end|>", "<|start|>"};

/// The grammar of `syntax` for calls of `[n] tools` under `choice`
/// (nullopt for `none` or no tools: nothing to constrain); `parallel`
/// allows several calls in an answer (OpenAI's `parallel_tool_calls`,
/// default true). See the file comment.
/// @throws llmkit::error if `choice` names a function not in `tools`, or a
/// tool's parameters are a schema schema_to_gbnf refuses with `options`.
inline std::optional<tool_grammar> tool_call_grammar(tool_syntax syntax, std::span<const tool_definition> tools,
                                                     const tool_choice& choice, bool parallel = true,
                                                     const grammar::json_schema_options& options = {}) {
  if (choice.mode == tool_choice_mode::none || tools.empty()) return std::nullopt;
  if (syntax == tool_syntax::harmony) return detail::harmony_call_grammar(tools, choice, options);
  const char* args_key = syntax == tool_syntax::llama3_json ? "parameters" : "arguments";
  json defs = json::object();
  json calls = json::array();
  bool found = false;
  for (std::size_t i = 0; i < tools.size(); ++i) {
    const tool_definition& t = tools[i];
    if (choice.mode == tool_choice_mode::named && t.name != choice.name) continue;
    found = true;
    const std::string prefix = "tool" + std::to_string(i);
    json params = t.parameters;
    detail::hoist_refs(params, prefix, defs);
    defs[prefix] = std::move(params);
    json props = json::object();
    props["name"] = json{{"const", t.name}};
    props[args_key] = json{{"$ref", "#/$defs/" + prefix}};
    json required = json::array({"name", args_key});
    if (syntax == tool_syntax::mistral) {
      props["id"] = json{{"type", "string"}, {"pattern", "^[a-zA-Z0-9]{9}$"}};
      required.push_back("id");
    }
    calls.push_back(json{{"type", "object"}, {"properties", std::move(props)}, {"required", std::move(required)}});
  }
  LLMKIT_CHECK(found, "tool_choice: function '", choice.name.substr(0, 64), "' is not in tools");
  json call = calls.size() == 1 ? calls[0] : json{{"anyOf", std::move(calls)}};
  json root;
  if (syntax == tool_syntax::mistral) {
    root = json{{"type", "array"}, {"items", std::move(call)}, {"minItems", 1}};
    if (!parallel) root["maxItems"] = 1;
  } else {
    root = std::move(call);
  }
  root["$defs"] = std::move(defs);
  std::string gbnf = grammar::schema_to_gbnf(root, options);
  LLMKIT_ASSERT(gbnf.rfind("root ::= ", 0) == 0);
  gbnf.replace(0, 4, "tool-call");
  detail::tighten_json_space(gbnf);

  tool_grammar g;
  switch (syntax) {
    case tool_syntax::hermes:
      g.gbnf = parallel ? "root ::= tool-block (\"\\n\" tool-block)*\n" : "root ::= tool-block\n";
      g.gbnf += "tool-block ::= \"<tool_call>\\n\" tool-call \"\\n</tool_call>\"\n";
      g.triggers = {"<tool_call>"};
      break;
    case tool_syntax::llama3_json:
      g.gbnf = "root ::= tool-call\n";
      g.triggers = {"{\"name\"", "{ \"name\""};
      break;
    case tool_syntax::mistral:
      g.gbnf = "root ::= \"[TOOL_CALLS]\" \" \"? tool-call\n";
      g.triggers = {"[TOOL_CALLS]"};
      break;
    case tool_syntax::harmony: break;  // harmony_call_grammar

  }
  g.gbnf += gbnf;
  if (choice.mode != tool_choice_mode::automatic) g.triggers.clear();
  return g;
}

}  // namespace llmkit::chat
