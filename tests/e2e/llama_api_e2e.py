#!/usr/bin/env python3
"""End-to-end tests of llama-server's native API in `kvpin serve`
(src/serve/llama.c): POST /completion, GET /props, GET /slots.

Oracles: llama-server itself, recorded (tests/data/golden/
llama_server_shapes.json: the member names of its answers and its greedy
completion of "Once upon a time" on the bundled model, llama.cpp de3ff815):
kvpin's answers must carry every member llama-server's carry, and the same
greedy text; and invariants of kvpin's own other API: the streamed pieces
concatenate to the whole answer, the tokens are /v1/completions' token ids
for the same request, n_predict bounds the tokens (stop_type "limit"), a
stop string ends the text (stop_type "word"), n_probs gives per-token
probabilities, a repeated prompt is counted as cached, and the fields
kvpin does not act on are accepted and named in x-kvpin-ignored-fields.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kvpin_test import Results, Server, kill_all, sse  # noqa: E402

R = Results("e2e_llama_api")
REF = json.load(open("tests/data/golden/llama_server_shapes.json"))
PROMPT = "Once upon a time"


def main():
    srv = Server(R, "--kv-type", "f32", "-np", "4")
    try:
        st, h, j = srv.post("/completion", {"prompt": PROMPT, "n_predict": 4, "temperature": 0})
        R.ok(st == 200 and set(REF["completion_keys"]) <= set(j), "completion members: %s %s" % (st, sorted(j)))
        R.ok(st == 200 and j["content"] == REF["completion_content"],
             "greedy completion as llama-server's: %r vs %r" % (j.get("content"), REF["completion_content"]))
        R.ok(st == 200 and set(REF["timings_keys"]) <= set(j["timings"]), "timings members: %s" % j.get("timings"))
        R.ok(st == 200 and j["stop"] is True and j["stop_type"] == "limit" and j["tokens_predicted"] == 4 and
             j["tokens_evaluated"] == 5 and j["prompt"] == PROMPT, "completion values: %s" % j)
        # the same request on /v1/completions gives the same tokens
        st, _, o = srv.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 8, "temperature": 0,
                                                "return_token_ids": True})
        st2, _, k = srv.post("/completion", {"prompt": PROMPT, "n_predict": 8, "temperature": 0,
                                             "return_tokens": True})
        R.ok(st == 200 and st2 == 200 and k["tokens"] == o["choices"][0]["token_ids"] and
             k["content"] == o["choices"][0]["text"], "tokens and text as /v1/completions': %s / %s" % (k, o))
        R.ok(st2 == 200 and k["tokens_cached"] >= 5 and k["timings"]["cache_n"] >= 4,
             "a repeated prompt is cached: %s" % k.get("timings"))
        # streamed: llama-server's events, pieces that add up
        _, evs = sse(srv, "/completion", {"prompt": PROMPT, "n_predict": 6, "temperature": 0, "stream": True})
        R.ok(len(evs) >= 2 and all(set(REF["stream_chunk_keys"]) <= set(e) for e in evs[:-1]) and
             set(REF["stream_final_keys"]) <= set(evs[-1]) and evs[-1]["stop"] is True and
             evs[-1]["content"] == REF["stream_final_content"], "stream events: %s" % evs[:2])
        text = "".join(e["content"] for e in evs)
        toks = [t for e in evs for t in e["tokens"]]
        st, _, w = srv.post("/completion", {"prompt": PROMPT, "n_predict": 6, "temperature": 0,
                                            "return_tokens": True})
        R.ok(text == w["content"] and toks == w["tokens"], "stream %r %s vs %r %s" % (text, toks, w["content"],
                                                                                      w["tokens"]))
        # a stop string
        st, _, j = srv.post("/completion", {"prompt": PROMPT, "n_predict": 30, "temperature": 0, "stop": [" girl"]})
        R.ok(st == 200 and j["stop_type"] == "word" and not j["content"].endswith(" girl") and
             " girl" not in j["content"], "stop string: %s" % j)
        # n_probs
        st, _, j = srv.post("/completion", {"prompt": PROMPT, "n_predict": 3, "temperature": 0, "n_probs": 2})
        R.ok(st == 200 and j.get("completion_probabilities"), "n_probs: %s" % j)
        # fields kvpin does not act on: accepted and named
        st, h, j = srv.post("/completion", {"prompt": PROMPT, "n_predict": 1, "id_slot": 2, "typical_p": 1.0,
                                            "samplers": ["top_k"], "cache_prompt": True})
        ign = {k.lower(): v for k, v in h.items()}.get("x-kvpin-ignored-fields", "")
        R.ok(st == 200 and "typical_p" in ign and "samplers" in ign, "ignored fields: %s %r" % (st, ign))
        st, _, j = srv.post("/completion", {"prompt": 12})
        R.ok(st == 400 and "prompt" in json.dumps(j), "a bad prompt is a 400: %s %s" % (st, j))
        # /props and /slots
        st, p = srv.get("/props")
        core = ["default_generation_settings", "total_slots", "model_path", "chat_template", "bos_token", "eos_token",
                "modalities", "build_info", "model_alias", "endpoint_slots", "endpoint_props", "is_sleeping"]
        R.ok(st == 200 and set(core) <= set(p) and set(core) <= set(REF["props_keys"]) and p["total_slots"] == 4 and
             set(REF["props_default_generation_settings_keys"]) <= set(p["default_generation_settings"]),
             "props: %s" % p)
        st, sl = srv.get("/slots")
        R.ok(st == 200 and len(sl) == 4 and all(set(REF["slot_keys"]) <= set(x) for x in sl), "slots: %s" % sl)
        srv.stop()
    finally:
        kill_all()
    return R.finish()


if __name__ == "__main__":
    sys.exit(main())
