"""tiers_bench.py - time to first token of a long prompt restored from the
disk tier and from Redis vs computed, on `kvpin serve` (release build).

    python3 bench/tiers_bench.py [MODEL.gguf] [N_TOKENS] [N_PROMPTS] [-t T]

N_PROMPTS (default 2) distinct prompts of N_TOKENS (default 20000) token
ids are computed, one after another, on server A, which has both tiers
(--cache-dir and --cache-redis): "computed" is A's time to first token
(the tiers' writes run beside it, off its path). Once every block is
written and A is gone, each prompt is asked of a fresh server on the same
directory without Redis ("disk") and of a fresh server on the same Redis
without a directory ("redis"), each restore checked to reuse every whole
block but the last position's. Before each disk restore the page cache is
dropped (sync; echo 1 > /proc/sys/vm/drop_caches) when this process may,
so the records come from the device; the table says whether it could.
A request of max_tokens 1 measures the time to first token, client side,
after a 4-token request has faulted in the weights (as server A had them). Prints the medians and the ratios; redis-server runs on a
free loopback port.
"""
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "e2e"))
from kvpin_test import Results, Server, free_port  # noqa: E402

argv = [x for x in sys.argv[1:]]
threads = "2"
if "-t" in argv:
    i = argv.index("-t")
    threads = argv[i + 1]
    del argv[i:i + 2]
model = argv[0] if len(argv) > 0 else "build/bench/smollm2-135m-Q8_0.gguf"
n_tok = int(argv[1]) if len(argv) > 1 else 20000
n_prompts = int(argv[2]) if len(argv) > 2 else 2
r = Results("tiers_bench")
tmp = tempfile.mkdtemp(prefix="kvpin-tbench-")
rport = free_port()
redis = subprocess.Popen(["redis-server", "--port", str(rport), "--bind", "127.0.0.1", "--save", "", "--appendonly",
                          "no", "--dir", tmp], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
time.sleep(0.5)
addr = "127.0.0.1:%d" % rport
prompts = [[1] + [(7 * i + 13 * k + 5) % 400 + 3 for i in range(n_tok - 1)] for k in range(n_prompts)]
common = ["-c", str(n_tok + 64), "--kv-budget", "%dM" % 4096]


def drop_page_cache():
    try:
        subprocess.run(["sync"], check=False)
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("1\n")
        return True
    except OSError:
        return False


def ttft(srv, p):
    t0 = time.time()
    st, _, j = srv.post("/v1/completions", {"prompt": p, "max_tokens": 1, "temperature": 0}, timeout=3600)
    dt = time.time() - t0
    r.ok(st == 200, "request: %s" % st)
    return dt, j["kvpin_cache"]


def restore(args, tier):
    times, dropped = [], []
    for p in prompts:
        if tier == "disk":
            dropped.append(drop_page_cache())
        srv = Server(r, *common, *args, model=model, threads=threads)
        ttft(srv, [1, 5, 6, 7])  # the weights' pages and the threads, which a computed prompt also has warm
        dt, kc = ttft(srv, p)
        whole = (n_tok - 1) // 16 * 16
        r.ok(kc["reused_tokens"] >= whole and kc["reused_from"][tier] >= whole - 16,
             "%s: reused from %s: %s" % (tier, tier, kc["reused_from"]))
        times.append(dt)
        srv.stop()
    return times, dropped


try:
    a = Server(r, *common, "--cache-dir", tmp + "/d", "--cache-redis", addr, "--cache-redis-timeout-ms", "2000",
               model=model, threads=threads)
    cold = [ttft(a, p)[0] for p in prompts]
    deadline = time.time() + 600
    want = n_prompts * (n_tok // 16)
    while time.time() < deadline:
        t = a.get("/v1/cache")[1]["tiers"]
        if t["disk"]["writes"] >= want and t["redis"]["writes"] >= want:
            break
        time.sleep(0.2)
    r.ok(t["disk"]["writes"] >= want and t["redis"]["writes"] >= want, "every block written: %s" % t)
    a.stop()
    disk, dropped = restore(["--cache-dir", tmp + "/d"], "disk")
    red, _ = restore(["--cache-redis", addr, "--cache-redis-timeout-ms", "2000"], "redis")
finally:
    redis.kill()
    redis.wait()
    shutil.rmtree(tmp)
print("model %s, a %d-token prompt, %d prompts, -t %s; page cache dropped before the disk restores: %s"
      % (os.path.basename(model), n_tok, n_prompts, threads, "yes" if all(dropped) else "no (not permitted)"))
print("| | TTFT median | runs | vs computed |")
print("|---|---|---|---|")
for name, v in (("computed", cold), ("disk", disk), ("redis", red)):
    print("| %s | %.3f s | %s | %s |" % (name, statistics.median(v), ", ".join("%.3f" % x for x in v),
                                        "1" if name == "computed" else "%.1fx faster" %
                                        (statistics.median(cold) / statistics.median(v))))
sys.exit(r.finish())
