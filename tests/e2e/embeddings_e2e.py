#!/usr/bin/env python3
"""End-to-end tests of POST /v1/embeddings (src/serve/embed.c).

Oracle: llama.cpp's embeddings of the same texts on the same model files
(tests/data/golden/embeddings.json, made by tools/llamacpp_embed.c against
libllama: mean and last pooling, L2-normalized), for the bundled model, a
qwen3 file in F16 and a GQA llama in Q8_0: kvpin's must agree within 2e-3
per component (1e-5 for the F32 bundled model, 1e-3 and 2.5e-3 for the F16 and Q8_0
files, whose activations kvpin rounds as it does for logits).
Also: the OpenAI API's shape (object list, data[i].index, usage), token-id
inputs give what their text gives, base64 encodes the same floats, one text
or a list, --pooling last as the default pooling, and clear 400s naming
the field for a bad input, an unknown model, a wrong dimensions or pooling.
"""
import base64
import json
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kvpin_test import Results, Server, kill_all  # noqa: E402

R = Results("e2e_embeddings")
REF = json.load(open("tests/data/golden/embeddings.json"))
TOL = {"stories260K.gguf": 1e-5, "gen-qwen3-f16.gguf": 1e-3, "gen-llama-gqa-q8_0.gguf": 2.5e-3}  # measured 4e-7, 6e-5, 1.2e-3


def maxdiff(a, b):
    return max(abs(x - y) for x, y in zip(a, b)) if len(a) == len(b) else float("inf")


def main():
    try:
        for m in REF["models"]:
            name = os.path.basename(m["model"])
            srv = Server(R, model=m["model"])
            try:
                for pooling, cases in m["pooling"].items():
                    texts = [c["text"] for c in cases]
                    st, _, j = srv.post("/v1/embeddings", {"input": texts, "pooling": pooling, "model":
                                                           srv.get("/v1/models")[1]["data"][0]["id"]})
                    if not R.ok(st == 200, "%s %s: %s %s" % (name, pooling, st, j)):
                        continue
                    got = [d["embedding"] for d in sorted(j["data"], key=lambda d: d["index"])]
                    diffs = [maxdiff(g, c["embedding"]) for g, c in zip(got, cases)]
                    R.ok(len(got) == len(cases) and max(diffs) <= TOL[name],
                         "%s %s pooling: max |kvpin - llama.cpp| %s (tolerance %g)" % (name, pooling, diffs, TOL[name]))
                    R.ok(j["object"] == "list" and all(d["object"] == "embedding" for d in j["data"]) and
                         j["usage"]["prompt_tokens"] == sum(len(c["tokens"]) for c in cases),
                         "%s: shape and usage %s" % (name, j["usage"]))
                    # token ids give what their text gives
                    st, _, t = srv.post("/v1/embeddings", {"input": [c["tokens"] for c in cases], "pooling": pooling})
                    R.ok(st == 200 and all(maxdiff(a["embedding"], b) < 1e-6 for a, b in zip(t["data"], got)),
                         "%s: token ids as their text" % name)
            finally:
                srv.stop()
        # the bundled model: base64, one text, --pooling last, errors
        srv = Server(R, "--pooling", "last")
        try:
            bundled = REF["models"][0]["pooling"]
            st, _, j = srv.post("/v1/embeddings", {"input": "Once upon a time", "encoding_format": "base64"})
            vec = list(struct.unpack("<%df" % (len(base64.b64decode(j["data"][0]["embedding"])) // 4),
                                     base64.b64decode(j["data"][0]["embedding"]))) if st == 200 else []
            R.ok(st == 200 and len(j["data"]) == 1 and maxdiff(vec, bundled["last"][0]["embedding"]) < 1e-5,
                 "base64, one text, --pooling last: %s" % st)
            bad = [({"input": []}, "input"), ({"input": 5}, "input"), ({"input": [[1, 99999]]}, "input"),
                   ({"input": "x", "model": "other"}, "model"), ({"input": "x", "dimensions": 3}, "dimensions"),
                   ({"input": "x", "pooling": "cls"}, "pooling"), ({"input": "x", "encoding_format": "hex"},
                                                                   "encoding_format")]
            for body, field in bad:
                st, _, j = srv.post("/v1/embeddings", body)
                R.ok(st == 400 and j.get("error", {}).get("param") == field, "%s: %s %s" % (body, st, j))
            st, _, j = srv.post("/embeddings", {"input": "A"})
            R.ok(st == 200 and len(j["data"][0]["embedding"]) == 64, "/embeddings: %s" % st)
        finally:
            srv.stop()
    finally:
        kill_all()
    return R.finish()


if __name__ == "__main__":
    sys.exit(main())
