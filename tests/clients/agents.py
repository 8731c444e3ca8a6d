#!/usr/bin/env python3
"""agents.py - the real coding agents against `kvpin serve` (run by
tests/clients/e2e_agents.sh after it installed the pinned npm packages).

Claude Code (`claude -p`, then `--continue`, then a new session) through
ANTHROPIC_BASE_URL, Codex (`codex exec`, then `exec resume --last`, then a
new session) through a custom model provider on the Responses API, and
opencode (`run`, `run --continue`, a new session) through an
OpenAI-compatible provider on chat completions, against a
random-weight model with a real BPE vocabulary and a 64k context
(`kvpin mkmodel`, 2 layers of width 64: the agents' 15-20k-token prompts
are computed in seconds even under the sanitizers), with --max-tokens-cap 8
so that a turn of random text ends at once.

Between each agent and kvpin sits a relay of this test's own: it times,
for every request, the first byte of the answer after the last byte of the
request. Oracles, none of them kvpin's word alone:
  - each agent exits 0 (its own verdict on every answer it got);
  - /metrics counts no answer but 200 (kvpin_requests_total by status);
  - the first byte of every answer came within 1 s of its request (the
    relay's clock), though a cold prompt takes seconds to compute;
  - a continued session reuses the whole previous prompt (the cache
    report's reused tokens against the previous request's prompt tokens,
    less the last token at most), and a new session's first miss is at the
    user's own new text (the doctor's snippet names it: everything before,
    the system prompt and the tools, came from the cache).
No network beyond loopback: Claude Code's non-essential traffic and both
agents' telemetry are off, and each runs in a fresh HOME.
"""
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "e2e"))
from kvpin_test import KVPIN, Results, Server  # noqa: E402

R = Results("e2e_agents")
ok = R.ok
BIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "node_modules", ".bin")


class Relay:
    """A TCP relay on a free loopback port to `port`, timing each answer's
    first byte after the request's last byte."""

    def __init__(self, port):
        self.up = port
        self.delays = []
        self.mu = threading.Lock()
        self.s = socket.socket()
        self.s.bind(("127.0.0.1", 0))
        self.s.listen(64)
        self.port = self.s.getsockname()[1]
        threading.Thread(target=self.accept, daemon=True).start()

    def accept(self):
        while True:
            try:
                c, _ = self.s.accept()
            except OSError:
                return
            u = socket.create_connection(("127.0.0.1", self.up))
            state = {"sent": None}
            threading.Thread(target=self.pump, args=(c, u, state, True), daemon=True).start()
            threading.Thread(target=self.pump, args=(u, c, state, False), daemon=True).start()

    def pump(self, src, dst, state, request):
        try:
            while True:
                b = src.recv(65536)
                if not b:
                    break
                now = time.time()
                if request:
                    state["sent"] = now
                elif state["sent"] is not None:
                    with self.mu:
                        self.delays.append(now - state["sent"])
                    state["sent"] = None
                dst.sendall(b)
        except OSError:
            pass
        for x in (src, dst):
            try:
                x.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def history(srv):
    """The server's last requests, oldest first (the dashboard's history,
    24 at most: the three agents' sessions make about a dozen)."""
    st, j = srv.get("/v1/cache/events")
    return sorted(j["history"]["requests"], key=lambda r: r["seq"]) if st == 200 else []


def statuses(srv):
    st, data = srv.get("/metrics")
    out = {}
    for line in data.decode().splitlines():
        if line.startswith("kvpin_requests_total{"):
            k, v = line.rsplit(" ", 1)
            out[k.split('"')[1]] = int(float(v))
    return out


def run(what, cmd, env, cwd, secs=300):
    p = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=secs)
    ok(p.returncode == 0, "%s: exit %d\n%s" % (what, p.returncode, (p.stdout + p.stderr)[-2000:]))
    return p


def check_sessions(srv, agent, first, cont, new, seen):
    """first, cont, new: how many requests each run made (from the history)."""
    h = history(srv)[seen:]
    if not ok(len(h) >= first + cont + new and first and cont and new,
              "%s: requests per run %d, %d, %d; history %d" % (agent, first, cont, new, len(h))):
        return
    prev = h[first - 1]  # the first session's last request
    c = h[first]  # the continued session's first request
    ok(c["reused_tokens"] >= prev["prompt_tokens"] - 1,
       "%s --continue reuses the whole previous prompt: %d of %d" % (agent, c["reused_tokens"], prev["prompt_tokens"]))
    n = max(h[first + cont:first + cont + new], key=lambda r: r["prompt_tokens"])  # its main prompt (not a title's)
    snip = n["cache"].get("request_snippet", "") + n["cache"].get("detail", "")
    ok("new session" in snip and n["reused_tokens"] > 0.5 * prev["prompt_tokens"],
       "%s: a new session misses first at its user's text (reused %d of %d): %r" % (
           agent, n["reused_tokens"], n["prompt_tokens"], snip[:200]))


def counted(srv, before):
    return len(history(srv)) - before


def claude(srv, relay, tmp):
    home, work = os.path.join(tmp, "claude-home"), os.path.join(tmp, "work")
    os.makedirs(home)
    os.makedirs(work, exist_ok=True)
    env = dict(os.environ, HOME=home, ANTHROPIC_BASE_URL="http://127.0.0.1:%d" % relay.port,
               ANTHROPIC_API_KEY="sk-kvpin-test", DISABLE_TELEMETRY="1", DISABLE_AUTOUPDATER="1",
               CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1")
    exe = os.path.join(BIN, "claude")
    seen = len(history(srv))
    run("claude -p", [exe, "-p", "say hi"], env, work)
    a = counted(srv, seen)
    run("claude -p --continue", [exe, "-p", "--continue", "and again"], env, work)
    b = counted(srv, seen) - a
    run("claude -p (a new session)", [exe, "-p", "a new session"], env, work)
    c = counted(srv, seen) - a - b
    check_sessions(srv, "claude", a, b, c, seen)
    # the billing header was left out of every prompt (kvpin's count of them)
    st, data = srv.get("/metrics")
    n = [float(l.split()[-1]) for l in data.decode().splitlines()
         if l.startswith("kvpin_volatile_blocks_dropped_total ")]
    ok(n == [a + b + c], "claude: its billing header left out of each of its %d prompts: %s" % (a + b + c, n))


def codex(srv, relay, tmp):
    home = os.path.join(tmp, "codex-home")
    os.makedirs(os.path.join(home, ".codex"))
    with open(os.path.join(home, ".codex", "config.toml"), "w") as f:
        f.write('model = "kvpin"\nmodel_provider = "kvpin"\n[model_providers.kvpin]\nname = "kvpin"\n'
                'base_url = "http://127.0.0.1:%d/v1"\nwire_api = "responses"\nenv_key = "KVPIN_AGENT_KEY"\n'
                '[analytics]\nenabled = false\n' % relay.port)
    work = os.path.join(tmp, "work")
    os.makedirs(work, exist_ok=True)
    env = dict(os.environ, HOME=home, CODEX_HOME=os.path.join(home, ".codex"), KVPIN_AGENT_KEY="x")
    exe = os.path.join(BIN, "codex")
    seen = len(history(srv))
    run("codex exec", [exe, "exec", "--skip-git-repo-check", "say hi"], env, work)
    a = counted(srv, seen)
    run("codex exec resume --last", [exe, "exec", "--skip-git-repo-check", "resume", "--last", "and again"], env, work)
    b = counted(srv, seen) - a
    run("codex exec (a new session)", [exe, "exec", "--skip-git-repo-check", "a new session"], env, work)
    c = counted(srv, seen) - a - b
    check_sessions(srv, "codex", a, b, c, seen)


def opencode(srv, relay, tmp):
    home = os.path.join(tmp, "opencode-home")
    os.makedirs(os.path.join(home, ".config", "opencode"))
    with open(os.path.join(home, ".config", "opencode", "opencode.json"), "w") as f:
        json.dump({"$schema": "https://opencode.ai/config.json", "autoupdate": False, "share": "disabled",
                   "provider": {"kvpin": {"npm": "@ai-sdk/openai-compatible", "name": "kvpin",
                                          "options": {"baseURL": "http://127.0.0.1:%d/v1" % relay.port, "apiKey": "x"},
                                          "models": {"test": {"name": "test"}}}},
                   "model": "kvpin/test"}, f)
    work = os.path.join(tmp, "opencode-work")
    os.makedirs(work)
    env = dict(os.environ, HOME=home, OPENCODE_DISABLE_AUTOUPDATE="1")
    # opencode's Linux x86-64 build itself: the opencode-ai wrapper names a package
    # per platform, and only this one is in the registry the tests install from
    exe = os.path.join(os.path.dirname(BIN), "opencode-linux-x64-baseline", "bin", "opencode")
    seen = len(history(srv))
    run("opencode run", [exe, "run", "say hi"], env, work)
    a = counted(srv, seen)
    run("opencode run --continue", [exe, "run", "--continue", "and again"], env, work)
    b = counted(srv, seen) - a
    run("opencode run (a new session)", [exe, "run", "a new session"], env, work)
    c = counted(srv, seen) - a - b
    check_sessions(srv, "opencode", a, b, c, seen)


def main():
    tmp = tempfile.mkdtemp(prefix="kvpin-agents-")
    model = os.path.join(tmp, "agent.gguf")
    p = subprocess.run([KVPIN, "mkmodel", "-o", model, "--preset", "qwen2-tiny", "--tokenizer",
                        "tests/data/vocab/gen-qwen2-vocab.gguf", "--embd", "64", "--heads", "2", "--kv-heads", "1",
                        "--head-dim", "32", "--ff", "128", "--layers", "2", "--ctx-train", "65536", "--type", "F16"],
                       capture_output=True, text=True)
    if not ok(p.returncode == 0, "mkmodel: %s" % p.stderr[-500:]):
        return R.finish()
    srv = Server(R, "--ctx", "65536", "--max-tokens-cap", "8", "-np", "2", model=model, threads=2)
    relay = Relay(srv.port)
    try:
        claude(srv, relay, tmp)
        codex(srv, relay, tmp)
        opencode(srv, relay, tmp)
        st = statuses(srv)
        ok(sum(v for k, v in st.items() if k != "200") == 0, "every answer a 200: %s" % st)
        with relay.mu:
            d = list(relay.delays)
        ok(d and max(d) < 1.0, "the first byte of every answer within 1 s of its request: %d answers, slowest "
           "%.3f s" % (len(d), max(d) if d else -1))
    finally:
        srv.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return R.finish()


if __name__ == "__main__":
    sys.exit(main())
