#!/usr/bin/env python3
"""agent_first_bench.py - Claude Code's first request: time to first byte and
to first token, cold, warm and in a new session, kvpin against llama.cpp's
server in the same sitting (make bench, bench/run.sh; issue #34's goals).

The request is Claude Code's own: `--record` runs the pinned Claude Code
(tests/clients/node_modules, `claude -p`) against a recording stand-in for
the Anthropic API on loopback and keeps the largest POST /v1/messages body
it sends (its system prompt and its tools, about 28,700 tokens on Claude's
vocabulary) in build/bench/claude-first-request.json. Nothing leaves the
machine: the stand-in answers every call with a one-word streamed message.

Then, for each server (a fresh process each, --ctx positions, one slot, -t
threads), three requests through /v1/messages, streamed, max_tokens 4:

  cold         the recorded request on an empty cache;
  warm         the same request again (the agent's retry, or --continue's
               unchanged prefix);
  new session  the request as a new session sends it: the billing header's
               per-session suffix and the user's first prompt changed.

The servers render Claude Code's Messages body with their own templates
and Messages layers, so their prompts differ (llama.cpp's leaves out the
tools a template without tool syntax cannot show); for the comparison the
same three requests are also sent to both as the same token ids (the body
flattened to one ChatML-style text, tokenized by kvpin): kvpin's
/v1/completions against llama.cpp's /completion.

Per request: time to the first byte of the answer (headers; kvpin sends them
and message_start at admission, goal < 100 ms), to the first text delta
(the prompt computed), and the prompt tokens the server reports read from
its cache. Every figure is the median of --reps sittings (a cold prompt
needs a fresh server, so each sitting starts both servers anew); the load
average is printed, since other work on shared cores inflates every time.

usage: agent_first_bench.py --kvpin ./kvpin -m MODEL [--llama-server PATH]
                            [-t 2] [--reps 1] [--ctx 65536] [--request FILE]
                            [--record]
"""
import argparse
import http.client
import http.server
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")
CLAUDE = os.path.join(ROOT, "tests", "clients", "node_modules", ".bin", "claude")
DEFAULT_REQUEST = os.path.join(ROOT, "build", "bench", "claude-first-request.json")


# ---- recording Claude Code's request ------------------------------------

def sse(events):
    return "".join("event: %s\ndata: %s\n\n" % (e["type"], json.dumps(e)) for e in events).encode()


class Recorder(http.server.BaseHTTPRequestHandler):
    bodies = []

    def log_message(self, *a):
        pass

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if not self.path.startswith("/v1/messages") or self.path.startswith("/v1/messages/count_tokens"):
            out = json.dumps({"input_tokens": 1}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)
            return
        req = json.loads(body)
        Recorder.bodies.append(req)
        msg = {"id": "msg_rec%d" % len(Recorder.bodies), "type": "message", "role": "assistant",
               "model": req.get("model", "m"), "content": [], "stop_reason": None, "stop_sequence": None,
               "usage": {"input_tokens": 1, "output_tokens": 0}}
        if req.get("stream"):
            out = sse([{"type": "message_start", "message": msg},
                       {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
                       {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "ok"}},
                       {"type": "content_block_stop", "index": 0},
                       {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                        "usage": {"output_tokens": 1}},
                       {"type": "message_stop"}])
            ctype = "text/event-stream"
        else:
            msg.update(content=[{"type": "text", "text": "ok"}], stop_reason="end_turn")
            out = json.dumps(msg).encode()
            ctype = "application/json"
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)


def record(path):
    if not os.path.exists(CLAUDE):
        sys.exit("agent_first_bench: Claude Code is not installed (cd tests/clients && npm ci)")
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    tmp = tempfile.mkdtemp(prefix="kvpin-record-")
    env = dict(os.environ, HOME=tmp, ANTHROPIC_BASE_URL="http://127.0.0.1:%d" % srv.server_address[1],
               ANTHROPIC_API_KEY="sk-record", DISABLE_TELEMETRY="1", DISABLE_AUTOUPDATER="1",
               CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1")
    p = subprocess.run([CLAUDE, "-p", "say hi"], env=env, cwd=tmp, capture_output=True, text=True, timeout=300)
    srv.shutdown()
    if not Recorder.bodies:
        sys.exit("agent_first_bench: Claude Code sent no /v1/messages request (exit %d): %s"
                 % (p.returncode, p.stderr[-400:]))
    req = max(Recorder.bodies, key=lambda b: len(json.dumps(b)))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(req, f)
    print("recorded Claude Code's first request: %d bytes, %d tools -> %s"
          % (len(json.dumps(req)), len(req.get("tools") or []), path))


def new_session(req):
    """The request as a new session's first request: the billing header's
    per-session characters and the user's prompt are different."""
    r = json.loads(json.dumps(req))
    sysb = r.get("system")
    if isinstance(sysb, list):
        for b in sysb:
            t = b.get("text", "")
            if t.startswith("x-anthropic-billing-header:"):
                b["text"] = re.sub(r"(cc_version=[0-9.]+\.)([0-9a-f]+)", lambda m: m.group(1) + "9f3", t)
    for m in r.get("messages", []):
        if m.get("role") != "user":
            continue
        c = m.get("content")
        if isinstance(c, str):
            m["content"] = c.replace("say hi", "list the files here")
        elif isinstance(c, list):
            for p in c:
                if p.get("type") == "text" and "say hi" in p.get("text", ""):
                    p["text"] = p["text"].replace("say hi", "list the files here")
    return r


# ---- servers -------------------------------------------------------------

def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def wait_ready(port, proc, secs=600):
    end = time.time() + secs
    while time.time() < end:
        if proc.poll() is not None:
            return False
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                return True
        except OSError:
            pass
        time.sleep(0.3)
    return False


def start(kind, exe, model, threads, ctx):
    port = free_port()
    if kind == "kvpin":
        cmd = [exe, "serve", "-m", model, "--port", str(port), "-t", str(threads), "--ctx", str(ctx), "-np", "1"]
    else:
        cmd = [exe, "-m", model, "--port", str(port), "-t", str(threads), "-c", str(ctx), "-np", "1",
               "-fa", "auto", "--jinja"]
    log = open(os.path.join(tempfile.gettempdir(), "agent-bench-%s.log" % kind), "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    if not wait_ready(port, proc):
        proc.kill()
        sys.exit("agent_first_bench: %s did not start (%s)" % (kind, log.name))
    return proc, port


def ask(port, req):
    """One streamed /v1/messages request: (first byte s, first text s,
    cache-read tokens, input tokens)."""
    body = dict(req, stream=True, max_tokens=4)
    body.pop("thinking", None)
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=7200)
    t0 = time.time()
    c.request("POST", "/v1/messages", json.dumps(body),
              {"Content-Type": "application/json", "anthropic-version": "2023-06-01", "x-api-key": "x"})
    r = c.getresponse()
    ttfb = time.time() - t0
    if r.status != 200:
        sys.exit("agent_first_bench: HTTP %d: %s" % (r.status, r.read()[:300]))
    ttft = None
    read = inp = 0
    for line in r:
        if not line.startswith(b"data:"):
            continue
        ev = json.loads(line[5:])
        if ev.get("type") == "content_block_delta" and ttft is None:
            ttft = time.time() - t0
        u = (ev.get("message") or {}).get("usage") or ev.get("usage") or {}
        read = max(read, u.get("cache_read_input_tokens") or 0)
        inp = max(inp, (u.get("input_tokens") or 0) + (u.get("cache_read_input_tokens") or 0) +
                  (u.get("cache_creation_input_tokens") or 0))
    c.close()
    return ttfb, ttft if ttft is not None else time.time() - t0, read, inp


def flatten(req):
    """The request as one ChatML-style text (system blocks, tools as JSON,
    then the turns): the same text for both servers, so that both compute
    the same tokens whatever each one's Messages layer and template do."""
    def text(c):
        if isinstance(c, str):
            return c
        return "\n".join(p.get("text", "") for p in c if p.get("type") == "text")
    sysb = req.get("system") or ""
    if isinstance(sysb, list):  # the per-session billing block, which both servers leave out
        sysb = [b for b in sysb if not b.get("text", "").startswith("x-anthropic-billing-header:")]
    out = ["<|im_start|>system\n" + text(sysb) + "\n\n# Tools\n" +
           json.dumps(req.get("tools") or [], sort_keys=True) + "<|im_end|>\n"]
    for m in req.get("messages", []):
        out.append("<|im_start|>%s\n%s<|im_end|>\n" % (m.get("role"), text(m.get("content"))))
    return "".join(out) + "<|im_start|>assistant\n"


def token_ids(port, text):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("POST", "/tokenize", json.dumps({"content": text}), {"Content-Type": "application/json"})
    return json.loads(c.getresponse().read())["tokens"]


def ask_ids(kind, port, ids):
    """The same token ids as a streamed completion: kvpin's /v1/completions,
    llama.cpp's /completion. (first byte s, first token s, cached tokens, ids)."""
    if kind == "kvpin":
        path, body = "/v1/completions", {"prompt": ids, "max_tokens": 4, "stream": True, "temperature": 0,
                                         "stream_options": {"include_usage": True}}
    else:
        path, body = "/completion", {"prompt": ids, "n_predict": 4, "stream": True, "cache_prompt": True,
                                     "temperature": 0}
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=7200)
    t0 = time.time()
    c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    ttfb = time.time() - t0
    if r.status != 200:
        sys.exit("agent_first_bench: %s HTTP %d: %s" % (kind, r.status, r.read()[:300]))
    ttft, cached = None, 0
    for line in r:
        if not line.startswith(b"data:") or line.strip() == b"data: [DONE]":
            continue
        ev = json.loads(line[5:])
        if ttft is None and (ev.get("content") or (ev.get("choices") or [{}])[0].get("text")):
            ttft = time.time() - t0
        cached = max(cached, (ev.get("kvpin_cache") or {}).get("reused_tokens") or 0,
                     ((ev.get("usage") or {}).get("prompt_tokens_details") or {}).get("cached_tokens") or 0,
                     (ev.get("timings") or {}).get("cache_n") or 0)
    c.close()
    return ttfb, ttft if ttft is not None else time.time() - t0, cached, len(ids)


def sitting(kind, exe, model, threads, ctx, req, ids):
    out = {}
    proc, port = start(kind, exe, model, threads, ctx)
    try:
        out["messages"] = {"cold": ask(port, req), "warm": ask(port, req),
                           "new session": ask(port, new_session(req))}
    finally:
        proc.terminate()
        proc.wait()
    proc, port = start(kind, exe, model, threads, ctx)
    try:
        out["ids"] = {"cold": ask_ids(kind, port, ids[0]), "warm": ask_ids(kind, port, ids[0]),
                      "new session": ask_ids(kind, port, ids[1])}
    finally:
        proc.terminate()
        proc.wait()
    return out


def table(title, servers, runs, path):
    print(title)
    print("%-10s %-12s %12s %12s %16s" % ("server", "request", "first byte", "first token", "cached/prompt"))
    for kind, _ in servers:
        for what in ("cold", "warm", "new session"):
            xs = [r[path][what] for r in runs[kind]]
            med = lambda i: statistics.median(x[i] for x in xs)
            print("%-10s %-12s %10.3f s %10.2f s %9d/%d" % (kind, what, med(0), med(1), xs[-1][2], xs[-1][3]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kvpin", default="./kvpin")
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--llama-server")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--ctx", type=int, default=65536)
    ap.add_argument("--request", default=DEFAULT_REQUEST)
    ap.add_argument("--record", action="store_true", help="record Claude Code's request first")
    a = ap.parse_args()
    if a.record or not os.path.exists(a.request):
        record(a.request)
    with open(a.request) as f:
        req = json.load(f)
    servers = [("kvpin", a.kvpin)] + ([("llama.cpp", a.llama_server)] if a.llama_server else [])
    # the shared token ids, from kvpin's tokenizer (a server of its own)
    proc, port = start("kvpin", a.kvpin, a.model, a.threads, a.ctx)
    try:
        ids = (token_ids(port, flatten(req)), token_ids(port, flatten(new_session(req))))
    finally:
        proc.terminate()
        proc.wait()
    runs = {k: [] for k, _ in servers}
    for rep in range(a.reps):
        for kind, exe in servers:
            runs[kind].append(sitting(kind, exe, a.model, a.threads, a.ctx, req, ids))
            print("  sitting %d, %s: %s" % (rep + 1, kind, json.dumps(runs[kind][-1])), file=sys.stderr)
    print("Claude Code's first request on %s (%d threads, %d sitting(s), load %.2f)"
          % (os.path.basename(a.model), a.threads, a.reps, os.getloadavg()[0]))
    table("As Claude Code sends it (POST /v1/messages; each server renders its own prompt):",
          servers, runs, "messages")
    table("The same %d token ids to both (kvpin /v1/completions, llama.cpp /completion):" % len(ids[0]),
          servers, runs, "ids")
    if a.llama_server:
        for what in ("cold", "warm", "new session"):
            k = statistics.median(r["ids"][what][1] for r in runs["kvpin"])
            l = statistics.median(r["ids"][what][1] for r in runs["llama.cpp"])
            print("first token on the same ids, %s: kvpin %.2f s, llama.cpp %.2f s, ratio %.2f"
                  % (what, k, l, l / k))

if __name__ == "__main__":
    main()
