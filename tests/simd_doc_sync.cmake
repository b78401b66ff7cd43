# SPDX-License-Identifier: MIT
# ctest driver: docs/getting-started.md must quote tests/consumer/project/main.cpp
# verbatim between its begin/end markers (the program the consumer test builds).
#   -DDOC=<markdown file> -DSOURCE=<source file>
file(READ "${DOC}" doc)
file(READ "${SOURCE}" source)
string(REGEX MATCH "<!-- begin tests/consumer/project/main.cpp -->\n```cpp\n(.*)```\n<!-- end tests/consumer/project/main.cpp -->" _ "${doc}")
if(NOT CMAKE_MATCH_1)
  message(FATAL_ERROR "${DOC}: no quoted main.cpp between the begin/end markers")
endif()
if(NOT CMAKE_MATCH_1 STREQUAL source)
  message(FATAL_ERROR "${DOC} quotes a main.cpp that differs from ${SOURCE}: copy the file into the page")
endif()
message(STATUS "${DOC} quotes ${SOURCE} verbatim")
