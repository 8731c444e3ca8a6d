#!/usr/bin/env python3
"""qwen35_e2e.py - kvpin serve on a qwen35 model (gated delta-net layers
with a recurrent state, tests/data/models/gen-qwen35-f32.gguf) and on a
qwen35moe one (the same layers with routed experts and a shared expert,
gen-qwen35moe-f32.gguf): a two-turn chat through /v1/chat/completions with
the cache report, resumed from the prefix cache's state snapshots
(docs/state-checkpoints.md).

Oracle: a second server with --no-prefix-cache (every prompt computed in
full). Turn 1, turn 2 (turn 1 with its answer and a new user message) and
an edit in the middle of turn 1's user text give the same greedy answers
(token ids) from both servers. The cached server's reports: turn 2 reuses
more than turn 1's prompt (it resumes at a snapshot), and on every report
reused_tokens + state_recomputed_tokens is where the prompt matched the
cache (at most --state-every before it); the edit resumes at a snapshot
before the edit, its cause state_checkpoint when it recomputed matched
tokens. /v1/cache bills the snapshots.

Snapshots on disk (--cache-dir): a server answers turn 1 and is killed
once its blocks and state snapshots are written; a new server on the same
directory answers turn 2 with the uncached server's tokens, its report
reusing from disk (at least turn 1's prompt less --state-every, nothing
from RAM), and /v1/cache's tiers.disk counts the snapshots and the restore.
`kvpin doctor --cache-dir` on a prompt that extends a completion the
server wrote says where a server resumes (a verified snapshot on disk at
or past the completion's prompt less --state-every); once every snapshot
file is damaged, it names the refusal (checksum) and resumes earlier.
"""
import os
import shutil
import sys
import tempfile
import time

from kvpin_test import KVPIN, Results, Server, kill_all

MODELS = ("tests/data/models/gen-qwen35-f32.gguf", "tests/data/models/gen-qwen35moe-f32.gguf")
EVERY = 32
r = Results("qwen35_e2e")


def chat(srv, messages):
    st, _, j = srv.post("/v1/chat/completions", {"messages": messages, "max_tokens": 8, "temperature": 0,
                                                 "return_token_ids": True})
    r.ok(st == 200, "chat: %s %r" % (st, j))
    return j if st == 200 else None


def same(a, b, what):
    if a and b:
        r.ok(a["choices"][0]["token_ids"] == b["choices"][0]["token_ids"],
             "%s: cached %r, uncached %r" % (what, a["choices"][0]["token_ids"], b["choices"][0]["token_ids"]))


def consistent(j, what):
    """reused + state_recomputed is the match; the snapshot at most EVERY before it."""
    c = j["kvpin_cache"]
    r.ok("state_recomputed_tokens" in c, "%s: the report has state_recomputed_tokens: %r" % (what, c))
    rec = c.get("state_recomputed_tokens", 0)
    match = c["diverged_at_token"] if c["diverged_at_token"] < j["usage"]["prompt_tokens"] else \
        j["usage"]["prompt_tokens"] - 1
    r.ok(c["reused_tokens"] + rec == match and rec < EVERY,
         "%s: reused %d + recomputed %d, matched %d: %r" % (what, c["reused_tokens"], rec, match, c))
    r.ok(c["reused_tokens"] + c["computed_tokens"] == j["usage"]["prompt_tokens"], "%s: counts add up" % what)
    if rec:
        r.ok(c["cause"] == "state_checkpoint", "%s: cut at a snapshot: cause %r" % (what, c["cause"]))
    return c


def main(model):
    print("  %s" % model)
    cached = Server(r, "--ctx", "512", "--chat-template", "chatml", "--state-every", str(EVERY), model=model)
    plain = Server(r, "--ctx", "512", "--chat-template", "chatml", "--no-prefix-cache", model=model)
    try:
        story = ("Lily and Tom went to the park. They saw a big dog and a small cat. The dog ran after "
                 "the ball and the cat sat in the sun. Tom laughed and Lily clapped her hands.")
        first = [{"role": "system", "content": "You tell short stories about a park."},
                 {"role": "user", "content": story}]
        a, aref = chat(cached, first), chat(plain, first)
        same(a, aref, "turn 1")
        if not (a and aref):
            return
        n1 = a["usage"]["prompt_tokens"]
        second = first + [{"role": "assistant", "content": a["choices"][0]["message"]["content"]},
                          {"role": "user", "content": "And then the dog came back with the ball."}]
        b, bref = chat(cached, second), chat(plain, second)
        same(b, bref, "turn 2")
        if b and bref:
            c = consistent(b, "turn 2")
            r.ok(c["reused_tokens"] >= n1 - EVERY and c["reused_tokens"] > 0,
                 "turn 2 resumes near turn 1's end (%d tokens): %r" % (n1, c))
            r.ok(bref["kvpin_cache"]["reused_tokens"] == 0, "no cache: %r" % bref["kvpin_cache"])
            print("  turn 2: %d prompt tokens, %d reused, %d state-recomputed (turn 1: %d)" % (
                b["usage"]["prompt_tokens"], c["reused_tokens"], c.get("state_recomputed_tokens", 0), n1))
        edited = [first[0], {"role": "user", "content": story.replace("sat in the sun", "sat in the shade")}]
        d, dref = chat(cached, edited), chat(plain, edited)
        same(d, dref, "edit")
        if d and dref:
            c = consistent(d, "edit")
            print("  edit: diverged at %d, %d reused, %d state-recomputed, cause %s" % (
                c["diverged_at_token"], c["reused_tokens"], c.get("state_recomputed_tokens", 0), c["cause"]))
        st, cache = cached.get("/v1/cache")
        r.ok(st == 200, "/v1/cache: %s" % st)
        kv = cache.get("kv", {}) if st == 200 else {}
        r.ok(kv.get("state_snapshots", 0) > 0 and kv.get("state_snapshot_bytes", 0) > 0,
             "/v1/cache bills the snapshots: %r" % {k: v for k, v in kv.items() if "state" in k})
        if b and bref:
            restart(model, first, second, n1, bref)
    finally:
        for s in (cached, plain):
            if s in Server.running:
                s.stop()


def disk_tier(srv):
    st, c = srv.get("/v1/cache")
    return c.get("tiers", {}).get("disk", {}) if st == 200 and c.get("tiers") else {}


def doctor(model, cache_dir, prompt, n_text):
    """kvpin doctor --cache-dir on a prompt extending a written completion; then on damaged snapshots."""
    import json
    import subprocess
    log = os.path.join(cache_dir, "turns.jsonl")
    with open(log, "w") as f:
        f.write(json.dumps({"prompt": prompt}) + "\n")

    def run():
        dr = subprocess.run([KVPIN, "doctor", "--json", "-m", model, "--cache-dir", cache_dir, log],
                            capture_output=True, text=True, timeout=300)
        rows = [json.loads(x) for x in dr.stdout.splitlines() if x.strip()] if dr.returncode == 0 else []
        r.ok(len(rows) == 1, "doctor: one row: %s %s" % (dr.returncode, dr.stderr[-300:]))
        return rows[0] if rows else {}
    row = run()
    at = row.get("tier_state_resume_token", 0)
    r.ok(at >= n_text - EVERY and at > 0 and row.get("tier_state_from") == "disk" and
         row.get("tier_state_refused_at") == 0, "doctor: resumes at a verified snapshot (prompt %d): %r" % (n_text, row))
    damaged = 0
    for root, _, files in os.walk(cache_dir):
        for name in files:
            if name.endswith(".kvs"):
                with open(os.path.join(root, name), "r+b") as f:
                    f.seek(-200, os.SEEK_END)
                    f.write(b"\x40" * 64)
                damaged += 1
    r.ok(damaged >= 3, "damaged %d snapshot files" % damaged)
    row = run()
    r.ok(row.get("tier_state_refused_at", 0) >= at and row.get("tier_state_refused_reason") == "checksum" and
         row.get("tier_state_resume_token", -1) == 0,
         "doctor: a damaged snapshot is refused (checksum), none is used: %r" % row)


def restart(model, first, second, n1, bref):
    """Turn 1 on a server with --cache-dir, killed; turn 2 on a new one."""
    tmp = tempfile.mkdtemp(prefix="kvpin-qwen35-")
    args = ("--ctx", "512", "--chat-template", "chatml", "--state-every", str(EVERY), "--cache-dir", tmp)
    try:
        a = Server(r, *args, model=model)
        chat(a, first)
        deadline = time.time() + 30
        while time.time() < deadline and disk_tier(a).get("state_snapshots", 0) < 2:
            time.sleep(0.05)
        d = disk_tier(a)
        r.ok(d.get("state_snapshots", 0) >= 2 and d.get("state_snapshot_bytes", 0) > 0 and
             d.get("bytes", 0) > d.get("state_snapshot_bytes", 0),
             "turn 1's snapshots (prompt end, answer end) reach the disk, in its bytes: %r" % d)
        a.kill()
        b = Server(r, *args, model=model)
        j = chat(b, second)
        same(j, bref, "turn 2 after a restart on --cache-dir")
        if j:
            c = j["kvpin_cache"]
            r.ok(c["reused_from"]["disk"] >= n1 - EVERY and c["reused_from"]["ram"] == 0 and
                 c["reused_tokens"] == c["reused_from"]["disk"],
                 "turn 2 resumes from disk near turn 1's end (%d tokens): %r" % (n1, c))
            print("  restart: turn 2 reused %d tokens from disk, %d state-recomputed" % (
                c["reused_from"]["disk"], c.get("state_recomputed_tokens", 0)))
        st, cache = b.get("/v1/cache")
        t = cache.get("tiers", {}) if st == 200 else {}
        r.ok(t.get("state_restores") == 1 and t.get("state_restore_failed") == 0,
             "/v1/cache counts the restore from a snapshot: %r" % t)
        text = ("Once upon a time a little fox lived in the woods. Every morning he ran to the river to drink "
                "and every evening he came home to sleep under the old oak tree.")
        st, _, j = b.post("/v1/completions", {"prompt": text, "max_tokens": 4, "temperature": 0})
        r.ok(st == 200, "completion: %s" % st)
        n_text = j["usage"]["prompt_tokens"] if st == 200 else 0
        b.stop()  # writes what is queued
        doctor(model, tmp, text + " The end.", n_text)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


try:
    for m in MODELS:
        main(m)
finally:
    kill_all()
sys.exit(r.finish())
