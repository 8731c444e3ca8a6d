#!/bin/sh
# kvpin bench --plot: the SVG parses as XML, has one point per measured
# configuration (prompt length x depth for prefill and time to first token,
# depth for decode) with the values the JSON lines report, llama.cpp's
# points from --peer for the same model file only, the bytes-bound ceiling
# as a line, and axis ranges that cover every point. $KVPIN names the binary.
KVPIN=${KVPIN:-./kvpin}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
cat >"$T/peer.jsonl" <<'JSON'
{"engine":"llama.cpp","model":"stories260K.gguf","test":"pp16","depth":0,"flash_attn_mode":"off","tps_median":9000.5}
{"engine":"llama.cpp","model":"stories260K.gguf","test":"tg8","depth":40,"flash_attn_mode":"off","tps_median":4000}
{"engine":"llama.cpp","model":"another.gguf","test":"tg8","depth":40,"flash_attn_mode":"off","tps_median":4000}
JSON
"$KVPIN" bench -m models/stories260K.gguf -p 16,24,40 -n 8 -d 0,40 -r 1 -t 1 --json --plot "$T/out.svg" \
    --peer "$T/peer.jsonl" >"$T/out.jsonl" 2>"$T/err.txt" || { echo "FAIL e2e_plot: kvpin bench:"; cat "$T/err.txt"; exit 1; }
# --plot alone sweeps prompts and depths: more than one point per panel
"$KVPIN" bench -m models/stories260K.gguf -n 8 -r 1 -t 1 --no-probe --json --plot "$T/sweep.svg" >"$T/sweep.jsonl" \
    2>"$T/err.txt" || { echo "FAIL e2e_plot: kvpin bench --plot (defaults):"; cat "$T/err.txt"; exit 1; }
python3 - "$T/sweep.jsonl" <<'PY' || exit 1
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
pp = sorted({(r["test"], r["depth"]) for r in rows if r["test"].startswith("pp")})
tg = sorted({r["depth"] for r in rows if r["test"].startswith("tg")})
if len(pp) != 9 or tg != [0, 512, 1024]:
    print("FAIL e2e_plot: --plot with the defaults measured %s and %s" % (pp, tg)); sys.exit(1)
PY
exec python3 - "$T/out.svg" "$T/out.jsonl" <<'PY'
import json, re, sys
import xml.etree.ElementTree as ET
NS = "{http://www.w3.org/2000/svg}"
passed = failed = 0
def ok(c, what):
    global passed, failed
    if c: passed += 1
    else: failed += 1; print("FAIL e2e_plot: " + what)
try:
    root = ET.parse(sys.argv[1]).getroot()
    ok(root.tag == NS + "svg", "the root is <svg>")
except ET.ParseError as e:
    print("FAIL e2e_plot: the SVG is not XML: %s" % e); sys.exit(1)
rows = [json.loads(l) for l in open(sys.argv[2])]
pp = [r for r in rows if r["test"].startswith("pp")]
tg = [r for r in rows if r["test"].startswith("tg")]
ok(len(pp) == 6 and len(tg) == 2, "6 pp and 2 tg measurements: %d, %d" % (len(pp), len(tg)))
panels = {g.get("data-title"): g for g in root.iter(NS + "g") if g.get("class") == "panel"}
ok(sorted(panels) == ["decode", "prefill", "time to first token"], "panels: %s" % sorted(panels))
def points(g, prefix):
    return [(float(c.get("data-x")), float(c.get("data-y"))) for c in g.iter(NS + "circle")
            if c.get("class") == "point" and c.get("data-series").startswith(prefix)]
def close(a, b):
    return abs(a - b) <= 1e-5 * max(abs(a), abs(b), 1e-9)
want = {"prefill": [(float(r["test"][2:]), r["tps_median"]) for r in pp],
        "time to first token": [(float(r["test"][2:]), 1e3 * float(r["test"][2:]) / r["tps_median"]) for r in pp],
        "decode": [(float(r["depth"]), r["tps_median"]) for r in tg]}
for name, g in panels.items():
    got = sorted(points(g, "kvpin"))
    exp = sorted(want[name])
    ok(len(got) == len(exp) and all(close(a[0], b[0]) and close(a[1], b[1]) for a, b in zip(got, exp)),
       "%s: kvpin points %s, measured %s" % (name, got, exp))
    peer = points(g, "llama.cpp")
    ok(len(peer) == 1, "%s: one llama.cpp point of this model: %s" % (name, peer))
    xmin, xmax, ymin, ymax = (float(g.get(k)) for k in ("data-xmin", "data-xmax", "data-ymin", "data-ymax"))
    allp = points(g, "")
    ok(all(xmin <= x <= xmax and ymin <= y <= ymax for x, y in allp) and xmax > xmin and ymax > ymin,
       "%s: axes [%g, %g] x [%g, %g] cover %s" % (name, xmin, xmax, ymin, ymax, allp))
    ok(len(g.findall(".//" + NS + "text")) > 12, "%s: ticks, labels and a legend" % name)
lines = [l for l in panels["decode"].iter(NS + "polyline") if l.get("class") == "line"]
ok(len(lines) == 1 and "ceiling" in lines[0].get("data-series") and len(lines[0].get("points").split()) == 17,
   "decode: the bytes-bound ceiling line")
ok(any("tokens / s" in (t.text or "") for t in panels["prefill"].iter(NS + "text")), "units on the axes")
# each kvpin series of two or more points is joined by a line through them in x order
for name, g in panels.items():
    series = {}
    for c in g.iter(NS + "circle"):
        if c.get("class") == "point" and c.get("data-series").startswith("kvpin"):
            series.setdefault(c.get("data-series"), []).append(c)
    joins = {l.get("data-series"): l for l in g.iter(NS + "polyline") if l.get("class") == "join"}
    for sname, cs in series.items():
        if len(cs) < 2:
            continue
        l = joins.get(sname)
        want = [(float(c.get("cx")), float(c.get("cy"))) for c in sorted(cs, key=lambda c: float(c.get("data-x")))]
        got = [tuple(float(v) for v in p.split(",")) for p in l.get("points").split()] if l is not None else []
        ok(len(got) == len(want) and all(abs(a[0] - b[0]) < 0.01 and abs(a[1] - b[1]) < 0.01 for a, b in zip(got, want)),
           "%s: %s joined through its points: %s vs %s" % (name, sname, got, want))
print("e2e_plot: %d passed, %d failed" % (passed, failed))
sys.exit(1 if failed else 0)
PY
