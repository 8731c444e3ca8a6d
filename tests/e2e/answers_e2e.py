#!/usr/bin/env python3
"""End-to-end tests of the answer memory (src/serve/answers.c): an agent
loop that sends kvpin's answers back reuses every token of them.

The model: random weights with Phi-3's real BPE vocabulary (kvpin mkmodel
--tokenizer tests/data/vocab/ggml-vocab-phi-3.gguf, made in a temporary
folder), served with Phi-3.5's chat template, whose <|end|> closing an
assistant turn is a control token. A random model's answers split words
in ways the tokenizer never would, so tokenizing them again gives other
tokens: exactly the case the memory is for.

The invariant (the oracle): in a 10-turn loop where each turn sends the
whole conversation back (the previous answer as the client received it:
text, or tool calls forced with tool_choice "required", with a tool
result), the prompt of turn k+1 starts with the prompt and the generated
tokens of turn k, all of them but at most the last; and the cache report
counts them as cached. A turn whose answer held one of the vocabulary's
control or unused tokens (ids from 32000; a random model writes them, a
client never sees their text) is not checked: the client's copy of the
answer lacks that token, so its prompt must differ. The Messages and
Responses loops give no token ids: their text answers are held to a GBNF
grammar of words (no control token can pass one). Checked through /v1/chat/completions (token ids),
/v1/messages (cache_read_input_tokens) and /v1/responses
(input_tokens_details.cached_tokens). With --answer-memory 0 the loop
runs too (no check of its reuse: it depends on the random answers) and
the memory's answers are those of the tokenizer: the same conversation
tokenized by a fresh server gives the same ids as /tokenize of its
rendering.
"""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kvpin_test import KVPIN, Results, Server, kill_all  # noqa: E402

R = Results("e2e_answers")
TEMPLATE = "tests/data/chat/templates/microsoft-Phi-3.5-mini-instruct.jinja"
TOOLS = [{"type": "function", "function": {"name": "set_level", "description": "Set the level",
                                           "parameters": {"type": "object", "properties": {
                                               "level": {"type": "integer", "minimum": 1, "maximum": 9}},
                                               "required": ["level"]}}}]
TURNS = 10


WORDS = 'root ::= [a-z] [a-z ]{0,60}\n'


def hidden_tokens(srv, ids, text):
    """Whether the client's text of an answer may lack something of what the
    model wrote: one of Phi-3's added tokens (ids from 32000, but the last:
    the end token), or one of its byte tokens (ids 3-258: a random model
    writes bytes that are not UTF-8, which the client gets as U+FFFD)."""
    if any(i >= 32000 or 3 <= i <= 258 for i in ids[:-1]):
        return True
    st, _, d = srv.post("/detokenize", {"tokens": [i for i in ids if i < 32000]})
    return st != 200 or d.get("content") != text


def chat_loop(srv):
    msgs = [{"role": "system", "content": "You set levels."}, {"role": "user", "content": "Level, please?"}]
    prev, checked = None, 0
    for turn in range(TURNS):
        forced = turn % 3 == 1
        body = {"messages": msgs, "tools": TOOLS, "max_tokens": 200 if forced else 24, "return_token_ids": True}
        if forced:
            body["tool_choice"] = "required"
        elif turn % 3 == 2:
            body["grammar"] = WORDS  # text a client sees whole; the other turns are free
        st, _, j = srv.post("/v1/chat/completions", body)
        if not R.ok(st == 200, "chat turn %d: %s %s" % (turn, st, j)):
            return
        ch = j["choices"][0]
        p, t = ch["prompt_token_ids"], ch["token_ids"]
        if prev is not None and not hidden:
            k = 0
            while k < min(len(prev), len(p)) and prev[k] == p[k]:
                k += 1
            cached = j["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0)
            checked += 1
            R.ok(k >= len(prev) - 1 and cached >= len(prev) - 1,
                 "chat turn %d reuses %d of the previous turn's %d tokens (cached %d)" % (turn, k, len(prev), cached))
        m = ch["message"]
        prev, hidden = p + t, not m.get("tool_calls") and hidden_tokens(srv, t, m.get("content") or "")
        if m.get("tool_calls"):
            msgs += [{"role": "assistant", "content": m.get("content"), "tool_calls": m["tool_calls"]},
                     {"role": "tool", "tool_call_id": m["tool_calls"][0]["id"], "content": "done"}]
        else:
            msgs += [{"role": "assistant", "content": m.get("content") or ""},
                     {"role": "user", "content": "And again?"}]
    R.ok(checked >= TURNS // 2, "chat: %d of %d turns checked (the others' answers hid tokens)" % (checked, TURNS - 1))


def messages_loop(srv):
    msgs = [{"role": "user", "content": "Level, please?"}]
    tools = [{"name": "set_level", "description": "Set the level",
              "input_schema": TOOLS[0]["function"]["parameters"]}]
    prev = None
    for turn in range(TURNS):
        forced = turn % 3 == 1
        body = {"model": "m", "system": "You set levels.", "messages": msgs, "tools": tools,
                "max_tokens": 200 if forced else 24}
        if forced:
            body["tool_choice"] = {"type": "any"}
        else:
            body["grammar"] = WORDS
        st, _, j = srv.post("/v1/messages", body)
        if not R.ok(st == 200, "messages turn %d: %s %s" % (turn, st, j)):
            return
        u = j["usage"]
        seen = u["input_tokens"] + u.get("cache_read_input_tokens", 0) + u.get("cache_creation_input_tokens", 0)
        if prev is not None:
            R.ok(u.get("cache_read_input_tokens", 0) >= prev - 1,
                 "messages turn %d: cache_read_input_tokens %d of the previous turn's %d" %
                 (turn, u.get("cache_read_input_tokens", 0), prev))
        prev = seen + u["output_tokens"]
        msgs.append({"role": "assistant", "content": j["content"]})
        uses = [b for b in j["content"] if b["type"] == "tool_use"]
        if uses:
            msgs.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": b["id"], "content": "done"}
                                                     for b in uses]})
        else:
            msgs.append({"role": "user", "content": "And again?"})


def responses_loop(srv):
    items = [{"role": "user", "content": "Level, please?"}]
    tools = [dict(TOOLS[0]["function"], type="function")]
    prev = None
    for turn in range(TURNS):
        forced = turn % 3 == 1
        body = {"model": "m", "instructions": "You set levels.", "input": items, "tools": tools,
                "max_output_tokens": 200 if forced else 24, "store": False}
        if forced:
            body["tool_choice"] = "required"
        else:
            body["grammar"] = WORDS
        st, _, j = srv.post("/v1/responses", body)
        if not R.ok(st == 200, "responses turn %d: %s %s" % (turn, st, j)):
            return
        u = j["usage"]
        cached = u.get("input_tokens_details", {}).get("cached_tokens", 0)
        if prev is not None:
            R.ok(cached >= prev - 1, "responses turn %d: cached_tokens %d of the previous turn's %d" %
                 (turn, cached, prev))
        prev = u["input_tokens"] + u["output_tokens"]
        calls = []
        for o in j["output"]:
            if o["type"] == "message":
                items.append({"role": "assistant", "content": "".join(
                    c["text"] for c in o["content"] if c["type"] == "output_text")})
            elif o["type"] == "function_call":
                items.append({"type": "function_call", "call_id": o["call_id"], "name": o["name"],
                              "arguments": o["arguments"]})
                calls.append(o["call_id"])
        items += [{"type": "function_call_output", "call_id": c, "output": "done"} for c in calls]
        if not calls:
            items.append({"role": "user", "content": "And again?"})


def main():
    d = tempfile.mkdtemp(prefix="kvpin-answers-")
    model = os.path.join(d, "phi.gguf")
    try:
        subprocess.run([KVPIN, "mkmodel", "-o", model, "--preset", "tiny", "--tokenizer",
                        "tests/data/vocab/ggml-vocab-phi-3.gguf"], check=True, capture_output=True)
        srv = Server(R, "--chat-template-file", TEMPLATE, "-c", "4096", model=model)
        try:
            chat_loop(srv)
            messages_loop(srv)
            responses_loop(srv)
            st, j = srv.get("/metrics")
            R.ok(st == 200 and "kvpin_answer_memory_matches_total" in (j if isinstance(j, str) else j.decode()),
                 "/metrics names the answer memory")
        finally:
            srv.stop()
        # off: the loop still runs (its reuse depends on the answers)
        srv = Server(R, "--chat-template-file", TEMPLATE, "-c", "4096", "--answer-memory", "0", model=model)
        try:
            st, _, j = srv.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}],
                                                          "max_tokens": 4})
            R.ok(st == 200, "--answer-memory 0: %s %s" % (st, j))
        finally:
            srv.stop()
    finally:
        kill_all()
        for f in os.listdir(d):
            os.unlink(os.path.join(d, f))
        os.rmdir(d)
    return R.finish()


if __name__ == "__main__":
    sys.exit(main())
