#!/usr/bin/env python3
"""End-to-end tests of n > 1 and logprobs on `kvpin serve` over loopback
(run by tests/run_all.sh with the binary in $KVPIN).

Expected values come from outside the answer under test:
  - usage: prompt_tokens from /tokenize (the prompt once), completion_tokens
    the sum of the choices' token ids;
  - the prompt computed once: the server's counters (/metrics prompt minus
    cached tokens) move by the prompt's uncached tokens once, not n times;
  - each choice i of a request with seed s is the request with seed s + i
    alone (text and token ids); greedy choices equal each other and n = 1;
  - streamed choices equal the same request not streamed;
  - logprobs: the log-softmax in float64 of the logits `kvpin logits`
    computes for the same token ids (an independent forward pass over the
    whole sequence), at temperature 1, after top-k and a temperature, and
    for greedy (documented: the temperature-1 distribution);
  - cancelling a stream of n choices ends all of them, no block leaks.
"""
import http.client
import json
import math
import os
import struct
import subprocess
import sys
import tempfile

from kvpin_test import KVPIN, MODEL, Results, Server, metrics, no_leaks, tokenize, wait_idle

R = Results("e2e_choices")
ok = R.ok
C, X = "/v1/completions", "/v1/chat/completions"


def computed(m):
    return m["kvpin_prompt_tokens_total"] - m["kvpin_prompt_tokens_cached_total"]


def stream(srv, path, body):
    """The SSE events of a streamed request, parsed (the [DONE] as None)."""
    c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=60)
    c.request("POST", path, body=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    events = []
    for line in r.read().decode().split("\n"):
        if line.startswith("data: "):
            d = line[6:]
            events.append(None if d == "[DONE]" else json.loads(d))
    c.close()
    return r.status, events


def usage_and_sharing(srv):
    prompt = "The little robot looked at the stars and wondered why they were so far away from home."
    p_ids = tokenize(srv, prompt)
    m0 = metrics(srv)
    st, _, j = srv.post(C, {"prompt": prompt, "n": 4, "max_tokens": 8, "seed": 11, "temperature": 1,
                            "return_token_ids": True, "ignore_eos": True})
    m1 = metrics(srv)
    if not ok(st == 200, "n 4: %s %s" % (st, j)):
        return
    ch = j["choices"]
    ok([c["index"] for c in ch] == [0, 1, 2, 3], "choices ordered by index: %s" % [c["index"] for c in ch])
    ok(j["usage"]["prompt_tokens"] == len(p_ids), "prompt counted once: %s vs %d" % (j["usage"], len(p_ids)))
    ok(j["usage"]["completion_tokens"] == sum(len(c["token_ids"]) for c in ch) == 32,
       "completion tokens summed: %s" % j["usage"])
    ok(all(c["prompt_token_ids"] == p_ids for c in ch), "every choice's prompt ids are the prompt's")
    uncached = len(p_ids) - j["usage"]["prompt_tokens_details"]["cached_tokens"]
    ok(computed(m1) - computed(m0) == uncached, "the prompt computed once: %d positions, %d uncached (4x: %d)" % (
        computed(m1) - computed(m0), uncached, 4 * uncached))
    ok(m1["kvpin_prompt_tokens_total"] - m0["kvpin_prompt_tokens_total"] == 4 * len(p_ids),
       "each choice is a request of the whole prompt in the counters")
    ok(j["kvpin_cache"]["choices_computed_tokens"] == uncached and j["kvpin_cache"]["choices"] == 4,
       "kvpin_cache: %s" % j["kvpin_cache"])
    ok(len(set(c["text"] for c in ch)) > 1, "4 sampled choices are not all the same: %s" % [c["text"] for c in ch])
    no_leaks(R, srv, "after n 4")
    # a prompt whose length is a multiple of the block size has no partial block to copy; one that is not does
    for extra in ["", " Then", " Then it", " Then it slept"]:
        st, _, j = srv.post(C, {"prompt": prompt + extra + " Later", "n": 3, "max_tokens": 4, "seed": 3,
                                "return_token_ids": True})
        ok(st == 200 and len(j["choices"]) == 3, "n 3 after %r: %s" % (extra, st))
    no_leaks(R, srv, "after the block-boundary prompts")


def seeds(srv):
    body = {"prompt": "Once upon a time", "max_tokens": 10, "temperature": 1, "return_token_ids": True}
    st, _, j = srv.post(C, dict(body, n=3, seed=100))
    if not ok(st == 200, "n 3 seed 100: %s" % st):
        return
    for i, c in enumerate(j["choices"]):
        st, _, one = srv.post(C, dict(body, seed=100 + i))
        ok(one["choices"][0]["text"] == c["text"] and one["choices"][0]["token_ids"] == c["token_ids"],
           "choice %d of seed 100 is seed %d alone: %r vs %r" % (i, 100 + i, c["text"], one["choices"][0]["text"]))
    # streamed: the same choices, a finish per choice, usage once at the end
    st, ev = stream(srv, C, dict(body, n=3, seed=100, stream=True, stream_options={"include_usage": True}))
    ok(st == 200 and ev and ev[-1] is None, "stream ends with [DONE]")
    texts, finishes, usages = ["", "", ""], [[], [], []], []
    for e in ev[:-1]:
        if e.get("usage"):
            usages.append(e["usage"])
        for c in e["choices"]:
            texts[c["index"]] += c["text"]
            if c["finish_reason"]:
                finishes[c["index"]].append(c["finish_reason"])
    ok(texts == [c["text"] for c in j["choices"]], "streamed choices equal the body's: %s" % texts)
    ok(finishes == [["length"]] * 3, "one finish per choice: %s" % finishes)
    ok(len(usages) == 1 and ev[-2].get("usage") == usages[0], "usage once, in the last chunk")
    ok(usages and usages[0]["completion_tokens"] == 30 and usages[0]["prompt_tokens"] == j["usage"]["prompt_tokens"],
       "streamed usage: %s" % usages)
    # chat streaming: a role chunk per choice, chunks carry their index
    st, ev = stream(srv, X, {"messages": [{"role": "user", "content": "Tell a story"}], "n": 2, "max_tokens": 5,
                             "seed": 9, "stream": True})
    roles = [c["index"] for e in ev[:-1] for c in e["choices"] if c["delta"].get("role")]
    ok(st == 200 and roles == [0, 1], "a role chunk per choice: %s" % roles)
    st, _, body_ = srv.post(X, {"messages": [{"role": "user", "content": "Tell a story"}], "n": 2, "max_tokens": 5,
                                "seed": 9})
    got = ["", ""]
    for e in ev[:-1]:
        for c in e["choices"]:
            got[c["index"]] += c["delta"].get("content") or ""
    ok(got == [c["message"]["content"] for c in body_["choices"]], "chat stream equals the body: %s" % got)


TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Current weather",
                                          "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                         "required": ["city"], "additionalProperties": False}}}]


def stream_choices(ev, n):
    """Content, tool calls (name, arguments) and finish of each choice of a chat stream."""
    out = [{"content": "", "calls": {}, "finish": None} for _ in range(n)]
    for e in ev[:-1]:
        for c in e.get("choices", []):
            o = out[c["index"]]
            o["content"] += c["delta"].get("content") or ""
            for tc in c["delta"].get("tool_calls") or []:
                call = o["calls"].setdefault(tc["index"], {"name": "", "arguments": ""})
                call["name"] += tc.get("function", {}).get("name") or ""
                call["arguments"] += tc.get("function", {}).get("arguments") or ""
            o["finish"] = c["finish_reason"] or o["finish"]
    return [{"content": o["content"], "calls": [o["calls"][k] for k in sorted(o["calls"])], "finish": o["finish"]}
            for o in out]


def body_choices(j):
    return [{"content": c["message"].get("content") or "",
             "calls": [{"name": t["function"]["name"], "arguments": t["function"]["arguments"]}
                       for t in c["message"].get("tool_calls") or []],
             "finish": c["finish_reason"]} for c in j["choices"]]


def tools_streamed(srv):
    """A streamed chat with tools and logprobs, or tools and n > 1 (forced calls
    included), streams normally and equals the same request not streamed."""
    base = {"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": TOOLS, "max_tokens": 12,
            "seed": 5, "temperature": 1}
    for extra, what in [({"logprobs": True}, "tools + logprobs"), ({"n": 2}, "tools + n 2"),
                        ({"n": 2, "tool_choice": "required", "max_tokens": 200}, "forced call + n 2"),
                        ({"logprobs": True, "tool_choice": "required", "max_tokens": 200}, "forced call + logprobs")]:
        req = dict(base, **extra)
        n = req.get("n", 1)
        st, ev = stream(srv, X, dict(req, stream=True))
        if not ok(st == 200 and ev and ev[-1] is None, "%s: a normal stream (%s)" % (what, st)):
            continue
        st, _, j = srv.post(X, req)
        ok(st == 200 and stream_choices(ev, n) == body_choices(j),
           "%s: streamed choices equal the body's: %s vs %s" % (what, stream_choices(ev, n),
                                                                body_choices(j) if st == 200 else j))
        if "tool_choice" in req:
            ok(all(c["finish"] == "tool_calls" and c["calls"] for c in stream_choices(ev, n)),
               "%s: every choice is a call" % what)
        if req.get("logprobs"):
            lps = [c for e in ev[:-1] for c in e.get("choices", []) if c.get("logprobs")]
            ok(len(lps) > 0, "%s: the stream carries logprobs" % what)


def greedy(srv):
    body = {"prompt": "One day, a girl named Lily", "max_tokens": 12, "temperature": 0}
    st, _, j = srv.post(C, dict(body, n=4))
    st1, _, one = srv.post(C, body)
    texts = [c["text"] for c in j["choices"]]
    ok(st == 200 and len(set(texts)) == 1 and texts[0] == one["choices"][0]["text"],
       "greedy choices equal each other and n 1: %s vs %r" % (texts, one["choices"][0]["text"]))


def refusals(srv):
    for n, what in [(5, "more than --parallel"), (17, "more than 16"), (0, "zero")]:
        st, _, j = srv.post(C, {"prompt": "a", "n": n})
        ok(st == 400 and j["error"]["param"] == "n", "n %d (%s): %s %s" % (n, what, st, j))
    for lp in [6, -1, True]:
        st, _, j = srv.post(C, {"prompt": "a", "logprobs": lp})
        ok(st == 400 and j["error"]["param"] == "logprobs", "completions logprobs %r: %s" % (lp, st))
    st, _, j = srv.post(X, {"messages": [{"role": "user", "content": "a"}], "logprobs": True, "top_logprobs": 21})
    ok(st == 400 and j["error"]["param"] == "top_logprobs", "top_logprobs 21: %s" % st)
    st, _, j = srv.post(X, {"messages": [{"role": "user", "content": "a"}], "top_logprobs": 2})
    ok(st == 400 and j["error"]["param"] == "top_logprobs", "top_logprobs without logprobs: %s" % st)


def ref_logits(ids):
    """The logits of every position of ids from `kvpin logits` (its own forward pass)."""
    with tempfile.NamedTemporaryFile(suffix=".f32", delete=False) as f:
        path = f.name
    try:
        subprocess.run([KVPIN, "logits", "-m", MODEL, "--tokens", " ".join(map(str, ids)), "-o", path,
                        "--kv-type", "f16", "-t", "1"], check=True, stdout=subprocess.DEVNULL)
        data = open(path, "rb").read()
    finally:
        os.unlink(path)
    rows = len(ids)
    n_vocab = len(data) // 4 // rows
    flat = struct.unpack("<%df" % (rows * n_vocab), data)
    return [flat[i * n_vocab:(i + 1) * n_vocab] for i in range(rows)]


def log_softmax(row, temp=1.0, top_k=0):
    idx = list(range(len(row)))
    if top_k:
        idx = sorted(idx, key=lambda i: (-row[i], i))[:top_k]
    mx = max(row[i] for i in idx)
    s = sum(math.exp((row[i] - mx) / temp) for i in idx)
    out = {i: (row[i] - mx) / temp - math.log(s) for i in idx}
    return out


def logprobs_values(srv):
    prompt = "Once upon a time, there was a"
    cases = [({"temperature": 1, "top_p": 1}, 1.0, 0), ({"temperature": 0.7, "top_k": 3}, 0.7, 3),
             ({"temperature": 0}, 1.0, 0)]
    for params, temp, top_k in cases:
        body = dict({"prompt": prompt, "max_tokens": 6, "logprobs": 5, "seed": 4, "return_token_ids": True,
                     "ignore_eos": True}, **params)
        st, _, j = srv.post(C, body)
        if not ok(st == 200, "logprobs %s: %s %s" % (params, st, j)):
            continue
        c = j["choices"][0]
        lp = c["logprobs"]
        ids = c["prompt_token_ids"] + c["token_ids"]
        rows = ref_logits(ids[:-1])
        ok(len(rows) == len(ids) - 1, "kvpin logits rows: %d" % len(rows))
        P = len(c["prompt_token_ids"])
        ok(len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"]) == 6,
           "legacy shape lengths: %s" % {k: len(v) for k, v in lp.items()})
        ok("".join(lp["tokens"]) == c["text"], "the tokens spell the text: %r vs %r" % ("".join(lp["tokens"]), c["text"]))
        off = 0
        for k in range(6):
            ok(lp["text_offset"][k] == off, "text_offset %d: %d vs %d" % (k, lp["text_offset"][k], off))
            off += len(lp["tokens"][k].encode())
            ref = log_softmax(rows[P - 1 + k], temp, top_k)
            tok = c["token_ids"][k]
            ok(tok in ref and abs(lp["token_logprobs"][k] - ref[tok]) < 2e-3,
               "%s token %d: logprob %s, reference %s" % (params, k, lp["token_logprobs"][k], ref.get(tok)))
            top = lp["top_logprobs"][k]
            vals = sorted(top.values(), reverse=True)
            best = sorted(ref.values(), reverse=True)[:5]
            ok(len(vals) == min(5, len(ref)), "%s: %d top entries (reference %d)" % (params, len(vals), len(ref)))
            # two tokens of one text would share a key; the likeliest of those is what is listed
            ok(all(abs(a - b) < 2e-3 for a, b in zip(vals, best)) or len(vals) < len(best),
               "%s token %d: top %s vs reference %s" % (params, k, vals, best))
            ok(lp["token_logprobs"][k] <= vals[0] + 1e-6, "sampled <= top-1")
            if top_k:
                ok(lp["tokens"][k] in top, "within top_k the sampled token is listed")
            if params["temperature"] == 0:
                am = max(range(len(rows[P - 1 + k])), key=lambda i: (rows[P - 1 + k][i], -i))
                ok(tok == am, "greedy is the argmax")
    # chat: the shape, bytes, top lists sorted
    st, _, j = srv.post(X, {"messages": [{"role": "user", "content": "Tell me a story"}], "max_tokens": 6,
                            "logprobs": True, "top_logprobs": 3, "seed": 2})
    if ok(st == 200, "chat logprobs: %s" % st):
        content = j["choices"][0]["logprobs"]["content"]
        ok(len(content) >= 1, "chat logprobs content: %s" % content)
        ok("".join(e["token"] for e in content) == j["choices"][0]["message"]["content"], "chat tokens spell the text")
        for e in content:
            ok(bytes(e["bytes"]).decode(errors="replace") == e["token"], "bytes are the token's: %s" % e)
            tl = [t["logprob"] for t in e["top_logprobs"]]
            ok(len(tl) == 3 and tl == sorted(tl, reverse=True) and e["logprob"] <= tl[0] + 1e-6,
               "top_logprobs sorted: %s" % e)
    # streamed: each chunk carries its tokens' logprobs; together they are the body's
    body = {"prompt": prompt, "max_tokens": 6, "logprobs": 2, "seed": 4, "temperature": 1, "ignore_eos": True}
    st, _, whole = srv.post(C, body)
    st, ev = stream(srv, C, dict(body, stream=True))
    toks, lps = [], []
    for e in ev[:-1]:
        for c in e["choices"]:
            if c.get("logprobs"):
                toks += c["logprobs"]["tokens"]
                lps += c["logprobs"]["token_logprobs"]
    ok(toks == whole["choices"][0]["logprobs"]["tokens"] and lps == whole["choices"][0]["logprobs"]["token_logprobs"],
       "streamed logprobs are the body's: %s vs %s" % (toks, whole["choices"][0]["logprobs"]["tokens"]))


def cancel(srv):
    c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=60)
    c.request("POST", C, body=json.dumps({"prompt": "Once", "n": 3, "max_tokens": 400, "stream": True,
                                          "ignore_eos": True}).encode(),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    r.readline()
    c.sock.close()
    c.close()
    ok(wait_idle(srv, 30), "cancelling the stream ends every choice")
    no_leaks(R, srv, "after a cancelled stream of 3 choices")


def main():
    srv = Server(R, "--ctx", "512", "--parallel", "4", "--chat-template", "chatml")
    try:
        usage_and_sharing(srv)
        seeds(srv)
        greedy(srv)
        refusals(srv)
        logprobs_values(srv)
        cancel(srv)
        no_leaks(R, srv, "at the end")
    finally:
        srv.stop()
    srv = Server(R, "--ctx", "2048", "--parallel", "4", "--chat-template", "chatml")
    try:
        tools_streamed(srv)
        no_leaks(R, srv, "after the streams with tools")
    finally:
        srv.stop()
    return R.finish()


if __name__ == "__main__":
    sys.exit(main())
