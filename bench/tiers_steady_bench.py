#!/usr/bin/env python3
"""tiers_steady_bench.py - prefill and decode speed of `kvpin serve` with the
tiers below RAM on (--cache-dir and --cache-redis, both writing every
finished sequence's blocks) vs off, in steady state (the issue's goal:
within 2%, the writers being off the hot path).

    python3 bench/tiers_steady_bench.py [--kvpin ./kvpin] [-m MODEL] [-t 2]
                                        [--rounds 6] [--prompt 512] [--gen 64]

Two servers run side by side on the same model and threads: "off" (RAM
only) and "on" (a disk tier in a scratch folder and a Redis tier on a
redis-server of the bench's own, loopback). A round sends each server, in
alternating order, one request of --prompt fresh random token ids (never
cached: every prompt is computed, and every one of its blocks is then
written to disk and published to Redis) with --gen streamed tokens
(ignore_eos). Prefill speed is prompt tokens / time to first token;
decode speed is tokens after the first / time from the first to the last,
client side. The figure per round is the ratio on/off of the two requests
of that round, which ran back to back, so a shared machine's drift
cancels; the table gives the median of the rounds' ratios and each side's
median speed.
"""
import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(__file__))
from server_bench import stream  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "e2e"))
from kvpin_test import Server, free_port  # noqa: E402


def one(port, n_prompt, n_gen, n_vocab, rng):
    prompt = [1] + [rng.randrange(3, n_vocab) for _ in range(n_prompt - 1)]
    stamps = []
    t0, _, usage = stream(port, {"prompt": prompt, "max_tokens": n_gen, "temperature": 0, "ignore_eos": True,
                                 "stream": True, "stream_options": {"include_usage": True}}, stamps)
    assert usage and usage["completion_tokens"] == n_gen and len(stamps) >= 2, usage
    return n_prompt / (stamps[0] - t0), (len(stamps) - 1) / (stamps[-1] - stamps[0])


def cpu_seconds(pid, threads=None):
    """CPU time (user + system) of process pid, or of its threads whose name
    (/proc/PID/task/TID/comm) is in threads."""
    tick = os.sysconf("SC_CLK_TCK")
    if threads is None:
        with open("/proc/%d/stat" % pid) as f:
            v = f.read().rsplit(")", 1)[1].split()
        return (int(v[11]) + int(v[12])) / tick
    total = 0.0
    for tid in os.listdir("/proc/%d/task" % pid):
        try:
            with open("/proc/%d/task/%s/comm" % (pid, tid)) as f:
                if f.read().strip() not in threads:
                    continue
            with open("/proc/%d/task/%s/stat" % (pid, tid)) as f:
                v = f.read().rsplit(")", 1)[1].split()
            total += (int(v[11]) + int(v[12])) / tick
        except OSError:
            pass
    return total


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kvpin", default="./kvpin")
    ap.add_argument("-m", "--model", default="build/bench/smollm2-135m-Q8_0.gguf")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--gen", type=int, default=64)
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="kvpin-steady-")
    rport = free_port()
    redis = subprocess.Popen(["redis-server", "--port", str(rport), "--bind", "127.0.0.1", "--save", "",
                              "--appendonly", "no", "--dir", tmp], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    time.sleep(0.5)
    off = Server(None, model=a.model, binary=a.kvpin, threads=a.threads, start_seconds=60)
    on = Server(None, "--cache-dir", os.path.join(tmp, "d"), "--cache-redis", "127.0.0.1:%d" % rport,
                model=a.model, binary=a.kvpin, threads=a.threads, start_seconds=60)
    rng = random.Random(7)
    n_vocab = 500  # ids 3..499 exist in every vocabulary; 499^15 first blocks: none repeats
    try:
        run(a, off, on, n_vocab, rng, redis.pid)
    finally:
        on.stop()
        off.stop()
        redis.kill()
        redis.wait()
        shutil.rmtree(tmp)


def run(a, off, on, n_vocab, rng, redis_pid):
    one(off.port, a.prompt, a.gen, n_vocab, rng)  # warm-up: page faults, thread start
    one(on.port, a.prompt, a.gen, n_vocab, rng)
    time.sleep(1)
    cpu0 = (cpu_seconds(on.p.pid), cpu_seconds(on.p.pid, ("kvpin-disk", "kvpin-redis")), cpu_seconds(redis_pid))
    pp = {"off": [], "on": []}
    tg = {"off": [], "on": []}
    rp, rt = [], []
    for k in range(a.rounds):
        order = (("off", off), ("on", on)) if k % 2 == 0 else (("on", on), ("off", off))
        got = {}
        for name, srv in order:
            got[name] = one(srv.port, a.prompt, a.gen, n_vocab, rng)
            pp[name].append(got[name][0])
            tg[name].append(got[name][1])
        rp.append(got["on"][0] / got["off"][0])
        rt.append(got["on"][1] / got["off"][1])
    time.sleep(1)
    cpu1 = (cpu_seconds(on.p.pid), cpu_seconds(on.p.pid, ("kvpin-disk", "kvpin-redis")), cpu_seconds(redis_pid))
    srv, wr, rds = (cpu1[i] - cpu0[i] for i in range(3))
    with urllib.request.urlopen("http://127.0.0.1:%d/v1/cache" % on.port) as f:
        t = json.load(f)["tiers"]
    print("the tiers of \"on\": disk %d writes, %d dropped; redis %d writes, %d dropped" % (
        t["disk"]["writes"], t["disk"]["dropped_queue_full"], t["redis"]["writes"], t["redis"]["dropped_queue_full"]))
    print("CPU of \"on\" over the rounds: %.2f s in all, %.2f s (%.1f%%) in its tier writer threads (kvpin-disk, "
          "kvpin-redis); redis-server: %.2f s (%.1f%% of it)" % (srv, wr, 100 * wr / srv if srv else 0, rds,
                                                                  100 * rds / srv if srv else 0))
    print("tiers on (disk + Redis, every block written) vs off: %d rounds of a %d-token prompt + %d tokens, -t %d"
          % (a.rounds, a.prompt, a.gen, a.threads))
    print("| | off t/s (median) | on t/s (median) | on/off (median of the rounds' ratios) |")
    print("|---|---|---|---|")
    for name, d, r in (("prefill", pp, rp), ("decode", tg, rt)):
        print("| %s | %.1f | %.1f | %.3f (%s) |" % (name, statistics.median(d["off"]), statistics.median(d["on"]),
                                                   statistics.median(r), ", ".join("%.3f" % x for x in r)))


if __name__ == "__main__":
    main()
