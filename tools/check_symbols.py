#!/usr/bin/env python3
"""check_symbols.py - what libkvpin exports (run by tests/shell/e2e_library.sh).

The public interface is include/kvpin.h: every function it declares is
marked KP_API, the library's objects are compiled with -fvisibility=hidden,
and the shared object's version script exports kp_* only. This script
checks the result in the built (or installed) libraries:

  - `nm -D --defined-only libkvpin.so` lists exactly the functions kvpin.h
    declares with KP_API (read from the header itself), nothing more, and
    all of them start with kp_;
  - `nm -g --defined-only libkvpin.a` shows no global symbol without the
    kp_ prefix (so the static library links beside ggml and other
    libraries), and defines every function of kvpin.h.

Prints one line per problem and exits 1 when there is any.

Usage: tools/check_symbols.py include/kvpin.h build/rel/libkvpin.so build/rel/libkvpin.a
"""
import re
import subprocess
import sys

DECL = re.compile(r"\bKP_API\b([^;{]*?)\b(\w+)\s*\(", re.S)


def header_functions(path):
    text = open(path, encoding="utf-8").read()
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)  # comments mention KP_API too
    text = re.sub(r"^\s*#.*$", " ", text, flags=re.M)   # the #define of KP_API itself
    return {m.group(2) for m in DECL.finditer(text)}


def nm(args):
    out = subprocess.run(["nm"] + args, capture_output=True, text=True, check=True).stdout
    syms = set()
    for line in out.splitlines():
        f = line.split()
        # "ADDR TYPE NAME" (defined); archive member headers ("x.o:") and blank lines skipped
        if len(f) == 3 and len(f[1]) == 1:
            syms.add(f[2].split("@")[0])
    return syms


def main(argv):
    if len(argv) != 3:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    header, so, ar = argv
    errors = []
    api = header_functions(header)
    if not api:
        errors.append("%s declares no KP_API function" % header)
    for f in sorted(api):
        if not f.startswith("kp_"):
            errors.append("%s: %s does not start with kp_" % (header, f))
    dyn = nm(["-D", "--defined-only", so])
    for s in sorted(dyn - api):
        errors.append("%s exports %s, which %s does not declare" % (so, s, header))
    for s in sorted(api - dyn):
        errors.append("%s does not export %s (declared in %s)" % (so, s, header))
    static = nm(["-g", "--defined-only", ar])
    for s in sorted(static):
        if not s.startswith("kp_"):
            errors.append("%s: global symbol %s lacks the kp_ prefix" % (ar, s))
    for s in sorted(api - static):
        errors.append("%s does not define %s (declared in %s)" % (ar, s, header))
    for e in errors:
        print("check_symbols: " + e, file=sys.stderr)
    if not errors:
        print("check_symbols: %s exports the %d functions of %s; %s has %d global symbols, all kp_*" %
              (so, len(api), header, ar, len(static)))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
