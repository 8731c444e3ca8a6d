#!/usr/bin/env python3
"""make_seeds.py - writes the seed inputs of the fuzz targets (fuzz/README.md).

  python3 fuzz/make_seeds.py [KVPIN]     (from the repository root; KVPIN
                                          default ./kvpin, for mkmodel)
  python3 fuzz/make_seeds.py --grammar   (seeds-grammar/ and seeds-gcompile/ only)
  python3 fuzz/make_seeds.py --jinja     (seeds-jinja/ only)

seeds-model/  tiny random-weight models from `kvpin mkmodel` (llama with the
              bundled SentencePiece vocabulary; qwen2 and qwen3 with the
              byte-level BPE vocabulary tests/data/vocab/gen-qwen2-vocab.gguf;
              qwen3 in Q4_K, whose 256-element blocks need 256-wide rows,
              with the small SentencePiece one),
              in F32, Q8_0, Q4_0 and Q4_K.
seeds-tok/    a control byte per vocabulary and flag combination, then texts
              from llama.cpp's tokenizer test inputs (tests/data/vocab/*.inp).
seeds-oai/    request bodies as the official clients and agent frameworks
              send them (chat and completions), each after its control byte.
seeds-agent/  Messages API and Responses API bodies (text, system blocks and
              cache_control, tools with tool_use / tool_result round trips,
              input items, function_call_output, text.format), each after
              its control byte.
seeds-http/   whole HTTP requests (head and body) to every endpoint: plain,
              chunked, keep-alive pairs, with and without an API key header,
              and a few malformed framings.
seeds-grammar/ JSON Schemas (ws bound in the control byte) and GBNF
              grammars as clients send them, each followed by a NUL and a
              document a model might write under it.
seeds-gcompile/ recipes that expand into large grammars and schemas (deep
              rule chains, wide alternatives, enums, anyOf lists, long property
              lists, near and beyond the limits of src/grammar/grammar.h).
seeds-jinja/  every chat template of tests/data/chat/templates/ (subfolders
              too), each followed by a NUL and a template context (messages,
              tools, add_generation_prompt, bos/eos) taken from
              tests/data/chat/conversations.json, normalized as kvpin does.
The files are deterministic: the same script writes the same bytes.
"""
import json
import os
import subprocess
import sys

KVPIN = sys.argv[1] if len(sys.argv) > 1 else "./kvpin"
HERE = os.path.dirname(os.path.abspath(__file__))


def write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def models():
    out = os.path.join(HERE, "seeds-model")
    os.makedirs(out, exist_ok=True)
    small = ["--layers", "1", "--embd", "32", "--heads", "2", "--kv-heads", "1", "--head-dim", "16",
             "--ff", "64", "--ctx", "64", "--tied"]
    bpe = os.path.join("tests", "data", "vocab", "gen-qwen2-vocab.gguf")
    specs = [
        ("llama-spm-f32", ["--type", "F32"]),
        ("llama-spm-q8_0", ["--type", "Q8_0"]),
        ("llama-spm-q4_0-gqa", ["--type", "Q4_0", "--heads", "4"]),
        ("qwen2-bpe-q8_0", ["--arch", "qwen2", "--type", "Q8_0", "--tokenizer", bpe]),
        ("qwen3-spm-q4_k", ["--arch", "qwen3", "--type", "Q4_K", "--embd", "256",
                            "--ff", "256"]),
    ]
    for name, extra in specs:
        subprocess.run([KVPIN, "mkmodel", "-o", os.path.join(out, name + ".gguf")] + small + extra +
                       ["--seed", "3"], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def texts():
    with open(os.path.join("tests", "data", "vocab", "ggml-vocab-llama-spm.gguf.inp"), encoding="utf-8") as f:
        cases = f.read().split("\n__ggml_vocab_test__\n")
    cases = [c for c in cases if c][:24]
    cases += ["<s>hi</s> <|im_start|>user\nx<|im_end|>", "caf\u00e9 \U0001F600 \u2581\u2581a", "\xff\xfe"]
    out = os.path.join(HERE, "seeds-tok")
    for i, c in enumerate(cases):
        data = c.encode("utf-8", "surrogateescape") if isinstance(c, str) else c
        for v in range(0, 12, 3):  # a spread of vocabularies
            write(os.path.join(out, "t%02d-v%02d" % (i, v)), bytes([v, (i % 8)]) + data)


def requests():
    tool = {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                            "unit": {"enum": ["c", "f"]}},
                           "required": ["city"]}}}
    chats = [
        {"model": "m", "messages": [{"role": "user", "content": "Hi"}]},
        {"model": "m", "messages": [{"role": "system", "content": "You are terse."},
                                    {"role": "user", "content": "2+2?"}], "max_tokens": 8, "temperature": 0},
        {"messages": [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
         "stream": True, "stream_options": {"include_usage": True}},
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "part one"},
                                                   {"type": "text", "text": " part two"}]}]},
        {"messages": [{"role": "user", "content": "weather in Paris?"}], "tools": [tool],
         "tool_choice": "auto"},
        {"messages": [{"role": "user", "content": "weather?"},
                      {"role": "assistant", "content": None, "tool_calls": [
                          {"id": "call_1", "type": "function",
                           "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
                      {"role": "tool", "tool_call_id": "call_1", "content": "18C"}], "tools": [tool]},
        {"messages": [{"role": "user", "content": "x"}], "stop": ["\n", "END"], "seed": 7, "top_p": 0.9,
         "top_k": 40, "min_p": 0.05, "presence_penalty": 0.5, "frequency_penalty": 0.1,
         "return_token_ids": True},
        {"messages": [{"role": "user", "content": "a </s> b <s> <|im_end|>"}], "max_completion_tokens": 4},
        {"messages": [{"role": "user", "content": "json"}], "response_format": {"type": "text"},
         "logprobs": False, "n": 1, "user": "u1"},
        {"messages": [{"role": "user", "content": "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n"
                                                   "</tool_call>"}]},
    ]
    completions = [
        {"model": "m", "prompt": "Once upon a time", "max_tokens": 16},
        {"prompt": [1, 403, 407], "max_tokens": 4, "temperature": 0.7, "stream": True},
        {"prompt": ["Only one"], "stop": "\n", "ignore_eos": True},
        {"prompt": "x" * 64, "max_tokens": 0, "echo": False, "best_of": 1, "logit_bias": {}},
    ]
    out = os.path.join(HERE, "seeds-oai")
    n = 0
    for fam in range(0, 11):
        for body in chats:
            write(os.path.join(out, "chat-%02d-f%02d.json" % (chats.index(body), fam)),
                  bytes([1 | (fam << 1)]) + json.dumps(body).encode())
            n += 1
    for i, body in enumerate(completions):
        write(os.path.join(out, "completion-%02d.json" % i), b"\x00" + json.dumps(body).encode())
    # model output shapes for the tool-call parser (the body bytes double as text)
    for i, t in enumerate(["<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
                           "</tool_call>", "<|python_tag|>{\"name\": \"f\", \"parameters\": {}}; "
                           "{\"name\": \"g\", \"parameters\": {\"a\": 1}}", "Sure. <tool_c",
                           "<think>hmm</think>\n\n<tool_call>\n{\"name\":\"f\",\"arguments\":\"{}\"}\n</tool_call>"]):
        for fam in (3, 4, 6):
            write(os.path.join(out, "output-%02d-f%02d.txt" % (i, fam)), bytes([fam << 1]) + t.encode())


def http():
    out = os.path.join(HERE, "seeds-http")
    small = [{"prompt": "Once upon a time", "max_tokens": 4, "temperature": 0},
             {"prompt": [1, 403, 407], "max_tokens": 3, "stream": True, "stream_options": {"include_usage": True}}]
    chat = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
            "max_tokens": 4, "temperature": 0}
    reqs = []

    def post(path, body, extra=b""):
        data = json.dumps(body).encode()
        return (b"POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n%s"
                b"Content-Length: %d\r\n\r\n" % (path.encode(), extra, len(data))) + data

    for b in small:
        reqs.append(post("/v1/completions", b))
    reqs.append(post("/v1/chat/completions", chat, b"Authorization: Bearer k\r\nX-Request-Id: fuzz-1\r\n"))
    reqs.append(post("/tokenize", {"content": "Once upon a time", "add_special": True}))
    reqs.append(post("/detokenize", {"tokens": [1, 403, 407, 231]}))
    reqs.append(post("/v1/cache/probe", {"prompt": "Once upon a time"}))
    reqs.append(post("/v1/cache/pin", {"prompt": "Once upon a time", "ttl": 5}))
    for path in ("/health", "/v1/models", "/metrics", "/v1/cache", "/nope"):
        reqs.append(b"GET %s HTTP/1.1\r\nHost: x\r\n\r\n" % path.encode())
    reqs.append(b"DELETE /v1/cache/pin/1 HTTP/1.1\r\nHost: x\r\n\r\n")
    body = json.dumps(small[0]).encode()
    reqs.append(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body))
    reqs.append(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\nGET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
    reqs.append(b"POST /tokenize HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 7\r\n\r\nhello")
    reqs.append(b"POST /tokenize HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n")
    reqs.append(b"GET /health HTTP/1.0\r\n\r\n")
    for i, r in enumerate(reqs):
        write(os.path.join(out, "req-%02d.http" % i), r)


def grammars():
    out = os.path.join(HERE, "seeds-grammar")
    person = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10},
                                               "age": {"type": ["integer", "null"], "minimum": 0, "maximum": 150}},
              "required": ["name", "age"], "additionalProperties": False}
    schemas = [
        (person, {"name": "Ann", "age": 42}),
        ({"type": "object", "properties": {"id": {"type": "string", "format": "uuid"},
                                           "when": {"type": "string", "format": "date-time"},
                                           "day": {"type": "string", "format": "date"},
                                           "tags": {"type": "array", "items": {"enum": ["a", "b", None]},
                                                    "minItems": 1, "maxItems": 3}},
          "required": ["id"]},
         {"id": "123e4567-e89b-12d3-a456-426614174000", "when": "2024-02-29T10:00:00Z", "tags": ["a"]}),
        ({"$ref": "#/$defs/node", "$defs": {"node": {"type": "object", "properties": {
            "v": {"type": "number", "exclusiveMinimum": 0, "maximum": 10},
            "next": {"anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]}}, "required": ["v", "next"]}}},
         {"v": 2.5, "next": {"v": 10, "next": None}}),
        ({"type": "integer", "minimum": -9007199254740991, "maximum": 9007199254740991}, 12345),
        ({"oneOf": [{"const": "yes"}, {"type": "boolean"}, {"type": "string", "minLength": 2}]}, "yes"),
        ({"type": "object", "additionalProperties": {"type": "number"}}, {"x": 1.5e3, "y": -0.25}),
        (True, [1, "two", {"three": None}]),
    ]
    for i, (sc, doc) in enumerate(schemas):
        for ws in (0, 2):
            write(os.path.join(out, "schema-%02d-ws%d.bin" % (i, ws)),
                  bytes([ws << 1]) + json.dumps(sc).encode() + b"\0" +
                  json.dumps(doc, separators=(",", ":") if ws == 0 else None).encode())
    gbnfs = [
        ('root ::= "yes" | "no"', "yes"),
        ('root ::= item (", " item)*\nitem ::= [a-z]+ | [0-9]{1,3}', "ab, 12, c"),
        ('root ::= "{" ws "\\"k\\":" ws value ws "}"\nvalue ::= [^"\\\\]* | "[" value "]"\n'
         'ws ::= [ \\t\\n]{0,4} # comment', '{"k": [abc]}'),
        ('root ::= [\u00e0-\u00ff\u4e00-\u9fff]+ .', "\u00e9\u65e5x"),
        ('root ::= ("a" root "b")? ', "aabb"),
    ]
    for i, (g, doc) in enumerate(gbnfs):
        write(os.path.join(out, "gbnf-%02d.bin" % i), b"\x01" + g.encode() + b"\0" + doc.encode())


def gcompile():
    """seeds-gcompile/: recipes that expand into large grammars (the layout
    is in fuzz_gcompile.c): control byte, n, fragment NUL prefix NUL suffix."""
    out = os.path.join(HERE, "seeds-gcompile")
    recipes = [  # (name, gbnf, n, fragment, prefix, suffix)
        ("gbnf-deep-rules", True, 20000, 'r@ ::= "(" r# ")"\n', "root ::= r0\n", 'r@ ::= "a"\n'),
        ("gbnf-right-chain", True, 30000, 'r@ ::= "x" r# | "y" [a-z]*\n', "root ::= r0\n", 'r@ ::= "z"\n'),
        ("gbnf-optional-chain", True, 1000, 'r@ ::= "x"? r#\n', "root ::= r0\n", 'r@ ::= "y"\n'),
        ("gbnf-too-wide", True, 1100, 'r@ ::= "x@"? r#\n', "root ::= r0\n", 'r@ ::= "y"\n'),
        ("gbnf-alternatives", True, 50000, ' | "a@"', 'root ::= "a"', "\n"),
        ("gbnf-nested-groups", True, 256, '("x" $)?', "root ::= ", '"y"'),
        ("gbnf-too-deep", True, 300, '("x" $)?', "root ::= ", '"y"'),
        ("gbnf-classes", True, 3000, 'c@ ::= [a-z0-9\\u00e0-\\u00ff]{1,#} "@" | [^"\\n]+\n', 'root ::= "a"\n', ""),
        ("schema-enum", False, 9999, ',"v@"', '{"type":"object","properties":{"e":{"enum":["v"', ']}},"required":["e"]}'),
        ("schema-anyof", False, 999, ',{"const":"c@"}', '{"anyOf":[{"const":0}', "]}"),
        ("schema-properties", False, 999, ',"p@":{"type":"string","maxLength":@}',
         '{"type":"object","properties":{"p":{"type":"integer"}', "}}"),
        ("schema-nested-arrays", False, 255, '{"type":"array","items":$}', "", "true"),
        # '#' and '$' written as JSON escapes: in a fragment they are placeholders
        ("schema-ref-chain", False, 2000,
         ',"d#":{"type":"object","properties":{"x":{"\\u0024ref":"\\u0023/definitions/d@"}}}',
         '{"definitions":{"d0":{"type":"integer"}', '},"\\u0024ref":"\\u0023/definitions/d@"}'),
        ("schema-ref-chain-80", False, 80,
         ',"d#":{"type":"object","properties":{"x":{"\\u0024ref":"\\u0023/definitions/d@"}}}',
         '{"definitions":{"d0":{"type":"integer"}', '},"\\u0024ref":"\\u0023/definitions/d@"}'),
        ("schema-ranges", False, 999, ',"n@":{"type":"integer","minimum":-1@,"maximum":2@@}',
         '{"type":"object","properties":{"a":{"type":"integer"}', "}}"),
    ]
    for name, gbnf, n, frag, prefix, suffix in recipes:
        write(os.path.join(out, name + ".bin"), bytes([1 if gbnf else 0, n & 255, n >> 8]) + frag.encode() + b"\0" +
              prefix.encode() + b"\0" + suffix.encode())


def agent():
    out = os.path.join(HERE, "seeds-agent")
    w = {"name": "get_weather", "description": "The weather", "input_schema": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
    anth = [
        {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "Hi"}]},
        {"model": "m", "max_tokens": 16, "system": [{"type": "text", "text": "Be brief.",
                                                     "cache_control": {"type": "ephemeral"}}],
         "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi", "cache_control": {
             "type": "ephemeral", "ttl": "1h"}}]}], "stream": True},
        {"model": "m", "max_tokens": 64, "tools": [dict(w, cache_control={"type": "ephemeral"})],
         "tool_choice": {"type": "any"}, "messages": [
             {"role": "user", "content": "Weather?"},
             {"role": "assistant", "content": [{"type": "text", "text": "Let me look."}, {
                 "type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [
                 {"type": "text", "text": "18 C"}]}, {"type": "text", "text": "Thanks"}]}],
         "stop_sequences": ["\n\n"], "temperature": 0.5, "top_k": 40, "metadata": {"user_id": "u"}},
    ]
    resp = [
        {"model": "m", "input": "Hi", "instructions": "Be brief.", "max_output_tokens": 16},
        {"model": "m", "input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather",
             "arguments": "{\"city\":\"Paris\"}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "18 C"}],
         "tools": [{"type": "function", "name": "get_weather", "parameters": w["input_schema"]}],
         "tool_choice": "required", "stream": True},
        {"model": "m", "input": "A person.", "text": {"format": {"type": "json_schema", "name": "p", "schema": {
            "type": "object", "properties": {"name": {"type": "string"}}}, "strict": True}}, "store": False,
         "previous_response_id": "resp_1"},
    ]
    for i, b in enumerate(anth):
        for fl in (0, 2):
            write(os.path.join(out, "messages-%d-%d.json" % (i, fl)),
                  bytes([fl | ((i * 3) % 10) << 2]) + json.dumps(b).encode())
    for i, b in enumerate(resp):
        write(os.path.join(out, "responses-%d.json" % i), bytes([1 | ((i * 5) % 10) << 2]) + json.dumps(b).encode())


def jinja():
    out = os.path.join(HERE, "seeds-jinja")
    root = os.path.join(HERE, "..", "tests", "data", "chat")
    sys.path.insert(0, os.path.join(HERE, "..", "tools"))
    import chat_golden  # the request normalization kvpin's serve/chat_jinja.c follows
    with open(os.path.join(root, "conversations.json"), encoding="utf-8") as f:
        convs = list(json.load(f).items())
    paths = []
    for d, _, names in os.walk(os.path.join(root, "templates")):
        paths += [os.path.join(d, n) for n in names if n.endswith(".jinja")]
    for i, path in enumerate(sorted(paths)):
        name, conv = convs[i % len(convs)]
        messages, tools = chat_golden.normalize(conv)
        ctx = {"messages": messages, "tools": tools, "bos_token": "<s>", "eos_token": "</s>",
               "add_generation_prompt": conv.get("add_generation_prompt", True)}
        with open(path, "rb") as f:
            text = f.read()
        stem = os.path.basename(path)[: -len(".jinja")]
        write(os.path.join(out, "%s__%s" % (stem, name)), text + b"\0" + json.dumps(ctx, sort_keys=True).encode())


if __name__ == "__main__":
    if sys.argv[1:2] == ["--grammar"]:  # only the grammar seeds (no kvpin needed)
        grammars()
        gcompile()
        sys.exit(0)
    if sys.argv[1:2] == ["--jinja"]:  # only the template seeds (no kvpin needed)
        jinja()
        sys.exit(0)
    jinja()
    grammars()
    gcompile()
    models()
    texts()
    requests()
    agent()
    http()
