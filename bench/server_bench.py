#!/usr/bin/env python3
"""kvpin serve benchmarks (issue goals), run by `make bench`:

  1 aggregate decode throughput of 8 concurrent streams vs 1 stream
    (goal >= 4x), each stream max_tokens tokens after a short prompt;
  2 server overhead per streamed token: decode time per token through HTTP
    (one stream, client-side timestamps) vs `kvpin bench` tgN in-process on
    the same model and threads (goal < 2% of the decode step);
  3 agent loop through HTTP: the loop of bench/bench_prefix.c (T turns, each
    = the previous prompt + its answer + a new tail, growing by G tokens a
    turn; prompts sent as token ids, the answer's ids from
    return_token_ids), time to first token of the warm turns
    vs the same loop in-process (bench_prefix's table, given with --prefix
    FILE) (goal: within 10%).

Every figure is the median of --reps runs; the machine's load average is
printed since other work on the shared cores inflates every time.

usage: server_bench.py --kvpin ./kvpin -m MODEL [-t 2] [--reps 3] [--quick]
                       [--prefix build/bench/prefix.txt]
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
from kvpin_test import Server  # noqa: E402


def stream(port, body, stamps):
    """Streams a completion, appending (time, n_tokens_so_far) at each chunk
    that carries text; returns (t_sent, t_headers, usage)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=3600)
    t0 = time.perf_counter()
    c.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    th = time.perf_counter()
    assert r.status == 200, r.read()
    buf, usage = b"", None
    while True:
        chunk = r.read1(65536)
        if not chunk:
            break
        now = time.perf_counter()
        buf += chunk
        while b"\n\n" in buf:
            ev, buf = buf.split(b"\n\n", 1)
            if not ev.startswith(b"data: ") or ev == b"data: [DONE]":
                continue
            j = json.loads(ev[6:])
            if j.get("usage"):
                usage = j["usage"]
            elif j.get("choices") and j["choices"][0]["text"]:
                stamps.append(now)
    c.close()
    return t0, th, usage


def decode_rate(port, n_streams, max_tokens, n_vocab, rng):
    """Aggregate decode tokens/s over the window in which all streams decode."""
    prompts = [[1] + [rng.randrange(3, n_vocab) for _ in range(15)] for _ in range(n_streams)]
    stamps = [[] for _ in range(n_streams)]
    usage = [None] * n_streams

    def run(k):
        body = {"prompt": prompts[k], "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0,
                "stream": True, "stream_options": {"include_usage": True}}
        usage[k] = stream(port, body, stamps[k])[2]

    ts = [threading.Thread(target=run, args=(k,)) for k in range(n_streams)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    # the window: from the last stream's second chunk to the first stream's last chunk
    lo = max(s[1] for s in stamps)
    hi = min(s[-1] for s in stamps)
    if hi <= lo:
        raise SystemExit("server_bench: streams did not overlap; raise max_tokens")
    # tokens per chunk: each chunk holds what was released since the last one;
    # count chunks in the window, scaled by completion_tokens / chunks per stream
    total = 0.0
    for s, u in zip(stamps, usage):
        per_chunk = u["completion_tokens"] / len(s)
        total += per_chunk * sum(1 for t in s if lo < t <= hi)
    return total / (hi - lo)


def inproc_tg(kvpin, model, threads, n, reps):
    out = subprocess.run([kvpin, "bench", "-m", model, "-p", "0", "-n", str(n), "-r", str(reps), "-t", str(threads),
                          "--json"], capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        j = json.loads(line)
        if j["test"] == "tg%d" % n:
            return j["tps_median"]
    raise SystemExit("server_bench: no tg result from kvpin bench")


def agent_loop(port, n_vocab, n_final, turns, vol, rng):
    """bench_prefix's agent loop through HTTP; returns per-turn TTFT (s) and cached tokens."""
    grow = n_final // turns
    ans = grow - vol
    prompt = [rng.randrange(3, n_vocab) for _ in range(grow)]
    ttfts, cached = [], []
    for i in range(turns):
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=3600)
        # the last turn only needs its first token
        body = {"prompt": prompt, "max_tokens": ans if i + 1 < turns else 1, "ignore_eos": True, "temperature": 0,
                "stream": True, "stream_options": {"include_usage": True}, "return_token_ids": True}
        t0 = time.perf_counter()
        c.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
        r = c.getresponse()  # headers leave once the first token is sampled
        ttfts.append(time.perf_counter() - t0)
        data = r.read()
        c.close()
        u = [json.loads(l[6:]) for l in data.split(b"\n\n") if l.startswith(b"data: {")]
        cached.append(u[-1]["usage"]["prompt_tokens_details"]["cached_tokens"])
        last = [e["choices"][0] for e in u if e["choices"] and "token_ids" in e["choices"][0]][0]
        prompt = last["prompt_token_ids"] + last["token_ids"] + [rng.randrange(3, n_vocab) for _ in range(vol)]
    return ttfts, cached


def prefix_ttfts(path):
    """Per-turn TTFT (s) of section 1 of bench_prefix's output."""
    rows, on = [], False
    for line in open(path):
        if line.startswith("== 1."):
            on = True
            continue
        if on and line.startswith("=="):
            break
        f = line.split()
        if on and len(f) == 6 and f[0].isdigit():
            rows.append(float(f[5]) / 1e3)
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kvpin", default="./kvpin")
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--prefix", help="bench_prefix output of the same model and sizes")
    a = ap.parse_args()
    rng = random.Random(20261129)
    info = subprocess.run([a.kvpin, "info", "-m", a.model], capture_output=True, text=True).stdout
    m = re.search(r"vocab (\d+)", info)
    n_vocab = int(m.group(1)) if m else 32000
    load = open("/proc/loadavg").read().split()[:3]
    print("server_bench: %s, %d threads, load average %s" % (a.model, a.threads, " ".join(load)))
    goals = []

    srv = Server(None, "--parallel", "8", "--ctx", "4096", model=a.model, binary=a.kvpin, threads=a.threads,
                 start_seconds=60)
    try:
        one = [decode_rate(srv.port, 1, a.tokens, n_vocab, rng) for _ in range(a.reps)]
        eight = [decode_rate(srv.port, 8, a.tokens, n_vocab, rng) for _ in range(a.reps)]
    finally:
        srv.stop()
    r1, r8 = statistics.median(one), statistics.median(eight)
    print("decode, 1 stream : %s tok/s (median %.1f)" % (" ".join("%.1f" % x for x in one), r1))
    print("decode, 8 streams: %s tok/s aggregate (median %.1f) = %.2f x one stream" %
          (" ".join("%.1f" % x for x in eight), r8, r8 / r1))
    goals.append(("8 streams aggregate decode vs 1 stream", ">= 4x", "%.2fx" % (r8 / r1), r8 / r1 >= 4))

    tg = inproc_tg(a.kvpin, a.model, a.threads, a.tokens, a.reps)
    over = (1 / r1 - 1 / tg) / (1 / tg) * 100
    print("decode in-process (kvpin bench tg%d): %.1f tok/s; through HTTP %.1f tok/s: %+.1f%% per token" %
          (a.tokens, tg, r1, over))
    goals.append(("server overhead per streamed token", "< 2% of a decode step", "%+.1f%%" % over, over < 2))

    div = 10 if a.quick else 1
    n_final, turns, vol = 20000 // div, 20, 200 // div
    srv = Server(None, "--parallel", "1", "--ctx", str(n_final + 64), "--prefill-chunk", "256", model=a.model,
                 binary=a.kvpin, threads=a.threads, start_seconds=60)
    try:
        ttft, cached = agent_loop(srv.port, n_vocab, n_final, turns, vol, rng)
    finally:
        srv.stop()
    print("agent loop through HTTP (%d turns to %d tokens): TTFT ms per turn: %s" %
          (turns, n_final, " ".join("%.0f" % (t * 1e3) for t in ttft)))
    print("  cached_tokens per turn: %s" % " ".join(str(c) for c in cached))
    warm = statistics.median(ttft[-5:])
    if a.prefix and os.path.exists(a.prefix):
        ref = prefix_ttfts(a.prefix)
        if len(ref) == turns:
            rw = statistics.median(ref[-5:])
            d = (warm / rw - 1) * 100
            print("  warm TTFT (median of the last 5 turns): HTTP %.1f ms vs in-process %.1f ms: %+.1f%%" %
                  (warm * 1e3, rw * 1e3, d))
            goals.append(("agent loop warm TTFT, HTTP vs in-process", "within 10%", "%+.1f%%" % d, d <= 10))
        else:
            print("  (no in-process agent loop of the same size in %s)" % a.prefix)
    print()
    print("%-44s %-24s %-12s %s" % ("goal", "target", "measured", "verdict"))
    for g, t, m_, okv in goals:
        print("%-44s %-24s %-12s %s" % (g, t, m_, "PASS" if okv else "FAIL"))


if __name__ == "__main__":
    main()
