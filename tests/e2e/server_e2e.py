#!/usr/bin/env python3
"""End-to-end tests of `kvpin serve` over real HTTP on 127.0.0.1 (run by
tests/run_all.sh with the binary in $KVPIN).

Expected values come from outside the server's own answer:
  - status codes and error fields from the OpenAI API conventions;
  - cached_tokens of an agent loop from /tokenize: the longest common token
    prefix of the new prompt with every earlier prompt + answer;
  - the divergence byte of a timestamp edit from the two prompt texts;
  - each of 16 concurrent greedy streams from the same request run alone;
  - no leaked KV blocks: after the load, the blocks in use are exactly the
    blocks the prefix index holds, and no sequence holds a lease;
  - the request log: one line per request whose status, id, tokens and
    cause are what the client received (response, x-request-id header);
  - API keys by their documented precedence, RFC 7235's case-insensitive
    scheme, 401 before 404/405/413; IPv6 on ::1 (skipped, with a message,
    where the machine cannot bind ::1); -np as --parallel;
  - tools on the chatml template (the generic tool format of src/serve/chat.h):
    the prompt, detokenized, holds each tool's canonical JSON (json.dumps with
    sorted keys, no spaces: RFC 8785 for these values) in the documented
    block; a second request with the same tools, keys permuted, reuses the
    cache past the block (cached_tokens is the longest common token prefix);
    tool_choice "none" renders no tools; any tool call in a reply, streamed
    or not, has OpenAI's shape;
  - cache endpoints under the load of eight decoding streams answer within a
    second at the 99th percentile (a generous bound: they are served between
    two steps).
"""
import http.client
import json
import os
import re
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

from kvpin_test import KVPIN, MODEL, Results, Server, kill_all, no_leaks, server_env, tokenize, wait_idle

R = Results("e2e_server")
ok = R.ok


def lcp(a, b):
    n = 0
    while n < len(a) and n < len(b) and a[n] == b[n]:
        n += 1
    return n


# ---------------------------------------------------------------------------
def hostile(srv):
    """At least 40 malformed or hostile requests: right status, a clear
    OpenAI-style error body, and the server healthy afterwards."""
    C, X = "/v1/completions", "/v1/chat/completions"
    big = "word " * 3000  # more tokens than --ctx 512
    cases = [
        # (what, method, path, body, status, param or None)
        ("empty body", "POST", C, b"", 400, None),
        ("not JSON", "POST", C, b"{", 400, None),
        ("trailing garbage", "POST", C, b'{"prompt":"a"} x', 400, None),
        ("a JSON array", "POST", C, b"[1,2]", 400, None),
        ("JSON null", "POST", C, b"null", 400, None),
        ("duplicate keys", "POST", C, b'{"prompt":"a","prompt":"b"}', 400, None),
        ("deep nesting", "POST", C, b"[" * 20000 + b"]" * 20000, 400, None),
        ("invalid UTF-8", "POST", C, b'{"prompt":"\xff\xfe\xfd"}', 400, None),
        ("lone surrogate escape", "POST", C, b'{"prompt":"\\ud800"}', 400, None),
        ("NaN literal", "POST", C, b'{"prompt":"a","temperature":NaN}', 400, None),
        ("huge exponent", "POST", C, b'{"prompt":"a","temperature":1e999}', 400, None),
        ("prompt missing", "POST", C, {"max_tokens": 3}, 400, "prompt"),
        ("prompt a number", "POST", C, {"prompt": 5}, 400, "prompt"),
        ("prompt empty array", "POST", C, {"prompt": []}, 400, "prompt"),
        ("several prompts", "POST", C, {"prompt": ["a", "b"]}, 400, "prompt"),
        ("return_token_ids a string", "POST", C, {"prompt": "a", "return_token_ids": "yes"}, 400,
         "return_token_ids"),
        ("nested token arrays", "POST", C, {"prompt": [[1, 2]]}, 400, "prompt"),
        ("negative token id", "POST", C, {"prompt": [1, -1]}, 400, "prompt"),
        ("token id past the vocabulary", "POST", C, {"prompt": [1, 999999]}, 400, "prompt"),
        ("token id not an integer", "POST", C, {"prompt": [1, 2.5]}, 400, "prompt"),
        ("max_tokens a string", "POST", C, {"prompt": "a", "max_tokens": "10"}, 400, "max_tokens"),
        ("negative max_tokens", "POST", C, {"prompt": "a", "max_tokens": -1}, 400, "max_tokens"),
        ("fractional max_tokens", "POST", C, {"prompt": "a", "max_tokens": 1.5}, 400, "max_tokens"),
        ("huge max_tokens", "POST", C, {"prompt": "a", "max_tokens": 10 ** 30}, 400, None),  # a JSON parse error
        ("temperature a string", "POST", C, {"prompt": "a", "temperature": "hot"}, 400, "temperature"),
        ("temperature too high", "POST", C, {"prompt": "a", "temperature": 5}, 400, "temperature"),
        ("top_p above 1", "POST", C, {"prompt": "a", "top_p": 2}, 400, "top_p"),
        ("negative top_k", "POST", C, {"prompt": "a", "top_k": -1}, 400, "top_k"),
        ("negative min_p", "POST", C, {"prompt": "a", "min_p": -0.1}, 400, "min_p"),
        ("presence_penalty out of range", "POST", C, {"prompt": "a", "presence_penalty": 3}, 400,
         "presence_penalty"),
        ("seed a string", "POST", C, {"prompt": "a", "seed": "x"}, 400, "seed"),
        ("seed beyond 64 bits", "POST", C, {"prompt": "a", "seed": 10 ** 30}, 400, None),
        ("stop a number", "POST", C, {"prompt": "a", "stop": 5}, 400, "stop"),
        ("stop with a number", "POST", C, {"prompt": "a", "stop": ["x", 1]}, 400, "stop"),
        ("too many stops", "POST", C, {"prompt": "a", "stop": ["s%d" % i for i in range(17)]}, 400, "stop"),
        ("stream a string", "POST", C, {"prompt": "a", "stream": "yes"}, 400, "stream"),
        ("stream_options without stream", "POST", C,
         {"prompt": "a", "stream_options": {"include_usage": True}}, 400, "stream_options"),
        ("stream_options not an object", "POST", C,
         {"prompt": "a", "stream": True, "stream_options": [1]}, 400, "stream_options"),
        ("n of 17", "POST", C, {"prompt": "a", "n": 17}, 400, "n"),
        ("logprobs of 6", "POST", C, {"prompt": "a", "logprobs": 6}, 400, "logprobs"),
        ("echo not a boolean", "POST", C, {"prompt": "a", "echo": "yes"}, 400, "echo"),
        ("n_predict below -1", "POST", C, {"prompt": "a", "n_predict": -2}, 400, "n_predict"),
        ("prompt_cache_key a number", "POST", C, {"prompt": "a", "prompt_cache_key": 5}, 400, "prompt_cache_key"),
        ("prompt longer than the context", "POST", C, {"prompt": big, "max_tokens": 1}, 400, "prompt"),
        ("messages missing", "POST", X, {"max_tokens": 3}, 400, "messages"),
        ("messages empty", "POST", X, {"messages": []}, 400, "messages"),
        ("messages a string", "POST", X, {"messages": "hi"}, 400, "messages"),
        ("unknown role", "POST", X, {"messages": [{"role": "wizard", "content": "x"}]}, 400, "messages"),
        ("content a number", "POST", X, {"messages": [{"role": "user", "content": 5}]}, 400, "messages"),
        ("content missing", "POST", X, {"messages": [{"role": "user"}]}, 400, "messages"),
        ("image content part", "POST", X,
         {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, 400,
         "messages[0].content[0].type"),
        ("message not an object", "POST", X, {"messages": ["hi"]}, 400, "messages"),
        ("tools a string", "POST", X, {"messages": [{"role": "user", "content": "x"}], "tools": "x"}, 400, "tools"),
        ("a tool whose function is not an object", "POST", X,
         {"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": 3}]}, 400,
         "tools"),
        ("tool_choice required", "POST", X,
         {"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"}, 400, "tool_choice"),
        ("chat prompt too long", "POST", X, {"messages": [{"role": "user", "content": big}]}, 400, "messages"),
        ("tokenize content a number", "POST", "/tokenize", {"content": 5}, 400, "content"),
        ("tokenize unknown field", "POST", "/tokenize", {"content": "a", "x": 1}, 400, "x"),
        ("detokenize bad id", "POST", "/detokenize", {"tokens": [1, -5]}, 400, "tokens"),
        ("detokenize not a list", "POST", "/detokenize", {"tokens": "1 2"}, 400, "tokens"),
        ("probe with prompt and messages", "POST", "/v1/cache/probe",
         {"prompt": "a", "messages": [{"role": "user", "content": "a"}]}, 400, "prompt"),
        ("pin with a negative ttl", "POST", "/v1/cache/pin", {"prompt": "a", "ttl": -1}, 400, "ttl"),
        ("unpin an unknown id", "DELETE", "/v1/cache/pin/pin-424242", None, 404, "id"),
        ("unpin garbage", "DELETE", "/v1/cache/pin/x%ff", None, 404, "id"),
        ("unknown path", "GET", "/v2/everything", None, 404, None),
        ("wrong method", "GET", C, None, 405, None),
        ("wrong method on cache", "DELETE", "/v1/cache", None, 405, None),
    ]
    for what, method, path, body, status, param in cases:
        st, h, data = srv.request(method, path, body)
        try:
            j = json.loads(data)
        except ValueError:
            j = None
        ok(st == status, "%s: status %d, expected %d (%r)" % (what, st, status, data[:200]))
        good = isinstance(j, dict) and isinstance(j.get("error"), dict) and \
            isinstance(j["error"].get("message"), str) and len(j["error"]["message"]) > 5 and \
            isinstance(j["error"].get("type"), str) and "param" in j["error"] and "code" in j["error"]
        ok(good, "%s: not an OpenAI error body: %r" % (what, data[:200]))
        if good and param is not None:
            ok(j["error"]["param"] == param, "%s: param %r, expected %r" % (what, j["error"]["param"], param))
        if what == "wrong method":
            ok(h.get("Allow") == "POST", "405 without Allow: POST")
        if what == "prompt longer than the context" and good:
            ok(j["error"]["code"] == "context_length_exceeded" and "512" in j["error"]["message"],
               "the context error must say how long: %s" % j["error"])
    n = len(cases)

    # a body over --max-body (64K): 413, announced or not
    st, _, j = srv.post("/v1/completions", {"prompt": "x" * 70000})
    ok(st == 413 and "limit" in j["error"]["message"], "oversized body: %d %r" % (st, j))
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
    for _ in range(20):
        try:
            s.sendall(b"1000\r\n" + b"a" * 4096 + b"\r\n")
        except OSError:
            break
    try:
        s.sendall(b"0\r\n\r\n")
        resp = s.recv(200)
    except OSError:
        resp = b""
    s.close()
    ok(resp.startswith(b"HTTP/1.1 413"), "chunked body over the limit: %r" % resp[:60])
    # headers over the 64K connection limit
    st = None
    try:
        st, _, _ = srv.request("GET", "/health", headers={"X-Big": "a" * 80000})
    except (ConnectionError, http.client.HTTPException, OSError):
        st = "closed"
    ok(st in (413, 431, "closed"), "huge header: %r" % (st,))
    n += 3
    # a client that sends half a request and stalls is dropped after --timeout
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=20)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"pro")
    t0 = time.time()
    try:
        got = s.recv(100)
    except OSError:
        got = b""
    ok(got in (b"",) or got.startswith(b"HTTP/1.1 4"), "slow client: %r" % got[:40])
    ok(time.time() - t0 < 15, "slow client was not dropped in time")
    s.close()
    n += 1
    st, j = srv.get("/health")
    ok(st == 200 and j["status"] == "ok", "healthy after the hostile requests")
    no_leaks(R, srv, "after hostile requests")
    return n


def disconnects():
    """Clients that leave mid-stream or while waiting for a plain answer.
    A stream's failed write, or a connection reset (SO_LINGER 0), cancels
    the request at once. A plain answer's client that only closed cannot be
    told from one that half-closed (TCP shows both as the end of its input)
    until the answer is written, so that request runs to its max_tokens and
    is then freed. Either way what was computed stays cached."""
    srv = Server(R, "--ctx", "60000", "--parallel", "2")
    long_req = {"prompt": "Once upon a time", "max_tokens": 100000, "ignore_eos": True, "temperature": 0}
    def generated():
        m = srv.request("GET", "/metrics")[2].decode()
        return int(float(re.search(r"^kvpin_generated_tokens_total (\S+)$", m, re.M).group(1)))

    for how in ("stream", "reset", "close"):
        gen0 = generated()
        s = socket.create_connection(("127.0.0.1", srv.port), timeout=20)
        body = json.dumps(dict(long_req, stream=how == "stream",
                               max_tokens=300 if how == "close" else 100000)).encode()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(body) + body)
        if how == "stream":
            first = s.recv(200)
            ok(first.startswith(b"HTTP/1.1 200"), "stream start: %r" % first[:40])
        elif how == "reset":
            time.sleep(0.5)
            st, j = srv.get("/health")
            ok(j["running"] == 1, "the long request runs: %s" % j)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()
        if how == "close":  # it runs to its 300 tokens, then is freed
            deadline = time.time() + 60
            while generated() - gen0 < 300 and time.time() < deadline:
                time.sleep(0.05)
            ok(generated() - gen0 == 300, "the closed client's request generated %d of its 300 tokens" %
               (generated() - gen0))
        ok(wait_idle(srv, 60), "a client that left (%s) still holds its sequence" % how)
    m = srv.request("GET", "/metrics")[2].decode()
    ok(re.search(r"^kvpin_generations_cancelled_total 2$", m, re.M) is not None,
       "the stream and the reset request were cancelled, the closed one ran to its end")
    st, c = srv.get("/v1/cache")
    ok(c["counts"]["cached_tokens"] > 20, "what the cancelled requests computed stays cached: %s" % c["counts"])
    no_leaks(R, srv, "after disconnects")
    # SIGTERM while a stream and a plain request run: both end, the server exits at once
    live = []
    for stream in (True, False):
        s = socket.create_connection(("127.0.0.1", srv.port), timeout=20)
        body = json.dumps(dict(long_req, stream=stream)).encode()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        live.append(s)
    time.sleep(0.5)
    t0 = time.time()
    srv.stop()
    ok(time.time() - t0 < 10, "shutdown with live requests took %.1f s" % (time.time() - t0))
    for s in live:
        s.close()


def auth():
    srv = Server(R, "--api-key", "sekret", "--ctx", "256")
    st, _, j = srv.post("/v1/completions", {"prompt": "a", "max_tokens": 1})
    ok(st == 401 and j["error"]["code"] == "invalid_api_key", "no key: %d" % st)
    st, _, j = srv.post("/v1/completions", {"prompt": "a", "max_tokens": 1}, headers={"Authorization": "Bearer nope"})
    ok(st == 401, "wrong key: %d" % st)
    st, _, j = srv.post("/v1/completions", {"prompt": "a", "max_tokens": 1},
                        headers={"Authorization": "Bearer sekret"})
    ok(st == 200 and j["usage"]["completion_tokens"] == 1, "right key: %d %r" % (st, j))
    st, j = srv.get("/health")
    ok(st == 200, "/health needs no key")
    st, j = srv.get("/metrics")
    ok(st == 401, "/metrics needs the key")
    # RFC 7235: the scheme is case-insensitive, then one or more spaces
    body = {"prompt": "a", "max_tokens": 1}
    for value in ("bearer sekret", "BEARER sekret", "bEaReR sekret", "Bearer   sekret"):
        st, _, _ = srv.post("/v1/completions", body, headers={"Authorization": value})
        ok(st == 200, "Authorization: %r: %d" % (value, st))
    for value in ("Basic sekret", "Bearersekret", "Bearer", "Bearer sekret2", "Bearer sekre", "sekret"):
        st, _, _ = srv.post("/v1/completions", body, headers={"Authorization": value})
        ok(st == 401, "Authorization: %r: %d, expected 401" % (value, st))
    srv.stop()
    # without the key, 401 comes before 404, 405 and 413 (the client learns nothing of routes or limits)
    srv = Server(R, "--api-key", "sekret", "--ctx", "256", "--max-body", "4K")
    cases = [("unknown path", "GET", "/v2/everything", None, 404),
             ("wrong method", "GET", "/v1/completions", None, 405),
             ("unpin an unknown id", "DELETE", "/v1/cache/pin/pin-424242", None, 404),
             ("body over --max-body", "POST", "/v1/completions", {"prompt": "x" * 8000}, 413)]
    for what, method, path, body, status in cases:
        st, h, data = srv.request(method, path, body)
        ok(st == 401 and json.loads(data)["error"]["code"] == "invalid_api_key" and "Allow" not in h,
           "%s without the key: %d %r, expected 401" % (what, st, data[:100]))
        st, _, _ = srv.request(method, path, body, headers={"Authorization": "Bearer sekret"})
        ok(st == status, "%s with the key: %d, expected %d" % (what, st, status))
    srv.stop()


def start_fails(args, env=None):
    """kvpin serve ARGS that must refuse to start: (exit code, stderr)."""
    p = subprocess.run([KVPIN, "serve", "-m", MODEL, "--port", "0", "-t", "1", "--quiet"] + args,
                       env=server_env(env), capture_output=True, timeout=60)
    return p.returncode, p.stderr.decode(errors="replace")


def api_keys():
    """--api-key, else --api-key-file (first line, trailing whitespace cut), else $KVPIN_API_KEY."""
    d = tempfile.mkdtemp(prefix="kvpin-keys-")
    kf, empty, missing = os.path.join(d, "key"), os.path.join(d, "empty"), os.path.join(d, "missing")
    with open(kf, "w") as f:
        f.write("filekey \t\r\nsecond line\n")
    os.chmod(kf, 0o600)
    with open(empty, "w") as f:
        f.write("  \nkey on line two\n")

    def works(srv):
        """The keys among envkey, filekey, argkey, "second line" that the server takes."""
        got = set()
        for key in ("envkey", "filekey", "argkey", "second line"):
            st, _, _ = srv.request("GET", "/v1/models", headers={"Authorization": "Bearer " + key})
            if st == 200:
                got.add(key)
        st, _, _ = srv.request("GET", "/v1/models")
        ok(st == 401, "no key: %d" % st)
        return got

    env = {"KVPIN_API_KEY": "envkey"}
    srv = Server(R, "--ctx", "256", env=env)
    ok(works(srv) == {"envkey"}, "KVPIN_API_KEY alone is the key")
    srv.stop()
    srv = Server(R, "--ctx", "256", "--api-key-file", kf, env=env)
    ok(works(srv) == {"filekey"}, "--api-key-file wins over KVPIN_API_KEY, first line, whitespace trimmed")
    srv.stop()
    srv = Server(R, "--ctx", "256", "--api-key=argkey", "--api-key-file=" + kf, env=env)
    ok(works(srv) == {"argkey"}, "--api-key wins over both")
    with open("/proc/%d/cmdline" % srv.p.pid, "rb") as f:
        cmdline = f.read()
    ok(b"argkey" not in cmdline and b"--api-key=" in cmdline, "the key is blanked from ps: %r" % cmdline)
    srv.stop()
    for what, args, e, want in [
            ("an empty first line", ["--api-key-file", empty], None, "first line is empty"),
            ("a missing file", ["--api-key-file", missing], None, "cannot read --api-key-file " + missing),
            ("a directory", ["--api-key-file", d], None, d),
            ("a missing file next to --api-key", ["--api-key", "k", "--api-key-file", missing], None, missing),
            ("an empty --api-key", ["--api-key="], None, "--api-key must not be empty"),
            ("an empty KVPIN_API_KEY", [], {"KVPIN_API_KEY": ""}, "KVPIN_API_KEY is set but empty")]:
        rc, err = start_fails(args, e)
        ok(rc == 2 and want in err and len(err.strip().split("\n")) == 1,
           "%s: exit %d, expected 2 and one line with %r: %r" % (what, rc, want, err))
    for f in (kf, empty):
        os.unlink(f)
    os.rmdir(d)


def parallel_np():
    """-np 2 is --parallel 2: of three long requests two run, one waits."""
    srv = Server(R, "-np", "2", "--ctx", "60000")
    body = json.dumps({"prompt": "Once", "max_tokens": 100000, "ignore_eos": True, "stream": True}).encode()
    socks = []
    for _ in range(3):
        s = socket.create_connection((srv.host, srv.port), timeout=20)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        socks.append(s)
    deadline, j = time.time() + 10, {}
    while time.time() < deadline:
        st, j = srv.get("/health")
        if j.get("running", 0) + j.get("queued", 0) == 3 and j.get("queued") < 3:  # all in, admitted
            time.sleep(0.3)  # (more would run now if -np were not 2)
            st, j = srv.get("/health")
            break
        time.sleep(0.05)
    ok(j.get("running") == 2 and j.get("queued") == 1, "-np 2: %s" % j)
    for s in socks:
        s.close()
    ok(wait_idle(srv), "the -np 2 requests ended")
    srv.stop()


LOG_LINE = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3})Z ((?:[a-z_]+=\S+ ?)+)$")
LOG_KEYS = ["id", "client", "method", "path", "status", "error", "prompt", "cached", "computed", "cause",
            "completion", "finish", "preempted", "ttft_ms", "total_ms", "ignored"]


def log_lines(srv, n, seconds=10):
    """The request lines of srv's log (dicts, plus "time"), once there are n of them."""
    deadline = time.time() + seconds
    while True:
        lines = [l for l in srv.log_text().split("\n") if l and not l.startswith("kvpin serve:")]
        if len(lines) >= n or time.time() > deadline:
            break
        time.sleep(0.05)
    out = []
    for l in lines:
        m = LOG_LINE.match(l)
        if not ok(m is not None, "not a log line: %r" % l):
            continue
        kv = dict(f.split("=", 1) for f in m.group(2).split(" "))
        ok(list(kv) == LOG_KEYS, "log keys %s" % list(kv))
        kv["time"] = m.group(1)
        out.append(kv)
    return out


def request_log():
    """One line per request (errors too) with the status, id, tokens and cause the client saw; the id is
    the x-request-id header of every response, the client's own when sane."""
    import datetime
    t_start = datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None)
    srv = Server(R, "--ctx", "60000", "-np", "1", "--api-key", "k", "--max-body", "4K", quiet=False)
    A = {"Authorization": "Bearer k", "Content-Type": "application/json"}
    want = []  # (x-request-id seen, {field: expected})

    def gen_fields(j, finish):
        u, c = j["usage"], j["kvpin_cache"]
        return {"prompt": str(u["prompt_tokens"]), "cached": str(u["prompt_tokens_details"]["cached_tokens"]),
                "computed": str(c["computed_tokens"]), "cause": c["cause"], "completion": str(u["completion_tokens"]),
                "finish": finish, "preempted": str(c["preemptions"])}

    body = {"prompt": "Once upon a time", "max_tokens": 5, "temperature": 0}
    for rid in ("client-id-1", "client-id-2"):  # the second is a hit
        st, h, j = srv.post("/v1/completions", body, headers=dict(A, **{"X-Request-Id": rid}))
        ok(st == 200 and h.get("x-request-id") == rid, "the client's x-request-id echoed: %r" % h.get("x-request-id"))
        want.append((h.get("x-request-id"), dict(gen_fields(j, j["choices"][0]["finish_reason"]), status="200",
                                                 error="-", method="POST", path="/v1/completions")))
    ok(want[1][1]["cause"] == "hit", "the second request hits the cache: %s" % want[1][1])
    # insane ids are replaced by the server's own, unique per request
    for bad in ("x" * 65, "has space", "tab\there"):
        st, h, _ = srv.request("GET", "/v1/models", headers=dict(A, **{"X-Request-Id": bad}))
        rid = h.get("x-request-id", "")
        ok(st == 200 and rid and rid != bad and re.match(r"^[\x21-\x7e]{1,64}$", rid), "insane id %r -> %r" % (bad, rid))
        want.append((rid, {"status": "200", "error": "-", "method": "GET", "path": "/v1/models", "prompt": "-",
                           "cause": "-", "finish": "-", "preempted": "-"}))
    # a stream: the header on the stream's response, the usage of its last chunk in the line
    c = http.client.HTTPConnection(srv.host, srv.port, timeout=60)
    c.request("POST", "/v1/chat/completions", body=json.dumps(
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0, "stream": True,
         "stream_options": {"include_usage": True}}), headers=A)
    r = c.getresponse()
    rid = r.getheader("x-request-id")
    events = [json.loads(e[6:]) for e in r.read().split(b"\n\n") if e.startswith(b"data: {")]
    c.close()
    last = [e for e in events if e.get("usage")]
    finish = [e["choices"][0]["finish_reason"] for e in events if e["choices"] and e["choices"][0]["finish_reason"]]
    ok(r.status == 200 and rid and len(last) == 1 and len(finish) == 1, "stream: %s %r" % (r.status, rid))
    if last and finish:
        want.append((rid, dict(gen_fields(last[0], finish[0]), status="200", error="-",
                               path="/v1/chat/completions")))
    # errors: each with its status and code
    for what, method, path, b, headers, status, code in [
            ("no key", "GET", "/v2/x", None, {}, "401", "invalid_api_key"),
            ("unknown path", "GET", "/v2/x%20y", None, A, "404", "not_found"),
            ("wrong method", "GET", "/v1/completions", None, A, "405", "method_not_allowed"),
            ("bad JSON", "POST", "/v1/completions", b"{", A, "400", "-"),
            ("too long", "POST", "/v1/completions", {"prompt": "x" * 5000}, A, "413", "body_too_large"),
            ("bad field", "POST", "/v1/completions", {"prompt": "a", "top_k": -1}, A, "400", "-")]:
        st, h, data = srv.request(method, path, b, headers=headers)
        ok(str(st) == status and h.get("x-request-id"), "%s: %d %r" % (what, st, h.get("x-request-id")))
        want.append((h.get("x-request-id"), {"status": status, "error": code, "method": method, "path": path,
                                              "prompt": "-"}))
    # a client that leaves before its answer: 499
    st, h, j = srv.post("/tokenize", {"content": "Once", "add_special": True}, headers=A)
    want.append((h.get("x-request-id"), {"status": "200", "path": "/tokenize"}))
    s = socket.create_connection((srv.host, srv.port), timeout=20)
    lb = json.dumps({"prompt": "Once", "max_tokens": 100000, "ignore_eos": True}).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nAuthorization: Bearer k\r\nX-Request-Id: gone-1\r\n"
              b"Content-Length: %d\r\n\r\n" % len(lb) + lb)
    time.sleep(0.5)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # a reset: the client left
    s.close()
    want.append(("gone-1", {"status": "499", "error": "client_left", "finish": "client_left",
                            "prompt": str(len(j["tokens"]))}))
    ok(wait_idle(srv), "the request of the client that left ended")
    t_end = datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None)
    lines = log_lines(srv, len(want) + 1)  # wait_idle's /health requests are logged too
    by_id = {}
    for kv in lines:
        by_id.setdefault(kv["id"], []).append(kv)
    n_health = sum(1 for kv in lines if kv["path"] == "/health")
    ok(len(lines) == len(want) + n_health and n_health >= 1,
       "%d log lines for %d requests and %d /health" % (len(lines), len(want), n_health))
    for rid, fields in want:
        got = by_id.get(rid, [])
        if not ok(len(got) == 1, "request %r: %d log lines" % (rid, len(got))):
            continue
        kv = got[0]
        for k, v in fields.items():
            ok(kv[k] == v, "request %r: %s=%s, expected %s" % (rid, k, kv[k], v))
        t = datetime.datetime.strptime(kv["time"], "%Y-%m-%dT%H:%M:%S.%f")
        ok(t_start - datetime.timedelta(seconds=1) <= t <= t_end + datetime.timedelta(seconds=1),
           "request %r: time %s outside %s .. %s" % (rid, kv["time"], t_start, t_end))
        ok(re.match(r"^127\.0\.0\.1:\d+$", kv["client"]) is not None, "client %s" % kv["client"])
        ok(float(kv["total_ms"]) >= 0 and (kv["ttft_ms"] == "-" or float(kv["ttft_ms"]) <= float(kv["total_ms"])),
           "request %r: ttft %s, total %s" % (rid, kv["ttft_ms"], kv["total_ms"]))
        if fields.get("completion", "0") != "0" and fields["status"] == "200":
            ok(kv["ttft_ms"] != "-", "request %r: no time to first token" % rid)
    ok(len(set(kv["id"] for kv in lines)) == len(lines), "request ids are unique")
    ok("Application reported" not in srv.log_text(),
       "a client that left is its request's 499 line, not an error of libmicrohttpd's: %r" % [
           l for l in srv.log_text().split("\n") if "Application reported" in l])
    srv.stop()
    # --quiet: no request lines at all
    srv = Server(R, "--ctx", "256")
    srv.get("/health")
    srv.post("/v1/completions", {"prompt": "a", "max_tokens": 1})
    time.sleep(0.3)
    ok(not [l for l in srv.log_text().split("\n") if l and not l.startswith("kvpin serve:")],
       "--quiet logs no requests: %r" % srv.log_text()[-500:])
    srv.stop()


def ipv6():
    """--host ::1, [::1], :: and a host name; the URL printed has the brackets."""
    try:
        probe = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        probe.bind(("::1", 0))
        probe.close()
    except OSError as e:
        print("SKIP e2e_server: IPv6: this machine cannot bind ::1 (%s)" % e, flush=True)
        return
    for host in ("::1", "[::1]"):
        srv = Server(R, "--host", host, "--ctx", "256", quiet=False)
        ok(srv.url == "http://[::1]:%d" % srv.port, "--host %s: listening on %s" % (host, srv.url))
        st, _, j = srv.post("/v1/completions", {"prompt": "Once", "max_tokens": 2, "temperature": 0})
        ok(st == 200 and j["usage"]["completion_tokens"] == 2, "--host %s: a completion over ::1: %d" % (host, st))
        lines = log_lines(srv, 1)
        ok(len(lines) == 1 and re.match(r"^\[::1\]:\d+$", lines[0]["client"]) is not None,
           "--host %s: the client in the log: %s" % (host, lines and lines[0]["client"]))
        srv.stop()
    srv = Server(R, "--host", "::", "--ctx", "256")  # every address, IPv6 and IPv4
    ok(srv.url == "http://[::]:%d" % srv.port, "--host ::: %s" % srv.url)
    for h in ("::1", "127.0.0.1"):
        st, j = srv.get("/health") if h == "::1" else (srv.request("GET", "/health", host=h)[0], None)
        ok(st == 200, "--host ::, a client on %s: %s" % (h, st))
    srv.stop()
    srv = Server(R, "--host", "localhost", "--ctx", "256")
    ok(srv.url in ("http://127.0.0.1:%d" % srv.port, "http://[::1]:%d" % srv.port), "--host localhost: %s" % srv.url)
    ok(srv.get("/health")[0] == 200, "--host localhost answers")
    srv.stop()
    rc, err = start_fails(["--host", "no.such.host.invalid"])
    ok(rc == 1 and "cannot resolve --host no.such.host.invalid" in err, "an unknown host: %d %r" % (rc, err))


def queue_full():
    srv = Server(R, "--parallel", "1", "--queue", "1", "--ctx", "60000")
    socks = []
    body = json.dumps({"prompt": "Once", "max_tokens": 100000, "ignore_eos": True, "stream": True}).encode()
    for _ in range(2):  # one runs, one waits
        s = socket.create_connection(("127.0.0.1", srv.port), timeout=20)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        socks.append(s)
        time.sleep(0.3)
    st, h, j = srv.post("/v1/completions", {"prompt": "Once", "max_tokens": 2})
    ok(st == 503 and h.get("Retry-After") == "1" and "waiting" in j["error"]["message"],
       "queue full: %d %r %r" % (st, h.get("Retry-After"), j))
    for s in socks:
        s.close()
    ok(wait_idle(srv), "queued and running requests of clients that left are dropped")
    st, _, j = srv.post("/v1/completions", {"prompt": "Once", "max_tokens": 2})
    ok(st == 200, "serves again after the queue drained: %d" % st)
    no_leaks(R, srv, "after the queue test")
    srv.stop()


def agent_loop(srv):
    """Each turn resends the previous prompt + answer + a new tail; cached
    tokens must equal the longest common token prefix with anything earlier."""
    prompt = "System: You tell short stories to children.\nUser: Tell me about a cat.\nAssistant:"
    # token lists of what earlier requests left cached (prompt + answer; the
    # last sampled token is never fed back, so it has no K/V); the hostile
    # requests before left nothing cached
    st, c = srv.get("/v1/cache")
    ok(c["counts"]["cached_tokens"] == 0, "the cache is empty before the agent loop")
    history = []
    grew = 0
    last_cached = -1
    for turn in range(6):
        st, _, j = srv.post("/v1/completions", {"prompt": prompt, "max_tokens": 12, "temperature": 0})
        if not ok(st == 200, "turn %d: %d %r" % (turn, st, j)):
            return
        ids = tokenize(srv, prompt)
        want = max([lcp(ids, h) for h in history] or [0])
        if want == len(ids):
            want -= 1  # a full hit recomputes the last position
        cached = j["usage"]["prompt_tokens_details"]["cached_tokens"]
        ok(j["usage"]["prompt_tokens"] == len(ids), "turn %d prompt_tokens %d vs /tokenize %d" %
           (turn, j["usage"]["prompt_tokens"], len(ids)))
        ok(cached == want, "turn %d: cached_tokens %d, expected %d" % (turn, cached, want))
        ok(j["kvpin_cache"]["reused_tokens"] == cached, "turn %d: report and usage disagree" % turn)
        if turn > 0:
            ok(j["kvpin_cache"]["cause"] == "hit", "turn %d: cause %s" % (turn, j["kvpin_cache"]["cause"]))
        grew += cached > last_cached
        last_cached = cached
        answer = j["choices"][0]["text"]
        history.append(tokenize(srv, prompt + answer)[:-1])
        prompt = prompt + answer + "\nUser: And then what happened?\nAssistant:"
    ok(grew == 6, "cached_tokens must grow every turn")
    # a timestamp in the system prompt
    a = "System: it is 2026-11-28 09:14:03 UTC.\nYou are a careful assistant.\nUser: hello"
    b = a.replace("2026-11-28 09:14:03", "2026-11-29 10:02:41")
    srv.post("/v1/completions", {"prompt": a, "max_tokens": 2, "temperature": 0})
    st, _, j = srv.post("/v1/completions", {"prompt": b, "max_tokens": 2, "temperature": 0})
    d = len(os.path.commonprefix([a, b]))
    rep = j["kvpin_cache"]
    ok(rep["cause"] == "timestamp", "timestamp edit: cause %s (%s)" % (rep["cause"], rep["detail"]))
    ok(rep["diverged_at_byte"] == d, "timestamp edit: diverged_at_byte %d, expected %d" % (rep["diverged_at_byte"], d))
    ok("2026-11-28" in rep["cached_snippet"] and "2026-11-29" in rep["request_snippet"], "snippets: %s" % rep)
    ok(isinstance(rep["advice"], str) and "timestamp" in rep["advice"], "advice: %s" % rep["advice"])
    want = lcp(tokenize(srv, a), tokenize(srv, b))
    ok(j["usage"]["prompt_tokens_details"]["cached_tokens"] == want, "timestamp edit: cached %d, expected %d" %
       (j["usage"]["prompt_tokens_details"]["cached_tokens"], want))
    # the probe says the same without running the model
    st, _, p = srv.post("/v1/cache/probe", {"prompt": b.replace("hello", "bye")})
    ok(st == 200 and p["reused_tokens"] >= want and p["cause"] in ("hit", "other"), "probe: %r" % p)


def token_ids(srv):
    """return_token_ids: the prompt's ids equal /tokenize, the completion's
    ids detokenize to the text, and resending prompt + completion as ids
    reuses every token the cache holds."""
    prompt = "Once upon a time, there was a little dog named Max."
    body = {"prompt": prompt, "max_tokens": 10, "temperature": 0, "ignore_eos": True, "return_token_ids": True}
    st, _, j = srv.post("/v1/completions", body)
    if not ok(st == 200, "return_token_ids: %d %r" % (st, j)):
        return
    ch = j["choices"][0]
    ok(ch["prompt_token_ids"] == tokenize(srv, prompt), "prompt_token_ids vs /tokenize: %r" % ch["prompt_token_ids"])
    gen = ch["token_ids"]
    ok(len(gen) == j["usage"]["completion_tokens"] == 10, "token_ids: %d ids, usage %d" %
       (len(gen), j["usage"]["completion_tokens"]))
    # (detokenized after the prompt: a leading space of the first piece is kept there)
    st, _, d = srv.post("/detokenize", {"tokens": ch["prompt_token_ids"][1:] + gen})
    ok(st == 200 and d["content"] == prompt + ch["text"], "token_ids detokenize to %r, text %r" % (d, ch["text"]))
    # the next turn as ids: everything but the last sampled token is cached
    tail = tokenize(srv, " The end.")[1:]  # without the BOS
    again = ch["prompt_token_ids"] + gen + tail
    st, _, k = srv.post("/v1/completions", {"prompt": again, "max_tokens": 1, "temperature": 0})
    want = len(ch["prompt_token_ids"]) + len(gen) - 1
    ok(st == 200 and k["usage"]["prompt_tokens_details"]["cached_tokens"] == want,
       "resent as ids: cached %s, expected %d" % (k.get("usage"), want))
    ok("token_ids" not in k["choices"][0], "token ids only when asked for")
    # streamed: all the ids on the last chunk, the same as unstreamed
    body["stream"] = True
    c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=120)
    c.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    events = [json.loads(e[6:]) for e in c.getresponse().read().split(b"\n\n") if e.startswith(b"data: {")]
    c.close()
    with_ids = [e["choices"][0] for e in events if e["choices"] and "token_ids" in e["choices"][0]]
    ok(len(with_ids) == 1 and with_ids[0]["finish_reason"] == "length" and with_ids[0]["token_ids"] == gen and
       with_ids[0]["prompt_token_ids"] == ch["prompt_token_ids"], "streamed token ids: %r" % with_ids)
    # chat: the rendered prompt's ids
    st, _, j = srv.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
                                                 "temperature": 0, "return_token_ids": True})
    ch = j["choices"][0] if st == 200 else {}
    ok(st == 200 and len(ch["prompt_token_ids"]) == j["usage"]["prompt_tokens"] and
       len(ch["token_ids"]) == j["usage"]["completion_tokens"], "chat return_token_ids: %r" % j)


def sse(srv, body):
    """Streams a completion; returns (text, finish_reason, usage, saw_done)."""
    c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=120)
    c.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        return None, r.status, None, False
    text, finish, usage, done = "", None, None, False
    buf = b""
    while True:
        chunk = r.read1(4096) if hasattr(r, "read1") else r.read(1)
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf:
            ev, buf = buf.split(b"\n\n", 1)
            if not ev.startswith(b"data: "):
                continue
            data = ev[6:]
            if data == b"[DONE]":
                done = True
                continue
            j = json.loads(data)
            if j.get("choices"):
                text += j["choices"][0]["text"]
                finish = j["choices"][0]["finish_reason"] or finish
            if j.get("usage"):
                usage = j["usage"]
    c.close()
    return text, finish, usage, done


def concurrent(srv):
    """16 streaming clients at once; each output equals the request alone."""
    heads = ["Once upon a time, there was a little girl named Lily.", "The sun was shining and",
             "Tom had a big red ball."]
    reqs = []
    for i in range(16):
        p = heads[i % 3] + (" She" if i % 2 else " One day,") + " " * (i % 4)
        reqs.append({"prompt": p, "max_tokens": 16 + i, "temperature": 0, "stream": True,
                     "stream_options": {"include_usage": True}})
    out = [None] * 16
    threads = [threading.Thread(target=lambda k=k: out.__setitem__(k, sse(srv, reqs[k]))) for k in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    for k in range(16):
        text, finish, usage, done = out[k] or (None, None, None, False)
        if not ok(text is not None and done, "stream %d did not finish: %r" % (k, out[k])):
            continue
        alone = dict(reqs[k], stream=False)
        alone.pop("stream_options")
        st, _, j = srv.post("/v1/completions", alone)
        ok(st == 200 and text == j["choices"][0]["text"], "stream %d differs from the request alone:\n%r\n%r" %
           (k, text, j["choices"][0]["text"] if st == 200 else j))
        ok(usage and usage["completion_tokens"] == j["usage"]["completion_tokens"], "stream %d usage %r" % (k, usage))
        ok(finish == j["choices"][0]["finish_reason"], "stream %d finish %s" % (k, finish))
    ok(wait_idle(srv), "sequences left running after the concurrent streams")
    st, j = srv.get("/health")
    ok(st == 200, "healthy after 16 streams")
    st, m = srv.request("GET", "/metrics")[0], srv.request("GET", "/metrics")[2].decode()
    ok(re.search(r"^kvpin_prompt_tokens_cached_total [1-9]", m, re.M) is not None, "metrics: cached tokens")
    ok(re.search(r'^kvpin_time_to_first_token_seconds_count [1-9]', m, re.M) is not None, "metrics: ttft")
    ok(re.search(r'^kvpin_requests_total\{status="400"\} [1-9]', m, re.M) is not None, "metrics: 400s counted")


STRUCT_SCHEMA = {
    "type": "object",
    "properties": {
        "id": {"type": "string", "format": "uuid"},
        "who": {"$ref": "#/$defs/person"},
        "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 3},
        "parts": {"type": "array", "minItems": 1, "maxItems": 2, "items": {
            "type": "object", "properties": {"n": {"type": "integer"}, "ok": {"type": "boolean"}},
            "required": ["n", "ok"], "additionalProperties": False}},
        "next": {"anyOf": [{"$ref": "#"}, {"type": "null"}]},
    },
    "required": ["id", "who", "tags", "parts", "next"],
    "additionalProperties": False,
    "$defs": {"person": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}},
                         "required": ["name"], "additionalProperties": False}},
}


def structured(srv):
    """response_format json_schema (nested objects, arrays, enums, $ref,
    recursion) from eight clients at once, all batched together and sharing
    one compiled grammar: every answer ends with "stop", parses and
    validates (python3-jsonschema, formats checked); a keyword kvpin does not
    support is a 400 naming it, param response_format."""
    try:
        import jsonschema
    except ImportError:
        ok(False, "structured output: python3-jsonschema is needed (apt-get install python3-jsonschema)")
        return
    val = jsonschema.Draft202012Validator(STRUCT_SCHEMA, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    out = [None] * 8

    def one(k):
        out[k] = srv.post("/v1/chat/completions", {
            "messages": [{"role": "user", "content": "Fill in the form."}], "max_tokens": 400, "seed": k + 1,
            "response_format": {"type": "json_schema",
                                "json_schema": {"name": "form", "strict": k % 2 == 0, "schema": STRUCT_SCHEMA}}},
            timeout=180)
    threads = [threading.Thread(target=one, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(200)
    for k in range(8):
        st, _, j = out[k] or (None, None, None)
        if not ok(st == 200, "structured %d: %r %r" % (k, st, j)):
            continue
        c = j["choices"][0]
        text = c["message"]["content"]
        ok(c["finish_reason"] == "stop", "structured %d ended with %s: %r" % (k, c["finish_reason"], text))
        try:
            doc = json.loads(text)
        except ValueError as e:
            ok(False, "structured %d is not JSON (%s): %r" % (k, e, text))
            continue
        errs = [e.message for e in val.iter_errors(doc)]
        ok(not errs, "structured %d does not validate: %s: %r" % (k, errs[:3], text))
    bad = dict(STRUCT_SCHEMA, properties=dict(STRUCT_SCHEMA["properties"], n={"type": "number", "multipleOf": 2}))
    st, _, j = srv.post("/v1/chat/completions", {
        "messages": [{"role": "user", "content": "x"}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "bad", "schema": bad}}})
    e = j.get("error", {}) if isinstance(j, dict) else {}
    ok(st == 400 and e.get("param") == "response_format" and e.get("type") == "invalid_request_error" and
       "multipleOf" in e.get("message", "") and "#/properties/n" in e.get("message", ""),
       "unsupported keyword: %r %r" % (st, j))
    ok(wait_idle(srv), "sequences left running after the structured requests")


def cache_latency(srv, clients=8, n=30):
    """While `clients` streaming requests decode (each restarting when it
    ends), times n each of GET /v1/cache, POST /v1/cache/probe and DELETE
    /v1/cache/pin/{id} (one real pin, the rest unknown ids: 404, still served
    by the engine thread). Returns {endpoint: sorted seconds}."""
    st, _, pin = srv.post("/v1/cache/pin", {"prompt": "Pinned before the load starts.", "ttl": 0})
    ok(st == 200, "pin before the latency load: %r" % pin)
    stop = threading.Event()
    started = threading.Semaphore(0)

    def client(k):
        body = {"prompt": "Stream %d: once upon a time" % k, "max_tokens": 100000, "ignore_eos": True,
                "temperature": 0, "stream": True}
        first = True
        while not stop.is_set():
            c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=120)
            c.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
            r = c.getresponse()
            while not stop.is_set():
                if not r.read1(4096):
                    break
                if first:
                    first = False
                    started.release()
            c.close()

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    for _ in range(clients):
        started.acquire(timeout=60)
    times = {"GET /v1/cache": [], "POST /v1/cache/probe": [], "DELETE /v1/cache/pin": []}
    running = []
    for i in range(n):
        t0 = time.perf_counter()
        st, c = srv.get("/v1/cache")
        times["GET /v1/cache"].append(time.perf_counter() - t0)
        ok(st == 200, "GET /v1/cache under load: %d" % st)
        running.append(c["counts"]["running"] if st == 200 else 0)
        t0 = time.perf_counter()
        st, _, j = srv.post("/v1/cache/probe", {"prompt": "Pinned before the load starts, and then"})
        times["POST /v1/cache/probe"].append(time.perf_counter() - t0)
        ok(st == 200 and j["reused_tokens"] > 0, "probe under load: %d %r" % (st, j))
        pid = pin["id"] if i == 0 else "pin-%d" % (10 ** 9 + i)
        t0 = time.perf_counter()
        st, _, _ = srv.request("DELETE", "/v1/cache/pin/" + pid)
        times["DELETE /v1/cache/pin"].append(time.perf_counter() - t0)
        ok(st == (200 if i == 0 else 404), "unpin under load: %d" % st)
    stop.set()
    for t in threads:
        t.join(60)
    ok(min(running) == clients, "the %d streams were not all decoding while timed: %r" % (clients, running))
    return {k: sorted(v) for k, v in times.items()}


def p99(v):
    return v[min(len(v) - 1, int(0.99 * len(v)))]


def cache_under_load(srv):
    """Cache reads and operations answer at once while eight streams decode
    (they used to wait seconds for the engine's mutex)."""
    times = cache_latency(srv)
    for k, v in times.items():
        ok(p99(v) < 1.0, "%s under load: p99 %.3f s (median %.3f s)" % (k, p99(v), v[len(v) // 2]))
    ok(wait_idle(srv), "the streams of the latency load still run")


def pins(srv):
    st, _, j = srv.post("/v1/cache/pin", {"prompt": "A shared system prompt for every agent in the crew.", "ttl": 0})
    ok(st == 200 and j["id"].startswith("pin-") and j["tokens"] > 5 and j["bytes"] > 0, "pin: %r" % j)
    st, c = srv.get("/v1/cache")
    ok(c["counts"]["pins"] == 1 and c["kv"]["pinned_bytes"] >= j["bytes"], "pinned in /v1/cache: %s" % c["counts"])
    ok(any(p["pinned"] for p in c["prefixes"]), "a pinned prefix is listed")
    # another client cannot name it: the number alone, or a wrong tag, deletes nothing
    num = j["id"].split("-")[1]
    forged = "pin-%s-%016x" % (num, (int(j["id"].split("-")[2], 16) ^ 1) if j["id"].count("-") == 2 else 0)
    for guess in ("pin-" + num, forged, "pin-%d" % (int(num) + 1)):
        st, _, _ = srv.request("DELETE", "/v1/cache/pin/" + guess)
        ok(st == 404, "unpin by a guessed id %s: %d" % (guess, st))
    ok(srv.get("/v1/cache")[1]["counts"]["pins"] == 1, "the pin survives the guesses")
    st, _, d = srv.request("DELETE", "/v1/cache/pin/" + j["id"])
    ok(st == 200, "unpin: %d" % st)
    st, c = srv.get("/v1/cache")
    ok(c["counts"]["pins"] == 0 and c["kv"]["pinned_bytes"] == 0, "unpinned: %s" % c["counts"])


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city"]}}}


def permuted(v):
    """v with every object's members in reverse order."""
    if isinstance(v, dict):
        return {k: permuted(v[k]) for k in reversed(list(v))}
    if isinstance(v, list):
        return [permuted(x) for x in v]
    return v


def chat_events(srv, body):
    """Streams a chat completion; returns the parsed data events (None on error)."""
    c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=120)
    c.request("POST", "/v1/chat/completions", body=json.dumps(dict(body, stream=True)),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    if r.status != 200:
        return None
    return [json.loads(e[6:]) for e in data.split(b"\n\n") if e.startswith(b"data: {")]


def call_shape_ok(call):
    fn = call.get("function", {})
    try:
        args_ok = isinstance(json.loads(fn.get("arguments")), dict)
    except (TypeError, ValueError):
        args_ok = False
    return (re.fullmatch(r"call_[A-Za-z0-9]{24}", call.get("id", "")) is not None and call.get("type") == "function"
            and isinstance(fn.get("name"), str) and fn["name"] and args_ok)


def tools_generic():
    """Tools on a template without a tool syntax (chatml): the generic format."""
    srv = Server(R, "--ctx", "2048", "--chat-template", "chatml")
    canon = json.dumps(WEATHER, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    block = ("# Tools\n\nYou may call one or more functions to assist with the user query. The functions, one "
             "JSON object each:\n" + canon + "\n\nTo call functions, end your reply with one JSON object in this "
             "form, and nothing after it:\n"
             '{"tool_calls":[{"name":"<function-name>","arguments":<args-json-object>}]}')
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"}]
    base = {"messages": msgs, "max_tokens": 8, "temperature": 0, "return_token_ids": True}
    st, _, plain = srv.post("/v1/chat/completions", base)
    st1, _, one = srv.post("/v1/chat/completions", dict(base, tools=[WEATHER]))
    if not ok(st == 200 and st1 == 200, "tools on chatml: %d %r / %d %r" % (st, plain, st1, one)):
        srv.stop()
        return
    ok(one["usage"]["prompt_tokens"] > plain["usage"]["prompt_tokens"], "the tools are in the prompt")
    ids1 = one["choices"][0]["prompt_token_ids"]
    st, _, d = srv.post("/detokenize", {"tokens": ids1})
    want = ("<|im_start|>system\nBe brief.\n\n" + block + "<|im_end|>\n<|im_start|>user\nWeather in Paris?<|im_end|>\n"
            "<|im_start|>assistant\n")
    ok(st == 200 and d["content"].endswith(want), "the prompt is the documented rendering: %r" % d)
    # the same tools with their keys permuted, another question: cached past the tool block
    q2 = [msgs[0], {"role": "user", "content": "And in Oslo, please?"}]
    st, _, two = srv.post("/v1/chat/completions", dict(base, messages=q2, tools=[permuted(WEATHER)]))
    ids2 = two["choices"][0]["prompt_token_ids"] if st == 200 else []
    n = lcp(ids1, ids2)
    cached = two["usage"]["prompt_tokens_details"]["cached_tokens"] if st == 200 else -1
    ok(cached == n, "second request with the tools: cached %d, common prefix %d" % (cached, n))
    st, _, d = srv.post("/detokenize", {"tokens": ids2[:n]})
    ok(st == 200 and block + "<|im_end|>" in d["content"], "the cached prefix holds the whole tool block: %r" % d)
    # tool_choice none: no tools rendered
    st, _, none = srv.post("/v1/chat/completions", dict(base, tools=[WEATHER], tool_choice="none"))
    ok(st == 200 and none["usage"]["prompt_tokens"] == plain["usage"]["prompt_tokens"],
       "tool_choice none: %d prompt tokens, %d without tools" % (none["usage"]["prompt_tokens"] if st == 200 else -1,
                                                                 plain["usage"]["prompt_tokens"]))
    # a history with a call and its result: accepted, and the call is in the prompt in the reply shape
    hist = q2[:2] + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{ "city" : "Oslo" }'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    st, _, h = srv.post("/v1/chat/completions", dict(base, messages=hist, tools=[WEATHER]))
    st2, _, d = srv.post("/detokenize", {"tokens": h["choices"][0]["prompt_token_ids"] if st == 200 else [0]})
    ok(st == 200 and st2 == 200 and
       '<|im_start|>assistant\n{"tool_calls":[{"name":"get_weather","arguments":{"city":"Oslo"}}]}<|im_end|>\n'
       '<|im_start|>user\n{"tool_results":[{"tool_call_id":"call_1","name":"get_weather","content":"sunny"}]}'
       "<|im_end|>\n" in d["content"], "history with a tool call: %r" % (d,))
    # replies: OpenAI's shape whatever the model writes (a call is unlikely from this model)
    calls_seen = 0
    for seed in range(4):
        body = dict(base, tools=[WEATHER], seed=seed, temperature=1, max_tokens=24)
        st, _, j = srv.post("/v1/chat/completions", body)
        m = j["choices"][0]["message"] if st == 200 else {}
        fin = j["choices"][0]["finish_reason"] if st == 200 else None
        if m.get("tool_calls"):
            calls_seen += 1
            ok(fin == "tool_calls" and all(call_shape_ok(c) for c in m["tool_calls"]), "tool calls: %r" % j)
        else:
            ok(st == 200 and isinstance(m.get("content"), str) and fin in ("stop", "length"), "reply: %r" % j)
        ev = chat_events(srv, body)
        if not ok(ev is not None and len(ev) > 0, "streamed with tools"):
            continue
        content = "".join(e["choices"][0]["delta"].get("content") or "" for e in ev if e["choices"])
        deltas = [t for e in ev if e["choices"] for t in e["choices"][0]["delta"].get("tool_calls", [])]
        finish = [e["choices"][0]["finish_reason"] for e in ev if e["choices"] and e["choices"][0]["finish_reason"]]
        ok(content == (m.get("content") or ""), "streamed content %r, unstreamed %r" % (content, m.get("content")))
        ok(finish == [fin], "streamed finish %r, unstreamed %r" % (finish, fin))
        # per call: a first delta with index, id, type, name (arguments ""), then the arguments
        got = {}
        for t in deltas:
            c = got.setdefault(t["index"], {"id": None, "name": None, "arguments": ""})
            if "id" in t:
                ok(t.get("type") == "function" and c["id"] is None, "first delta of a call: %r" % t)
                c["id"], c["name"] = t["id"], t["function"]["name"]
            c["arguments"] += t["function"].get("arguments", "")
        want_calls = [(c["function"]["name"], c["function"]["arguments"]) for c in m.get("tool_calls") or []]
        ok([(got[i]["name"], got[i]["arguments"]) for i in sorted(got)] == want_calls,
           "streamed calls %r, unstreamed %r" % (got, want_calls))
    print("e2e_server: tools on chatml: %d of 4 replies were calls" % calls_seen)
    no_leaks(R, srv, "after the tool requests")
    srv.stop()


def main():
    try:
        srv = Server(R, "--ctx", "512", "--parallel", "8", "--max-body", "64K", "--timeout", "2",
                     "--chat-template", "chatml")
        n = hostile(srv)
        ok(n >= 40, "only %d hostile requests" % n)
        agent_loop(srv)
        token_ids(srv)
        pins(srv)
        cache_under_load(srv)
        concurrent(srv)
        structured(srv)
        no_leaks(R, srv, "at the end")
        srv.stop()
        auth()
        api_keys()
        request_log()
        ipv6()
        parallel_np()
        queue_full()
        disconnects()
        tools_generic()
    finally:
        kill_all()
    return R.finish()


if __name__ == "__main__":
    sys.exit(main())
