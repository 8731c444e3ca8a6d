#!/usr/bin/env python3
"""choices_bench.py - n choices from one prefill against n separate requests
(make bench, bench/run.sh; issue #11's goal: n 8 on a 2,000-token prompt).

Starts `kvpin serve` on the given model with --parallel N and, for each of
--reps runs (a fresh prompt each, so nothing is cached from the run before):

  A  one request with n N (max_tokens T each);
  B  N separate requests of the same prompt at once (seeds differ).

and reports per mode the medians of: the prompt positions the engine
computed (from /metrics: prompt tokens minus cached ones), the KV bytes in
use at the peak of the run above the bytes in use before it (GET /v1/cache,
polled every 20 ms; the prompt's own bytes are prompt x bytes per token),
and the wall time from the first request sent to the last answer.
"""
import argparse
import http.client
import json
import os
import random
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "e2e"))
from kvpin_test import Server  # noqa: E402


def req(port, method, path, body=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request(method, path, body=json.dumps(body).encode() if body is not None else None,
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, data


def metrics(port):
    st, data = req(port, "GET", "/metrics")
    out = {}
    for line in data.decode().splitlines():
        if line and not line.startswith("#"):
            k, v = line.rsplit(" ", 1)
            out[k] = float(v)
    return out["kvpin_prompt_tokens_total"] - out["kvpin_prompt_tokens_cached_total"]


def kv_used(port):
    st, data = req(port, "GET", "/v1/cache")
    kv = json.loads(data)["kv"]
    return kv["used_bytes"], kv["bytes_per_token"]


def run(port, mode, prompt, n, tokens):
    """Returns (computed positions, peak KV bytes above the start, seconds)."""
    base, _ = kv_used(port)
    c0 = metrics(port)
    peak = [base]
    done = threading.Event()

    def poll():
        while not done.is_set():
            peak[0] = max(peak[0], kv_used(port)[0])
            time.sleep(0.02)

    body = {"prompt": prompt, "max_tokens": tokens, "temperature": 1, "ignore_eos": True}
    poller = threading.Thread(target=poll)
    poller.start()
    t0 = time.time()
    if mode == "n":
        st, data = req(port, "POST", "/v1/completions", dict(body, n=n, seed=1))
        assert st == 200, data[:300]
        assert len(json.loads(data)["choices"]) == n
    else:
        errs = []

        def one(i):
            st, data = req(port, "POST", "/v1/completions", dict(body, seed=1 + i))
            if st != 200:
                errs.append(data[:300])

        th = [threading.Thread(target=one, args=(i,)) for i in range(n)]
        for t in th:
            t.start()
        for t in th:
            t.join()
        assert not errs, errs
    dt = time.time() - t0
    done.set()
    poller.join()
    return metrics(port) - c0, peak[0] - base, dt


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kvpin", default="./kvpin")
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-n", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=2000, help="prompt tokens")
    ap.add_argument("--tokens", type=int, default=16, help="max_tokens per choice")
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    srv = Server(None, "--parallel", str(a.n), "--ctx", str(a.prompt + a.tokens + 64), model=a.model,
                 binary=a.kvpin, threads=a.threads, start_seconds=60)
    port = srv.port
    try:
        _, per_token = kv_used(port)
        rng = random.Random(11)
        res = {"n": [], "separate": []}
        for rep in range(a.reps):
            for mode in ("n", "separate"):  # A/B in one sitting, alternating
                prompt = [rng.randrange(100, 40000) for _ in range(a.prompt)]  # fresh: no cached prefix
                res[mode].append(run(port, mode, prompt, a.n, a.tokens))
        print("n %d on a %d-token prompt, %d tokens per choice, %d runs each (medians), %d bytes of KV per token:" % (
            a.n, a.prompt, a.tokens, a.reps, per_token))
        print("  %-24s %18s %22s %10s" % ("", "prompt computed", "peak KV bytes added", "wall s"))
        for mode, name in (("n", "one request, n %d" % a.n), ("separate", "%d separate requests" % a.n)):
            r = res[mode]
            print("  %-24s %18d %22d %10.2f" % (name, statistics.median(x[0] for x in r),
                                                 statistics.median(x[1] for x in r), statistics.median(x[2] for x in r)))
        print("  the prompt's own K/V: %d bytes (%d tokens); computed once = %d positions, %dx = %d" % (
            a.prompt * per_token, a.prompt, a.prompt, a.n, a.n * a.prompt))
        print(json.dumps({"bench": "choices", "n": a.n, "prompt": a.prompt, "tokens": a.tokens,
                          "bytes_per_token": per_token, "runs": res}))
    finally:
        srv.stop()


if __name__ == "__main__":
    main()
