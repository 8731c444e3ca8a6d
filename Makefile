# kvpin - one Makefile for everything.
#
#   make            release build: ./kvpin, build/rel/libkvpin.a and libkvpin.so
#   make install    kvpin, the libraries, kvpin.h, kvpin.pc, the man page, the
#                   bash completion and the bundled model under PREFIX
#                   (/usr/local), staged under DESTDIR; make uninstall removes them
#   make test       every test, built with AddressSanitizer + UBSan (build/asan/),
#                   and the release library installed into build/test/prefix
#                   (tests/shell/e2e_library.sh builds examples/ against it)
#   make asan       the sanitizer build of kvpin and the tests, without running them
#   make check      the layering of src/ (floors, no include upward, no circle)
#   make fuzz       every libFuzzer target for FUZZ_SECONDS each (default 60)
#   make bench      benchmark tables (see README)
#   make deps       install the Debian packages the build needs (apt-get)
#   make clean
#
# Library code lives in src/FLOOR/ (every src/*/*.c forms libkvpin.a; see
# src/README.md for the floors and what each may include), the command line
# in cli/; tests/unit/test_<module>.c are one program each. Objects record their
# header dependencies (-MMD), so a changed header rebuilds what includes it.

CC      ?= cc
PKGS    := libpcre2-8 jansson libmicrohttpd
# the cache tiers: block keys and checksums (XXH3-128), the Redis client
PKGS    += libxxhash hiredis libsodium
# pkg-config and the compiler are asked when a recipe first needs their
# answer (then remembered), not when make reads this file: in `make deps
# all` the packages are installed before the first compile asks for their
# flags. Every variable built on them below is recursive (=) for the same
# reason.
PKG_CFLAGS = $(eval PKG_CFLAGS := $$(shell pkg-config --cflags $$(PKGS) 2>/dev/null))$(PKG_CFLAGS)
PKG_LIBS   = $(eval PKG_LIBS := $$(shell pkg-config --libs $$(PKGS) 2>/dev/null || \
	       echo -lpcre2-8 -ljansson -lmicrohttpd -lxxhash -lhiredis -lsodium))$(PKG_LIBS)

# -march=native when the compiler accepts it, else a portable x86-64 build;
# kernels pick AVX2/FMA/F16C at run time either way (see src/kernels/dispatch.c).
MARCH   = $(eval MARCH := $$(shell $$(CC) -march=native -E -x c /dev/null >/dev/null 2>&1 && echo -march=native))$(MARCH)
WARN    := -std=c11 -Wall -Wextra -Werror -D_GNU_SOURCE -Isrc -Iinclude -MMD -MP
# The library's objects: position-independent (one set of objects makes
# both libkvpin.a and libkvpin.so) and every symbol hidden but the
# functions include/kvpin.h marks KP_API.
LIB_CFLAGS := -fPIC -fvisibility=hidden
CFLAGS_RELEASE = $(WARN) -O2 $(MARCH) -g $(PKG_CFLAGS) -pthread
CFLAGS_ASAN    = $(WARN) -O1 -g -fsanitize=address,undefined -fno-sanitize-recover=all \
	              -fno-omit-frame-pointer $(PKG_CFLAGS) -pthread
LDLIBS  = $(PKG_LIBS) -lm -pthread

SRC     := $(wildcard src/*/*.c)
TESTS   := $(patsubst tests/unit/%.c,%,$(wildcard tests/unit/test_*.c))
FUZZ_TARGETS := $(patsubst fuzz/fuzz_%.c,%,$(wildcard fuzz/fuzz_*.c))

CLI     := $(wildcard cli/*.c)
# Files compiled into the library (tools/embed.py): the dashboard page
# (src/serve/dashboard.h), web/NAME.html -> build/gen/NAME_page.c, and the
# built-in chat templates (src/serve/chat_builtin.h),
# src/serve/templates/*.jinja -> build/gen/chat_templates.c.
GEN      := dashboard_page chat_templates
TEMPLATES := $(sort $(wildcard src/serve/templates/*.jinja))
REL_OBJ  := $(patsubst src/%.c,build/rel/%.o,$(SRC)) $(GEN:%=build/rel/gen/%.o)
ASAN_OBJ := $(patsubst src/%.c,build/asan/%.o,$(SRC)) $(GEN:%=build/asan/gen/%.o)
REL_CLI  := $(patsubst cli/%.c,build/rel/cli_%.o,$(CLI))
ASAN_CLI := $(patsubst cli/%.c,build/asan/cli_%.o,$(CLI))

.PHONY: all test asan check fuzz bench bench-quick deps clean install uninstall test-install FORCE
all: kvpin build/rel/libkvpin.so

kvpin: build/rel/libkvpin.a $(REL_CLI)
	$(CC) $(CFLAGS_RELEASE) -o $@ $(REL_CLI) build/rel/libkvpin.a $(LDLIBS)

build/rel/%.o: src/%.c build/rel/lib.flags | build/rel
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_RELEASE) $(LIB_CFLAGS) -c -o $@ $<
build/asan/%.o: src/%.c build/asan/lib.flags | build/asan
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ASAN) $(LIB_CFLAGS) -c -o $@ $<
# The flags the library objects of a build were compiled with, rewritten
# only when they change: a build tree made with other flags (before
# LIB_CFLAGS, say) is recompiled rather than linked into a broken .so.
build/rel/lib.flags: FORCE | build/rel
	@f='$(CFLAGS_RELEASE) $(LIB_CFLAGS)'; [ "$$(cat $@ 2>/dev/null)" = "$$f" ] || echo "$$f" >$@
build/asan/lib.flags: FORCE | build/asan
	@f='$(CFLAGS_ASAN) $(LIB_CFLAGS)'; [ "$$(cat $@ 2>/dev/null)" = "$$f" ] || echo "$$f" >$@
build/gen/dashboard_page.c: web/dashboard.html tools/embed.py | build/gen
	python3 tools/embed.py kp_dash_page serve/dashboard.h $< $@
build/gen/chat_templates.c: $(TEMPLATES) src/serve/chat_builtin.h tools/embed.py | build/gen
	python3 tools/embed.py --table kp_chat_builtins serve/chat_builtin.h $@ $(TEMPLATES)
build/rel/gen/%.o: build/gen/%.c build/rel/lib.flags
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_RELEASE) $(LIB_CFLAGS) -c -o $@ $<
build/asan/gen/%.o: build/gen/%.c build/asan/lib.flags
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ASAN) $(LIB_CFLAGS) -c -o $@ $<
build/rel/cli_%.o: cli/%.c | build/rel
	$(CC) $(CFLAGS_RELEASE) -c -o $@ $<
build/asan/cli_%.o: cli/%.c | build/asan
	$(CC) $(CFLAGS_ASAN) -c -o $@ $<

# What `kvpin --version` reports: the commit (with -dirty), the compiler and
# the flags, in a generated header that version.c gets with -include.
# tools/buildinfo.sh runs on every make but rewrites the header only when its
# text changes, so version.c is recompiled only then.
build/rel/buildinfo.h: FORCE | build/rel
	@sh tools/buildinfo.sh $@ '$(CC)' '$(filter-out -MMD -MP,$(CFLAGS_RELEASE))'
build/asan/buildinfo.h: FORCE | build/asan
	@sh tools/buildinfo.sh $@ '$(CC)' '$(filter-out -MMD -MP,$(CFLAGS_ASAN))'
# Where the release binary looks for the bundled model after the places
# relative to itself (cli/main.c: cli_default_model): PREFIX's data
# directory, in a header rewritten only when PREFIX changes.
build/rel/paths.h: FORCE | build/rel
	@t='#define KP_DATADIR "$(DATADIR)/kvpin"'; [ "$$(cat $@ 2>/dev/null)" = "$$t" ] || echo "$$t" >$@
build/rel/cli_main.o: cli/main.c build/rel/paths.h | build/rel
	$(CC) $(CFLAGS_RELEASE) -include build/rel/paths.h -c -o $@ $<
build/rel/cli_version.o: cli/version.c build/rel/buildinfo.h | build/rel
	$(CC) $(CFLAGS_RELEASE) -include build/rel/buildinfo.h -c -o $@ $<
build/asan/cli_version.o: cli/version.c build/asan/buildinfo.h | build/asan
	$(CC) $(CFLAGS_ASAN) -include build/asan/buildinfo.h -c -o $@ $<
FORCE:

build/rel/libkvpin.a: $(REL_OBJ)
	rm -f $@ && ar rcs $@ $^
build/asan/libkvpin.a: $(ASAN_OBJ)
	rm -f $@ && ar rcs $@ $^

# The shared library: the same objects; the version script exports kp_*
# only (the objects already hide everything else), -z defs refuses an
# undefined symbol at link time. VERSION and the SONAME's major number are
# read from include/kvpin.h, their one place.
VERSION  := $(shell sed -n 's/^\#define KP_VERSION "\(.*\)"/\1/p' include/kvpin.h)
SOMAJOR  := $(shell sed -n 's/^\#define KP_VERSION_MAJOR \([0-9]*\)/\1/p' include/kvpin.h)
SONAME   := libkvpin.so.$(SOMAJOR)
build/rel/libkvpin.so.$(VERSION): $(REL_OBJ) src/api/kvpin.map
	$(CC) -shared -pthread -Wl,-soname,$(SONAME) -Wl,--version-script=src/api/kvpin.map -Wl,-z,defs \
	  -o $@ $(REL_OBJ) $(LDLIBS)
build/rel/libkvpin.so: build/rel/libkvpin.so.$(VERSION)
	ln -sf libkvpin.so.$(VERSION) build/rel/$(SONAME)
	ln -sf $(SONAME) $@

build/asan/kvpin: build/asan/libkvpin.a $(ASAN_CLI)
	$(CC) $(CFLAGS_ASAN) -o $@ $(ASAN_CLI) build/asan/libkvpin.a $(LDLIBS)

build/asan/test_%: tests/unit/test_%.c tests/unit/harness.h build/asan/libkvpin.a
	$(CC) $(CFLAGS_ASAN) -o $@ $< build/asan/libkvpin.a $(LDLIBS)

# Allocation failure injection: the test's own malloc & co. stand in for
# libc's in every call kvpin's objects make (tests/unit/test_alloc_fail.c).
WRAP_ALLOC := -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc,--wrap=free,--wrap=aligned_alloc,--wrap=strdup
build/asan/test_alloc_fail: tests/unit/test_alloc_fail.c tests/unit/harness.h build/asan/libkvpin.a
	$(CC) $(CFLAGS_ASAN) -o $@ $< build/asan/libkvpin.a $(LDLIBS) $(WRAP_ALLOC)

build/rel build/asan build/fuzz build/gen:
	mkdir -p $@
# `make deps all`, `make deps test`: every build step waits for deps (each
# starts from one of these folders, order-only), also under -j.
ifneq ($(filter deps,$(MAKECMDGOALS)),)
build/rel build/asan build/fuzz build/gen: | deps
endif

asan: build/asan/kvpin $(addprefix build/asan/,$(TESTS)) $(addprefix build/asan/fuzz_,$(FUZZ_TARGETS))

# The floors of src/ (tools/check_floors.py): no include runs up a floor,
# no circle of includes, and no circle of calls between the files of one
# folder (read from the objects of the sanitizer build). Prints the include
# graph.
check: build/asan/libkvpin.a
	python3 tools/check_floors.py --objects build/asan

# The kernels' tests once more at the release optimization (-O2 and the
# machine's -march, no sanitizer): what the compiler's vectorizer makes of
# the portable references shows only there (GCC 12 miscompiled one loop of
# attn_scalar.c at -O2 while -O1 was right).
REL_TESTS := test_attn test_quant
build/rel/test_%: tests/unit/test_%.c tests/unit/harness.h build/rel/libkvpin.a
	$(CC) $(CFLAGS_RELEASE) -o $@ $< build/rel/libkvpin.a $(LDLIBS)

# Unit tests run first, then the end-to-end tests that drive the binary.
# tests/shell/e2e_library.sh checks the release libraries (no sanitizer),
# installed into TEST_PREFIX.
test: check asan test-install $(addprefix build/rel/,$(REL_TESTS))
	@for t in $(REL_TESTS); do \
	  build/rel/$$t >build/rel/$$t.log 2>&1; st=$$?; echo "release build: $$(tail -n 1 build/rel/$$t.log)"; \
	  [ $$st -eq 0 ] || { cat build/rel/$$t.log; exit 1; }; done
	@ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  sh tests/run_all.sh build/asan $(TESTS)

# ---- fuzzing (fuzz/README.md): libFuzzer targets fuzz/fuzz_NAME.c ----
# make fuzz                        every target for FUZZ_SECONDS each
# make fuzz FUZZ_TARGET=model      one target
# Corpora grow under build/fuzz/corpus-NAME; a crash is written to
# fuzz/regress-NAME/ (commit it with the fix: make test replays it).
FUZZ_TARGET  ?= $(FUZZ_TARGETS)
FUZZ_SECONDS ?= 60
FUZZ_MAXLEN_gguf  := 65536
FUZZ_MAXLEN_model := 262144
FUZZ_MAXLEN_tok   := 4096
FUZZ_MAXLEN_oai   := 16384
FUZZ_MAXLEN_http  := 8192
FUZZ_MAXLEN_grammar := 4096
FUZZ_MAXLEN_gcompile := 512
FUZZ_MAXLEN_agent := 16384
FUZZ_MAXLEN_jinja := 32768
FUZZ_FLAGS = -std=c11 -D_GNU_SOURCE -Isrc -Iinclude -g -O1 -fsanitize=fuzzer,address,undefined \
	      -fno-sanitize-recover=all $(PKG_CFLAGS) -pthread
FUZZ_OBJ := $(patsubst src/%.c,build/fuzz/obj/%.o,$(SRC)) $(GEN:%=build/fuzz/obj/gen/%.o)
build/fuzz/obj/gen/%.o: build/gen/%.c | build/fuzz
	@mkdir -p $(dir $@)
	clang $(subst -fsanitize=fuzzer,-fsanitize=fuzzer-no-link,$(FUZZ_FLAGS)) -c -o $@ $<
build/fuzz/obj/%.o: src/%.c | build/fuzz
	@mkdir -p $(dir $@)
	clang $(subst -fsanitize=fuzzer,-fsanitize=fuzzer-no-link,$(FUZZ_FLAGS)) -MMD -MP -c -o $@ $<
build/fuzz/libkvpin.a: $(FUZZ_OBJ)
	rm -f $@ && ar rcs $@ $^
build/fuzz/fuzz_%: fuzz/fuzz_%.c build/fuzz/libkvpin.a
	clang $(FUZZ_FLAGS) -o $@ $< build/fuzz/libkvpin.a $(LDLIBS)
fuzz: $(addprefix build/fuzz/fuzz_,$(FUZZ_TARGET))
	@for t in $(FUZZ_TARGET); do \
	  mkdir -p build/fuzz/corpus-$$t fuzz/regress-$$t; \
	  dict=""; [ -f fuzz/$$t.dict ] && dict="-dict=fuzz/$$t.dict"; \
	  echo "fuzz_$$t: $(FUZZ_SECONDS) s"; \
	  build/fuzz/fuzz_$$t -max_total_time=$(FUZZ_SECONDS) -max_len=$(FUZZ_MAXLEN_$$t) $$dict \
	    -print_final_stats=1 -artifact_prefix=fuzz/regress-$$t/ build/fuzz/corpus-$$t fuzz/seeds-$$t \
	    2>build/fuzz/$$t.log || { tail -40 build/fuzz/$$t.log; exit 1; }; \
	  grep -E "^stat::(number_of_executed_units|peak_rss)" build/fuzz/$$t.log; \
	done

# The same targets without libFuzzer (fuzz/standalone.c), for make test:
# every seed and saved crash replayed under ASan and UBSan.
build/asan/fuzz_%: fuzz/fuzz_%.c fuzz/standalone.c build/asan/libkvpin.a
	$(CC) $(CFLAGS_ASAN) -o $@ $< fuzz/standalone.c build/asan/libkvpin.a $(LDLIBS)

# The benchmark programs bench/bench_NAME.c, on the release library; bench/run.sh
# runs them with kvpin bench and the server benchmarks (bench/README.md).
build/rel/bench_%: bench/bench_%.c build/rel/libkvpin.a
	$(CC) $(CFLAGS_RELEASE) -o $@ $< build/rel/libkvpin.a $(LDLIBS)

bench: kvpin build/rel/bench_tok build/rel/bench_quant build/rel/bench_prefix build/rel/bench_grammar build/rel/bench_jinja
	sh bench/run.sh

# The speed table side by side with llama.cpp in under 10 minutes (bench/quick.sh).
bench-quick: kvpin
	sh bench/quick.sh

deps:
	sh tools/deps.sh

# ---- make install PREFIX=/usr/local DESTDIR= ; make uninstall ----
# The binary, both libraries (libkvpin.so.VERSION, its SONAME link
# libkvpin.so.MAJOR and the development link libkvpin.so), kvpin.h,
# kvpin.pc, the man page, the bash completion, and the bundled model where
# an installed kvpin looks for it.
# DESTDIR stages the tree elsewhere (packages); the paths inside the files
# stay PREFIX's. After a system-wide install, run ldconfig.
PREFIX     ?= /usr/local
BINDIR     ?= $(PREFIX)/bin
LIBDIR     ?= $(PREFIX)/lib
INCLUDEDIR ?= $(PREFIX)/include
DATADIR    ?= $(PREFIX)/share
MANDIR     ?= $(DATADIR)/man
BASHCOMPDIR ?= $(DATADIR)/bash-completion/completions
D          := $(DESTDIR)
INSTALLED  := $(BINDIR)/kvpin $(LIBDIR)/libkvpin.a $(LIBDIR)/libkvpin.so.$(VERSION) $(LIBDIR)/$(SONAME) \
	      $(LIBDIR)/libkvpin.so $(INCLUDEDIR)/kvpin.h $(LIBDIR)/pkgconfig/kvpin.pc \
	      $(DATADIR)/kvpin/stories260K.gguf $(MANDIR)/man1/kvpin.1 $(BASHCOMPDIR)/kvpin
install: kvpin build/rel/libkvpin.a build/rel/libkvpin.so src/api/kvpin.pc.in docs/kvpin.1 docs/kvpin.bash-completion
	install -d $(D)$(BINDIR) $(D)$(LIBDIR)/pkgconfig $(D)$(INCLUDEDIR) $(D)$(DATADIR)/kvpin \
	  $(D)$(MANDIR)/man1 $(D)$(BASHCOMPDIR)
	install -m 755 kvpin $(D)$(BINDIR)/kvpin
	install -m 644 build/rel/libkvpin.a $(D)$(LIBDIR)/libkvpin.a
	install -m 755 build/rel/libkvpin.so.$(VERSION) $(D)$(LIBDIR)/libkvpin.so.$(VERSION)
	ln -sf libkvpin.so.$(VERSION) $(D)$(LIBDIR)/$(SONAME)
	ln -sf $(SONAME) $(D)$(LIBDIR)/libkvpin.so
	install -m 644 include/kvpin.h $(D)$(INCLUDEDIR)/kvpin.h
	sed -e 's|@PREFIX@|$(PREFIX)|; s|@LIBDIR@|$(LIBDIR)|; s|@INCLUDEDIR@|$(INCLUDEDIR)|' \
	    -e 's|@DATADIR@|$(DATADIR)|; s|@VERSION@|$(VERSION)|' \
	    src/api/kvpin.pc.in >$(D)$(LIBDIR)/pkgconfig/kvpin.pc
	install -m 644 models/stories260K.gguf $(D)$(DATADIR)/kvpin/stories260K.gguf
	install -m 644 docs/kvpin.1 $(D)$(MANDIR)/man1/kvpin.1
	install -m 644 docs/kvpin.bash-completion $(D)$(BASHCOMPDIR)/kvpin
uninstall:
	rm -f $(addprefix $(D),$(INSTALLED))
	rmdir $(D)$(DATADIR)/kvpin 2>/dev/null || true

# make test installs into this scratch prefix first: tests/shell/e2e_library.sh
# builds examples/ against the installed library with pkg-config (shared
# and static) and runs them, and checks the tree and the installed kvpin.
TEST_PREFIX := $(CURDIR)/build/test/prefix
test-install: kvpin build/rel/libkvpin.so
	rm -rf $(TEST_PREFIX)
	$(MAKE) --no-print-directory install PREFIX=$(TEST_PREFIX)

clean:
	rm -rf build kvpin

# The header dependencies the compiler recorded (-MMD). A dependency file
# whose source (its first prerequisite) is gone, moved or deleted since it
# was written, is left out: make would stop at "No rule to make target"
# instead of building the program from where its source is now.
DEPFILES = $(shell find build -name '*.d' 2>/dev/null | \
	     xargs -r awk 'FNR == 1 { if ((getline line < $$2) >= 0) print FILENAME; close($$2) }')
-include $(DEPFILES)
