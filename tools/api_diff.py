#!/usr/bin/env python3
"""api_diff.py - the same HTTP conversation with two kvpin binaries, compared.

    python3 tools/api_diff.py OLD_KVPIN NEW_KVPIN [-m MODEL] [-v]

For a change that must not change behaviour (a refactor of the serve
floor): each binary runs `kvpin serve` on a fresh server with the same
flags, and receives the same sequence of requests over every API
(completions, chat completions, Messages, Responses, the plain and cache
endpoints; whole bodies and streams, tools, forced calls, n > 1, logprobs,
structured output, errors). Status, Content-Type, x-kvpin-ignored-fields
and the bodies (SSE streams event by event) must be equal, with the values
that differ between two runs masked: ids minted at random or from the
clock, timestamps, durations. Seeds are fixed, so sampling is the same.

Exit status 0 when every exchange matches; the first differences are
printed (-v: every exchange).
"""
import argparse
import http.client
import json
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "e2e"))
from kvpin_test import Results, Server  # noqa: E402

ID_RE = re.compile(r"\b(call_|toolu_|msg_|resp_|fc_|chatcmpl-|cmpl-|pin-|rs_)[A-Za-z0-9]+")
TIME_KEY = re.compile(r"(^|_)(ms|id|created|created_at|expires_at|time|seconds|started|uptime|age|at|ts|when)$|"
                      r"_ms_|wait|latency|ttft|tps|per_s|elapsed|last_used|^t$")

W = {"type": "function", "function": {"name": "get_weather", "description": "Current weather",
                                      "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                     "required": ["city"], "additionalProperties": False}}}
MSGS = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Tell a story about a cat"}]
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}
ANTH_TOOL = {"name": "get_weather", "description": "Current weather",
             "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                              "additionalProperties": False}}


def corpus():
    """(method, path, body, headers) in order; "$RESP" in a path or body is the
    id of the last Responses answer."""
    C, X, A, R = "/v1/completions", "/v1/chat/completions", "/v1/messages", "/v1/responses"
    chat = {"messages": MSGS, "max_tokens": 12, "seed": 7, "temperature": 0.8}
    out = [
        ("POST", C, {"prompt": "Once upon a time", "max_tokens": 10, "seed": 1}),
        ("POST", C, {"prompt": "Once upon a time", "max_tokens": 10, "seed": 1, "stream": True,
                     "stream_options": {"include_usage": True}}),
        ("POST", C, {"prompt": "Once upon a time there", "max_tokens": 6, "temperature": 0, "return_token_ids": True,
                     "stop": ["the"]}),
        ("POST", C, {"prompt": [1, 2, 3, 4], "max_tokens": 5, "seed": 3}),
        ("POST", C, {"prompt": "A dog", "max_tokens": 6, "n": 3, "seed": 9, "temperature": 1}),
        ("POST", C, {"prompt": "A dog", "max_tokens": 6, "n": 2, "seed": 9, "stream": True, "logprobs": 2,
                     "stream_options": {"include_usage": True}}),
        ("POST", C, {"prompt": "A dog", "max_tokens": 6, "logprobs": 3, "seed": 2}),
        ("POST", C, {"prompt": "Lily", "max_tokens": 8, "stream": True, "return_progress": True, "seed": 4}),
        ("POST", C, {"prompt": "x", "max_tokens": -1}),
        ("POST", C, {"prompt": "x", "n": 0}),
        ("POST", C, {"prompt": "x", "frobnicate": 1, "max_tokens": 2, "seed": 1}),
        ("POST", C, "{not json"),
        ("POST", X, chat),
        ("POST", X, dict(chat, stream=True, stream_options={"include_usage": True})),
        ("POST", X, dict(chat, tools=[W])),
        ("POST", X, dict(chat, tools=[W], stream=True)),
        ("POST", X, dict(chat, tools=[W], tool_choice="required", max_tokens=40)),
        ("POST", X, dict(chat, tools=[W], tool_choice="required", max_tokens=40, stream=True)),
        ("POST", X, dict(chat, tools=[W], tool_choice={"type": "function", "function": {"name": "get_weather"}},
                         max_tokens=40, n=2, stream=True)),
        ("POST", X, dict(chat, tools=[W], logprobs=True, stream=True)),
        ("POST", X, dict(chat, logprobs=True, top_logprobs=2, n=2)),
        ("POST", X, dict(chat, response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}},
                         max_tokens=40)),
        ("POST", X, dict(chat, response_format={"type": "json_object"}, max_tokens=20, stream=True)),
        ("POST", X, dict(chat, prompt_cache_key="agent-1", prompt_cache_retention="24h")),
        ("POST", X, dict(chat, messages=MSGS + [{"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}], tools=[W])),
        ("POST", X, dict(chat, tool_choice="required")),
        ("POST", X, {"messages": [{"role": "wizard", "content": "x"}]}),
        ("POST", X, {"max_tokens": 3}),
        ("POST", A, {"model": "m", "max_tokens": 12, "system": "You are terse.",
                     "messages": [{"role": "user", "content": "Tell a story about a cat"}], "temperature": 0}),
        ("POST", A, {"model": "m", "max_tokens": 12, "stream": True, "temperature": 0,
                     "system": [{"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}}],
                     "messages": [{"role": "user", "content": "Tell a story about a cat"}]}),
        ("POST", A, {"model": "m", "max_tokens": 40, "tools": [ANTH_TOOL], "tool_choice": {"type": "any"},
                     "messages": [{"role": "user", "content": "Weather in Paris?"}], "temperature": 0}),
        ("POST", A, {"model": "m", "max_tokens": 40, "tools": [ANTH_TOOL], "tool_choice": {"type": "any"},
                     "stream": True, "messages": [{"role": "user", "content": "Weather in Paris?"}], "temperature": 0}),
        ("POST", A, {"model": "m", "max_tokens": 10, "stop_sequences": ["the", "a"], "temperature": 0,
                     "messages": [{"role": "user", "content": "Once"}, {"role": "assistant", "content": [
                         {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Oslo"}}]},
                         {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                                       "content": "rain"}]}], "tools": [ANTH_TOOL],
                     "metadata": {"user_id": "u"}}),
        ("POST", A + "/count_tokens", {"model": "m", "messages": [{"role": "user", "content": "Hello there"}],
                                       "tools": [ANTH_TOOL]}),
        ("POST", A, {"model": "m", "messages": [{"role": "user", "content": "x"}]}),
        ("POST", A, {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image"}]}]}),
        ("POST", R, {"model": "m", "input": "Tell a story", "max_output_tokens": 12, "temperature": 0}),
        ("GET", R + "/$RESP", None),
        ("POST", R, {"model": "m", "input": "And then?", "previous_response_id": "$RESP", "max_output_tokens": 12,
                     "temperature": 0, "stream": True}),
        ("POST", R, {"model": "m", "input": "Weather in Paris?", "max_output_tokens": 40, "temperature": 0,
                     "tools": [{"type": "function", "name": "get_weather", "parameters": ANTH_TOOL["input_schema"]}],
                     "tool_choice": "required"}),
        ("POST", R, {"model": "m", "input": "Weather in Paris?", "max_output_tokens": 40, "temperature": 0,
                     "stream": True, "instructions": "Be brief.",
                     "tools": [{"type": "function", "name": "get_weather", "parameters": ANTH_TOOL["input_schema"]}],
                     "tool_choice": "required"}),
        ("DELETE", R + "/$RESP", None),
        ("GET", R + "/$RESP", None),
        ("POST", R, {"model": "m", "input": "x", "previous_response_id": "resp_nope"}),
        ("POST", R, {"model": "m", "input": 5}),
        ("POST", "/tokenize", {"content": "Hello world"}),
        ("POST", "/detokenize", {"tokens": [1, 2, 3, 4]}),
        ("GET", "/v1/models", None),
        ("POST", "/v1/cache/probe", {"messages": MSGS}),
        ("POST", "/v1/cache/pin", {"prompt": "Once upon a time", "ttl": 60}),
        ("GET", "/v1/cache", None),
        ("GET", "/v1/nope", None),
        ("PUT", "/v1/completions", None),
    ]
    return [(m, p, b, {}) for m, p, b in out]


def mask(v, key=""):
    if isinstance(v, dict):
        return {k: mask(x, k) for k, x in v.items()}
    if isinstance(v, list):
        return [mask(x, key) for x in v]
    if isinstance(v, (int, float)) and not isinstance(v, bool) and TIME_KEY.search(key):
        return "<n>"
    if isinstance(v, str):
        return ID_RE.sub(lambda m: m.group(1) + "<id>", v)
    return v


def merge_lp(acc, lp):
    """Streamed logprobs of one choice concatenated (arrays appended)."""
    if not lp:
        return acc
    acc = acc or {}
    for k, v in lp.items():
        acc[k] = acc.get(k, []) + v if isinstance(v, list) else v
    return acc


def canonical_stream(events):
    """A stream as what it says, not how it was cut: how many tokens one
    event carries depends on timing (the engine may finish several between
    two reads) and choices interleave freely. OpenAI chunks become one
    record per choice (text, content, role, tool calls, logprobs, finish)
    plus the chunks without choices (usage, the last prompt_progress);
    Anthropic text deltas and Responses text deltas are joined per block or
    item; sequence numbers are masked (they count the events)."""
    choices, other, progress = {}, [], None
    deltas = {}
    for ev in events:
        d = ev.get("data")
        name = ev.get("event")
        if isinstance(d, dict) and "sequence_number" in d:
            d["sequence_number"] = "<n>"
        if name == "content_block_delta" and d.get("delta", {}).get("type") == "text_delta":
            deltas.setdefault(("a", d["index"]), []).append(d["delta"]["text"])
            continue
        if name == "response.output_text.delta":
            deltas.setdefault(("r", d["item_id"], d["content_index"]), []).append(d["delta"])
            continue
        if name or not isinstance(d, dict) or "choices" not in d:
            other.append(ev)
            continue
        if "prompt_progress" in d:
            progress = d
            continue
        if not d["choices"]:
            other.append(ev)
            continue
        head = {k: v for k, v in d.items() if k != "choices"}
        for c in d["choices"]:
            o = choices.setdefault(c["index"], {"head": head, "text": "", "content": "", "role": None, "calls": {},
                                                "logprobs": None, "finish": None, "rest": {}})
            o["text"] += c.get("text") or ""
            delta = c.get("delta") or {}
            o["content"] += delta.get("content") or ""
            o["role"] = delta.get("role") or o["role"]
            for tc in delta.get("tool_calls") or []:
                call = o["calls"].setdefault(tc["index"], {})
                for k, v in tc.items():
                    if k == "function":
                        fn = call.setdefault("function", {})
                        for fk, fv in v.items():
                            fn[fk] = fn.get(fk, "") + fv
                    else:
                        call[k] = v
            o["logprobs"] = merge_lp(o["logprobs"], c.get("logprobs"))
            o["finish"] = c.get("finish_reason") or o["finish"]
            o["rest"].update({k: v for k, v in c.items()
                              if k not in ("index", "text", "delta", "logprobs", "finish_reason")})
    return {"choices": [choices[i] for i in sorted(choices)], "other": other, "progress": progress,
            "deltas": {"/".join(map(str, k)): "".join(v) for k, v in sorted(deltas.items(), key=str)}}


def parse_body(ctype, data):
    text = data.decode("utf-8", "replace")
    if ctype.startswith("text/event-stream"):
        events = []
        for block in text.split("\n\n"):
            if not block.strip() or block.startswith(":"):
                continue
            ev = {}
            for line in block.split("\n"):
                if line.startswith("event: "):
                    ev["event"] = line[7:]
                elif line.startswith("data: "):
                    d = line[6:]
                    try:
                        ev["data"] = mask(json.loads(d))
                    except ValueError:
                        ev["data"] = d
            events.append(ev)
        return canonical_stream(events)
    try:
        return mask(json.loads(text))
    except ValueError:
        return text


def run(binary, model, verbose):
    r = Results("api_diff")
    srv = Server(r, "--ctx", "1024", "--parallel", "4", "--chat-template", "chatml", model=model, binary=binary)
    out, last_resp = [], "resp_none"
    try:
        for method, path, body, hdrs in corpus():
            path = path.replace("$RESP", last_resp)
            if isinstance(body, dict):
                body = json.loads(json.dumps(body).replace("$RESP", last_resp))
            raw = json.dumps(body).encode() if isinstance(body, (dict, list)) else (body or "").encode()
            c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=120)
            c.request(method, path, body=raw if body is not None else None,
                      headers=dict({"Content-Type": "application/json"}, **hdrs))
            resp = c.getresponse()
            data = resp.read()
            c.close()
            ctype = resp.getheader("Content-Type") or ""
            parsed = parse_body(ctype, data)
            if path == "/v1/responses" and resp.status == 200 and ctype.startswith("application/json"):
                last_resp = json.loads(data)["id"]
            out.append({"req": "%s %s" % (method, path.replace(last_resp, "$RESP")), "status": resp.status,
                        "type": ctype, "ignored": resp.getheader("x-kvpin-ignored-fields"), "body": parsed})
            if verbose:
                print(binary, method, path, resp.status, file=sys.stderr)
    finally:
        srv.stop()
    if r.failed:
        raise SystemExit("%s: the server did not stop cleanly" % binary)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("-m", "--model", default="models/stories260K.gguf")
    ap.add_argument("-v", "--verbose", action="store_true")
    a = ap.parse_args()
    old, new = run(a.old, a.model, a.verbose), run(a.new, a.model, a.verbose)
    bad = 0
    for x, y in zip(old, new):
        if x != y:
            bad += 1
            if bad <= 5:
                print("DIFFERS: %s\n  old: %s\n  new: %s" % (x["req"], json.dumps(x)[:1500], json.dumps(y)[:1500]))
        elif a.verbose:
            print("same: %s %d" % (x["req"], x["status"]))
    print("api_diff: %d exchanges, %d differ" % (len(old), bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
