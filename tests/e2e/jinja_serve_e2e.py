#!/usr/bin/env python3
"""End-to-end tests of `kvpin serve` rendering chat with a real Jinja
template (--chat-template-file; src/serve/chat_tmpl.c over src/jinja/).

Oracle: Python's jinja2 in transformers' configuration
(tools/chat_jinja_check.py's make_env and jinja2_render, the request
normalization of tools/chat_golden.py) renders the same request with the
bundled vocabulary's "<s>"/"</s>" as bos/eos; the server's /tokenize of that
text (special tokens parsed, BOS put in front when it is not there, as a
prompt gets it) must be the prompt_token_ids the chat answer returns. The
conversations' content holds no control-token text, so tokenizing the whole
rendering with special tokens parsed is what the markup/plain split gives.
The Messages API (count_tokens) and the Responses API (usage.input_tokens)
must count the same prompt as the chat request they translate to.
Also: a model's own tokenizer.chat_template is the default, its tool_use
variant serves requests with tools; chat_template_kwargs are the template's
variables (the ones its text does not name are listed as ignored) (a copy of the bundled model given both,
tests/shell/gguf_edit.py); a template's raise_exception is a 400 with its
message, another failure a 400 naming line and column; a syntax error stops
the server with its line and column; a date-stamping template
(strftime_now) renders SOURCE_DATE_EPOCH's day.
"""
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "shell"))
import gguf_edit  # noqa: E402
from kvpin_test import KVPIN, MODEL, Results, Server, kill_all, tokenize  # noqa: E402
import chat_jinja_check  # noqa: E402

R = Results("e2e_jinja_serve")
T = "tests/data/chat/templates/"
BOS_ID = 1
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                           "parameters": {"type": "object", "properties": {
                                               "city": {"type": "string"}}, "required": ["city"]}}}]
CONVS = [
    {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]},
    {"messages": [{"role": "user", "content": "Weather in Paris?"},
                  {"role": "assistant", "content": "", "tool_calls": [
                      {"id": "c1", "type": "function",
                       "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
                  {"role": "tool", "tool_call_id": "c1", "content": "{\"temp\": 18}"}],
     "tools": TOOLS},
    {"messages": [{"role": "user", "content": "One"}, {"role": "assistant", "content": "Two"},
                  {"role": "user", "content": [{"type": "text", "text": "Three"}, {"type": "text", "text": "Four"}]}]},
]


def expected_ids(srv, tmpl, req):
    text = chat_jinja_check.jinja2_render(tmpl, req, "<s>", "</s>")
    ids = tokenize(srv, text, add_special=False)
    return ids if ids[:1] == [BOS_ID] else [BOS_ID] + ids


def chat_ids(srv, req):
    body = dict(req, max_tokens=1, return_token_ids=True)
    st, _, j = srv.post("/v1/chat/completions", body)
    return st, j["choices"][0].get("prompt_token_ids") if st == 200 else j


def check_template(name, env, extra):
    tmpl = env.from_string(open(T + name).read())
    srv = Server(R, "--chat-template-file", T + name)
    try:
        for i, conv in enumerate(CONVS + extra):
            st, got = chat_ids(srv, conv)
            want = expected_ids(srv, tmpl, conv)
            R.ok(st == 200 and got == want, "%s conversation %d: chat prompt %s\n  want %s\n  got  %s" %
                 (name, i, st, want[:60], got if st != 200 else got[:60]))
        want = len(expected_ids(srv, tmpl, CONVS[0]))
        st, _, j = srv.post("/v1/messages/count_tokens", {"model": "m", "system": "Be brief.",
                                                           "messages": [{"role": "user", "content": "Hi there"}]})
        R.ok(st == 200 and j.get("input_tokens") == want, "%s Messages count_tokens: %s %s (want %d)" %
             (name, st, j, want))
        st, _, j = srv.post("/v1/messages", {"model": "m", "system": "Be brief.", "max_tokens": 1,
                                             "messages": [{"role": "user", "content": "Hi there"}]})
        u = j.get("usage", {}) if st == 200 else {}
        total = u.get("input_tokens", 0) + u.get("cache_creation_input_tokens", 0) + u.get("cache_read_input_tokens", 0)
        R.ok(st == 200 and total == want, "%s Messages usage: %s %s (want %d)" % (name, st, j, want))
        st, _, j = srv.post("/v1/responses", {"model": "m", "instructions": "Be brief.", "input": "Hi there",
                                              "max_output_tokens": 16})
        R.ok(st == 200 and j["usage"]["input_tokens"] == want, "%s Responses usage: %s %s (want %d)" %
             (name, st, j.get("usage", j), want))
        return srv
    except Exception:
        srv.stop()
        raise


def model_template(env):
    with tempfile.TemporaryDirectory() as d:
        m = os.path.join(d, "m.gguf")
        main_src = "{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m.content }}{{ eos_token }}{% endfor %}"
        tool_src = "{{ bos_token }}tools:{{ tools | length }}{{ eos_token }}"
        gguf_edit.edit(MODEL, m, [], [("tokenizer.chat_template", main_src),
                                     ("tokenizer.chat_template.tool_use", tool_src)])
        srv = Server(R, model=m)
        try:
            st, got = chat_ids(srv, CONVS[0])
            want = expected_ids(srv, env.from_string(main_src), CONVS[0])
            R.ok(st == 200 and got == want, "the model's template by default: %s %s (want %s)" % (st, got, want))
            st, got = chat_ids(srv, CONVS[1])
            want = expected_ids(srv, env.from_string(tool_src), CONVS[1])
            R.ok(st == 200 and got == want, "its tool_use variant with tools: %s %s (want %s)" % (st, got, want))
        finally:
            srv.stop()
        k = os.path.join(d, "k.jinja")
        kw_src = "{% for m in messages %}{{ m.content }}{% endfor %}{% if greeting is defined %}[{{ greeting }}]{% endif %}"
        with open(k, "w") as f:
            f.write(kw_src)
        srv = Server(R, "--chat-template-file", k)
        try:
            req = dict(CONVS[0], chat_template_kwargs={"greeting": "hello", "unused_kw": 1})
            st, h, j = srv.post("/v1/chat/completions", dict(req, max_tokens=1, return_token_ids=True))
            want = expected_ids(srv, env.from_string(kw_src), req)
            got = j["choices"][0]["prompt_token_ids"] if st == 200 else j
            R.ok(st == 200 and got == want and h.get("x-kvpin-ignored-fields") == "chat_template_kwargs.unused_kw",
                 "chat_template_kwargs reach the template: %s %s %s (want %s)" %
                 (st, h.get("x-kvpin-ignored-fields"), got, want))
        finally:
            srv.stop()
        t = os.path.join(d, "t.jinja")
        with open(t, "w") as f:
            f.write("{% for m in messages %}\n  {{ m.content + 1 }}\n{% endfor %}")
        srv = Server(R, "--chat-template-file", t)
        try:
            st, _, j = srv.post("/v1/chat/completions", dict(CONVS[0], max_tokens=1))
            msg = j["error"]["message"] if st == 400 else ""
            R.ok(st == 400 and "line 2, column" in msg and "TypeError" in msg, "a failing template: %s %s" % (st, j))
        finally:
            srv.stop()


def main():
    env = chat_jinja_check.make_env()
    try:
        think = [dict(CONVS[0], chat_template_kwargs={"enable_thinking": False})]
        check_template("Qwen-Qwen3-0.6B.jinja", env, think).stop()
        srv = check_template("meta-llama-Llama-3.3-70B-Instruct.jinja", env, [])
        two = [{"id": "a", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}] * 2
        st, _, j = srv.post("/v1/chat/completions", {"messages": [
            {"role": "user", "content": "x"}, {"role": "assistant", "content": "", "tool_calls": two},
            {"role": "tool", "content": "y"}], "tools": TOOLS, "max_tokens": 1})
        R.ok(st == 400 and j["error"]["message"] == "This model only supports single tool-calls at once!",
             "raise_exception: a 400 with the template's message: %s %s" % (st, j))
        srv.stop()
        model_template(env)
        os.environ["SOURCE_DATE_EPOCH"] = "1733356800"
        tmpl = env.from_string(open(T + "meta-llama-Llama-3.2-3B-Instruct.jinja").read())
        srv = Server(R, "--chat-template-file", T + "meta-llama-Llama-3.2-3B-Instruct.jinja",
                     env={"SOURCE_DATE_EPOCH": "1733356800"})
        st, got = chat_ids(srv, CONVS[0])
        want = expected_ids(srv, tmpl, CONVS[0])
        R.ok(st == 200 and got == want, "strftime_now: the day of SOURCE_DATE_EPOCH: %s" % st)
        srv.stop()
        p = subprocess.run([KVPIN, "serve", "-m", MODEL, "--port", "0", "--chat-template-file", "/dev/stdin"],
                           input=b"{% for m in messages %}\n{{ m.content ) }}\n{% endfor %}", capture_output=True,
                           timeout=60)
        err = p.stderr.decode()
        R.ok(p.returncode == 2 and "line 2, column 14" in err, "a syntax error stops the server: %d %s" %
             (p.returncode, err[-300:]))
    finally:
        kill_all()
    return R.finish()


if __name__ == "__main__":
    sys.exit(main())
