# The two commands a new user needs (README.md): `make demo` and `make test`.
# Both install missing Debian packages first (scripts/install-deps.sh), then configure and build.
PRESET ?= release
JOBS ?= $(shell nproc)
PREFIX ?= /usr/local

.PHONY: all deps bench-deps build demo test bench install clean

all: build

deps:
	bash scripts/install-deps.sh

# Optional: what benchmarks/torch_compare.py needs (Debian's python3-torch); never part of `make test`.
bench-deps:
	bash scripts/install-deps.sh --bench

build: deps
	cmake --preset $(PRESET)
	cmake --build --preset $(PRESET) -j $(JOBS)

# The test preset leaves out labels slow, tcp (the MPI tests again over TCP) and docs_output (the demo
# and the runs whose output README.md and docs/ quote, checked by tests/docs), which .ci/run runs after
# this.
# The preset retries a test that timed out once (the machine stalling); scripts/ctest-retries.sh names
# every test that passed only so. The long fault and fuzz runs (labels faults_long, fuzz_long) are
# .ci/run phases of their own.
test: build
	ctest --preset $(PRESET) -j $(JOBS); status=$$?; bash scripts/ctest-retries.sh build/$(PRESET); exit $$status

# The benchmarks (docs/benchmarks.md): not part of `make build`, so that `make test` builds only what the
# tests run.
bench: build
	cmake --build --preset $(PRESET) -j $(JOBS) --target benchmarks

demo: build
	bash scripts/demo.sh build/$(PRESET)

# The `zeroshard` tool into $(PREFIX)/bin (on PATH for /usr/local), with the library, its headers and
# its CMake package (find_package(zeroshard), README.md). The docs write plain `zeroshard` for it; without
# `make install` it is build/$(PRESET)/tools/zeroshard.
install: build
	cmake --install build/$(PRESET) --prefix $(PREFIX)

clean:
	rm -rf build
