#!/usr/bin/env python3
"""experts_e2e.py - kvpin serve on the mixture-of-experts models:
tests/data/models/gen-qwen3moe-f32.gguf (qwen3moe: 2 layers of 8 experts,
3 routed per token) and gen-gpt-oss-mxfp4.gguf (gpt-oss: 4 layers, windows
of 16 on even layers, sinks, YaRN, 4 of 8 MXFP4 experts): chat
completions, forks, a pin and the disk tier, with the cache report.

Oracle: a second server with --no-prefix-cache (every prompt computed in
full, alone). The same conversation, sent again, extended by a turn and
edited in its middle, gives the same greedy answers (token ids) from both
servers while the cached one reports what it reused; n = 2 at temperature
0 gives two copies of that answer (the forks share the prompt's blocks);
a pinned system prompt is reused by a request that starts with it; and a
server restarted on the first one's --cache-dir restores the prompt from
disk and answers the same, its FINGERPRINT naming the expert counts.
`kvpin info` names the experts. Each model runs the whole list.
"""
import os
import shutil
import subprocess
import sys
import tempfile
import time

from kvpin_test import KVPIN, Results, Server, kill_all

# (model, what kvpin info says of its experts, its fingerprint's lines)
MODELS = [
    ("tests/data/models/gen-qwen3moe-f32.gguf", "experts:       8 per layer of width 64, 3 routed per token",
     ["\narch qwen3moe\n", "\nn_expert 8\nn_expert_used 3\nn_ff_exp 64\n"]),
    ("tests/data/models/gen-gpt-oss-mxfp4.gguf", "experts:       8 per layer of width 64, 4 routed per token",
     ["\narch gpt-oss\n", "\nn_expert 8\nn_expert_used 4\nn_ff_exp 64\ngate softmax_topk\n",
      "\nyarn_n_ctx_orig 4096\n", "\nlayer_kinds wfwf\n"]),
]
MODEL, INFO, FP_LINES = MODELS[0]
r = Results("experts_e2e")
STORY = ("Lily and Tom went to the park. They saw a big dog and a small cat. The dog ran after "
         "the ball and the cat sat in the sun. Tom laughed and Lily clapped her hands.")
FIRST = [{"role": "system", "content": "You tell short stories about a park."},
         {"role": "user", "content": STORY}]


def chat(srv, messages, **extra):
    body = {"messages": messages, "max_tokens": 8, "temperature": 0, "return_token_ids": True}
    body.update(extra)
    st, _, j = srv.post("/v1/chat/completions", body)
    r.ok(st == 200, "chat: %s %r" % (st, j))
    return j if st == 200 else None


def ids_of(j, i=0):
    return j["choices"][i]["token_ids"]


def info():
    out = subprocess.run([KVPIN, "info", "-m", MODEL], capture_output=True, text=True, timeout=60)
    r.ok(out.returncode == 0 and INFO in out.stdout, "kvpin info names the experts: %s" % out.stdout[-800:])


def conversation(cached, plain):
    a, b, ref = chat(cached, FIRST), chat(cached, FIRST), chat(plain, FIRST)
    if not (a and b and ref):
        return None
    n_prompt = a["usage"]["prompt_tokens"]
    r.ok(ids_of(a) == ids_of(b) == ids_of(ref), "same answer cached, repeated and uncached: %r %r %r" %
         (ids_of(a), ids_of(b), ids_of(ref)))
    r.ok(b["kvpin_cache"]["reused_tokens"] >= n_prompt - 1, "repeat reuses the prompt: %r" % b["kvpin_cache"])
    second = FIRST + [{"role": "assistant", "content": a["choices"][0]["message"]["content"]},
                      {"role": "user", "content": "And then the dog came back with the ball."}]
    c, cref = chat(cached, second), chat(plain, second)
    if c and cref:
        r.ok(ids_of(c) == ids_of(cref), "second turn: cached %r, uncached %r" % (ids_of(c), ids_of(cref)))
        r.ok(c["kvpin_cache"]["reused_tokens"] >= n_prompt - 1, "second turn reuse: %r" % c["kvpin_cache"])
        r.ok(cref["kvpin_cache"]["reused_tokens"] == 0, "no cache: %r" % cref["kvpin_cache"])
    edited = [FIRST[0], {"role": "user", "content": STORY.replace("small cat", "small bird")}]
    d, dref = chat(cached, edited), chat(plain, edited)
    if d and dref:
        r.ok(ids_of(d) == ids_of(dref), "edited: cached %r, uncached %r" % (ids_of(d), ids_of(dref)))
        reused = d["kvpin_cache"]["reused_tokens"]
        print("  reuse: repeat %d of %d, edit %d of %d" % (b["kvpin_cache"]["reused_tokens"], n_prompt, reused,
                                                           d["usage"]["prompt_tokens"]))
        r.ok(8 < reused < d["usage"]["prompt_tokens"] - 8, "an edit in the middle reuses a part: %r" % d["kvpin_cache"])
    # forks: n = 2 greedy answers are both the single answer
    f = chat(cached, FIRST, n=2)
    if f:
        r.ok(len(f["choices"]) == 2 and ids_of(f, 0) == ids_of(f, 1) == ids_of(ref),
             "n = 2 forks give the greedy answer twice: %r" % [ch.get("token_ids") for ch in f["choices"]])
    return ids_of(ref)


def pinned(cached, plain):
    system = [{"role": "system", "content": "You are a careful narrator. " * 6}]
    st, _, pin = cached.post("/v1/cache/pin", {"messages": system})
    r.ok(st == 200 and "id" in pin, "pin: %s %r" % (st, pin))
    ask = system + [{"role": "user", "content": "Tell me about the dog."}]
    j, ref = chat(cached, ask), chat(plain, ask)
    if j and ref and st == 200:
        r.ok(ids_of(j) == ids_of(ref), "after the pin: cached %r, uncached %r" % (ids_of(j), ids_of(ref)))
        r.ok(j["kvpin_cache"]["reused_tokens"] >= pin["tokens"] > 8,
             "the pinned prefix is reused: %r %r" % (pin, j["kvpin_cache"]))
        st, _, _ = cached.request("DELETE", "/v1/cache/pin/" + pin["id"])
        r.ok(st == 200, "unpin: %d" % st)


def disk_tier(answer):
    tmp = tempfile.mkdtemp(prefix="kvpin-moe-")
    try:
        a = Server(r, "--ctx", "512", "--chat-template", "chatml", "--cache-dir", tmp, model=MODEL)
        j = chat(a, FIRST)
        deadline = time.time() + 30
        while time.time() < deadline:
            st, c = a.get("/v1/cache")
            if st == 200 and c.get("tiers", {}).get("disk", {}).get("blocks", 0) >= 2:
                break
            time.sleep(0.05)
        a.kill()
        fps = [os.path.join(tmp, x, "FINGERPRINT") for x in os.listdir(tmp)
               if os.path.exists(os.path.join(tmp, x, "FINGERPRINT"))]
        text = open(fps[0]).read() if fps else ""
        r.ok(all(line in text for line in FP_LINES), "the disk tier's fingerprint names the experts: %r" % text)
        b = Server(r, "--ctx", "512", "--chat-template", "chatml", "--cache-dir", tmp, model=MODEL)
        k = chat(b, FIRST)
        if j and k:
            kc = k["kvpin_cache"]
            r.ok(ids_of(j) == ids_of(k) == answer, "restored from disk, the same answer: %r %r %r" %
                 (ids_of(j), ids_of(k), answer))
            r.ok(kc["reused_from"]["disk"] >= 16, "the restarted server reuses from disk: %r" % kc)
        b.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    info()
    cached = Server(r, "--ctx", "512", "--chat-template", "chatml", model=MODEL)
    plain = Server(r, "--ctx", "512", "--chat-template", "chatml", "--no-prefix-cache", model=MODEL)
    try:
        answer = conversation(cached, plain)
        pinned(cached, plain)
    finally:
        for s in (cached, plain):
            if s in Server.running:
                s.stop()
    if answer is not None:
        disk_tier(answer)


try:
    for MODEL, INFO, FP_LINES in MODELS:
        print("model %s" % MODEL)
        main()
finally:
    kill_all()
sys.exit(r.finish())
