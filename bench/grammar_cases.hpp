// SPDX-License-Identifier: MIT
// What the grammar benches (bench_grammar's masks and compiles,
// bench_model's constrained decoding) run on: the Llama 3 vocabulary
// (128,256 tokens, tests/data fixture) and JSON schemas, each with a valid
// document, kept in one place so the figures stay comparable.
#pragma once

#include <llmkit/grammar/token_vocabulary.hpp>
#include <llmkit/model/gguf.hpp>
#include <llmkit/model/tokenizer.hpp>

#include <memory>
#include <string>

namespace llmkit_bench {

inline const llmkit::model::tokenizer& llama3() {
  static const llmkit::model::tokenizer t = llmkit::model::tokenizer::from_gguf(
      llmkit::model::gguf_file::open(std::string(LLMKIT_SOURCE_DIR) + "/tests/data/llama3-bpe-vocab.gguf"));
  return t;
}
inline const std::shared_ptr<const llmkit::grammar::token_vocabulary>& llama3_vocab() {
  static const auto v = llmkit::grammar::token_vocabulary::from_tokenizer(llama3());
  return v;
}

struct bench_case {
  const char* name;
  const char* schema;
  const char* document;
};
inline const bench_case grammar_cases[] = {
    {"person",
     R"({"type": "object", "properties": {"name": {"type": "string", "maxLength": 40},
         "age": {"type": "integer", "minimum": 0, "maximum": 150}, "email": {"type": "string"},
         "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 8}},
         "required": ["name", "age"], "additionalProperties": false})",
     R"({"name": "Ada Lovelace", "age": 36, "email": "ada@example.org", "tags": ["math", "engines", "poetry"]})"},
    {"tool_call",
     R"({"type": "object", "properties": {"name": {"enum": ["get_weather", "search", "send_email"]},
         "arguments": {"type": "object", "properties": {"city": {"type": "string"},
         "unit": {"enum": ["celsius", "fahrenheit"]}, "days": {"type": "integer", "minimum": 1, "maximum": 14}},
         "required": ["city"]}}, "required": ["name", "arguments"]})",
     R"({"name": "get_weather", "arguments": {"city": "Zürich, Switzerland", "unit": "celsius", "days": 3}})"},
    {"tree",
     R"({"$ref": "#/$defs/node", "$defs": {"node": {"type": "object", "properties": {"label": {"type": "string"},
         "weight": {"type": "number"}, "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
         "required": ["label"]}}})",
     R"({"label": "root", "weight": 1.5, "children": [{"label": "left", "children": []}, {"label": "right", "weight": -2e3, "children": [{"label": "leaf"}]}]})"},
    {"json_object", R"({"type": "object"})",
     R"({"id": 12345, "items": [{"sku": "A-1", "qty": 2, "price": 9.99}, {"sku": "B-7", "qty": 1, "price": 120.0}], "paid": true, "note": null})"},
};

}  // namespace llmkit_bench
