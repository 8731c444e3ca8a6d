#!/usr/bin/env python3
"""Prefill and decode per architecture, kvpin beside llama.cpp in one run.

For each model file given (gemma3, qwen3moe, gpt-oss shapes from `kvpin
mkmodel`, or real files), R rounds alternate `kvpin bench` and llama.cpp's
`llama-bench` (flash attention on; weights read into memory, --load-mode none, so
that pages the kernel dropped from the page cache are not read from disk
during a run), each one repetition of pp P and tg N at
depth 0 on T threads, so both sides see the same machine load; the table
gives the medians of the rounds, the ratio kvpin / llama.cpp, and kvpin's
decode as GB/s of the bytes a step reads (only the routed experts for
mixture-of-experts models) and as % of the read bandwidth kvpin's probe
measured in the same round.

  python3 bench/arch_bench.py [-r 3] [-p 512] [-n 32] [-t 2] MODEL.gguf...

llama-bench: $LLAMA_BENCH, else llama-bench on the PATH (build llama.cpp
natively as bench/README.md says). kvpin: $KVPIN, else ./kvpin.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys


def run_kvpin(kvpin, model, p, n, t):
    out = subprocess.run([kvpin, "bench", "-m", model, "-p", str(p), "-n", str(n), "-r", "1", "-t", str(t), "--json"],
                         capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        raise RuntimeError(f"kvpin bench failed on {model}: {out.stderr.strip()[-400:]}")
    res = {}
    for line in out.stdout.splitlines():
        j = json.loads(line)
        res[j["test"][:2]] = j
    return res


def run_llama(bench, model, p, n, t):
    out = subprocess.run([bench, "-m", model, "-p", str(p), "-n", str(n), "-r", "1", "-t", str(t), "-fa", "on",
                          "-lm", "none", "-o", "jsonl"], capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        raise RuntimeError(f"llama-bench failed on {model}: {out.stderr.strip()[-400:]}")
    res = {}
    for line in out.stdout.splitlines():
        if not line.startswith("{"):
            continue
        j = json.loads(line)
        res["pp" if j.get("n_prompt", 0) > 0 else "tg"] = j["avg_ts"]
    return res


def fmt(k, ll):
    """'k / l' and the ratio, or k alone without the peer; '-' when not run."""
    if not k:
        return "-", "-"
    med = statistics.median
    if not ll:
        return f"{med(k):.1f}", "-"
    return f"{med(k):.1f} / {med(ll):.1f}", f"{med(k) / med(ll):.2f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-r", type=int, default=3, help="rounds (each side once per round)")
    ap.add_argument("-p", type=int, default=512, help="prompt tokens of the pp test (0: none)")
    ap.add_argument("-n", type=int, default=32, help="generated tokens of the tg test (0: none)")
    ap.add_argument("-t", type=int, default=2, help="threads")
    ap.add_argument("--kvpin-only", action="store_true", help="without llama-bench")
    ap.add_argument("models", nargs="+")
    a = ap.parse_args()
    kvpin = os.environ.get("KVPIN", "./kvpin")
    bench = None if a.kvpin_only else os.environ.get("LLAMA_BENCH") or shutil.which("llama-bench")
    if not bench and not a.kvpin_only:
        sys.exit("arch_bench: set LLAMA_BENCH to llama.cpp's llama-bench (bench/README.md says how to build it), "
                 "or pass --kvpin-only")
    rows = []
    for m in a.models:
        k_pp, k_tg, l_pp, l_tg, gbs, pct = [], [], [], [], [], []
        for _ in range(a.r):
            k = run_kvpin(kvpin, m, a.p, a.n, a.t)
            ll = run_llama(bench, m, a.p, a.n, a.t) if bench else {}
            if a.p:
                k_pp.append(k["pp"]["tps_median"])
            if a.n:
                k_tg.append(k["tg"]["tps_median"])
                gbs.append(k["tg"]["tg_gbs"])
                pct.append(k["tg"]["tg_pct_of_read_bw"])
            if "pp" in ll and a.p:
                l_pp.append(ll["pp"])
            if "tg" in ll and a.n:
                l_tg.append(ll["tg"])
        rows.append((os.path.basename(m), fmt(k_pp, l_pp), fmt(k_tg, l_tg),
                     f"{statistics.median(gbs):.1f} ({statistics.median(pct):.0f}%)" if gbs else "-"))
        print(f"# {os.path.basename(m)}: pp {[round(x, 1) for x in k_pp]} vs {[round(x, 1) for x in l_pp]}, "
              f"tg {[round(x, 1) for x in k_tg]} vs {[round(x, 1) for x in l_tg]}", flush=True)
    peer = " / llama.cpp" if bench else ""
    print(f"\n| file | pp{a.p} kvpin{peer} t/s | ratio | tg{a.n} kvpin{peer} t/s | ratio | kvpin tg GB/s (% of read) |")
    print("|---|---|---|---|---|---|")
    for f, pp, tg, g in rows:
        print(f"| {f} | {pp[0]} | {pp[1]} | {tg[0]} | {tg[1]} | {g} |")


if __name__ == "__main__":
    main()
