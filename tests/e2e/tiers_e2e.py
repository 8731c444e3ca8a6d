"""tiers_e2e.py - the disk tier of `kvpin serve` end to end ($KVPIN names
the binary; tests/run_all.sh runs it).

Restart: a ~2,000-token conversation is computed on a server with
--cache-dir; the server is killed with SIGKILL; a new one on the same
directory answers the next turn reusing >= 99% of its prompt from disk,
with the text a server without a prefix cache gives (greedy). The same
directory under --kv-type f32 or another model's weights reuses nothing
and says why at start.

Faults, each on a fresh server over the same directory (so the blocks come
from disk): a truncated record, a flipped K/V byte, a record with the right
key but other tokens: the restore stops at that block under its reason
(truncated, checksum, tokens), the answer is still the cold one; a FIFO
put in place of a record the server indexed is refused without blocking
(io) and replaced by the record. A
--cache-disk-budget smaller than one record writes nothing and counts it.
`kvpin run --prompt-cache --cache-dir` run twice: the second run restores
the first one's blocks and prints what a run without a prefix cache prints.

The restart again on a random 135M-shaped model (release build, for time),
the weights hash kept under --cache-dir when the model's folder refuses it,
and `kvpin doctor --cache-dir` on the directory (the blocks on disk; none
under another KV type's fingerprint, and why).
"""
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
from kvpin_test import Results, Server, tokenize, wait_idle  # noqa: E402

r = Results("e2e_tiers")
B = 16
N_GEN = 8
tmp = tempfile.mkdtemp(prefix="kvpin-tiers-")
cache = os.path.join(tmp, "cache")


def complete(srv, ids):
    st, _, j = srv.post("/v1/completions", {"prompt": ids, "max_tokens": N_GEN, "temperature": 0})
    r.ok(st == 200, "completion: %s %s" % (st, j))
    return j


def disk(srv, check=True):
    st, c = srv.get("/v1/cache")
    if check:
        r.ok(st == 200 and c.get("tiers") and "disk" in c["tiers"], "/v1/cache has tiers.disk: %s" % c.get("tiers"))
    return c["tiers"]["disk"]


def wait_written(srv, blocks, field="blocks"):
    deadline = time.time() + 30
    while time.time() < deadline:
        if disk(srv, False)[field] >= blocks:
            return True
        time.sleep(0.05)
    return False


story = ("User: Tell me a story about Lily and her dog. Assistant: Once upon a time, there was a little girl "
         "named Lily. She had a dog named Max who loved to run in the park. One day they found a big red ball "
         "under a tree, and they played until the sun went down. ")
with_cold = Server(r, "--no-prefix-cache")
ids = tokenize(with_cold, story * 40)
r.ok(len(ids) >= 2000, "the conversation has %d tokens" % len(ids))
p1 = ids[:2000]                                          # 125 whole blocks
p2 = p1 + tokenize(with_cold, " User: And then?", add_special=False)[:8]
cold1 = complete(with_cold, p1)["choices"][0]["text"]
cold2 = complete(with_cold, p2)["choices"][0]["text"]
with_cold.stop()

# turn 1 on A, killed with SIGKILL once its blocks are on disk
a = Server(r, "--cache-dir", cache)
j = complete(a, p1)
r.ok(j["choices"][0]["text"] == cold1, "turn 1 equals the cold run")
r.ok(j["kvpin_cache"]["reused_from"] == {"ram": 0, "disk": 0, "redis": 0}, "turn 1 is cold: %s" % j["kvpin_cache"])
r.ok(wait_written(a, (2000 + N_GEN) // B), "the blocks of turn 1 reach the disk: %s" % disk(a))
a.kill()

# turn 2 on B, same directory
b = Server(r, "--cache-dir", cache, quiet=False)
r.ok("125 blocks" in b.log_text(), "B finds the blocks at start: %s" % b.log_text()[-400:])
j = complete(b, p2)
kc = j["kvpin_cache"]
r.ok(kc["reused_from"]["disk"] >= 0.99 * len(p2), "turn 2 reuses >= 99%% of %d from disk: %s" % (len(p2), kc))
r.ok(kc["reused_tokens"] == kc["reused_from"]["disk"] and kc["reused_from"]["ram"] == 0, "all of it from disk: %s" % kc)
r.ok(kc.get("restore", {}).get("cause") == "restored", "cause restored: %s" % kc.get("restore"))
r.ok(kc.get("cause") == "restored" and kc.get("index_cause") == "cold" and "from the tiers below it (disk %d" %
     kc["reused_from"]["disk"] in kc.get("detail", ""), "kvpin_cache.cause restored, the index's cold beside it: %s" % kc)
r.ok(j["usage"]["prompt_tokens_details"]["cached_tokens"] == kc["reused_tokens"], "usage agrees: %s" % j["usage"])
r.ok(j["choices"][0]["text"] == cold2, "turn 2 equals the cold run: %r vs %r" % (j["choices"][0]["text"], cold2))
d = disk(b)
r.ok(d["hits"] >= 125 and d["failures"] == 0, "/v1/cache disk hits %s failures %s" % (d["hits"], d["failures"]))
st, m = b.request("GET", "/metrics")[0], b.request("GET", "/metrics")[2].decode()
r.ok('kvpin_tier_hits_total{tier="disk"}' in m and "kvpin_tier_restore_seconds_bucket" in m, "/metrics tier lines")
hits = [ln for ln in m.splitlines() if ln.startswith('kvpin_tier_hits_total{tier="disk"}')]
r.ok(hits and int(float(hits[0].split()[1])) == d["hits"], "metrics hits = /v1/cache hits: %s" % hits)
b.stop()

# the same restart on a random 135M-shaped model (30 layers, 576 wide, 3 kv-heads; Q8_0), on the release
# build ./kvpin (make test builds it): under the sanitizers its 2,000-token prefills take minutes each, and
# the bundled model's restart above already runs under them
KVPIN = os.environ.get("KVPIN", "./kvpin")
REL = os.environ.get("KVPIN_RELEASE", "./kvpin")
big = os.path.join(tmp, "smollm2-135m-Q8_0.gguf")
mk = subprocess.run([REL, "mkmodel", "--preset", "smollm2-135m", "--type", "Q8_0", "--tokenizer",
                     "tests/data/vocab/ggml-vocab-starcoder.gguf", "-o", big], capture_output=True, text=True, timeout=600)
r.ok(mk.returncode == 0, "mkmodel 135M: %s" % mk.stderr[-300:])
big_cache = os.path.join(tmp, "cache135")
cold_big = Server(r, "--no-prefix-cache", "-c", "2100", model=big, binary=REL)
bids = tokenize(cold_big, story * 60)[:2000]
bids2 = bids + tokenize(cold_big, " User: And then?", add_special=False)[:8]
big_cold2 = complete(cold_big, bids2)["choices"][0]["text"]
cold_big.stop()
a = Server(r, "--cache-dir", big_cache, "-c", "2100", model=big, binary=REL)
complete(a, bids)
r.ok(wait_written(a, (2000 + N_GEN) // B), "135M: the blocks of turn 1 reach the disk: %s" % disk(a))
a.kill()
b = Server(r, "--cache-dir", big_cache, "-c", "2100", model=big, binary=REL)
j = complete(b, bids2)
kc = j["kvpin_cache"]
r.ok(kc["reused_from"]["disk"] >= 0.99 * len(bids2) and kc["cause"] == "restored",
     "135M: turn 2 reuses >= 99%% of %d from disk: %s" % (len(bids2), kc))
r.ok(j["choices"][0]["text"] == big_cold2, "135M: turn 2 equals the cold run: %r vs %r" % (j["choices"][0]["text"], big_cold2))
b.stop()

# the model's folder does not take the weights hash (here: its cache file's name is a directory):
# the hash is kept under --cache-dir instead, and a restart still restores
ro = os.path.join(tmp, "ro")
os.makedirs(os.path.join(ro, "m.gguf.kvpin-fp"))
shutil.copy("models/stories260K.gguf", os.path.join(ro, "m.gguf"))
ro_cache = os.path.join(tmp, "cache-ro")
for k in range(2):
    srv = Server(r, "--cache-dir", ro_cache, model=os.path.join(ro, "m.gguf"))
    j = complete(srv, p1)
    r.ok(j["choices"][0]["text"] == cold1, "hash under --cache-dir, run %d: the cold answer" % k)
    if k == 1:
        r.ok(j["kvpin_cache"]["reused_from"]["disk"] >= 0.99 * len(p1), "hash under --cache-dir: restored after a "
             "restart: %s" % j["kvpin_cache"])
    else:
        r.ok(wait_written(srv, 2000 // B), "hash under --cache-dir: blocks written")
    srv.stop()
r.ok([x for x in os.listdir(ro_cache) if x.startswith("weights-") and x.endswith(".fp")],
     "the weights hash is kept in --cache-dir: %s" % os.listdir(ro_cache))

# kvpin doctor --cache-dir: the conversation's blocks are on disk (a server's RAM lost them with it);
# under another KV type's fingerprint the directory holds none of them, and it says why
import json  # noqa: E402
KVPIN = os.environ.get("KVPIN", "./kvpin")
log = os.path.join(tmp, "turns.jsonl")
with open(log, "w") as f:
    f.write(json.dumps({"prompt": story * 40}) + "\n" + json.dumps({"prompt": "A new start. " + story}) + "\n")
for args, want in (([], True), (["--kv-type", "f32"], False)):
    dr = subprocess.run([KVPIN, "doctor", "--json", "--cache-dir", cache, *args, log], capture_output=True, text=True,
                        timeout=300)
    rows = [json.loads(x) for x in dr.stdout.splitlines() if x.strip()] if dr.returncode == 0 else []
    r.ok(len(rows) == 2, "doctor --cache-dir %s: two turns: %s %s" % (args, dr.returncode, dr.stderr[-300:]))
    if len(rows) == 2:
        r.ok((rows[0]["on_disk_tokens"] >= 2000) == want and rows[0]["in_redis_tokens"] == 0,
             "doctor %s: turn 1 on disk: %s" % (args, rows[0]["on_disk_tokens"]))
        r.ok(rows[1]["on_disk_tokens"] == 0, "doctor %s: another start has nothing on disk: %s" % (args, rows[1]))
    r.ok(want or "ignored" in dr.stderr and "kv_type F16 (here F32)" in dr.stderr,
         "doctor %s: says why the directory's blocks do not count: %s" % (args, dr.stderr[-300:]))
dr = subprocess.run([KVPIN, "doctor", "--cache-dir", cache, log], capture_output=True, text=True, timeout=300)
r.ok(dr.returncode == 0 and "(evicted from RAM but on disk)" in dr.stdout and "held by the tiers below RAM" in dr.stdout,
     "doctor's text says a server restores turn 1 from disk: %s" % dr.stdout[-600:])

# another KV type, another model on the same directory: nothing reused, and why
for args, why in ((["--kv-type", "f32"], "kv_type F16 (here F32)"), (None, "weights ")):
    if args is None:
        other = os.path.join(tmp, "other.gguf")
        shutil.copy("models/stories260K.gguf", other)
        with open(other, "r+b") as f:  # one byte near the end: the last tensor's data
            f.seek(-3, os.SEEK_END)
            c = f.read(1)
            f.seek(-3, os.SEEK_END)
            f.write(bytes([c[0] ^ 1]))
        srv = Server(r, "--cache-dir", cache, model=other, quiet=False)
    else:
        srv = Server(r, "--cache-dir", cache, *args, quiet=False)
    log = srv.log_text()
    r.ok("ignored" in log and why in log, "%s: the start says why: %s" % (args or "other model", log[-600:]))
    j = complete(srv, p2)
    r.ok(j["kvpin_cache"]["reused_tokens"] == 0, "%s: nothing reused: %s" % (args, j["kvpin_cache"]))
    srv.stop()

# faults in our own fingerprint's folder
fpdirs = [x for x in os.listdir(cache) if len(x) == 32 and open(os.path.join(cache, x, "FINGERPRINT")).read().find("kv_type F16") >= 0
          and os.path.exists(os.path.join(cache, x, "FINGERPRINT"))]


def key_of(n_blocks):
    """The key of block n_blocks - 1 of p1 as kvpin computes it (xxhsum -H2)."""
    import struct
    import subprocess
    key = bytes(16)
    for jb in range(n_blocks):
        msg = key + struct.pack("<%di" % B, *p1[jb * B:(jb + 1) * B])
        path = os.path.join(tmp, "msg")
        open(path, "wb").write(msg)
        out = subprocess.run(["xxhsum", "-H2", path], capture_output=True, text=True).stdout
        key = bytes.fromhex(out.split()[0])
    return key.hex()


ours = None
for x in fpdirs:
    if os.path.exists(os.path.join(cache, x, key_of(1) + ".kvb")):
        ours = os.path.join(cache, x)
r.ok(ours is not None, "the F16 folder holds block 0 under its xxhsum key")


def corrupt(block, how):
    path = os.path.join(ours, key_of(block + 1) + ".kvb")
    data = bytearray(open(path, "rb").read())
    if how == "truncated":
        data = data[:len(data) - 7]
    elif how == "checksum":
        data[len(data) - 100] ^= 0x40
    elif how == "tokens":
        data[96 + 4 * 3] ^= 1  # token 3 of the record; key and checksum untouched
    open(path, "wb").write(bytes(data))


for block, how in ((10, "truncated"), (20, "checksum"), (30, "tokens")):
    corrupt(block, how)
    srv = Server(r, "--cache-dir", ours.rsplit("/", 1)[0])
    j = complete(srv, p2)
    kc = j["kvpin_cache"]
    r.ok(kc["reused_from"]["disk"] == block * B, "%s at block %d: restored up to it: %s" % (how, block, kc))
    r.ok(kc.get("restore", {}).get("cause") == "restore_failed" and kc["restore"]["reason"] == how,
         "%s: cause restore_failed, reason %s: %s" % (how, how, kc.get("restore")))
    r.ok(kc.get("cause") == "restore_failed" and "(%s)" % how in kc.get("detail", ""),
         "%s: kvpin_cache.cause restore_failed with the reason: %s %s" % (how, kc.get("cause"), kc.get("detail")))
    r.ok(j["choices"][0]["text"] == cold2, "%s: the answer is still the cold one" % how)
    d = disk(srv)
    r.ok(d["failures_by_reason"][how] == 1, "%s counted: %s" % (how, d["failures_by_reason"]))
    r.ok(wait_idle(srv) and wait_written(srv, 1, "writes"), "%s: the block is written again" % how)
    size = os.path.getsize(os.path.join(ours, key_of(block + 1) + ".kvb"))
    r.ok(size == 96 + 4 * B + 640 * B, "%s: the record is whole again (%d bytes)" % (how, size))
    srv.stop()

# a FIFO in place of a record the running server indexed: opened without
# blocking, refused as not a regular file (io); the answer is still the
# cold one, and in time (a blocking open would hang the engine thread)
srv = Server(r, "--cache-dir", ours.rsplit("/", 1)[0])
fifo = os.path.join(ours, key_of(40 + 1) + ".kvb")
os.unlink(fifo)
os.mkfifo(fifo)
t0 = time.time()
j = complete(srv, p2)
kc = j["kvpin_cache"]
r.ok(time.time() - t0 < 60 and kc["reused_from"]["disk"] == 40 * B,
     "a FIFO at block 40: restored up to it, no hang: %s" % kc.get("restore"))
r.ok(kc.get("restore", {}).get("reason") == "io", "a FIFO: reason io: %s" % kc.get("restore"))
r.ok(j["choices"][0]["text"] == cold2, "a FIFO: the answer is still the cold one")
r.ok(wait_idle(srv) and wait_written(srv, 1, "writes"), "a FIFO: the block is written again")
r.ok(os.path.isfile(fifo) and not os.path.islink(fifo), "a FIFO: replaced by a regular record")
srv.stop()

# sealed records (--cache-key-file, libsodium's crypto_auth): a keyed server
# seals what it writes (32 bytes more a record) and restores it; a server
# without the key still reads them; a record an attacker changed and whose
# XXH3 checksum they recomputed is refused under the key (mac), as are
# records of an unkeyed store and of another key; the answer stays the cold one
keyed = os.path.join(tmp, "keyed")
keyfile = os.path.join(tmp, "cache.key")
with open(keyfile, "w") as f:
    f.write("00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\n")
otherkey = os.path.join(tmp, "other.key")
with open(otherkey, "wb") as f:
    f.write(bytes(range(32)))
srv = Server(r, "--cache-dir", keyed, "--cache-key-file", keyfile)
r.ok(complete(srv, p1)["choices"][0]["text"] == cold1, "keyed: the cold answer")
r.ok(wait_idle(srv) and wait_written(srv, 2000 // B), "keyed: blocks written")
srv.stop()
kdir = [os.path.join(keyed, x) for x in os.listdir(keyed) if os.path.isdir(os.path.join(keyed, x))][0]
rec5 = os.path.join(kdir, key_of(5 + 1) + ".kvb")
r.ok(os.path.getsize(rec5) == 96 + 4 * B + 640 * B + 32, "keyed: a record carries 32 bytes of MAC: %d" %
     os.path.getsize(rec5))
for args, what in ((["--cache-key-file", keyfile], "the same key"), ([], "no key")):
    srv = Server(r, "--cache-dir", keyed, *args)
    j = complete(srv, p2)
    r.ok(j["kvpin_cache"]["reused_from"]["disk"] >= 124 * B and j["choices"][0]["text"] == cold2,
         "sealed records restored with %s: %s" % (what, j["kvpin_cache"]["reused_from"]))
    srv.stop()
# the attacker's edit: a K/V byte changed, the XXH3-128 of the K/V bytes recomputed
data = bytearray(open(rec5, "rb").read())
kv0, kv1 = 96 + 4 * B, len(data) - 32
data[kv0 + 100] ^= 0x40
open(os.path.join(tmp, "kv"), "wb").write(bytes(data[kv0:kv1]))
out = subprocess.run(["xxhsum", "-H2", os.path.join(tmp, "kv")], capture_output=True, text=True).stdout
data[80:96] = bytes.fromhex(out.split()[0])
open(rec5, "wb").write(bytes(data))
for args, block, what in ((["--cache-key-file", keyfile], 5, "a forged record"),
                          (["--cache-key-file", otherkey], 0, "another key")):
    srv = Server(r, "--cache-dir", keyed, *args)
    j = complete(srv, p2)
    kc = j["kvpin_cache"]
    r.ok(kc["reused_from"]["disk"] == block * B and kc.get("restore", {}).get("reason") == "mac",
         "%s: restored up to block %d, refused as mac: %s" % (what, block, kc.get("restore")))
    r.ok(j["choices"][0]["text"] == cold2, "%s: the answer is the cold one" % what)
    srv.stop()
srv = Server(r, "--cache-dir", ours.rsplit("/", 1)[0], "--cache-key-file", keyfile)
j = complete(srv, p2)
r.ok(j["kvpin_cache"]["reused_from"]["disk"] == 0 and j["kvpin_cache"].get("restore", {}).get("reason") == "mac",
     "an unsealed store under a key: nothing restored (mac): %s" % j["kvpin_cache"].get("restore"))
srv.stop()

# a budget below one record
small = os.path.join(tmp, "small")
srv = Server(r, "--cache-dir", small, "--cache-disk-budget", "1000")
j = complete(srv, p1)
r.ok(j["choices"][0]["text"] == cold1, "tiny budget: the answer is the cold one")
d = disk(srv)
r.ok(d["blocks"] == 0 and d["dropped_over_budget"] >= 125, "tiny budget: nothing written, counted: %s" % d)
srv.stop()

# run --prompt-cache --cache-dir: a second run restores the first one's blocks
KVPIN = os.environ.get("KVPIN", "./kvpin")
text = story * 3
run_dir = os.path.join(tmp, "run")
base = [KVPIN, "run", "-m", "models/stories260K.gguf", "-n", "12", "-t", "1"]
subprocess.run(base + ["--cache-dir", run_dir, "-p", text], capture_output=True, timeout=120)
warm = subprocess.run(base + ["--cache-dir", run_dir, "-p", text + " And"], capture_output=True, text=True, timeout=120)
cold = subprocess.run(base + ["--no-prefix-cache", "-p", text + " And"], capture_output=True, text=True, timeout=120)
r.ok(warm.returncode == 0 and warm.stdout == cold.stdout, "run --cache-dir: the cold answer: %r vs %r" % (warm.stdout, cold.stdout))
r.ok(" tokens restored from disk" in warm.stderr, "run --cache-dir: restored from disk: %s" % warm.stderr[-400:])

shutil.rmtree(tmp)
sys.exit(r.finish())
