#!/bin/sh
# End-to-end tests of libkvpin as a library, on the release build installed
# into a scratch prefix ($KVPIN_TEST_PREFIX, default build/test/prefix;
# `make test` runs `make test-install` first):
#   - the installed tree: exactly the files make install promises, the
#     SONAME links, kvpin.pc; make install DESTDIR= stages the same tree and
#     make uninstall removes every file again;
#   - the installed kvpin finds the installed model (relative to itself,
#     and through the data directory baked in when it is copied elsewhere);
#   - libkvpin.so exports exactly the functions kvpin.h declares and
#     libkvpin.a has no global symbol without the kp_ prefix
#     (tools/check_symbols.py, whose failure on a header missing a
#     declaration is checked too); the header compiles alone as C11
#     -pedantic and as C++, and a C++ program links to libkvpin.so;
#   - examples/agent_turns.c built with `pkg-config --cflags --libs kvpin`
#     (run on the installed libkvpin.so through its rpath) and with
#     `pkg-config --static` (libkvpin.a): its two greedy turns print what
#     `kvpin run --temp 0` prints for the same prompts, and the second turn
#     reuses exactly the tokens it shares with the first turn's prompt +
#     answer, computed here from the tokenizer and run's token ids.
# Everything here runs without sanitizers: ASan does not mix with a plain
# shared library, so the library's calls are tested under ASan by
# tests/unit/test_api.c (linked statically) and here on the release build.
P=${KVPIN_TEST_PREFIX:-build/test/prefix}
CC=${CC:-cc}
CXX=${CXX:-c++}
T=$(mktemp -d) || exit 1
trap 'rm -rf "$T"' EXIT
pass=0; fail=0
ok()  { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL e2e_library: $*"; }
check() { # check DESCRIPTION COMMAND...: the command must succeed
    d=$1; shift
    if "$@"; then ok; else bad "$d"; fi
}

if [ ! -x "$P/bin/kvpin" ]; then
    bad "nothing installed in $P (make test-install puts the release build there)"
    echo "e2e_library: $pass passed, $fail failed"
    exit 1
fi
P=$(cd "$P" && pwd)
LIB=$P/lib
ver=$(sed -n 's/^#define KP_VERSION "\(.*\)"/\1/p' include/kvpin.h)
major=$(sed -n 's/^#define KP_VERSION_MAJOR \([0-9]*\)/\1/p' include/kvpin.h)
export PKG_CONFIG_PATH="$LIB/pkgconfig"

# ---- the installed tree -----------------------------------------------------
cat >"$T/want.txt" <<EOF
bin/kvpin
include/kvpin.h
lib/libkvpin.a
lib/libkvpin.so
lib/libkvpin.so.$major
lib/libkvpin.so.$ver
lib/pkgconfig/kvpin.pc
share/bash-completion/completions/kvpin
share/kvpin/stories260K.gguf
share/man/man1/kvpin.1
EOF
(cd "$P" && find . ! -type d | sed 's|^\./||' | sort) >"$T/have.txt"
check "the installed files are make install's: $(tr '\n' ' ' <"$T/have.txt")" cmp -s "$T/want.txt" "$T/have.txt"
check "libkvpin.so -> libkvpin.so.$major" [ "$(readlink "$LIB/libkvpin.so")" = "libkvpin.so.$major" ]
check "libkvpin.so.$major -> libkvpin.so.$ver" [ "$(readlink "$LIB/libkvpin.so.$major")" = "libkvpin.so.$ver" ]
check "the installed model is the bundled one" cmp -s "$P/share/kvpin/stories260K.gguf" models/stories260K.gguf
check "the installed header is include/kvpin.h" cmp -s "$P/include/kvpin.h" include/kvpin.h
check "pkg-config knows kvpin $ver" [ "$(pkg-config --modversion kvpin)" = "$ver" ]
check "pkg-config: Cflags and Libs" sh -c "pkg-config --cflags kvpin | grep -q -- '-I$P/include' &&
    pkg-config --libs kvpin | grep -q -- '-L$LIB -lkvpin'"
check "pkg-config --static adds what libkvpin.a needs" sh -c "pkg-config --static --libs kvpin |
    grep -- ' -lm ' | grep -- ' -pthread ' | grep -- ' -lpcre2-8 ' | grep -- ' -ljansson ' | grep -q -- ' -lmicrohttpd '"
check "pkg-config: modeldir" [ "$(pkg-config --variable=modeldir kvpin)" = "$P/share/kvpin" ]
# DESTDIR stages the same tree under another root; uninstall removes it all
# (the same PREFIX as the scratch install: nothing is rebuilt)
S=$T/stage
(unset MAKEFLAGS MFLAGS MAKELEVEL; make -s install PREFIX="$P" DESTDIR="$S" >"$T/make.log" 2>&1)
(cd "$S$P" 2>/dev/null && find . ! -type d | sed 's|^\./||' | sort) >"$T/staged.txt"
check "make install DESTDIR= stages the same files: $(tail -3 "$T/make.log")" cmp -s "$T/want.txt" "$T/staged.txt"
check "the staged kvpin.pc names PREFIX, not DESTDIR" sh -c "grep -q '^prefix=$P\$' '$S$P/lib/pkgconfig/kvpin.pc' &&
    ! grep -q '$S' '$S$P/lib/pkgconfig/kvpin.pc'"
(unset MAKEFLAGS MFLAGS MAKELEVEL; make -s uninstall PREFIX="$P" DESTDIR="$S" >>"$T/make.log" 2>&1)
check "make uninstall removes every file" sh -c "[ -d '$S$P/lib' ] && [ -z \"\$(find '$S' ! -type d)\" ]"
check "make uninstall removes share/kvpin" [ ! -d "$S$P/share/kvpin" ]

# ---- the installed kvpin finds the installed model ----------------------------
mkdir -p "$T/elsewhere"
(cd "$T/elsewhere" && env -u KVPIN_MODEL "$P/bin/kvpin" info) >"$T/info.txt" 2>&1
check "installed kvpin uses PREFIX/share/kvpin/stories260K.gguf: $(head -1 "$T/info.txt")" \
    grep -q "^file: *$P/share/kvpin/stories260K.gguf\$" "$T/info.txt"
cp "$P/bin/kvpin" "$T/elsewhere/kvpin"
(cd "$T" && env -u KVPIN_MODEL "$T/elsewhere/kvpin" info) >"$T/info2.txt" 2>&1
check "a copy of kvpin elsewhere finds the model in the baked data directory: $(head -1 "$T/info2.txt")" \
    grep -q "^file: *$P/share/kvpin/stories260K.gguf\$" "$T/info2.txt"

# ---- exported symbols -----------------------------------------------------
check "libkvpin.so exports exactly kvpin.h's functions, libkvpin.a only kp_ symbols" \
    python3 tools/check_symbols.py "$P/include/kvpin.h" "$LIB/libkvpin.so" "$LIB/libkvpin.a"
sed '/KP_API const char \*kp_version(void);/d' include/kvpin.h >"$T/short.h"
check "the negative control removed a declaration" sh -c "! cmp -s include/kvpin.h '$T/short.h'"
check "check_symbols fails when the .so exports what the header does not declare" \
    sh -c "! python3 tools/check_symbols.py '$T/short.h' '$LIB/libkvpin.so' '$LIB/libkvpin.a' 2>/dev/null"
soname=$(readelf -d "$LIB/libkvpin.so" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
check "SONAME is libkvpin.so.MAJOR ($soname)" [ "$soname" = "libkvpin.so.$major" ]

# ---- the header alone: C11 -pedantic, C++ ---------------------------------
check "kvpin.h compiles alone as C11 -pedantic" \
    $CC -std=c11 -pedantic -Wall -Wextra -Werror -fsyntax-only -x c "$P/include/kvpin.h"
cat >"$T/hello.cc" <<'EOF'
// A C++ user of kvpin.h: the extern "C" names link, the types work.
#include <cstdio>
#include <cstring>
#include <string>
#include "kvpin.h"
int main(int argc, char **argv) {
    if (argc < 2) return 2;
    kp_err err;
    kp_lm *lm = nullptr;
    if (kp_lm_open(&lm, argv[1], &err) != KP_RC_OK) { std::fprintf(stderr, "%s\n", err.msg); return 1; }
    int32_t *ids = nullptr;
    size_t n = 0;
    const std::string text = "Once upon a time";
    if (kp_tokenize(lm, text.data(), text.size(), false, false, &ids, &n, &err) != KP_RC_OK) return 1;
    char *back = nullptr;
    size_t len = 0;
    if (kp_detokenize(lm, ids, n, false, &back, &len, &err) != KP_RC_OK) return 1;
    std::printf("%s %zu %s\n", kp_version(), n, back);
    kp_mem_free(back);
    kp_mem_free(ids);
    kp_lm_free(lm);
    return 0;
}
EOF
if $CXX -std=c++11 -pedantic -Wall -Wextra -Werror -o "$T/hello" "$T/hello.cc" \
    $(pkg-config --cflags --libs kvpin) -Wl,-rpath,"$LIB" 2>"$T/cxx.err"; then
    ok
    # the reference: the CLI's tokenizer (llama.cpp's ids, checked by e2e_cli)
    n=$(printf 'Once upon a time' | "$P/bin/kvpin" tokenize --no-bos | wc -w)
    check "a C++ program runs on libkvpin.so" \
        sh -c "[ \"\$('$T/hello' models/stories260K.gguf)\" = '$ver $n Once upon a time' ]"
    check "the C++ program loads the installed libkvpin.so" \
        sh -c "ldd '$T/hello' | grep -q '=> $LIB/libkvpin.so.$major '"
else
    bad "C++ build against kvpin.h: $(head -5 "$T/cxx.err")"
fi

# ---- examples/agent_turns.c against the installed library ---------------------
cp examples/agent_turns.c "$T/"
(cd "$T" && $CC -std=c11 -Wall -Wextra -Werror -pedantic -o agent_turns agent_turns.c \
    $(pkg-config --cflags --libs kvpin) -Wl,-rpath,"$(pkg-config --variable=libdir kvpin)") 2>"$T/cc.err"
check "the example builds with pkg-config --cflags --libs kvpin: $(head -3 "$T/cc.err")" [ -x "$T/agent_turns" ]
# static: libkvpin.a and the libraries pkg-config --static adds; the system
# libraries stay shared (-l:libkvpin.a picks the archive over the .so)
(cd "$T" && $CC -std=c11 -Wall -Wextra -Werror -pedantic -o agent_turns_static agent_turns.c \
    $(pkg-config --cflags --static kvpin) $(pkg-config --static --libs kvpin | sed 's/-lkvpin /-l:libkvpin.a /')) \
    2>"$T/cc2.err"
check "the example builds with pkg-config --static: $(head -3 "$T/cc2.err")" [ -x "$T/agent_turns_static" ]
check "the shared build needs libkvpin.so.$major" sh -c "readelf -d '$T/agent_turns' | grep -q 'NEEDED.*libkvpin.so.$major'"
check "the shared build loads the installed one" sh -c "ldd '$T/agent_turns' | grep -q '=> $LIB/libkvpin.so.$major '"
check "the static build needs no libkvpin.so" sh -c "! readelf -d '$T/agent_turns_static' | grep -q libkvpin"
# the README's shared build line, as written (app.c: the example), runs without LD_LIBRARY_PATH
readme_cc=$(python3 - <<'PY'
import re
text = open("README.md").read()
m = re.search(r"^    (cc -o app app\.c \$\(pkg-config --cflags --libs kvpin\)(?:[^\n]*\\\n)*[^\n]*)", text, re.M)
print(re.sub(r"\s*#.*", "", m.group(1).replace("\\\n", " ")) if m else "")
PY
)
check "the README has a shared build line: $readme_cc" [ -n "$readme_cc" ]
cp examples/agent_turns.c "$T/app.c"
(cd "$T" && sh -c "$readme_cc") 2>"$T/cc3.err"
check "the README's line builds: $(head -3 "$T/cc3.err")" [ -x "$T/app" ]
(cd "$T/elsewhere" && env -u LD_LIBRARY_PATH "$T/app" "$(pkg-config --variable=modeldir kvpin)/stories260K.gguf" \
    "Once" " Then" 4) >"$T/app.out" 2>"$T/app.err"
check "the README's build runs without LD_LIBRARY_PATH: $(tail -1 "$T/app.err")" [ -s "$T/app.out" ]
PROMPT="Once upon a time, Tom the cat"
NEXT=" Then Tom saw a bird."
N=24
for v in agent_turns agent_turns_static; do
    (cd "$T/elsewhere" && env -u LD_LIBRARY_PATH "$T/$v" "$(pkg-config --variable=modeldir kvpin)/stories260K.gguf" \
        "$PROMPT" "$NEXT" $N) >"$T/$v.out" 2>"$T/$v.err"
    check "$v runs: $(tail -2 "$T/$v.err")" [ -s "$T/$v.out" ]
done
check "the static and the shared build print the same" sh -c "cmp -s '$T/agent_turns.out' '$T/agent_turns_static.out' &&
    cmp -s '$T/agent_turns.err' '$T/agent_turns_static.err'"
# The references: the installed kvpin's greedy run of each prompt (stdout:
# the text and a newline; stderr: the ids with --print-tokens), its
# tokenizer, and the rule of the prefix cache: a prompt reuses its longest
# common token prefix with what is cached (turn 1's prompt and every
# generated token, but a last one that ended generation as an
# end-of-generation token), all but the last position on a full match.
cat >"$T/turns.py" <<'EOF'
import re, subprocess, sys
kvpin, p1, nxt, n, out_path, err_path = sys.argv[1:]
def run(prompt):
    r = subprocess.run([kvpin, "run", "--temp", "0", "-n", n, "--print-tokens", "-p", prompt],
                       capture_output=True, check=True)
    err = r.stderr.decode()
    ids = [int(x) for x in re.search(r"^tokens:(.*)$", err, re.M).group(1).split()]
    eog = "stopped by end of generation token" in err
    return r.stdout, ids, eog
def tokenize(text):
    r = subprocess.run([kvpin, "tokenize"], input=text.encode(), capture_output=True, check=True)
    return [int(x) for x in r.stdout.split()]
out1, gen1, eog1 = run(p1)
assert out1.endswith(b"\n") and len(out1) > 1, out1
p2 = p1 + out1[:-1].decode() + nxt
out2, _, _ = run(p2)
have = open(out_path, "rb").read()
assert have == out1 + out2, ("the example's text differs from kvpin run's", have, out1 + out2)
ids1 = tokenize(p1)
cached = ids1 + (gen1[:-1] if eog1 else gen1)
ids2 = tokenize(p2)
share = 0
while share < min(len(ids2), len(cached)) and ids2[share] == cached[share]:
    share += 1
reuse = share - 1 if share == len(ids2) else share
assert reuse > len(ids1), "turn 2 must reuse turn 1's answer too"
err = open(err_path).read()
m = re.search(r"^turn 2: (\d+) prompt tokens, (\d+) reused, (\d+) computed, diverged at token (\d+) ", err, re.M)
assert m, err
got = tuple(int(x) for x in m.groups())
want = (len(ids2), reuse, len(ids2) - reuse, share)
assert got == want, ("turn 2 (prompt, reused, computed, diverged): example, expected", got, want)
m1 = re.search(r"^turn 1: (\d+) prompt tokens, 0 reused, (\d+) computed, .*cause cold$", err, re.M)
assert m1 and int(m1.group(1)) == len(ids1), err
assert re.search(r"^turn 2: .*cause hit$", err, re.M), err
EOF
check "the greedy turns and turn 2's reuse match kvpin run and the tokenizer" \
    python3 "$T/turns.py" "$P/bin/kvpin" "$PROMPT" "$NEXT" $N "$T/agent_turns.out" "$T/agent_turns.err"
# the memory bill the example prints follows the KV formula kvpin info shows
bpt=$("$P/bin/kvpin" info -m "$P/share/kvpin/stories260K.gguf" |
    sed -n 's/^  F16: 2 x \([0-9]*\) layers x \([0-9]*\) kv-heads x \([0-9]*\) head_dim x 2 bytes.*/\1 \2 \3/p' |
    { read l h d; echo $((2 * l * h * d * 2)); })
check "the example's memory bill: $bpt bytes per token (F16)" grep -q "^memory: $bpt bytes per token, " "$T/agent_turns.err"

echo "e2e_library: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
