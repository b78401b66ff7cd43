# SPDX-License-Identifier: MIT
# Thin wrapper over the CMake presets. Every target first installs missing
# Debian packages (as root) or prints the apt-get line to run.
#   make demo   build and run the main example
#   make test   build everything; run the suite in release and sanitizer builds,
#               then the threaded tests under ThreadSanitizer (the release run
#               measures the machine into build/roofline.json first, a few
#               seconds, unless a file is already there)
#   make bench  run every benchmark at full length (release build)
#   make test-clang  the release tests, examples included, built with clang++-19
#               (the clang preset), after compiling <llmkit/llmkit.hpp> in one
#               translation unit with clang++-16; not part of make test
PACKAGES := cmake make ninja-build g++ libeigen3-dev libxsimd-dev catch2 libbenchmark-dev \
            libcli11-dev nlohmann-json3-dev clang-14 libclang-rt-14-dev \
            libcpp-httplib-dev pkg-config libboost1.81-dev
# Open MPI: the disaggregated prefill/decode example and its test (two ranks);
# configure with -DLLMKIT_WITH_MPI=OFF to build without it.
MPI_PACKAGES := libopenmpi-dev openmpi-bin
# The compilers make test-clang builds with (libstdc++, as with g++).
CLANG_PACKAGES := clang-16 clang-19
export CMAKE_BUILD_PARALLEL_LEVEL ?= $(shell nproc)
export CTEST_PARALLEL_LEVEL ?= $(shell nproc)
DEMO ?= llmkit-generate

.PHONY: deps deps-all deps-clang stale-builds demo test test-release test-sanitize test-tsan test-clang bench clean

deps:
	@./scripts/deps.sh $(PACKAGES)

# Also the `openai`, `ajv` and `ajv-formats` npm packages for llmkit-server's client tests (npm ci from
# tests/server-client/package-lock.json; skipped with a note without node).
deps-all:
	@./scripts/deps.sh $(PACKAGES) $(MPI_PACKAGES)
	@./scripts/server-client-deps.sh

deps-clang:
	@./scripts/deps.sh $(CLANG_PACKAGES)

# The presets use Ninja: a build folder configured by another generator (an
# older checkout's Unix Makefiles) cannot be reconfigured, so it starts afresh.
stale-builds:
	@for d in build/*/; do \
	  if [ -f "$$d/CMakeCache.txt" ] && ! grep -qx 'CMAKE_GENERATOR:INTERNAL=Ninja' "$$d/CMakeCache.txt"; then \
	    echo "llmkit: $$d was configured for another generator; removing it"; rm -rf "$$d"; fi; \
	done

demo: deps stale-builds
	cmake --preset release
	cmake --build --preset release --target $(DEMO)
	./build/release/examples/$(DEMO)

test: deps-all stale-builds
	cmake --workflow --preset release
	cmake --workflow --preset sanitize
	cmake --workflow --preset tsan

test-release: deps-all stale-builds
	cmake --workflow --preset release

test-sanitize: deps-all stale-builds
	cmake --workflow --preset sanitize

test-tsan: deps-all stale-builds
	cmake --workflow --preset tsan

test-clang: deps-all deps-clang stale-builds
	printf '#include <llmkit/llmkit.hpp>\nint main() {}\n' | \
	  clang++-16 -std=c++20 -march=native -O1 -Iinclude -I/usr/include/eigen3 -x c++ - -c -o /dev/null
	cmake --workflow --preset clang

bench: deps-all stale-builds
	cmake --preset release
	cmake --build --preset release
	./scripts/run-benches.sh build/release/bench

clean:
	rm -rf build
