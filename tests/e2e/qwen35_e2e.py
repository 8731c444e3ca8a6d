#!/usr/bin/env python3
"""qwen35_e2e.py - kvpin serve on a qwen35 model (gated delta-net layers
with a recurrent state, tests/data/models/gen-qwen35-f32.gguf) and on a
qwen35moe one (the same layers with routed experts and a shared expert,
gen-qwen35moe-f32.gguf): a two-turn chat through /v1/chat/completions with
the cache report, resumed from the prefix cache's state snapshots
(docs/state-checkpoints.md).

Oracle: a second server with --no-prefix-cache (every prompt computed in
full). Turn 1, turn 2 (turn 1 with its answer and a new user message) and
an edit in the middle of turn 1's user text give the same greedy answers
(token ids) from both servers. The cached server's reports: turn 2 reuses
more than turn 1's prompt (it resumes at a snapshot), and on every report
reused_tokens + state_recomputed_tokens is where the prompt matched the
cache (at most --state-every before it); the edit resumes at a snapshot
before the edit, its cause state_checkpoint when it recomputed matched
tokens. /v1/cache bills the snapshots.
"""
import sys

from kvpin_test import Results, Server, kill_all

MODELS = ("tests/data/models/gen-qwen35-f32.gguf", "tests/data/models/gen-qwen35moe-f32.gguf")
EVERY = 32
r = Results("qwen35_e2e")


def chat(srv, messages):
    st, _, j = srv.post("/v1/chat/completions", {"messages": messages, "max_tokens": 8, "temperature": 0,
                                                 "return_token_ids": True})
    r.ok(st == 200, "chat: %s %r" % (st, j))
    return j if st == 200 else None


def same(a, b, what):
    if a and b:
        r.ok(a["choices"][0]["token_ids"] == b["choices"][0]["token_ids"],
             "%s: cached %r, uncached %r" % (what, a["choices"][0]["token_ids"], b["choices"][0]["token_ids"]))


def consistent(j, what):
    """reused + state_recomputed is the match; the snapshot at most EVERY before it."""
    c = j["kvpin_cache"]
    r.ok("state_recomputed_tokens" in c, "%s: the report has state_recomputed_tokens: %r" % (what, c))
    rec = c.get("state_recomputed_tokens", 0)
    match = c["diverged_at_token"] if c["diverged_at_token"] < j["usage"]["prompt_tokens"] else \
        j["usage"]["prompt_tokens"] - 1
    r.ok(c["reused_tokens"] + rec == match and rec < EVERY,
         "%s: reused %d + recomputed %d, matched %d: %r" % (what, c["reused_tokens"], rec, match, c))
    r.ok(c["reused_tokens"] + c["computed_tokens"] == j["usage"]["prompt_tokens"], "%s: counts add up" % what)
    if rec:
        r.ok(c["cause"] == "state_checkpoint", "%s: cut at a snapshot: cause %r" % (what, c["cause"]))
    return c


def main(model):
    print("  %s" % model)
    cached = Server(r, "--ctx", "512", "--chat-template", "chatml", "--state-every", str(EVERY), model=model)
    plain = Server(r, "--ctx", "512", "--chat-template", "chatml", "--no-prefix-cache", model=model)
    try:
        story = ("Lily and Tom went to the park. They saw a big dog and a small cat. The dog ran after "
                 "the ball and the cat sat in the sun. Tom laughed and Lily clapped her hands.")
        first = [{"role": "system", "content": "You tell short stories about a park."},
                 {"role": "user", "content": story}]
        a, aref = chat(cached, first), chat(plain, first)
        same(a, aref, "turn 1")
        if not (a and aref):
            return
        n1 = a["usage"]["prompt_tokens"]
        second = first + [{"role": "assistant", "content": a["choices"][0]["message"]["content"]},
                          {"role": "user", "content": "And then the dog came back with the ball."}]
        b, bref = chat(cached, second), chat(plain, second)
        same(b, bref, "turn 2")
        if b and bref:
            c = consistent(b, "turn 2")
            r.ok(c["reused_tokens"] >= n1 - EVERY and c["reused_tokens"] > 0,
                 "turn 2 resumes near turn 1's end (%d tokens): %r" % (n1, c))
            r.ok(bref["kvpin_cache"]["reused_tokens"] == 0, "no cache: %r" % bref["kvpin_cache"])
            print("  turn 2: %d prompt tokens, %d reused, %d state-recomputed (turn 1: %d)" % (
                b["usage"]["prompt_tokens"], c["reused_tokens"], c.get("state_recomputed_tokens", 0), n1))
        edited = [first[0], {"role": "user", "content": story.replace("sat in the sun", "sat in the shade")}]
        d, dref = chat(cached, edited), chat(plain, edited)
        same(d, dref, "edit")
        if d and dref:
            c = consistent(d, "edit")
            print("  edit: diverged at %d, %d reused, %d state-recomputed, cause %s" % (
                c["diverged_at_token"], c["reused_tokens"], c.get("state_recomputed_tokens", 0), c["cause"]))
        st, cache = cached.get("/v1/cache")
        r.ok(st == 200, "/v1/cache: %s" % st)
        kv = cache.get("kv", {}) if st == 200 else {}
        r.ok(kv.get("state_snapshots", 0) > 0 and kv.get("state_snapshot_bytes", 0) > 0,
             "/v1/cache bills the snapshots: %r" % {k: v for k, v in kv.items() if "state" in k})
    finally:
        for s in (cached, plain):
            if s in Server.running:
                s.stop()


try:
    for m in MODELS:
        main(m)
finally:
    kill_all()
sys.exit(r.finish())
