# cgo.mk - builds the C core in csrc/ on its own, outside cgo: unit tests
# under ASan/UBSan, libFuzzer targets, micro-benchmarks.
#
#   make -f cgo.mk test                 # unit tests, sanitizers on
#   make -f cgo.mk fuzz FUZZ_SECONDS=60 # each fuzzer for 60 s
#   make -f cgo.mk bench
#   make -f cgo.mk test TLS=openssl     # against OpenSSL 3 instead of BoringSSL
#
# Everything lands in build/. Two shared cores: no -j by default.

# The C core: the sources talaris_core.c includes (the one list, which
# cgo compiles; no globbing, so a file that is still being written does
# not break everybody's build). Headers are included with their folder
# ("base/evq.h") from csrc/, so every compile gets -I csrc.
CORE_SRCS = $(shell sed -n 's|^\#include "\(csrc/.*\.c\)"$$|\1|p' talaris_core.c)

CC       ?= cc
FUZZ_CC  ?= clang
BUILD    ?= build
FUZZ_SECONDS ?= 20

# TLS backend: BoringSSL (Debian android-libboringssl-dev) by default; the
# rpath makes binaries find it without LD_LIBRARY_PATH.
TLS ?= boringssl
ifeq ($(TLS),openssl)
TLS_CFLAGS  =
TLS_LDFLAGS = -lssl -lcrypto
else
BORINGSSL_LIBDIR = /usr/lib/x86_64-linux-gnu/android
TLS_CFLAGS  = -I/usr/include/android
TLS_LDFLAGS = -L$(BORINGSSL_LIBDIR) -Wl,-rpath,$(BORINGSSL_LIBDIR) -lssl -lcrypto
endif

# Static liburing for the loop sources once they join CORE_SRCS.
URING_LDFLAGS = -l:liburing.a

LDLIBS   = $(TLS_LDFLAGS) $(URING_LDFLAGS) -lpthread
WARN     = -Wall -Wextra -Werror
STD      = -std=gnu11
SAN      = -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer

# TL_DEBUG: defences that must never fire abort instead of repairing.
TEST_CFLAGS  = -I csrc -O1 -g -DTL_DEBUG $(SAN) $(WARN) $(STD) $(TLS_CFLAGS)
FUZZ_CFLAGS  = -I csrc -O1 -g -DTL_DEBUG -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all $(WARN) $(STD) $(TLS_CFLAGS)
BENCH_CFLAGS = -I csrc -O2 -g $(WARN) $(STD) $(TLS_CFLAGS)

CORE_HDRS  = $(filter-out csrc/test/% csrc/fuzz/% csrc/bench/%,$(wildcard csrc/*.h csrc/*/*.h))
TEST_SRCS  = $(wildcard csrc/test/test_*.c)
TEST_BINS  = $(patsubst csrc/test/%.c,$(BUILD)/test/%,$(TEST_SRCS))
FUZZ_SRCS  = $(wildcard csrc/fuzz/fuzz_*.c)
FUZZ_NAMES = $(patsubst csrc/fuzz/fuzz_%.c,%,$(FUZZ_SRCS))
FUZZ_BINS  = $(patsubst %,$(BUILD)/fuzz/fuzz_%,$(FUZZ_NAMES))

.PHONY: layers test test-build fuzz fuzz-build bench clean
.DELETE_ON_ERROR:

# layers: the call graph between csrc modules (files) has no cycle, no
# folder calls a folder ranked at or above its own, and nothing outside
# loop/ includes loop/loop.h (csrc/layers.py; -v prints the folder graph
# docs/ARCHITECTURE.md draws, then the module graph).
layers:
	@python3 csrc/layers.py

test: layers $(TEST_BINS)
	@set -e; for t in $(TEST_BINS); do echo "== $$t"; ./$$t; done; \
	echo "all $(words $(TEST_BINS)) C test programs passed"; \
	if [ -s $(TEST_SUMMARY) ]; then cat $(TEST_SUMMARY); fi

test-build: $(TEST_BINS)

# The core is compiled once per flavour (test, fuzz) and every program links
# the same objects: compiling it into each test program and fuzzer took 191 s of a C test pass's 200 (CI runs two passes).
# Linking the objects one by one, not from an archive, keeps the link the
# same as naming the sources: every core object is in every program.
TEST_OBJS = $(patsubst csrc/%.c,$(BUILD)/obj/test/%.o,$(CORE_SRCS))
FUZZ_OBJS = $(patsubst csrc/%.c,$(BUILD)/obj/fuzz/%.o,$(CORE_SRCS))

$(BUILD)/obj/test/%.o: csrc/%.c $(CORE_HDRS)
	@mkdir -p $(@D)
	$(CC) $(TEST_CFLAGS) -c -o $@ $<

$(BUILD)/obj/fuzz/%.o: csrc/%.c $(CORE_HDRS)
	@mkdir -p $(@D)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -c -o $@ $<

$(BUILD)/test/%: csrc/test/%.c $(TEST_OBJS) $(CORE_HDRS) csrc/test/check.h csrc/test/frames.h csrc/test/config.h csrc/test/loop_harness.h
	@mkdir -p $(@D)
	$(CC) $(TEST_CFLAGS) -o $@ $< $(TEST_OBJS) $(LDLIBS)

# Each fuzzer runs over a scratch copy of its seed corpus, so new inputs
# it finds stay in build/ and testdata/ only changes by hand. A fuzzer
# that ran no input fails the target as a finding does: libFuzzer's
# final stats (-print_final_stats) must report a positive
# stat::number_of_executed_units (a fuzzer that exits at once, or whose
# stats line is missing, tested nothing).
fuzz: $(FUZZ_BINS)
	@set -e; [ -n "$(FUZZ_NAMES)" ] || { echo "fuzz: no fuzzers in csrc/fuzz" >&2; exit 1; }; \
	for n in $(FUZZ_NAMES); do \
		c=$(BUILD)/fuzz/corpus/$$n; mkdir -p $$c; \
		if [ -d testdata/fuzz/$$n ]; then cp -f testdata/fuzz/$$n/* $$c/ 2>/dev/null || true; fi; \
		echo "== fuzz_$$n for $(FUZZ_SECONDS)s ($(TLS))"; \
		log=$(BUILD)/fuzz/fuzz_$$n.log; \
		$(BUILD)/fuzz/fuzz_$$n -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 \
			-artifact_prefix=$(BUILD)/fuzz/fuzz_$$n- $$c 2>$$log \
			|| { tail -n 60 $$log; exit 1; }; \
		grep -E '^#[0-9]+.*DONE|stat::number_of_executed_units|stat::average_exec_per_sec' $$log || true; \
		u=$$(sed -n 's/^stat::number_of_executed_units: *\([0-9][0-9]*\).*/\1/p' $$log | tail -n 1); \
		if [ -z "$$u" ] || [ "$$u" -eq 0 ]; then \
			tail -n 60 $$log; \
			echo "fuzz_$$n: $${u:-no} stat::number_of_executed_units in $$log: it executed no input" >&2; \
			exit 1; \
		fi; \
	done; \
	echo "all $(words $(FUZZ_NAMES)) fuzzers executed inputs ($(TLS))"

fuzz-build: $(FUZZ_BINS)

$(BUILD)/fuzz/fuzz_%: csrc/fuzz/fuzz_%.c $(FUZZ_OBJS) $(CORE_HDRS)
	@mkdir -p $(@D)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -o $@ $< $(FUZZ_OBJS) $(LDLIBS)

# Benchmarks link the core as cgo builds it: one translation unit
# (talaris_core.c includes every source), so inlining matches production.
BENCH_SRCS = $(wildcard csrc/bench/bench_*.c)
BENCH_BINS = $(patsubst csrc/bench/%.c,$(BUILD)/bench/%,$(BENCH_SRCS))

bench: $(BENCH_BINS)
	@set -e; for b in $(BENCH_BINS); do ./$$b; done

$(BUILD)/bench/%: csrc/bench/%.c $(CORE_SRCS) $(CORE_HDRS) talaris_core.c
	@mkdir -p $(@D)
	$(CC) $(BENCH_CFLAGS) -o $@ $< talaris_core.c $(LDLIBS)

clean:
	rm -rf $(BUILD)

# ---- AES-GCM verification (gcm.c): emulated build, published vectors, ----
# ---- differential fuzzer, self-test. ----
#
# gcm.c is compiled a second time with its 256-bit VAES/VPCLMULQDQ
# operations as pairs of 128-bit AES-NI/PCLMULQDQ ones (csrc/test/gcm_emul.h,
# -DTL_GCM_EMUL: the CPU check then asks for AVX2 only) and its functions
# renamed tl_gcm_emul_*, so the shipped code runs on CPUs without VAES
# (AMD Zen 2) and a program can hold both builds. test_gcm_emul is
# test_gcm.c against it; test_gcm_vectors runs the published vectors
# (fetched by ./build.sh vectors into VECTORS_DIR, not committed) through
# both builds and the library; fuzz_gcm_diff compares both with the
# library. The gcm programs write which builds ran to TEST_SUMMARY, printed
# at the end of `test`.
GCM_SRC      = $(filter %/gcm.c,$(CORE_SRCS))
GCM_EMUL_H   = csrc/test/gcm_emul.h
GCM_EMUL_DEF = -DTL_GCM_EMUL -include $(GCM_EMUL_H)
GCM_EMUL_TEST_OBJ = $(BUILD)/obj/test/gcm_emul.o
GCM_EMUL_FUZZ_OBJ = $(BUILD)/obj/fuzz/gcm_emul.o
VECTORS_DIR ?= $(if $(XDG_CACHE_HOME),$(XDG_CACHE_HOME)/talaris/vectors,build/vectors)
TEST_SUMMARY = $(BUILD)/test/summary.txt
export TL_VECTORS_DIR = $(VECTORS_DIR)
export TL_TEST_SUMMARY = $(TEST_SUMMARY)

TEST_BINS += $(BUILD)/test/test_gcm_emul

.PHONY: vectors test-summary-reset
test: test-summary-reset vectors $(BUILD)/test/test_gcm_emul

# Idempotent: a no-op once the pinned files are in VECTORS_DIR.
vectors:
	@TL_VECTORS_DIR=$(VECTORS_DIR) ./build.sh vectors

test-summary-reset:
	@mkdir -p $(BUILD)/test; : >$(TEST_SUMMARY)

$(GCM_EMUL_TEST_OBJ): $(GCM_SRC) $(GCM_EMUL_H) $(CORE_HDRS)
	@mkdir -p $(@D)
	$(CC) $(TEST_CFLAGS) $(GCM_EMUL_DEF) -c -o $@ $<

$(GCM_EMUL_FUZZ_OBJ): $(GCM_SRC) $(GCM_EMUL_H) $(CORE_HDRS)
	@mkdir -p $(@D)
	$(FUZZ_CC) $(FUZZ_CFLAGS) $(GCM_EMUL_DEF) -c -o $@ $<

GCM_TEST_DEPS = $(TEST_OBJS) $(GCM_EMUL_TEST_OBJ) $(CORE_HDRS) $(GCM_EMUL_H) csrc/test/check.h

$(BUILD)/test/test_gcm_emul: csrc/test/test_gcm.c $(GCM_TEST_DEPS)
	@mkdir -p $(@D)
	$(CC) $(TEST_CFLAGS) $(GCM_EMUL_DEF) -o $@ $< $(TEST_OBJS) $(GCM_EMUL_TEST_OBJ) $(LDLIBS)

$(BUILD)/test/test_gcm_vectors $(BUILD)/test/test_gcm_selftest: $(BUILD)/test/%: csrc/test/%.c $(GCM_TEST_DEPS)
	@mkdir -p $(@D)
	$(CC) $(TEST_CFLAGS) -o $@ $< $(TEST_OBJS) $(GCM_EMUL_TEST_OBJ) $(LDLIBS)

$(BUILD)/fuzz/fuzz_gcm_diff: csrc/fuzz/fuzz_gcm_diff.c $(FUZZ_OBJS) $(GCM_EMUL_FUZZ_OBJ) $(CORE_HDRS)
	@mkdir -p $(@D)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -o $@ $< $(FUZZ_OBJS) $(GCM_EMUL_FUZZ_OBJ) $(LDLIBS)
