#!/usr/bin/env python3
"""The agent loop on a sliding-window model, kvpin beside llama.cpp's server.

An agent's context grows turn by turn: each turn sends the previous prompt,
the model's answer to it and NEW new tokens (a tool result, the user's next
message), and once, at turn EDIT, the agent edits its history BACK tokens
before the end of the previous prompt (a branch, a rewritten tool result).
On a model with sliding-window layers (gemma3, gpt-oss) llama.cpp's server
keeps only the window for those layers and re-processes the whole prompt
whenever a request resumes before its last position (llama.cpp #13194,
#14157, #21831) unless started with --swa-full (full K/V for every layer).
kvpin's cache keeps every block, so the edit recomputes from the edit on.

The same token ids go to every server through llama-server's native
/completion (prompt as ids, cache_prompt, greedy n_predict ANSWER tokens,
return_tokens; kvpin serves the same API), and the next turn appends the
answer's ids that server returned. Per server the table gives: tokens
computed (prompt tokens not taken from the cache) per turn, summed, at the
edit and after it; the prompt time summed (its own timings.prompt_ms); and
the K/V memory it holds (kvpin: /v1/cache's kv.used_bytes, the blocks in use; llama.cpp: the
KV cache sizes its log prints, allocated at start for the context).

  python3 bench/swa_agent_bench.py -m MODEL.gguf [--turns 20] [--new 1000]
      [--edit 10] [--back 2000] [--answer 8] [-t 2]
      [--llama-server PATH] [--kvpin ./kvpin]

llama-server: --llama-server, $LLAMA_SERVER, or llama-server on the PATH;
without one only kvpin runs.
"""
import argparse
import http.client
import json
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def call(port, method, path, body=None, timeout=7200):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    c.request(method, path, json.dumps(body) if body is not None else None,
              {"Content-Type": "application/json"} if body is not None else {})
    r = c.getresponse()
    data = r.read()
    c.close()
    if r.status != 200:
        raise RuntimeError("%s %s: %d %s" % (method, path, r.status, data[:300]))
    return json.loads(data)


def start(name, cmd):
    log = open(os.path.join(tempfile.gettempdir(), "swa-agent-%s.log" % name), "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    port = int(cmd[cmd.index("--port") + 1])
    end = time.time() + 600
    while time.time() < end:
        if proc.poll() is not None:
            sys.exit("swa_agent_bench: %s exited (%s)" % (name, log.name))
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                return proc, port, log.name
        except OSError:
            pass
        time.sleep(0.3)
    proc.kill()
    sys.exit("swa_agent_bench: %s did not start (%s)" % (name, log.name))


def llama_kv_mib(logpath):
    """The KV cache sizes llama.cpp's log prints (MiB), summed."""
    total = 0.0
    for line in open(logpath, errors="replace"):
        m = re.search(r"llama_kv_cache: size =\s*([\d.]+) MiB", line)
        if m:
            total += float(m.group(1))
    return total


def loop(name, port, a, vocab):
    rng = random.Random(1234)
    new = lambda n: [rng.randrange(3, vocab) for _ in range(n)]  # noqa: E731
    prompt = new(a.new)
    turns = []
    for t in range(1, a.turns + 1):
        if t > 1:
            if t == a.edit:  # the edit: one token BACK tokens before the previous prompt's end
                at = max(1, prev_len - a.back)
                prompt[at] = 3 + (prompt[at] - 3 + 1) % (vocab - 3)
            prompt += new(a.new)
        prev_len = len(prompt)
        t0 = time.time()
        r = call(port, "POST", "/completion", {"prompt": prompt, "n_predict": a.answer, "cache_prompt": True,
                                               "temperature": 0, "top_k": 1, "return_tokens": True,
                                               "ignore_eos": True})
        wall = time.time() - t0
        tm = r.get("timings", {})
        computed = tm.get("prompt_n", 0)
        turns.append({"turn": t, "prompt": len(prompt), "computed": computed,
                      "prompt_ms": tm.get("prompt_ms", 0.0), "wall_s": wall})
        print("  %-18s turn %2d: prompt %6d, computed %6d, prompt %.1f s" % (name, t, len(prompt), computed,
                                                                           tm.get("prompt_ms", 0) / 1000),
              flush=True)
        prompt = prompt + list(r.get("tokens") or [])
    return turns


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--turns", type=int, default=20)
    ap.add_argument("--new", type=int, default=1000)
    ap.add_argument("--edit", type=int, default=10)
    ap.add_argument("--back", type=int, default=2000)
    ap.add_argument("--answer", type=int, default=8)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--kvpin", default=os.environ.get("KVPIN", "./kvpin"))
    ap.add_argument("--llama-server", default=os.environ.get("LLAMA_SERVER") or shutil.which("llama-server"))
    ap.add_argument("--kvpin-args", default="", help="more options for kvpin serve (e.g. --window-budget 64M)")
    a = ap.parse_args()
    ctx = a.turns * (a.new + a.answer) + 256
    ctx = (ctx + 1023) // 1024 * 1024
    runs = [("kvpin", [a.kvpin, "serve", "-m", a.model, "--port", str(free_port()), "-t", str(a.threads),
                       "-c", str(ctx), "-np", "1"] + a.kvpin_args.split())]
    if a.llama_server:
        base = [a.llama_server, "-m", a.model, "-t", str(a.threads), "-c", str(ctx), "-np", "1", "-fa", "on",
                "-v", "--port"]  # -v: its log then prints the KV cache sizes
        runs.append(("llama.cpp", base + [str(free_port())]))
        runs.append(("llama.cpp --swa-full", base + [str(free_port()), "--swa-full"]))
    results = []
    for name, cmd in runs:
        proc, port, logpath = start(name.replace(" ", ""), cmd)
        try:
            vocab = call(port, "GET", "/v1/models")["data"][0].get("meta", {}).get("n_vocab", 512)
            turns = loop(name, port, a, vocab)
            if name == "kvpin":
                kv_mib = call(port, "GET", "/v1/cache")["kv"]["used_bytes"] / 2 ** 20
            else:
                kv_mib = llama_kv_mib(logpath)
        finally:
            proc.terminate()
            proc.wait(timeout=60)
        results.append((name, turns, kv_mib))
    print("\n%d turns of %d new tokens, answers of %d, an edit at turn %d %d tokens back; %d threads; %s" %
          (a.turns, a.new, a.answer, a.edit, a.back, a.threads, os.path.basename(a.model)))
    print("| server | tokens computed, all turns | at the edit (turn %d) | turns after it | prompt time, all "
          "turns | K/V memory |" % a.edit)
    print("|---|---|---|---|---|---|")
    for name, turns, kv in results:
        tot = sum(t["computed"] for t in turns)
        at = sum(t["computed"] for t in turns if t["turn"] == a.edit)
        after = sum(t["computed"] for t in turns if t["turn"] > a.edit)
        ms = sum(t["prompt_ms"] for t in turns)
        print("| %s | %d | %d | %d | %.1f s | %.0f MiB |" % (name, tot, at, after, ms / 1000, kv))


if __name__ == "__main__":
    main()
