#!/usr/bin/env python3
"""End-to-end tests of kvpin's Jinja interpreter through `kvpin template`
(run by tests/run_all.sh with the binary in $KVPIN).

  - the byte-exact check: tools/chat_jinja_check.py renders every template
    of tests/data/chat/templates/ on every conversation with Python's
    jinja2, live, and with `kvpin template --batch`, and compares (the
    oracle is jinja2; needs python3-jinja2, `make deps`);
  - the command line: --chat-template-file with --bos/--eos, a template's
    raise_exception (exit 1, the message on stderr), a syntax error (its
    line and column), and -m MODEL: a copy of the bundled model given a
    tokenizer.chat_template and a tool_use variant (tests/shell/gguf_edit.py)
    renders with the model's own bos/eos texts (read from the file by the
    test, not taken from kvpin), the variant only when tools are given;
  - --chat-template NAME: kvpin's built-in template of each family of
    tests/data/chat/templates.json renders conversations as the family's
    real template does (the goldens of tests/data/chat/golden/, made by
    jinja2: tools/chat_golden.py), tools in the generic format included;
    an unknown NAME, or NAME with a file, exits 2.
"""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "shell"))
from kvpin_test import KVPIN, MODEL, Results  # noqa: E402
import gguf_edit  # noqa: E402

R = Results("e2e_jinja")
ok = R.ok


def template(args, body):
    p = subprocess.run([KVPIN, "template"] + args, input=json.dumps(body).encode(), capture_output=True)
    return p.returncode, p.stdout.decode(), p.stderr.decode()


def model_tokens(path):
    """bos and eos texts of a GGUF file, read with gguf_edit's reader."""
    data = open(path, "rb").read()
    r = gguf_edit.Reader(data)
    r.o = 4
    r.take("I")
    r.take("Q")
    n_kv = r.take("Q")
    kv = {}
    for _ in range(n_kv):
        k = r.string()
        t = r.take("I")
        kv[k.decode()] = r.value(t)
    toks = kv["tokenizer.ggml.tokens"][1]
    return toks[kv["tokenizer.ggml.bos_token_id"]].decode(), toks[kv["tokenizer.ggml.eos_token_id"]].decode()


def main():
    env = dict(os.environ, KVPIN=KVPIN)
    p = subprocess.run([sys.executable, "tools/chat_jinja_check.py", "--kvpin", KVPIN], capture_output=True, env=env)
    out = p.stdout.decode()
    print(out.strip().splitlines()[-1] if out.strip() else p.stderr.decode()[-2000:])
    ok(p.returncode == 0, "chat_jinja_check: jinja2 and kvpin differ:\n" + out[-4000:] + p.stderr.decode()[-2000:])

    with tempfile.TemporaryDirectory() as d:
        t = os.path.join(d, "t.jinja")
        with open(t, "w") as f:
            f.write("{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}\n{% endfor %}"
                    "{% if add_generation_prompt %}[assistant]{% endif %}{{ eos_token }}")
        body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                             {"role": "assistant", "content": None}]}
        rc, so, se = template(["--chat-template-file", t, "--bos", "<B>", "--eos", "<E>"], body)
        ok(rc == 0 and so == "<B>[user]a\nb\n[assistant]\n[assistant]<E>", "template file: %d %r %r" % (rc, so, se))
        ok(t in se, "the source is named on stderr: %r" % se)
        body["add_generation_prompt"] = False
        rc, so, _ = template(["--chat-template-file", t], body)
        ok(rc == 0 and so == "[user]a\nb\n[assistant]\n", "add_generation_prompt false, no bos/eos: %r" % so)

        with open(t, "w") as f:
            f.write("{% if messages[0].role != 'system' %}{{ raise_exception('A system message is required.') }}{% endif %}")
        rc, so, se = template(["--chat-template-file", t], {"messages": [{"role": "user", "content": "x"}]})
        ok(rc == 1 and so == "" and "A system message is required." in se, "raise_exception: %d %r %r" % (rc, so, se))

        with open(t, "w") as f:
            f.write("line one\n{% if x %}\n{{ 1 + }}\n{% endif %}")
        rc, so, se = template(["--chat-template-file", t], {"messages": []})
        ok(rc == 1 and ":3:8: TemplateSyntaxError" in se, "syntax error position: %r" % se)

        m = os.path.join(d, "m.gguf")
        gguf_edit.edit(MODEL, m, [], [("tokenizer.chat_template", "{{ bos_token }}plain{{ eos_token }}"),
                                     ("tokenizer.chat_template.tool_use", "{{ bos_token }}tools:{{ tools | length }}")])
        bos, eos = model_tokens(m)
        rc, so, se = template(["-m", m], {"messages": [{"role": "user", "content": "x"}]})
        ok(rc == 0 and so == bos + "plain" + eos, "model template: %d %r %r" % (rc, so, se))
        tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
        rc, so, se = template(["-m", m], {"messages": [], "tools": tools})
        ok(rc == 0 and so == bos + "tools:1" and "tool_use" in se, "tool_use variant: %d %r %r" % (rc, so, se))
        rc, so, se = template(["-m", MODEL], {"messages": []})
        ok(rc == 1 and "chat_template" in se, "a model without a template: %d %r" % (rc, se))

    data = "tests/data/chat"
    convs = json.load(open(os.path.join(data, "conversations.json")))
    compared = 0
    for t in json.load(open(os.path.join(data, "templates.json"))):
        for name in ("system_user", "tool_call_parallel", "think_tool_steps", "dated"):
            golden = os.path.join(data, "golden", t["file"][:-len(".jinja")] + "__" + name + ".txt")
            if not os.path.exists(golden):  # the template refuses it
                continue
            c = convs[name]
            kwargs = {k: c[k] for k in ("date_string", "enable_thinking") if k in c}
            body = {"messages": c["messages"], "add_generation_prompt": c["add_generation_prompt"],
                    "chat_template_kwargs": kwargs}
            if c.get("tools"):
                body["tools"] = c["tools"]
            rc, so, se = template(["--chat-template", t["family"], "--bos", t["bos"], "--eos", t["eos"]], body)
            want = open(golden, encoding="utf-8", newline="").read()
            ok(rc == 0 and so == want, "--chat-template %s / %s: %d %r\nwant %r\n%s" % (t["family"], name, rc, so, want, se))
            compared += 1
    ok(compared >= 40, "only %d built-in renderings compared" % compared)
    rc, so, se = template(["--chat-template", "vicuna"], {"messages": [{"role": "user", "content": "x"}]})
    ok(rc == 2 and "unknown --chat-template" in se, "unknown built-in name: %d %r" % (rc, se))
    rc, so, se = template(["--chat-template", "chatml", "--chat-template-file", "x.jinja"], {"messages": []})
    ok(rc == 2 and "exclude each other" in se, "a name and a file: %d %r" % (rc, se))
    rc, so, se = template(["--chat-template", "gemma"], {"messages": [{"role": "user", "content": "a"},
                                                                      {"role": "user", "content": "b"}]})
    ok(rc == 1 and so == "" and "messages[1].role: the gemma chat template expects" in se,
       "a built-in template's refusal: %d %r" % (rc, se))
    return R.finish()


if __name__ == "__main__":
    sys.exit(main())
