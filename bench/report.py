#!/usr/bin/env python3
"""Prints the side-by-side table of `make bench` from its JSON lines:
kvpin's and llama.cpp's median tokens/s per (model, test, depth) and the
ratio kvpin / llama.cpp for each llama.cpp flash-attention mode measured."""
import json
import sys

rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
kv = {}
peer = {}
fa_modes = []
for r in rows:
    key = (r["model"], r["test"], r["depth"])
    if r.get("engine") == "kvpin":
        kv[key] = r
    else:
        mode = r.get("flash_attn_mode", "?")
        fa = "fa " + mode + ("=" + ("on" if r.get("flash_attn") else "off") if mode == "auto" else "")
        peer[(key, fa)] = r
        if fa not in fa_modes:
            fa_modes.append(fa)
head = "| model | test | depth | kvpin t/s (min-max) | " + " | ".join(
    "llama.cpp %s t/s | ratio" % f for f in fa_modes) + " |"
print(head)
print("|" + "---|" * (4 + 2 * len(fa_modes)))
for key in sorted(kv, key=lambda k: (k[0], k[1][:2], k[2])):
    r = kv[key]
    cells = ["%s" % key[0], key[1], str(key[2]),
             "%.1f (%.1f-%.1f)" % (r["tps_median"], r["tps_min"], r["tps_max"])]
    for f in fa_modes:
        p = peer.get((key, f))
        if p:
            cells += ["%.1f" % p["tps_median"], "%.2f" % (r["tps_median"] / p["tps_median"])]
        else:
            cells += ["-", "-"]
    print("| " + " | ".join(cells) + " |")
