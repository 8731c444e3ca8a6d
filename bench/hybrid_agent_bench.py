#!/usr/bin/env python3
"""Agent loops on a hybrid model (qwen35: gated delta-net + attention layers),
kvpin beside llama.cpp's server.

A recurrent layer's state summarizes the whole prefix and cannot be cut back,
so a server that keeps only its slot's last state re-processes the whole
prompt whenever a request does not extend that slot exactly (llama.cpp's
"forcing full prompt re-processing due to lack of cache data", #21831, with
a few "context checkpoints" per slot as a partial fix). kvpin's prefix index
keeps state snapshots (every --state-every positions, at every prompt's and
answer's end, at pins: docs/state-checkpoints.md) and resumes from the latest
one at or before the divergence.

Three runs per server, the same token ids to each through llama-server's
native /completion (prompt as ids, cache_prompt, greedy n_predict ANSWER
tokens, return_tokens, ignore_eos; kvpin serves the same API):

  append   TURNS turns: each sends the previous prompt, the answer the
           server returned and NEW new tokens (a tool result, the user's
           next message). The divergence is the end of the previous answer:
           NEW tokens must be computed.
  rewrite  the same loop, but each turn rewrites the previous answer as a
           template that drops reasoning does: only its second half goes
           back into the prompt. The divergence is the end of the previous
           prompt: the kept half and NEW must be computed.
  crew     AGENTS agents at once (-np AGENTS) sharing a SPEC-token spec,
           each with NEW tokens of its own; then each agent's second turn
           (its first prompt, its answer, NEW more). Spec computed once at
           best: SPEC + AGENTS x NEW, then AGENTS x NEW.

Per run and server: tokens computed per turn (the server's own
timings.prompt_n) against what the divergence requires, the excess (kvpin's
goal: at most --state-every), and the prompt time per warm turn (its own
timings.prompt_ms, the time to the first token less sampling), medians and
sums; kvpin's state snapshots and bytes held at the end (/v1/cache).

  python3 bench/hybrid_agent_bench.py -m MODEL.gguf [--turns 20] [--new 1000]
      [--answer 32] [--agents 8] [--spec 4000] [--runs append,rewrite,crew]
      [-t 2] [--llama-server PATH] [--kvpin ./kvpin] [--kvpin-args "..."]

llama-server: --llama-server, $LLAMA_SERVER, or llama-server on the PATH;
without one only kvpin runs.
"""
import argparse
import os
import random
import shutil
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from swa_agent_bench import call, free_port, start  # noqa: E402


def complete(port, prompt, a):
    t0 = time.time()
    r = call(port, "POST", "/completion", {"prompt": prompt, "n_predict": a.answer, "cache_prompt": True,
                                           "temperature": 0, "top_k": 1, "return_tokens": True, "ignore_eos": True})
    tm = r.get("timings", {})
    return {"computed": tm.get("prompt_n", 0), "prompt_ms": tm.get("prompt_ms", 0.0), "wall_s": time.time() - t0,
            "answer": list(r.get("tokens") or [])}


def loop(name, port, a, vocab, rewrite):
    rng = random.Random(1234)
    new = lambda n: [rng.randrange(3, vocab) for _ in range(n)]  # noqa: E731
    prompt, turns, back = new(a.new), [], []
    need = len(prompt)
    for t in range(1, a.turns + 1):
        r = complete(port, prompt, a)
        r.update(turn=t, prompt=len(prompt), need=need)
        turns.append(r)
        print("  %-12s %-7s turn %2d: prompt %6d, computed %6d (needs %5d), prompt %.2f s" %
              (name, "rewrite" if rewrite else "append", t, len(prompt), r["computed"], need, r["prompt_ms"] / 1000),
              flush=True)
        ans = r["answer"]
        if rewrite:  # the template drops the answer's first half (its reasoning)
            kept = ans[len(ans) // 2:]
            need = len(kept) + a.new
            prompt = prompt + kept + new(a.new)
        else:
            need = a.new
            prompt = prompt + ans + new(a.new)
        back.append(ans)
    return turns


def crew(name, port, a, vocab):
    rng = random.Random(99)
    spec = [rng.randrange(3, vocab) for _ in range(a.spec)]
    own = [[rng.randrange(3, vocab) for _ in range(a.new)] for _ in range(a.agents)]
    rounds = []
    prompts = [spec + o for o in own]
    for rnd in (1, 2):
        res = [None] * a.agents
        t0 = time.time()

        def one(i):
            res[i] = complete(port, prompts[i], a)
            res[i]["done_s"] = time.time() - t0

        th = [threading.Thread(target=one, args=(i,)) for i in range(a.agents)]
        for x in th:
            x.start()
        for x in th:
            x.join()
        need = a.spec + a.agents * a.new if rnd == 1 else a.agents * a.new
        got = sum(r["computed"] for r in res)
        rounds.append({"round": rnd, "computed": got, "need": need, "wall_s": max(r["done_s"] for r in res),
                       "prompt_ms": [r["prompt_ms"] for r in res]})
        print("  %-12s crew    round %d: %d agents computed %6d (needs %6d), all done in %.1f s" %
              (name, rnd, a.agents, got, need, rounds[-1]["wall_s"]), flush=True)
        rng2 = random.Random(7 + rnd)
        prompts = [p + r["answer"] + [rng2.randrange(3, vocab) for _ in range(a.new)] for p, r in zip(prompts, res)]
    return rounds


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--turns", type=int, default=20)
    ap.add_argument("--new", type=int, default=1000)
    ap.add_argument("--answer", type=int, default=32)
    ap.add_argument("--agents", type=int, default=8)
    ap.add_argument("--spec", type=int, default=4000)
    ap.add_argument("--runs", default="append,rewrite,crew")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--kvpin", default=os.environ.get("KVPIN", "./kvpin"))
    ap.add_argument("--llama-server", default=os.environ.get("LLAMA_SERVER") or shutil.which("llama-server"))
    ap.add_argument("--kvpin-args", default="", help="more options for kvpin serve (e.g. --state-every 128)")
    a = ap.parse_args()
    runs = [r for r in a.runs.split(",") if r]
    for r in runs:
        if r not in ("append", "rewrite", "crew"):
            sys.exit("hybrid_agent_bench: unknown run %r (append, rewrite, crew)" % r)
    ctx = max(a.turns * (a.new + a.answer), 2 * (a.spec + 2 * a.new + a.answer)) + 256
    ctx = (ctx + 1023) // 1024 * 1024
    servers = [("kvpin", lambda np, port: [a.kvpin, "serve", "-m", a.model, "--port", str(port), "-t",
                                           str(a.threads), "-c", str(ctx), "-np", str(np)] + a.kvpin_args.split())]
    if a.llama_server:  # -c is the whole context, split between its -np slots
        servers.append(("llama.cpp", lambda np, port: [a.llama_server, "-m", a.model, "-t", str(a.threads), "-c",
                                                       str(ctx * np), "-np", str(np), "-fa", "on", "--port",
                                                       str(port)]))
    out = {}
    for name, cmd in servers:
        for run in runs:
            np = a.agents if run == "crew" else 1
            proc, port, _ = start(name.replace(".", ""), cmd(np, free_port()))
            try:
                vocab = call(port, "GET", "/v1/models")["data"][0].get("meta", {}).get("n_vocab", 512)
                res = crew(name, port, a, vocab) if run == "crew" else loop(name, port, a, vocab, run == "rewrite")
                held = None
                if name == "kvpin":
                    kv = call(port, "GET", "/v1/cache")["kv"]
                    md = call(port, "GET", "/v1/cache/events")["model"]
                    rec = kv.get("by_kind", {}).get("recurrent")
                    if rec:  # and what K/V of every layer would take for the tokens cached
                        full = kv["by_kind"]["full"]
                        toks = full["index_bytes"] // max(1, full["bytes_per_token"])
                        held = (rec["snapshots"], rec["index_bytes"], rec["state_every"], full["index_bytes"],
                                toks, toks * full["bytes_per_token"] * md["n_layer"] // max(1, md["n_kv_layer"]))
                out[(name, run)] = (res, held)
            finally:
                proc.terminate()
                proc.wait(timeout=60)
    print("\n%s; %d threads; %d turns of %d new tokens, answers of %d; crew: %d agents, a %d-token spec" %
          (os.path.basename(a.model), a.threads, a.turns, a.new, a.answer, a.agents, a.spec))
    print("| run | server | computed, warm turns | needed | most excess in a turn | prompt time a warm turn "
          "(median) | all turns' prompt time |")
    print("|---|---|---|---|---|---|---|")
    med = {}
    for run in runs:
        for name, _ in servers:
            if (name, run) not in out:
                continue
            res, held = out[(name, run)]
            if run == "crew":
                for r in res:
                    print("| crew round %d | %s | %d | %d | %d | %.2f s | %.1f s (all %d agents done) |" %
                          (r["round"], name, r["computed"], r["need"], r["computed"] - r["need"],
                           statistics.median(r["prompt_ms"]) / 1000, sum(r["prompt_ms"]) / 1000, a.agents))
                continue
            warm = res[1:]
            comp, need = sum(t["computed"] for t in warm), sum(t["need"] for t in warm)
            excess = max((t["computed"] - t["need"] for t in warm), default=0)
            m = statistics.median(t["prompt_ms"] for t in warm) / 1000 if warm else 0
            med[(name, run)] = m
            print("| %s | %s | %d | %d | %d | %.2f s | %.1f s |" % (run, name, comp, need, excess, m,
                                                                   sum(t["prompt_ms"] for t in res) / 1000))
    for run in runs:
        k, lc = med.get(("kvpin", run)), med.get(("llama.cpp", run))
        if k and lc:
            print("%s: kvpin's warm turn %.1fx faster than llama.cpp's (medians)" % (run, lc / k))
    for run in runs:
        held = out.get(("kvpin", run), (None, None))[1]
        if held:
            print("kvpin after %s: %d state snapshots, %.1f MiB (--state-every %d), and %.1f MiB of attention K/V "
                  "for %d cached tokens; K/V in every layer would take %.1f MiB" %
                  (run, held[0], held[1] / 2 ** 20, held[2], held[3] / 2 ** 20, held[4], held[5] / 2 ** 20))


if __name__ == "__main__":
    main()
