#!/usr/bin/env python3
"""Hostile tests of `kvpin serve` (run by tests/e2e_hostile.sh): requests
that once got a wrong answer. Expected values come from the standards and
the API conventions, not from the server:
  - /detokenize of bytes that are not complete UTF-8: one U+FFFD per
    maximal invalid subpart (Unicode 15, 3.9 "U+FFFD Substitution of
    Maximal Subparts"), the rest of the text kept;
  - tools nested deeper than the limit: a 400 invalid_request_error naming
    `tools`, not `context_length_exceeded` (the prompt is not too long).
"""
import json
import sys

from kvpin_test import Results, Server

R = Results("hostile_server")


def byte_ids(data):
    """Token ids of raw bytes in the bundled SentencePiece vocabulary:
    <0x00>..<0xFF> are ids 3..258."""
    return [3 + b for b in data]


def detokenize(srv):
    cases = [
        (b"\xe4", "\ufffd"),                                 # lead byte alone
        (b"\xe4\xb8\xad", "\u4e2d"),                          # a whole character
        (b"\xe4\xb8", "\ufffd"),                              # truncated: one maximal subpart
        (b"\xe4A", "\ufffdA"),                                # broken by an ASCII byte
        (b"A\xff\xfeB", "A\ufffd\ufffdB"),                    # bytes never valid
        (b"\xed\xa0\x80", "\ufffd\ufffd\ufffd"),              # a surrogate: each byte its own subpart
        (b"\xf0\x9f\x98\x80\xf0\x9f", "\U0001F600\ufffd"),    # a complete emoji then a cut one
    ]
    for raw, want in cases:
        st, _, j = srv.post("/detokenize", {"tokens": byte_ids(raw)})
        R.ok(st == 200 and j.get("content") == want,
             "/detokenize %r: %s %r, want %r" % (raw, st, j, want))


def deep_tools(srv):
    deep = '{"type":"object"}'
    for _ in range(600):
        deep = '{"type":"object","properties":{"x":%s}}' % deep
    body = ('{"messages":[{"role":"user","content":"hi"}],'
            '"tools":[{"type":"function","function":{"name":"f","parameters":%s}}]}' % deep)
    st, _, j = srv.post("/v1/chat/completions", body)
    err = j.get("error", {}) if isinstance(j, dict) else {}
    R.ok(st == 400 and err.get("type") == "invalid_request_error" and err.get("code") != "context_length_exceeded"
         and err.get("param") == "tools",
         "tools nested 600 deep: %s %s" % (st, err))
    st, j = srv.get("/health")
    R.ok(st == 200, "healthy after the deep tools")


def main():
    srv = Server(R, "--chat-template", "qwen2.5")
    try:
        detokenize(srv)
        deep_tools(srv)
    finally:
        srv.stop()
    return R.finish()


if __name__ == "__main__":
    sys.exit(main())
