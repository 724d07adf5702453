# The seeds' experiments on Courier (apps/README.md). Included from the top-level Makefile.
#
#   make apps          build the applications (target/apps/) with Courier's oshcc
#   make apps-test     each application, each variant, small, on 2 and 4 PEs, result checked
#   make experiments   everything in apps/experiments.sh; writes apps/RESULTS.md and its plots

APPS_DIR := apps
APPS_OUT := target/apps
APPS := bcast allreduce spmv cg syncput fadd
APPS_BINS := $(addprefix $(APPS_OUT)/,$(APPS))

.PHONY: apps apps-test experiments

$(APPS_OUT)/%: $(APPS_DIR)/%.c $(APPS_DIR)/common.h $(APPS_DIR)/halo.h $(APPS_DIR)/allreduce.h target/release/oshcc
	@mkdir -p $(APPS_OUT)
	target/release/oshcc -O2 -g -std=gnu11 -Wall -Wextra -Werror $< -o $@ -lm

apps: shmem
	$(MAKE) --no-print-directory $(APPS_BINS)

apps-test: apps
	python3 $(APPS_DIR)/report.py selftest
	bash $(APPS_DIR)/test.sh

experiments: apps
	bash $(APPS_DIR)/experiments.sh
