#!/usr/bin/env python3
"""End-to-end tests of tool calls in each template's own syntax
(src/serve/toolsyn.c through src/serve/answer.c).

For each template (Qwen3 and Hermes <tool_call> JSON, Qwen3-Coder XML
parameters, Llama 3.1 bare JSON, Mistral [TOOL_CALLS]name[ARGS], DeepSeek
V3.1 markers, GLM-4.6 <arg_key>/<arg_value>, Kimi K2 functions.NAME:IDX),
the server runs the bundled random-weight model with --chat-template-file,
and a GBNF `grammar` forces its reply to be a text written by hand in that
family's published format (the oracle: the format, not kvpin's output).
The reply must come back as the calls it holds:
  - /v1/chat/completions: message.tool_calls with the name and the
    arguments (a value typed by the tool's schema: "days" an integer),
    finish_reason "tool_calls", the content in front of the calls as
    content; streamed, the deltas carry the same content and calls and no
    byte of the markup;
  - /v1/messages: tool_use blocks with the arguments as input, stop_reason
    "tool_use";
  - /v1/responses: function_call items.
A text that only mentions the markup stays content.

A forced call (tool_choice required or named) is generated in the
template's own markup, in the very bytes the template renders when the
client sends the call back: the detokenized prompt of the next turn must
start with the detokenized prompt and answer of this one (a tool whose
only parameter is a small integer, so that the random model ends its call).
A forced call of an unknown function is a 400.

A template that renders no tools at all (Gemma 3's, Llama 2's) gets them
in kvpin's generic tool format: the prompt must be what jinja2 renders from
the conversation rewritten by tools/chat_golden.py's generic_tools (the
reference implementation of the format), and a reply in the format comes
back as calls.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
from kvpin_test import Results, Server, kill_all, sse, tokenize  # noqa: E402
import chat_golden  # noqa: E402
import chat_jinja_check  # noqa: E402

R = Results("e2e_toolsyn")
T = "tests/data/chat/templates/llama.cpp/"
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather",
                                           "parameters": {"type": "object", "properties": {
                                               "city": {"type": "string"}, "days": {"type": "integer"}},
                                               "required": ["city"]}}},
         {"type": "function", "function": {"name": "ping", "description": "Is it up", "parameters": {"type": "object", "properties": {}}}}]
ANTHROPIC_TOOLS = [{"name": t["function"]["name"], "description": t["function"]["description"],
                    "input_schema": t["function"]["parameters"]} for t in TOOLS]
WANT = [("get_weather", {"city": "Paris", "days": 3})]

# (template, the reply as the family's models write it, content in front, calls)
CASES = [
    ("Qwen-Qwen3-0.6B.jinja",
     'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n</tool_call>',
     "Checking.", WANT),
    ("NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja",
     '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n</tool_call>\n'
     '<tool_call>\n{"name": "ping", "arguments": {}}\n</tool_call>',
     "", WANT + [("ping", {})]),
    ("Qwen3-Coder.jinja",
     "Sure.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
     "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
     "Sure.", WANT),
    ("meta-llama-Llama-3.1-8B-Instruct.jinja",
     '{"name": "get_weather", "parameters": {"city": "Paris", "days": 3}}', "", WANT),
    ("unsloth-mistral-Devstral-Small-2507.jinja",
     '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "days": 3}[TOOL_CALLS]ping[ARGS]{}', "",
     WANT + [("ping", {})]),
    ("deepseek-ai-DeepSeek-V3.1.jinja",
     "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>"
     '{"city": "Paris", "days": 3}<｜tool▁call▁end｜><｜tool▁calls▁end｜>', "", WANT),
    ("GLM-4.6.jinja",
     "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
     "<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>", "", WANT),
    ("moonshotai-Kimi-K2.jinja",
     "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
     '{"city": "Paris", "days": 3}<|tool_call_end|><|tool_calls_section_end|>', "", WANT),
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


def calls_of(tool_calls):
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in tool_calls]


def check(name, reply, content, want):
    srv = Server(R, "--chat-template-file", T + name, "-c", "8192")  # Devstral's system prompt: 4k tokens
    try:
        base = {"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": TOOLS,
                "grammar": gbnf_literal(reply), "max_tokens": 400, "temperature": 0}
        st, _, j = srv.post("/v1/chat/completions", base)
        m = j["choices"][0]["message"] if st == 200 else {}
        got = calls_of(m.get("tool_calls") or [])
        R.ok(st == 200 and got == want and (m.get("content") or "") == content and
             j["choices"][0]["finish_reason"] == "tool_calls",
             "%s chat: %s %s\n  want calls %s content %r" % (name, st, j, want, content))
        # streamed: content deltas and the calls, no markup
        _, evs = sse(srv, "/v1/chat/completions", dict(base, stream=True))
        text, calls, fin = "", {}, None
        for e in evs:
            for ch in e.get("choices", []):
                d = ch.get("delta", {})
                text += d.get("content") or ""
                for tc in d.get("tool_calls") or []:
                    c = calls.setdefault(tc["index"], {"name": "", "arguments": ""})
                    c["name"] += tc.get("function", {}).get("name") or ""
                    c["arguments"] += tc.get("function", {}).get("arguments") or ""
                fin = ch.get("finish_reason") or fin
        sgot = [(calls[k]["name"], json.loads(calls[k]["arguments"])) for k in sorted(calls)]
        R.ok(sgot == want and text.strip() == content and fin == "tool_calls",
             "%s stream: calls %s text %r finish %s" % (name, sgot, text, fin))
        # Anthropic Messages
        st, _, j = srv.post("/v1/messages", {"model": "m", "max_tokens": 400, "tools": ANTHROPIC_TOOLS,
                                             "grammar": gbnf_literal(reply),
                                             "messages": [{"role": "user", "content": "Weather in Paris?"}]})
        uses = [(b["name"], b["input"]) for b in j.get("content", []) if b.get("type") == "tool_use"] \
            if st == 200 else None
        R.ok(st == 200 and uses == want and j.get("stop_reason") == "tool_use",
             "%s messages: %s %s" % (name, st, j))
        # OpenAI Responses
        st, _, j = srv.post("/v1/responses", {"model": "m", "max_output_tokens": 400, "grammar": gbnf_literal(reply),
                                              "tools": [dict(t["function"], type="function") for t in TOOLS],
                                              "input": "Weather in Paris?"})
        fcs = [(o["name"], json.loads(o["arguments"])) for o in j.get("output", []) if o.get("type") == "function_call"] \
            if st == 200 else None
        R.ok(st == 200 and fcs == want, "%s responses: %s %s" % (name, st, j))
        # a reply that only mentions the markup is content
        plain = "I would call get_weather with city=Paris."
        st, _, j = srv.post("/v1/chat/completions", dict(base, grammar=gbnf_literal(plain)))
        m = j["choices"][0]["message"] if st == 200 else {}
        R.ok(st == 200 and not m.get("tool_calls") and m.get("content") == plain,
             "%s plain reply: %s %s" % (name, st, j))
        srv.stop()
    except Exception as e:  # noqa: BLE001
        R.ok(False, "%s: %r" % (name, e))
        srv.kill()


LEVEL = [{"type": "function", "function": {"name": "set_level", "description": "Set the level",
                                           "parameters": {"type": "object", "properties": {
                                               "level": {"type": "integer", "minimum": 1, "maximum": 9}},
                                               "required": ["level"]}}}]


def check_forced(name):
    srv = Server(R, "--chat-template-file", T + name, "-c", "8192")
    try:
        msgs = [{"role": "user", "content": "Level?"}]
        for choice in ("required", {"type": "function", "function": {"name": "set_level"}}):
            st, _, j = srv.post("/v1/chat/completions", {"messages": msgs, "tools": LEVEL, "tool_choice": choice,
                                                          "max_tokens": 200, "return_token_ids": True})
            ch = j["choices"][0] if st == 200 else {}
            calls = calls_of(ch.get("message", {}).get("tool_calls") or []) if st == 200 else []
            R.ok(st == 200 and ch["finish_reason"] == "tool_calls" and len(calls) == 1 and
                 calls[0][0] == "set_level" and list(calls[0][1]) == ["level"] and 1 <= calls[0][1]["level"] <= 9,
                 "%s forced %s: %s %s" % (name, choice, st, j))
            if st != 200:
                continue
            m = ch["message"]
            back = msgs + [{"role": "assistant", "content": m.get("content") or "", "tool_calls": m["tool_calls"]},
                           {"role": "tool", "tool_call_id": m["tool_calls"][0]["id"], "content": "ok"}]
            st, _, j2 = srv.post("/v1/chat/completions", {"messages": back, "tools": LEVEL, "max_tokens": 1,
                                                           "return_token_ids": True})
            _, _, d1 = srv.post("/detokenize", {"tokens": ch["prompt_token_ids"] + ch["token_ids"]})
            _, _, d2 = srv.post("/detokenize", {"tokens": j2["choices"][0]["prompt_token_ids"] if st == 200 else []})
            a, b = d1.get("content", ""), d2.get("content", "")
            # the answer's end-of-turn token is the template's too: compare up to it
            R.ok(st == 200 and b.startswith(a.rstrip()) and len(a) > len(d1.get("content", "")) // 2,
                 "%s forced call re-rendered: generated %r\n  next prompt %r" % (name, a[-120:], b[len(a) - 120:len(a) + 40]))
        st, _, j = srv.post("/v1/chat/completions", {"messages": msgs, "tools": LEVEL, "max_tokens": 5,
                                                      "tool_choice": {"type": "function", "function": {"name": "nope"}}})
        R.ok(st == 400 and "nope" in json.dumps(j), "%s forced unknown function: %s %s" % (name, st, j))
        srv.stop()
    except Exception as e:  # noqa: BLE001
        R.ok(False, "%s forced: %r" % (name, e))
        srv.kill()


def check_generic(path, family):
    srv = Server(R, "--chat-template-file", path)
    try:
        env = chat_jinja_check.make_env()
        tmpl = env.from_string(open(path).read())
        conv = {"messages": [{"role": "user", "content": "Weather in Paris?"},
                             {"role": "assistant", "content": "", "tool_calls": [
                                 {"id": "c1", "type": "function",
                                  "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
                             {"role": "tool", "tool_call_id": "c1", "content": "{\"temp\": 18}"},
                             {"role": "user", "content": "And tomorrow?"}], "tools": TOOLS}
        messages, tools = chat_golden.normalize(conv)
        messages, tools = chat_golden.generic_tools(family, messages, tools)
        text = tmpl.render(messages=messages, tools=tools, bos_token="<s>", eos_token="</s>",
                           add_generation_prompt=True)
        want = tokenize(srv, text, add_special=False)
        want = want if want[:1] == [1] else [1] + want
        st, _, j = srv.post("/v1/chat/completions", dict(conv, max_tokens=1, return_token_ids=True))
        got = j["choices"][0].get("prompt_token_ids") if st == 200 else j
        R.ok(st == 200 and got == want, "%s generic format: %s\n  want %s\n  got  %s" % (path, st, want[:40], got))
        reply = 'Let me see.\n{"tool_calls":[{"name":"get_weather","arguments":{"city":"Paris","days":3}}]}'
        st, _, j = srv.post("/v1/chat/completions", dict(conv, grammar=gbnf_literal(reply), max_tokens=200))
        m = j["choices"][0]["message"] if st == 200 else {}
        R.ok(st == 200 and calls_of(m.get("tool_calls") or []) == WANT and m.get("content") == "Let me see.",
             "%s generic reply: %s %s" % (path, st, j))
        srv.stop()
    except Exception as e:  # noqa: BLE001
        R.ok(False, "%s: %r" % (path, e))
        srv.kill()


def main():
    try:
        for name, reply, content, want in CASES:
            check(name, reply, content, want)
            # the bundled SentencePiece vocabulary writes DeepSeek's U+2581 back as a space
            if "DeepSeek" not in name:
                check_forced(name)
        check_generic("tests/data/chat/templates/google-gemma-3-it.jinja", "gemma")
        check_generic("tests/data/chat/templates/meta-llama-Llama-2-7b-chat-hf.jinja", "llama2")
        check_generic("tests/data/chat/templates/teknium-OpenHermes-2.5-Mistral-7B.jinja", "chatml")
    finally:
        kill_all()
    return R.finish()


if __name__ == "__main__":
    sys.exit(main())
