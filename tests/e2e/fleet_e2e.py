"""fleet_e2e.py - the Redis tier: a redis-server of its own on a free
loopback port and two `kvpin serve` replicas on it ($KVPIN names the
binary; tests/run_all.sh runs it).

 - a prompt computed on replica A is reused by replica B from Redis
   (cached_tokens >= 99% of the prompt's whole blocks), answers equal the
   answer of a server without a prefix cache (greedy);
 - Redis loses its data (FLUSHALL): the loss is noticed, the replica that
   holds the prompt publishes its blocks again at its next use, and a new
   replica restores them;
 - Redis killed mid-run: both replicas keep answering, correctly; the
   incident is logged once; Redis started again: sharing resumes;
 - a value cut short in Redis is refused (truncated), the answer unchanged;
 - a "Redis" that accepts connections and never answers: requests are
   answered (the tier times out, counted as timeout), nothing is reused.
"""
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
from kvpin_test import Results, Server, free_port, tokenize  # noqa: E402

r = Results("e2e_fleet")
B = 16
N_GEN = 8
tmp = tempfile.mkdtemp(prefix="kvpin-fleet-")


rport = free_port()


def start_redis():
    p = subprocess.Popen(["redis-server", "--port", str(rport), "--bind", "127.0.0.1", "--save", "", "--appendonly",
                          "no", "--dir", tmp], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 10
    while time.time() < deadline:
        try:
            if resp(["PING"]) == b"PONG":
                return p
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("redis-server did not start")


def resp(args):
    """One command to our redis-server, its reply (bulk/status as bytes, int, None)."""
    s = socket.create_connection(("127.0.0.1", rport), timeout=5)
    out = b"*%d\r\n" % len(args)
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out += b"$%d\r\n%s\r\n" % (len(a), a)
    s.sendall(out)
    f = s.makefile("rb")
    line = f.readline()
    kind, rest = line[:1], line[1:-2]
    if kind == b"$":
        n = int(rest)
        val = None if n < 0 else f.read(n + 2)[:-2]
    elif kind == b":":
        val = int(rest)
    else:
        val = rest
    s.close()
    return val


def complete(srv, ids):
    st, _, j = srv.post("/v1/completions", {"prompt": ids, "max_tokens": N_GEN, "temperature": 0})
    r.ok(st == 200, "completion: %s %s" % (st, j))
    return j


def tiers(srv):
    return srv.get("/v1/cache")[1]["tiers"]


def wait_for(cond, seconds=15):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return False


def key_hex(ids, n_blocks):
    key = bytes(16)
    for jb in range(n_blocks):
        path = os.path.join(tmp, "msg")
        open(path, "wb").write(key + struct.pack("<%di" % B, *ids[jb * B:(jb + 1) * B]))
        out = subprocess.run(["xxhsum", "-H2", path], capture_output=True, text=True).stdout
        key = bytes.fromhex(out.split()[0])
    return key.hex()


texts = ["Lily and Max went to the park to play with a big red ball. ",
         "Tom had a little boat and he liked to sail it on the pond. ",
         "The sun was warm and the birds sang in the tall green trees. ",
         "Sue found a shiny stone and showed it to her mom at home. "]
cold = Server(r, "--no-prefix-cache")
prompts = [tokenize(cold, t * 30)[:600] for t in texts]
answers = [complete(cold, p)["choices"][0]["text"] for p in prompts]
cold.stop()

redis = start_redis()
addr = "127.0.0.1:%d" % rport
a = Server(r, "--cache-redis", addr, quiet=False)
b = Server(r, "--cache-redis", addr, quiet=False)
wait_for(lambda: tiers(a)["redis"]["failures"] == 0 and tiers(b)["redis"]["failures"] == 0, 3)


def shared(srv_from, srv_to, i, what):
    p = prompts[i]
    j = complete(srv_from, p)
    r.ok(j["choices"][0]["text"] == answers[i], "%s: A's answer equals the cold one" % what)
    whole = (len(p) - 1) // B
    wait_for(lambda: tiers(srv_from)["redis"]["writes"] >= whole and resp(["EXISTS", "kvpin:%s:%s" % (
        tiers(srv_from)["fingerprint"], key_hex(p, whole))]) == 1)
    j = complete(srv_to, p)
    kc = j["kvpin_cache"]
    r.ok(j["usage"]["prompt_tokens_details"]["cached_tokens"] >= 0.99 * whole * B,
         "%s: B reuses >= 99%% of %d block tokens: %s" % (what, whole * B, kc))
    r.ok(kc["reused_tokens"] == whole * B and kc["reused_from"]["redis"] >= whole * B - 1,
         "%s: from Redis (the BOS token may be in RAM): %s" % (what, kc))
    r.ok(j["choices"][0]["text"] == answers[i], "%s: B's answer equals the cold one" % what)


shared(a, b, 0, "shared")
fp = tiers(a)["fingerprint"]
r.ok(resp(["DBSIZE"]) >= (600 - 1) // B, "the blocks are in Redis: %s" % resp(["DBSIZE"]))
# kvpin doctor --cache-redis sees them: every whole block of prompt 0, nothing of another start
log = os.path.join(tmp, "turns.jsonl")
with open(log, "w") as f:
    f.write(json.dumps({"prompt": texts[0] * 30}) + "\n" + json.dumps({"prompt": "Another start. " + texts[0]}) + "\n")
dr = subprocess.run([os.environ.get("KVPIN", "./kvpin"), "doctor", "--json", "--cache-redis", addr, log],
                    capture_output=True, text=True, timeout=300)
rows = [json.loads(x) for x in dr.stdout.splitlines() if x.strip()] if dr.returncode == 0 else []
r.ok(len(rows) == 2 and rows[0]["in_redis_tokens"] >= (len(prompts[0]) // B) * B and rows[0]["on_disk_tokens"] == 0 and
     rows[1]["in_redis_tokens"] == 0, "doctor --cache-redis: prompt 0's blocks in Redis: %s %s" % (rows, dr.stderr[-300:]))

# Redis loses its data (FLUSHALL; a restart without persistence alike): A, which
# holds prompt 0 in RAM, publishes it again at its next use, and a new
# replica restores it (before, A's set of published keys kept it from ever
# publishing them again, and every other replica computed them cold)
resp(["FLUSHALL"])
r.ok(wait_for(lambda: tiers(a)["redis"]["epochs_lost"] >= 1, 10), "FLUSHALL noticed: %s" % tiers(a)["redis"])
whole0 = (len(prompts[0]) - 1) // B
j = complete(a, prompts[0])
r.ok(j["kvpin_cache"]["reused_from"]["ram"] >= whole0 * B - 1, "A still holds prompt 0: %s" % j["kvpin_cache"])
r.ok(wait_for(lambda: resp(["EXISTS", "kvpin:%s:%s" % (fp, key_hex(prompts[0], whole0))]) == 1),
     "after FLUSHALL, A publishes prompt 0's blocks again")
c = Server(r, "--cache-redis", addr)
time.sleep(1.2)  # its lookup connection is made in the background
j = complete(c, prompts[0])
r.ok(j["kvpin_cache"]["reused_from"]["redis"] >= whole0 * B - 1 and j["choices"][0]["text"] == answers[0],
     "after FLUSHALL, a new replica restores prompt 0 from Redis: %s" % j["kvpin_cache"])
c.stop()

# Redis dies mid-run
redis.kill()
redis.wait()
for srv, name in ((a, "A"), (b, "B")):
    for i in (1, 2):
        t0 = time.time()
        j = complete(srv, prompts[i])
        r.ok(j["choices"][0]["text"] == answers[i], "Redis down: %s answers prompt %d correctly" % (name, i))
        r.ok(time.time() - t0 < 5, "Redis down: %s answers in time" % name)
for srv, name in ((a, "A"), (b, "B")):
    r.ok(srv.log_text().count("computing without the Redis tier") == 1,
         "Redis down: %s logs the incident once:\n%s" % (name, srv.log_text()[-800:]))
r.ok(tiers(b)["redis"]["failures"] >= 1, "Redis down: counted: %s" % tiers(b)["redis"]["failures_by_reason"])

# Redis back: sharing resumes
redis = start_redis()
for srv, name in ((a, "A"), (b, "B")):
    r.ok(wait_for(lambda: "connected again" in srv.log_text(), 10), "Redis back: %s reconnects" % name)
shared(b, a, 3, "after the restart")

# a value cut short
p = prompts[1]
j = complete(a, p)  # A has prompt 1 in RAM; it publishes now that Redis is back
whole = (len(p) - 1) // B
name = "kvpin:%s:%s" % (fp, key_hex(p, 4))
r.ok(wait_for(lambda: resp(["EXISTS", name]) == 1), "prompt 1's block 3 reaches Redis")
val = resp(["GET", name])
resp(["SET", name, val[:len(val) // 2]])
c = Server(r, "--cache-redis", addr)
time.sleep(1.2)  # its lookup connection is made in the background
j = complete(c, p)
kc = j["kvpin_cache"]
r.ok(kc["reused_tokens"] == 3 * B and kc["reused_from"]["redis"] == 3 * B, "cut short at block 3: restored up to it: %s" % kc)
r.ok(kc.get("restore", {}).get("reason") == "truncated", "cut short: reason truncated: %s" % kc.get("restore"))
r.ok(tiers(c)["redis"]["failures_by_reason"]["truncated"] == 1, "cut short: counted")
r.ok(j["choices"][0]["text"] == answers[1], "cut short: the answer is the cold one")
c.stop()

# a server that accepts and never answers
mute = socket.socket()
mute.bind(("127.0.0.1", 0))
mute.listen(16)
held = []
stop = threading.Event()


def accept():
    mute.settimeout(0.2)
    while not stop.is_set():
        try:
            held.append(mute.accept()[0])
        except OSError:
            pass


th = threading.Thread(target=accept)
th.start()
m = Server(r, "--cache-redis", "127.0.0.1:%d" % mute.getsockname()[1], "--cache-redis-timeout-ms", "50", quiet=False)
for i in (0, 2):
    t0 = time.time()
    j = complete(m, prompts[i])
    r.ok(j["choices"][0]["text"] == answers[i] and j["kvpin_cache"]["reused_from"]["redis"] == 0,
         "mute Redis: prompt %d computed: %s" % (i, j["kvpin_cache"]))
    r.ok(time.time() - t0 < 5, "mute Redis: answered in time")
r.ok(wait_for(lambda: tiers(m)["redis"]["failures_by_reason"]["timeout"] >= 1, 5),
     "mute Redis: counted as timeout: %s" % tiers(m)["redis"]["failures_by_reason"])
r.ok("timed out" in m.log_text(), "mute Redis: logged: %s" % m.log_text()[-500:])
m.stop()
stop.set()
th.join()
for s in held:
    s.close()
mute.close()

a.stop()
b.stop()
redis.kill()
redis.wait()
shutil.rmtree(tmp)
sys.exit(r.finish())
