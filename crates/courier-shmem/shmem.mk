# OpenSHMEM on Courier: library, headers, wrappers, tests, conformance.
# Included from the top-level Makefile; paths are relative to the repository root.
#
#   make shmem             the library (libcourier_shmem.so, .a) and target/release/{oshcc,oshc++,oshrun}
#   make shmem-check-gen   regenerate shmem.h, shmemx.h and src/typed/list.rs into a temp dir and diff
#   make shmem-test        the headers against the library's exports (tests/symbols.py), then
#                          the C test programs under courier run (2 and 4 PEs, shm and tcp)
#   make conformance       Sandia OpenSHMEM's test suite (SOS_TESTS=path, default ../shared/conformance/tests-sos)
#   make install           also installs the library, headers, wrappers and courier-shmem.pc

SHMEM_DIR := crates/courier-shmem
SHMEM_LIBDIR := $(abspath target/release)
SHMEM_VERSION := $(CAPI_VERSION)
SHMEM_WRAPPERS := target/release/oshcc target/release/oshc++ target/release/oshrun

.PHONY: shmem shmem-check-gen shmem-test conformance shmem-install shmem-uninstall

# oshcc / oshc++ / oshrun from their templates: $(1) output, $(2) template, $(3) name,
# $(4) compiler variable, $(5) default-compiler variable, $(6) default compiler,
# $(7) include dir, $(8) lib dir, $(9) courier binary.
define shmem_wrapper
	sed -e 's|@NAME@|$(3)|g' -e 's|@ENVVAR@|$(4)|g' -e 's|@DEFCC_VAR@|$(5)|g' -e 's|@DEFCC@|$(6)|g' \
	    -e 's|@INCDIR@|$(7)|g' -e 's|@LIBDIR@|$(8)|g' -e 's|@COURIER@|$(9)|g' -e 's|@VERSION@|$(SHMEM_VERSION)|g' $(2) > $(1)
	chmod 0755 $(1)
endef

shmem:
	$(CARGO_BUILD)
	$(call shmem_wrapper,target/release/oshcc,$(SHMEM_DIR)/scripts/oshcc.in,oshcc,COURIER_SHMEM_CC,CC,cc,$(abspath $(SHMEM_DIR)/include),$(SHMEM_LIBDIR),)
	$(call shmem_wrapper,target/release/oshc++,$(SHMEM_DIR)/scripts/oshcc.in,oshc++,COURIER_SHMEM_CXX,CXX,c++,$(abspath $(SHMEM_DIR)/include),$(SHMEM_LIBDIR),)
	$(call shmem_wrapper,target/release/oshrun,$(SHMEM_DIR)/scripts/oshrun.in,oshrun,,,,,,$(SHMEM_LIBDIR)/courier)

shmem-check-gen:
	@tmp=$$(mktemp -d) && python3 $(SHMEM_DIR)/gen/generate.py $$tmp && \
	  for f in include/shmem.h include/shmemx.h $$(cd $$tmp && ls src/typed/*.rs); do \
	    diff -u $(SHMEM_DIR)/$$f $$tmp/$$f || { echo "$$f: out of date; run python3 $(SHMEM_DIR)/gen/generate.py" >&2; rm -rf $$tmp; exit 1; }; \
	  done; rm -rf $$tmp; echo "shmem-check-gen: generated files are current"

shmem-test: shmem
	python3 $(SHMEM_DIR)/tests/symbols.py target/release/libcourier_shmem.so
	bash $(SHMEM_DIR)/tests/run.sh

SOS_TESTS ?= ../shared/conformance/tests-sos
conformance: shmem
	bash $(SHMEM_DIR)/conformance/run.sh $(SOS_TESTS)

shmem-install: shmem
	install -d $(DESTDIR)$(PREFIX)/lib $(DESTDIR)$(PREFIX)/include $(DESTDIR)$(PREFIX)/lib/pkgconfig $(DESTDIR)$(PREFIX)/bin
	install -m 0755 target/release/libcourier_shmem.so $(DESTDIR)$(PREFIX)/lib/libcourier_shmem.so
	install -m 0644 target/release/libcourier_shmem.a $(DESTDIR)$(PREFIX)/lib/libcourier_shmem.a
	install -m 0644 $(SHMEM_DIR)/include/shmem.h $(SHMEM_DIR)/include/shmemx.h $(DESTDIR)$(PREFIX)/include/
	sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@VERSION@|$(SHMEM_VERSION)|g' $(SHMEM_DIR)/courier-shmem.pc.in > $(DESTDIR)$(PREFIX)/lib/pkgconfig/courier-shmem.pc
	$(call shmem_wrapper,$(DESTDIR)$(PREFIX)/bin/oshcc,$(SHMEM_DIR)/scripts/oshcc.in,oshcc,COURIER_SHMEM_CC,CC,cc,$(PREFIX)/include,$(PREFIX)/lib,)
	$(call shmem_wrapper,$(DESTDIR)$(PREFIX)/bin/oshc++,$(SHMEM_DIR)/scripts/oshcc.in,oshc++,COURIER_SHMEM_CXX,CXX,c++,$(PREFIX)/include,$(PREFIX)/lib,)
	install -m 0755 target/release/courier $(DESTDIR)$(PREFIX)/bin/courier
	$(call shmem_wrapper,$(DESTDIR)$(PREFIX)/bin/oshrun,$(SHMEM_DIR)/scripts/oshrun.in,oshrun,,,,,,$(PREFIX)/bin/courier)

SHMEM_INSTALLED := lib/libcourier_shmem.so lib/libcourier_shmem.a include/shmem.h include/shmemx.h \
	lib/pkgconfig/courier-shmem.pc bin/oshcc bin/oshc++ bin/oshrun bin/courier
shmem-uninstall:
	rm -f $(addprefix $(DESTDIR)$(PREFIX)/,$(SHMEM_INSTALLED))
