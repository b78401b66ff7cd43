// SPDX-License-Identifier: MIT
// llmkit-server over real sockets: each test starts the program (its path is
// the compile definition LLMKIT_SERVER_BIN) on a free loopback port with the vendored stories260K,
// talks HTTP to it with cpp-httplib's client, and stops it with SIGTERM
// (it must exit 0). Every wait is bounded.
#include <httplib.h>

#include "server_process.hpp"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <future>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

using llmkit_server_test::server_process;

using json = nlohmann::json;
using namespace std::chrono_literals;

httplib::Result post(const server_process& s, const std::string& path, const std::string& body,
                     const httplib::Headers& headers = {}) {
  auto c = s.client();
  return c.Post(path.c_str(), headers, body, "application/json");
}

/// The text of a response: the non-streamed choice, or the streamed pieces joined.
std::string text_of(const std::string& body, bool streamed) {
  if (!streamed) return json::parse(body).at("choices")[0].at("text").get<std::string>();
  std::string text;
  std::size_t pos = 0;
  while ((pos = body.find("data: ", pos)) != std::string::npos) {
    const std::size_t end = body.find("\n\n", pos);
    const std::string data = body.substr(pos + 6, end - pos - 6);
    pos = end;
    if (data == "[DONE]") break;
    const json chunk = json::parse(data);
    for (const auto& c : chunk.at("choices")) text += c.value("text", "");
  }
  return text;
}

/// A value of /metrics (a line `name value`), or -1.
double metric(const server_process& s, const std::string& name) {
  auto c = s.client();
  const auto r = c.Get("/metrics");
  if (!r || r->status != 200) return -1;
  const std::string key = "\n" + name + " ";
  const std::size_t at = r->body.find(key);
  if (at == std::string::npos) return -1;
  return std::stod(r->body.substr(at + key.size()));
}

/// Sends a streamed request on a raw socket, reads until the first SSE
/// event arrived, and closes the connection (a client that goes away).
void disconnect_mid_stream(int port, const std::string& body) {
  llmkit_server_test::raw_connection c(port);
  REQUIRE(c.send("POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body));
  REQUIRE(c.read(30s, "data: ").find("data: ") != std::string::npos);
}  // closed: the client goes away

const std::string lily = R"({"prompt": "Once upon a time", "max_tokens": 24, "temperature": 0})";

}  // namespace

TEST_CASE("every endpoint answers") {
  server_process s;
  auto c = s.client();
  auto health = c.Get("/health");
  REQUIRE(health);
  CHECK(health->status == 200);
  CHECK(json::parse(health->body).at("status") == "ok");
  auto models = c.Get("/v1/models");
  REQUIRE(models);
  CHECK(json::parse(models->body).at("data")[0].at("id") == "stories260K");
  auto r = post(s, "/v1/completions", lily);
  REQUIRE(r);
  CHECK(r->status == 200);
  const json answer = json::parse(r->body);
  CHECK_THAT(answer.at("choices")[0].at("text").get<std::string>(), Catch::Contains("a little girl named Lily"));
  CHECK(answer.at("usage").at("completion_tokens") == 24);
  auto missing = c.Get("/v2/nothing");
  REQUIRE(missing);
  CHECK(missing->status == 404);
  CHECK(json::parse(missing->body).at("error").at("code") == "unknown_route");
  CHECK(metric(s, "llmkit_generated_tokens_total") == 24);
  CHECK(s.stop() == 0);
}

TEST_CASE("the parameters reach the model: stop, max_tokens, n, logprobs, logit_bias, token-id prompts, context") {
  server_process s({"--ctx", "64"});
  auto answer = [&](const json& body) {
    auto r = post(s, "/v1/completions", body.dump());
    REQUIRE(r);
    INFO(r->body);
    REQUIRE(r->status == 200);
    return json::parse(r->body);
  };
  const json greedy = {{"prompt", "Once upon a time"}, {"max_tokens", 24}, {"temperature", 0}};
  const std::string story = answer(greedy).at("choices")[0].at("text");
  REQUIRE(story.find(" girl") != std::string::npos);

  // A stop string cuts the text before it, streamed or not.
  json stop = greedy;
  stop["stop"] = {" girl", "zzz"};
  const json stopped = answer(stop);
  CHECK(stopped.at("choices")[0].at("text") == story.substr(0, story.find(" girl")));
  CHECK(stopped.at("choices")[0].at("finish_reason") == "stop");
  stop["stream"] = true;
  auto streamed = post(s, "/v1/completions", stop.dump());
  REQUIRE(streamed);
  CHECK(text_of(streamed->body, true) == story.substr(0, story.find(" girl")));
  CHECK_THAT(streamed->body, Catch::Contains("\"finish_reason\":\"stop\""));

  json five = greedy;
  five["max_tokens"] = 5;
  const json short_answer = answer(five);
  CHECK(short_answer.at("usage").at("completion_tokens") == 5);
  CHECK(short_answer.at("choices")[0].at("finish_reason") == "length");
  CHECK(story.rfind(short_answer.at("choices")[0].at("text").get<std::string>(), 0) == 0);

  // The same prompt as token ids (BOS, then "Once upon a time") gives the same story.
  json ids = greedy;
  ids["prompt"] = {1, 403, 407, 261, 378};
  CHECK(answer(ids).at("choices")[0].at("text") == story);

  // n samples: one choice each, from their own random streams.
  const json three = answer({{"prompt", "Once upon a time"}, {"max_tokens", 16}, {"n", 3}, {"seed", 5}});
  REQUIRE(three.at("choices").size() == 3);
  std::vector<std::string> texts;
  for (std::size_t i = 0; i < 3; ++i) {
    CHECK(three.at("choices")[i].at("index") == i);
    texts.push_back(three.at("choices")[i].at("text"));
  }
  CHECK_FALSE((texts[0] == texts[1] && texts[1] == texts[2]));

  // logprobs: one entry per token, at most k alternatives, the drawn token's logprob <= 0.
  json lp = five;
  lp["logprobs"] = 2;
  const json with_lp = answer(lp).at("choices")[0].at("logprobs");
  REQUIRE(with_lp.at("tokens").size() == 5);
  for (std::size_t i = 0; i < 5; ++i) {
    CHECK(with_lp.at("token_logprobs")[i].get<double>() <= 0.0);
    CHECK(with_lp.at("top_logprobs")[i].size() <= 2);
  }

  // logit_bias: EOS (id 2) pushed up ends the answer at once.
  json eos = greedy;
  eos["logit_bias"] = {{"2", 100}};
  const json ended = answer(eos);
  CHECK(ended.at("choices")[0].at("text") == "");
  CHECK(ended.at("choices")[0].at("finish_reason") == "stop");
  CHECK(ended.at("usage").at("completion_tokens") == 1);

  // The context (--ctx 64) bounds prompt + max_tokens.
  json too_long = greedy;
  too_long["max_tokens"] = 60;
  auto refused = post(s, "/v1/completions", too_long.dump());
  REQUIRE(refused);
  CHECK(refused->status == 400);
  CHECK(json::parse(refused->body).at("error").at("code") == "context_length_exceeded");
  CHECK(s.stop() == 0);
}

TEST_CASE("use_beam_search: best_of beams, the n best as choices, width 1 is greedy, streamed is a 400") {
  server_process s;
  auto answer = [&](const json& body) {
    auto r = post(s, "/v1/completions", body.dump());
    REQUIRE(r);
    INFO(r->body);
    REQUIRE(r->status == 200);
    return json::parse(r->body);
  };
  const json greedy = {{"prompt", "Once upon a time"}, {"max_tokens", 12}, {"temperature", 0}};
  const std::string story = answer(greedy).at("choices")[0].at("text");
  json one = greedy;
  one["use_beam_search"] = true;
  one["best_of"] = 1;
  CHECK(answer(one).at("choices")[0].at("text") == story);  // one beam is greedy decoding

  const json beams = answer({{"prompt", "Once upon a time"}, {"max_tokens", 12}, {"use_beam_search", true},
                             {"best_of", 4}, {"n", 2}, {"length_penalty", 1.0}});
  REQUIRE(beams.at("choices").size() == 2);
  std::size_t tokens = 0;
  for (std::size_t i = 0; i < 2; ++i) {
    const json& c = beams.at("choices")[i];
    CHECK(c.at("index") == i);
    CHECK_FALSE(c.at("text").get<std::string>().empty());
    CHECK((c.at("finish_reason") == "stop" || c.at("finish_reason") == "length"));
  }
  CHECK(beams.at("choices")[0].at("text") != beams.at("choices")[1].at("text"));
  tokens = beams.at("usage").at("completion_tokens").get<std::size_t>();
  CHECK(tokens > 0);

  json streamed = one;
  streamed["stream"] = true;
  auto refused = post(s, "/v1/completions", streamed.dump());
  REQUIRE(refused);
  CHECK(refused->status == 400);
  CHECK_THAT(json::parse(refused->body).at("error").at("message").get<std::string>(),
             Catch::Contains("beam search cannot be streamed"));
  CHECK(s.stop() == 0);
}

TEST_CASE("streamed text equals non-streamed text, and a seeded request is equal alone and with 16 others in flight") {
  server_process s({"--max-queue", "64"});
  const json request = {{"prompt", "Lily and Ben"}, {"max_tokens", 32}, {"temperature", 0.9}, {"seed", 42}};
  auto alone = post(s, "/v1/completions", request.dump());
  REQUIRE(alone);
  REQUIRE(alone->status == 200);
  const std::string expected = text_of(alone->body, false);
  json streamed = request;
  streamed["stream"] = true;
  auto st = post(s, "/v1/completions", streamed.dump());
  REQUIRE(st);
  CHECK(text_of(st->body, true) == expected);

  std::vector<std::future<httplib::Result>> others;
  for (int i = 0; i < 16; ++i) {
    json other = request;
    other["seed"] = 1000 + i;
    other["stream"] = i % 2 == 0;
    others.push_back(std::async(std::launch::async, [&s, body = other.dump()] { return post(s, "/v1/completions", body); }));
  }
  auto loaded = post(s, "/v1/completions", request.dump());
  for (auto& f : others) {
    auto r = f.get();
    REQUIRE(r);
    CHECK(r->status == 200);
  }
  REQUIRE(loaded);
  CHECK(text_of(loaded->body, false) == expected);
  CHECK(s.stop() == 0);
}

TEST_CASE("the serial backend answers as the engine does: the same text, streamed or not, stop strings, n") {
  server_process engine({"--kv-type", "f32"});
  server_process serial({"--backend", "serial"});
  const std::vector<json> requests{
      {{"prompt", "Once upon a time"}, {"max_tokens", 24}, {"temperature", 0}},
      {{"prompt", "Once upon a time"}, {"max_tokens", 24}, {"temperature", 0}, {"stop", {" girl", "zzz"}}},
      // A stop string that spans tokens, and one that never completes (held back, then released).
      {{"prompt", "Once upon a time"}, {"max_tokens", 24}, {"temperature", 0}, {"stop", {"re was a l"}}},
      {{"prompt", "Once upon a time"}, {"max_tokens", 24}, {"temperature", 0}, {"stop", {"Lily.\n\nzzz"}}},
      {{"prompt", "Lily and Ben"}, {"max_tokens", 32}, {"temperature", 0.9}, {"seed", 42}},
      {{"prompt", "Lily and Ben"}, {"max_tokens", 16}, {"n", 3}, {"seed", 5}},
      {{"prompt", "Once"}, {"max_tokens", 24}, {"logit_bias", {{"2", 100}}}},
  };
  for (const json& request : requests) {
    INFO(request.dump());
    auto e = post(engine, "/v1/completions", request.dump());
    auto r = post(serial, "/v1/completions", request.dump());
    REQUIRE(e);
    REQUIRE(r);
    REQUIRE(e->status == 200);
    REQUIRE(r->status == 200);
    const json ej = json::parse(e->body), rj = json::parse(r->body);
    CHECK(rj.at("choices") == ej.at("choices"));
    CHECK(rj.at("usage") == ej.at("usage"));
    if (request.value("n", 1) != 1) continue;
    json streamed = request;
    streamed["stream"] = true;
    auto st = post(serial, "/v1/completions", streamed.dump());
    REQUIRE(st);
    CHECK(text_of(st->body, true) == text_of(r->body, false));
  }
  CHECK(engine.stop() == 0);
  CHECK(serial.stop() == 0);
}

TEST_CASE("speculative decoding: --draft ngram and --draft self answer with the text of a server without drafting, per-request switches") {
  server_process plain({"--kv-type", "f32"});
  const std::vector<json> requests{
      {{"prompt", "Once upon a time"}, {"max_tokens", 48}, {"temperature", 0}},
      {{"prompt", "The cat sat on the mat. The cat was happy. The cat"}, {"max_tokens", 40}, {"temperature", 0},
       {"stop", {"dog"}}},
      {{"prompt", "Lily and Ben"}, {"max_tokens", 32}, {"temperature", 0.9}, {"seed", 42}},
      {{"prompt", "Lily and Ben"}, {"max_tokens", 16}, {"n", 2}, {"seed", 5}},
  };
  for (const char* draft : {"ngram", "self"}) {
    INFO("--draft " << draft);
    server_process spec({"--kv-type", "f32", "--draft", draft, "--draft-max", "6"});
    for (const json& request : requests) {
      INFO(request.dump());
      auto p = post(plain, "/v1/completions", request.dump());
      REQUIRE(p);
      REQUIRE(p->status == 200);
      json opted_out = request, fewer = request;
      opted_out["speculative"] = false;
      fewer["speculative.n_max"] = 2;
      for (const json& variant : {request, opted_out, fewer}) {
        auto r = post(spec, "/v1/completions", variant.dump());
        REQUIRE(r);
        REQUIRE(r->status == 200);
        CHECK(json::parse(r->body).at("choices") == json::parse(p->body).at("choices"));
      }
      json streamed = request;
      streamed["stream"] = true;
      auto st = post(spec, "/v1/completions", streamed.dump());
      REQUIRE(st);
      if (request.value("n", 1) == 1) CHECK(text_of(st->body, true) == text_of(p->body, false));
    }
    for (const json& bad : {json{{"prompt", "Once"}, {"speculative.n_max", 0}},
                            json{{"prompt", "Once"}, {"speculative.n_max", 17}},
                            json{{"prompt", "Once"}, {"speculative", "yes"}}}) {
      auto r = post(spec, "/v1/completions", bad.dump());
      REQUIRE(r);
      CHECK(r->status == 400);
      CHECK(r->body.find("speculative") != std::string::npos);
    }
    CHECK(spec.stop() == 0);
  }
  CHECK(plain.stop() == 0);
}

TEST_CASE("completions on each KV element type: --kv-type f32, f16, bf16, int8") {
  const json greedy = {{"prompt", "Once upon a time"}, {"max_tokens", 24}, {"temperature", 0}};
  std::map<std::string, std::string> texts;
  for (const char* type : {"f32", "f16", "bf16", "int8"}) {
    INFO("--kv-type " << type);
    server_process s({"--kv-type", type});
    auto r = post(s, "/v1/completions", greedy.dump());
    REQUIRE(r);
    REQUIRE(r->status == 200);
    const json answer = json::parse(r->body);
    CHECK(answer.at("usage").at("completion_tokens") == 24);
    CHECK(answer.at("choices")[0].at("finish_reason") == "length");
    texts[type] = answer.at("choices")[0].at("text");
    // A shared prefix is reused from the cache's published blocks: the same answer again.
    auto again = post(s, "/v1/completions", greedy.dump());
    REQUIRE(again);
    CHECK(json::parse(again->body).at("choices")[0].at("text") == texts[type]);
    CHECK(metric(s, "llmkit_generated_tokens_total") == 48);
    CHECK(s.stop() == 0);
  }
  INFO("f32: " << texts["f32"] << "\nf16: " << texts["f16"] << "\nbf16: " << texts["bf16"] << "\nint8: " << texts["int8"]);
  CHECK_THAT(texts["f32"], Catch::StartsWith(", there was a little girl named Lily."));
  // On stories260K the greedy story's margins are wider than the storage
  // error (tests/test_model.cpp bounds it per logit: f16 0.05, bf16 0.25,
  // int8 0.5): the half types give f32's text; int8 its first sentence.
  CHECK(texts["f16"] == texts["f32"]);
  CHECK(texts["bf16"] == texts["f32"]);
  CHECK_THAT(texts["int8"], Catch::StartsWith(", there was a little girl named Lily."));
}

TEST_CASE("model loading options: --activations f32, --no-mmap and --mlock serve the same story") {
  const json greedy = {{"prompt", "Once upon a time"}, {"max_tokens", 16}, {"temperature", 0}};
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"--activations", "f32"}, {"--no-mmap"}, {"--mlock"}, {"--backend", "serial", "--no-mmap"}}) {
    INFO(args[0]);
    server_process s(args);
    auto r = post(s, "/v1/completions", greedy.dump());
    REQUIRE(r);
    REQUIRE(r->status == 200);
    CHECK_THAT(json::parse(r->body).at("choices")[0].at("text").get<std::string>(),
               Catch::StartsWith(", there was a little girl named Lily."));
    CHECK(s.stop() == 0);
  }
}

TEST_CASE("32 concurrent streams all finish") {
  server_process s({"--chat-template", "zephyr"});
  std::vector<std::future<httplib::Result>> streams;
  for (int i = 0; i < 32; ++i)
    streams.push_back(std::async(std::launch::async, [&s, i] {
      const json body = {{"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}, {"max_tokens", 8},
                         {"seed", i}, {"stream", true}};
      return post(s, "/v1/chat/completions", body.dump());
    }));
  for (auto& f : streams) {
    auto r = f.get();
    INFO("httplib error " << httplib::to_string(r.error()));
    REQUIRE(r);
    CHECK(r->status == 200);
    CHECK_THAT(r->body, Catch::Contains("\"delta\":{\"role\":\"assistant\",\"content\":\"\"}"));
    CHECK_THAT(r->body, Catch::EndsWith("data: [DONE]\n\n"));
  }
  // The backend clears its running slot just after the last finish event.
  double running = -1;
  for (int i = 0; i < 100 && running != 0; ++i) {
    running = metric(s, "llmkit_running_requests");
    if (running != 0) std::this_thread::sleep_for(20ms);
  }
  CHECK(running == 0);
  CHECK(metric(s, "llmkit_requests_total{finish_reason=\"stop\"}") +
            metric(s, "llmkit_requests_total{finish_reason=\"length\"}") ==
        32);
  CHECK(s.stop() == 0);
}

TEST_CASE("401 without the API key, except on /health") {
  server_process s({"--api-key", "sk-test"});
  auto none = post(s, "/v1/completions", lily);
  REQUIRE(none);
  CHECK(none->status == 401);
  CHECK(json::parse(none->body).at("error").at("code") == "invalid_api_key");
  auto wrong = post(s, "/v1/completions", lily, {{"Authorization", "Bearer sk-other"}});
  REQUIRE(wrong);
  CHECK(wrong->status == 401);
  auto right = post(s, "/v1/completions", lily, {{"Authorization", "Bearer sk-test"}});
  REQUIRE(right);
  CHECK(right->status == 200);
  // The tokenizer's routes need the key too (as llama-server's do).
  const std::string tokenize = R"({"content": "Once"})";
  auto tokens = post(s, "/tokenize", tokenize);
  REQUIRE(tokens);
  CHECK(tokens->status == 401);
  auto tokens_right = post(s, "/tokenize", tokenize, {{"Authorization", "Bearer sk-test"}});
  REQUIRE(tokens_right);
  CHECK(tokens_right->status == 200);
  auto text = post(s, "/detokenize", R"({"tokens": [403]})");
  REQUIRE(text);
  CHECK(text->status == 401);
  auto c = s.client();
  auto health = c.Get("/health");
  REQUIRE(health);
  CHECK(health->status == 200);
  CHECK(s.stop() == 0);
}

TEST_CASE("/tokenize and /detokenize in llama-server's shapes, and a user's </s> stays text without --parse-special") {
  server_process s;
  auto answer = [&](const std::string& path, const json& body, int status = 200) {
    auto r = post(s, path, body.dump());
    REQUIRE(r);
    INFO(r->body);
    REQUIRE(r->status == status);
    return json::parse(r->body);
  };
  // "Once upon a time" is the prompt of the token-id test above, without its BOS.
  const std::vector<int> once{403, 407, 261, 378};
  CHECK(answer("/tokenize", {{"content", "Once upon a time"}}).at("tokens") == once);
  std::vector<int> with_bos{1};
  with_bos.insert(with_bos.end(), once.begin(), once.end());
  CHECK(answer("/tokenize", {{"content", "Once upon a time"}, {"add_special", true}}).at("tokens") == with_bos);
  const json pieces = answer("/tokenize", {{"content", "Once upon a time"}, {"with_pieces", true}}).at("tokens");
  REQUIRE(pieces.size() == 4);
  std::string joined;
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    CHECK(pieces[i].at("id") == once[i]);
    joined += pieces[i].at("piece").get<std::string>();
  }
  CHECK(joined == " Once upon a time");
  // A piece that is part of a UTF-8 character is its bytes (llama-server's example on stories260K).
  const json accent = answer("/tokenize", {{"content", "\xC3\xA1"}, {"with_pieces", true}}).at("tokens");
  std::vector<int> bytes;
  for (const auto& t : accent)
    if (t.at("piece").is_array())
      for (const auto& b : t.at("piece")) bytes.push_back(b.get<int>());
  CHECK(bytes == std::vector<int>{0xC3, 0xA1});

  // Back to text, control tokens rendered.
  CHECK(answer("/detokenize", {{"tokens", once}}).at("content") == " Once upon a time");
  CHECK(answer("/detokenize", {{"tokens", with_bos}}).at("content") == "<s> Once upon a time");
  CHECK(answer("/detokenize", {{"tokens", json::array()}}).at("content") == "");

  // A user's </s> is text, and asking for control tokens needs --parse-special.
  const json eos_text = answer("/tokenize", {{"content", "a</s>"}}).at("tokens");
  CHECK(std::find(eos_text.begin(), eos_text.end(), json(2)) == eos_text.end());
  CHECK(answer("/tokenize", {{"content", "a</s>"}, {"parse_special", false}}).at("tokens") == eos_text);
  CHECK(answer("/tokenize", {{"content", "a</s>"}, {"parse_special", true}}, 400).at("error").at("param") ==
        "parse_special");

  // Bad requests name the field.
  CHECK(answer("/detokenize", {{"tokens", {403, 512}}}, 400).at("error").at("param") == "tokens[1]");
  CHECK(answer("/detokenize", {{"tokens", "403"}}, 400).at("error").at("param") == "tokens");
  CHECK(answer("/tokenize", {{"prompt", "Once"}}, 400).at("error").at("param") == "content");
  auto deep = post(s, "/tokenize", R"({"content": "a", "x": )" + std::string(1000, '[') + std::string(1000, ']') + "}");
  REQUIRE(deep);
  CHECK(deep->status == 400);
  auto c = s.client();
  auto get = c.Get("/tokenize");
  REQUIRE(get);
  CHECK(get->status == 404);
  CHECK(s.stop() == 0);

  // --parse-special: the same text holds EOS, by default or when asked.
  server_process trusted({"--parse-special"});
  auto parsed = post(trusted, "/tokenize", R"({"content": "a</s>"})");
  REQUIRE(parsed);
  REQUIRE(parsed->status == 200);
  CHECK(json::parse(parsed->body).at("tokens").back() == 2);
  auto kept = post(trusted, "/tokenize", R"({"content": "a</s>", "parse_special": false})");
  REQUIRE(kept);
  CHECK(json::parse(kept->body).at("tokens") == eos_text);
  CHECK(trusted.stop() == 0);
}

TEST_CASE("413 for a body over --max-body-bytes") {
  server_process s({"--max-body-bytes", "1000"});
  const json big = {{"prompt", std::string(2000, 'a')}};
  auto r = post(s, "/v1/completions", big.dump());
  REQUIRE(r);
  CHECK(r->status == 413);
  CHECK(json::parse(r->body).at("error").at("code") == "request_too_large");
  CHECK(s.stop() == 0);
}

TEST_CASE("429 with Retry-After when the queue is full") {
  server_process s({"--max-queue", "1"});
  // EOS (id 2) banned: every request runs its 2000 tokens.
  const std::string slow =
      R"({"prompt": "Once", "max_tokens": 2000, "temperature": 1, "seed": 1, "logit_bias": {"2": -100}})";
  std::vector<std::future<httplib::Result>> calls;
  for (int i = 0; i < 8; ++i)
    calls.push_back(std::async(std::launch::async, [&s, &slow] { return post(s, "/v1/completions", slow); }));
  int n_429 = 0;
  for (auto& f : calls) {
    auto r = f.get();
    REQUIRE(r);
    if (r->status == 429) {
      ++n_429;
      CHECK(r->get_header_value("Retry-After") == "1");
      CHECK(json::parse(r->body).at("error").at("code") == "queue_full");
    } else {
      CHECK(r->status == 200);
    }
  }
  CHECK(n_429 >= 1);
  CHECK(s.stop() == 0);
}

TEST_CASE("503 while draining after SIGTERM, running requests finish, exit 0") {
  server_process s({"--drain-seconds", "60"});
  // 8 choices of 1000 tokens each (EOS banned): seconds in a release build, tens of seconds under ASan.
  const std::string slow =
      R"({"prompt": "Once", "max_tokens": 1000, "n": 8, "temperature": 1, "seed": 1, "logit_bias": {"2": -100}})";
  auto running = std::async(std::launch::async, [&s, &slow] { return post(s, "/v1/completions", slow); });
  for (int i = 0; i < 100 && metric(s, "llmkit_running_requests") != 1; ++i) std::this_thread::sleep_for(20ms);
  ::kill(s.pid(), SIGTERM);
  std::this_thread::sleep_for(100ms);
  auto refused = post(s, "/v1/completions", lily);
  REQUIRE(refused);
  CHECK(refused->status == 503);
  CHECK(json::parse(refused->body).at("error").at("code") == "draining");
  auto c = s.client();
  auto health = c.Get("/health");
  REQUIRE(health);
  CHECK(health->status == 503);
  auto r = running.get();
  REQUIRE(r);
  CHECK(r->status == 200);
  CHECK(json::parse(r->body).at("usage").at("completion_tokens") == 8000);
  CHECK(s.stop() == 0);
}

TEST_CASE("200 mutated bodies get a 4xx and the server stays healthy") {
  server_process s;
  std::mt19937_64 rng(37);
  const std::string base =
      R"({"prompt": "Once upon a time", "max_tokens": 4, "temperature": 0.5, "top_p": 0.9, "stop": ["\n"], "n": 2})";
  // Values each field refuses.
  const std::vector<std::pair<std::string, std::vector<std::string>>> fields{
      {"max_tokens", {"\"x\"", "-1e300", "1e300", "[]", "{}", "true", "\"NaN\"", "0"}},
      {"temperature", {"\"x\"", "-1e300", "1e300", "[]", "{}", "true", "\"NaN\"", "2.5"}},
      {"top_p", {"\"x\"", "-1e300", "1e300", "[]", "{}", "true", "\"NaN\"", "0"}},
      {"n", {"\"x\"", "-1e300", "1e300", "[]", "{}", "true", "\"NaN\"", "0", "1.5"}},
      {"prompt", {"[]", "{}", "true", "-1e300", "[1.5]", "[-1]"}},
      {"stop", {"{}", "true", "-1e300", "[\"\"]", "[1]", "\"\""}}};
  for (int i = 0; i < 200; ++i) {
    std::string body = base;
    if (i % 2 == 0) {
      body.resize(rng() % (body.size() - 1));  // truncated
    } else {
      const auto& [f, values] = fields[rng() % fields.size()];
      const std::size_t at = body.find("\"" + f + "\": ") + f.size() + 4;
      const std::size_t end = body.find_first_of(",}", body[at] == '[' ? body.find(']', at) : at);
      body.replace(at, end - at, values[rng() % values.size()]);
    }
    auto r = post(s, i % 4 < 2 ? "/v1/completions" : "/v1/chat/completions", body);
    REQUIRE(r);
    INFO(body);
    CHECK(r->status >= 400);
    CHECK(r->status < 500);
  }
  auto c = s.client();
  auto health = c.Get("/health");
  REQUIRE(health);
  CHECK(health->status == 200);
  auto ok = post(s, "/v1/completions", lily);
  REQUIRE(ok);
  CHECK(ok->status == 200);
  CHECK(metric(s, "llmkit_requests_rejected_total") == 200);
  CHECK(s.stop() == 0);
}

TEST_CASE("a client that disconnects mid-stream cancels its request, and KV blocks used return to zero") {
  server_process s;
  disconnect_mid_stream(s.port(),
                        R"({"prompt": "Once upon a time", "max_tokens": 2000, "stream": true, "logit_bias": {"2": -100}})");
  double cancelled = 0;
  for (int i = 0; i < 200 && cancelled < 1; ++i) {
    std::this_thread::sleep_for(50ms);
    cancelled = metric(s, "llmkit_requests_total{finish_reason=\"cancelled\"}");
  }
  CHECK(cancelled == 1);
  CHECK(metric(s, "llmkit_generated_tokens_total") < 2000);
  CHECK(s.stop() == 0);
}
