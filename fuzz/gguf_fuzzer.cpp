// SPDX-License-Identifier: MIT
// libFuzzer target for the GGUF reader and everything that reads metadata
// from it (tokenizer, Llama config and weight loading). Any input must either
// parse or raise llmkit::error: a crash, leak, hang or sanitizer report is a
// bug. Build: clang++-14 -std=c++20 -march=native -fsanitize=fuzzer,address,undefined
//   -Iinclude fuzz/gguf_fuzzer.cpp (tests/model.cmake does it in sanitizer builds).
#include <llmkit/model/gguf.hpp>
#include <llmkit/model/llama.hpp>
#include <llmkit/model/tokenizer.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace llmkit::model;
  try {
    const gguf_file f(std::as_bytes(std::span(data, size)));
    std::size_t sink = f.data_offset() + f.alignment();
    for (const auto& [key, value] : f.metadata()) {
      sink += key.size() + value.index();
      if (const auto* a = std::get_if<gguf_array>(&value)) {
        if (a->type() == gguf_type::string) {
          for (auto s : a->strings()) sink += s.size();
        } else if (a->type() != gguf_type::array && a->type() != gguf_type::boolean && a->size() > 0) {
          sink += static_cast<std::size_t>(a->get<double>(a->size() - 1) != 0.0);
        }
      }
    }
    for (const auto& t : f.tensors())
      if (t.n_bytes > 0) sink += static_cast<std::size_t>(t.data[0]) + static_cast<std::size_t>(t.data[t.n_bytes - 1]);
    try {
      const auto tok = tokenizer::from_gguf(f);
      const auto ids = tok.encode("Once upon a time \xc3\xa9 12345 it's\r\n <s><|eot_id|>", {.add_bos = true});
      sink += tok.decode(ids).size();
      const auto special = tok.encode("<s>x</s><|bos|>y<|user|>", {.parse_special = true});
      sink += tok.decode(special, {.render_special = true}).size();
    } catch (const llmkit::error&) {
    }
    try {
      llama_model m(f);
      sink += m.vocab_size();
    } catch (const llmkit::error&) {
    }
    volatile std::size_t keep = sink;
    (void)keep;
  } catch (const llmkit::error&) {
  }
  return 0;
}
