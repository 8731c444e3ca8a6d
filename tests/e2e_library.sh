#!/bin/sh
# End-to-end tests of libkvpin as a library, on the release build
# ($KVPIN_LIBDIR, default build/rel; `make test` builds it): the shared
# object exports exactly the functions include/kvpin.h declares, the static
# library no global symbol without the kp_ prefix (tools/check_symbols.py,
# whose failure on a header missing a declaration is checked too); the
# header compiles alone as C11 with -pedantic and as C++, and a C++ program
# links to libkvpin.so and runs. The release build carries no sanitizer
# (ASan does not mix with a plain shared library); the library's calls are
# tested under ASan by tests/test_api.c, linked statically.
LIB=${KVPIN_LIBDIR:-build/rel}
CC=${CC:-cc}
CXX=${CXX:-c++}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
pass=0; fail=0
ok()  { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL e2e_library: $*"; }
check() { # check DESCRIPTION COMMAND...: the command must succeed
    d=$1; shift
    if "$@"; then ok; else bad "$d"; fi
}

if [ ! -f "$LIB/libkvpin.so" ] || [ ! -f "$LIB/libkvpin.a" ]; then
    bad "no $LIB/libkvpin.so or $LIB/libkvpin.a (make builds them)"
    echo "e2e_library: $pass passed, $fail failed"
    exit 1
fi

# ---- exported symbols -----------------------------------------------------
check "libkvpin.so exports exactly kvpin.h's functions, libkvpin.a only kp_ symbols" \
    python3 tools/check_symbols.py include/kvpin.h "$LIB/libkvpin.so" "$LIB/libkvpin.a"
sed '/KP_API const char \*kp_version(void);/d' include/kvpin.h >"$T/short.h"
check "the negative control removed a declaration" sh -c "! cmp -s include/kvpin.h '$T/short.h'"
check "check_symbols fails when the .so exports what the header does not declare" \
    sh -c "! python3 tools/check_symbols.py '$T/short.h' '$LIB/libkvpin.so' '$LIB/libkvpin.a' 2>/dev/null"
soname=$(readelf -d "$LIB/libkvpin.so" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
major=$(sed -n 's/^#define KP_VERSION_MAJOR \([0-9]*\)/\1/p' include/kvpin.h)
check "SONAME is libkvpin.so.MAJOR ($soname)" [ "$soname" = "libkvpin.so.$major" ]

# ---- the header alone: C11 -pedantic, C++ ---------------------------------
mkdir -p "$T/inc"
cp include/kvpin.h "$T/inc/"
check "kvpin.h compiles alone as C11 -pedantic" \
    $CC -std=c11 -pedantic -Wall -Wextra -Werror -fsyntax-only -I"$T/inc" -x c "$T/inc/kvpin.h"
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
if $CXX -std=c++11 -pedantic -Wall -Wextra -Werror -I"$T/inc" -o "$T/hello" "$T/hello.cc" \
    -L"$LIB" -lkvpin -Wl,-rpath,"$(cd "$LIB" && pwd)" 2>"$T/cxx.err"; then
    ok
    # the reference: the CLI's own tokenizer (llama.cpp's ids, checked by e2e_cli)
    n=$(printf 'Once upon a time' | "${KVPIN:-./kvpin}" tokenize --no-bos | wc -w)
    ver=$(sed -n 's/^#define KP_VERSION "\(.*\)"/\1/p' include/kvpin.h)
    check "a C++ program runs on libkvpin.so" \
        sh -c "[ \"\$('$T/hello' models/stories260K.gguf)\" = '$ver $n Once upon a time' ]"
    check "the C++ program loads the built libkvpin.so" \
        sh -c "ldd '$T/hello' | grep -q '$(cd "$LIB" && pwd)/libkvpin.so.$major'"
else
    bad "C++ build against kvpin.h: $(head -5 "$T/cxx.err")"
fi

echo "e2e_library: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
