#!/usr/bin/env python3
"""check_floors.py - the layering of src/ (run by `make check`).

kvpin's library is a stack of floors, one folder each (src/README.md says
what each owns). A file may include headers of its own folder and of
folders on lower floors only; folders on the same floor are independent of
each other. This script reads every #include "..." of src/, cli/, tests/
(every folder below it), tools/, bench/ and fuzz/ (node_modules/ aside),
prints the folder-level include graph (edges with counts) and the
file-level graph of each folder, and fails (exit 1) when

  - a file includes a header of a higher floor, or of another folder on its
    own floor;
  - an include names a header that does not exist (a stale path);
  - the file-level include graph has a circle (a.h -> b.h -> a.h);
  - a file of src/ other than the routing table (ROUTING) includes the
    header of an API dialect (a .c that defines a `kp_dialect` table, its
    header: serve/answer.h's dialects are known to the rest of the
    library only through that interface), the dialect's own .c aside;
  - with --objects DIR: the files of one folder call each other in a circle
    (a.c uses a symbol b.c defines and b.c one a.c defines, directly or
    through others), read from `nm` of the compiled objects under DIR.

cli/, tests/, tools/, bench/ and fuzz/ sit above every floor of src/: they
may include anything, and nothing in src/ may include them.

Usage: tools/check_floors.py [--objects build/rel] [--quiet]
"""
import os
import re
import subprocess
import sys
from collections import defaultdict

# Floor of each folder of src/, lowest first. Same number: independent.
FLOORS = {
    "base": 0,     # status, growable buffers, UTF-8, threads, canonical JSON
    "gguf": 1,     # the file format: reader, writer, element types
    "jinja": 1,    # the Jinja template interpreter (chat templates over JSON values)
    "kernels": 2,  # dot products per weight type, attention inner loops, CPU dispatch
    "kv": 2,       # the KV block pool
    "tok": 3,      # tokenizers and the text of generated tokens
    "model": 3,    # hyperparameters, weights, the forward pass, sampling, random models
    "grammar": 4,  # constrained decoding: grammars, JSON Schema / GBNF, matcher, token masks
    "cache": 5,    # prefix index, KV block records and keys, tiers below RAM, miss analysis (doctor)
    "engine": 6,   # the engine (KV pool + index + forward pass), the generation loop, cache reports
    "api": 7,      # the public library interface (kvpin.h)
    "serve": 7,    # scheduler, API dialects, chat templates, HTTP server
}
TOP = 100  # cli/, tests/, tools/, bench/, fuzz/

# The one file of src/ that may include the API dialects' headers.
ROUTING = os.path.join("src", "serve", "routes.c")
DIALECT = re.compile(r'^\s*static\s+const\s+kp_dialect\s+\w+\s*=', re.M)

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def files_under(root, exts=(".c", ".h")):
    out = []
    for d, dirs, names in os.walk(root):
        dirs[:] = [x for x in dirs if x != "node_modules"]  # npm packages (bench/, tests/clients/)
        for n in sorted(names):
            if n.endswith(exts):
                out.append(os.path.join(d, n))
    return sorted(out)


def folder_of(path):
    """('kernels', 2) for src/kernels/quant.c, ('cli', TOP) for cli/run.c."""
    parts = path.split(os.sep)
    if parts[0] == "src" and len(parts) >= 3:
        return parts[1], FLOORS.get(parts[1])
    if parts[0] == "include":  # kvpin.h: the public face of src/api/, the same folder
        return "api", FLOORS["api"]
    return parts[0], TOP


def resolve(src, inc):
    """The file an include names: next to the includer, then under src/ or include/."""
    for base in (os.path.dirname(src), "src", "include"):
        p = os.path.normpath(os.path.join(base, inc))
        if os.path.isfile(p):
            return p
    return None


def find_cycle(graph):
    """One circle of the directed graph {node: set(nodes)}, or None."""
    WHITE, GREY, BLACK = 0, 1, 2
    color = defaultdict(int)
    stack = []

    def visit(n):
        color[n] = GREY
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if color[m] == GREY:
                return stack[stack.index(m):] + [m]
            if color[m] == WHITE:
                c = visit(m)
                if c:
                    return c
        stack.pop()
        color[n] = BLACK
        return None

    for n in sorted(graph):
        if color[n] == WHITE:
            c = visit(n)
            if c:
                return c
    return None


def symbol_graph(objdir):
    """{object: set(objects it takes symbols from)} per folder, from nm."""
    defs, uses = {}, defaultdict(set)
    objs = [p for p in files_under(objdir, (".o",)) if not os.path.basename(p).startswith(("cli_", "test_"))]
    # objects of deleted sources (DIR/FLOOR/x.o without src/FLOOR/x.c) are stale
    objs = [p for p in objs if os.path.isfile(os.path.join("src", os.path.relpath(p, objdir))[:-2] + ".c")]
    for o in objs:
        out = subprocess.run(["nm", o], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            f = line.split()
            if len(f) == 3 and f[1] in "TDBR":
                defs[f[2]] = o
            elif len(f) == 2 and f[0] == "U":
                uses[o].add(f[1])
    graph = defaultdict(set)
    for o, syms in uses.items():
        for s in syms:
            d = defs.get(s)
            if d and d != o and os.path.dirname(d) == os.path.dirname(o):
                graph[o].add(d)
    return graph


def main(argv):
    objdir = None
    quiet = "--quiet" in argv
    if "--objects" in argv:
        objdir = argv[argv.index("--objects") + 1]
    errors = []
    files = []
    for root in ("src", "include", "cli", "tests", "tools", "bench", "fuzz"):
        if os.path.isdir(root):
            files += files_under(root)
    for p in files:
        if p.startswith("src" + os.sep) and p.count(os.sep) == 1:
            errors.append("%s: library code must live in a floor folder (src/FLOOR/)" % p)
        f, rank = folder_of(p)
        if p.startswith("src" + os.sep) and p.count(os.sep) >= 2 and rank is None:
            errors.append("%s: folder src/%s/ has no floor in tools/check_floors.py" % (p, f))
    dialect_headers = set()
    for p in files:
        if p.startswith("src" + os.sep) and p.endswith(".c"):
            with open(p, encoding="utf-8", errors="replace") as fh:
                if DIALECT.search(fh.read()):
                    dialect_headers.add(p[:-2] + ".h")
    folder_edges = defaultdict(int)
    file_graph = defaultdict(set)
    for p in files:
        f, rank = folder_of(p)
        with open(p, encoding="utf-8", errors="replace") as fh:
            text = fh.read()
        for m in INCLUDE.finditer(text):
            target = resolve(p, m.group(1))
            if target is None:
                errors.append('%s: #include "%s" names no file' % (p, m.group(1)))
                continue
            g, grank = folder_of(target)
            file_graph[p].add(target)
            if (target in dialect_headers and p.startswith("src" + os.sep) and p != ROUTING
                    and p[:-2] != target[:-2]):
                errors.append('%s includes the dialect header "%s": only %s may (the rest of src/ knows a '
                              'dialect through serve/answer.h)' % (p, m.group(1), ROUTING))
            if g != f:
                folder_edges[(f, g)] += 1
            if rank is None or grank is None or g == f:
                continue
            if grank > rank or (grank == rank and rank != TOP):
                errors.append('%s (floor %s, %d) includes "%s" (floor %s, %d): %s' %
                              (p, f, rank, m.group(1), g, grank,
                               "a higher floor" if grank > rank else "another folder of the same floor"))
    cyc = find_cycle(file_graph)
    if cyc:
        errors.append("include circle: " + " -> ".join(cyc))
    if objdir:
        sg = symbol_graph(objdir)
        cyc = find_cycle(sg)
        if cyc:
            errors.append("call circle between files: " + " -> ".join(os.path.basename(c) for c in cyc))
    if not quiet:
        print("include graph of the floors (includer -> included: #includes)")
        order = sorted(set(k for e in folder_edges for k in e), key=lambda x: (FLOORS.get(x, TOP), x))
        for a in order:
            outs = [(b, n) for (x, b), n in folder_edges.items() if x == a]
            if not outs:
                continue
            outs.sort(key=lambda t: (-FLOORS.get(t[0], TOP), t[0]))
            print("  %-8s (%3s) -> %s" % (a, FLOORS.get(a, "top"),
                                          ", ".join("%s %d" % (b, n) for b, n in outs)))
        print("files per folder, and what each includes within it")
        for fl in sorted(FLOORS, key=lambda x: (FLOORS[x], x)):
            inside = [p for p in files if p.startswith(os.path.join("src", fl) + os.sep)]
            if not inside:
                continue
            print("  src/%s/ (floor %d): %d files" % (fl, FLOORS[fl], len(inside)))
            for p in inside:
                own = sorted(os.path.basename(t) for t in file_graph[p] if os.path.dirname(t) == os.path.dirname(p))
                if own:
                    print("      %-22s -> %s" % (os.path.basename(p), " ".join(own)))
    for e in errors:
        print("check_floors: " + e, file=sys.stderr)
    if errors:
        return 1
    if not quiet:
        print("check_floors: no include runs up a floor, no circle%s" %
              (" (includes and calls)" if objdir else " (includes)"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
