# Courier C ABI: build, header check, C examples as tests, install.
# Included from the top-level Makefile; every path is relative to the repository root.
#
#   make capi                 libcourier.so, libcourier.a (the workspace's one build: $(CARGO_BUILD))
#   make capi-check-header    regenerate include/courier.h into a temp file and diff (needs cbindgen 0.29.4)
#   make capi-examples        build examples/c/*.c against the shared and the static library
#   make capi-test            run every example and C test (exit 0 = pass) with COURIER_TLS=tcp and with the default
#   make install PREFIX=...   lib/, include/, lib/pkgconfig/courier{,-static}.pc, bin/courier (default PREFIX=/usr/local)
#   make uninstall PREFIX=... removes them
#   make capi-go-test         Go bindings: gofmt, vet, tests with -race, then a GC-stress run (GOGC=1)
#   make capi-job-test        examples/c/job_ring under courier run with 1, 2, 4 and 8 ranks

CARGO ?= cargo
CC ?= cc
PREFIX ?= /usr/local
DESTDIR ?=

CAPI_DIR := crates/courier-capi
CAPI_HEADER := $(CAPI_DIR)/include/courier.h
# Extended Sockets: written by hand (cbindgen skips src/exs/), installed beside courier.h.
CAPI_EXS_HEADER := $(CAPI_DIR)/include/exs.h
CAPI_LIBDIR := target/release
CAPI_SO := $(CAPI_LIBDIR)/libcourier.so
CAPI_A := $(CAPI_LIBDIR)/libcourier.a
CAPI_STATIC_LIBS := -lgcc_s -lutil -lrt -lpthread -lm -ldl -lc
CAPI_VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
CAPI_CFLAGS ?= -O2 -g -Wall -Wextra -Werror -std=c11 -D_DEFAULT_SOURCE
CAPI_EXAMPLE_SRCS := $(wildcard examples/c/*.c)
CAPI_EXAMPLE_DIR := target/c-examples
CAPI_EXAMPLES_SHARED := $(patsubst examples/c/%.c,$(CAPI_EXAMPLE_DIR)/%,$(CAPI_EXAMPLE_SRCS))
CAPI_EXAMPLES_STATIC := $(patsubst examples/c/%.c,$(CAPI_EXAMPLE_DIR)/%-static,$(CAPI_EXAMPLE_SRCS))
# C tests (not examples): built against the shared library, run like the examples.
CAPI_CTEST_SRCS := $(wildcard $(CAPI_DIR)/tests/c/*.c)
CAPI_CTESTS := $(patsubst $(CAPI_DIR)/tests/c/%.c,$(CAPI_EXAMPLE_DIR)/test-%,$(CAPI_CTEST_SRCS))
CAPI_EXAMPLE_DEPS := examples/c/common.h examples/c/exs_common.h $(CAPI_DIR)/tests/c/exs_procs.h $(CAPI_HEADER) $(CAPI_EXS_HEADER)
# Transport selections the examples run under (shm is tried by the default, "all").
CAPI_TEST_TLS ?= tcp all

.PHONY: capi capi-check-header capi-examples capi-test capi-job-test capi-go-test install uninstall capi-pc

capi:
	$(CARGO_BUILD)

capi-check-header:
	$(CAPI_DIR)/check-header.sh

# Examples are relinked on every run: cheap, and never stale against a rebuilt library.
$(CAPI_EXAMPLE_DIR)/%: examples/c/%.c $(CAPI_EXAMPLE_DEPS) capi
	@mkdir -p $(CAPI_EXAMPLE_DIR)
	$(CC) $(CAPI_CFLAGS) -I$(CAPI_DIR)/include $< -o $@ -L$(CAPI_LIBDIR) -lcourier -Wl,-rpath,$(abspath $(CAPI_LIBDIR))

$(CAPI_EXAMPLE_DIR)/%-static: examples/c/%.c $(CAPI_EXAMPLE_DEPS) capi
	@mkdir -p $(CAPI_EXAMPLE_DIR)
	$(CC) $(CAPI_CFLAGS) -I$(CAPI_DIR)/include $< -o $@ $(CAPI_A) $(CAPI_STATIC_LIBS)

$(CAPI_EXAMPLE_DIR)/test-%: $(CAPI_DIR)/tests/c/%.c $(CAPI_EXAMPLE_DEPS) capi
	@mkdir -p $(CAPI_EXAMPLE_DIR)
	$(CC) $(CAPI_CFLAGS) -I$(CAPI_DIR)/include $< -o $@ -L$(CAPI_LIBDIR) -lcourier -Wl,-rpath,$(abspath $(CAPI_LIBDIR))

capi-examples: $(CAPI_EXAMPLES_SHARED) $(CAPI_EXAMPLES_STATIC) $(CAPI_CTESTS)

# hello takes a role and an address: scripts/hello-test.sh runs it as two processes.
CAPI_SELF_RUNNING := $(filter-out $(CAPI_EXAMPLE_DIR)/hello $(CAPI_EXAMPLE_DIR)/hello-static,$(CAPI_EXAMPLES_SHARED) $(CAPI_EXAMPLES_STATIC))

capi-test: capi-examples
	@set -e; for tls in $(CAPI_TEST_TLS); do \
	  for ex in $(CAPI_SELF_RUNNING) $(CAPI_CTESTS); do \
	    echo "== COURIER_TLS=$$tls $$ex"; \
	    COURIER_TLS=$$tls timeout 120 $$ex || { echo "FAILED: COURIER_TLS=$$tls $$ex" >&2; exit 1; }; \
	  done; \
	done; echo "capi-test: all C examples passed"

# The job example as a job: courier run's exchange, lazy and eager wire-up, every byte checked.
CAPI_JOB_RANKS ?= 1 2 4 8
capi-job-test: $(CAPI_EXAMPLE_DIR)/job_ring $(CAPI_EXAMPLE_DIR)/job_ring-static
	$(CARGO_BUILD)
	@set -e; for ex in $(CAPI_EXAMPLE_DIR)/job_ring $(CAPI_EXAMPLE_DIR)/job_ring-static; do \
	  for n in $(CAPI_JOB_RANKS); do \
	    echo "== courier run -n $$n $$ex"; \
	    timeout 120 target/release/courier run -n $$n $$ex > target/c-examples/job_ring.out \
	      || { cat target/c-examples/job_ring.out; echo "FAILED: courier run -n $$n $$ex" >&2; exit 1; }; \
	    test "$$(grep -c 'ring and all-to-all OK' target/c-examples/job_ring.out)" = "$$n" \
	      || { cat target/c-examples/job_ring.out; echo "FAILED: not $$n ranks OK" >&2; exit 1; }; \
	  done; \
	done; echo "capi-job-test: job_ring passed under courier run"

# courier.pc and courier-static.pc for PREFIX: $(1) template, $(2) output.
define capi_pc
	sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@VERSION@|$(CAPI_VERSION)|g' $(1) > $(2)
endef

# Always rewritten: the prefix is baked in, and PREFIX may differ from the last run.
capi-pc:
	@mkdir -p $(CAPI_LIBDIR)
	$(call capi_pc,$(CAPI_DIR)/courier.pc.in,$(CAPI_LIBDIR)/courier.pc)
	$(call capi_pc,$(CAPI_DIR)/courier-static.pc.in,$(CAPI_LIBDIR)/courier-static.pc)

# Installs the library, its headers (courier.h, exs.h) and .pc files; shmem-install adds the
# `courier` command, libcourier_shmem, shmem.h, shmemx.h, oshcc, oshc++ and oshrun.
install: capi capi-pc shmem-install
	install -d $(DESTDIR)$(PREFIX)/lib $(DESTDIR)$(PREFIX)/include $(DESTDIR)$(PREFIX)/lib/pkgconfig
	install -m 0755 $(CAPI_SO) $(DESTDIR)$(PREFIX)/lib/libcourier.so
	install -m 0644 $(CAPI_A) $(DESTDIR)$(PREFIX)/lib/libcourier.a
	install -m 0644 $(CAPI_HEADER) $(DESTDIR)$(PREFIX)/include/courier.h
	install -m 0644 $(CAPI_EXS_HEADER) $(DESTDIR)$(PREFIX)/include/exs.h
	install -m 0644 $(CAPI_LIBDIR)/courier.pc $(CAPI_LIBDIR)/courier-static.pc $(DESTDIR)$(PREFIX)/lib/pkgconfig/

# Removes what install installed (and nothing else: directories stay).
CAPI_INSTALLED := lib/libcourier.so lib/libcourier.a include/courier.h include/exs.h \
	lib/pkgconfig/courier.pc lib/pkgconfig/courier-static.pc
uninstall: shmem-uninstall
	rm -f $(addprefix $(DESTDIR)$(PREFIX)/,$(CAPI_INSTALLED))

# The Go binding links target/release/libcourier.a. Go's caches do not notice a rebuilt
# Rust library: -count=1 reruns the tests, and GO_LIBFLAGS (the library's digest in
# courier.LibBuild) makes every test binary relink against the library just built.
GO_LIBFLAGS = -ldflags=-X=courier.dev/courier.LibBuild=$$(sha256sum $(abspath $(CAPI_A)) | cut -c1-16)

capi-go-test: capi
	cd bindings/go && test -z "$$(gofmt -l .)" || { gofmt -l .; echo "gofmt: files above need formatting" >&2; exit 1; }
	cd bindings/go && go vet ./...
	cd bindings/go && go test $(GO_LIBFLAGS) -race -count=1 ./...
	cd bindings/go && GOGC=1 COURIER_TEST_GO_GCSTRESS=1 go test $(GO_LIBFLAGS) -count=1 ./...
	cd bindings/go && COURIER_TLS=tcp go test $(GO_LIBFLAGS) -count=1 ./...
