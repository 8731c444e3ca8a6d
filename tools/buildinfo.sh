#!/bin/sh
# tools/buildinfo.sh OUT CC FLAGS: writes OUT, the header `kvpin --version`
# reads (cli/version.c): the git commit of the source tree (short hash,
# "-dirty" when the tree has changes, "unknown" when it is not a git
# checkout of its own), the compiler command and the flags. OUT is only
# rewritten when its text changes, so make recompiles version.c when the
# commit or the flags change and not otherwise.
out=$1 cc=$2 flags=$3
root=$(cd "$(dirname "$0")/.." && pwd)
commit=unknown
top=$(git -C "$root" rev-parse --show-toplevel 2>/dev/null)
if [ -n "$top" ] && [ "$(cd "$top" && pwd)" = "$root" ] && c=$(git -C "$root" rev-parse --short HEAD 2>/dev/null); then
    commit=$c
    [ -n "$(git -C "$root" status --porcelain 2>/dev/null)" ] && commit="$commit-dirty"
fi
esc() { printf '%s' "$1" | tr -s ' \t\n' '   ' | sed 's/^ //; s/ $//; s/\\/\\\\/g; s/"/\\"/g'; }
mkdir -p "$(dirname "$out")"
tmp="$out.tmp.$$"
{
    echo "/* written by tools/buildinfo.sh: the build that cli/version.c reports */"
    printf '#define KP_GIT_COMMIT "%s"\n' "$(esc "$commit")"
    printf '#define KP_BUILD_CC "%s"\n' "$(esc "$cc")"
    printf '#define KP_BUILD_FLAGS "%s"\n' "$(esc "$flags")"
} >"$tmp"
if cmp -s "$tmp" "$out"; then rm -f "$tmp"; else mv "$tmp" "$out"; fi
