# SPDX-License-Identifier: MIT
# Thin wrapper over the CMake presets. Every target first installs missing
# Debian packages (as root) or prints the apt-get line to run.
#   make demo   build and run the main example
#   make test   build everything; run the suite in release and sanitizer builds,
#               then the threaded tests under ThreadSanitizer (the release run
#               measures the machine into build/roofline.json first, a few
#               seconds, unless a file is already there)
#   make bench  run every benchmark at full length (release build)
PACKAGES := cmake make ninja-build g++ libeigen3-dev libxsimd-dev catch2 libbenchmark-dev \
            libcli11-dev nlohmann-json3-dev clang-14 libclang-rt-14-dev \
            libcpp-httplib-dev pkg-config libboost1.81-dev
# Open MPI: the disaggregated prefill/decode example and its test (two ranks);
# configure with -DLLMKIT_WITH_MPI=OFF to build without it.
MPI_PACKAGES := libopenmpi-dev openmpi-bin
export CMAKE_BUILD_PARALLEL_LEVEL ?= $(shell nproc)
export CTEST_PARALLEL_LEVEL ?= $(shell nproc)
DEMO ?= llmkit-generate

.PHONY: deps deps-all stale-builds demo test test-release test-sanitize test-tsan bench clean

deps:
	@./scripts/deps.sh $(PACKAGES)

# Also the `openai` npm package for llmkit-server's client test (npm ci from
# tests/server-client/package-lock.json; skipped with a note without node).
deps-all:
	@./scripts/deps.sh $(PACKAGES) $(MPI_PACKAGES)
	@./scripts/server-client-deps.sh

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

bench: deps-all stale-builds
	cmake --preset release
	cmake --build --preset release
	./scripts/run-benches.sh build/release/bench

clean:
	rm -rf build
