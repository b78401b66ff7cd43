// SPDX-License-Identifier: MIT
#pragma once

/// @file llmkit/grammar/json_schema.hpp
/// JSON Schema (the subset structured outputs and function calling use) to
/// GBNF. Needs nlohmann/json (nlohmann-json3-dev), unlike the rest of the
/// module.
///
/// Supported: `type` (and unions), `properties` / `required` /
/// `additionalProperties`, `items` / `prefixItems` / `minItems` / `maxItems`,
/// `enum`, `const`, `anyOf`, `oneOf` (as anyOf: a document matching two
/// branches is not refused), `allOf` of one schema or of object schemas
/// (merged), `$ref` to `#/$defs/...` or `#/definitions/...` (recursion
/// allowed), strings with `minLength` / `maxLength` / `format` (date, time,
/// date-time, uuid) or `pattern` (regex.hpp's subset), integers and numbers
/// with `minimum` / `maximum`.
///
/// What the grammar produces is always valid, but some valid documents are
/// not produced:
/// - properties come in the schema's order; an object with `properties`
///   gets no other keys unless `additionalProperties` is true or a schema;
/// - `minimum` / `maximum` on integers are exact when the range holds at most
///   256 values (an enumeration); otherwise only the sign is enforced
///   (minimum >= 0: no '-'; maximum < 0: '-' required) and the digit count of
///   the larger bound, so a value can exceed a bound with as many digits. On
///   numbers only the sign is enforced.
/// - whitespace between tokens is at most 20 blanks/newlines; integers have
///   at most 16 digits, fractions and exponents at most 16.
///
/// Other keywords (`uniqueItems`, `multipleOf`, ...): with
/// `strict`, an error naming the keyword's JSON path; otherwise ignored
/// (annotations such as `title`, `description`, `default`, `examples`,
/// `$schema`, `$id`, `$comment` are always ignored).

#include <cctype>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "llmkit/core/error.hpp"
#include "llmkit/grammar/regex.hpp"

namespace llmkit::grammar {

/// Options of `schema_to_gbnf`.
struct json_schema_options {
  bool strict = true;           ///< unsupported keywords are errors (else ignored)
  std::size_t max_rules = 4096; ///< rules the conversion may create
  std::size_t max_depth = 128;  ///< nesting of inline subschemas
};

namespace detail {

class schema_converter {
 public:
  using json = nlohmann::ordered_json;
  schema_converter(const json& root, const json_schema_options& o) : root_(root), opt_(o) {}

  std::string convert() {
    const std::string body = visit(root_, "#", 0);
    std::string out = "root ::= " + body + "\n";
    for (const auto& [name, rule] : rules_) out += name + " ::= " + rule + "\n";
    return out;
  }

  static std::string literal(std::string_view s) {
    std::string out = "\"";
    for (unsigned char c : s) {
      if (c == '"' || c == '\\') {
        out += '\\';
        out += static_cast<char>(c);
      } else if (c < 0x20) {
        static const char* hex = "0123456789ABCDEF";
        out += "\\x";
        out += hex[c >> 4];
        out += hex[c & 15];
      } else {
        out += static_cast<char>(c);
      }
    }
    return out + "\"";
  }

 private:
  template <class... Parts>
  [[noreturn]] static void fail(const std::string& path, const Parts&... parts) {
    ::llmkit::detail::throw_error("json schema: at ", path, ": ", parts...);
  }

  std::string add_rule(const std::string& name, const std::string& body) {
    if (rules_.find(name) == rules_.end()) {
      if (rules_.size() >= opt_.max_rules) fail("#", "more than ", opt_.max_rules, " grammar rules");
      rules_[name] = body;
    }
    return name;
  }
  std::string fresh(const std::string& hint) { return hint + "-" + std::to_string(counter_++); }

  // The common rules, added on first use.
  std::string ws() { return add_rule("ws", "[ \\t\\n]{0,20}"); }
  std::string str_char() {
    return add_rule("json-char", "[^\"\\\\\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4})");
  }
  std::string string_rule() { return add_rule("json-string", "\"\\\"\" " + str_char() + "* \"\\\"\""); }
  std::string integer_rule() { return add_rule("json-integer", "\"-\"? (\"0\" | [1-9] [0-9]{0,15})"); }
  std::string number_rule() {
    return add_rule("json-number", integer_rule() + " (\".\" [0-9]{1,16})? ([eE] [-+]? [0-9]{1,16})?");
  }
  std::string any_value() {
    if (rules_.count("json-value")) return "json-value";
    rules_["json-value"] = "";  // placeholder: the value rule is recursive
    const std::string w = ws();
    const std::string kv = string_rule() + " " + w + " \":\" " + w + " json-value " + w;
    add_rule("json-object", "\"{\" " + w + " (" + kv + " (\",\" " + w + " " + kv + ")*)? \"}\"");
    add_rule("json-array",
             "\"[\" " + w + " (json-value " + w + " (\",\" " + w + " json-value " + w + ")*)? \"]\"");
    rules_["json-value"] = "json-object | json-array | " + string_rule() + " | " + number_rule() +
                           " | \"true\" | \"false\" | \"null\"";
    return "json-value";
  }

  void check_keywords(const json& s, const std::string& path) {
    static const std::set<std::string, std::less<>> known{
        "type", "properties", "required", "additionalProperties", "items", "prefixItems", "minItems", "maxItems",
        "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "$defs", "definitions", "minLength", "maxLength",
        "format", "pattern", "minimum", "maximum", "title", "description", "default", "examples", "$schema", "$id", "$comment"};
    if (!opt_.strict) return;
    for (auto it = s.begin(); it != s.end(); ++it)
      if (!known.count(it.key())) fail(path + "/" + it.key(), "keyword '", it.key(), "' is not supported");
  }

  std::string resolve_ref(const std::string& ref, const std::string& path, std::size_t depth) {
    std::string name;
    const json* target = nullptr;
    for (const char* prefix : {"#/$defs/", "#/definitions/"}) {
      const std::string p = prefix;
      if (ref.rfind(p, 0) == 0) {
        name = ref.substr(p.size());
        const std::string key = p.substr(2, p.size() - 3);
        if (root_.contains(key) && root_[key].is_object() && root_[key].contains(name)) target = &root_[key][name];
      }
    }
    if (ref == "#") target = &root_;
    if (!target) fail(path, "$ref '", ref, "' does not name an entry of #/$defs or #/definitions");
    std::string rule = "ref";
    for (char c : name.empty() ? std::string("root") : name)
      rule += (std::isalnum(static_cast<unsigned char>(c)) ? c : '-');
    rule += "-" + std::to_string(std::hash<std::string>{}(ref) % 100000);
    if (rules_.count(rule)) return rule;
    rules_[rule] = "";  // placeholder for recursive references
    rules_[rule] = visit(*target, ref, depth + 1);
    return rule;
  }

  static std::string repeat(std::uint64_t lo, std::optional<std::uint64_t> hi) {
    return "{" + std::to_string(lo) + "," + (hi ? std::to_string(*hi) : std::string()) + "}";
  }

  std::string visit(const json& s, const std::string& path, std::size_t depth) {
    if (depth > opt_.max_depth) fail(path, "schema nested deeper than ", opt_.max_depth);
    if (s.is_boolean()) {
      if (s.get<bool>()) return any_value();
      fail(path, "schema 'false' matches nothing");
    }
    if (!s.is_object()) fail(path, "a schema must be an object or a boolean");
    check_keywords(s, path);
    if (s.contains("$ref")) {
      if (!s["$ref"].is_string()) fail(path + "/$ref", "must be a string");
      return resolve_ref(s["$ref"].get<std::string>(), path + "/$ref", depth);
    }
    if (s.contains("const")) return literal(s["const"].dump());
    if (s.contains("enum")) {
      const json& e = s["enum"];
      if (!e.is_array() || e.empty()) fail(path + "/enum", "must be a non-empty array");
      std::string out = "(";
      for (std::size_t i = 0; i < e.size(); ++i) out += (i ? " | " : "") + literal(e[i].dump());
      return out + ")";
    }
    for (const char* key : {"anyOf", "oneOf"}) {
      if (!s.contains(key)) continue;
      const json& a = s[key];
      if (!a.is_array() || a.empty()) fail(path + "/" + key, "must be a non-empty array");
      std::string out = "(";
      for (std::size_t i = 0; i < a.size(); ++i)
        out += (i ? " | " : "") + visit(a[i], path + "/" + key + "/" + std::to_string(i), depth + 1);
      return out + ")";
    }
    if (s.contains("allOf")) {
      const json& a = s["allOf"];
      if (!a.is_array() || a.empty()) fail(path + "/allOf", "must be a non-empty array");
      if (a.size() == 1) return visit(a[0], path + "/allOf/0", depth + 1);
      json merged = {{"type", "object"}, {"properties", json::object()}, {"required", json::array()}};
      for (std::size_t i = 0; i < a.size(); ++i) {
        const json& part = a[i];
        if (!part.is_object() || !part.contains("properties"))
          fail(path + "/allOf/" + std::to_string(i), "allOf of several schemas is supported for object schemas only");
        for (auto it = part["properties"].begin(); it != part["properties"].end(); ++it)
          merged["properties"][it.key()] = it.value();
        if (part.contains("required"))
          for (const auto& r : part["required"]) merged["required"].push_back(r);
      }
      return visit(merged, path + "/allOf", depth + 1);
    }
    if (s.contains("type")) {
      const json& t = s["type"];
      if (t.is_array()) {
        if (t.empty()) fail(path + "/type", "is an empty array");
        std::string out = "(";
        for (std::size_t i = 0; i < t.size(); ++i) {
          json one = s;
          one["type"] = t[i];
          out += (i ? " | " : "") + visit(one, path, depth + 1);
        }
        return out + ")";
      }
      if (!t.is_string()) fail(path + "/type", "must be a string or an array of strings");
      const std::string type = t.get<std::string>();
      if (type == "string") return string_schema(s, path);
      if (type == "integer") return integer_schema(s, path);
      if (type == "number") return number_schema(s, path);
      if (type == "boolean") return "(\"true\" | \"false\")";
      if (type == "null") return "\"null\"";
      if (type == "object") return object_schema(s, path, depth);
      if (type == "array") return array_schema(s, path, depth);
      fail(path + "/type", "unknown type '", type, "'");
    }
    if (s.contains("properties")) return object_schema(s, path, depth);
    if (s.contains("items") || s.contains("prefixItems")) return array_schema(s, path, depth);
    return any_value();
  }

  static std::optional<std::uint64_t> count_of(const json& s, const char* key, const std::string& path) {
    if (!s.contains(key)) return std::nullopt;
    const json& v = s[key];
    if (!v.is_number_integer() || v.get<std::int64_t>() < 0 || v.get<std::int64_t>() > 4096)
      fail(path + "/" + key, "must be an integer in [0, 4096], got ", v.dump());
    return v.get<std::uint64_t>();
  }

  std::string string_schema(const json& s, const std::string& path) {
    if (s.contains("pattern")) {
      if (!s["pattern"].is_string()) fail(path + "/pattern", "must be a string");
      if (opt_.strict && (s.contains("minLength") || s.contains("maxLength") || s.contains("format")))
        fail(path + "/pattern", "pattern together with minLength, maxLength or format is not supported");
      try {
        return "\"\\\"\" " + regex_to_gbnf(s["pattern"].get<std::string>()) + " \"\\\"\"";
      } catch (const llmkit::error& e) {
        if (opt_.strict) fail(path + "/pattern", e.what());  // non-strict: an unsupported pattern is ignored
      }
    }
    if (s.contains("format")) {
      const std::string f = s["format"].is_string() ? s["format"].get<std::string>() : "";
      const std::string q = "\"\\\"\"";
      // Calendar dates only (validators reject 02-30 and 02-29 of a common year): 31-, 30- and 28-day
      // months, and 02-29 of a leap year (divisible by 4; by 400 when it ends in 00).
      const std::string by4 = "(\"0\" [048] | [2468] [048] | [13579] [26])";
      const std::string day28 = "(\"0\" [1-9] | \"1\" [0-9] | \"2\" [0-8])";
      const std::string date = "([0-9]{4} \"-\" ((\"0\" [13578] | \"1\" [02]) \"-\" (" + day28 +
                               " | \"29\" | \"3\" [01]) | (\"0\" [469] | \"11\") \"-\" (" + day28 +
                               " | \"29\" | \"30\") | \"02-\" " + day28 + ") | ([0-9] [0-9] (\"0\" [48] | [2468] [048] | [13579] [26]) | " +
                               by4 + " \"00\") \"-02-29\")";
      const std::string hm = "([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9]";
      const std::string time = hm + " \":\" [0-5] [0-9] (\".\" [0-9]{1,6})? (\"Z\" | [+-] " + hm + ")";
      const std::string hex = "[0-9a-fA-F]";
      if (f == "date") return q + " " + date + " " + q;
      if (f == "time") return q + " " + time + " " + q;
      if (f == "date-time") return q + " " + date + " \"T\" " + time + " " + q;
      if (f == "uuid")
        return q + " " + hex + "{8} \"-\" " + hex + "{4} \"-\" " + hex + "{4} \"-\" " + hex + "{4} \"-\" " + hex +
               "{12} " + q;
      if (opt_.strict) fail(path + "/format", "format '", s["format"].dump(), "' is not supported");
    }
    const auto lo = count_of(s, "minLength", path);
    const auto hi = count_of(s, "maxLength", path);
    if (lo && hi && *hi < *lo) fail(path, "maxLength ", *hi, " is below minLength ", *lo);
    if (!lo && !hi) return string_rule();
    return "\"\\\"\" " + str_char() + repeat(lo.value_or(0), hi) + " \"\\\"\"";
  }

  static std::optional<double> bound(const json& s, const char* key, const std::string& path) {
    if (!s.contains(key)) return std::nullopt;
    if (!s[key].is_number()) fail(path + "/" + key, "must be a number");
    return s[key].get<double>();
  }

  std::string integer_schema(const json& s, const std::string& path) {
    auto lo = bound(s, "minimum", path), hi = bound(s, "maximum", path);
    if (lo) lo = std::ceil(*lo);
    if (hi) hi = std::floor(*hi);
    if (lo && hi && *hi < *lo) fail(path, "maximum ", *hi, " is below minimum ", *lo);
    if (lo && hi && *hi - *lo < 256) {
      std::string out = "(";
      for (auto v = static_cast<std::int64_t>(*lo); v <= static_cast<std::int64_t>(*hi); ++v)
        out += (v != static_cast<std::int64_t>(*lo) ? " | " : "") + literal(std::to_string(v));
      return out + ")";
    }
    const bool nonneg = lo && *lo >= 0;
    const bool neg = hi && *hi < 0;
    std::size_t digits = 16;
    if (nonneg && hi) digits = std::to_string(static_cast<std::int64_t>(*hi)).size();
    if (neg && lo) digits = std::to_string(static_cast<std::int64_t>(-*lo)).size();
    const std::string body = "(\"0\" | [1-9] [0-9]{0," + std::to_string(digits - 1) + "})";
    if (nonneg) return body;
    if (neg) return "\"-\" [1-9] [0-9]{0," + std::to_string(digits - 1) + "}";
    return integer_rule();
  }

  std::string number_schema(const json& s, const std::string& path) {
    const auto lo = bound(s, "minimum", path), hi = bound(s, "maximum", path);
    if (lo && hi && *hi < *lo) fail(path, "maximum ", *hi, " is below minimum ", *lo);
    const std::string frac = " (\".\" [0-9]{1,16})? ([eE] [-+]? [0-9]{1,16})?";
    if (lo && *lo >= 0) return "(\"0\" | [1-9] [0-9]{0,15})" + frac;
    if (hi && *hi < 0) return "\"-\" (\"0\" | [1-9] [0-9]{0,15})" + frac;  // -0.x may still be > max: approximate
    return number_rule();
  }

  std::string object_schema(const json& s, const std::string& path, std::size_t depth) {
    const std::string w = ws();
    const json empty = json::object();
    const json& props = s.contains("properties") ? s["properties"] : empty;
    if (!props.is_object()) fail(path + "/properties", "must be an object");
    std::set<std::string> required;
    if (s.contains("required")) {
      if (!s["required"].is_array()) fail(path + "/required", "must be an array");
      for (const auto& r : s["required"]) {
        if (!r.is_string()) fail(path + "/required", "entries must be strings");
        if (!props.contains(r.get<std::string>()) && props.size() > 0)
          fail(path + "/required", "'", r.get<std::string>(), "' is not in properties");
        required.insert(r.get<std::string>());
      }
    }
    // Extra keys: allowed when additionalProperties is true or a schema, or
    // when there are no properties and it is absent.
    std::string extra;
    if (s.contains("additionalProperties")) {
      const json& a = s["additionalProperties"];
      if (a.is_object()) extra = visit(a, path + "/additionalProperties", depth + 1);
      else if (a.is_boolean() && a.get<bool>()) extra = any_value();
      else if (!a.is_boolean()) fail(path + "/additionalProperties", "must be a boolean or a schema");
    } else if (props.empty()) {
      extra = any_value();
    }
    const std::string name = fresh("object");
    std::vector<std::string> kv;
    std::vector<bool> optional;
    for (auto it = props.begin(); it != props.end(); ++it) {
      const std::string value = visit(it.value(), path + "/properties/" + it.key(), depth + 1);
      kv.push_back(literal(json(it.key()).dump()) + " " + w + " \":\" " + w + " " + value + " " + w);
      optional.push_back(!required.count(it.key()));
    }
    // first_i / after_i: the members from i on, before or after a first one was written.
    std::string first = "", after = "";
    if (!extra.empty()) {
      const std::string ekv = string_rule() + " " + w + " \":\" " + w + " " + extra + " " + w;
      after = add_rule(name + "-after-" + std::to_string(kv.size()), "(\",\" " + w + " " + ekv + ")*");
      first = add_rule(name + "-first-" + std::to_string(kv.size()), "(" + ekv + " " + after + ")?");
    }
    for (std::size_t i = kv.size(); i-- > 0;) {
      const std::string a = "\",\" " + w + " " + kv[i] + " " + after;
      const std::string f = kv[i] + " " + after;
      const std::string after_i = optional[i] ? "(" + a + ") | " + (after.empty() ? "\"\"" : after) : a;
      const std::string first_i = optional[i] ? "(" + f + ") | " + (first.empty() ? "\"\"" : first) : f;
      after = add_rule(name + "-after-" + std::to_string(i), after_i);
      first = add_rule(name + "-first-" + std::to_string(i), first_i);
    }
    return "\"{\" " + w + " " + (first.empty() ? "" : first + " ") + "\"}\"";
  }

  std::string array_schema(const json& s, const std::string& path, std::size_t depth) {
    const std::string w = ws();
    const auto lo = count_of(s, "minItems", path).value_or(0);
    const auto hi = count_of(s, "maxItems", path);
    if (hi && *hi < lo) fail(path, "maxItems ", *hi, " is below minItems ", lo);
    std::vector<std::string> prefix;
    if (s.contains("prefixItems")) {
      const json& p = s["prefixItems"];
      if (!p.is_array()) fail(path + "/prefixItems", "must be an array");
      for (std::size_t i = 0; i < p.size(); ++i)
        prefix.push_back(visit(p[i], path + "/prefixItems/" + std::to_string(i), depth + 1));
    }
    std::string item;  // empty: no items after the prefix
    if (!s.contains("items")) item = any_value();
    else if (s["items"].is_boolean() && !s["items"].get<bool>()) item = "";
    else item = visit(s["items"], path + "/items", depth + 1);
    const std::size_t k = prefix.size();
    if (item.empty() && lo > k) fail(path, "minItems ", lo, " exceeds the ", k, " prefixItems with items false");
    // rest_j: members from position j on, each after a comma.
    std::string rest;
    if (!item.empty() && !(hi && *hi <= k)) {
      const std::uint64_t a = lo > k ? lo - k : 0;
      std::optional<std::uint64_t> b;
      if (hi) b = *hi - k;
      rest = "(\",\" " + w + " " + item + " " + w + ")" + repeat(a, b);
    }
    std::vector<std::string> all = prefix;
    if (k == 0) {
      if (item.empty() || (hi && *hi == 0)) return "\"[\" " + w + " \"]\"";
      // One leading member, then repeats.
      const std::uint64_t a = lo > 1 ? lo - 1 : 0;
      std::optional<std::uint64_t> b;
      if (hi) b = *hi - 1;
      const std::string body = item + " " + w + " (\",\" " + w + " " + item + " " + w + ")" + repeat(a, b);
      return "\"[\" " + w + " " + (lo == 0 ? "(" + body + ")?" : body) + " \"]\"";
    }
    for (std::size_t j = std::min<std::size_t>(k, hi ? *hi : k); j-- > 1;) {
      const std::string part = "\",\" " + w + " " + prefix[j] + " " + w + " " + rest;
      rest = j >= lo ? "(" + part + ")?" : "(" + part + ")";
    }
    const std::string head = prefix[0] + " " + w + " " + rest;
    return "\"[\" " + w + " " + (lo == 0 ? "(" + head + ")?" : "(" + head + ")") + " \"]\"";
  }

  const json& root_;
  json_schema_options opt_;
  std::map<std::string, std::string> rules_;
  std::size_t counter_ = 0;
};

}  // namespace detail

/// The GBNF text of JSON Schema `schema` (see the file comment).
/// @throws llmkit::error naming the JSON path of an invalid or (strict)
/// unsupported part, or a limit exceeded.
inline std::string schema_to_gbnf(const nlohmann::ordered_json& schema, const json_schema_options& options = {}) {
  return detail::schema_converter(schema, options).convert();
}

/// As above, from the schema's text.
/// @throws llmkit::error also when the text is not JSON.
inline std::string schema_to_gbnf(std::string_view schema_text, const json_schema_options& options = {}) {
  nlohmann::ordered_json schema;
  try {
    schema = nlohmann::ordered_json::parse(schema_text);
  } catch (const nlohmann::json::exception& e) {
    ::llmkit::detail::throw_error("json schema: not valid JSON: ", e.what());
  }
  return schema_to_gbnf(schema, options);
}

/// GBNF for any JSON object (`{"type": "json_object"}` response formats).
inline std::string json_object_gbnf() { return schema_to_gbnf(nlohmann::ordered_json{{"type", "object"}}); }

}  // namespace llmkit::grammar
