#!/usr/bin/env python3
"""Memory and reuse of a sliding-window model's cache, by default and under
--window-budget (docs/window-budget.md's table).

A gemma3-1b-shaped model with a narrow width (26 layers, 22 of them window
layers, one kv-head of 256: gemma3-1b's KV bill per token) is generated
twice, with gemma3's window (512) and with gpt-oss's (128). One conversation
of 12 turns goes through `kvpin run --prompt-cache` (one engine, greedy):

  turns 1-10   each appends about 520 words to the previous prompt; each
               answer (8 tokens) is not sent back, so a turn diverges at the
               previous prompt's end
  turn 11      an edit just past turn 9's prompt
  turn 12      an edit well back (after turn 2's prompt)

For each window and budget (none, a middle one, the least the engine
accepts, which its error message names) the table gives the window-layer
rows the cache holds after turn 10, the tokens reused on turns 2-10 and on
the two edits, the total, and the peak RSS; the greedy answers must be the
same in every run (checked).

  python3 bench/window_budget_bench.py [-t 2] [--kvpin ./kvpin] [--dir build/bench]
"""
import argparse
import json
import os
import random
import re
import subprocess
import sys

WORDS = ("the of and to in a is that for it as was with be by on not he this are or his from at which but have an "
         "they you were her she there one all we their").split()


def turns_file(path):
    rnd = random.Random(7)

    def para(n):
        return " ".join(rnd.choice(WORDS) for _ in range(n))

    turns, conv = [], ""
    for _ in range(10):
        conv += " " + para(520)
        turns.append(conv)
    turns.append(turns[8] + " zebra " + para(500))
    rest = turns[9].split()[len(turns[1].split()) + 40:]
    turns.append(turns[1] + " zebra " + para(40) + " " + " ".join(rest))
    with open(path, "w") as f:
        for p in turns:
            f.write(json.dumps({"prompt": p}) + "\n")


def run(kvpin, model, turns, threads, budget):
    cmd = [kvpin, "run", "--prompt-cache", "-m", model, "--turns", turns, "-n", "8", "--temp", "0", "-t",
           str(threads), "-c", "8192", "--kv-budget", "512M"]
    if budget:
        cmd += ["--window-budget", budget]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = p.communicate(timeout=1800)
    if p.returncode != 0:
        return None, err.strip().splitlines()[-1] if err.strip() else "exit %d" % p.returncode
    reused = [int(m.group(2)) for m in re.finditer(r"^turn (\d+): \d+ prompt tokens, (\d+) reused", err, re.M)]
    held = re.findall(r"^turn 10: the cache holds ([\d.]+) MiB of full-layer rows and ([\d.]+) MiB of window-layer",
                      err, re.M)
    return {"reused": reused, "answers": out, "full": float(held[0][0]) if held else None,
            "window": float(held[0][1]) if held else None}, None


def peak_rss(kvpin, model, turns, threads, budget):
    cmd = ["/usr/bin/time", "-f", "%M", kvpin, "run", "--prompt-cache", "-m", model, "--turns", turns, "-n", "8",
           "--temp", "0", "-t", str(threads), "-c", "8192", "--kv-budget", "512M"]
    if budget:
        cmd += ["--window-budget", budget]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    last = p.stderr.strip().splitlines()[-1]
    return int(last) * 1024 if last.isdigit() else None


def least_budget(kvpin, model, turns, threads):
    _, err = run(kvpin, model, turns, threads, "1M")
    m = re.search(r"need \d+ \((\d+) bytes\)", err or "")
    return int(m.group(1)) if m else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--kvpin", default=os.environ.get("KVPIN", "./kvpin"))
    ap.add_argument("--dir", default="build/bench")
    a = ap.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    turns = os.path.join(a.dir, "window-turns.jsonl")
    turns_file(turns)
    rows = []
    for w in (512, 128):
        answers = None  # each model's runs against its default run
        model = os.path.join(a.dir, "gemma3-narrow-w%d-f16.gguf" % w)
        if not os.path.exists(model):
            subprocess.run([a.kvpin, "mkmodel", "--preset", "gemma3-1b", "--embd", "256", "--ff", "512", "--type",
                            "F16", "--sliding-window", str(w), "-o", model], check=True, capture_output=True)
        least = least_budget(a.kvpin, model, turns, a.threads)
        if not least:
            sys.exit("window_budget_bench: no least budget in kvpin's message")
        least_mib = (least + (1 << 20) - 1) >> 20
        for label, budget in (("none (default)", None), ("%dM" % (2 * least_mib), "%dM" % (2 * least_mib)),
                              ("%dM (the least)" % least_mib, "%dM" % least_mib)):
            res, err = run(a.kvpin, model, turns, a.threads, budget)
            if res is None:
                sys.exit("window_budget_bench: W %d, budget %s: %s" % (w, budget, err))
            if answers is None:
                answers = res["answers"]
            same = res["answers"] == answers
            rss = peak_rss(a.kvpin, model, turns, a.threads, budget)
            r = res["reused"]
            rows.append((w, label, res["window"], r[1:10], r[10], r[11], sum(r), rss, same))
            print("# W %d, %s: reused %s, window rows %.1f MiB, peak RSS %s, answers %s" %
                  (w, label, r, res["window"], rss, "same" if same else "DIFFER"), flush=True)
    print()
    print("| W | `--window-budget` | window rows cached after turn 10 | turns 2-10 reused | edit past turn 9 "
          "reused | edit well back reused | reused in all | peak RSS | answers |")
    print("|---|---|---|---|---|---|---|---|---|")
    for w, label, win, r210, e1, e2, tot, rss, same in rows:
        print("| %d | %s | %.1f MiB | %s | %s | %s | %s | %s | %s |" % (
            w, label, win, ", ".join("{:,}".format(x) for x in r210), "{:,}".format(e1), "{:,}".format(e2),
            "{:,}".format(tot), "%d MB" % (rss // 1000000) if rss else "-", "same" if same else "differ"))
    if any(not row[-1] for row in rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
