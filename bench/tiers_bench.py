"""tiers_bench.py - time to first token of a long prompt restored from the
disk tier and from Redis vs computed, on `kvpin serve` (release build).

    python3 bench/tiers_bench.py [MODEL.gguf] [N_TOKENS]

For each of 3 distinct prompts of N_TOKENS (default 2000) token ids:
computed on a server without a prefix cache; computed on server A (with
--cache-dir and --cache-redis), then, after A is gone, asked of a fresh
server on the same directory (disk) and of a fresh server on the same Redis
without a directory (redis). A request of max_tokens 1 measures the time to
first token, client side. Prints the medians. The page cache is warm (the
records were just written); redis-server runs on a free loopback port.
"""
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
import kvpin_test  # noqa: E402
from kvpin_test import Results, Server  # noqa: E402

model = sys.argv[1] if len(sys.argv) > 1 else kvpin_test.MODEL
n_tok = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
r = Results("tiers_bench")
tmp = tempfile.mkdtemp(prefix="kvpin-tbench-")
s = socket.socket()
s.bind(("127.0.0.1", 0))
rport = s.getsockname()[1]
s.close()
redis = subprocess.Popen(["redis-server", "--port", str(rport), "--bind", "127.0.0.1", "--save", "", "--appendonly",
                          "no", "--dir", tmp], stdout=subprocess.DEVNULL)
time.sleep(0.5)
addr = "127.0.0.1:%d" % rport
prompts = [[1] + [(7 * i + 13 * k + 5) % 400 + 3 for i in range(n_tok - 1)] for k in range(3)]


def ttft(srv, p):
    t0 = time.time()
    st, _, j = srv.post("/v1/completions", {"prompt": p, "max_tokens": 1, "temperature": 0}, timeout=600)
    dt = time.time() - t0
    r.ok(st == 200, "request: %s" % st)
    return dt, j["kvpin_cache"]


def run(args, label, expect):
    srv = Server(r, "-m", model, "-c", str(n_tok + 64), *args)
    times = []
    for p in prompts:
        dt, kc = ttft(srv, p)
        if expect:
            r.ok(kc["reused_tokens"] >= n_tok - 16 and kc["reused_from"][expect] >= n_tok - 17,
                 "%s: reused from %s: %s" % (label, expect, kc["reused_from"]))
        times.append(dt)
    srv.stop()
    return times


cold = run(["--no-prefix-cache"], "computed", None)
a = Server(r, "-m", model, "-c", str(n_tok + 64), "--cache-dir", tmp + "/d", "--cache-redis", addr)
for p in prompts:
    ttft(a, p)
deadline = time.time() + 120
while time.time() < deadline:
    t = a.get("/v1/cache")[1]["tiers"]
    if t["disk"]["writes"] >= 3 * (n_tok // 16) and t["redis"]["writes"] >= 3 * (n_tok // 16):
        break
    time.sleep(0.1)
a.stop()
disk = run(["--cache-dir", tmp + "/d"], "disk", "disk")
red = run(["--cache-redis", addr, "--cache-redis-timeout-ms", "1000"], "redis", "redis")
redis.kill()
redis.wait()
shutil.rmtree(tmp)
for name, v in (("computed", cold), ("disk", disk), ("redis", red)):
    print("%-9s TTFT median of 3: %7.1f ms  (runs: %s)" % (name, 1e3 * statistics.median(v),
                                                         ", ".join("%.1f" % (1e3 * x) for x in v)))
print("disk %.1fx, redis %.1fx faster than computing" % (statistics.median(cold) / statistics.median(disk),
                                                          statistics.median(cold) / statistics.median(red)))
sys.exit(r.finish())
