#!/usr/bin/env python3
"""What an open dashboard costs the engine (run by `make bench`).

16 concurrent streams decode (kvpin serve -np 16, server_bench.py's
decode_rate: aggregate tokens/s over the window in which all of them
decode), with and without a poller doing what the page does - GET
/v1/cache and GET /v1/cache/events - every --interval seconds (default
1, the page's own rate). The two modes alternate in one sitting
(ABBA...), --reps runs each; the figure is the median of each mode and
their difference in percent, and the median of the ratios of the runs
that ran back to back (goal: within 2%).

On a shared machine that difference is mostly noise, so the bench also
measures what a poll costs directly: after the runs (the tree and the
history full), --cpu-polls polls against the idle server, and the
server process's CPU time (utime + stime of /proc/PID/stat) they took,
per poll. That CPU is the HTTP threads' (none of it is the engine
thread's but a short copy of the snapshot under its mutex), so at the
page's rate it bounds what the page can take from decoding: the CPU per
second of polling over the -t cores the engine computes on.

usage: dashboard_bench.py --kvpin ./kvpin -m MODEL [-t 2] [--reps 5]
                          [--tokens 128] [--interval 1] [--cpu-polls 200]
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
from server_bench import decode_rate  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "e2e"))
from kvpin_test import Server  # noqa: E402


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
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--cpu-polls", type=int, default=200)
    a = ap.parse_args()
    srv = Server(None, "-np", str(a.streams), model=a.model, binary=a.kvpin, threads=a.threads, start_seconds=60)
    try:
        rates, polls = measure(a, srv.port)
        cpu = poll_cpu(srv.p.pid, srv.port, a.cpu_polls)
    finally:
        srv.stop()
    report(a, rates, polls, cpu)


def cpu_seconds(pid):
    """utime + stime of the whole process, in seconds (proc(5))."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def poll_cpu(pid, port, n):
    """Server CPU seconds per poll (both GETs), polling the idle server n times."""
    time.sleep(0.5)  # the last requests' ends published
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    idle0 = cpu_seconds(pid)
    time.sleep(1.0)
    idle = cpu_seconds(pid) - idle0  # what the idle server burns in a second (timers, none expected)
    t0 = cpu_seconds(pid)
    w0 = time.perf_counter()
    for _ in range(n):
        for path in ("/v1/cache", "/v1/cache/events"):
            c.request("GET", path)
            r = c.getresponse()
            r.read()
            assert r.status == 200, (path, r.status)
    wall = time.perf_counter() - w0
    used = cpu_seconds(pid) - t0 - idle * wall
    c.close()
    return max(used, 0.0) / n


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


def report(a, rates, polls, cpu):
    polls, per_poll = polls
    closed, opened = statistics.median(rates["closed"]), statistics.median(rates["open"])
    diff = 100.0 * (opened - closed) / closed
    # each ABBA pair ran back to back: their ratio cancels the drift of a shared machine
    pairs = [o / c for c, o in zip(rates["closed"], rates["open"])]
    paired = 100.0 * (statistics.median(pairs) - 1.0)
    print("load average: %s" % " ".join("%.2f" % x for x in os.getloadavg()))
    print("dashboard overhead, %d streams x %d tokens, %s, %d threads, %d runs each (ABBA), "
          "page polled every %.2f s (%d requests):" % (a.streams, a.tokens, os.path.basename(a.model), a.threads,
                                                       a.reps, a.interval, polls))
    print("  decode tokens/s, page closed: median %.0f  (runs: %s)" %
          (closed, ", ".join("%.0f" % x for x in rates["closed"])))
    print("  decode tokens/s, page open:   median %.0f  (runs: %s)" %
          (opened, ", ".join("%.0f" % x for x in rates["open"])))
    print("  difference of the medians: %+.2f%%; median of the %d paired ratios open/closed: %+.2f%% "
          "(goal: within 2%%)" % (diff, len(pairs), paired))
    print("  one poll (GET /v1/cache + /v1/cache/events) takes %.2f ms at the client while the streams decode" %
          (per_poll * 1e3))
    print("  server CPU per poll (%d polls of the idle server, /proc/PID/stat): %.3f ms; one poll every %.2f s takes"
          " %.3f%% of the %d cores the engine computes on" % (a.cpu_polls, cpu * 1e3, a.interval,
                                                             100.0 * cpu / a.interval / a.threads, a.threads))


if __name__ == "__main__":
    main()
