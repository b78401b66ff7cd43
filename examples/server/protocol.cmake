# SPDX-License-Identifier: MIT
# llmkit_server_protocol: llmkit-server's OpenAI protocol (openai_protocol.cpp, with
# tool calling in tool_calls.cpp),
# compiled once for the server and tests/test_server_protocol.cpp. Included by
# examples/server/CMakeLists.txt and tests/server_protocol.cmake, whichever
# comes first (the sanitizer presets build the tests without the examples).
if(TARGET llmkit_server_protocol)
  return()
endif()
llmkit_require(nlohmann_json 3 DEBIAN nlohmann-json3-dev)
add_library(llmkit_server_protocol STATIC "${CMAKE_CURRENT_LIST_DIR}/openai_protocol.cpp"
  "${CMAKE_CURRENT_LIST_DIR}/tool_calls.cpp")
target_include_directories(llmkit_server_protocol PUBLIC "${CMAKE_CURRENT_LIST_DIR}")
target_link_libraries(llmkit_server_protocol PUBLIC llmkit_inTreeFlags nlohmann_json::nlohmann_json)
