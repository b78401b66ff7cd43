# SPDX-License-Identifier: MIT
# Finds a dependency or stops with the Debian package that provides it.
#   llmkit_require(<find_package args...> DEBIAN <package>)
macro(llmkit_require name)
  cmake_parse_arguments(_req "" "DEBIAN" "" ${ARGN})
  find_package(${name} ${_req_UNPARSED_ARGUMENTS} QUIET)
  if(NOT ${name}_FOUND)
    message(FATAL_ERROR
      "llmkit: ${name} was not found. Install the Debian package `${_req_DEBIAN}`:\n"
      "    apt-get install -y ${_req_DEBIAN}\n"
      "(or run `make deps`, which installs every missing package).")
  endif()
endmacro()
