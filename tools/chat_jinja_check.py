#!/usr/bin/env python3
"""The byte-exact check of kvpin's Jinja interpreter against jinja2 (make test).

    python3 tools/chat_jinja_check.py [--kvpin PATH] [--data DIR] [-v]

Renders every template under DIR/templates/ (every *.jinja, subfolders
included) on every conversation of DIR/conversations.json and
DIR/jinja_conversations.json twice: with Python's jinja2, live, the way
Hugging Face transformers' apply_chat_template does (an
ImmutableSandboxedEnvironment with trim_blocks and lstrip_blocks, the
loopcontrols extension, transformers' {% generation %} tag, and the
raise_exception / strftime_now globals), and with `kvpin template --batch`,
all cases in one process. Both sides get the same OpenAI request body;
Python normalizes it with tools/chat_golden.py's `normalize` (the rules
kvpin's serve/chat_jinja.c implements) and builds the context
(messages, tools, add_generation_prompt, bos_token, eos_token, the
members of chat_template_kwargs).

`tojson` writes RFC 8785 canonical JSON on both sides (kvpin's choice, see
DIR/README.md). strftime_now reads SOURCE_DATE_EPOCH, which this script
sets for both, so dates do not depend on the day.

A case passes when both render the same bytes, or both fail: a template's
raise_exception message must be kvpin's exactly; for other errors
(undefined values, type errors) any kvpin error is accepted. Prints the
count (templates x conversations, identical / differing) and the cases
that differ; exits 1 when one does.
"""
import argparse
import datetime
import json
import os
import subprocess
import sys

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import chat_golden  # noqa: E402  (normalize, canonical tojson, raise_exception)

EPOCH = "1733356800"  # 2024-12-05 00:00:00 UTC
DEFAULT_BOS, DEFAULT_EOS = "<|bos|>", "<|eos|>"


class Generation(jinja2.ext.Extension):
    """transformers' {% generation %}...{% endgeneration %}: the body, rendered."""
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def strftime_now(fmt):
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    if epoch:
        return datetime.datetime.fromtimestamp(int(epoch), datetime.timezone.utc).strftime(fmt)
    return datetime.datetime.now().strftime(fmt)


def make_env():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols, Generation])
    env.filters["tojson"] = chat_golden.tojson_canonical
    env.globals["raise_exception"] = chat_golden.raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def request_of(conv):
    """A conversation of the test data as an OpenAI request body."""
    req = {"messages": conv["messages"], "add_generation_prompt": conv.get("add_generation_prompt", True)}
    if "tools" in conv:
        req["tools"] = conv["tools"]
    kwargs = dict(conv.get("chat_template_kwargs", {}))
    for k in ("enable_thinking", "date_string"):
        if k in conv:
            kwargs[k] = conv[k]
    if kwargs:
        req["chat_template_kwargs"] = kwargs
    return req


def jinja2_render(template, req, bos, eos):
    messages, tools = chat_golden.normalize(req)
    ctx = dict(req.get("chat_template_kwargs", {}))
    ctx.update(messages=messages, tools=tools, bos_token=bos, eos_token=eos,
               add_generation_prompt=req.get("add_generation_prompt", True))
    return template.render(**ctx)


def load_cases(data):
    templates = []
    for root, _, names in os.walk(os.path.join(data, "templates")):
        templates += [os.path.join(root, n) for n in sorted(names) if n.endswith(".jinja")]
    templates.sort()
    tokens = {}
    meta = os.path.join(data, "templates.json")
    if os.path.exists(meta):
        with open(meta, encoding="utf-8") as f:
            for t in json.load(f):
                tokens[os.path.join(data, "templates", t["file"])] = (t["bos"], t["eos"])
    convs = {}
    for name in ("conversations.json", "jinja_conversations.json"):
        path = os.path.join(data, name)
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                convs.update(json.load(f))
    return templates, tokens, convs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kvpin", default=os.environ.get("KVPIN", "./kvpin"))
    ap.add_argument("--data", default="tests/data/chat")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args()
    os.environ["SOURCE_DATE_EPOCH"] = EPOCH
    templates, tokens, convs = load_cases(args.data)
    env = make_env()
    cases, expected = [], []
    for path in templates:
        bos, eos = tokens.get(path, (DEFAULT_BOS, DEFAULT_EOS))
        with open(path, encoding="utf-8", newline="") as f:
            src = f.read()
        try:
            tmpl, compile_err = env.from_string(src), None
        except Exception as e:  # the template does not compile in jinja2
            tmpl, compile_err = None, e
        for name, conv in convs.items():
            req = request_of(conv)
            cases.append({"template": path, "request": req, "bos": bos, "eos": eos})
            if compile_err:
                expected.append((path, name, None, compile_err))
                continue
            try:
                expected.append((path, name, jinja2_render(tmpl, req, bos, eos), None))
            except Exception as e:
                expected.append((path, name, None, e))
    stdin = "".join(json.dumps(c, ensure_ascii=False) + "\n" for c in cases)
    p = subprocess.run([args.kvpin, "template", "--batch"], input=stdin.encode(), capture_output=True)
    if p.returncode != 0:
        sys.stderr.write(p.stderr.decode(errors="replace"))
        print("chat_jinja_check: kvpin template --batch failed (exit %d)" % p.returncode)
        return 1
    answers = [json.loads(line) for line in p.stdout.decode().splitlines()]
    if len(answers) != len(cases):
        print("chat_jinja_check: %d answers for %d cases" % (len(answers), len(cases)))
        return 1
    same = raised = 0
    diffs = []
    for (path, name, text, err), ans in zip(expected, answers):
        where = "%s x %s" % (os.path.relpath(path, os.path.join(args.data, "templates")), name)
        if err is None:
            if ans["ok"] and ans["text"] == text:
                same += 1
                continue
            got = ans["text"] if ans["ok"] else "%s: %s (%s:%s)" % (ans["kind"], ans["msg"], ans["line"], ans["col"])
            diffs.append((where, repr(text), repr(got)))
            continue
        exact = type(err) is jinja2.exceptions.TemplateError  # raise_exception
        if ans["ok"]:
            diffs.append((where, "%s: %s" % (type(err).__name__, err), "rendered " + repr(ans["text"][:200])))
        elif exact and (ans["kind"] != "TemplateError" or ans["msg"] != str(err)):
            diffs.append((where, "raise_exception(%r)" % str(err), "%s: %s" % (ans["kind"], ans["msg"])))
        else:
            same += 1
            raised += 1
            if args.verbose:
                print("both fail: %s: jinja2 %s: %s | kvpin %s: %s" % (where, type(err).__name__, err, ans["kind"], ans["msg"]))
    for where, want, got in diffs:
        print("DIFF %s\n  jinja2: %s\n  kvpin:  %s" % (where, want[:600], got[:600]))
    print("chat_jinja_check: %d templates x %d conversations = %d cases: %d identical (%d of them errors on both sides), %d differing"
          % (len(templates), len(convs), len(cases), same, raised, len(diffs)))
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
