# SPDX-License-Identifier: MIT
# Thin wrapper over the CMake presets. Every target first installs missing
# Debian packages (as root) or prints the apt-get line to run.
#   make demo   build and run the main example
#   make test   build everything; run the suite in release and sanitizer builds
#   make bench  run every benchmark at full length (release build)
PACKAGES := cmake make g++ libeigen3-dev libxsimd-dev catch2 libbenchmark-dev \
            libcli11-dev nlohmann-json3-dev clang-14 libclang-rt-14-dev
export CMAKE_BUILD_PARALLEL_LEVEL ?= $(shell nproc)
DEMO ?= llmkit-generate

.PHONY: deps demo test test-release test-sanitize bench clean

deps:
	@./scripts/deps.sh $(PACKAGES)

demo: deps
	cmake --preset release
	cmake --build --preset release --target $(DEMO)
	./build/release/examples/$(DEMO)

test: deps
	cmake --workflow --preset release
	cmake --workflow --preset sanitize

test-release: deps
	cmake --workflow --preset release

test-sanitize: deps
	cmake --workflow --preset sanitize

bench: deps
	cmake --preset release
	cmake --build --preset release
	./scripts/run-benches.sh build/release/bench

clean:
	rm -rf build
