#!/usr/bin/env python3
"""What an open dashboard costs the engine (run by `make bench`).

16 concurrent streams decode (kvpin serve -np 16, server_bench.py's
decode_rate: aggregate tokens/s over the window in which all of them
decode), with and without a poller doing what the page does - GET
/v1/cache and GET /v1/cache/events - every --interval seconds (default
0.25, four times the page's own rate). The two modes alternate in one
sitting (ABBA...), --reps runs each; the figure is the median of each
mode and their difference in percent (goal: within 2%), and the time one
poll takes (the HTTP threads' work, none of it on the engine thread but
a short copy of the snapshot under its mutex).

usage: dashboard_bench.py --kvpin ./kvpin -m MODEL [-t 2] [--reps 5]
                          [--tokens 128] [--interval 0.25]
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from server_bench import decode_rate, start, stop  # noqa: E402


def poller(port, interval, halt, count, times):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    while not halt.is_set():
        t0 = time.perf_counter()
        for path in ("/v1/cache", "/v1/cache/events"):
            c.request("GET", path)
            r = c.getresponse()
            r.read()
            assert r.status == 200, (path, r.status)
            count[0] += 1
        times.append(time.perf_counter() - t0)
        halt.wait(interval)
    c.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kvpin", default="./kvpin")
    ap.add_argument("-m", "--model", default="models/stories260K.gguf")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--interval", type=float, default=0.25)
    a = ap.parse_args()
    p, port, log = start(a.kvpin, a.model, a.threads, "-np", str(a.streams))
    try:
        rates, polls = measure(a, port)
    finally:
        stop(p, log)
    report(a, rates, polls)


def measure(a, port):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("GET", "/v1/models")
    n_vocab = json.loads(c.getresponse().read())["data"][0]["meta"]["n_vocab"]
    c.close()
    rng = random.Random(7)
    decode_rate(port, a.streams, a.tokens, n_vocab, rng)  # warm up
    rates = {"closed": [], "open": []}
    polls = [0]
    times = []
    for r in range(a.reps):
        order = ("closed", "open") if r % 2 == 0 else ("open", "closed")
        for mode in order:
            halt = threading.Event()
            th = None
            if mode == "open":
                th = threading.Thread(target=poller, args=(port, a.interval, halt, polls, times))
                th.start()
            rates[mode].append(decode_rate(port, a.streams, a.tokens, n_vocab, rng))
            halt.set()
            if th:
                th.join()
    return rates, (polls[0], statistics.median(times) if times else 0)


def report(a, rates, polls):
    polls, per_poll = polls
    closed, opened = statistics.median(rates["closed"]), statistics.median(rates["open"])
    diff = 100.0 * (opened - closed) / closed
    print("load average: %s" % " ".join("%.2f" % x for x in os.getloadavg()))
    print("dashboard overhead, %d streams x %d tokens, %s, %d threads, %d runs each (ABBA), "
          "page polled every %.2f s (%d requests):" % (a.streams, a.tokens, os.path.basename(a.model), a.threads,
                                                       a.reps, a.interval, polls))
    print("  decode tokens/s, page closed: median %.0f  (runs: %s)" %
          (closed, ", ".join("%.0f" % x for x in rates["closed"])))
    print("  decode tokens/s, page open:   median %.0f  (runs: %s)" %
          (opened, ", ".join("%.0f" % x for x in rates["open"])))
    print("  difference: %+.2f%% (goal: within 2%%)" % diff)
    print("  one poll (GET /v1/cache + /v1/cache/events, HTTP threads) takes %.2f ms at the client: at the page's"
          " rate of one a second that is %.2f%% of one core" % (per_poll * 1e3, per_poll * 1e3 / 10))


if __name__ == "__main__":
    main()
