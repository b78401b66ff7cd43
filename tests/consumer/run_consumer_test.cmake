# SPDX-License-Identifier: MIT
# ctest driver: builds tests/consumer/project against llmkit as a user would.
#   -DMODE=find_package|add_subdirectory -DLLMKIT_SOURCE_DIR=... -DWORK_DIR=...
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "command failed (${rc}): ${ARGN}\n${out}")
  endif()
  message(STATUS "${out}")
endfunction()

file(REMOVE_RECURSE "${WORK_DIR}")
set(gen -G "${GENERATOR}")
if(MODE STREQUAL "find_package")
  run(${CMAKE_COMMAND} ${gen} -S "${LLMKIT_SOURCE_DIR}" -B "${WORK_DIR}/llmkit-build"
      -DLLMKIT_BUILD_TESTS=OFF -DLLMKIT_BUILD_BENCH=OFF -DLLMKIT_BUILD_EXAMPLES=OFF
      -DCMAKE_INSTALL_PREFIX=${WORK_DIR}/prefix)
  run(${CMAKE_COMMAND} --install "${WORK_DIR}/llmkit-build")
  run(${CMAKE_COMMAND} ${gen} -S "${LLMKIT_SOURCE_DIR}/tests/consumer/project" -B "${WORK_DIR}/build"
      -DLLMKIT_CONSUME=find_package -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix -DCMAKE_BUILD_TYPE=Release)
else()
  run(${CMAKE_COMMAND} ${gen} -S "${LLMKIT_SOURCE_DIR}/tests/consumer/project" -B "${WORK_DIR}/build"
      -DLLMKIT_CONSUME=add_subdirectory -DLLMKIT_SOURCE_DIR=${LLMKIT_SOURCE_DIR} -DCMAKE_BUILD_TYPE=Release)
endif()
run(${CMAKE_COMMAND} --build "${WORK_DIR}/build")
run("${WORK_DIR}/build/consumer")
