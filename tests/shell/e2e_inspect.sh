#!/bin/sh
# kvpin inspect --html: the heat map page holds one row per step (the
# prefill's last position, then each decode step), row r over n_prompt + r
# cached positions, each row's weights summing to 1 (a softmax), prompt and
# generated columns marked, and the same weights the text output prints
# for the same greedy run. $KVPIN names the binary.
KVPIN=${KVPIN:-./kvpin}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
"$KVPIN" inspect -m models/stories260K.gguf -p "Once upon a time" -n 6 -t 1 --html "$T/a.html" >"$T/out.txt" 2>"$T/err.txt" ||
    { echo "FAIL e2e_inspect: kvpin inspect:"; cat "$T/err.txt"; exit 1; }
"$KVPIN" inspect -m models/stories260K.gguf -p "x" -n 2 --html "$T/no/such/dir.html" >/dev/null 2>"$T/err2.txt"
rc=$?
exec python3 - "$T/a.html" "$T/out.txt" "$rc" "$T/err2.txt" <<'PY'
import html.parser, re, sys
passed = failed = 0
def ok(c, what):
    global passed, failed
    if c: passed += 1
    else: failed += 1; print("FAIL e2e_inspect: " + what)
class P(html.parser.HTMLParser):
    def __init__(self):
        super().__init__(); self.table = None; self.rows = []; self.heads = []
    def handle_starttag(self, tag, a):
        a = dict(a)
        if tag == "table" and a.get("id") == "heat": self.table = a
        elif tag == "tr" and a.get("class") == "step": self.rows.append((a, []))
        elif tag == "td" and self.rows and "data-v" in a: self.rows[-1][1].append((int(a["data-p"]), float(a["data-v"]), a["class"]))
        elif tag == "th" and "data-p" in a: self.heads.append((int(a["data-p"]), a["class"]))
p = P(); p.feed(open(sys.argv[1]).read())
text = open(sys.argv[2]).read()
n_prompt = int(re.search(r"prefill: (\d+) prompt tokens", text).group(1))
# the text output's weights: the prefill's table, then each decode's list
steps = [[float(x) for x in re.findall(r"pos +\d+ .*? (\d\.\d{4}) ", text.split("decode:")[0])]]
for block in re.findall(r"over the cache:\n((?:    [0-9. ]+\n)+)", text):
    steps.append([float(x) for x in block.split()])
ok(p.table is not None and int(p.table["data-prompt"]) == n_prompt, "the table and its prompt length")
ok(len(p.rows) == len(steps) and len(steps) >= 4, "rows %d, steps in the text output %d" % (len(p.rows), len(steps)))
for r, (attrs, cells) in enumerate(p.rows):
    ok(int(attrs["data-keys"]) == n_prompt + r and [c[0] for c in cells] == list(range(n_prompt + r)),
       "row %d covers %d cached positions: %s" % (r, n_prompt + r, attrs))
    ok(abs(sum(c[1] for c in cells) - 1) < 1e-4, "row %d sums to 1: %g" % (r, sum(c[1] for c in cells)))
    ok(all(c[2].startswith("prompt" if c[0] < n_prompt else "gen") for c in cells), "row %d: prompt vs generated" % r)
    if r < len(steps):
        tol = 5e-5 if r == 0 else 5e-4
        ok(len(steps[r]) == len(cells) and all(abs(a - c[1]) <= tol for a, c in zip(steps[r], cells)),
           "row %d: the weights the text output prints %s vs %s" % (r, steps[r], [c[1] for c in cells]))
ok(len(p.heads) == n_prompt + len(p.rows) - 1 and "first-gen" in p.heads[n_prompt][1], "column heads, the first generated marked")
ok(sys.argv[3] != "0" and "cannot write" in open(sys.argv[4]).read(), "an unwritable --html fails with a message")
print("e2e_inspect: %d passed, %d failed" % (passed, failed))
sys.exit(1 if failed else 0)
PY
