"""kvpin_test.py - what the Python end-to-end tests share: a real `kvpin
serve` on a free loopback port (Server), HTTP helpers, the pass/fail count,
and the leak check. Standard library only; $KVPIN names the binary.
"""
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import tempfile
import time

KVPIN = os.environ.get("KVPIN", "./kvpin")
MODEL = "models/stories260K.gguf"


def free_port():
    """A TCP port free on loopback now (for a helper server of a test's own)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


class Results:
    """Counts checks; `ok` prints a failure with the suite's name."""

    def __init__(self, suite):
        self.suite, self.passed, self.failed = suite, 0, 0

    def ok(self, cond, what):
        if cond:
            self.passed += 1
        else:
            self.failed += 1
            print("FAIL %s: %s" % (self.suite, what), flush=True)
        return cond

    def finish(self):
        print("%s: %d passed, %d failed" % (self.suite, self.passed, self.failed))
        return 0 if self.failed == 0 else 1


class Server:
    """`kvpin serve` on 127.0.0.1 and a free port, stderr in a log file.
    stop() sends SIGTERM and checks the exit status and that the log holds
    no sanitizer report."""

    def __init__(self, results, *args, model=MODEL, quiet=True, binary=None):
        self.r = results
        self.log = tempfile.NamedTemporaryFile(prefix="kvpin-serve-", suffix=".log", delete=False)
        cmd = [binary or KVPIN, "serve", "-m", model, "--port", "0", "-t", "1"] + (["--quiet"] if quiet else []) + list(args)
        self.p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=self.log)
        self.port = None
        deadline = time.time() + 30
        while time.time() < deadline and self.port is None:
            with open(self.log.name, "rb") as f:
                m = re.search(rb"listening on http://[^ ]*:(\d+)", f.read())
            if m:
                self.port = int(m.group(1))
            elif self.p.poll() is not None:
                break
            else:
                time.sleep(0.05)
        if self.port is None:
            raise RuntimeError("server did not start: " + open(self.log.name, errors="replace").read())

    def request(self, method, path, body=None, headers=None, timeout=60):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
        elif isinstance(body, str):
            body = body.encode()
        h = {"Content-Type": "application/json"}
        h.update(headers or {})
        c.request(method, path, body=body, headers=h)
        r = c.getresponse()
        data = r.read()
        c.close()
        return r.status, dict(r.getheaders()), data

    def post(self, path, body, **kw):
        st, h, data = self.request("POST", path, body, **kw)
        try:
            return st, h, json.loads(data)
        except ValueError:
            return st, h, data

    def get(self, path, **kw):
        st, h, data = self.request("GET", path, **kw)
        try:
            return st, json.loads(data)
        except ValueError:
            return st, data

    def log_text(self):
        return open(self.log.name, errors="replace").read()

    def stop(self):
        self.p.send_signal(signal.SIGTERM)
        try:
            rc = self.p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.p.kill()
            rc = -9
        log = self.log_text()
        self.r.ok(rc == 0, "server exit status %s after SIGTERM; log:\n%s" % (rc, log[-3000:]))
        self.r.ok("AddressSanitizer" not in log and "runtime error" not in log and "LeakSanitizer" not in log,
                  "sanitizer report in the server log:\n" + log[-3000:])
        os.unlink(self.log.name)


def tokenize(srv, text, add_special=True):
    st, _, j = srv.post("/tokenize", {"content": text, "add_special": add_special})
    assert st == 200, j
    return j["tokens"]


def wait_idle(srv, seconds=10):
    deadline = time.time() + seconds
    while time.time() < deadline:
        st, j = srv.get("/health")
        if st == 200 and j["running"] == 0 and j["queued"] == 0:
            return True
        time.sleep(0.05)
    return False


def no_leaks(r, srv, what):
    st, c = srv.get("/v1/cache")
    r.ok(st == 200, what + ": GET /v1/cache")
    r.ok(c["counts"]["running"] == 0 and c["counts"]["leases"] == 0, what + ": sequences still held: %s" % c["counts"])
    r.ok(c["kv"]["used_bytes"] == c["kv"]["index_bytes"],
         what + ": blocks in use %d != blocks the index holds %d" % (c["kv"]["used_bytes"], c["kv"]["index_bytes"]))
