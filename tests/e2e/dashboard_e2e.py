"""dashboard_e2e.py - the cache dashboard (GET /) in headless Chromium,
against a real `kvpin serve` on loopback (run by tests/run_all.sh).

After a scripted agent loop (each turn resends the conversation with the
answer and one more user line) and a timestamp miss, Chromium loads the
page and dumps its DOM; the checks compare the DOM with what the server
and the responses said:

  - the memory bill's cells (data-bytes) are /v1/cache's kv numbers;
  - the node count is /v1/cache's counts.nodes, and the tree draws one
    rectangle per node; /v1/cache/events' tree is a tree of the index
    (its leaves are counts.prefixes, its runs sum to counts.cached_tokens);
  - the newest request row has the last response's prompt and reused
    tokens, its miss row the cause `timestamp`, the snippets the response's
    kvpin_cache snippets, and the marked bytes are exactly the characters
    where the two prompts differ (from the test's own two texts);
  - per-minute buckets sum to the responses' reused and computed tokens;
  - a node's whole text (GET /v1/cache/node/CHAIN, and the page opened
    with #node=CHAIN, as a click shows it) is the text of a prompt the test
    sent and its answer, up to where the node ends; an unknown chain is a
    404, a malformed one a 400;
  - with --api-key: no key asks for one, a wrong key says so, the right key
    (from #key= or the form) shows the bill;
  - with --cache-dir, the bill's disk row is /v1/cache's tiers.disk;
  - --no-dashboard: GET / is a 404, the JSON stays.

Screenshots go to build/test/dashboard.png and dashboard-wrong-key.png.
Chromium is $CHROMIUM or `chromium` on PATH (Debian: apt-get install
chromium; tools/debian-packages.txt lists it).
"""
import html.parser
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kvpin_test import Results, Server, wait_idle, no_leaks  # noqa: E402

R = Results("e2e_dashboard")
ok = R.ok
CHROMIUM = os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
SHOTS = "build/test"


class Node:
    def __init__(self, tag, attrs, parent):
        self.tag, self.attrs, self.parent, self.children, self.text = tag, dict(attrs), parent, [], []

    def all_text(self):
        out = []
        for t in self.text:
            out.append(t if isinstance(t, str) else t.all_text())
        return "".join(out)

    def find_all(self, pred):
        found = [self] if pred(self) else []
        for c in self.children:
            found += c.find_all(pred)
        return found

    def classes(self):
        return (self.attrs.get("class") or "").split()


VOID = {"meta", "link", "br", "img", "input", "hr", "col", "area", "base", "wbr", "source"}


class Dom(html.parser.HTMLParser):
    """The DOM Chromium dumps, as a tree of Node (text kept in order)."""

    def __init__(self, text):
        super().__init__(convert_charrefs=True)
        self.root = Node("#root", {}, None)
        self.cur = self.root
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        n = Node(tag, attrs, self.cur)
        self.cur.children.append(n)
        self.cur.text.append(n)
        if tag not in VOID:
            self.cur = n

    def handle_startendtag(self, tag, attrs):
        n = Node(tag, attrs, self.cur)
        self.cur.children.append(n)
        self.cur.text.append(n)

    def handle_endtag(self, tag):
        n = self.cur
        while n is not self.root and n.tag != tag:
            n = n.parent
        if n is not self.root:
            self.cur = n.parent

    def handle_data(self, data):
        self.cur.text.append(data)

    def by_id(self, i):
        f = self.root.find_all(lambda n: n.attrs.get("id") == i)
        return f[0] if f else None

    def by_class(self, c):
        return self.root.find_all(lambda n: c in n.classes())


def chromium(url, *args):
    prof = tempfile.mkdtemp(prefix="kvpin-chromium-")
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--hide-scrollbars",
           "--no-first-run", "--user-data-dir=" + prof, "--window-size=1400,1700",
           "--virtual-time-budget=3000"] + list(args) + [url]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    finally:
        shutil.rmtree(prof, ignore_errors=True)
    return r


def load(url, tries=3):
    """The DOM once the page has drawn (data-ready on body), or the last one."""
    dom = None
    for _ in range(tries):
        r = chromium(url, "--dump-dom")
        dom = Dom(r.stdout)
        body = dom.root.find_all(lambda n: n.tag == "body")
        if body and body[0].attrs.get("data-ready") == "1":
            return dom
    return dom


def shot(url, name):
    path = os.path.join(SHOTS, name)
    if os.path.exists(path):
        os.unlink(path)
    chromium(url, "--screenshot=" + os.path.abspath(path))
    ok(os.path.exists(path) and os.path.getsize(path) > 10000, "screenshot %s written" % path)
    return path


def diff_run(x, y):
    """The characters of x between the common prefix and the common suffix of x and y."""
    p = len(os.path.commonprefix([x, y]))
    s = len(os.path.commonprefix([x[p:][::-1], y[p:][::-1]]))
    return x[p:len(x) - s]


def agent_loop(srv):
    """Three turns of a growing conversation, then a timestamp edit. Returns
    the responses in order and the two timestamped prompts."""
    out = []
    prompt = "User: Tell me a story about a cat.\nAssistant:"
    for _ in range(3):
        st, _, j = srv.post("/v1/completions", {"prompt": prompt, "max_tokens": 6, "temperature": 0})
        ok(st == 200, "agent turn: %s" % st)
        out.append(j)
        prompt = prompt + j["choices"][0]["text"] + "\nUser: And then?\nAssistant:"
    a = "System: it is 2026-11-28 09:14:03 UTC.\nYou are a careful assistant.\nUser: hello"
    b = a.replace("2026-11-28 09:14:03", "2026-11-29 10:02:41")
    for p in (a, b):
        st, _, j = srv.post("/v1/completions", {"prompt": p, "max_tokens": 4, "temperature": 0})
        ok(st == 200, "timestamp prompt: %s" % st)
        out.append(j)
    return out, a, b


def check_page(srv):
    resps, a, b = agent_loop(srv)
    ok(resps[-1]["kvpin_cache"]["cause"] == "timestamp", "the edit is a timestamp miss: %s" % resps[-1]["kvpin_cache"])
    ok(wait_idle(srv), "idle after the loop")
    st, cache = srv.get("/v1/cache")
    st2, ev = srv.get("/v1/cache/events")
    ok(st == 200 and st2 == 200, "GET /v1/cache %d, /v1/cache/events %d" % (st, st2))
    # the tree of the events is the index's
    nodes = ev["tree"]["nodes"]
    ok(ev["tree"]["total"] == cache["counts"]["nodes"] == len(nodes), "tree nodes %d / %d, /v1/cache %d" %
       (len(nodes), ev["tree"]["total"], cache["counts"]["nodes"]))
    ok(sum(1 for n in nodes if n["children"] == 0) == cache["counts"]["prefixes"], "tree leaves vs prefixes")
    ok(sum(n["tokens"] for n in nodes) == cache["counts"]["cached_tokens"], "tree runs vs cached_tokens")
    ok(all(n["parent"] < n["id"] and (n["start"] == 0 if n["parent"] < 0 else n["start"] == nodes[n["parent"]]["end"])
           for n in nodes), "every node starts where its parent ends")
    # the history agrees with the responses
    h = ev["history"]
    ok(len(h["requests"]) == len(resps), "history: %d requests" % len(h["requests"]))
    reused = sum(j["usage"]["prompt_tokens_details"]["cached_tokens"] for j in resps)
    computed = sum(j["kvpin_cache"]["computed_tokens"] for j in resps)
    ok(sum(m["reused"] for m in h["minutes"]) == reused, "minutes: reused tokens sum to the responses'")
    ok(sum(sum(m["computed"].values()) for m in h["minutes"]) == computed, "minutes: computed tokens sum")
    ok(sum(m["computed"].get("timestamp", 0) for m in h["minutes"]) == resps[-1]["kvpin_cache"]["computed_tokens"],
       "minutes: the timestamp miss's computed tokens under timestamp")
    warm = [j["usage"]["prompt_tokens_details"]["cached_tokens"] > 0 and j["kvpin_cache"].get("cause") != "cold"
            for j in resps]
    ok(len(h["latency"]) == len(resps) and [p["warm"] for p in h["latency"]] == warm, "latency points, warm ones")
    ok(sum(m["hits"] for m in h["minutes"]) == sum(warm), "minutes: hits are the warm requests")

    dom = load("http://127.0.0.1:%d/" % srv.port)
    body = dom.root.find_all(lambda n: n.tag == "body")
    ok(body and body[0].attrs.get("data-ready") == "1", "the page drew (data-ready)")
    kv = cache["kv"]
    for f in ("budget_bytes", "used_bytes", "index_bytes", "pinned_bytes", "shared_bytes", "saved_bytes",
              "free_bytes"):
        cell = dom.by_id("bill-" + f)
        ok(cell is not None and cell.attrs.get("data-bytes") == str(kv[f]), "bill %s: %s vs %d" %
           (f, cell and cell.attrs.get("data-bytes"), kv[f]))
    fm = dom.by_id("formula")
    m = ev["model"]
    # bytes per value of the pool's type, from ggml's block layouts (not from the server)
    per_value = {"F32": 4, "F16": 2, "Q8_0": 34 / 32, "Q4_0": 18 / 32}[m["kv_type_k"].upper()]
    want = "2 (K and V) x %d layers x %d kv_heads x %d head_dim x %g bytes (%s) = %d" % (
        m["n_layer"], m["n_head_kv"], m["head_dim"], per_value, m["kv_type_k"], kv["bytes_per_token"])
    ok(m["kv_type_k"] == m["kv_type_v"] and
       2 * m["n_layer"] * m["n_head_kv"] * m["head_dim"] * per_value == kv["bytes_per_token"],
       "the formula's numbers make the pool's bytes per token")
    ok(fm is not None and want in fm.all_text(), "formula: %r" % (fm and fm.all_text()))
    nc = dom.by_id("node-count")
    ok(nc is not None and nc.attrs.get("data-nodes") == str(cache["counts"]["nodes"]), "node count %s vs %d" %
       (nc and nc.attrs.get("data-nodes"), cache["counts"]["nodes"]))
    rects = [n for n in dom.by_class("node") if n.tag == "rect"]
    ok(len(rects) == cache["counts"]["nodes"], "tree: %d rectangles for %d nodes" % (len(rects), cache["counts"]["nodes"]))
    rows = dom.by_class("req")
    last = resps[-1]
    ok(len(rows) == len(resps), "request rows: %d" % len(rows))
    if rows:
        cells = [c.all_text() for c in rows[0].children if c.tag == "td"]
        ok(cells[1] == str(last["usage"]["prompt_tokens"]) and
           cells[2] == str(last["usage"]["prompt_tokens_details"]["cached_tokens"]) and cells[6] == "timestamp",
           "newest row: %s" % cells)
    miss = [r for r in dom.by_class("miss-row")]
    ok(len(miss) == 1 and miss[0].attrs.get("data-cause") == "timestamp",
       "one miss row, cause timestamp: %s" % [r.attrs for r in miss])
    if miss:
        rep = last["kvpin_cache"]
        for cls, snip, mine, other in (("snip-request", "request_snippet", b, a), ("snip-cached", "cached_snippet", a, b)):
            s = miss[0].find_all(lambda n, c=cls: c in n.classes())
            marks = s[0].find_all(lambda n: n.tag == "mark") if s else []
            ok(s and s[0].all_text() == rep[snip], "%s: %r vs kvpin_cache %r" % (cls, s and s[0].all_text(), rep[snip]))
            ok(len(marks) == 1 and marks[0].all_text() == diff_run(mine, other),
               "%s marks %r, the prompts differ in %r" % (cls, marks and marks[0].all_text(), diff_run(mine, other)))
    sel = check_node(srv, ev, resps, [a, b])
    return shot("http://127.0.0.1:%d/%s" % (srv.port, "#node=" + sel if sel else ""), "dashboard.png")


def chain(nodes, i):
    firsts = []
    while i >= 0:
        firsts.insert(0, str(nodes[i]["first"]))
        i = nodes[i]["parent"]
    return ".".join(firsts)


def check_node(srv, ev, resps, timestamped):
    """Every leaf's whole path text is one sent prompt + the start of its
    answer (the index holds prompt + answer but the last answer token); the
    page opened at the deepest leaf shows that text."""
    nodes = ev["tree"]["nodes"]
    sent = []
    prompt = "User: Tell me a story about a cat.\nAssistant:"
    for j in resps[:3]:
        sent.append((prompt, j["choices"][0]["text"]))
        prompt = prompt + j["choices"][0]["text"] + "\nUser: And then?\nAssistant:"
    sent += [(t, j["choices"][0]["text"]) for t, j in zip(timestamped, resps[3:])]
    # how a path's text starts before a prompt: the BOS token's text and the
    # tokenizer's own leading space, as the server writes "x" tokenized
    st, _, tj = srv.post("/tokenize", {"content": "x", "add_special": True})
    st2, _, dj = srv.post("/detokenize", {"tokens": tj["tokens"]})
    lead = dj["content"][:-1] if st == st2 == 200 and dj["content"].endswith("x") else ""
    leaves = [i for i, n in enumerate(nodes) if n["children"] == 0]
    deepest, best = None, -1
    for i in leaves:
        st, j = srv.get("/v1/cache/node/" + chain(nodes, i))
        ok(st == 200 and j["start"] == nodes[i]["start"] and j["end"] == nodes[i]["end"],
           "node %d by its chain: %d %s" % (i, st, st == 200 and (j["start"], j["end"])))
        if st != 200:
            continue
        full = j["before"] + j["text"]
        text = full[len(lead):] if full.startswith(lead) else full
        match = [p for p, ans in sent if text.startswith(p) and (p + ans).startswith(text)]
        ok(len(match) >= 1, "leaf %d's text is a sent prompt + the start of its answer: %r %r" % (i, full[:40], lead))
        if j["end"] > best:
            deepest, best, want = i, j["end"], j
    st, _, _ = srv.request("GET", "/v1/cache/node/99999999")
    ok(st in (400, 404), "a chain of no node: %d" % st)
    st, _, _ = srv.request("GET", "/v1/cache/node/" + str(nodes[0]["first"]) + ".999999999999999999999")
    ok(st == 400, "a chain with an id out of range: %d" % st)
    st, _, _ = srv.request("GET", "/v1/cache/node/1..2")
    ok(st == 400, "a malformed chain: %d" % st)
    # an id of the vocabulary that starts no child of the root: 404
    firsts = {n["first"] for n in nodes if n["parent"] < 0}
    free = next(t for t in range(5, 100) if t not in firsts)
    st, _, body = srv.request("GET", "/v1/cache/node/%d" % free)
    ok(st == 404 and b"node_not_found" in body, "an unknown chain: %d %r" % (st, body[:120]))
    if deepest is None:
        return None
    dom = load("http://127.0.0.1:%d/#node=%s" % (srv.port, chain(nodes, deepest)))
    mark, before = dom.by_id("node-text"), dom.by_id("node-before")
    ok(mark is not None and mark.all_text() == want["text"] and mark.attrs.get("data-end") == str(want["end"]),
       "the page shows the selected node's whole text (%r)" % (mark and mark.all_text()[:60]))
    ok(want["start"] == 0 or (before is not None and before.all_text() == want["before"]),
       "... and the path before it")
    return chain(nodes, deepest)


def check_key():
    srv = Server(R, "--api-key", "s3cret-key")
    base = "http://127.0.0.1:%d/" % srv.port
    st, _, _ = srv.request("GET", "/")
    ok(st == 200, "with a key the page itself loads: %d" % st)
    st, _, _ = srv.request("GET", "/v1/cache/events")
    ok(st == 401, "with a key the events need it: %d" % st)
    srv.post("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 3},
             headers={"Authorization": "Bearer s3cret-key"})
    dom = load(base, tries=1)
    auth, msg = dom.by_id("auth"), dom.by_id("auth-msg")
    ok(auth is not None and "show" in auth.classes() and msg is not None and msg.all_text() == "",
       "no key: the page asks for one")
    dom = load(base + "#key=wrong", tries=1)
    auth, msg = dom.by_id("auth"), dom.by_id("auth-msg")
    ok(auth is not None and "show" in auth.classes() and msg is not None and "refused" in msg.all_text(),
       "wrong key: a clear message (%r)" % (msg and msg.all_text()))
    shot(base + "#key=wrong", "dashboard-wrong-key.png")
    dom = load(base + "#key=s3cret-key")
    st, cache = srv.get("/v1/cache", headers={"Authorization": "Bearer s3cret-key"})
    cell = dom.by_id("bill-used_bytes")
    ok(cell is not None and cell.attrs.get("data-bytes") == str(cache["kv"]["used_bytes"]) and
       "show" not in dom.by_id("auth").classes(), "right key: the bill")
    rows = dom.by_class("req")
    ok(len(rows) == 1, "right key: the request row")
    srv.stop()


def check_tiers():
    """With --cache-dir the bill has a disk row whose numbers are /v1/cache's."""
    d = tempfile.mkdtemp(prefix="kvpin-dash-tiers-")
    srv = Server(R, "--cache-dir", d)
    try:
        prompt = "User: " + " ".join("word%d" % i for i in range(60)) + "\nAssistant:"
        st, _, _ = srv.post("/v1/completions", {"prompt": prompt, "max_tokens": 4, "temperature": 0})
        ok(st == 200, "tiers: a request %d" % st)
        ok(wait_idle(srv), "tiers: idle")
        cache, last = None, -1
        for _ in range(100):  # the writer thread is off the request's path: until it has written all
            st, cache = srv.get("/v1/cache")
            n = ((cache.get("tiers") or {}).get("disk") or {}).get("blocks", 0)
            if n > 0 and n == last:
                break
            last = n
            time.sleep(0.2)
        disk = (cache.get("tiers") or {}).get("disk")
        ok(disk is not None and disk["blocks"] > 0, "tiers: blocks on disk %s" % disk)
        dom = load("http://127.0.0.1:%d/" % srv.port)
        row = dom.by_id("tier-disk")
        ok(row is not None and disk is not None and row.attrs.get("data-bytes") == str(disk["bytes"]) and
           row.attrs.get("data-blocks") == str(disk["blocks"]), "tiers: the disk row is /v1/cache's (%s)" %
           (row and row.attrs))
    finally:
        srv.stop()
        shutil.rmtree(d, ignore_errors=True)


def check_off():
    srv = Server(R, "--no-dashboard")
    for p in ("/", "/dashboard"):
        st, _, _ = srv.request("GET", p)
        ok(st == 404, "--no-dashboard: GET %s %d" % (p, st))
    st, _ = srv.get("/v1/cache/events")
    ok(st == 200, "--no-dashboard: the events stay")
    srv.stop()


def main():
    if not CHROMIUM:
        print("e2e_dashboard: FAIL: no chromium (apt-get install chromium; make deps installs "
              "tools/debian-packages.txt)")
        return 1
    os.makedirs(SHOTS, exist_ok=True)
    srv = Server(R)
    st, h, page = srv.request("GET", "/dashboard")
    ok(st == 200 and h.get("Content-Type", "").startswith("text/html") and page.startswith(b"<!doctype html>"),
       "GET /dashboard: %d %s" % (st, h.get("Content-Type")))
    ok(b"http://" not in page.replace(b"http://www.w3.org/2000/svg", b"") and b"https://" not in page,
       "the page names no other server")
    path = check_page(srv)
    no_leaks(R, srv, "after the page")
    srv.stop()
    check_key()
    check_tiers()
    check_off()
    print("e2e_dashboard: screenshots %s, %s" % (path, os.path.join(SHOTS, "dashboard-wrong-key.png")))
    return R.finish()


if __name__ == "__main__":
    sys.exit(main())
