#!/usr/bin/env python3
"""End-to-end tests of OpenAI's harmony format (gpt-oss): reasoning,
content and tool calls read out of harmony messages (src/serve/harmony.c,
reasoning.c's harmony mode, through src/serve/answer.c).

The server runs the bundled random-weight model with gpt-oss's own chat
template (--chat-template-file), and a GBNF `grammar` forces its reply to
a text written by hand in the published harmony format (OpenAI's cookbook
article "OpenAI Harmony Response Format": the oracle is the format, not
kvpin's output):

  - an analysis message then a final one: the analysis is the reasoning
    (chat completions' reasoning_content, a Messages thinking block, a
    Responses reasoning item; streamed as deltas), the final message's
    body the content;
  - an analysis message then a call on the commentary channel, written
    as the cookbook writes it ("<|channel|>commentary to=functions.NAME
    <|constrain|>json<|message|>ARGS<|call|>"): a tool call, no content;
  - a preamble (a commentary message without a recipient) then a call
    written as the template writes calls back (recipient first, "json"
    without <|constrain|>): the preamble is the content;
  - a final message without analysis; a reply in plain text;
through /v1/chat/completions, /v1/messages and /v1/responses, streamed
and not, with no byte of harmony markup in content or reasoning.
"<|return|>" and "<|call|>" end the turn (the random model's vocabulary
has no such tokens: the server stops on their texts).

A forced call (tool_choice required) is generated in the very bytes the
template renders when the client sends the call back: the text jinja2
renders (tools/chat_jinja_check.py's environment) for the next turn
holds the generation prompt followed by exactly the generated text.

The same through a vocabulary that has harmony's texts as control tokens
(the bundled model's copy, tests/shell/gguf_edit.py): the prompt's markup
is those tokens, and replies and forced calls come back the same.

Reasoning the client sends back (reasoning_content) reaches the template
in `thinking`, the field it reads: the next prompt is what jinja2 renders
with `thinking` set.
"""
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "shell"))
from kvpin_test import MODEL, Results, Server, kill_all, sse, tokenize  # noqa: E402
import gguf_edit  # noqa: E402
import chat_golden  # noqa: E402
import chat_jinja_check  # noqa: E402

R = Results("e2e_harmony")
TEMPLATE = "tests/data/chat/templates/llama.cpp/openai-gpt-oss-120b.jinja"
EPOCH = "1733356800"  # the template writes the date: the same one on both sides
os.environ["SOURCE_DATE_EPOCH"] = EPOCH
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather",
                                           "parameters": {"type": "object", "properties": {
                                               "city": {"type": "string"}, "days": {"type": "integer"}},
                                               "required": ["city"]}}},
         {"type": "function", "function": {"name": "ping", "description": "Is it up",
                                           "parameters": {"type": "object", "properties": {}}}}]
ANTHROPIC_TOOLS = [{"name": t["function"]["name"], "description": t["function"]["description"],
                    "input_schema": t["function"]["parameters"]} for t in TOOLS]
RESPONSES_TOOLS = [dict(t["function"], type="function") for t in TOOLS]
WANT = [("get_weather", {"city": "Paris", "days": 3})]

# (what, the reply as harmony writes it, reasoning, content, calls)
CASES = [
    ("analysis then final",
     "<|channel|>analysis<|message|>User asks about the weather. Answer directly.<|end|>"
     "<|start|>assistant<|channel|>final<|message|>It is sunny in Paris.<|return|>",
     "User asks about the weather. Answer directly.", "It is sunny in Paris.", []),
    ("analysis then a call",
     "<|channel|>analysis<|message|>Need to use function get_weather.<|end|>"
     "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
     '{"city":"Paris","days":3}<|call|>',
     "Need to use function get_weather.", "", WANT),
    ("preamble then a call",
     "<|channel|>analysis<|message|>Two steps: say so, then call.<|end|>"
     "<|start|>assistant<|channel|>commentary<|message|>Checking the weather first.<|end|>"
     "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>"
     '{"city": "Paris", "days": 3}<|call|>',
     "Two steps: say so, then call.", "Checking the weather first.", WANT),
    ("final only",
     "<|channel|>final<|message|>Hello there.<|return|>", "", "Hello there.", []),
    ("plain text",
     "I would call get_weather with city=Paris.", "", "I would call get_weather with city=Paris.", []),
]


def gbnf_literal(text):
    """A GBNF grammar whose one document is text."""
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        else:
            out.append(ch)
    return 'root ::= "%s"\n' % "".join(out)


def no_markup(*texts):
    return all("<|" not in t and "|>" not in t for t in texts)


def check_chat(srv, what, reply, reasoning, content, want):
    base = {"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": TOOLS,
            "grammar": gbnf_literal(reply), "max_tokens": 400, "temperature": 0}
    st, _, j = srv.post("/v1/chat/completions", base)
    ch = j["choices"][0] if st == 200 else {}
    m = ch.get("message", {})
    got = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in m.get("tool_calls") or []]
    R.ok(st == 200 and got == want and (m.get("content") or "") == content and
         (m.get("reasoning_content") or "") == reasoning and
         ch["finish_reason"] == ("tool_calls" if want else "stop"),
         "%s chat: %s %s\n  want reasoning %r content %r calls %s" % (what, st, j, reasoning, content, want))
    _, evs = sse(srv, "/v1/chat/completions", dict(base, stream=True))
    text, think, calls, fin = "", "", {}, None
    for e in evs:
        for c in e.get("choices", []):
            d = c.get("delta", {})
            text += d.get("content") or ""
            think += d.get("reasoning_content") or ""
            for tc in d.get("tool_calls") or []:
                k = calls.setdefault(tc["index"], {"name": "", "arguments": ""})
                k["name"] += tc.get("function", {}).get("name") or ""
                k["arguments"] += tc.get("function", {}).get("arguments") or ""
            fin = c.get("finish_reason") or fin
    sgot = [(calls[k]["name"], json.loads(calls[k]["arguments"])) for k in sorted(calls)]
    R.ok(sgot == want and text.strip() == content and think.strip() == reasoning and no_markup(text, think) and
         fin == ("tool_calls" if want else "stop"),
         "%s chat stream: calls %s text %r reasoning %r finish %s" % (what, sgot, text, think, fin))


def check_messages(srv, what, reply, reasoning, content, want):
    body = {"model": "m", "max_tokens": 400, "tools": ANTHROPIC_TOOLS, "grammar": gbnf_literal(reply),
            "messages": [{"role": "user", "content": "Weather in Paris?"}]}
    st, _, j = srv.post("/v1/messages", body)
    blocks = j.get("content", []) if st == 200 else []
    uses = [(b["name"], b["input"]) for b in blocks if b.get("type") == "tool_use"]
    texts = "".join(b["text"] for b in blocks if b.get("type") == "text")
    thinks = "".join(b["thinking"] for b in blocks if b.get("type") == "thinking")
    R.ok(st == 200 and uses == want and texts == content and thinks == reasoning and
         j.get("stop_reason") == ("tool_use" if want else "end_turn"),
         "%s messages: %s %s" % (what, st, j))
    _, evs = sse(srv, "/v1/messages", dict(body, stream=True))
    text, think, tools, cur = "", "", [], None
    for e in evs:
        if e.get("type") == "content_block_start" and e["content_block"].get("type") == "tool_use":
            cur = [e["content_block"]["name"], ""]
            tools.append(cur)
        d = e.get("delta", {}) if e.get("type") == "content_block_delta" else {}
        text += d.get("text") or ""
        think += d.get("thinking") or ""
        if d.get("type") == "input_json_delta":
            cur[1] += d.get("partial_json") or ""
    sgot = [(n, json.loads(a or "{}")) for n, a in tools]
    R.ok(sgot == want and text.strip() == content and think.strip() == reasoning and no_markup(text, think),
         "%s messages stream: calls %s text %r thinking %r" % (what, sgot, text, think))


def check_responses(srv, what, reply, reasoning, content, want):
    body = {"model": "m", "max_output_tokens": 400, "grammar": gbnf_literal(reply), "tools": RESPONSES_TOOLS,
            "input": "Weather in Paris?"}
    st, _, j = srv.post("/v1/responses", body)
    out = j.get("output", []) if st == 200 else []
    fcs = [(o["name"], json.loads(o["arguments"])) for o in out if o.get("type") == "function_call"]
    texts = "".join(c.get("text", "") for o in out if o.get("type") == "message" for c in o.get("content", []))
    thinks = "".join(c.get("text", "") for o in out if o.get("type") == "reasoning" for c in o.get("content", []))
    R.ok(st == 200 and fcs == want and texts == content and thinks == reasoning,
         "%s responses: %s %s" % (what, st, j))
    _, evs = sse(srv, "/v1/responses", dict(body, stream=True))
    text, think, fcs = "", "", []
    for e in evs:
        if e.get("type") == "response.output_text.delta":
            text += e["delta"]
        elif e.get("type") == "response.reasoning_text.delta":
            think += e["delta"]
        elif e.get("type") == "response.output_item.done" and e["item"].get("type") == "function_call":
            fcs.append((e["item"]["name"], json.loads(e["item"]["arguments"])))
    R.ok(fcs == want and text.strip() == content and think.strip() == reasoning and no_markup(text, think),
         "%s responses stream: calls %s text %r reasoning %r" % (what, fcs, text, think))


def check_replies():
    srv = Server(R, "--chat-template-file", TEMPLATE, "-c", "4096", env={"SOURCE_DATE_EPOCH": EPOCH})
    try:
        for what, reply, reasoning, content, want in CASES:
            check_chat(srv, what, reply, reasoning, content, want)
            check_messages(srv, what, reply, reasoning, content, want)
            check_responses(srv, what, reply, reasoning, content, want)
        # --reasoning-format none is not this server's: the split is on by default
        srv.stop()
    except Exception as e:  # noqa: BLE001
        R.ok(False, "replies: %r" % (e,))
        srv.kill()


def check_inline():
    """--reasoning-format none: the reply comes back as written, up to "<|return|>", where generation
    stops though the grammar goes on (the vocabulary has no such token: the server stops on the text)."""
    srv = Server(R, "--chat-template-file", TEMPLATE, "-c", "4096", "--reasoning-format", "none",
                 env={"SOURCE_DATE_EPOCH": EPOCH})
    try:
        what, reply = CASES[0][0], CASES[0][1]
        st, _, j = srv.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}],
                                                      "grammar": gbnf_literal(reply + " and more after the end"),
                                                      "max_tokens": 400})
        m = j["choices"][0]["message"] if st == 200 else {}
        R.ok(st == 200 and m.get("content") == reply[:-len("<|return|>")] and not m.get("reasoning_content") and
             j["choices"][0]["finish_reason"] == "stop", "%s inline: %s %s" % (what, st, j))
        srv.stop()
    except Exception as e:  # noqa: BLE001
        R.ok(False, "inline: %r" % (e,))
        srv.kill()


LEVEL = [{"type": "function", "function": {"name": "set_level", "description": "Set the level",
                                           "parameters": {"type": "object", "properties": {
                                               "level": {"type": "integer", "minimum": 1, "maximum": 9}},
                                               "required": ["level"]}}}]


def jinja_render(messages, tools, add_generation_prompt=True):
    env = chat_jinja_check.make_env()
    tmpl = env.from_string(open(TEMPLATE).read())
    return tmpl.render(messages=messages, tools=tools, bos_token="", eos_token="",
                       add_generation_prompt=add_generation_prompt)


def prompt_ids(srv, text):
    """The ids the server gives a rendered prompt (its BOS added when the vocabulary adds one)."""
    want = tokenize(srv, text, add_special=False)
    with_bos = tokenize(srv, text, add_special=True)
    return with_bos if with_bos[:1] != want[:1] else want


def check_forced():
    srv = Server(R, "--chat-template-file", TEMPLATE, "-c", "4096", env={"SOURCE_DATE_EPOCH": EPOCH})
    try:
        msgs = [{"role": "user", "content": "Level?"}]
        gen_prompt = jinja_render(msgs, LEVEL)
        for choice in ("required", {"type": "function", "function": {"name": "set_level"}}):
            st, _, j = srv.post("/v1/chat/completions", {"messages": msgs, "tools": LEVEL, "tool_choice": choice,
                                                          "max_tokens": 200, "return_token_ids": True})
            ch = j["choices"][0] if st == 200 else {}
            m = ch.get("message", {})
            calls = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in m.get("tool_calls") or []]
            R.ok(st == 200 and ch["finish_reason"] == "tool_calls" and len(calls) == 1 and calls[0][0] == "set_level"
                 and list(calls[0][1]) == ["level"] and 1 <= calls[0][1]["level"] <= 9 and not m.get("content"),
                 "forced %s: %s %s" % (choice, st, j))
            if st != 200 or len(calls) != 1:
                continue
            R.ok(ch["prompt_token_ids"] == prompt_ids(srv, gen_prompt),
                 "forced %s: the prompt is not jinja2's rendering" % (choice,))
            # the generated text: after the prompt's (a SentencePiece detokenizer drops a leading space)
            _, _, d0 = srv.post("/detokenize", {"tokens": ch["prompt_token_ids"]})
            _, _, d1 = srv.post("/detokenize", {"tokens": ch["prompt_token_ids"] + ch["token_ids"]})
            pre, full = d0.get("content", ""), d1.get("content", "")
            generated = full[len(pre):] if full.startswith(pre) else None
            back = msgs + [{"role": "assistant", "content": "", "tool_calls": m["tool_calls"]},
                           {"role": "tool", "tool_call_id": m["tool_calls"][0]["id"], "content": "ok"}]
            bm, bt = chat_golden.normalize({"messages": back, "tools": LEVEL})
            nxt = jinja_render(bm, bt)
            end = nxt.find("<|call|>", len(gen_prompt))
            sent_back = nxt[len(gen_prompt):end + len("<|call|>")] if end >= 0 else None
            # the turn's end, "<|call|>", is a stop string here: the text ends before or after it
            R.ok(nxt.startswith(gen_prompt) and sent_back is not None and
                 generated in (sent_back, sent_back[:-len("<|call|>")]),
                 "forced %s: generated %r\n  the template renders it back as %r" % (choice, generated, sent_back))
            st, _, j2 = srv.post("/v1/chat/completions", {"messages": back, "tools": LEVEL, "max_tokens": 1,
                                                           "return_token_ids": True})
            R.ok(st == 200 and j2["choices"][0]["prompt_token_ids"] == prompt_ids(srv, nxt),
                 "forced %s: the next prompt is not jinja2's rendering: %s" % (choice, st))
        srv.stop()
    except Exception as e:  # noqa: BLE001
        R.ok(False, "forced: %r" % (e,))
        srv.kill()


def check_thinking_sent_back():
    """reasoning_content of an assistant message with a call is rendered as the template's thinking."""
    srv = Server(R, "--chat-template-file", TEMPLATE, "-c", "4096", env={"SOURCE_DATE_EPOCH": EPOCH})
    try:
        call = {"id": "call_1", "type": "function",
                "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"days\": 3}"}}
        conv = [{"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": "", "reasoning_content": "Need the weather tool.",
                 "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 18}"}]
        # the oracle: the template given `thinking`, the field it documents
        ref = [dict(conv[0]), dict(conv[1]), dict(conv[2])]
        del ref[1]["reasoning_content"]
        ref[1]["thinking"] = "Need the weather tool."
        ref[1]["tool_calls"] = [dict(call, function={"name": "get_weather", "arguments": {"city": "Paris", "days": 3}})]
        text = jinja_render(ref, TOOLS)
        R.ok("<|channel|>analysis<|message|>Need the weather tool.<|end|>" in text,
             "the reference rendering has no analysis message: %r" % text[-300:])
        st, _, j = srv.post("/v1/chat/completions", {"messages": conv, "tools": TOOLS, "max_tokens": 1,
                                                      "return_token_ids": True})
        R.ok(st == 200 and j["choices"][0]["prompt_token_ids"] == prompt_ids(srv, text),
             "reasoning_content sent back: %s, not the template's rendering with thinking" % st)
        # a preamble, reasoning and a call, as kvpin answers them: the template refuses content beside
        # thinking before a call, the reasoning is what it renders (the preamble is left out)
        conv[1]["content"] = "Checking the weather first."
        st, _, j = srv.post("/v1/chat/completions", {"messages": conv, "tools": TOOLS, "max_tokens": 1,
                                                      "return_token_ids": True})
        R.ok(st == 200 and j["choices"][0]["prompt_token_ids"] == prompt_ids(srv, text),
             "a preamble, reasoning and a call sent back: %s %s" % (st, j if st != 200 else ""))
        # through Messages: a thinking block, a text block and a tool_use block
        amsgs = [{"role": "user", "content": "Weather in Paris?"},
                 {"role": "assistant", "content": [
                     {"type": "thinking", "thinking": "Need the weather tool.", "signature": ""},
                     {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Paris", "days": 3}}]},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1", "content": "{\"temp\": 18}"}]}]
        st, _, j = srv.post("/v1/messages", {"model": "m", "max_tokens": 1, "tools": ANTHROPIC_TOOLS,
                                             "messages": amsgs})
        R.ok(st == 200 and j["usage"]["input_tokens"] + j["usage"].get("cache_read_input_tokens", 0) ==
             len(prompt_ids(srv, text)), "Messages with a thinking block sent back: %s %s" % (st, j))
        srv.stop()
    except Exception as e:  # noqa: BLE001
        R.ok(False, "thinking sent back: %r" % (e,))
        srv.kill()


HARMONY_TOKENS = ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>", "<|call|>"]


def check_harmony_vocabulary():
    """A vocabulary with harmony's tokens (a copy of the bundled model whose byte tokens <0x01>..<0x07>,
    ids 4..10, are control tokens with harmony's texts, as o200k_harmony has them): the template's
    markup is those tokens, and replies and forced calls come back as with the texts."""
    path = tempfile.mktemp(prefix="kvpin-harmony-", suffix=".gguf")
    gguf_edit.edit(MODEL, path, [], [], [(4 + i, t, 3) for i, t in enumerate(HARMONY_TOKENS)])
    srv = None
    try:
        srv = Server(R, "--chat-template-file", TEMPLATE, "-c", "4096", model=path,
                     env={"SOURCE_DATE_EPOCH": EPOCH})
        msgs = [{"role": "user", "content": "Weather in Paris?"}]
        text = jinja_render(msgs, None)
        reply = ("<|channel|>analysis<|message|>Simple.<|end|>"
                 "<|start|>assistant<|channel|>final<|message|>It is sunny.")
        st, _, j = srv.post("/v1/chat/completions", {"messages": msgs, "grammar": gbnf_literal(reply),
                                                      "max_tokens": 200, "return_token_ids": True})
        ch = j["choices"][0] if st == 200 else {}
        ids = ch.get("prompt_token_ids", [])
        R.ok(st == 200 and all(ids.count(4 + i) == text.count(t) for i, t in enumerate(HARMONY_TOKENS)) and
             text.count("<|start|>") > 1, "harmony vocabulary: the prompt's markup is not its tokens: %s %s" % (st, j))
        m = ch.get("message", {})
        R.ok(st == 200 and m.get("reasoning_content") == "Simple." and m.get("content") == "It is sunny." and
             ch["finish_reason"] == "stop", "harmony vocabulary reply: %s %s" % (st, j))
        # a forced call: the template's bytes up to <|call|>, which the model ends with as its token
        # (a grammar writes text: it would spell the marker out)
        lmsgs = [{"role": "user", "content": "Level?"}]
        st, _, j = srv.post("/v1/chat/completions", {"messages": lmsgs, "tools": LEVEL, "tool_choice": "required",
                                                      "max_tokens": 200, "return_token_ids": True})
        ch = j["choices"][0] if st == 200 else {}
        m = ch.get("message", {})
        calls = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in m.get("tool_calls") or []]
        R.ok(st == 200 and ch["finish_reason"] == "tool_calls" and len(calls) == 1 and calls[0][0] == "set_level" and
             not m.get("content"), "harmony vocabulary forced call: %s %s" % (st, j))
        if len(calls) == 1:
            _, _, d0 = srv.post("/detokenize", {"tokens": ch["prompt_token_ids"]})
            _, _, d1 = srv.post("/detokenize", {"tokens": ch["prompt_token_ids"] + ch["token_ids"]})
            pre, full = d0.get("content", ""), d1.get("content", "")
            back = lmsgs + [{"role": "assistant", "content": "", "tool_calls": m["tool_calls"]},
                            {"role": "tool", "tool_call_id": m["tool_calls"][0]["id"], "content": "ok"}]
            bm, bt = chat_golden.normalize({"messages": back, "tools": LEVEL})
            gen_prompt, nxt = jinja_render(lmsgs, LEVEL), jinja_render(bm, bt)
            end = nxt.find("<|call|>", len(gen_prompt))
            R.ok(full.startswith(pre) and end > 0 and full[len(pre):] == nxt[len(gen_prompt):end],
                 "harmony vocabulary forced call: generated %r, the template renders %r" %
                 (full[len(pre):], nxt[len(gen_prompt):end + 8]))
        srv.stop()
    except Exception as e:  # noqa: BLE001
        R.ok(False, "harmony vocabulary: %r" % (e,))
        if srv:
            srv.kill()
    finally:
        os.unlink(path)


def main():
    try:
        check_replies()
        check_harmony_vocabulary()
        check_inline()
        check_forced()
        check_thinking_sent_back()
    finally:
        kill_all()
    return R.finish()


if __name__ == "__main__":
    sys.exit(main())
