"""kvpin_test.py - what the Python end-to-end tests (tests/e2e/*_e2e.py) and
the server benchmarks (bench/*.py) share: a real `kvpin serve` on a free
port (Server), HTTP helpers, the pass/fail count (Results), the leak check.
Standard library only; $KVPIN names the binary, relative paths are the
repository root's (the tests run from there).

    from kvpin_test import Results, Server, no_leaks
    r = Results("e2e_thing")
    srv = Server(r, "--ctx", "256")          # listening once this returns
    st, headers, body = srv.post("/v1/completions", {"prompt": "Once"})
    no_leaks(r, srv, "after the completion")
    srv.stop()                               # SIGTERM; checks exit 0, no sanitizer report
    sys.exit(r.finish())

A benchmark passes None for the results: stop() then checks nothing.
Outside this folder: sys.path.insert(0, "<repository>/tests/e2e").
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
# kvpin serve's line on stderr once it accepts connections (cli/serve.c)
LISTENING = rb"listening on (http://(\[[0-9a-f:.%]+\]|[0-9.]+):(\d+)) "


def free_port():
    """A TCP port free on loopback now (for a helper server of a test's own)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def server_env(env=None):
    """The environment of a server: ours without KVPIN_API_KEY (a server's
    key is what its arguments or env say), plus env."""
    e = dict(os.environ)
    e.pop("KVPIN_API_KEY", None)
    e.update(env or {})
    return e


def launch(cmd, pattern, seconds=30, env=None, stdout_too=False, prefix="kvpin-serve-"):
    """Starts cmd with its stderr (and its stdout when stdout_too) in a log
    file and waits up to `seconds` for the bytes regex `pattern` in the log.
    Returns (process, log file name, match); raises RuntimeError with the
    log when the process ends first or the time runs out (it is killed)."""
    log = tempfile.NamedTemporaryFile(prefix=prefix, suffix=".log", delete=False)
    p = subprocess.Popen(cmd, stdout=log if stdout_too else subprocess.DEVNULL, stderr=log,
                         env=server_env(env))
    deadline = time.time() + seconds
    while time.time() < deadline:
        with open(log.name, "rb") as f:
            m = re.search(pattern, f.read())
        if m:
            return p, log.name, m
        if p.poll() is not None:
            break
        time.sleep(0.05)
    p.kill()
    p.wait()
    raise RuntimeError("%s did not start: %s" % (cmd[0], open(log.name, errors="replace").read()))


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
    """`kvpin serve` (binary, default $KVPIN) on model with -t threads,
    --port 0, --quiet unless quiet is False, then args; 127.0.0.1 unless
    args say --host. Its environment is server_env(env); stderr goes to a
    log file. Once started: url (as the server printed it), host (where to
    connect: loopback for "every address"), port, p (the process).
    stop() sends SIGTERM and, with results, checks the exit status and that
    the log holds no sanitizer report; kill() sends SIGKILL. Every server
    not stopped or killed yet is in Server.running (kill_all())."""

    running = []

    def __init__(self, results, *args, model=MODEL, quiet=True, binary=None, env=None, threads=1,
                 start_seconds=30):
        self.r = results
        cmd = [binary or KVPIN, "serve", "-m", model, "--port", "0", "-t", str(threads)] + \
              (["--quiet"] if quiet else []) + list(args)
        self.p, self.log_name, m = launch(cmd, LISTENING, start_seconds, env)
        self.url = m.group(1).decode()
        self.port = int(m.group(3))
        self.host = m.group(2).decode().strip("[]")
        self.host = {"::": "::1", "0.0.0.0": "127.0.0.1"}.get(self.host, self.host)
        Server.running.append(self)

    def request(self, method, path, body=None, headers=None, timeout=60, host=None):
        """(status, headers, body bytes); a dict or list body is sent as JSON."""
        c = http.client.HTTPConnection(host or self.host, self.port, timeout=timeout)
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
        """(status, headers, JSON body, or the bytes when it is not JSON)."""
        st, h, data = self.request("POST", path, body, **kw)
        try:
            return st, h, json.loads(data)
        except ValueError:
            return st, h, data

    def get(self, path, **kw):
        """(status, JSON body, or the bytes when it is not JSON)."""
        st, h, data = self.request("GET", path, **kw)
        try:
            return st, json.loads(data)
        except ValueError:
            return st, data

    def log_text(self):
        return open(self.log_name, errors="replace").read()

    def stop(self):
        self.p.send_signal(signal.SIGTERM)
        try:
            rc = self.p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.p.kill()
            rc = -9
        log = self.log_text()
        if self.r is not None:
            self.r.ok(rc == 0, "server exit status %s after SIGTERM; log:\n%s" % (rc, log[-3000:]))
            self.r.ok("AddressSanitizer" not in log and "runtime error" not in log and "LeakSanitizer" not in log,
                      "sanitizer report in the server log:\n" + log[-3000:])
        os.unlink(self.log_name)
        Server.running.remove(self)

    def kill(self):
        """SIGKILL, as a crash would end it; checks nothing."""
        self.p.kill()
        self.p.wait(timeout=30)
        os.unlink(self.log_name)
        Server.running.remove(self)


def kill_all():
    """SIGKILL to every server not stopped (a test's finally)."""
    for s in list(Server.running):
        s.p.kill()


def tokenize(srv, text, add_special=True):
    st, _, j = srv.post("/tokenize", {"content": text, "add_special": add_special})
    assert st == 200, j
    return j["tokens"]


def metrics(srv):
    """GET /metrics as {"name{labels}": value}."""
    st, _, data = srv.request("GET", "/metrics")
    out = {}
    for line in data.decode().splitlines():
        if line and not line.startswith("#"):
            k, v = line.rsplit(" ", 1)
            out[k] = float(v)
    return out


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


def sse(srv, path, body):
    """The data events of a stream, as JSON (the [DONE] left out), and the headers."""
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=120)
    b = json.dumps(body).encode()
    s.sendall(b"POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
              b"Connection: close\r\n\r\n" % (path.encode(), len(b)) + b)
    data = b""
    while True:
        got = s.recv(65536)
        if not got:
            break
        data += got
    s.close()
    head, _, body = data.partition(b"\r\n\r\n")
    headers = {}
    for line in head.split(b"\r\n")[1:]:
        k, _, v = line.partition(b":")
        headers[k.decode().strip().lower()] = v.decode().strip()
    if headers.get("transfer-encoding") == "chunked":  # undo the chunking
        out, rest = b"", body
        while rest:
            n, _, rest = rest.partition(b"\r\n")
            n = int(n, 16)
            if n == 0:
                break
            out, rest = out + rest[:n], rest[n + 2:]
        body = out
    events = [json.loads(l[6:]) for l in body.decode().split("\n") if l.startswith("data: {")]
    return headers, events
