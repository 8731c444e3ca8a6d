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
"""
import sys

from kvpin_test import Results, Server, kill_all

MODEL = "tests/data/models/gen-gemma3-f32.gguf"
r = Results("gemma3_e2e")


def chat(srv, messages):
    st, _, j = srv.post("/v1/chat/completions", {"messages": messages, "max_tokens": 8, "temperature": 0,
                                                 "return_token_ids": True})
    r.ok(st == 200, "chat: %s %r" % (st, j))
    return j if st == 200 else None


def main():
    cached = Server(r, "--ctx", "512", "--chat-template", "gemma", model=MODEL)
    plain = Server(r, "--ctx", "512", "--chat-template", "gemma", "--no-prefix-cache", model=MODEL)
    try:
        story = ("Lily and Tom went to the park. They saw a big dog and a small cat. The dog ran after "
                 "the ball and the cat sat in the sun. Tom laughed and Lily clapped her hands.")
        first = [{"role": "system", "content": "You tell short stories about a park."},
                 {"role": "user", "content": story}]
        a = chat(cached, first)
        b = chat(cached, first)
        ref = chat(plain, first)
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
        if c and cref:
            r.ok(c["choices"][0]["token_ids"] == cref["choices"][0]["token_ids"],
                 "second turn: cached %r, uncached %r" % (c["choices"][0]["token_ids"],
                                                          cref["choices"][0]["token_ids"]))
            r.ok(c["kvpin_cache"]["reused_tokens"] > 16, "second turn reuse: %r" % c["kvpin_cache"])
            r.ok(cref["kvpin_cache"]["reused_tokens"] == 0, "no cache: %r" % cref["kvpin_cache"])
        # an edit in the middle of the user's text: reuse up to it, exact after it
        edited = [first[0], {"role": "user", "content": story.replace("small cat", "small bird")}]
        d, dref = chat(cached, edited), chat(plain, edited)
        if d and dref:
            r.ok(d["choices"][0]["token_ids"] == dref["choices"][0]["token_ids"],
                 "edited: cached %r, uncached %r" % (d["choices"][0]["token_ids"], dref["choices"][0]["token_ids"]))
            reused = d["kvpin_cache"]["reused_tokens"]
            print("  reuse: repeat %d of %d, second turn %d of %d, edit %d of %d" % (
                rep["reused_tokens"], n_prompt, c["kvpin_cache"]["reused_tokens"] if c else -1,
                c["usage"]["prompt_tokens"] if c else -1, reused, d["usage"]["prompt_tokens"]))
            r.ok(16 < reused < d["usage"]["prompt_tokens"] - 16, "edit in the middle reuses a part: %r" %
                 d["kvpin_cache"])
    finally:
        for s in (cached, plain):
            if s in Server.running:
                s.stop()


try:
    main()
finally:
    kill_all()
sys.exit(r.finish())
