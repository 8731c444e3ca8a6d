#!/bin/sh
# The man page (docs/kvpin.1) and the bash completion
# (docs/kvpin.bash-completion) against the binary's own --help
# ($KVPIN, default ./kvpin): every long option of every command's --help is
# in that command's section of the man page, the man page's version is
# kvpin.h's, and the completion offers exactly the commands and each
# command's options (tools/check_docs.py). Negative controls: a man page
# missing one option, and a completion that misses the long-only options,
# must fail the check. The man page renders without groff warnings (when
# groff is installed), and make install puts both where man and
# bash-completion look (checked on the scratch install of e2e_library.sh
# when it is there).
KVPIN=${KVPIN:-./kvpin}
P=${KVPIN_TEST_PREFIX:-build/test/prefix}
T=$(mktemp -d) || exit 1
trap 'rm -rf "$T"' EXIT
pass=0; fail=0
ok()  { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL e2e_docs: $*"; }
check() { # check DESCRIPTION COMMAND...: the command must succeed
    d=$1; shift
    if "$@"; then ok; else bad "$d"; fi
}

check "man page and completion cover every --help option" \
    python3 tools/check_docs.py "$KVPIN" docs/kvpin.1 docs/kvpin.bash-completion

# negative controls: the check notices a missing option
sed 's/\\-\\-request\\-timeout/\\-\\-request/g' docs/kvpin.1 >"$T/kvpin.1"
check "the man control lacks --request-timeout" sh -c "! grep -q 'request\\\\-timeout' '$T/kvpin.1'"
check "a man page without --request-timeout fails" \
    sh -c "! python3 tools/check_docs.py '$KVPIN' '$T/kvpin.1' docs/kvpin.bash-completion 2>/dev/null"
sed 's|s/^ \\{1,7\\}\\(--|s/^NEVER\\(--|' docs/kvpin.bash-completion >"$T/completion"
check "the completion control lost its long-only options rule" sh -c "! cmp -s docs/kvpin.bash-completion '$T/completion'"
check "a completion without the long-only options fails" \
    sh -c "! python3 tools/check_docs.py '$KVPIN' docs/kvpin.1 '$T/completion' 2>/dev/null"

if command -v groff >/dev/null 2>&1; then
    groff -man -ww -z docs/kvpin.1 2>"$T/groff.err"
    check "the man page renders without warnings: $(head -3 "$T/groff.err")" [ ! -s "$T/groff.err" ]
fi

if [ -d "$P/share" ]; then
    check "make install: share/man/man1/kvpin.1" cmp -s docs/kvpin.1 "$P/share/man/man1/kvpin.1"
    check "make install: share/bash-completion/completions/kvpin" \
        cmp -s docs/kvpin.bash-completion "$P/share/bash-completion/completions/kvpin"
fi

echo "e2e_docs: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
