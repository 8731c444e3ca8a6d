#!/usr/bin/env python3
"""End-to-end tests of `kvpin serve` with a quantized KV cache: the
server's cache and its disk and Redis tiers on q8_0 and q4_0 K/V (and K
and V of different types), which the bundled model (head_dim 8) refuses.

The model: tests/data/models/gen-llama-gqa-f32.gguf (head_dim 32). The
invariant (the oracle) is the one of the F16 tests: cached equals
recomputed. For each KV setting, a server without a prefix cache gives the
greedy answers of a conversation's turns (the first, a second that extends
it, an edit in the middle of the first); a server with its cache must give
the same texts, reusing the shared prefix; a server on a --cache-dir,
killed with SIGKILL, and a new one on the same directory, must restore the
blocks (cause restored, >= 95% from disk) and answer as the cold server; a
second replica on the same Redis restores from it and answers the same
(when redis-server is installed: `make deps` installs it). A directory
written under one KV type restores nothing under another (the fingerprint
names the types).
"""
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kvpin_test import Results, Server, free_port, kill_all, tokenize  # noqa: E402

R = Results("e2e_kvq_server")
MODEL = "tests/data/models/gen-llama-gqa-f32.gguf"
SETTINGS = [("q8_0", ["--kv-type", "q8_0"]), ("q4_0", ["--kv-type", "q4_0"]),
            ("q8_0 K, f16 V", ["--kv-type-k", "q8_0", "--kv-type-v", "f16"])]
N_GEN = 8


def complete(srv, ids):
    st, _, j = srv.post("/v1/completions", {"prompt": ids, "max_tokens": N_GEN, "temperature": 0})
    R.ok(st == 200, "completion: %s %s" % (st, j))
    return j if st == 200 else {"choices": [{"text": None}], "kvpin_cache": {}}


def redis_ping(port):
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=2)
        s.sendall(b"*1\r\n$4\r\nPING\r\n")
        ok = s.recv(16).startswith(b"+PONG")
        s.close()
        return ok
    except OSError:
        return False


def main():
    tmp = tempfile.mkdtemp(prefix="kvpin-kvq-")
    redis = None
    try:
        story = ("Once upon a time there was a little girl named Lily. She had a dog named Max who loved to run "
                 "in the park with her every day after school. ")
        probe = Server(R, "--no-prefix-cache", model=MODEL)
        base = tokenize(probe, story * 12)
        probe.stop()
        p1 = base[:400]
        p2 = p1 + base[400:440]
        p3 = p1[:200] + list(reversed(p1[200:260])) + p1[260:]  # an edit in the middle
        rport = free_port()
        if shutil.which("redis-server"):
            redis = subprocess.Popen(["redis-server", "--port", str(rport), "--bind", "127.0.0.1", "--save", "",
                                      "--appendonly", "no", "--dir", tmp], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
            deadline = time.time() + 10
            while time.time() < deadline and not redis_ping(rport):
                time.sleep(0.05)
        R.ok(redis is not None and redis_ping(rport), "redis-server runs (make deps installs it)")
        for name, args in SETTINGS:
            cold = Server(R, "--no-prefix-cache", *args, model=MODEL)
            want = [complete(cold, p)["choices"][0]["text"] for p in (p1, p2, p3)]
            cold.stop()
            # the server's own cache
            srv = Server(R, *args, model=MODEL)
            got = [complete(srv, p) for p in (p1, p2, p3)]
            R.ok([g["choices"][0]["text"] for g in got] == want, "%s: cached equals recomputed: %s vs %s" %
                 (name, [g["choices"][0]["text"] for g in got], want))
            R.ok(got[1]["kvpin_cache"].get("reused_tokens", 0) >= len(p1) and
                 200 <= got[2]["kvpin_cache"].get("reused_tokens", 0) < len(p1),
                 "%s: the second turn reuses the first, the edit reuses up to it: %s / %s" %
                 (name, got[1]["kvpin_cache"].get("reused_tokens"), got[2]["kvpin_cache"].get("reused_tokens")))
            srv.stop()
            # the disk tier across a SIGKILL
            cache = os.path.join(tmp, "disk-" + name.replace(" ", "_").replace(",", ""))
            a = Server(R, "--cache-dir", cache, *args, model=MODEL)
            complete(a, p1)
            deadline = time.time() + 30
            while time.time() < deadline:
                st, c = a.get("/v1/cache")
                if st == 200 and (c.get("tiers") or {}).get("disk", {}).get("blocks", 0) >= len(p1) // 16:
                    break
                time.sleep(0.1)
            a.kill()
            b = Server(R, "--cache-dir", cache, *args, model=MODEL)
            j = complete(b, p2)
            kc = j["kvpin_cache"]
            R.ok(j["choices"][0]["text"] == want[1] and kc.get("cause") == "restored" and
                 kc.get("reused_from", {}).get("disk", 0) >= 0.95 * len(p1),
                 "%s: a restarted server restores from disk and answers as the cold one: %s %r" %
                 (name, kc, j["choices"][0]["text"]))
            b.stop()
            # another KV type on that directory restores nothing
            other = ["--kv-type", "f16"]
            c2 = Server(R, "--cache-dir", cache, *other, model=MODEL)
            j = complete(c2, p2)
            R.ok(j["kvpin_cache"].get("reused_from", {}).get("disk", 0) == 0,
                 "%s: an f16 server on the directory restores nothing: %s" % (name, j["kvpin_cache"]))
            c2.stop()
            # two replicas on one Redis
            if redis is not None:
                r1 = Server(R, "--cache-redis", "127.0.0.1:%d" % rport, *args, model=MODEL)
                complete(r1, p1)
                time.sleep(1.0)  # the publish is asynchronous
                r2 = Server(R, "--cache-redis", "127.0.0.1:%d" % rport, *args, model=MODEL)
                j = complete(r2, p2)
                R.ok(j["choices"][0]["text"] == want[1] and j["kvpin_cache"].get("reused_from", {}).get("redis", 0) > 0,
                     "%s: a second replica restores from Redis and answers as the cold one: %s" %
                     (name, j["kvpin_cache"]))
                r1.stop()
                r2.stop()
    finally:
        kill_all()
        if redis is not None:
            redis.kill()
            redis.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    return R.finish()


if __name__ == "__main__":
    sys.exit(main())
