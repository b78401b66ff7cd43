// SPDX-License-Identifier: MIT
// llmkit-server's engine backend with a f16 KV cache (its own translation unit: engine_backend.hpp).
#include "engine_backend_impl.hpp"

namespace llmkit_server {

template <>
std::unique_ptr<backend> make_engine_backend_of<llmkit::f16>(const engine_backend_options& o) {
  return make_engine_backend_for<llmkit::f16>(o);
}

}  // namespace llmkit_server
