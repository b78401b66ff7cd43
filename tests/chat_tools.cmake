# SPDX-License-Identifier: MIT
# test_chat_tools: llmkit/chat/ reads tools and calls with nlohmann/json.
llmkit_require(nlohmann_json 3 DEBIAN nlohmann-json3-dev)
target_link_libraries(${llmkit_test_target} PRIVATE nlohmann_json::nlohmann_json)
