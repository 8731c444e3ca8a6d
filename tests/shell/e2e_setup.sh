#!/bin/sh
# `make deps all` on a machine without the packages: the flags pkg-config
# gives must be read after `deps` installed them, not when make reads the
# Makefile (the hiredis headers live in /usr/include/hiredis, so a compile
# that ran without pkg-config's -I fails). A copy of the tree runs make
# with stand-ins first in PATH: dpkg-query reports nothing installed and
# pkg-config knows no package until apt-get (the stand-in) has "installed"
# them; then both defer to the real tools. Built with -j2, so the order
# must hold in parallel too.
set -u
top=$(cd "$(dirname "$0")/../.." && pwd)
t=$(mktemp -d)
trap 'rm -rf "$t"' EXIT
fail() { echo "e2e_setup: FAIL: $*"; exit 1; }
command -v pkg-config >/dev/null || fail "pkg-config is not installed (make deps)"
real_pc=$(command -v pkg-config)
real_dq=$(command -v dpkg-query)
mkdir -p "$t/bin" "$t/tree"
cat >"$t/bin/pkg-config" <<EOS
#!/bin/sh
[ -f "$t/installed" ] && exec "$real_pc" "\$@"
exit 1
EOS
cat >"$t/bin/dpkg-query" <<EOS
#!/bin/sh
[ -f "$t/installed" ] && exec "$real_dq" "\$@"
exit 1
EOS
cat >"$t/bin/apt-get" <<EOS
#!/bin/sh
[ "\$1" = update ] || touch "$t/installed"
EOS
printf '#!/bin/sh\nshift 0; exec "$@"\n' >"$t/bin/sudo"
chmod +x "$t/bin/"*
(cd "$top" && cp -r Makefile src include cli tools web "$t/tree/")
cd "$t/tree" || fail "no tree"
PATH="$t/bin:$PATH" make -j2 deps build/rel/cache/redistier.o build/asan/cache/redistier.o >"$t/log" 2>&1 ||
    { tail -5 "$t/log"; fail "make deps build/rel/cache/redistier.o failed"; }
[ -f "$t/installed" ] || fail "make deps did not run apt-get"
grep -q "installing Debian packages" "$t/log" || fail "deps did not see the packages missing"
n=$(grep -c -- "-I/usr/include/hiredis" "$t/log")
[ "$n" -ge 2 ] || { cat "$t/log"; fail "the compiles ran without pkg-config's flags"; }
echo "e2e_setup: ok (make -j2 deps + compile: pkg-config read after the install)"
