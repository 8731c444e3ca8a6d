#!/bin/sh
# End-to-end tests of `kvpin canon` ($KVPIN, default ./kvpin), run from the
# repository root. Expected bytes come from references: the examples of
# RFC 8785 (sections 3.2.2 and 3.2.3) and the canonical forms V8 computed
# for tests/data/canon/doc-*.json (tools/canon_ref.mjs).
KVPIN=${KVPIN:-./kvpin}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
pass=0; fail=0
ok()  { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL e2e_canon: $*"; }
check() { # check DESCRIPTION COMMAND...: the command must succeed
    d=$1; shift
    if "$@"; then ok; else bad "$d"; fi
}

# RFC 8785 section 3.2.2, from stdin; no newline after the output
cat >"$T/rfc.json" <<'EOF'
{
  "numbers": [333333333.33333329, 1E30, 4.50,
              2e-3, 0.000000000000000000000000001],
  "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
  "literals": [null, true, false]
}
EOF
printf '%s' '{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],"string":"€$\u000f\nA'"'"'B\"\\\\\"/"}' >"$T/rfc.want"
"$KVPIN" canon <"$T/rfc.json" >"$T/out" 2>"$T/err"; rc=$?
check "RFC 8785 3.2.2 from stdin: exit 0" [ $rc -eq 0 ]
check "RFC 8785 3.2.2 from stdin: bytes" cmp -s "$T/out" "$T/rfc.want"
"$KVPIN" canon - <"$T/rfc.json" >"$T/out" 2>/dev/null
check "'-' reads stdin" cmp -s "$T/out" "$T/rfc.want"
"$KVPIN" canon --newline "$T/rfc.json" >"$T/out" 2>/dev/null
{ cat "$T/rfc.want"; echo; } >"$T/rfc.want.nl"
check "--newline adds one newline" cmp -s "$T/out" "$T/rfc.want.nl"

# RFC 8785 section 3.2.3: member order by UTF-16 code units
printf '{"\\u20ac":"Euro Sign","\\r":"Carriage Return","\\ufb33":"Hebrew Letter Dalet With Dagesh","1":"One","\\ud83d\\ude00":"Emoji: Grinning Face","\\u0080":"Control","\\u00f6":"Latin Small Letter O With Diaeresis"}' >"$T/sort.json"
printf '{"\\r":"Carriage Return","1":"One","\302\200":"Control","\303\266":"Latin Small Letter O With Diaeresis","\342\202\254":"Euro Sign","\360\237\230\200":"Emoji: Grinning Face","\357\254\263":"Hebrew Letter Dalet With Dagesh"}' >"$T/sort.want"
"$KVPIN" canon "$T/sort.json" >"$T/out" 2>/dev/null
check "RFC 8785 3.2.3 member order" cmp -s "$T/out" "$T/sort.want"

# every V8 reference document, given as a file argument
n=0
for f in tests/data/canon/doc-*.json; do
    "$KVPIN" canon "$f" >"$T/out" 2>"$T/err" || { bad "canon $f failed: $(cat "$T/err")"; continue; }
    if cmp -s "$T/out" "${f%.json}.canon"; then n=$((n + 1)); else bad "canon $f differs from V8"; fi
done
check "V8 documents compared" [ "$n" -ge 40 ]
# canonical output is a fixed point
"$KVPIN" canon tests/data/canon/doc-07.json | "$KVPIN" canon >"$T/out" 2>/dev/null
check "canon of canon is unchanged" cmp -s "$T/out" tests/data/canon/doc-07.canon

# errors: FILE:line:col: message, exit 1
printf '{\n  "a": 1,\n  "b": tru\n}\n' >"$T/bad.json"
"$KVPIN" canon "$T/bad.json" >"$T/out" 2>"$T/err"; rc=$?
check "syntax error: exit 1" [ $rc -eq 1 ]
check "syntax error: FILE:line:col" grep -q "^kvpin canon: $T/bad.json:3:[0-9]*: " "$T/err"
check "syntax error: nothing on stdout" [ ! -s "$T/out" ]
printf '{"a":1,"a":2}' | "$KVPIN" canon >/dev/null 2>"$T/err"; rc=$?
check "duplicate member names refused" sh -c "[ $rc -eq 1 ] && grep -q '^kvpin canon: <stdin>:1:[0-9]*: duplicate' '$T/err'"
printf '[1e400]' | "$KVPIN" canon >/dev/null 2>"$T/err"; rc=$?
check "number overflow refused" sh -c "[ $rc -eq 1 ] && grep -q '^kvpin canon: <stdin>:1:' '$T/err'"
printf '[NaN]' | "$KVPIN" canon >/dev/null 2>&1; rc=$?
check "NaN refused" [ $rc -eq 1 ]
printf '' | "$KVPIN" canon >/dev/null 2>"$T/err"; rc=$?
check "empty input refused" sh -c "[ $rc -eq 1 ] && grep -q '^kvpin canon: <stdin>:1:1: ' '$T/err'"
python3 -c "print('[' * 600 + ']' * 600)" | "$KVPIN" canon >/dev/null 2>"$T/err"; rc=$?
check "nesting limit" sh -c "[ $rc -eq 1 ] && grep -q 'deeper than' '$T/err'"
"$KVPIN" canon /nonexistent.json >/dev/null 2>"$T/err"; rc=$?
check "missing file: exit 1" sh -c "[ $rc -eq 1 ] && grep -q 'cannot open /nonexistent.json' '$T/err'"
"$KVPIN" canon --bogus >/dev/null 2>&1; rc=$?
check "unknown option: exit 2" [ $rc -eq 2 ]
"$KVPIN" canon a.json b.json >/dev/null 2>&1; rc=$?
check "two files: exit 2" [ $rc -eq 2 ]
"$KVPIN" canon --help >"$T/out" 2>&1; rc=$?
check "--help" sh -c "[ $rc -eq 0 ] && grep -q 'usage: kvpin canon' '$T/out'"

echo "e2e_canon: $pass passed, $fail failed"
[ $fail -eq 0 ]
