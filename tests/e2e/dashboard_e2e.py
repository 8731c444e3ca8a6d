"""dashboard_e2e.py - the cache dashboard (GET /) in headless Chromium,
against a real `kvpin serve` on loopback (run by tests/run_all.sh).

After a scripted agent loop (each turn resends the conversation with the
answer and one more user line, under a prompt_cache_key), a timestamp
miss, a prompt that reuses a few of its tokens only, and two unrelated chat
conversations, Chromium loads the page and dumps its DOM; the checks
compare the DOM with what the server and the responses said:

  - above the fold, first: the headline's tokens reused and computed are
    the responses' sums (and /v1/cache's counts.reused_tokens), and the
    rows of "tokens recomputed per cause" are the responses' computed
    tokens and requests grouped by cause (hit apart), worst first, equal to
    the history's per-minute sums;
  - a request is warm (row and latency dot) exactly when it reused at least
    the stated share of its prompt (90%): the prompt that reused a few
    tokens is drawn cold, though under the old rule (reused anything) it
    was warm;
  - each request's row shows its prompt_cache_key and its cause, and a miss
    its cached and request snippets side by side;
  - the second chat conversation, which shares only the template's opening
    with the first, is new_prefix;
  - the prefix tree's labels are the nodes' text (control characters
    escaped, ellipsized), never token ids;
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
  - a model with sliding-window layers (gemma3): a bill row per layer kind,
    its bytes /v1/cache's kv.by_kind, bytes per token of each kind from the
    formula; none for a model without window layers;
  - a hybrid model (qwen35): the formula counts the attention layers only,
    and the bill has an attention row and a recurrent-state row (snapshots
    held, their bytes) that are /v1/cache's kv.by_kind;
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


AGENT_KEY = "story-agent"
LOW_SHARE_KEY = "agent-b <&>"  # markup in a key shows as text
LOW_SHARE_PROMPT = "User: Tell me a story" + " about the big red ball and the little dog who played in the park" * 4
CHAT_QUESTIONS = ("What is the capital of France?", "Write a haiku about autumn leaves.")


def agent_loop(srv):
    """Three turns of a growing conversation (under a prompt_cache_key), a
    timestamp edit, a prompt sharing only its first words with the first
    turn, and two unrelated chat conversations. Returns the responses in
    order, the prompt_cache_key of each ("" none), and the two timestamped
    prompts."""
    out, keys = [], []
    prompt = "User: Tell me a story about a cat.\nAssistant:"
    for _ in range(3):
        st, _, j = srv.post("/v1/completions", {"prompt": prompt, "max_tokens": 6, "temperature": 0,
                                                "prompt_cache_key": AGENT_KEY})
        ok(st == 200, "agent turn: %s" % st)
        out.append(j)
        keys.append(AGENT_KEY)
        prompt = prompt + j["choices"][0]["text"] + "\nUser: And then?\nAssistant:"
    a = "System: it is 2026-11-28 09:14:03 UTC.\nYou are a careful assistant.\nUser: hello"
    b = a.replace("2026-11-28 09:14:03", "2026-11-29 10:02:41")
    for p in (a, b):
        st, _, j = srv.post("/v1/completions", {"prompt": p, "max_tokens": 4, "temperature": 0})
        ok(st == 200, "timestamp prompt: %s" % st)
        out.append(j)
        keys.append("")
    st, _, j = srv.post("/v1/completions", {"prompt": LOW_SHARE_PROMPT, "max_tokens": 4, "temperature": 0,
                                            "prompt_cache_key": LOW_SHARE_KEY})
    ok(st == 200, "low-share prompt: %s" % st)
    out.append(j)
    keys.append(LOW_SHARE_KEY)
    for q in CHAT_QUESTIONS:
        st, _, j = srv.post("/v1/chat/completions", {"messages": [{"role": "user", "content": q}], "max_tokens": 4,
                                                     "temperature": 0})
        ok(st == 200, "chat: %s" % st)
        out.append(j)
        keys.append("")
    return out, keys, a, b


def is_warm(j):
    """The page's rule: at least 90% of the prompt reused."""
    return j["usage"]["prompt_tokens_details"]["cached_tokens"] * 100 >= j["usage"]["prompt_tokens"] * 90


def visible(s):
    """A label's escaping: control characters as \\n \\t \\r \\xNN."""
    names = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}
    return "".join(names.get(ch, "\\x%02X" % ord(ch)) if ord(ch) < 0x20 or ord(ch) == 0x7F else ch for ch in s)


def check_page(srv):
    resps, keys, a, b = agent_loop(srv)
    ts = resps[4]
    ok(ts["kvpin_cache"]["cause"] == "timestamp", "the edit is a timestamp miss: %s" % ts["kvpin_cache"])
    low = resps[5]
    low_reused = low["usage"]["prompt_tokens_details"]["cached_tokens"]
    ok(0 < low_reused and not is_warm(low) and low["kvpin_cache"]["cause"] not in ("cold", "hit"),
       "the low-share prompt reused %d of %d tokens, cause %s (warm under a rule of 'reused anything')" %
       (low_reused, low["usage"]["prompt_tokens"], low["kvpin_cache"]["cause"]))
    ok(resps[7]["kvpin_cache"]["cause"] == "new_prefix",
       "an unrelated chat sharing the template's opening is new_prefix: %s" % resps[7]["kvpin_cache"].get("detail"))
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
    ok(sum(m["computed"].get("timestamp", 0) for m in h["minutes"]) == ts["kvpin_cache"]["computed_tokens"],
       "minutes: the timestamp miss's computed tokens under timestamp")
    warm = [is_warm(j) for j in resps]
    ok(len(h["latency"]) == len(resps) and [p["warm"] for p in h["latency"]] == warm, "latency points, warm ones")
    ok(sum(m["hits"] for m in h["minutes"]) == sum(warm), "minutes: hits are the warm requests")
    # tokens recomputed per cause, from the responses (hit apart: new text, nothing to fix)
    by_cause = {}
    for j in resps:
        c = j["kvpin_cache"]["cause"]
        t, n = by_cause.get(c, (0, 0))
        by_cause[c] = (t + j["kvpin_cache"]["computed_tokens"], n + 1)
    hist_tok, hist_req = {}, {}
    for m in h["minutes"]:
        for c, v in m["computed"].items():
            hist_tok[c] = hist_tok.get(c, 0) + v
        for c, v in m["requests_by_cause"].items():
            hist_req[c] = hist_req.get(c, 0) + v
    ok({c: (hist_tok.get(c, 0), hist_req.get(c, 0)) for c in set(hist_tok) | set(hist_req)} ==
       {c: v for c, v in by_cause.items() if v[0] or v[1]}, "minutes: tokens and requests per cause are the responses'")

    dom = load("http://127.0.0.1:%d/" % srv.port)
    body = dom.root.find_all(lambda n: n.tag == "body")
    ok(body and body[0].attrs.get("data-ready") == "1", "the page drew (data-ready)")
    # above the fold: the tokens section is the page's first, the requests second
    sections = [n.attrs.get("id") for n in dom.root.find_all(lambda n: n.tag == "section")]
    ok(sections[:2] == ["tokens", "requests"], "tokens, then the requests, lead the page: %s" % sections)
    hd = dom.by_id("headline")
    ok(hd is not None and hd.attrs.get("data-reused") == str(reused) == str(cache["counts"]["reused_tokens"]) and
       hd.attrs.get("data-computed") == str(computed),
       "headline: %s reused, %s computed; responses %d / %d, /v1/cache reused_tokens %d" %
       (hd and hd.attrs.get("data-reused"), hd and hd.attrs.get("data-computed"), reused, computed,
        cache["counts"]["reused_tokens"]))
    ok(hd is not None and "{:,}".format(reused) in hd.all_text() and "{:,}".format(computed) in hd.all_text(),
       "headline text: %r" % (hd and hd.all_text()))
    rule = dom.by_id("warm-rule")
    ok(rule is not None and "at least %d%%" % h["warm_percent"] in rule.all_text() and h["warm_percent"] == 90,
       "the page states the warm rule: %r" % (rule and rule.all_text()))
    rows = [r for r in dom.by_class("cause-row")]
    got = [(r.attrs.get("data-cause"), int(r.attrs.get("data-tokens")), int(r.attrs.get("data-requests"))) for r in rows]
    want = sorted([(c, t, n) for c, (t, n) in by_cause.items() if c != "hit"], key=lambda x: (-x[1], -x[2]))
    ok(got == want, "per-cause rows, worst first: %s, responses say %s" % (got, want))
    for r, (c, t, n) in zip(rows, want):
        ok(("%s cost %s tokens in %d request" % (c, "{:,}".format(t), n)) in r.all_text(), "row: %r" % r.all_text())
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
    check_labels(dom, nodes)
    # one row a request, newest first: key, tokens, warm, cause; a miss's snippets beside it
    rows = dom.by_class("req")
    ok(len(rows) == len(resps), "request rows: %d" % len(rows))
    for row, j, key in zip(rows, reversed(resps), reversed(keys)):
        cell = {c.classes()[0]: c for c in row.children if c.tag == "td" and c.classes()}
        rep = j["kvpin_cache"]
        ok(row.attrs.get("data-key") == key and cell["key"].all_text() == (key or "-"),
           "row %s: key %r, sent %r" % (row.attrs.get("data-seq"), cell["key"].all_text(), key))
        ok(cell["prompt"].all_text() == str(j["usage"]["prompt_tokens"]) and
           cell["reused"].attrs.get("data-tokens") == str(j["usage"]["prompt_tokens_details"]["cached_tokens"]),
           "row %s: tokens" % row.attrs.get("data-seq"))
        ok(row.attrs.get("data-warm") == ("1" if is_warm(j) else "0"), "row %s: warm %s, reused %d of %d" %
           (row.attrs.get("data-seq"), row.attrs.get("data-warm"), j["usage"]["prompt_tokens_details"]["cached_tokens"],
            j["usage"]["prompt_tokens"]))
        ok(row.attrs.get("data-cause") == rep["cause"] and cell["cause"].all_text() == rep["cause"],
           "row %s: cause %r, response %r" % (row.attrs.get("data-seq"), cell["cause"].all_text(), rep["cause"]))
        miss = row.find_all(lambda n: "miss-detail" in n.classes())
        ok(len(miss) == (0 if rep["cause"] in ("hit", "cold") else 1), "row %s: snippets for %s" %
           (row.attrs.get("data-seq"), rep["cause"]))
        if miss:
            for cls, snip in (("snip-request", "request_snippet"), ("snip-cached", "cached_snippet")):
                s = miss[0].find_all(lambda n, c=cls: c in n.classes())
                ok(s and s[0].all_text() == rep[snip], "row %s %s: %r vs kvpin_cache %r" %
                   (row.attrs.get("data-seq"), cls, s and s[0].all_text(), rep[snip]))
    # the timestamp row marks exactly the characters where the two prompts differ
    ts_row = rows[len(resps) - 1 - 4] if len(rows) == len(resps) else None
    miss = ts_row.find_all(lambda n: "miss-detail" in n.classes()) if ts_row else []
    ok(len(miss) == 1 and miss[0].attrs.get("data-cause") == "timestamp", "the timestamp row's snippets")
    if miss:
        for cls, mine, other in (("snip-request", b, a), ("snip-cached", a, b)):
            s = miss[0].find_all(lambda n, c=cls: c in n.classes())
            marks = s[0].find_all(lambda n: n.tag == "mark") if s else []
            ok(len(marks) == 1 and marks[0].all_text() == diff_run(mine, other),
               "%s marks %r, the prompts differ in %r" % (cls, marks and marks[0].all_text(), diff_run(mine, other)))
    # the latency dots: warm by the share reused; the low-share prompt's dot is not warm
    dots = [n for n in dom.by_id("ttft-svg").children if n.tag == "circle"]
    ok([("warm" in d.classes()) for d in dots] == warm, "latency dots warm exactly when >= 90%% reused")
    low_dot = [d for d in dots if d.attrs.get("data-prompt") == str(low["usage"]["prompt_tokens"]) and
               d.attrs.get("data-reused") == str(low_reused)]
    ok(len(low_dot) == 1 and "cold" in low_dot[0].classes(), "the prompt that reused %d of %d tokens is drawn cold" %
       (low_reused, low["usage"]["prompt_tokens"]))
    sel = check_node(srv, ev, resps, [a, b], LOW_SHARE_PROMPT)
    return shot("http://127.0.0.1:%d/%s" % (srv.port, "#node=" + sel if sel else ""), "dashboard.png")


def check_labels(dom, nodes):
    """Each node wide enough for a label shows its text: escaped, cut with an
    ellipsis, never ids."""
    groups = [g for g in dom.by_id("tree-svg").children if g.tag == "g"]
    labelled = 0
    for g in groups:
        n = nodes[int(g.attrs["data-id"])]
        full = visible(n["text"]) + ("\u2026" if n["more"] else "") if n["text"] else \
            "(%d %s, no text alone)" % (n["tokens"], "token" if n["tokens"] == 1 else "tokens")
        for t in g.find_all(lambda x: x.tag == "text"):
            label = t.all_text()
            labelled += 1
            ok(label == full or (label.endswith("\u2026") and full.startswith(label[:-1])),
               "node %d's label %r is its text %r" % (n["id"], label, full))
            ok("\n" not in label and not all(ch.isdigit() or ch in ". " for ch in label),
               "node %d's label reads as text: %r" % (n["id"], label))
    ok(labelled >= 1, "labels drawn: %d of %d nodes" % (labelled, len(groups)))


def chain(nodes, i):
    firsts = []
    while i >= 0:
        firsts.insert(0, str(nodes[i]["first"]))
        i = nodes[i]["parent"]
    return ".".join(firsts)


def check_node(srv, ev, resps, timestamped, low):
    """Every leaf's whole path text is one sent prompt + the start of its
    answer (the index holds prompt + answer but the last answer token; a
    chat prompt as the model's ChatML template renders it); the page opened
    at the deepest leaf shows that text."""
    nodes = ev["tree"]["nodes"]
    sent = []
    prompt = "User: Tell me a story about a cat.\nAssistant:"
    for j in resps[:3]:
        sent.append((prompt, j["choices"][0]["text"]))
        prompt = prompt + j["choices"][0]["text"] + "\nUser: And then?\nAssistant:"
    sent += [(t, j["choices"][0]["text"]) for t, j in zip(timestamped, resps[3:5])]
    sent.append((low, resps[5]["choices"][0]["text"]))
    for q, j in zip(CHAT_QUESTIONS, resps[6:8]):
        sent.append(("<|im_start|>user\n%s<|im_end|>\n<|im_start|>assistant\n" % q, j["choices"][0]["message"]["content"]))
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


GEMMA3 = "tests/data/models/gen-gemma3-f16.gguf"


def check_kinds(plain_dom):
    """A model with sliding-window layers: the bill has a row per layer kind
    whose bytes are /v1/cache's kv.by_kind, and bytes per token of each
    kind are 2 x that kind's layers x kv-heads x head_dim x 2 (F16), summing
    to the pool's; cached bytes of each are the cached tokens' rows (index
    blocks x block size x that). A model without them has no such row."""
    ok(plain_dom.by_id("bill-kind-window") is None and plain_dom.by_id("bill-kind-full") is None,
       "kinds: no kind rows for a model without window layers")
    srv = Server(R, model=GEMMA3)
    try:
        words = " ".join("w%d" % i for i in range(40))
        st, _, _ = srv.post("/v1/completions", {"prompt": words, "max_tokens": 4, "temperature": 0})
        ok(st == 200, "kinds: a request %d" % st)
        ok(wait_idle(srv), "kinds: idle")
        st, cache = srv.get("/v1/cache")
        st, ev = srv.get("/v1/cache/events")
        kv, m = cache["kv"], ev["model"]
        bk = kv.get("by_kind") or {}
        full, win = bk.get("full"), bk.get("window")
        ok(full is not None and win is not None, "kinds: /v1/cache kv.by_kind has full and window: %s" % bk)
        if full is None or win is None:
            return
        ok(full["layers"] + win["layers"] == m["n_layer"] and win["layers"] > 0 and win["window"] > 0,
           "kinds: layers %d + %d = %d" % (full["layers"], win["layers"], m["n_layer"]))
        for x in (full, win):
            ok(x["bytes_per_token"] == 2 * x["layers"] * m["n_head_kv"] * m["head_dim"] * 2,
               "kinds: bytes per token %d from the formula" % x["bytes_per_token"])
        ok(full["bytes_per_token"] + win["bytes_per_token"] == kv["bytes_per_token"], "kinds: the two sum")
        tokens = kv["index_bytes"] // kv["block_bytes"] * (kv["block_bytes"] // kv["bytes_per_token"])
        ok(tokens > 0 and full["index_bytes"] == tokens * full["bytes_per_token"] and
           win["index_bytes"] == tokens * win["bytes_per_token"],
           "kinds: cached bytes of each kind are the cached blocks' rows (%d tokens): %s" % (tokens, bk))
        dom = load("http://127.0.0.1:%d/" % srv.port)
        for name, x in (("full", full), ("window", win)):
            cell = dom.by_id("bill-kind-" + name)
            ok(cell is not None and cell.attrs.get("data-bytes") == str(x["index_bytes"]) and
               cell.attrs.get("data-bytes-per-token") == str(x["bytes_per_token"]),
               "kinds: the %s row is /v1/cache's (%s)" % (name, cell and cell.attrs))
    finally:
        srv.stop()


QWEN35 = "tests/data/models/gen-qwen35-f32.gguf"


def check_hybrid():
    """A hybrid model (qwen35: recurrent gated delta-net layers and
    attention layers): the formula counts only the layers that keep K/V
    (n_kv_layer of n_layer) and makes the pool's bytes per token; the bill
    has an attention row (/v1/cache's kv.by_kind.full) and a recurrent-state
    row whose bytes and snapshot count are kv.by_kind.recurrent's, with
    cached bytes = snapshots x bytes a snapshot, after prompts that left
    snapshots (--state-every 16: every 16 positions and each prompt's end)."""
    srv = Server(R, "--state-every", "16", model=QWEN35)
    try:
        for n in (40, 70):
            words = " ".join("w%d" % i for i in range(n))
            st, _, _ = srv.post("/v1/completions", {"prompt": words, "max_tokens": 4, "temperature": 0})
            ok(st == 200, "hybrid: a request %d" % st)
        ok(wait_idle(srv), "hybrid: idle")
        st, cache = srv.get("/v1/cache")
        st, ev = srv.get("/v1/cache/events")
        kv, m = cache["kv"], ev["model"]
        bk = kv.get("by_kind") or {}
        full, rec = bk.get("full"), bk.get("recurrent")
        ok(full is not None and rec is not None and "window" not in bk,
           "hybrid: /v1/cache kv.by_kind has full and recurrent: %s" % bk)
        if full is None or rec is None:
            return
        ok(m["n_kv_layer"] == full["layers"] and 0 < m["n_kv_layer"] < m["n_layer"] and
           m["n_kv_layer"] + m["n_rec_layer"] == m["n_layer"],
           "hybrid: %d attention + %d recurrent layers of %d" % (m["n_kv_layer"], m["n_rec_layer"], m["n_layer"]))
        per_value = {"F32": 4, "F16": 2, "Q8_0": 34 / 32, "Q4_0": 18 / 32}[m["kv_type_k"].upper()]
        ok(2 * m["n_kv_layer"] * m["n_head_kv"] * m["head_dim"] * per_value == kv["bytes_per_token"] ==
           full["bytes_per_token"], "hybrid: the attention layers alone make the pool's bytes per token")
        ok(full["index_bytes"] + rec["index_bytes"] == kv["index_bytes"] and full["index_bytes"] > 0,
           "hybrid: the cached K/V and the snapshots make the index's bytes: %d + %d of %d" %
           (full["index_bytes"], rec["index_bytes"], kv["index_bytes"]))
        ok(rec["snapshots"] >= 2 and rec["index_bytes"] == rec["snapshots"] * rec["snapshot_bytes"] and
           rec["snapshot_bytes"] >= rec["state_bytes"] > 0 and rec["state_every"] == 16,
           "hybrid: snapshots held and their bytes: %s" % rec)
        dom = load("http://127.0.0.1:%d/" % srv.port)
        fm = dom.by_id("formula")
        want = "2 (K and V) x %d attention layers x %d kv_heads x %d head_dim x %g bytes (%s) = %d" % (
            m["n_kv_layer"], m["n_head_kv"], m["head_dim"], per_value, m["kv_type_k"], kv["bytes_per_token"])
        ok(fm is not None and want in fm.all_text(), "hybrid: formula %r" % (fm and fm.all_text()))
        cell = dom.by_id("bill-kind-full")
        ok(cell is not None and cell.attrs.get("data-bytes") == str(full["index_bytes"]) and
           cell.attrs.get("data-bytes-per-token") == str(full["bytes_per_token"]),
           "hybrid: the attention row is /v1/cache's (%s)" % (cell and cell.attrs))
        cell = dom.by_id("bill-kind-recurrent")
        ok(cell is not None and cell.attrs.get("data-bytes") == str(rec["index_bytes"]) and
           cell.attrs.get("data-snapshots") == str(rec["snapshots"]) and
           cell.attrs.get("data-snapshot-bytes") == str(rec["snapshot_bytes"]),
           "hybrid: the recurrent-state row is /v1/cache's (%s)" % (cell and cell.attrs))
    finally:
        srv.stop()


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
    plain = load("http://127.0.0.1:%d/" % srv.port)
    srv.stop()
    check_kinds(plain)
    check_hybrid()
    check_key()
    check_tiers()
    check_off()
    print("e2e_dashboard: screenshots %s, %s" % (path, os.path.join(SHOTS, "dashboard-wrong-key.png")))
    return R.finish()


if __name__ == "__main__":
    sys.exit(main())
