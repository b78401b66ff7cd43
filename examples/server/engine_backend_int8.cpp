// SPDX-License-Identifier: MIT
// llmkit-server's engine backend with a int8 KV cache (its own translation unit: engine_backend.hpp).
#include "engine_backend_impl.hpp"

namespace llmkit_server {

template <>
std::unique_ptr<backend> make_engine_backend_of<std::int8_t>(const engine_backend_options& o) {
  return make_engine_backend_for<std::int8_t>(o);
}

}  // namespace llmkit_server
