#!/usr/bin/env python3
"""End-to-end test of in-flight prefixes on `kvpin serve` over loopback (run
by tests/run_all.sh with the binary in $KVPIN).

A burst of N requests (token-id prompts: a 400-token spec + a 20-token tail
of each one's own), sent at once from N threads to a server with --parallel
N and a small prefill chunk (so the first one is still prefilling when the
others arrive). Expected values come from outside the answer under test:
  - the answers (greedy) equal those of a server without a prefix cache;
  - nothing was cached before, so every request but the first admitted
    reuses the spec (400 = the common prefix, tails differ from their first
    token) and the first reuses nothing; those that took it in flight say
    shared_inflight with inflight_reused_tokens == reused_tokens and the
    cause shared_inflight;
  - /metrics kvpin_inflight_reused_tokens_total is the sum of the reports,
    and the prompt positions computed (prompt minus cached tokens) are the
    spec once plus the tails;
  - the dashboard's request list (/v1/cache/events) carries the same
    reports, the request log says cause=shared_inflight for them; no block
    leaks.
"""
import random
import sys
import threading

from kvpin_test import Results, Server, metrics, no_leaks, wait_idle

R = Results("e2e_crew")
ok = R.ok
N, SPEC, TAIL, GEN = 6, 400, 20, 4


def body(p):
    return {"prompt": p, "max_tokens": GEN, "temperature": 0, "ignore_eos": True}


def main():
    rng = random.Random(18)
    spec = [1] + [rng.randrange(3, 500) for _ in range(SPEC - 1)]
    prompts = []
    for i in range(N):
        tail = [3 + i] + [rng.randrange(3, 500) for _ in range(TAIL - 1)]  # distinct first tokens
        prompts.append(spec + tail)
    ref = Server(R, "--no-prefix-cache", "--parallel", "1")
    want = []
    for p in prompts:
        st, _, j = ref.post("/v1/completions", body(p))
        ok(st == 200, "reference answer: %s" % st)
        want.append(j["choices"][0]["text"])
    ref.stop()

    srv = Server(R, "--parallel", str(N), "--prefill-chunk", "4", "--ctx", "512", quiet=False)
    m0 = metrics(srv)
    got = [None] * N

    def run(k):
        got[k] = srv.post("/v1/completions", body(prompts[k]), timeout=300)

    ts = [threading.Thread(target=run, args=(k,)) for k in range(N)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    m1 = metrics(srv)
    reports = []
    for k, (st, _, j) in enumerate(got):
        ok(st == 200, "burst request %d: %s" % (k, st))
        ok(j["choices"][0]["text"] == want[k], "request %d: answer differs from the server without a cache" % k)
        reports.append(j["kvpin_cache"])
    reuse = sorted(c["reused_tokens"] for c in reports)
    ok(reuse[0] == 0 and all(x == SPEC for x in reuse[1:]), "reused tokens per request %s" % reuse)
    inflight = [c for c in reports if c["shared_inflight"]]
    ok(len(inflight) >= 1, "no request took the spec in flight: %s" % reports)
    for c in reports:
        if c["shared_inflight"]:
            ok(c["inflight_reused_tokens"] == c["reused_tokens"] and c["cause"] == "shared_inflight" and
               c["inflight_wait_ms"] >= 0, "in-flight report: %s" % c)
        else:
            ok(c["inflight_reused_tokens"] == 0 and c["cause"] != "shared_inflight", "report: %s" % c)
    total = sum(c["inflight_reused_tokens"] for c in reports)
    ok(m1["kvpin_inflight_reused_tokens_total"] - m0.get("kvpin_inflight_reused_tokens_total", 0) == total,
       "metrics: in-flight tokens %s, reports %d" % (m1.get("kvpin_inflight_reused_tokens_total"), total))
    ok(m1["kvpin_inflight_followers_total"] == len(inflight), "metrics: followers")
    computed = (m1["kvpin_prompt_tokens_total"] - m0["kvpin_prompt_tokens_total"]) - \
        (m1["kvpin_prompt_tokens_cached_total"] - m0["kvpin_prompt_tokens_cached_total"])
    ok(computed == SPEC + N * TAIL, "prompt positions computed %d, spec once + tails %d" % (computed, SPEC + N * TAIL))
    ok(wait_idle(srv), "idle after the burst")
    st, ev = srv.get("/v1/cache/events")
    ok(st == 200, "GET /v1/cache/events")
    shown = [r for r in ev["history"]["requests"] if r.get("cache") and r["cache"].get("shared_inflight")]
    ok(len(shown) == len(inflight), "dashboard requests with shared_inflight: %d of %d" % (len(shown), len(inflight)))
    lines = [l for l in srv.log_text().splitlines() if " path=/v1/completions " in l]
    ok(sum(" cause=shared_inflight " in l for l in lines) == len(inflight),
       "request log lines with cause=shared_inflight: %s" % lines)
    no_leaks(R, srv, "after the burst")
    srv.stop()
    return R.finish()


if __name__ == "__main__":
    sys.exit(main())
