#!/usr/bin/env python3
"""End-to-end tests of kvpin's request policy and the agent fields (run by
tests/run_all.sh with the binary in $KVPIN), over real HTTP on loopback.

Expected values come from outside the server's answer:
  - the field lists of the OpenAI chat/completions and completions API
    references (every field a client may send is accepted; the ones kvpin
    does not act on, and unknown ones, are named in x-kvpin-ignored-fields
    and in the log line's ignored=); --strict-api refuses unknown ones;
  - invariants: a developer message and text-part contents give the same
    prompt tokens (return_token_ids) as the equivalent system message and
    string contents; a pinned conversation is a token prefix of the next
    turn, so the next turn reuses every pinned token;
  - llama.cpp's prompt_progress shape (total, cache, processed, time_ms;
    processed counts the cached tokens; the first at the cache, the last at
    the total, never decreasing);
  - the bugs as found: --queue 0 answered 503 with a sequence free;
    /metrics had kvpin_kv_bytes_budget 0 before the first request;
  - kvpin run's progress bar on a terminal (a pty): the same greedy text as
    without one.
"""
import json
import re
import socket
import subprocess
import sys
import time

from kvpin_test import KVPIN, Results, Server, wait_idle, sse  # noqa: E402

R = Results("e2e_policy")
C, X = "/v1/completions", "/v1/chat/completions"
HDR = "x-kvpin-ignored-fields"
USER = [{"role": "user", "content": "Hi"}]


def ignored(h):
    v = {k.lower(): x for k, x in h.items()}.get(HDR)
    return v.split(",") if v else []


def fields_accepted(srv):
    """Every field of the two OpenAI endpoints that kvpin does not act on is
    accepted and named; the neutral values are not named; acted-on fields
    are not named."""
    chat_not_acted = {
        "reasoning_effort": "low", "safety_identifier": "u-1", "service_tier": "auto", "verbosity": "low",
        "modalities": ["text", "audio"], "prediction": {"type": "content", "content": "x"},
        "audio": {"voice": "alloy", "format": "wav"}, "web_search_options": {}, "store": True,
        "metadata": {"a": "b"}, "user": "someone", "logit_bias": {"5": 1}, "parallel_tool_calls": False,
        "functions": [{"name": "f"}], "function_call": "none",
    }
    body = dict(messages=USER, max_tokens=2, **chat_not_acted)
    st, h, j = srv.post(X, body)
    R.ok(st == 200, "chat with every not-acted field: %d %s" % (st, j))
    R.ok(sorted(ignored(h)) == sorted(chat_not_acted), "chat: named %s, want %s" % (ignored(h), sorted(chat_not_acted)))
    compl_not_acted = {"echo": True, "best_of": 2, "suffix": "end", "logit_bias": {"5": 1}, "user": "someone",
                       "store": True, "metadata": {}, "service_tier": "flex", "safety_identifier": "u"}
    st, h, j = srv.post(C, dict(prompt="Once", max_tokens=2, **compl_not_acted))
    R.ok(st == 200, "completions with every not-acted field: %d %s" % (st, j))
    R.ok(sorted(ignored(h)) == sorted(compl_not_acted), "completions: named %s" % ignored(h))
    # neutral values ask for what kvpin does: accepted and not named
    neutral = {"echo": False, "best_of": 1, "logit_bias": {}, "store": False, "suffix": None, "user": None,
               "logprobs": None, "n": 1, "cache_prompt": True, "grammar": None}
    st, h, j = srv.post(C, dict(prompt="Once", max_tokens=2, **neutral))
    R.ok(st == 200 and ignored(h) == [], "neutral values: %d, named %s" % (st, ignored(h)))
    st, h, j = srv.post(X, dict(messages=USER, max_tokens=2, modalities=["text"], parallel_tool_calls=True,
                                prediction=None, tool_choice="auto", response_format={"type": "text"}))
    R.ok(st == 200 and ignored(h) == [], "chat neutral values: %d, named %s" % (st, ignored(h)))
    # acted on, never named
    acted = {"temperature": 0, "top_p": 1, "seed": 3, "stop": ["zz"], "max_completion_tokens": 2,
             "presence_penalty": 0, "frequency_penalty": 0, "top_k": 5, "min_p": 0, "repeat_penalty": 1.1,
             "return_token_ids": True, "ignore_eos": False, "prompt_cache_key": "k", "add_generation_prompt": True,
             "chat_template_kwargs": {"add_generation_prompt": True}, "n_predict": 2}
    st, h, j = srv.post(X, dict(messages=USER, **acted))
    R.ok(st == 200 and ignored(h) == [], "acted-on fields: %d, named %s %s" % (st, ignored(h), j))
    # unknown fields, top level and nested: accepted and named by path
    msgs = [{"role": "system", "content": "S", "cache_control": {"type": "x"}},
            {"role": "user", "content": [{"type": "text", "text": "Hi", "cache_control": {}}]}]
    st, h, j = srv.post(X, {"messages": msgs, "max_tokens": 2, "frobnicate": 1, "stream_options": None,
                            "chat_template_kwargs": {"custom_var": 1}})
    want = ["frobnicate", "chat_template_kwargs.custom_var", "messages[0].cache_control",
            "messages[1].content[0].cache_control"]
    R.ok(st == 200 and sorted(ignored(h)) == sorted(want), "unknown fields named: %d %s" % (st, ignored(h)))
    # cache_prompt false: kvpin reuses anyway (cached equals recomputed), and says it did not act on it
    st, h, j = srv.post(C, {"prompt": "Once", "max_tokens": 1, "cache_prompt": False})
    R.ok(st == 200 and ignored(h) == ["cache_prompt"], "cache_prompt false named: %s" % ignored(h))
    # type checks still hold for not-acted fields
    for f, bad in (("user", 5), ("store", "yes"), ("metadata", []), ("reasoning_effort", 1), ("best_of", "2")):
        path = C if f == "best_of" else X
        body = {"prompt": "a"} if path == C else {"messages": USER}
        body[f] = bad
        st, _, j = srv.post(path, body)
        R.ok(st == 400 and j["error"]["param"] == f, "%s=%r: %d %s" % (f, bad, st, j))
    # fields kvpin acts on are checked, not named: accepted when they make sense, else a 400 naming them
    for f, v, want in (("n", 2, 200), ("logprobs", True, 200), ("top_logprobs", 3, 400), ("tool_choice", "required", 400),
                       ("response_format", {"type": "json_object"}, 200), ("grammar", "root ::= \"a\"", 200)):
        st, h, j = srv.post(X, {"messages": USER, "max_tokens": 2, f: v})
        R.ok(st == want and (st == 200 or j["error"]["param"] == f) and f not in ignored(h),
             "%s=%r: %d (want %d) %s" % (f, v, st, want, j if st != 200 else ""))
    # n_predict is max_tokens
    st, _, j = srv.post(C, {"prompt": "Once", "n_predict": 3, "ignore_eos": True})
    R.ok(st == 200 and j["usage"]["completion_tokens"] == 3, "n_predict 3: %s" % j.get("usage"))
    st, _, j = srv.post(C, {"prompt": "Once", "n_predict": 3, "max_tokens": 4})
    R.ok(st == 400 and j["error"]["param"] == "n_predict", "n_predict against max_tokens: %d" % st)
    # the header on a stream, and the log line
    hd, ev = sse(srv, X, {"messages": USER, "max_tokens": 2, "stream": True, "user": "u", "zzz": 1})
    R.ok(hd.get(HDR) == "user,zzz", "stream header: %r" % hd.get(HDR))
    R.ok(ev and ev[-1]["choices"][0]["finish_reason"] == "length", "the stream ends: %s" % ev[-1:])
    time.sleep(0.3)
    log = srv.log_text()
    R.ok(re.search(r" ignored=user,zzz$", log, re.M) is not None, "ignored= in the log line")
    R.ok(re.search(r"path=/v1/chat/completions status=400 .* ignored=-$", log, re.M) is not None,
         "ignored=- when none")


def strict():
    srv = Server(R, "--strict-api", "--chat-template", "chatml", "--ctx", "512")
    cases = [
        (C, {"prompt": "a", "frobnicate": 1}, "frobnicate"),
        (C, {"prompt": "a", "stream": True, "stream_options": {"foo": 1}}, "stream_options.foo"),
        (X, {"messages": [{"role": "user", "content": "x", "foo": 1}]}, "messages[0].foo"),
        (X, {"messages": [{"role": "user", "content": [{"type": "text", "text": "x", "z": 0}]}]},
         "messages[0].content[0].z"),
        (X, {"messages": USER, "tools": [{"type": "function", "function": {"name": "f"}, "extra": 1}]}, "tools[0].extra"),
    ]
    for path, body, param in cases:
        st, _, j = srv.post(path, body)
        R.ok(st == 400 and j["error"]["param"] == param and "unknown field" in j["error"]["message"],
             "--strict-api refuses %s: %d %s" % (param, st, j))
    # known fields it does not act on are still accepted, and named
    st, h, j = srv.post(X, {"messages": USER, "max_tokens": 1, "reasoning_effort": "high", "user": "u"})
    R.ok(st == 200 and ignored(h) == ["reasoning_effort", "user"], "--strict-api keeps OpenAI's fields: %d %s" %
         (st, ignored(h)))
    srv.stop()


def roles_and_parts(srv):
    """developer = system, text parts = strings: the same prompt tokens (an
    invariant), in every role; image, audio and file parts are a 400 naming
    the part."""
    def ids(messages):
        st, _, j = srv.post(X, {"messages": messages, "max_tokens": 1, "return_token_ids": True, "temperature": 0})
        R.ok(st == 200, "chat: %d %s" % (st, j))
        return j["choices"][0]["prompt_token_ids"] if st == 200 else None

    plain = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
             {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "Bye"}]
    dev = [dict(plain[0], role="developer")] + plain[1:]
    parts = [dict(m, content=[{"type": "text", "text": m["content"]}]) for m in dev]
    a, b, c = ids(plain), ids(dev), ids(parts)
    R.ok(a is not None and a == b, "developer gives the system message's tokens")
    R.ok(a is not None and a == c, "text parts give the strings' tokens")
    st, _, j = srv.post(X, {"messages": [{"role": "developer", "content": "x"}, {"role": "developer", "content": "y"},
                                         {"role": "user", "content": "z"}], "max_tokens": 1})
    R.ok(st == 200, "two developer messages: %d" % st)
    for kind, part in (("image_url", {"image_url": {"url": "data:image/png;base64,AAAA"}}),
                       ("input_audio", {"input_audio": {"data": "AAAA", "format": "wav"}}),
                       ("file", {"file": {"file_id": "f"}})):
        msgs = [{"role": "system", "content": "s"},
                {"role": "user", "content": [{"type": "text", "text": "look"}, dict(part, type=kind)]}]
        st, _, j = srv.post(X, {"messages": msgs})
        R.ok(st == 400 and j["error"]["param"] == "messages[1].content[1].type" and kind in j["error"]["message"],
             "%s part: %d %s" % (kind, st, j))


def cache_key_and_retention():
    srv = Server(R, "--chat-template", "chatml", "--ctx", "512")
    sysmsg = [{"role": "system", "content": "You are the helpful planner of a crew of agents. " * 3}]
    turns = [sysmsg + [{"role": "user", "content": "Step %d" % i}] for i in range(3)]
    rep = []
    for i, m in enumerate(turns):
        st, _, j = srv.post(X, {"messages": m, "max_tokens": 2, "prompt_cache_key": "planner"})
        R.ok(st == 200 and j["kvpin_cache"].get("prompt_cache_key") == "planner", "the key in kvpin_cache: %s" %
             j.get("kvpin_cache"))
        rep.append(j["usage"])
    st, _, j = srv.post(C, {"prompt": "Once", "max_tokens": 1, "prompt_cache_key": "other"})
    # the Responses API's prompt_cache_key is acted on too (not an ignored field)
    st, h, j = srv.post("/v1/responses", {"model": "m", "input": "Once", "max_output_tokens": 1,
                                          "prompt_cache_key": "codex-session"})
    R.ok(st == 200 and j["kvpin_cache"].get("prompt_cache_key") == "codex-session" and
         "prompt_cache_key" not in ignored(h), "responses: the key in kvpin_cache: %s, ignored %s" % (
             j.get("kvpin_cache") if st == 200 else j, ignored(h)))
    st, c = srv.get("/v1/cache")
    keys = {k["key"]: k for k in c.get("prompt_cache_keys", [])}
    R.ok(set(keys) == {"planner", "other", "codex-session"}, "keys in /v1/cache: %s" % list(keys))
    R.ok(keys.get("codex-session", {}).get("requests") == 1, "the Responses key counted: %s" % keys.get("codex-session"))
    p = keys.get("planner", {})
    want_prompt = sum(u["prompt_tokens"] for u in rep)
    want_cached = sum(u["prompt_tokens_details"]["cached_tokens"] for u in rep)
    R.ok(p.get("requests") == 3 and p.get("prompt_tokens") == want_prompt and p.get("cached_tokens") == want_cached,
         "per-key counts are the responses' usage: %s" % p)
    R.ok(want_prompt and abs(p.get("hit_ratio", -1) - want_cached / want_prompt) < 1e-9, "hit ratio: %s" % p)
    R.ok(keys.get("other", {}).get("requests") == 1, "the other key: %s" % keys.get("other"))
    # retention 24h: the prompt is pinned for a day, through the pin machinery
    t0 = int(time.time())
    st, _, j = srv.post(X, {"messages": turns[0], "max_tokens": 2, "prompt_cache_key": "planner",
                            "prompt_cache_retention": "24h"})
    r = j["kvpin_cache"].get("retention", {}) if st == 200 else {}
    R.ok(r.get("policy") == "24h" and r.get("pinned") is True and r.get("tokens") == j["usage"]["prompt_tokens"],
         "retention pinned: %s" % r)
    R.ok(t0 + 86400 <= r.get("expires_at", 0) <= int(time.time()) + 86400, "expires in 24 h: %s" % r)
    st, c = srv.get("/v1/cache")
    R.ok(c["counts"]["pins"] == 1 and c["kv"]["pinned_bytes"] > 0, "the pin in /v1/cache: %s" % c["counts"])
    bs = c["kv"]["block_bytes"] // c["kv"]["bytes_per_token"]
    R.ok(c["kv"]["pinned_bytes"] == -(-r.get("tokens", 0) // bs) * c["kv"]["block_bytes"],
         "the pinned bytes are the prompt's blocks: %s" % c["kv"])
    keys = {k["key"]: k for k in c["prompt_cache_keys"]}
    R.ok(keys["planner"]["retention_pin"] == r.get("pin"), "the key's retention pin: %s" % keys["planner"])
    # the next turn of the same key replaces the key's pin: one pin per key
    st, _, j = srv.post(X, {"messages": turns[1], "max_tokens": 2, "prompt_cache_key": "planner",
                            "prompt_cache_retention": "24h"})
    st, c = srv.get("/v1/cache")
    R.ok(c["counts"]["pins"] == 1, "one retention pin per key: %s" % c["counts"])
    # the pin can be removed with the pin API
    pin = {k["key"]: k for k in c["prompt_cache_keys"]}["planner"]["retention_pin"]
    st, _, _ = srv.request("DELETE", "/v1/cache/pin/" + pin)
    R.ok(st == 200, "the retention pin unpins: %d" % st)
    # in_memory: the default behaviour, no pin
    st, _, j = srv.post(X, {"messages": turns[2], "max_tokens": 1, "prompt_cache_retention": "in_memory"})
    R.ok(st == 200 and j["kvpin_cache"]["retention"] == {"policy": "in_memory"}, "in_memory: %s" % j.get("kvpin_cache"))
    st, c = srv.get("/v1/cache")
    R.ok(c["counts"]["pins"] == 0, "in_memory pins nothing: %s" % c["counts"])
    st, _, j = srv.post(X, {"messages": USER, "prompt_cache_retention": "forever"})
    R.ok(st == 400 and j["error"]["param"] == "prompt_cache_retention", "a bad retention: %d" % st)
    srv.stop()
    # the pinned-bytes cap refuses: kvpin_cache says so, with the numbers (a budget whose cap holds few tokens)
    srv = Server(R, "--chat-template", "chatml", "--ctx", "512", "--kv-budget", "256K")
    long_user = [{"role": "user", "content": "tell me a story about a dog and a cat " * 8}]
    st, _, j = srv.post(X, {"messages": long_user, "max_tokens": 1, "prompt_cache_retention": "24h"})
    r = j["kvpin_cache"].get("retention", {}) if st == 200 else {}
    R.ok(st == 200 and r.get("pinned") is False and r.get("code") == "pinned_cap" and
         "over the cap" in r.get("error", "") and r.get("pinned_cap_bytes", 0) > 0,
         "the cap refuses the retention pin: %d %s" % (st, r))
    srv.stop()


def progress():
    """return_progress on a chunked prefill (--prefill-chunk 8)."""
    srv = Server(R, "--chat-template", "chatml", "--ctx", "512", "--prefill-chunk", "8")
    prompt = "Once upon a time there was a little girl named Lily. She loved to play in the park with her dog. " * 3
    for path, body in ((C, {"prompt": prompt}), (X, {"messages": [{"role": "user", "content": prompt}]})):
        body = dict(body, max_tokens=2, stream=True, return_progress=True, stream_options={"include_usage": True})
        hd, ev = sse(srv, path, body)
        prog = [e["prompt_progress"] for e in ev if "prompt_progress" in e]
        usage = [e for e in ev if e.get("usage")]
        R.ok(len(prog) >= 2, "%s: progress events: %d" % (path, len(prog)))
        R.ok(all(e["choices"] == [] for e in ev if "prompt_progress" in e), "progress chunks carry no choices")
        R.ok(all(set(p) == {"total", "cache", "processed", "time_ms"} for p in prog), "shape: %s" % prog[:1])
        if prog and usage:
            u = usage[-1]["usage"]
            R.ok(all(p["total"] == u["prompt_tokens"] for p in prog), "total = prompt_tokens")
            R.ok(all(p["cache"] == u["prompt_tokens_details"]["cached_tokens"] for p in prog), "cache = cached_tokens")
            R.ok(prog[0]["processed"] == prog[0]["cache"] and prog[-1]["processed"] == prog[-1]["total"],
                 "from the cache to the total: %s" % prog)
            R.ok(all(a["processed"] <= b["processed"] and a["time_ms"] <= b["time_ms"] for a, b in zip(prog, prog[1:])),
                 "never decreasing: %s" % prog)
        first_text = next(i for i, e in enumerate(ev) if e["choices"] and
                          (e["choices"][0].get("text") or e["choices"][0].get("delta", {}).get("content")))
        last_prog = max(i for i, e in enumerate(ev) if "prompt_progress" in e)
        R.ok(last_prog < first_text, "progress comes before the text")
    # without stream it is named, not acted on
    st, h, j = srv.post(C, {"prompt": "Once", "max_tokens": 1, "return_progress": True})
    R.ok(st == 200 and ignored(h) == ["return_progress"], "return_progress without stream: %s" % ignored(h))
    srv.stop()


def raw_stream(srv, path, body):
    """The stream's blocks in order (comments included), each with the time
    since the request was sent, and the time the response head came."""
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=60)
    b = json.dumps(body).encode()
    t0 = time.time()
    s.sendall(b"POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
              b"Connection: close\r\n\r\n" % (path.encode(), len(b)) + b)
    data, t_head = b"", None
    while True:
        got = s.recv(65536)
        if not got:
            break
        if t_head is None:
            t_head = time.time() - t0
        data += got
    s.close()
    head, _, rest = data.partition(b"\r\n\r\n")
    text = b""
    while rest:  # undo the chunking
        n, _, rest = rest.partition(b"\r\n")
        n = int(n, 16)
        if n == 0:
            break
        text, rest = text + rest[:n], rest[n + 2:]
    return head.split(b"\r\n")[0].decode(), [blk for blk in text.decode().split("\n\n") if blk], t_head


def first_byte():
    """Every streaming endpoint answers at admission, before the prompt is
    computed, and keeps the stream alive while it is (a comment line for
    OpenAI's chunks, ping for Messages, response.in_progress for
    Responses), whatever return_progress says. The prefill is cut in
    slices of 8 tokens (--prefill-chunk 8), so a prompt of about 2,000
    tokens takes about 250 steps: an event between the head and the first
    token proves the head went out before the prompt was computed."""
    srv = Server(R, "--chat-template", "chatml", "--ctx", "4096", "--prefill-chunk", "8")
    story = "Once upon a time there was a little girl named Lily who loved to play in the park with her dog. " * 20
    try:
        cases = [
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": story}], "max_tokens": 3,
                                      "stream": True, "seed": 1},
             lambda b: b.startswith(": prefill "), lambda b: '"content":"' in b and '"content":""' not in b,
             lambda b: '"role":"assistant"' in b),
            ("/v1/completions", {"prompt": story, "max_tokens": 3, "stream": True, "seed": 1},
             lambda b: b.startswith(": prefill "), lambda b: '"text":"' in b and '"text":""' not in b, None),
            ("/v1/messages", {"model": "m", "max_tokens": 3, "stream": True,
                              "messages": [{"role": "user", "content": story + " x"}]},
             lambda b: b.startswith("event: ping"), lambda b: b.startswith("event: content_block_delta"),
             lambda b: b.startswith("event: message_start")),
            ("/v1/responses", {"model": "m", "input": story + " y", "max_output_tokens": 3, "stream": True},
             lambda b: b.startswith("event: response.in_progress"),
             lambda b: b.startswith("event: response.output_text.delta"),
             lambda b: b.startswith("event: response.created")),
        ]
        for path, body, keepalive, token, opener in cases:
            status, blocks, t_head = raw_stream(srv, path, body)
            if not R.ok(status.endswith(" 200 OK") and blocks, "%s: a stream (%s)" % (path, status)):
                continue
            first_tok = next((i for i, b in enumerate(blocks) if token(b)), len(blocks))
            alive = [i for i, b in enumerate(blocks[:first_tok]) if keepalive(b)]
            # the opening event and one keep-alive at least (OpenAI: the comment at admission, N < M)
            R.ok(len(alive) >= (1 if path.endswith("completions") else 2),
                 "%s: keep-alive events while the prompt is computed, before the first token: "
                 "%d (first byte after %.3f s; blocks %s)" % (path, len(alive), t_head,
                                                            [b[:40] for b in blocks[:first_tok + 1]]))
            if opener:
                R.ok(opener(blocks[0]), "%s: the opening event first: %r" % (path, blocks[0][:60]))
            if path.endswith("completions"):
                done = [b for b in blocks if b.startswith(": prefill ")]
                nums = [tuple(map(int, b.split()[2].split("/"))) for b in done]
                R.ok(all(a < t for a, t in nums) and nums == sorted(nums),
                     "%s: the comments count up, below the prompt's tokens: %s" % (path, nums))
        # return_progress still gives llama.cpp's objects, and no comments
        status, blocks, _ = raw_stream(srv, "/v1/completions", {"prompt": story, "max_tokens": 2, "stream": True,
                                                                "return_progress": True})
        R.ok(any('"prompt_progress"' in b for b in blocks) and not any(b.startswith(": prefill") for b in blocks),
             "return_progress: prompt_progress chunks instead of comments")
    finally:
        srv.stop()


def volatile():
    """Per-session text at the start of a system message is left out of the
    prompt: Claude Code's billing header by default, --volatile-prefix
    patterns too. Oracles: count_tokens / the report of the same request
    without the text (the prompt is the same tokens), /metrics, and the
    second session's reuse of the first's system prompt."""
    def billing(tail):
        return "x-anthropic-billing-header: cc_version=2.1.332.%s; cc_entrypoint=sdk-cli;" % tail
    long_sys = "You are an agent working with the user toward their goals, using your own judgment. " * 8

    def body(head, user, **kw):
        system = ([{"type": "text", "text": head}] if head else []) + [
            {"type": "text", "text": long_sys, "cache_control": {"type": "ephemeral"}}]
        return dict({"model": "m", "max_tokens": 2, "system": system,
                     "messages": [{"role": "user", "content": user}]}, **kw)

    def sys_tokens(srv):
        """The tokens of the system prompt alone (its rendering is a prefix of every turn's)."""
        st, _, j = srv.post("/v1/cache/probe", {"messages": [{"role": "system", "content": long_sys}],
                                                "add_generation_prompt": False})
        return j["prompt_tokens"] if st == 200 else -1

    srv = Server(R, "--chat-template", "chatml", "--ctx", "2048")
    try:
        _, _, plain = srv.post("/v1/messages/count_tokens", {k: v for k, v in body(None, "Hi").items()
                                                             if k != "max_tokens"})
        _, _, with_h = srv.post("/v1/messages/count_tokens", {k: v for k, v in body(billing("0b8"), "Hi").items()
                                                              if k != "max_tokens"})
        R.ok(plain["input_tokens"] == with_h["input_tokens"], "the header adds no token: %s vs %s" % (plain, with_h))
        st, _, a = srv.post("/v1/messages", body(billing("0b8"), "Hi"))
        d = a.get("kvpin_cache", {}).get("dropped_volatile_block") if st == 200 else None
        R.ok(d == {"texts": 1, "bytes": len(billing("0b8")), "patterns": ["claude-code-billing"]},
             "the report names the dropped block: %s" % d)
        st, _, b = srv.post("/v1/messages", body(billing("1c9"), "What now?"))
        ksys = sys_tokens(srv)
        R.ok(st == 200 and ksys > 100 and b["kvpin_cache"]["reused_tokens"] >= ksys,
             "a new session (another header) reuses the system prompt: %s of %d" % (
                 b.get("kvpin_cache", {}).get("reused_tokens"), plain["input_tokens"]))
        # a user's text is never touched
        st, _, u = srv.post("/v1/messages", {"model": "m", "max_tokens": 1,
                                             "messages": [{"role": "user", "content": billing("0b8")}]})
        R.ok(st == 200 and "dropped_volatile_block" not in u["kvpin_cache"], "a user message keeps the text")
        st, m = srv.get("/metrics")
        n = [l for l in m.decode().split("\n") if l.startswith("kvpin_volatile_blocks_dropped_total ")]
        R.ok(n == ["kvpin_volatile_blocks_dropped_total 2"], "the counter: %s" % n)
    finally:
        srv.stop()
    # --keep-volatile: the header stays, and the tokens show it
    srv = Server(R, "--chat-template", "chatml", "--ctx", "2048", "--keep-volatile")
    try:
        _, _, kept = srv.post("/v1/messages/count_tokens", {k: v for k, v in body(billing("0b8"), "Hi").items()
                                                            if k != "max_tokens"})
        R.ok(kept["input_tokens"] > plain["input_tokens"], "--keep-volatile keeps the header: %s vs %s" % (
            kept, plain))
        st, _, a = srv.post("/v1/messages", body(billing("0b8"), "Hi"))
        R.ok(st == 200 and "dropped_volatile_block" not in a["kvpin_cache"], "no dropped block reported")
    finally:
        srv.stop()
    # --volatile-prefix on chat completions: a session line before the system prompt
    srv = Server(R, "--chat-template", "chatml", "--ctx", "2048", "--volatile-prefix", "Session [0-9a-f]+\n")
    try:
        def chat(sid, user):
            return srv.post(X, {"messages": [{"role": "system", "content": "Session %s\n%s" % (sid, long_sys)},
                                             {"role": "user", "content": user}], "max_tokens": 1})
        st, _, a = chat("1a2b", "Hi")
        st2, _, b = chat("99ff", "Hello again")
        _, _, ref = srv.post("/v1/cache/probe", {"messages": [{"role": "system", "content": long_sys},
                                                              {"role": "user", "content": "Hi"}]})
        R.ok(st == 200 and a["usage"]["prompt_tokens"] == ref["prompt_tokens"],
             "the prompt is the one without the session line: %s vs %s" % (a.get("usage"), ref.get("prompt_tokens")))
        R.ok(st2 == 200 and b["kvpin_cache"]["dropped_volatile_block"]["patterns"] == ["Session [0-9a-f]+\n"] and
             b["kvpin_cache"]["reused_tokens"] >= sys_tokens(srv) > 100,
             "another session reuses the system prompt: %s" % b.get("kvpin_cache"))
    finally:
        srv.stop()
    p = subprocess.run([KVPIN, "serve", "--port", "0", "--volatile-prefix", "(unclosed"], capture_output=True,
                       text=True, timeout=30)
    R.ok(p.returncode == 2 and "(unclosed" in p.stderr and "missing closing parenthesis" in p.stderr,
         "a pattern that does not compile: exit %d %r" % (p.returncode, p.stderr[-300:]))


def max_tokens_cap():
    """--max-tokens-cap N: no answer is longer than N tokens, through every
    API, and the report says when the cap lowered the request's max_tokens."""
    srv = Server(R, "--chat-template", "chatml", "--ctx", "1024", "--max-tokens-cap", "3")
    try:
        st, _, j = srv.post(C, {"prompt": "Once", "max_tokens": 50, "ignore_eos": True})
        R.ok(st == 200 and j["usage"]["completion_tokens"] == 3 and j["choices"][0]["finish_reason"] == "stop" and
             j["kvpin_cache"].get("max_tokens_cap") == 3, "completions capped, the turn ended: %r" % (
                 (j if st != 200 else (j["usage"], j["choices"][0]["finish_reason"])),))
        st, _, j = srv.post(X, {"messages": USER, "ignore_eos": True})  # no max_tokens: the context, capped
        R.ok(st == 200 and j["usage"]["completion_tokens"] == 3, "chat without max_tokens capped: %s" % j.get("usage"))
        st, _, j = srv.post(C, {"prompt": "Once", "max_tokens": 2, "ignore_eos": True})
        R.ok(st == 200 and j["usage"]["completion_tokens"] == 2 and "max_tokens_cap" not in j["kvpin_cache"],
             "under the cap: untouched, not reported")
        st, _, j = srv.post("/v1/messages", {"model": "m", "max_tokens": 1000,
                                             "messages": [{"role": "user", "content": "Hi"}]})
        R.ok(st == 200 and j["usage"]["output_tokens"] <= 3 and j["stop_reason"] == "end_turn",
             "messages capped, end_turn: %s %s" % (j.get("usage"), j.get("stop_reason")))
        st, _, j = srv.post("/v1/responses", {"model": "m", "input": "Hi", "max_output_tokens": 500})
        R.ok(st == 200 and j["usage"]["output_tokens"] <= 3 and j["status"] == "completed",
             "responses capped, completed: %s %s" % (j.get("usage"), j.get("status")))
    finally:
        srv.stop()
    p = subprocess.run([KVPIN, "serve", "--port", "0", "--max-tokens-cap", "0"], capture_output=True, text=True,
                       timeout=30)
    R.ok(p.returncode == 2 and "--max-tokens-cap" in p.stderr, "a cap of 0: exit %d %r" % (p.returncode, p.stderr[-200:]))


def nul_text():
    """U+0000 in a message is text like any other (JSON allows it; a model can
    write it, and an agent sends the answer back): every API takes it, and
    the prompt is the one with the character (more tokens than without)."""
    srv = Server(R, "--chat-template", "chatml", "--ctx", "1024")
    try:
        with_nul = [{"role": "user", "content": "a\u0000b"}]
        st, _, j = srv.post(X, {"messages": with_nul, "max_tokens": 1})
        _, _, p = srv.post("/v1/cache/probe", {"messages": with_nul})
        _, _, q = srv.post("/v1/cache/probe", {"messages": [{"role": "user", "content": "ab"}]})
        R.ok(st == 200 and j["usage"]["prompt_tokens"] == p["prompt_tokens"] > q["prompt_tokens"],
             "chat: U+0000 in a message: %s %s %s" % (st, j.get("usage") if st == 200 else j, (p, q)))
        st, _, j = srv.post("/v1/messages", {"model": "m", "max_tokens": 1, "messages": with_nul})
        R.ok(st == 200, "messages: U+0000 in a message: %s %s" % (st, j if st != 200 else ""))
        st, _, j = srv.post("/v1/responses", {"model": "m", "max_output_tokens": 1, "input": "a\u0000b"})
        R.ok(st == 200, "responses: U+0000 in the input: %s %s" % (st, j if st != 200 else ""))
    finally:
        srv.stop()


def bugs():
    # --queue 0 answered every request with 503, even with a sequence free
    srv = Server(R, "--queue", "0", "-np", "1")
    st, h, j = srv.post(C, {"prompt": "Once", "max_tokens": 2})
    R.ok(st == 200, "--queue 0 with a free sequence: %d %s" % (st, j))
    body = json.dumps({"prompt": "Once", "max_tokens": 100000, "ignore_eos": True, "stream": True}).encode()
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=20)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    s.recv(100)  # the stream runs: the only sequence is taken
    st, h, j = srv.post(C, {"prompt": "Once", "max_tokens": 2})
    R.ok(st == 503 and h.get("Retry-After") == "1", "--queue 0 with the sequence taken: %d" % st)
    s.close()
    R.ok(wait_idle(srv), "the stream of a client that left ends")
    srv.stop()
    # /metrics before any request: the budget and the free blocks of /v1/cache, not 0
    srv = Server(R, "--kv-budget", "1M")
    st, text = srv.get("/metrics")
    m = dict(re.findall(r"^(kvpin_kv_\w+) (\S+)$", text.decode() if isinstance(text, bytes) else text, re.M))
    st, c = srv.get("/v1/cache")
    R.ok(float(m.get("kvpin_kv_bytes_budget", 0)) == c["kv"]["budget_bytes"] > 0, "budget before a request: %s" % m)
    R.ok(float(m.get("kvpin_kv_blocks_free", 0)) == c["kv"]["blocks_free"] > 0, "free blocks before a request: %s" % m)
    srv.stop()


def pin_messages():
    """A pinned conversation is a token prefix of its next turn: no assistant
    opener at its end (add_generation_prompt false by default), so the next
    chat reuses every pinned token."""
    srv = Server(R, "--chat-template", "chatml", "--ctx", "512")
    sysmsg = [{"role": "system", "content": "You are a careful assistant who answers in one short sentence."}]
    st, _, pin = srv.post("/v1/cache/pin", {"messages": sysmsg})
    R.ok(st == 200, "pin messages: %d %s" % (st, pin))
    st, _, j = srv.post(X, {"messages": sysmsg + [{"role": "user", "content": "What is a cat?"}], "max_tokens": 1})
    R.ok(st == 200 and j["usage"]["prompt_tokens_details"]["cached_tokens"] >= pin.get("tokens", 1 << 30),
         "the next chat reuses all %s pinned tokens: cached %s" % (pin.get("tokens"),
                                                                  j["usage"]["prompt_tokens_details"]))
    # the field is accepted; true gives the old layout (the opener pinned too: one more turn of markup)
    st, _, pin2 = srv.post("/v1/cache/pin", {"messages": sysmsg, "add_generation_prompt": True})
    R.ok(st == 200 and pin2["tokens"] > pin["tokens"], "add_generation_prompt true pins the opener: %s %s" %
         (pin.get("tokens"), pin2.get("tokens")))
    st, _, j = srv.post("/v1/cache/pin", {"messages": sysmsg, "add_generation_prompt": "no"})
    R.ok(st == 400 and j["error"]["param"] == "add_generation_prompt", "a bad add_generation_prompt: %d" % st)
    # chat add_generation_prompt false: the prompt ends where the pin ends
    st, _, j = srv.post(X, {"messages": sysmsg, "max_tokens": 1, "add_generation_prompt": False,
                            "return_token_ids": True})
    R.ok(st == 200 and len(j["choices"][0]["prompt_token_ids"]) == pin["tokens"],
         "chat without the generation prompt has the pin's tokens: %s" % j.get("usage"))
    srv.stop()


def run_progress_bar():
    """kvpin run on a long prompt: with stderr a terminal (a pty) a progress
    bar shows the prefill, and the greedy text is the text of the run whose
    stderr is not a terminal (one batch, no bar)."""
    import os
    import pty
    import subprocess
    from kvpin_test import KVPIN, MODEL
    prompt = "Once upon a time there was a little girl named Lily. " * 60  # > 512 tokens
    cmd = [KVPIN, "run", "-m", MODEL, "-c", "2048", "-t", "1", "-p", prompt, "-n", "8", "--temp", "0"]
    plain = subprocess.run(cmd, capture_output=True, timeout=300)
    R.ok(plain.returncode == 0 and b"prefill [" not in plain.stderr, "no bar without a terminal: %r" % plain.stderr[-200:])
    master, slave = pty.openpty()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=slave)
    os.close(slave)
    err = b""
    while True:
        try:
            got = os.read(master, 65536)
        except OSError:
            break
        if not got:
            break
        err += got
    out, _ = p.communicate(timeout=300)
    os.close(master)
    R.ok(p.returncode == 0, "run with a terminal: %s" % p.returncode)
    bars = re.findall(rb"prefill \[#* *\] (\d+)/(\d+) tokens", err)
    R.ok(len(bars) >= 2 and all(b[1] == bars[0][1] for b in bars), "the bar redraws: %r" % bars[:3])
    R.ok(bars and int(bars[-1][0]) == int(bars[-1][1]) - 1, "the bar reaches the prompt's last token: %r" % bars[-1:])
    R.ok(out == plain.stdout and out.strip(), "the same greedy text with and without the bar: %r %r" %
         (out[-60:], plain.stdout[-60:]))


def main():
    srv = Server(R, "--chat-template", "chatml", "--ctx", "512", quiet=False)
    try:
        fields_accepted(srv)
        roles_and_parts(srv)
    finally:
        srv.stop()
    strict()
    cache_key_and_retention()
    progress()
    first_byte()
    volatile()
    max_tokens_cap()
    nul_text()
    bugs()
    pin_messages()
    run_progress_bar()
    return R.finish()


if __name__ == "__main__":
    sys.exit(main())
