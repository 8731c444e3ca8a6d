#!/usr/bin/env python3
"""messages_bench.py - an agent loop through /v1/messages against the same
loop through /v1/chat/completions (issue #12's goal).

Starts `kvpin serve` (chatml template) on the given model and runs, --reps
times and alternating, two loops of --turns turns each:

  A  /v1/messages, streamed: a --system-token system block with
     cache_control, one tool, and per turn a user message of about --new
     fresh tokens; the answer (--answer tokens at most, greedy) is appended
     to the conversation for the next turn;
  B  the same conversation through /v1/chat/completions, streamed.

Each loop's system text starts with its own words, so neither reuses what
the other cached. Per turn it records the time to first token (request
sent to the first text delta) and, for A, usage: every warm turn's
cache_read_input_tokens must be at least 99% of the previous turn's prompt
+ answer (the goal), and the three input counts must add up to the prompt.
Reports per warm turn the median time to first token of each loop and
their ratio (goal: A within 10% of B), and the smallest read share.
Standard library only.
"""
import argparse
import http.client
import json
import os
import random
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "e2e"))
from kvpin_test import Server  # noqa: E402

WORDS = ("cat dog tree house river stone cloud bird light night sun road field boat rain wind song "
         "bread apple green quiet small happy bright cold warm little story friend garden window").split()
TOOL = {"name": "get_weather", "description": "The weather in a city",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def post(port, path, body):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    return c, r


def tokens(port, text):
    c, r = post(port, "/tokenize", {"content": text})
    n = len(json.loads(r.read())["tokens"])
    c.close()
    return n


def text_of(port, n, rng, lead):
    """About n tokens of words (calibrated with /tokenize)."""
    sample = " ".join(rng.choice(WORDS) for _ in range(200))
    per = tokens(port, sample) / 200
    return lead + " " + " ".join(rng.choice(WORDS) for _ in range(int(n / per)))


def sse(r):
    """(event name, data) pairs of a stream."""
    name = None
    for raw in r:
        line = raw.decode("utf-8", "replace").rstrip("\r\n")
        if line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: "):
            yield name, line[6:]
            name = None


def turn_messages(port, system, conv, answer):
    body = {"model": "m", "max_tokens": answer, "temperature": 0, "stream": True, "tools": [TOOL],
            "system": [{"type": "text", "text": system, "cache_control": {"type": "ephemeral"}}], "messages": conv}
    t0 = time.perf_counter()
    c, r = post(port, "/v1/messages", body)
    ttft, text, usage = None, "", {}
    for name, data in sse(r):
        j = json.loads(data)
        if name == "message_start":
            usage = j["message"]["usage"]
        elif name == "content_block_delta" and j["delta"]["type"] == "text_delta":
            if ttft is None:
                ttft = time.perf_counter() - t0
            text += j["delta"]["text"]
        elif name == "message_delta":
            usage = j["usage"]
    c.close()
    return ttft if ttft is not None else time.perf_counter() - t0, text, usage


def turn_chat(port, system, conv, answer):
    tools = [{"type": "function", "function": {"name": TOOL["name"], "description": TOOL["description"],
                                               "parameters": TOOL["input_schema"]}}]
    body = {"model": "m", "max_tokens": answer, "temperature": 0, "stream": True, "tools": tools,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "system", "content": [{"type": "text", "text": system}]}] + conv}
    t0 = time.perf_counter()
    c, r = post(port, "/v1/chat/completions", body)
    ttft, text, usage = None, "", {}
    for _, data in sse(r):
        if data == "[DONE]":
            break
        j = json.loads(data)
        for ch in j.get("choices") or []:
            piece = ch.get("delta", {}).get("content")
            if piece:
                if ttft is None:
                    ttft = time.perf_counter() - t0
                text += piece
        if j.get("usage"):
            usage = j["usage"]
    c.close()
    return ttft if ttft is not None else time.perf_counter() - t0, text, usage


def loop(port, mode, args, rep):
    rng = random.Random(1000 * rep + (1 if mode == "A" else 2))
    system = text_of(port, args.system, rng, "Loop %s run %d." % (mode, rep))
    rng_turns = random.Random(rep)  # the same user turns for both loops
    conv, out = [], []
    for t in range(args.turns):
        conv.append({"role": "user", "content": text_of(port, args.new, rng_turns, "Turn %d." % t)})
        f = turn_messages if mode == "A" else turn_chat
        ttft, text, usage = f(port, system, conv, args.answer)
        conv.append({"role": "assistant", "content": text if text else "."})
        out.append((ttft, usage))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kvpin", default="./kvpin")
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=8192)
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--system", type=int, default=2000)
    ap.add_argument("--new", type=int, default=300)
    ap.add_argument("--answer", type=int, default=16)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    srv = Server(None, "--ctx", str(args.ctx), "--chat-template", "chatml", "-np", "1", model=args.model,
                 binary=args.kvpin, threads=args.threads)
    port = srv.port
    ttft = {"A": [[] for _ in range(args.turns)], "B": [[] for _ in range(args.turns)]}
    read_share, sums_ok = [], True
    try:
        for rep in range(args.reps):
            for mode in ("A", "B") if rep % 2 == 0 else ("B", "A"):
                res = loop(port, mode, args, rep)
                for t, (tt, usage) in enumerate(res):
                    ttft[mode][t].append(tt)
                if mode == "A":
                    for t in range(1, len(res)):
                        prev, cur = res[t - 1][1], res[t][1]
                        prev_total = (prev["input_tokens"] + prev["cache_creation_input_tokens"] +
                                      prev["cache_read_input_tokens"] + prev["output_tokens"])
                        read_share.append(cur["cache_read_input_tokens"] / prev_total)
    finally:
        srv.stop()
    print("| turn | /v1/messages TTFT ms (median) | /v1/chat/completions TTFT ms (median) | ratio |")
    print("|---|---|---|---|")
    ratios = []
    for t in range(args.turns):
        a, b = statistics.median(ttft["A"][t]) * 1e3, statistics.median(ttft["B"][t]) * 1e3
        if t > 0:
            ratios.append(a / b)
        print("| %d%s | %.1f | %.1f | %.2f |" % (t + 1, " (cold)" if t == 0 else "", a, b, a / b))
    print("warm turns: median TTFT ratio messages/chat %.2f (goal <= 1.10); smallest cache_read share of the "
          "previous prompt + answer %.4f (goal >= 0.99); %d reps" %
          (statistics.median(ratios), min(read_share) if read_share else 0, args.reps))
    return 0 if sums_ok else 1


if __name__ == "__main__":
    sys.exit(main())
