// SPDX-License-Identifier: MIT
// llmkit-tokenize: text to token ids and back with a GGUF model's tokenizer
// (SentencePiece or byte-level BPE, whichever the file names).
//
//   llmkit-tokenize [--model PATH] [--text TEXT] [--bos] [--special]
//   llmkit-tokenize [--model PATH] --decode --text "[1,2,3]" [--special]
//
// Encoding prints the ids as one JSON array on stdout; decoding prints the
// text. `--text -` reads the text (or the ids) from stdin.
#include <llmkit/model/gguf.hpp>
#include <llmkit/model/tokenizer.hpp>

#include "example_cli.hpp"

#include <cstdint>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

namespace {

// Ids from "[1, 2, 3]" or "1,2,3" (brackets, commas and white space separate).
std::vector<llmkit::token_id> parse_ids(const std::string& text) {
  std::vector<llmkit::token_id> ids;
  for (std::size_t at = 0; at < text.size();) {
    const char c = text[at];
    if (c == '[' || c == ']' || c == ',' || c == ' ' || c == '\t' || c == '\n' || c == '\r') {
      ++at;
      continue;
    }
    std::size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(text.substr(at), &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || v < INT32_MIN || v > INT32_MAX)
      throw std::invalid_argument("--decode: '" + text.substr(at, 16) + "' is not a token id");
    ids.push_back(static_cast<llmkit::token_id>(v));
    at += used;
  }
  return ids;
}

}  // namespace

int main(int argc, char** argv) {
  llmkit_examples::command_line cli{
      "Turn text into token ids (one JSON array) or ids into text, with a GGUF model's tokenizer"};
  cli.show_defaults();
  std::string model_path = LLMKIT_DEFAULT_MODEL;
  std::string text = "Once upon a time";
  bool add_bos = false, parse_special = false, decode = false;
  cli.add_option("--model", model_path, "GGUF file with a tokenizer (tokenizer.ggml.model llama or gpt2)");
  cli.add_option("--text", text, "text to encode, or with --decode the ids (\"[1,2,3]\" or 1,2,3); - reads stdin");
  cli.add_flag("--bos", add_bos, "prepend the BOS token when encoding");
  cli.add_flag("--special", parse_special,
               "encoding: turn special-token text (<|eot_id|>, <s>) into its id; decoding: print control tokens");
  cli.add_flag("--decode", decode, "read ids from --text and print their text");
  if (const auto exit_code = cli.parse(argc, argv)) return *exit_code;
  if (text == "-") text.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());

  try {
    const auto tok = llmkit::model::tokenizer::from_gguf(llmkit::model::gguf_file::open(model_path));
    if (decode) {
      const std::string out = tok.decode(parse_ids(text), {.render_special = parse_special});
      std::cout.write(out.data(), static_cast<std::streamsize>(out.size()));
      std::cout << "\n";
      return 0;
    }
    const auto ids = tok.encode(text, {.add_bos = add_bos, .parse_special = parse_special});
    std::cout << "[";
    for (std::size_t i = 0; i < ids.size(); ++i) std::cout << (i ? "," : "") << ids[i];
    std::cout << "]\n";
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
