#!/usr/bin/env python3
"""gemma3_e2e.py - kvpin serve on a gemma3 model (sliding windows of 16
positions on 5 of its 6 layers, tests/data/models/gen-gemma3-f32.gguf):
chat completions through /v1/chat/completions (the gemma chat template)
with the cache report.

Oracle: a second server with --no-prefix-cache (every prompt computed in
full). The same conversation, sent again and then extended by a turn, and
a conversation edited in its middle, give the same greedy answers (token
ids) from both servers, while the cached server reports what it reused:
the whole earlier prompt on the repeat, more than one window's worth of
tokens on the extension and on the edit.

A third server under --window-budget 300K (30 blocks' window rows: the
least its 4 sequences may run with) answers the same, reuses no more than
the cached one, and where it reuses less its cause is window_evicted, with
a detail naming where the tokens matched (the cached server's reuse);
/v1/cache bills its window arena and holds fewer window rows; an
assistant message rewritten in its middle resumes where the tokens differ
(the messages' starts are resume points under the budget). Then 16
requests at once on it (4 running at a time, the window arena under
pressure) are answered as the uncached server answers them. And the
positions a budget holds count the blocks' full-layer rows alone.
"""
import sys
import threading

from kvpin_test import Results, Server, kill_all, wait_idle

MODEL = "tests/data/models/gen-gemma3-f32.gguf"
r = Results("gemma3_e2e")


def chat(srv, messages):
    st, _, j = srv.post("/v1/chat/completions", {"messages": messages, "max_tokens": 8, "temperature": 0,
                                                 "return_token_ids": True})
    r.ok(st == 200, "chat: %s %r" % (st, j))
    return j if st == 200 else None


def check_budget(budget, runs):
    """The same requests through the window-budget server, in the same order."""
    for cached_j, again_j, ref_j, messages in runs:
        for want in ([cached_j, again_j] if again_j else [cached_j]):
            j = chat(budget, messages)
            if not (j and want and ref_j):
                continue
            r.ok(j["choices"][0]["token_ids"] == ref_j["choices"][0]["token_ids"],
                 "window budget: same answer as uncached: %r %r" % (j["choices"][0]["token_ids"],
                                                                    ref_j["choices"][0]["token_ids"]))
            got, full = j["kvpin_cache"], want["kvpin_cache"]
            r.ok(got["reused_tokens"] <= full["reused_tokens"] and
                 got["reused_tokens"] + got["computed_tokens"] == j["usage"]["prompt_tokens"],
                 "window budget: reuse %d, unbudgeted %d" % (got["reused_tokens"], full["reused_tokens"]))
            if got["reused_tokens"] < full["reused_tokens"]:
                r.ok(got["cause"] == "window_evicted" and
                     ("matched %d of" % full["reused_tokens"]) in (got.get("detail") or ""),
                     "window budget: a cut reuse is window_evicted: %r" % got)
                print("  window budget: %d reused where the tokens matched %d (%s)" % (
                    got["reused_tokens"], full["reused_tokens"], got.get("detail")))
    st, cache = budget.get("/v1/cache")
    w = cache["kv"]["by_kind"]["window"]
    r.ok(w["budget_bytes"] == 30 * 16 * w["bytes_per_token"] and 0 < w["used_bytes"] <= w["budget_bytes"],
         "window budget: the arena is billed: %r" % w)
    r.ok(w["index_bytes"] < cache["kv"]["by_kind"]["full"]["index_bytes"] // cache["kv"]["by_kind"]["full"][
        "bytes_per_token"] * w["bytes_per_token"], "window budget: fewer window rows cached than positions: %r" % w)


def check_budget_messages(cached, budget, plain, story):
    """An earlier message edited: under the window budget the prompt's
    messages' starts are resume points (the server passes them to the
    engine), so a conversation whose assistant message is rewritten in its
    middle resumes at that message's start or later (the latest position
    whose window is held, up to where the tokens differ: within three
    blocks of the edit here, W = 16), instead of falling back to 0: every
    window but those before the messages' starts and the prompt's end was
    dropped as the prompt was computed."""
    conv = [{"role": "system", "content": "You tell short stories about a park. " + story},
            {"role": "user", "content": story.replace("Lily", "Anna")},
            {"role": "assistant", "content": "The dog was happy. The cat was sleepy. The ball was red and round."},
            {"role": "user", "content": "Tell me more about the ball and what the children did next."}]
    edited = [dict(m) for m in conv]
    edited[2]["content"] = edited[2]["content"].replace("sleepy", "hungry")
    for srv in (cached, budget):
        chat(srv, conv)
    want, got, ref = chat(cached, edited), chat(budget, edited), chat(plain, edited)
    if not (want and got and ref):
        return
    w, g = want["kvpin_cache"], got["kvpin_cache"]
    print("  edited assistant message: reused %d (unbudgeted %d) of %d, cause %s" % (
        g["reused_tokens"], w["reused_tokens"], got["usage"]["prompt_tokens"], g.get("cause")))
    r.ok(w["reused_tokens"] > 128, "the edit is well into the prompt: %r" % w)
    r.ok(w["reused_tokens"] - 48 <= g["reused_tokens"] <= w["reused_tokens"],
         "window budget: an edited message resumes near the edit: %r vs %r" % (g, w))
    r.ok(got["choices"][0]["token_ids"] == ref["choices"][0]["token_ids"],
         "window budget, edited message: the uncached answer")


def check_budget_concurrent(budget, plain, story):
    """16 requests at once (4 run at a time) on the window-budget server,
    sharing the system prompt and edited at different places: every one is
    answered as the uncached server answers it (window slots run out and
    are given back; sequences step aside and resume), and the server is
    idle and consistent afterwards."""
    words = story.split()
    convs = []
    for i in range(16):
        w = list(words)
        w[(i * 7) % len(w)] = "zebra%d" % i
        convs.append([{"role": "system", "content": "You tell short stories about a park."},
                      {"role": "user", "content": " ".join(w) + (" again" * (i % 5))}])
    out = [None] * len(convs)

    def one(i):
        out[i] = chat(budget, convs[i])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(convs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, c in enumerate(convs):
        ref = chat(plain, c)
        if out[i] and ref:
            r.ok(out[i]["choices"][0]["token_ids"] == ref["choices"][0]["token_ids"],
                 "window budget, concurrent request %d: same answer as uncached" % i)
    r.ok(wait_idle(budget), "window budget: idle after the concurrent requests")
    st, cache = budget.get("/v1/cache")
    r.ok(st == 200 and cache["counts"]["running"] == 0, "window budget: nothing running: %r" % cache.get("counts"))
    w = cache["kv"]["by_kind"]["window"]
    print("  window budget: %d cached blocks gave up their window rows, %d of %d bytes in use" % (
        w["drops"], w["used_bytes"], w["budget_bytes"]))


def check_budget_positions():
    """--kv-budget 340K with --window-budget 300K: the blocks get the 40K
    left, 20 blocks of 16 positions at 128 bytes a token (the full layer's
    K and V: 2 x 1 layer x 1 kv-head x 32 x 2 bytes), so 320 positions; a
    prompt of more is refused with those numbers."""
    srv = Server(r, "--ctx", "512", "--kv-budget", "340K", "--window-budget", "300K", "-np", "1", model=MODEL)
    try:
        prompt = " ".join("w%d" % (i % 50) for i in range(140))
        st, _, j = srv.post("/v1/completions", {"prompt": prompt, "max_tokens": 4, "temperature": 0})
        msg = (j.get("error") or {}).get("message", "") if isinstance(j, dict) else ""
        r.ok(st == 400 and "the 320 positions the KV budget holds (40960 bytes at 128 bytes per token)" in msg,
             "window budget: the positions the blocks hold: %s %s" % (st, msg))
        st, _, j = srv.post("/v1/completions", {"prompt": "w1 w2 w3", "max_tokens": 4, "temperature": 0})
        r.ok(st == 200, "window budget: a short prompt fits: %s" % st)
    finally:
        srv.stop()


def main():
    cached = Server(r, "--ctx", "512", "--chat-template", "gemma", model=MODEL)
    plain = Server(r, "--ctx", "512", "--chat-template", "gemma", "--no-prefix-cache", model=MODEL)
    budget = Server(r, "--ctx", "512", "--chat-template", "gemma", "--window-budget", "300K", model=MODEL)
    try:
        story = ("Lily and Tom went to the park. They saw a big dog and a small cat. The dog ran after "
                 "the ball and the cat sat in the sun. Tom laughed and Lily clapped her hands.")
        first = [{"role": "system", "content": "You tell short stories about a park."},
                 {"role": "user", "content": story}]
        a = chat(cached, first)
        b = chat(cached, first)
        ref = chat(plain, first)
        runs = [(a, b, ref, first)]
        if not (a and b and ref):
            return
        n_prompt = a["usage"]["prompt_tokens"]
        r.ok(n_prompt > 48, "the prompt (%d tokens) is longer than three windows" % n_prompt)
        ids = a["choices"][0]["token_ids"]
        r.ok(ids == ref["choices"][0]["token_ids"] == b["choices"][0]["token_ids"],
             "same answer cached, repeated and uncached: %r %r %r" %
             (ids, b["choices"][0]["token_ids"], ref["choices"][0]["token_ids"]))
        rep = b["kvpin_cache"]
        r.ok(rep["reused_tokens"] >= n_prompt - 1, "repeat reuses the prompt: %r" % rep)
        # the conversation goes on: the earlier prompt is reused, the answer is the uncached one
        second = first + [{"role": "assistant", "content": a["choices"][0]["message"]["content"]},
                          {"role": "user", "content": "And then the dog came back with the ball."}]
        c, cref = chat(cached, second), chat(plain, second)
        runs.append((c, None, cref, second))
        if c and cref:
            r.ok(c["choices"][0]["token_ids"] == cref["choices"][0]["token_ids"],
                 "second turn: cached %r, uncached %r" % (c["choices"][0]["token_ids"],
                                                          cref["choices"][0]["token_ids"]))
            r.ok(c["kvpin_cache"]["reused_tokens"] > 16, "second turn reuse: %r" % c["kvpin_cache"])
            r.ok(cref["kvpin_cache"]["reused_tokens"] == 0, "no cache: %r" % cref["kvpin_cache"])
        # an edit in the middle of the user's text: reuse up to it, exact after it
        edited = [first[0], {"role": "user", "content": story.replace("small cat", "small bird")}]
        d, dref = chat(cached, edited), chat(plain, edited)
        runs.append((d, None, dref, edited))
        if d and dref:
            r.ok(d["choices"][0]["token_ids"] == dref["choices"][0]["token_ids"],
                 "edited: cached %r, uncached %r" % (d["choices"][0]["token_ids"], dref["choices"][0]["token_ids"]))
            reused = d["kvpin_cache"]["reused_tokens"]
            print("  reuse: repeat %d of %d, second turn %d of %d, edit %d of %d" % (
                rep["reused_tokens"], n_prompt, c["kvpin_cache"]["reused_tokens"] if c else -1,
                c["usage"]["prompt_tokens"] if c else -1, reused, d["usage"]["prompt_tokens"]))
            r.ok(16 < reused < d["usage"]["prompt_tokens"] - 16, "edit in the middle reuses a part: %r" %
                 d["kvpin_cache"])
        check_budget(budget, runs)
        check_budget_messages(cached, budget, plain, story)
        check_budget_concurrent(budget, plain, story)
    finally:
        for s in (cached, plain, budget):
            if s in Server.running:
                s.stop()


try:
    main()
    check_budget_positions()
finally:
    kill_all()
sys.exit(r.finish())
