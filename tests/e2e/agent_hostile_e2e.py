#!/usr/bin/env python3
"""Hostile inputs for the agent APIs, /v1/messages and /v1/responses (run by
tests/run_all.sh with the binary in $KVPIN), over real HTTP on
loopback.

Expected values come from outside the server's answer:
  - Anthropic's API reference: errors are {"type": "error", "error":
    {"type", "message"}} with invalid_request_error for a 400,
    authentication_error for a 401; at most 4 cache_control breakpoints;
    ttl "5m" or "1h"; max_tokens required; tool_result blocks answer a
    tool_use of the previous assistant message;
  - OpenAI's: errors {"error": {"message", "type", "param", "code"}}; an
    unknown previous_response_id or response id is a 404;
  - ids no other client can guess: every answer's id, tool-call id,
    item id and x-request-id differs from all others, also between
    requests in the same second with the same seed (a clock or a counter
    would repeat or be predictable), carries at least 64 random bits (hex
    of the documented length), and two request ids share no prefix (a
    start time or a counter in front);
  - invariants: after every refusal the server answers /health and holds no
    sequence or block beyond what its index caches (no_leaks); a breakpoint
    sent again refreshes its pin rather than adding one; a pin the
    pinned-bytes cap refuses is reported, the request still answers 200
    with usage adding up to count_tokens; stored responses stay within the
    store's bounds and store false keeps nothing; a client that leaves in
    the middle of a stream frees its sequence.
"""
import json
import socket
import time

from kvpin_test import Results, Server, no_leaks, tokenize, wait_idle

R = Results("e2e_agent_hostile")
M, CT, RS = "/v1/messages", "/v1/messages/count_tokens", "/v1/responses"
USER = [{"role": "user", "content": "Hi"}]


def anthropic_error(r, st, j, status, what, word=None):
    ok = R.ok(st == status, "%s: status %s (want %d): %s" % (what, st, status, j))
    ok = ok and R.ok(isinstance(j, dict) and j.get("type") == "error" and isinstance(j.get("error"), dict),
                     "%s: Anthropic's error shape: %s" % (what, j))
    if not ok:
        return
    want = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
            405: "invalid_request_error", 413: "request_too_large"}[status]
    R.ok(j["error"]["type"] == want, "%s: error type %s" % (what, j["error"]["type"]))
    if word:
        R.ok(word in j["error"]["message"], "%s: %r in %r" % (what, word, j["error"]["message"]))


def healthy(srv, what):
    st, j = srv.get("/health")
    R.ok(st == 200 and j["status"] == "ok", what + ": /health after it")
    wait_idle(srv)
    no_leaks(R, srv, what)


def messages(srv):
    base = {"model": "m", "max_tokens": 4, "messages": USER}
    cc = {"type": "ephemeral"}
    cases = [
        ("no max_tokens", {"model": "m", "messages": USER}, "max_tokens"),
        ("max_tokens 0", dict(base, max_tokens=0), "max_tokens"),
        ("max_tokens a string", dict(base, max_tokens="4"), "max_tokens"),
        ("no model", {"max_tokens": 4, "messages": USER}, "model"),
        ("messages not an array", dict(base, messages={"role": "user"}), "messages"),
        ("a tool role in messages", dict(base, messages=[{"role": "tool", "content": "x"}]), "role"),
        ("a tool_use in a system message", dict(base, messages=[{"role": "system", "content": [
            {"type": "tool_use", "id": "t", "name": "f", "input": {}}]}]), "text blocks only"),
        ("an unknown block type", dict(base, messages=[{"role": "user", "content": [{"type": "video"}]}]), "video"),
        ("an image block", dict(base, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}]), "image"),
        ("a document block", dict(base, messages=[{"role": "user", "content": [{"type": "document"}]}]), "document"),
        ("a text block without text", dict(base, messages=[{"role": "user", "content": [{"type": "text"}]}]), "text"),
        ("a tool_result for an unknown id", dict(base, messages=[{"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_ghost", "content": "x"}]}]), "toolu_ghost"),
        ("a tool_use in a user message", dict(base, messages=[{"role": "user", "content": [
            {"type": "tool_use", "id": "t", "name": "f", "input": {}}]}]), "assistant"),
        ("a tool_result after another tool_use", dict(base, messages=[
            {"role": "user", "content": "Q"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_a", "name": "f", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_b", "content": "x"}]}]),
         "toolu_b"),
        ("five breakpoints", dict(base, system=[{"type": "text", "text": "s%d" % i, "cache_control": cc}
                                                for i in range(5)]), "maximum of 4"),
        ("ttl 2h", dict(base, system=[{"type": "text", "text": "s", "cache_control": {"type": "ephemeral",
                                                                                     "ttl": "2h"}}]), "ttl"),
        ("ttl a number", dict(base, system=[{"type": "text", "text": "s", "cache_control": {"type": "ephemeral",
                                                                                           "ttl": 300}}]), "ttl"),
        ("cache_control not ephemeral", dict(base, system=[{"type": "text", "text": "s",
                                                            "cache_control": {"type": "forever"}}]), "ephemeral"),
        ("tool_choice any without tools", dict(base, tool_choice={"type": "any"}), "no tools"),
        ("tool_choice of an unknown tool", dict(base, tools=[{"name": "f", "input_schema": {"type": "object"}}],
                                                tool_choice={"type": "tool", "name": "g"}), "g"),
        ("a server tool", dict(base, tools=[{"type": "web_search_20250305", "name": "web_search"}]), "tool type"),
        ("temperature 2", dict(base, temperature=2), "temperature"),
        ("stop_sequences not strings", dict(base, stop_sequences=[1]), "stop_sequences"),
    ]
    for what, body, word in cases:
        st, _, j = srv.post(M, body)
        anthropic_error(R, st, j, 400, "messages: " + what, word)
    # what Claude Code 2.1 sends: max_tokens far above the context (cut at it)
    # and a system message among the turns (rendered in its place)
    st, _, j = srv.post(M, dict(base, max_tokens=10 ** 9, stop_sequences=["\n"]))
    R.ok(st == 200 and j["usage"]["output_tokens"] < 2048, "messages: huge max_tokens is cut at the context: %s %s" % (
        st, j.get("usage") if st == 200 else j))
    st, _, j = srv.post(M, dict(base, messages=USER + [{"role": "system", "content": "x"}, {"role": "user", "content": "y"}]))
    R.ok(st == 200 and j["type"] == "message", "messages: a system message among the turns: %s" % st)
    st, _, j = srv.post(M, "{not json")
    anthropic_error(R, st, j, 400, "messages: not JSON")
    st, _, j = srv.post(CT, {"model": "m", "messages": [{"role": "user", "content": [{"type": "image"}]}]})
    anthropic_error(R, st, j, 400, "count_tokens: an image block", "image")
    st, h, data = srv.request("GET", M)
    anthropic_error(R, st, json.loads(data), 405, "GET /v1/messages")
    healthy(srv, "messages refusals")

    # a breakpoint sent again refreshes its pin: one pin, however many times
    body = dict(base, system=[{"type": "text", "text": "A stable system prompt for the pin test.", "cache_control": cc}])
    pins = []
    for _ in range(3):
        st, _, j = srv.post(M, body)
        R.ok(st == 200, "a breakpoint request: %s %s" % (st, j))
        pins.append(j["kvpin_cache"]["cache_control"][0]["pin"])
    R.ok(len(set(pins)) == 3, "each hit makes the pin again: %s" % pins)
    st, c = srv.get("/v1/cache")
    R.ok(c["counts"]["pins"] == 1 and c["cache_control"]["live_pins"] == 1,
         "one pin for one breakpoint after three hits: %s %s" % (c["counts"], c["cache_control"]))

    # a client that leaves in the middle of a stream frees its sequence
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=30)
    b = json.dumps(dict(base, max_tokens=400, stream=True)).encode()
    s.sendall(b"POST /v1/messages HTTP/1.1\r\nHost: 127.0.0.1\r\nx-api-key: k\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n"
              % len(b) + b)
    got = b""
    while b"content_block_delta" not in got:
        chunk = s.recv(4096)
        if not chunk:
            break
        got += chunk
    R.ok(b"event: message_start" in got, "the stream began: %r" % got[:200])
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # reset on close
    s.close()
    time.sleep(0.5)
    healthy(srv, "a client leaving a Messages stream")


def responses(srv):
    cases = [
        ("an empty input", {"input": []}, "input"),
        ("an image part", {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
         "input[0].content[0].type"),
        ("an unknown item", {"input": [{"type": "computer_call"}]}, "input[0].type"),
        ("a function_call without arguments", {"input": [{"type": "function_call", "call_id": "c", "name": "f"}]},
         "input[0]"),
        ("an unknown tool type", {"input": "x", "tools": [{"type": "teleport"}]}, "tools[0]"),
        ("a namespace of a hosted tool", {"input": "x", "tools": [{"type": "namespace", "name": "n", "tools": [
            {"type": "web_search_preview"}]}]}, "tools[0].tools[0]"),
        ("a json_schema without schema", {"input": "x", "text": {"format": {"type": "json_schema", "name": "n"}}},
         "text.format.schema"),
        ("max_output_tokens -1", {"input": "x", "max_output_tokens": -1}, "max_output_tokens"),
        ("store a string", {"input": "x", "store": "no"}, "store"),
    ]
    for what, body, param in cases:
        st, _, j = srv.post(RS, dict(body, model="m"))
        R.ok(st == 400 and j.get("error", {}).get("param") == param,
             "responses: %s: %s %s (want 400 param %s)" % (what, st, j, param))
    st, _, j = srv.post(RS, {"model": "m", "input": "x", "previous_response_id": "resp_ghost"})
    R.ok(st == 404 and j["error"]["code"] == "previous_response_not_found", "an unknown previous_response_id: %s" % j)
    st, j = srv.get("/v1/responses/resp_ghost")
    R.ok(st == 404, "GET an unknown response: %s" % st)
    st, _, data = srv.request("DELETE", "/v1/responses/resp_ghost")
    R.ok(st == 404, "DELETE an unknown response: %s" % st)
    healthy(srv, "responses refusals")
    # the store: what is kept stays within its bounds; store false keeps nothing
    _, c0 = srv.get("/v1/cache")
    ids = []
    for i in range(4):
        st, _, j = srv.post(RS, {"model": "m", "input": "Hi %d" % i, "max_output_tokens": 2})
        R.ok(st == 200, "a stored response")
        ids.append(j["id"])
    st, _, j = srv.post(RS, {"model": "m", "input": "Hi", "max_output_tokens": 2, "store": False})
    _, c1 = srv.get("/v1/cache")
    r0, r1 = c0["responses"], c1["responses"]
    R.ok(r1["count"] == min(r0["count"] + 4, r1["max_count"]), "four stored, store false not: %s -> %s" % (r0, r1))
    R.ok(r1["bytes"] <= r1["max_bytes"] and r1["count"] <= r1["max_count"], "within the bounds: %s" % r1)
    for i in ids:
        st, _, _ = srv.request("DELETE", "/v1/responses/" + i)
        R.ok(st == 200, "DELETE a stored response")
    _, c2 = srv.get("/v1/cache")
    R.ok(c2["responses"]["count"] == r0["count"], "deleted: %s" % c2["responses"])


def ids(srv):
    """Ids from the kernel's CSPRNG: distinct across requests in the same
    second with the same seed, of the documented random length."""
    tool = {"name": "get_weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                                                     "required": ["city"]}}
    seen, req_ids = [], []
    for i in range(4):
        st, h, j = srv.post(M, {"model": "m", "max_tokens": 24, "messages": USER, "tools": [tool],
                                "tool_choice": {"type": "tool", "name": "get_weather"}, "temperature": 0})
        R.ok(st == 200, "a forced tool call: %s" % st)
        if st == 200:
            seen.append(j["id"])
            seen += [b["id"] for b in j["content"] if b["type"] == "tool_use"]
        req_ids.append(h.get("x-request-id", ""))
        st, h, j = srv.post("/v1/chat/completions", {"model": "m", "max_tokens": 2, "messages": USER, "seed": 7})
        if st == 200:
            seen.append(j["id"])
            R.ok(len(j["id"]) == len("chatcmpl-") + 32 and all(c in "0123456789abcdef" for c in j["id"][9:]),
                 "chatcmpl- and 32 hex digits: %s" % j["id"])
        req_ids.append(h.get("x-request-id", ""))
        st, h, j = srv.post(RS, {"model": "m", "input": "Hi", "max_output_tokens": 2, "seed": 7, "store": False})
        if st == 200:
            seen += [j["id"]] + [it["id"] for it in j["output"]]
        req_ids.append(h.get("x-request-id", ""))
    R.ok(len(seen) >= 16 and len(set(seen)) == len(seen), "%d ids, all distinct: %s" % (len(seen), seen))
    R.ok(len(set(req_ids)) == len(req_ids) and all(len(x) == 16 for x in req_ids),
         "request ids: 16 hex digits, all distinct: %s" % req_ids)
    st, h, _ = srv.request("GET", "/health")
    st2, h2, _ = srv.request("GET", "/health")
    a, b = h.get("x-request-id", ""), h2.get("x-request-id", "")
    R.ok(st == st2 == 200 and len(a) == len(b) == 16 and a != b and a[:8] != b[:8],
         "/health's request ids share no start time or counter: %s %s" % (a, b))


def pinned_cap():
    """A breakpoint longer than the pinned-bytes cap (half the pool): the pin
    is refused and reported, the request answers 200."""
    srv = Server(R, "--chat-template", "chatml", "--kv-type", "f32", "-c", "1024", "-np", "1", "--kv-budget", "2M")
    try:
        _, c = srv.get("/v1/cache")
        cap_tokens = c["kv"]["pinned_cap_bytes"] // c["kv"]["bytes_per_token"]
        total = c["kv"]["budget_bytes"] // c["kv"]["bytes_per_token"]
        word = "cats and dogs play "
        per = len(tokenize(srv, word * 10, add_special=False)) / 10
        n = int((cap_tokens + (min(total, 1024) - cap_tokens) // 2) / per)
        sysblock = [{"type": "text", "text": word * n, "cache_control": {"type": "ephemeral"}}]
        body = {"model": "m", "max_tokens": 2, "system": sysblock, "messages": USER}
        st, _, j = srv.post(M, body)
        R.ok(st == 200, "a breakpoint over the pinned cap still answers: %s %s" % (st, str(j)[:300]))
        if st == 200:
            bp = j["kvpin_cache"]["cache_control"][0]
            R.ok(bp["tokens"] > cap_tokens, "the prefix is longer than the cap: %s > %d" % (bp["tokens"], cap_tokens))
            R.ok(bp["pinned"] is False and bp["code"] == "pinned_cap", "the refusal reported: %s" % bp)
            u = j["usage"]
            _, _, ct = srv.post(CT, {"model": "m", "system": sysblock, "messages": USER})
            R.ok(u["input_tokens"] + u["cache_creation_input_tokens"] + u["cache_read_input_tokens"] == ct["input_tokens"],
                 "usage adds up: %s vs %s" % (u, ct))
        healthy(srv, "a refused pin")
    finally:
        srv.stop()


def main():
    srv = Server(R, "--chat-template", "chatml", "--kv-type", "f32", "--api-key", "k", "-c", "2048")
    try:
        st, _, j = srv.post(M, {"model": "m", "max_tokens": 2, "messages": USER}, headers={"x-api-key": "wrong"})
        anthropic_error(R, st, j, 401, "a wrong x-api-key")
        st, _, j = srv.post(M, {"model": "m", "max_tokens": 2, "messages": USER},
                            headers={"x-api-key": "k", "anthropic-version": "2023-06-01"})
        R.ok(st == 200 and j["type"] == "message", "x-api-key and anthropic-version accepted: %s" % st)
        st, _, j = srv.post(RS, {"model": "m", "input": "x", "max_output_tokens": 1}, headers={"x-api-key": "wrong"})
        R.ok(st == 401 and "error" in j and "message" in j["error"], "responses: 401 in OpenAI's shape: %s" % j)
        srv_k = _Keyed(srv, "k")
        messages(srv_k)
        responses(srv_k)
        ids(srv_k)
    finally:
        srv.stop()
    pinned_cap()
    return R.finish()


class _Keyed:
    """The server, every request with its key."""

    def __init__(self, srv, key):
        self.s, self.h, self.port = srv, {"Authorization": "Bearer " + key}, srv.port

    def post(self, path, body, **kw):
        return self.s.post(path, body, headers=self.h)

    def get(self, path, **kw):
        return self.s.get(path, headers=self.h)

    def request(self, method, path, body=None, **kw):
        return self.s.request(method, path, body, headers=self.h)


if __name__ == "__main__":
    raise SystemExit(main())
