#!/usr/bin/env python3
"""crew_bench.py - a crew that arrives together computes its shared spec once
(make bench, bench/run.sh; issue #18's goals).

Starts `kvpin serve` on the given model with --parallel P (8) and, for each
of --reps runs (a fresh spec each, so nothing is cached from the run before):

  single  one request of a spec of S tokens (4,000) + a T-token tail (100):
          the time of one cold prefill of that length;
  burst   N requests (8) of the same spec, each with its own T-token tail,
          all sent at once: wall time from the first sent to the last
          answered, the prompt tokens each reports reused (kvpin_cache
          reused_tokens / inflight_reused_tokens) and the prompt positions
          the engine computed (from /metrics: prompt minus cached tokens);
          the first one admitted computes the spec, the others reuse it;
  crowd   the same with 32 requests at --parallel P (the queued ones arrive
          while the leader prefills): total prefill work against
          spec + 32 tails (--crowd 0: skipped).

With --llama-server PATH, the burst also runs on llama.cpp's server
(`-np P --kv-unified -c P x (S + T + 64)`, prompts as token ids) in the same
sitting (some llama.cpp builds answer a random-weight model's text with a
500 "does not match the expected Content-only format" once it holds a split
UTF-8 character: --tokens 1 then, for both servers). Every figure is the
median of --reps runs; the load average is
printed, since other work on shared cores inflates every time.

usage: crew_bench.py --kvpin ./kvpin -m MODEL [-t 2] [--reps 3] [--spec 4000]
                     [--tail 100] [-n 8] [--crowd 32] [--parallel 8]
                     [--tokens 8] [--llama-server PATH]
"""
import argparse
import http.client
import json
import os
import random
import re
import statistics
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "e2e"))
from kvpin_test import Server, launch  # noqa: E402


def post(port, path, body):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=3600)
    c.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    if r.status != 200:
        raise SystemExit("crew_bench: %s answered %d: %s" % (path, r.status, data[:300]))
    return json.loads(data)


def metrics(port):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    c.close()
    out = {}
    for line in text.splitlines():
        f = line.split()
        if len(f) == 2 and not line.startswith("#"):
            out[f[0]] = float(f[1])
    return out


def burst(port, prompts, tokens, llama):
    """Sends every prompt at once; returns (wall s, [responses])."""
    res = [None] * len(prompts)
    errors = []

    def run(k):
        try:
            if llama:
                body = {"prompt": prompts[k], "n_predict": tokens, "temperature": 0, "cache_prompt": True}
                res[k] = post(port, "/completion", body)
            else:
                body = {"prompt": prompts[k], "max_tokens": tokens, "temperature": 0, "ignore_eos": True}
                res[k] = post(port, "/v1/completions", body)
        except BaseException as e:  # SystemExit of post() too: a thread cannot end the run itself
            errors.append(str(e))

    ts = [threading.Thread(target=run, args=(k,)) for k in range(len(prompts))]
    t0 = time.perf_counter()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if errors:
        raise SystemExit("crew_bench: %d of %d requests failed, the first: %s" % (len(errors), len(prompts), errors[0]))
    return time.perf_counter() - t0, res


def crew_prompts(rng, n_vocab, spec, tail, n):
    s = [rng.randrange(3, n_vocab) for _ in range(spec)]
    return [s + [rng.randrange(3, n_vocab) for _ in range(tail)] for _ in range(n)]


def reused(r):
    return r["kvpin_cache"]["reused_tokens"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kvpin", default="./kvpin")
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--spec", type=int, default=4000)
    ap.add_argument("--tail", type=int, default=100)
    ap.add_argument("-n", type=int, default=8)
    ap.add_argument("--crowd", type=int, default=32)
    ap.add_argument("--parallel", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--llama-server", help="llama.cpp's llama-server binary, for the burst side by side")
    a = ap.parse_args()
    rng = random.Random(20261202)
    info = subprocess.run([a.kvpin, "info", "-m", a.model], capture_output=True, text=True).stdout
    m = re.search(r"vocab (\d+)", info)
    n_vocab = int(m.group(1)) if m else 32000
    ctx = a.spec + a.tail + a.tokens + 64
    print("crew_bench: %s, %d threads, --parallel %d, spec %d + tails %d, load average %s" %
          (a.model, a.threads, a.parallel, a.spec, a.tail, " ".join(open("/proc/loadavg").read().split()[:3])))
    srv = Server(None, "--parallel", str(a.parallel), "--ctx", str(ctx), model=a.model, binary=a.kvpin,
                 threads=a.threads, start_seconds=120)
    port = srv.port
    single, walls, crowd_work, crowd_walls, reuse_rows, inflight_rows = [], [], [], [], [], []
    try:
        for _ in range(a.reps):
            one = crew_prompts(rng, n_vocab, a.spec, a.tail, 1)
            single.append(burst(port, one, a.tokens, False)[0])
            ps = crew_prompts(rng, n_vocab, a.spec, a.tail, a.n)
            w, res = burst(port, ps, a.tokens, False)
            walls.append(w)
            reuse_rows.append(sorted(reused(r) for r in res))
            inflight_rows.append(sorted(r["kvpin_cache"].get("inflight_reused_tokens", 0) for r in res))
            if a.crowd == 0:
                continue
            ps = crew_prompts(rng, n_vocab, a.spec, a.tail, a.crowd)
            m0 = metrics(port)
            w, res = burst(port, ps, a.tokens, False)
            m1 = metrics(port)
            crowd_walls.append(w)
            work = (m1["kvpin_prompt_tokens_total"] - m0["kvpin_prompt_tokens_total"]) - \
                   (m1["kvpin_prompt_tokens_cached_total"] - m0["kvpin_prompt_tokens_cached_total"])
            crowd_work.append(work)
    finally:
        srv.stop()
    peer = []
    if a.llama_server:
        p, log, mm = launch([a.llama_server, "-m", a.model, "-t", str(a.threads), "--port", "0", "-np",
                             str(a.parallel), "--kv-unified", "-c", str(a.parallel * ctx)],
                            rb"listening on http://[0-9.]+:(\d+)", 120, stdout_too=True, prefix="crew-bench-")
        port = int(mm.group(1))
        try:
            for _ in range(a.reps):
                ps = crew_prompts(rng, n_vocab, a.spec, a.tail, a.n)
                w, res = burst(port, ps, a.tokens, True)
                peer.append((w, sorted(r.get("tokens_cached", 0) for r in res)))
        finally:
            p.terminate()
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
            os.unlink(log)
    t1 = statistics.median(single)
    ideal = t1 * (a.spec + a.n * a.tail) / (a.spec + a.tail)
    wall = statistics.median(walls)
    print("single cold request (%d tokens): %s s (median %.2f)" % (a.spec + a.tail, " ".join("%.2f" % x for x in single), t1))
    print("burst of %d at once, kvpin: wall %s s (median %.2f)" % (a.n, " ".join("%.2f" % x for x in walls), wall))
    for k, (row, inf) in enumerate(zip(reuse_rows, inflight_rows)):
        print("  run %d: reused tokens per request %s (in flight %s)" % (k + 1, row, inf))
    if peer:
        pw = statistics.median(x[0] for x in peer)
        print("burst of %d at once, llama.cpp server: wall %s s (median %.2f)" %
              (a.n, " ".join("%.2f" % x[0] for x in peer), pw))
        for k, (_, row) in enumerate(peer):
            print("  run %d: cached tokens per request %s" % (k + 1, row))
    else:
        print("llama.cpp server: not run (give --llama-server PATH)")
    cw = statistics.median(crowd_work) if crowd_work else 0
    cap = a.spec + a.crowd * a.tail
    if crowd_work:
        print("crowd of %d at --parallel %d: prompt positions computed %s (median %d) vs spec + %d tails = %d: %.3fx; "
          "wall %s s" % (a.crowd, a.parallel, " ".join("%d" % x for x in crowd_work), cw, a.crowd, cap, cw / cap,
                         " ".join("%.2f" % x for x in crowd_walls)))
    # the first request admitted computes the spec (nothing was cached): the others must reuse it
    least = min(min(r[1:]) for r in reuse_rows) if a.n > 1 else 0
    goals = [
        ("burst wall <= 1.5 x (one spec prefill + tails)", "<= %.2f s" % (1.5 * ideal), "%.2f s" % wall,
         wall <= 1.5 * ideal),
        ("every burst request but the first reuses >= spec - 10", ">= %d" % (a.spec - 10), "%d" % least,
         least >= a.spec - 10),
    ]
    if crowd_work:
        goals.append(("crowd prefill work <= 1.05 x (spec + tails)", "<= %.0f" % (1.05 * cap), "%d" % cw,
                      cw <= 1.05 * cap))
    print()
    print("%-54s %-14s %-12s %s" % ("goal", "target", "measured", "verdict"))
    for g, t, m_, okv in goals:
        print("%-54s %-14s %-12s %s" % (g, t, m_, "PASS" if okv else "FAIL"))


if __name__ == "__main__":
    main()
