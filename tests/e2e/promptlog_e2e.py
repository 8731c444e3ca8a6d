#!/usr/bin/env python3
"""End-to-end tests of `kvpin serve --log-prompts FILE` and `kvpin doctor`
on what it wrote, and on a chat log (src/serve/promptlog.c, cli/cache.c).

Oracles: the prompts a server computed are the renderings the chat
template gives (jinja2 through tools/chat_jinja_check.py renders the same
requests: the log's "prompt" must be that text, byte for byte); the
doctor's verdict on the log is the one it gives on the chat requests
themselves rendered with the same template, and names the cause the
conversations were built with (a timestamp changed in the system prompt);
the log's lines are JSON with time, api, key and prompt_tokens (the
server's own usage), created 0600; a file kvpin cannot open stops the
server with its name.
"""
import json
import os
import stat
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
from kvpin_test import KVPIN, Results, Server, kill_all  # noqa: E402
import chat_jinja_check  # noqa: E402

R = Results("e2e_promptlog")
TMPL = "tests/data/chat/templates/teknium-OpenHermes-2.5-Mistral-7B.jinja"


def req(t):
    return {"messages": [{"role": "system", "content": "You are kvpin. The time is 10:%02d." % t},
                         {"role": "user", "content": "Summarize the plan."}]}


def doctor(*args):
    p = subprocess.run([KVPIN, "doctor", "--json"] + list(args), capture_output=True, text=True)
    return p.returncode, [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")], p.stderr


def main():
    d = tempfile.mkdtemp(prefix="kvpin-promptlog-")
    log = os.path.join(d, "prompts.jsonl")
    chat = os.path.join(d, "chat.jsonl")
    try:
        srv = Server(R, "--chat-template-file", TMPL, "--log-prompts", log)
        usage = []
        for t in range(3):
            st, _, j = srv.post("/v1/chat/completions", dict(req(t), max_tokens=2, prompt_cache_key="k1"))
            usage.append(j["usage"]["prompt_tokens"] if st == 200 else None)
        st, _, j = srv.post("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 1})
        srv.stop()
        lines = [json.loads(l) for l in open(log)]
        R.ok(len(lines) == 4 and [x["api"] for x in lines] == ["chat"] * 3 + ["completions"] and
             [x["prompt_tokens"] for x in lines[:3]] == usage and all(x.get("key") == "k1" for x in lines[:3]) and
             all(isinstance(x["time"], int) for x in lines), "the log's lines: %s" % lines)
        R.ok(stat.S_IMODE(os.stat(log).st_mode) == 0o600, "the log is 0600: %o" % os.stat(log).st_mode)
        env = chat_jinja_check.make_env()
        tmpl = env.from_string(open(TMPL).read())
        want = [chat_jinja_check.jinja2_render(tmpl, req(t), "<s>", "</s>") for t in range(3)]
        R.ok([x["prompt"] for x in lines[:3]] == want, "the prompts are the template's renderings")
        with open(chat, "w") as f:
            for t in range(3):
                f.write(json.dumps(req(t)) + "\n")
        rc1, a, e1 = doctor(log)
        rc2, b, e2 = doctor("--chat-template-file", TMPL, chat)
        R.ok(rc1 == 0 and len(a) >= 4 and a[1]["cause"] == "timestamp" and a[2]["cause"] == "timestamp",
             "doctor on the server's log: %s %s" % (a, e1))
        R.ok(rc2 == 0 and len(b) >= 3 and [x["cause"] for x in b[:3]] == [x["cause"] for x in a[:3]] and
             [x["diverged_at_byte"] for x in b[:3]] == [x["diverged_at_byte"] for x in a[:3]],
             "doctor on the chat log as on the server's: %s vs %s %s" % (b, a, e2))
        rc3, _, e3 = doctor(chat)
        R.ok(rc3 != 0 and "chat template" in e3, "a chat log without a template is refused: %s %r" % (rc3, e3))
        p = subprocess.run([KVPIN, "serve", "--port", "0", "--log-prompts", os.path.join(d, "no", "such", "x")],
                           capture_output=True, text=True, timeout=60)
        R.ok(p.returncode != 0 and "--log-prompts" in p.stderr, "an unwritable log: %s %r" % (p.returncode, p.stderr))
    finally:
        kill_all()
        for f in os.listdir(d):
            os.unlink(os.path.join(d, f))
        os.rmdir(d)
    return R.finish()


if __name__ == "__main__":
    sys.exit(main())
