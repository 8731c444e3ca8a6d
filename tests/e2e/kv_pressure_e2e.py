#!/usr/bin/env python3
"""End-to-end test of `kvpin serve` under KV pressure (run by
tests/run_all.sh with the binary in $KVPIN).

A server with `--kv-budget 409600` (40 blocks of 16 positions of the bundled
model, 640 bytes per token) takes 300 distinct requests from 8 clients at
once: completions with an explicit max_tokens and chats that run to the end
of the context (--ctx 512; streaming and not, mixed; every request fits the
budget alone, four long ones do not fit together). Expected values come from
outside the pressured server:
  - every request ends without an error (no 503, no error event in a
    stream), with the token ids, text, finish reason and completion_tokens
    the same request gets from a server with the default (big) budget,
    greedy;
  - the pressure was real: /metrics counts preemptions and waits for KV,
    and the answers' kvpin_cache.preemptions add up to the preemptions;
  - no leaked KV blocks afterwards (blocks in use == blocks the index holds);
  - a request that can never fit (its prompt, or its prompt + max_tokens,
    holds more positions than the budget) gets 400 kv_budget_exceeded at
    once with the numbers in the message, and a chat without max_tokens is
    cut to what the budget holds: prompt_tokens + completion_tokens - 1 ==
    the budget's positions (the last token is never fed back);
  - a pin that leaves too little room: the request runs alone to the
    positions left (budget - pinned blocks) and ends with finish length and
    kvpin_cache.note.
Prints the figures: requests, preemptions, errors, 503s, mismatches.
"""
import http.client
import json
import random
import re
import sys
import threading

from kvpin_test import Results, Server, no_leaks, wait_idle

R = Results("e2e_kv_pressure")
ok = R.ok
BUDGET = 409600  # bytes: 640 positions of 640 bytes
WORDS = ("the a little girl boy dog cat tree sun ball park happy sad big red blue went saw found played ran "
         "jumped friend mom dad home day night sky bird fish cake toy box water flower garden king queen").split()


def requests(n=300, seed=1234):
    """n distinct requests: 0 completions, 1 completions streamed, 2 chat,
    3 chat streamed; chats share a system prompt (prefix cache hits)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 40)))
        kind = i % 4
        if kind < 2:
            body = {"prompt": "Story %d: Once upon a time %s" % (i, words), "max_tokens": rng.randint(40, 200),
                    "ignore_eos": rng.random() < 0.3}
        else:
            body = {"messages": [{"role": "system", "content": "You tell short stories for children."},
                                 {"role": "user", "content": "Story %d about %s" % (i, words)}]}
        body.update({"temperature": 0, "return_token_ids": True, "stream": kind % 2 == 1})
        if body["stream"]:
            body["stream_options"] = {"include_usage": True}
        out.append(("/v1/chat/completions" if kind >= 2 else "/v1/completions", body))
    return out


def send(port, path, body):
    """One request; returns a dict: status, ids, text, finish, error, usage, cache (kvpin_cache)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    res = {"status": r.status, "ids": None, "text": "", "finish": None, "error": None, "usage": None, "cache": None}
    chat = "chat" in path
    if not body.get("stream") or r.status != 200:
        data = r.read()
        c.close()
        try:
            j = json.loads(data)
        except ValueError:
            res["error"] = data[:200]
            return res
        if r.status != 200:
            res["error"] = j.get("error")
            return res
        ch = j["choices"][0]
        res.update(ids=ch.get("token_ids"), text=ch["message"]["content"] if chat else ch["text"],
                   finish=ch["finish_reason"], usage=j["usage"], cache=j.get("kvpin_cache"))
        return res
    raw = r.read()
    c.close()
    for j in (json.loads(e[6:]) for e in raw.split(b"\n\n") if e.startswith(b"data: {")):
        if "error" in j:
            res["error"] = j["error"]
            continue
        if j.get("usage"):
            res["usage"], res["cache"] = j["usage"], j.get("kvpin_cache")
        if not j.get("choices"):
            continue
        ch = j["choices"][0]
        res["text"] += (ch["delta"].get("content") or "") if chat else ch["text"]
        res["finish"] = ch["finish_reason"] or res["finish"]
        if "token_ids" in ch:
            res["ids"] = ch["token_ids"]
    done = raw.rstrip().endswith(b"data: [DONE]")
    if not done and not res["error"]:
        res["error"] = "the stream ended without [DONE]"
    return res


def run_all(srv, reqs, clients=8):
    out = [None] * len(reqs)
    nxt = [0]
    lock = threading.Lock()

    def worker():
        while True:
            with lock:
                k = nxt[0]
                nxt[0] += 1
            if k >= len(reqs):
                return
            try:
                out[k] = send(srv.port, *reqs[k])
            except Exception as e:  # noqa: BLE001 - a failed request is a finding, not a crash of the test
                out[k] = {"status": None, "error": repr(e), "ids": None, "text": "", "finish": None}

    ts = [threading.Thread(target=worker) for _ in range(clients)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return out


def metric(srv, name):
    _, _, m = srv.request("GET", "/metrics")
    g = re.search(rb"^" + name.encode() + rb" (\S+)$", m, re.M)
    return float(g.group(1)) if g else None


def pressure():
    reqs = requests()
    # --ctx 512 on both: a request alone always fits the 640 positions, so
    # the cut of a default max_tokens to the budget (never_fits) plays no part
    small = Server(R, "--kv-budget", str(BUDGET), "--ctx", "512", "--chat-template", "chatml")
    big = Server(R, "--ctx", "512", "--chat-template", "chatml")
    out = {}
    ref = threading.Thread(target=lambda: out.__setitem__("want", run_all(big, reqs)))
    ref.start()  # the reference runs alongside (its answers do not depend on its load)
    got = run_all(small, reqs)
    ref.join()
    want = out["want"]
    ok(wait_idle(small), "the pressured server went idle")
    pre = metric(small, "kvpin_preemptions_total")
    waits = metric(small, "kvpin_kv_wait_seconds_count")
    no_leaks(R, small, "after the pressure")
    small.stop()
    big.stop()
    errors = sum(1 for g in got if g["status"] != 200 or g["error"])
    n503 = sum(1 for g in got if g["status"] == 503)
    differ = 0
    for k, (g, w) in enumerate(zip(got, want)):
        if not ok(w["status"] == 200 and not w["error"] and w["ids"], "reference %d failed: %r" % (k, w)):
            continue
        if g["status"] != 200 or g["error"]:
            continue
        same = g["ids"] == w["ids"] and g["text"] == w["text"] and g["finish"] == w["finish"]
        if g["usage"] and w["usage"]:
            same &= g["usage"]["completion_tokens"] == w["usage"]["completion_tokens"]
        differ += not same
        ok(same, "request %d (%s, stream %s) differs from the big-budget server:\n%.300r\n%.300r" %
           (k, reqs[k][0], reqs[k][1]["stream"], g, w))
    # each answer says how often it stepped aside; together, what /metrics counted
    told = [g["cache"]["preemptions"] for g in got if g.get("cache")]
    ok(len(told) == len(got) and sum(told) == pre, "kvpin_cache.preemptions of %d answers sum to %d, /metrics %r" %
       (len(told), sum(told), pre))
    ok(not any("note" in g["cache"] for g in got if g.get("cache")), "a note (no room even alone) without pins")
    first_err = next((g for g in got if g["status"] != 200 or g["error"]), None)
    gen = sum(len(w["ids"] or []) for w in want)
    print("kv pressure: %d requests (%d tokens generated), %s preemptions, %s waits for KV, %d errors (%d of them "
          "503), %d differ from the big budget%s" %
          (len(reqs), gen, "%d" % pre if pre is not None else "no", "%d" % waits if waits is not None else "no",
           errors, n503, differ,
           "; first error: %r" % (first_err,) if first_err else ""))
    ok(errors == 0 and n503 == 0, "%d errors, %d 503s under KV pressure" % (errors, n503))
    ok(pre is not None and pre > 0, "no preemption counted (%r): the test did not press the budget" % pre)
    ok(waits is not None and waits > 0, "no admission waited for KV (%r)" % waits)


def never_fits():
    """--ctx 2048 over 640 positions: what the budget can never hold is a 400; a
    chat with no max_tokens is cut to the budget."""
    srv = Server(R, "--kv-budget", str(BUDGET), "--ctx", "2048", "--chat-template", "chatml")
    st, _, j = srv.post("/v1/completions", {"prompt": [1] + [300] * 599, "max_tokens": 100})
    msg = j["error"]["message"] if st == 400 else ""
    ok(st == 400 and j["error"]["code"] == "kv_budget_exceeded", "prompt + max_tokens over the budget: %d %r" % (st, j))
    for num in ("600", "100", "640", "409600"):
        ok(num in msg, "the message names %s: %r" % (num, msg))
    st, _, j = srv.post("/v1/completions", {"prompt": [1] + [300] * 699})
    ok(st == 400 and j["error"]["code"] == "kv_budget_exceeded" and "700" in j["error"]["message"],
       "a prompt alone over the budget: %d %r" % (st, j))
    st, _, j = srv.post("/v1/completions", {"prompt": [1] + [300] * 599, "max_tokens": 41, "temperature": 0,
                                            "ignore_eos": True})
    ok(st == 200 and j["usage"]["completion_tokens"] == 41, "600 + 41 - 1 positions fit 640: %d %r" % (st, j))
    st, _, j = srv.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}],
                                                 "ignore_eos": True, "temperature": 0})
    u = j.get("usage", {}) if st == 200 else {}
    ok(st == 200 and j["choices"][0]["finish_reason"] == "length" and
       u["prompt_tokens"] + u["completion_tokens"] - 1 == 640, "a chat without max_tokens is cut to the budget: %d %r" %
       (st, u or j))
    # a pin of 300 positions (19 of the 40 blocks) leaves 21 blocks, 336
    # positions: a request that fits the budget but not that runs alone to
    # them and ends with a note instead of waiting for ever
    st, _, pin = srv.post("/v1/cache/pin", {"prompt": [1] + [300] * 299})
    ok(st == 200, "pin: %d %r" % (st, pin))
    st, _, j = srv.post("/v1/completions", {"prompt": [1] + list(range(5, 14)), "max_tokens": 600, "temperature": 0,
                                            "ignore_eos": True})
    c = j.get("kvpin_cache", {}) if st == 200 else {}
    ok(st == 200 and j["choices"][0]["finish_reason"] == "length" and j["usage"]["completion_tokens"] == 336 - 10 + 1
       and "pinned" in c.get("note", ""), "the room a pin leaves: %d %r" % (st, j.get("usage", j)))
    st, _, _ = srv.request("DELETE", "/v1/cache/pin/" + pin.get("id", "none"))
    ok(st == 200, "unpin: %d" % st)
    ok(wait_idle(srv), "idle after the refusals")
    no_leaks(R, srv, "after the refusals")
    srv.stop()


def main():
    never_fits()
    pressure()
    return R.finish()


if __name__ == "__main__":
    sys.exit(main())
