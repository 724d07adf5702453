# Courier — one command per workflow.
#   make          build everything (release)
#   make run      build and run the main job: the local benchmark suite, both processes started for you
#   make test     every test: scripts, Rust (unit, conformance, multi-process), C examples, Go bindings
#   make bench    side-by-side benchmarks against UCX and libfabric (installs them if missing)
#   make experiments  the seeds' experiments on Courier (apps/): writes apps/RESULTS.md
#   make fuzz     every fuzz target under libFuzzer for FUZZ_SECONDS each (docs/fuzzing.md)
#   make miri     the library's unit tests under Miri (nightly), which checks for undefined behaviour

CARGO ?= cargo
# One build for every target (make, make capi, make shmem, make install): cargo builds a
# library with or without object code depending on what else the command builds (an LTO'd
# cdylib alone needs only bitcode), so `-p courier-capi` after `--workspace` rebuilt
# libcourier and everything above it. The whole workspace every time rebuilds nothing.
CARGO_BUILD = $(CARGO) build --release --workspace
export CARGO_TERM_COLOR ?= never
# rustup installs cargo into ~/.cargo/bin and the Go tarball lives in /usr/local/go/bin; neither
# is on a fresh shell's PATH, and scripts/deps.sh's PATH does not reach make. Look there after
# PATH, so tools already on PATH keep coming first.
export PATH := $(PATH):$(HOME)/.cargo/bin:/usr/local/go/bin

.PHONY: all build run test miri test-rust test-gpu test-scripts test-hello test-snippets test-install lint fmt bench clean deps deps-test fuzz fuzz-seeds

include crates/courier-capi/capi.mk
include crates/courier-shmem/shmem.mk
include apps/apps.mk

all: build

deps:
	@bash scripts/deps.sh

deps-test:
	@bash scripts/deps.sh test

build: deps
	$(CARGO_BUILD)

run: build
	./target/release/courier perf --local

test: deps-test test-scripts test-snippets test-rust capi-check-header capi-test capi-job-test capi-go-test test-hello test-install shmem-check-gen shmem-test apps-test lint
	@echo "make test: all suites passed"

test-rust:
	$(CARGO) test --workspace --release -- --test-threads=2

# Every Rust, C and Go block of the Markdown files is a doctest or a copy of a compiled source.
test-snippets:
	python3 scripts/check-snippets.py

# The hello programs (examples/hello.rs, examples/c/hello.c, bindings/go/cmd/hello) as two
# processes, every server with every client, over shm and tcp.
test-hello: $(CAPI_EXAMPLE_DIR)/hello
	$(CARGO) test --workspace --release --no-run   # builds the examples, as test-rust does
	cd bindings/go && go build $(GO_LIBFLAGS) -o ../../target/go-hello ./cmd/hello
	bash scripts/hello-test.sh target/release/examples/hello $(CAPI_EXAMPLE_DIR)/hello target/go-hello

# make install into a fresh prefix; C (pkg-config courier and courier-static) and Go (its own
# module, -tags courier_system) programs built from it run without LD_LIBRARY_PATH; make
# uninstall removes every file.
test-install:
	MAKE="$(MAKE)" bash scripts/install-test.sh

# On a machine with an NVIDIA GPU and its driver: the CUDA tests (a stand-in driver in
# `make test`) against the real driver and device, one test at a time.
test-gpu: deps-test capi
	COURIER_TEST_CUDA=real $(CARGO) test --release -p courier --test cuda --test cuda_memory -- --test-threads=1
	COURIER_TEST_CUDA=real $(CARGO) test --release -p courier-cli --test cli perf_with_device_memory
	cd bindings/go && COURIER_TEST_CUDA=real go test $(GO_LIBFLAGS) -count=1 -run TestDeviceMemory .

# scripts/deps.sh's toolchain choice, against stubs (installs nothing); the bench report's
# parsers against the output shapes of ucx_perftest, fi_pingpong, courier perf and ceilings.
test-scripts:
	bash scripts/test-deps.sh
	python3 bench/report.py selftest
	python3 bench/exs/report.py selftest
	python3 bench/carry.py selftest
	python3 bench/startup.py selftest

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets --release -- -D warnings
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc -p courier --no-deps
	cd bindings/go && test -z "$$(gofmt -l .)" || { gofmt -l .; echo "gofmt: files above need formatting" >&2; exit 1; }
	cd bindings/go && go vet ./...

bench: build
	bash bench/run.sh

# Every fuzz target (fuzz/) under libFuzzer for FUZZ_SECONDS each, one at a time, niced
# (not in make test, which replays the corpus); numbers in target/fuzz/report.md, for
# docs/fuzzing.md. FUZZ_TARGETS picks some.
FUZZ_SECONDS ?= 60
fuzz:
	@bash scripts/deps.sh fuzz
	bash scripts/fuzz.sh $(FUZZ_SECONDS) $(FUZZ_TARGETS)

# Write every fuzz target's seeds (well-formed messages from the library's emitters) into
# its corpus.
fuzz-seeds:
	$(CARGO) test --release -p courier-fuzz --test corpus -- --ignored write_seeds

# The library's unit tests under Miri (undefined behaviour: out-of-bounds or misaligned
# accesses, use after free, invalid values, aliasing violations under Stacked Borrows).
# Those that need system calls Miri does not model (sockets, epoll on them, memfd and
# shared mappings, CMA, fork) are `#[cfg_attr(miri, ignore)]`: what runs is the pure Rust
# (wire parsers and emitters, remote keys, the key table, addresses, frames, request and
# buffer bookkeeping, configuration parsing, the lock). Not in `make test`: it needs the
# nightly toolchain and takes about half an hour on 2 cores.
# Property tests run 16 cases each there (256 natively): Miri is about a thousand times
# slower, and what it checks is every access, not more inputs.
MIRIFLAGS ?= -Zmiri-disable-isolation
MIRI_PROPTEST_CASES ?= 16
miri:
	@bash scripts/deps.sh miri
	MIRIFLAGS="$(MIRIFLAGS)" PROPTEST_CASES=$(MIRI_PROPTEST_CASES) $(CARGO) +nightly miri test -p courier --lib -- --test-threads=2

clean:
	$(CARGO) clean
