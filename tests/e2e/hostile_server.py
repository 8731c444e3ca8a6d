#!/usr/bin/env python3
"""Hostile tests of `kvpin serve` (run by tests/shell/e2e_hostile.sh): requests
that once got a wrong answer. Expected values come from the standards and
the API conventions, not from the server:
  - /detokenize of bytes that are not complete UTF-8: one U+FFFD per
    maximal invalid subpart (Unicode 15, 3.9 "U+FFFD Substitution of
    Maximal Subparts"), the rest of the text kept;
  - tools nested deeper than the limit: a 400 invalid_request_error naming
    `tools`, not `context_length_exceeded` (the prompt is not too long);
  - a client that half-closes (shutdown SHUT_WR) after a complete request
    still gets its answer: only a reset or a failed write means it left;
  - request framing (RFC 9112 6.3): two different Content-Length values,
    Content-Length with Transfer-Encoding, a Content-Length that is not a
    number get 400, an unknown transfer coding 501, all before the body;
  - slow clients (slowloris) from one address cannot lock others out, and a
    request whose head or body trickles in is cut at --request-timeout;
  - a web page cannot use the server (DNS rebinding, cross-site POSTs): a
    Host naming another domain gets 421 on every endpoint, the dashboard and
    /health included, while IP literals and localhost pass; a POST whose
    Content-Type is one a page may send without a CORS preflight
    (text/plain, a form: the Fetch standard's safelisted types) gets 415
    and computes nothing; no answer carries Access-Control-* headers
    unless --cors-origin names the Origin, and then a preflight is a 204;
  - control tokens cannot be injected through text: "</s>" and "<s>" in a
    message (or a completions prompt, unless parse_special) stay text, so
    the prompt holds BOS once, at the start, and no EOS. The same with a
    real Jinja template (--chat-template-file, Qwen3's), and with one that
    takes the client's text apart every way a template can (trim, slices,
    characters one by one, replace, split and join, %, case, tojson): its
    own {{ bos_token }} and {{ eos_token }} are the only control tokens.
  - schemas and grammars beyond a limit of the README's (enum values,
    anyOf branches, properties, the ways a grammar may go on at one point,
    GBNF alternatives and nesting) get a 400 invalid_request_error naming
    the limit, on /v1/chat/completions, /v1/messages and /v1/responses:
    never 503 "overloaded" with Retry-After (or Anthropic's 529), which
    the SDKs retry forever, nor context_length_exceeded for the tools that
    carry the schema; under the limits they generate: an enum of 2,048
    strings inside an object gives an object holding one of them (checked
    with Python's json and the enum itself), 50,000 GBNF alternatives one
    of them.
"""
import json
import re
import os
import socket
import sys
import tempfile
import threading
import time

from kvpin_test import Results, Server

R = Results("hostile_server")


def byte_ids(data):
    """Token ids of raw bytes in the bundled SentencePiece vocabulary:
    <0x00>..<0xFF> are ids 3..258."""
    return [3 + b for b in data]


def detokenize(srv):
    cases = [
        (b"\xe4", "\ufffd"),                                 # lead byte alone
        (b"\xe4\xb8\xad", "\u4e2d"),                          # a whole character
        (b"\xe4\xb8", "\ufffd"),                              # truncated: one maximal subpart
        (b"\xe4A", "\ufffdA"),                                # broken by an ASCII byte
        (b"A\xff\xfeB", "A\ufffd\ufffdB"),                    # bytes never valid
        (b"\xed\xa0\x80", "\ufffd\ufffd\ufffd"),              # a surrogate: each byte its own subpart
        (b"\xf0\x9f\x98\x80\xf0\x9f", "\U0001F600\ufffd"),    # a complete emoji then a cut one
    ]
    for raw, want in cases:
        st, _, j = srv.post("/detokenize", {"tokens": byte_ids(raw)})
        R.ok(st == 200 and j.get("content") == want,
             "/detokenize %r: %s %r, want %r" % (raw, st, j, want))


def deep_tools(srv):
    deep = '{"type":"object"}'
    for _ in range(600):
        deep = '{"type":"object","properties":{"x":%s}}' % deep
    body = ('{"messages":[{"role":"user","content":"hi"}],'
            '"tools":[{"type":"function","function":{"name":"f","parameters":%s}}]}' % deep)
    st, _, j = srv.post("/v1/chat/completions", body)
    err = j.get("error", {}) if isinstance(j, dict) else {}
    R.ok(st == 400 and err.get("type") == "invalid_request_error" and err.get("code") != "context_length_exceeded"
         and err.get("param") == "tools",
         "tools nested 600 deep: %s %s" % (st, err))
    st, j = srv.get("/health")
    R.ok(st == 200, "healthy after the deep tools")


def error_message(j):
    """The error's message in OpenAI's and Anthropic's shapes."""
    err = j.get("error", {}) if isinstance(j, dict) else {}
    return err.get("message", "") if isinstance(err, dict) else ""


def schema_bodies(schema):
    """(endpoint, body) pairs that constrain the output with schema: a
    response_format and a forced tool call on chat completions, a forced
    tool on Messages, a text.format on Responses."""
    msgs = [{"role": "user", "content": "hi"}]
    tool = {"type": "function", "function": {"name": "f", "parameters": schema}}
    return [
        ("/v1/chat/completions", {"messages": msgs, "max_tokens": 48, "temperature": 0,
                                  "response_format": {"type": "json_schema",
                                                      "json_schema": {"name": "n", "schema": schema}}}),
        ("/v1/chat/completions", {"messages": msgs, "max_tokens": 48, "temperature": 0,
                                  "tools": [tool], "tool_choice": "required"}),
        ("/v1/messages", {"model": "m", "messages": msgs, "max_tokens": 48, "temperature": 0,
                          "tools": [{"name": "f", "input_schema": schema}],
                          "tool_choice": {"type": "tool", "name": "f"}}),
        ("/v1/responses", {"input": "hi", "max_output_tokens": 48, "temperature": 0,
                           "text": {"format": {"type": "json_schema", "name": "n", "schema": schema}}}),
    ]


def generated_json(path, j):
    """The document a constrained answer generated (parsed), or None."""
    try:
        if path == "/v1/messages":
            return [b for b in j["content"] if b["type"] == "tool_use"][0]["input"]
        if path == "/v1/responses":
            parts = [c for it in j["output"] if it["type"] == "message" for c in it["content"]]
            return json.loads(parts[0]["text"])
        msg = j["choices"][0]["message"]
        if msg.get("tool_calls"):
            return json.loads(msg["tool_calls"][0]["function"]["arguments"])
        return json.loads(msg["content"])
    except (KeyError, IndexError, TypeError, ValueError):
        return None


def grammar_limits(srv):
    def obj(inner):
        return {"type": "object", "properties": {"e": inner}, "required": ["e"], "additionalProperties": False}

    def enum(n):
        return {"enum": ["value%d" % i for i in range(n)]}

    branches = [{"type": "object", "properties": {"a%d" % i: {"type": "integer"}, "b%d" % i: {"type": "integer"}},
                 "additionalProperties": False} for i in range(600)]
    over = [
        ("an enum of 10,001 strings", obj(enum(10001)), "KP_SCHEMA_MAX_ENUM"),
        ("an anyOf of 1,001 consts", obj({"anyOf": [{"const": "c%d" % i} for i in range(1001)]}), "KP_SCHEMA_MAX_ANYOF"),
        ("1,001 properties", {"type": "object", "properties": {"p%d" % i: {"type": "integer"} for i in range(1001)}},
         "KP_SCHEMA_MAX_PROPERTIES"),
        ("600 object branches at one point", obj({"anyOf": branches}), "KP_GRAMMAR_MAX_WIDTH"),
    ]
    for what, schema, limit in over:
        for path, body in schema_bodies(schema):
            st, h, j = srv.post(path, body)
            msg = error_message(j)
            retry = any(k.lower() == "retry-after" for k in h)
            R.ok(st == 400 and limit in msg and not retry,
                 "%s on %s: %s (retry-after: %s) %s" % (what, path, st, retry, msg[:200]))
    msgs = [{"role": "user", "content": "hi"}]
    gbnf_over = [
        ("100,001 GBNF alternatives", "root ::= " + " | ".join('"a%d"' % i for i in range(100001)) + "\n",
         "KP_GRAMMAR_MAX_ALTS"),
        ("GBNF groups 257 deep", "root ::= " + "(" * 257 + '"a"' + ")" * 257 + "\n", "KP_GRAMMAR_MAX_NESTING"),
    ]
    for what, text, limit in gbnf_over:
        st, h, j = srv.post("/v1/chat/completions", {"messages": msgs, "max_tokens": 8, "grammar": text})
        msg = error_message(j)
        R.ok(st == 400 and limit in msg and not any(k.lower() == "retry-after" for k in h),
             "%s: %s %s" % (what, st, msg[:200]))
    # under the limits: the enum of 2,048 inside an object generates one of
    # its values (where the schema is not also rendered into the prompt as a
    # tool, which the bundled model's context could not hold)
    values = set(enum(2048)["enum"])
    for path, body in schema_bodies(obj(enum(2048))):
        if "tools" in body:
            continue
        st, _, j = srv.post(path, body)
        doc = generated_json(path, j) if st == 200 else None
        R.ok(isinstance(doc, dict) and set(doc) == {"e"} and doc["e"] in values,
             "an enum of 2,048 inside an object on %s: %s %s" % (path, st, doc if doc is not None else str(j)[:300]))
    st, _, j = srv.post("/v1/chat/completions", {"messages": msgs, "max_tokens": 16, "temperature": 0,
                                                 "grammar": "root ::= " + " | ".join('"a%d"' % i for i in range(50000)) + "\n"})
    content = j["choices"][0]["message"]["content"] if st == 200 else None
    R.ok(content is not None and content.startswith("a") and content[1:].isdigit() and int(content[1:]) < 50000
         and str(int(content[1:])) == content[1:],
         "50,000 GBNF alternatives: %s %r" % (st, content if content is not None else str(j)[:300]))
    st, j = srv.get("/health")
    R.ok(st == 200, "healthy after the large schemas")


def raw(srv, data, shut_wr=False, timeout=20, source=None):
    """Sends raw bytes, optionally half-closes, and reads until the server
    closes the connection or `timeout` passes. Returns (bytes, seconds)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if source:
        s.bind((source, 0))
    s.settimeout(timeout)
    s.connect(("127.0.0.1", srv.port))
    t0 = time.time()
    s.sendall(data)
    if shut_wr:
        s.shutdown(socket.SHUT_WR)
    out = b""
    try:
        while True:
            b = s.recv(65536)
            if not b:
                break
            out += b
    except (socket.timeout, ConnectionResetError):
        pass
    s.close()
    return out, time.time() - t0


def half_close(srv):
    body = json.dumps({"prompt": [1, 5], "max_tokens": 64, "ignore_eos": True, "temperature": 0}).encode()
    req = (b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
           b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body)) + body
    answered = 0
    for _ in range(10):
        out, _ = raw(srv, req, shut_wr=True)
        head, _, payload = out.partition(b"\r\n\r\n")
        try:
            j = json.loads(payload)
            if head.startswith(b"HTTP/1.1 200") and j["usage"]["completion_tokens"] == 64:
                answered += 1
        except (ValueError, KeyError):
            pass
    R.ok(answered == 10, "half-closed clients answered: %d of 10" % answered)


def framing(srv):
    body = b'{"content": "Once upon a time"}'
    cases = [
        ("two different Content-Length", b"Content-Length: %d\r\nContent-Length: %d\r\n" % (len(body), len(body) + 2),
         400),
        ("Content-Length with chunked", b"Content-Length: %d\r\nTransfer-Encoding: chunked\r\n" % len(body), 400),
        ("Content-Length -5", b"Content-Length: -5\r\n", 400),
        ("Content-Length abc", b"Content-Length: abc\r\n", 400),
        ("Content-Length +5", b"Content-Length: +5\r\n", 400),
        ("Transfer-Encoding gzip", b"Transfer-Encoding: gzip\r\n", 501),
        ("Transfer-Encoding gzip, chunked", b"Transfer-Encoding: gzip, chunked\r\n", 501),
    ]
    for what, headers, want in cases:
        # the head only: the answer must come before any body is sent
        out, dt = raw(srv, b"POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" + headers + b"\r\n", timeout=10)
        R.ok(out.startswith(b"HTTP/1.1 %d" % want) and dt < 5,
             "%s: want %d at once, got %r after %.1f s" % (what, want, out[:60], dt))
    # what stays valid: the same length twice, and chunked alone
    out, _ = raw(srv, b"POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: %d\r\n"
                      b"Content-Length: %d\r\n\r\n" % (len(body), len(body)) + body)
    R.ok(out.startswith(b"HTTP/1.1 200"), "the same Content-Length twice is one length: %r" % out[:60])
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    out, _ = raw(srv, b"POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nConnection: close\r\n"
                      b"Transfer-Encoding: chunked\r\n\r\n" + chunked)
    R.ok(out.startswith(b"HTTP/1.1 200") and b'"tokens"' in out, "a chunked body: %r" % out[:60])
    st, j = srv.get("/health")
    R.ok(st == 200, "healthy after the framing cases")


def slowloris(per_address="32"):
    """256 connections from 127.0.0.2, each sending one byte of a request
    head every 1.5 s; meanwhile a client at 127.0.0.1 asks /health 10 times
    over 20 s. Every one must be answered, in well under a second."""
    srv = Server(R, "--timeout", "5", "--request-timeout", "6", "--max-connections", "128",
                 "--max-per-address", per_address)
    try:
        stop = threading.Event()
        opened = []  # attack connections the server accepted (the test needs them: an attack that never connects proves nothing)

        def attack():
            head = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 200
            conns = []
            for _ in range(256):
                try:
                    c = socket.socket()
                    c.bind(("127.0.0.2", 0))
                    c.settimeout(2)
                    c.connect(("127.0.0.1", srv.port))
                    conns.append([c, 0])
                except OSError:
                    pass
            opened.append(len(conns))
            while not stop.is_set():
                for e in conns:
                    c, i = e
                    if c is None:
                        continue
                    try:
                        c.send(head[i % len(head):i % len(head) + 1])
                        e[1] += 1
                    except OSError:
                        e[0] = None
                    if c is not None and e[0] is None:
                        c.close()
                stop.wait(1.5)
                # reconnect what the server cut, as an attacker would
                for e in conns:
                    if e[0] is None and not stop.is_set():
                        try:
                            c = socket.socket()
                            c.bind(("127.0.0.2", 0))
                            c.settimeout(2)
                            c.connect(("127.0.0.1", srv.port))
                            e[0], e[1] = c, 0
                        except OSError:
                            pass
            for c, _ in conns:
                if c:
                    c.close()

        t = threading.Thread(target=attack)
        t.start()
        time.sleep(3)
        served, worst = 0, 0.0
        for _ in range(10):
            t0 = time.time()
            try:
                st, j = srv.get("/health", timeout=5)
                if st == 200:
                    served += 1
                    worst = max(worst, time.time() - t0)
            except OSError:
                pass
            time.sleep(2)
        stop.set()
        t.join()
        R.ok(served == 10 and worst < 1.0, "during the attack: %d of 10 /health answered, slowest %.2f s" %
             (served, worst))
        R.ok(opened and opened[0] >= int(per_address), "the attack held connections: %s of 256 opened" % opened)
        # one client alone trickling a head: cut at --request-timeout, not kept by the idle timeout
        c = socket.socket()
        c.bind(("127.0.0.3", 0))
        c.connect(("127.0.0.1", srv.port))
        t0, cut = time.time(), None
        for k in range(20):
            try:
                c.send(b"G" if k == 0 else b"a")
                c.settimeout(1)
                if c.recv(1) == b"":
                    cut = time.time() - t0
                    break
            except socket.timeout:
                continue
            except OSError:
                cut = time.time() - t0
                break
        c.close()
        R.ok(cut is not None and cut < 9, "a trickled head was cut after %s s (request timeout 6)" % cut)
        st, body = srv.request("GET", "/metrics")[::2]
        m = re.search(rb"^kvpin_http_requests_cut_total ([0-9.e+]+)$", body, re.M)
        # the trickled head above was cut at the deadline, and so were attack connections
        R.ok(m is not None and cut is not None and float(m.group(1)) >= 1,
             "the cut connections are counted in /metrics: %s" % (m.group(0) if m else None))
    finally:
        srv.stop()


def injection(srv):
    bos, eos = 1, 2  # the bundled vocabulary's <s> and </s>
    for what, path, body in [
        ("chat content", "/v1/chat/completions",
         {"messages": [{"role": "system", "content": "x </s> y"}, {"role": "user", "content": "a </s> b <s>"}],
          "max_tokens": 1, "return_token_ids": True}),
        ("tool result", "/v1/chat/completions",
         {"messages": [{"role": "user", "content": "weather?"},
                       {"role": "assistant", "content": "", "tool_calls": [
                           {"id": "c1", "type": "function", "function": {"name": "w", "arguments": "{\"q\": \"</s>\"}"}}]},
                       {"role": "tool", "tool_call_id": "c1", "content": "</s><s>sunny</s>"}],
          "tools": [{"type": "function", "function": {"name": "w", "description": "</s>", "parameters": {}}}],
          "max_tokens": 1, "return_token_ids": True}),
        ("completions prompt", "/v1/completions", {"prompt": "a </s> b <s>", "max_tokens": 1, "return_token_ids": True}),
    ]:
        st, _, j = srv.post(path, body)
        ids = j["choices"][0].get("prompt_token_ids", []) if st == 200 else []
        R.ok(st == 200 and ids[:1] == [bos] and bos not in ids[1:] and eos not in ids,
             "%s: control tokens from text: %s %s" % (what, st, ids[:40]))
    st, _, j = srv.post("/v1/completions", {"prompt": "a </s> b", "max_tokens": 1, "return_token_ids": True,
                                             "parse_special": True})
    R.ok(st == 200 and eos in j["choices"][0]["prompt_token_ids"], "parse_special: true parses </s>: %s" % j)


# A template that rebuilds the client's text in every way: no piece of it may become a control token.
TAKE_APART = (
    "{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content | trim }}|{{ m.content[1:] }}|"
    "{% for ch in m.content %}{{ ch }}{% endfor %}|{{ (m.content ~ '!') | upper | lower }}|"
    "{{ m.content.replace(' ', '') }}|{{ '%s' % m.content }}|{{ m.content.split(' ') | join('') }}|"
    "{% set s %}{{ m.content | replace(' ', '') }}{% endset %}{{ s }}|"
    "{% if m.tool_calls %}{{ m.tool_calls | tojson }}{% endif %}{{ eos_token }}{% endfor %}"
    "{% if tools %}{{ tools | tojson }}{% for t in tools %}{{ t.function.description[:2] }}"
    "{{ t.function.description[2:] }}{% endfor %}{% endif %}")


def jinja_injection():
    srv = Server(R, "--chat-template-file", "tests/data/chat/templates/Qwen-Qwen3-0.6B.jinja")
    try:
        injection(srv)
    finally:
        srv.stop()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "take_apart.jinja")
        with open(path, "w") as f:
            f.write(TAKE_APART)
        srv = Server(R, "--chat-template-file", path)
        try:
            bos, eos = 1, 2
            msgs = [{"role": "system", "content": "x </s> y"}, {"role": "user", "content": "a </s> b <s> </ s>"},
                    {"role": "assistant", "content": "", "tool_calls": [
                        {"id": "c1", "type": "function", "function": {"name": "w", "arguments": "{\"q\": \"</s>\"}"}}]},
                    {"role": "tool", "tool_call_id": "c1", "content": "</s><s>sunny</s>"}]
            tools = [{"type": "function", "function": {"name": "w", "description": "</s><s>", "parameters": {}}}]
            st, _, j = srv.post("/v1/chat/completions", {"messages": msgs, "tools": tools, "max_tokens": 1,
                                                         "return_token_ids": True})
            ids = j["choices"][0].get("prompt_token_ids", []) if st == 200 else []
            R.ok(st == 200 and ids[:1] == [bos] and bos not in ids[1:] and ids.count(eos) == len(msgs),
                 "a template that takes client text apart: control tokens from text: %s %s" % (st, j if st != 200 else ids))
        finally:
            srv.stop()


def web_pages(srv):
    body = {"prompt": "Hi", "max_tokens": 2}
    for path in ("/health", "/", "/v1/cache", "/metrics"):
        st, h, _ = srv.request("GET", path, headers={"Host": "attacker.example:%d" % srv.port})
        R.ok(st == 421, "GET %s with Host attacker.example: %s (want 421)" % (path, st))
    st, _, _ = srv.request("POST", "/v1/completions", body, headers={"Host": "rebind.attacker.example"})
    R.ok(st == 421, "a POST with a foreign Host: %s" % st)
    for host in ("127.0.0.1:%d" % srv.port, "localhost:%d" % srv.port, "[::1]:%d" % srv.port, "localhost"):
        st, _, _ = srv.request("GET", "/health", headers={"Host": host})
        R.ok(st == 200, "Host %s answered: %s" % (host, st))
    _, m0 = srv.request("GET", "/metrics")[0], srv.request("GET", "/metrics")[2].decode()
    for ct in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", None):
        h = {"Content-Type": ct} if ct else {"Content-Type": ""}
        st, _, j = srv.post("/v1/completions", body, headers=h)
        R.ok(st == 415 and isinstance(j, dict) and j["error"]["code"] == "unsupported_media_type" and
             (ct or "") in j["error"]["message"], "a POST with Content-Type %r: %s %s" % (ct, st, j))
    m1 = srv.request("GET", "/metrics")[2].decode()
    prompt = lambda m: [l for l in m.splitlines() if l.startswith("kvpin_prompt_tokens_total")]
    R.ok(prompt(m0) == prompt(m1), "the refused POSTs computed nothing: %s -> %s" % (prompt(m0), prompt(m1)))
    st, h, _ = srv.request("GET", "/health", headers={"Origin": "https://evil.example"})
    R.ok(st == 200 and not any(k.lower().startswith("access-control") for k in h),
         "no CORS headers without --cors-origin: %s" % h)
    st, h, _ = srv.request("OPTIONS", "/v1/chat/completions", headers={"Origin": "https://evil.example",
                                                                      "Access-Control-Request-Method": "POST"})
    R.ok(st != 204 and not any(k.lower().startswith("access-control") for k in h), "no preflight: %s %s" % (st, h))


def cors():
    srv = Server(R, "--chat-template", "chatml", "--cors-origin", "https://app.example", "--allowed-hosts",
                 "kvpin.internal,.lab.example")
    try:
        st, h, _ = srv.request("OPTIONS", "/v1/chat/completions", headers={
            "Origin": "https://app.example", "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type"})
        allow_h = h.get("Access-Control-Allow-Headers", "").lower()
        R.ok(st == 204 and h.get("Access-Control-Allow-Origin") == "https://app.example" and
             "POST" in h.get("Access-Control-Allow-Methods", "") and "authorization" in allow_h and
             "content-type" in allow_h, "a preflight from the named origin: %s %s" % (st, h))
        st, h, _ = srv.post("/v1/completions", {"prompt": "Hi", "max_tokens": 2},
                            headers={"Origin": "https://app.example"})
        R.ok(st == 200 and h.get("Access-Control-Allow-Origin") == "https://app.example",
             "its POST may be read: %s %s" % (st, h.get("Access-Control-Allow-Origin")))
        st, h, _ = srv.post("/v1/completions", {"prompt": "Hi", "max_tokens": 2},
                            headers={"Origin": "https://other.example"})
        R.ok(st == 200 and "Access-Control-Allow-Origin" not in h, "another origin's may not: %s" % h)
        for host, want in (("kvpin.internal:8080", 200), ("gpu.lab.example", 200), ("lab.example", 200),
                           ("evil.example", 421)):
            st, _, _ = srv.request("GET", "/health", headers={"Host": host})
            R.ok(st == want, "--allowed-hosts: Host %s -> %s (want %d)" % (host, st, want))
    finally:
        srv.stop()


def main():
    srv = Server(R, "--chat-template", "qwen2.5")
    try:
        injection(srv)
        detokenize(srv)
        deep_tools(srv)
        grammar_limits(srv)
        half_close(srv)
        framing(srv)
        web_pages(srv)
    finally:
        srv.stop()
    cors()
    jinja_injection()
    slowloris(sys.argv[1] if len(sys.argv) > 1 else "32")
    return R.finish()


if __name__ == "__main__":
    sys.exit(main())
