#!/usr/bin/env python3
"""Reference renderings of chat templates for tests/unit/test_chat.c.

    python3 tools/chat_golden.py [DATA_DIR]      (default tests/data/chat)

Renders every conversation of DATA_DIR/conversations.json through every
template listed in DATA_DIR/templates.json with jinja2, the way Hugging Face
transformers' apply_chat_template renders chat templates: an
ImmutableSandboxedEnvironment with trim_blocks and lstrip_blocks, the
loopcontrols extension, and the raise_exception / strftime_now globals.
Writes DATA_DIR/golden/<template>__<conversation>.txt with the rendered
bytes, or <template>__<conversation>.err with the exception text when the
template refuses the conversation.

Two things differ from a plain apply_chat_template call, both on purpose
and both documented in DATA_DIR/README.md:

  * The request is first normalized the way an OpenAI-compatible server
    (llama.cpp's, vLLM's, kvpin's) does before templating: a content array
    of text parts becomes one string (parts joined by "\\n"), null content
    becomes "", tool-call arguments (a JSON string in the OpenAI API) are
    parsed into objects, absent or empty tools are None.

  * `tojson` writes RFC 8785 canonical JSON (members sorted by UTF-16 code
    units, no whitespace, ECMAScript numbers) and ignores indent=, where
    transformers writes json.dumps(x, ensure_ascii=False, indent=indent):
    insertion order and ", " / ": " separators. kvpin emits canonical JSON
    for tool schemas and arguments so that key order and spacing sent by a
    client never change the prompt. For strings both give the same bytes.

Templates of families without a tool syntax of their own (all but
qwen2.5, qwen3 and llama3.1) are given conversations with tools in kvpin's
generic tool format (src/serve/chat.h): `generic_tools` below rewrites the
tools, tool calls and tool messages into plain system / user / assistant
messages, a second implementation of the documented bytes, and the real
template renders the result.

The date the Llama 3.1-3.3 templates print is passed as date_string
("26 Jul 2024", kvpin's default and the 3.1 template's own fallback, unless
a conversation sets "date_string"), so the output does not depend on the
day it is run. A conversation's "enable_thinking" is passed through too.

jinja2 is needed only to regenerate the files; the C test reads the
committed goldens.
"""
import json
import math
import os
import sys
from datetime import datetime

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

DATE_STRING = "26 Jul 2024"


# ------------------------------------------------------------------ canonical JSON
def es_number(x):
    """ECMAScript Number::toString of a finite double (RFC 8785 3.2.2.3)."""
    if isinstance(x, bool):
        raise TypeError("bool is not a number")
    x = float(x)
    if not math.isfinite(x):
        raise ValueError("NaN and infinities have no JSON form")
    if x == 0:
        return "0"
    if x < 0:
        return "-" + es_number(-x)
    # repr gives the shortest digits that read back (Python 3.1+)
    mant, _, exp = repr(x).partition("e")
    int_part, _, frac = mant.partition(".")
    digits = (int_part + frac).lstrip("0")
    lead_zeros = len(int_part + frac) - len((int_part + frac).lstrip("0"))
    n = len(int_part) - lead_zeros + (int(exp) if exp else 0)
    digits = digits.rstrip("0") or "0"
    k = len(digits)
    if k <= n <= 21:
        return digits + "0" * (n - k)
    if 0 < n <= 21:
        return digits[:n] + "." + digits[n:]
    if -6 < n <= 0:
        return "0." + "0" * (-n) + digits
    e = n - 1
    sign = "+" if e >= 0 else "-"
    if k == 1:
        return digits + "e" + sign + str(abs(e))
    return digits[0] + "." + digits[1:] + "e" + sign + str(abs(e))


def canonical(v):
    if v is None:
        return "null"
    if v is True:
        return "true"
    if v is False:
        return "false"
    if isinstance(v, (int, float)):
        return es_number(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(canonical(x) for x in v) + "]"
    if isinstance(v, dict):
        keys = sorted(v, key=lambda k: k.encode("utf-16-be"))
        return "{" + ",".join(json.dumps(k, ensure_ascii=False) + ":" + canonical(v[k]) for k in keys) + "}"
    raise TypeError("not JSON: %r" % (v,))


def tojson_canonical(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return canonical(x)


# ------------------------------------------------------------------ request normalization
def flatten(content):
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "\n".join(part["text"] for part in content)


def normalize(conv):
    messages = []
    for m in conv["messages"]:
        out = dict(m)
        out["content"] = flatten(m.get("content"))
        calls = m.get("tool_calls")
        if calls:
            out["tool_calls"] = []
            for c in calls:
                c = json.loads(json.dumps(c))
                c["function"]["arguments"] = json.loads(c["function"]["arguments"])
                out["tool_calls"].append(c)
        else:
            out.pop("tool_calls", None)
        if isinstance(m.get("reasoning_content"), str) and "thinking" not in m:
            out["thinking"] = m["reasoning_content"]
        messages.append(out)
    return messages, (conv.get("tools") or None)


# ------------------------------------------------------------------ the generic tool format
NATIVE_TOOLS = {"qwen2.5", "qwen3", "llama3.1"}
GENERIC_INTRO = ("# Tools\n\nYou may call one or more functions to assist with the user query. "
                 "The functions, one JSON object each:\n")
GENERIC_OUTRO = ("\nTo call functions, end your reply with one JSON object in this form, and "
                 "nothing after it:\n"
                 '{"tool_calls":[{"name":"<function-name>","arguments":<args-json-object>}]}')


def generic_tools(family, messages, tools):
    """The conversation in the generic tool format (chat.h), as plain messages."""
    if not tools and not any(m["role"] == "tool" or m.get("tool_calls") for m in messages):
        return messages, tools
    out = []
    block = GENERIC_INTRO + "".join(canonical(t) + "\n" for t in tools or []) + GENERIC_OUTRO
    if tools and messages[0]["role"] != "system":
        prefix = "You are a helpful assistant.\n\n" if family == "qwen2" else ""
        out.append({"role": "system", "content": prefix + block})
    alternate = family in ("llama2", "mistral", "gemma")
    i = 0
    while i < len(messages):
        m = messages[i]
        if m["role"] == "tool":
            results = []
            while i < len(messages) and messages[i]["role"] == "tool":
                t = messages[i]
                name = t.get("name")
                if name is None and t.get("tool_call_id") is not None:
                    prev = [x for x in out if x.get("_calls")]
                    for c in (prev[-1]["_calls"] if prev else []):
                        if c.get("id") == t["tool_call_id"]:
                            name = c["function"]["name"]
                            break
                r = ""
                if t.get("tool_call_id") is not None:
                    r += '"tool_call_id":' + canonical(t["tool_call_id"]) + ","
                if name is not None:
                    r += '"name":' + canonical(name) + ","
                results.append("{" + r + '"content":' + canonical(t["content"]) + "}")
                i += 1
            text = '{"tool_results":[' + ",".join(results) + "]}"
            if alternate and i < len(messages) and messages[i]["role"] == "user":
                text += "\n\n" + messages[i]["content"]
                i += 1
            out.append({"role": "user", "content": text})
            continue
        m = dict(m)
        if i == 0 and m["role"] == "system" and tools:
            m["content"] = (m["content"] + "\n\n" if m["content"] else "") + block
        elif m.get("tool_calls"):
            calls = ",".join('{"name":' + canonical(c["function"]["name"]) + ',"arguments":' +
                             canonical(c["function"]["arguments"]) + "}" for c in m["tool_calls"])
            m["content"] = (m["content"] + "\n" if m["content"] else "") + '{"tool_calls":[' + calls + "]}"
            m["_calls"] = m.pop("tool_calls")
        out.append(m)
        i += 1
    for m in out:
        m.pop("_calls", None)
    return out, None


# ------------------------------------------------------------------ rendering
def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def strftime_now(fmt):
    return datetime.now().strftime(fmt)


def make_env():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson_canonical
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def main():
    data = sys.argv[1] if len(sys.argv) > 1 else "tests/data/chat"
    with open(os.path.join(data, "templates.json"), encoding="utf-8") as f:
        templates = json.load(f)
    with open(os.path.join(data, "conversations.json"), encoding="utf-8") as f:
        conversations = json.load(f)
    out_dir = os.path.join(data, "golden")
    os.makedirs(out_dir, exist_ok=True)
    for name in os.listdir(out_dir):
        os.remove(os.path.join(out_dir, name))
    env = make_env()
    written = refused = 0
    for t in templates:
        with open(os.path.join(data, "templates", t["file"]), encoding="utf-8", newline="") as f:
            template = env.from_string(f.read())
        stem = t["file"][: -len(".jinja")]
        for conv_name, conv in conversations.items():
            messages, tools = normalize(conv)
            if t["family"] not in NATIVE_TOOLS:
                messages, tools = generic_tools(t["family"], messages, tools)
            base = os.path.join(out_dir, stem + "__" + conv_name)
            extra = {}
            if "enable_thinking" in conv:
                extra["enable_thinking"] = conv["enable_thinking"]
            try:
                text = template.render(messages=messages, tools=tools, bos_token=t["bos"],
                                       eos_token=t["eos"],
                                       add_generation_prompt=conv["add_generation_prompt"],
                                       date_string=conv.get("date_string", DATE_STRING), **extra)
            except Exception as e:  # the template refused the conversation
                with open(base + ".err", "w", encoding="utf-8") as f:
                    f.write("%s: %s\n" % (type(e).__name__, e))
                refused += 1
                continue
            with open(base + ".txt", "w", encoding="utf-8", newline="") as f:
                f.write(text)
            written += 1
    print("%d renderings, %d refusals in %s" % (written, refused, out_dir))


if __name__ == "__main__":
    main()
