# kvpin - one Makefile for everything.
#
#   make            release build: ./kvpin
#   make test       every test, built with AddressSanitizer + UBSan (build/asan/)
#   make asan       the sanitizer build of kvpin and the tests, without running them
#   make check      the layering of src/ (floors, no include upward, no circle)
#   make fuzz       libFuzzer on the GGUF reader for FUZZ_SECONDS (default 60)
#   make bench      benchmark tables (see README)
#   make deps       install the Debian packages the build needs (apt-get)
#   make clean
#
# Library code lives in src/FLOOR/ (every src/*/*.c forms libkvpin.a; see
# src/README.md for the floors and what each may include), the command line
# in cli/; tests/test_<module>.c are one program each. Objects record their
# header dependencies (-MMD), so a changed header rebuilds what includes it.

CC      ?= cc
PKGS    := libpcre2-8 jansson libmicrohttpd
PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS   := $(shell pkg-config --libs $(PKGS) 2>/dev/null || echo -lpcre2-8 -ljansson -lmicrohttpd)

# -march=native when the compiler accepts it, else a portable x86-64 build;
# kernels pick AVX2/FMA/F16C at run time either way (see src/kernels/dispatch.c).
MARCH   := $(shell $(CC) -march=native -E -x c /dev/null >/dev/null 2>&1 && echo -march=native)
WARN    := -std=c11 -Wall -Wextra -Werror -D_GNU_SOURCE -Isrc -MMD -MP
CFLAGS_RELEASE := $(WARN) -O2 $(MARCH) -g $(PKG_CFLAGS) -pthread
CFLAGS_ASAN    := $(WARN) -O1 -g -fsanitize=address,undefined -fno-sanitize-recover=all \
	              -fno-omit-frame-pointer $(PKG_CFLAGS) -pthread
LDLIBS  := $(PKG_LIBS) -lm -pthread

SRC     := $(wildcard src/*/*.c)
TESTS   := $(patsubst tests/%.c,%,$(wildcard tests/test_*.c))

CLI     := $(wildcard cli/*.c)
REL_OBJ  := $(patsubst src/%.c,build/rel/%.o,$(SRC))
ASAN_OBJ := $(patsubst src/%.c,build/asan/%.o,$(SRC))
REL_CLI  := $(patsubst cli/%.c,build/rel/cli_%.o,$(CLI))
ASAN_CLI := $(patsubst cli/%.c,build/asan/cli_%.o,$(CLI))

.PHONY: all test asan check fuzz bench deps clean
all: kvpin

kvpin: build/rel/libkvpin.a $(REL_CLI)
	$(CC) $(CFLAGS_RELEASE) -o $@ $(REL_CLI) build/rel/libkvpin.a $(LDLIBS)

build/rel/%.o: src/%.c | build/rel
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_RELEASE) -c -o $@ $<
build/asan/%.o: src/%.c | build/asan
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ASAN) -c -o $@ $<
build/rel/cli_%.o: cli/%.c | build/rel
	$(CC) $(CFLAGS_RELEASE) -c -o $@ $<
build/asan/cli_%.o: cli/%.c | build/asan
	$(CC) $(CFLAGS_ASAN) -c -o $@ $<

build/rel/libkvpin.a: $(REL_OBJ)
	rm -f $@ && ar rcs $@ $^
build/asan/libkvpin.a: $(ASAN_OBJ)
	rm -f $@ && ar rcs $@ $^

build/asan/kvpin: build/asan/libkvpin.a $(ASAN_CLI)
	$(CC) $(CFLAGS_ASAN) -o $@ $(ASAN_CLI) build/asan/libkvpin.a $(LDLIBS)

build/asan/test_%: tests/test_%.c tests/harness.h build/asan/libkvpin.a
	$(CC) $(CFLAGS_ASAN) -o $@ $< build/asan/libkvpin.a $(LDLIBS)

build/rel build/asan build/fuzz:
	mkdir -p $@

asan: build/asan/kvpin $(addprefix build/asan/,$(TESTS))

# The floors of src/ (tools/check_floors.py): no include runs up a floor,
# no circle of includes, and no circle of calls between the files of one
# folder (read from the objects of the sanitizer build). Prints the include
# graph.
check: build/asan/libkvpin.a
	python3 tools/check_floors.py --objects build/asan

# Unit tests run first, then the end-to-end tests that drive the binary.
test: check asan
	@ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  sh tests/run_all.sh build/asan $(TESTS)

FUZZ_SECONDS ?= 60
build/fuzz/fuzz_gguf: fuzz/fuzz_gguf.c $(SRC) $(wildcard src/*.h) | build/fuzz
	clang -std=c11 -D_GNU_SOURCE -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -Isrc \
	  -o $@ fuzz/fuzz_gguf.c src/gguf/gguf.c src/gguf/dtype.c src/base/status.c
fuzz: build/fuzz/fuzz_gguf
	mkdir -p build/fuzz/corpus
	build/fuzz/fuzz_gguf -max_total_time=$(FUZZ_SECONDS) -max_len=65536 -dict=fuzz/gguf.dict \
	  build/fuzz/corpus fuzz/seeds

build/rel/bench_%: tools/bench_%.c build/rel/libkvpin.a
	$(CC) $(CFLAGS_RELEASE) -o $@ $< build/rel/libkvpin.a $(LDLIBS)

bench: kvpin build/rel/bench_tok build/rel/bench_quant build/rel/bench_prefix
	sh bench/run.sh

deps:
	sh tools/deps.sh

clean:
	rm -rf build kvpin

-include $(shell find build -name '*.d' 2>/dev/null)
