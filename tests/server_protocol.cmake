# SPDX-License-Identifier: MIT
# test_server_protocol tests llmkit-server's protocol code (examples/server/),
# pure functions: no model, no kernels, no sockets.
include("${PROJECT_SOURCE_DIR}/examples/server/protocol.cmake")
set(llmkit_test_link llmkit_server_protocol)
list(APPEND llmkit_test_labels server)
# The tokenization tests read the vendored stories260K (tokenizer only).
target_compile_definitions(${llmkit_test_target} PRIVATE
  LLMKIT_DEFAULT_MODEL="${PROJECT_SOURCE_DIR}/models/stories260K.gguf")

