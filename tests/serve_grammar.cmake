# SPDX-License-Identifier: MIT
# test_serve_grammar: llmkit/grammar/json_schema.hpp parses schemas with nlohmann/json.
llmkit_require(nlohmann_json 3 DEBIAN nlohmann-json3-dev)
target_link_libraries(${llmkit_test_target} PRIVATE nlohmann_json::nlohmann_json)
