// SPDX-License-Identifier: MIT
#pragma once

/// @file examples/example_model.hpp
/// The model an example program runs: a GGUF file mapped from disk, or the
/// seeded synthetic ~100M Llama (`model::synthetic_100m_config()`, f16
/// weights, seed 1) built in memory, the same one bench_model writes.

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include <llmkit/model/gguf.hpp>
#include <llmkit/model/synthetic.hpp>

namespace llmkit_examples {

struct example_model {
  std::vector<std::byte> image;                    ///< the synthetic model's bytes (empty for a file)
  std::unique_ptr<llmkit::model::gguf_file> file;  ///< the parsed GGUF (views into `image` or the mapping)
  std::string name;                                ///< the path, or "synthetic-100M"
};

/// Opens `path`, or builds the synthetic model when `synthetic`.
inline example_model open_example_model(bool synthetic, const std::string& path) {
  namespace model = llmkit::model;
  example_model m;
  if (synthetic) {
    m.image = model::synthetic_llama({.config = model::synthetic_100m_config(),
                                      .weight_type = model::ggml_type::f16, .seed = 1}).bytes();
    m.file = std::make_unique<model::gguf_file>(m.image);
    m.name = "synthetic-100M";
  } else {
    m.file = std::make_unique<model::gguf_file>(model::gguf_file::open(path));
    m.name = path;
  }
  return m;
}

}  // namespace llmkit_examples
