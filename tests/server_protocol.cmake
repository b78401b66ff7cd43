# SPDX-License-Identifier: MIT
# test_server_protocol tests llmkit-server's protocol code (examples/server/),
# pure functions: no model, no kernels, no sockets.
include("${PROJECT_SOURCE_DIR}/examples/server/protocol.cmake")
set(llmkit_test_link llmkit_server_protocol)
list(APPEND llmkit_test_labels server)
# The tokenization tests read the vendored stories260K (tokenizer only).
target_compile_definitions(${llmkit_test_target} PRIVATE
  LLMKIT_DEFAULT_MODEL="${PROJECT_SOURCE_DIR}/models/stories260K.gguf")

# The libFuzzer targets of the server (cmake/llmkitFuzzers.cmake: sanitizer
# builds with clang++-14):
# - protocol (fuzz/protocol_fuzzer.cpp): request bodies of either API to a
#   checked request or a 4xx, and a chat's prompt with control tokens only in
#   the template's text; seeds in tests/fuzz/protocol/;
# - http (fuzz/http_fuzzer.cpp): raw request bytes through the server's HTTP
#   parser, limits and checks, then the protocol, to a request or a 4xx;
#   seeds in tests/fuzz/http/.
include("${PROJECT_SOURCE_DIR}/cmake/llmkitFuzzers.cmake")
llmkit_add_fuzzer(NAME protocol TEST "server: protocol fuzzer"
  SOURCES fuzz/protocol_fuzzer.cpp examples/server/openai_protocol.cpp examples/server/tool_calls.cpp
  INCLUDES examples/server TARGETS xsimd nlohmann_json::nlohmann_json SEEDS tests/fuzz/protocol)
# Beast's parser is built as the server's builds have it (NDEBUG: no
# BOOST_ASSERT): some of its internal asserts fire on malformed chunk lines
# that it then refuses safely (ASan and UBSan stay silent on them).
llmkit_add_fuzzer(NAME http TEST "server: http fuzzer"
  SOURCES fuzz/http_fuzzer.cpp examples/server/http_server.cpp examples/server/openai_protocol.cpp examples/server/tool_calls.cpp
  INCLUDES examples/server TARGETS xsimd nlohmann_json::nlohmann_json SEEDS tests/fuzz/http
  DEFINES BOOST_DISABLE_ASSERTS)
