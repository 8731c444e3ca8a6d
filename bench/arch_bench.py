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

  python3 bench/arch_bench.py [-r 3] [-p 512] [-n 32] [-t 2] [--variant NAME=ARGS]... MODEL.gguf...

--variant runs kvpin once more per round with ARGS added to `kvpin bench`
(for example `--variant "bf16 attention=--attn-precision bf16"`), a row of
its own beside the same llama.cpp runs. A pp row also gives attention's
share of kvpin's prefill time and its GFLOP/s as % of the multiply-add peak
of its instruction (kvpin bench's probe).

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


def run_kvpin(kvpin, model, p, n, t, extra=()):
    out = subprocess.run([kvpin, "bench", "-m", model, "-p", str(p), "-n", str(n), "-r", "1", "-t", str(t), "--json",
                          *extra], capture_output=True, text=True, timeout=1800)
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
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=ARGS",
                    help="also run kvpin with ARGS (a row named NAME)")
    ap.add_argument("models", nargs="+")
    a = ap.parse_args()
    variants = [("", [])]
    for v in a.variant:
        name, _, args = v.partition("=")
        variants.append((name, args.split()))
    kvpin = os.environ.get("KVPIN", "./kvpin")
    bench = None if a.kvpin_only else os.environ.get("LLAMA_BENCH") or shutil.which("llama-bench")
    if not bench and not a.kvpin_only:
        sys.exit("arch_bench: set LLAMA_BENCH to llama.cpp's llama-bench (bench/README.md says how to build it), "
                 "or pass --kvpin-only")
    rows = []
    for m in a.models:
        ks = {name: {"pp": [], "tg": [], "gbs": [], "pct": [], "attn": []} for name, _ in variants}
        l_pp, l_tg = [], []
        for _ in range(a.r):
            for name, extra in variants:
                k, d = run_kvpin(kvpin, m, a.p, a.n, a.t, extra), ks[name]
                if a.p:
                    d["pp"].append(k["pp"]["tps_median"])
                    j = k["pp"]
                    if "attn_gflops" in j:
                        d["attn"].append((j["attn_time_share"], j["attn_gflops"], j.get("attn_pct_of_peak")))
                if a.n:
                    d["tg"].append(k["tg"]["tps_median"])
                    d["gbs"].append(k["tg"]["tg_gbs"])
                    d["pct"].append(k["tg"]["tg_pct_of_read_bw"])
            ll = run_llama(bench, m, a.p, a.n, a.t) if bench else {}
            if "pp" in ll and a.p:
                l_pp.append(ll["pp"])
            if "tg" in ll and a.n:
                l_tg.append(ll["tg"])
        for name, _ in variants:
            d = ks[name]
            label = os.path.basename(m) + (f" ({name})" if name else "")
            att = "-"
            if d["attn"]:
                share = statistics.median(x[0] for x in d["attn"])
                gf = statistics.median(x[1] for x in d["attn"])
                pk = [x[2] for x in d["attn"] if x[2] is not None]
                att = f"{100 * share:.0f}%, {gf:.0f} GFLOP/s" + (f" ({statistics.median(pk):.0f}% of peak)" if pk else "")
            rows.append((label, fmt(d["pp"], l_pp), fmt(d["tg"], l_tg),
                         f"{statistics.median(d['gbs']):.1f} ({statistics.median(d['pct']):.0f}%)" if d["gbs"] else "-",
                         att))
            print(f"# {label}: pp {[round(x, 1) for x in d['pp']]} vs {[round(x, 1) for x in l_pp]}, "
                  f"tg {[round(x, 1) for x in d['tg']]} vs {[round(x, 1) for x in l_tg]}", flush=True)
    peer = " / llama.cpp" if bench else ""
    print(f"\n| file | pp{a.p} kvpin{peer} t/s | ratio | tg{a.n} kvpin{peer} t/s | ratio | kvpin tg GB/s (% of read) "
          f"| kvpin pp: attention's time, GFLOP/s |")
    print("|---|---|---|---|---|---|---|")
    for f, pp, tg, g, att in rows:
        print(f"| {f} | {pp[0]} | {pp[1]} | {tg[0]} | {tg[1]} | {g} | {att} |")


if __name__ == "__main__":
    main()
