#!/usr/bin/env python3
"""gguf_edit.py - makes hostile copies of a GGUF model file for the tests.

Reads a GGUF v2/v3 file with the standard library only, changes metadata
arrays, and writes a copy whose tensor table and tensor data are byte for
byte the original's (the data section is re-aligned after the new metadata).

  gguf_edit.py IN OUT [--resize KEY N ...] [--set-str KEY VALUE ...]

--resize cuts the array KEY to its first N entries, or extends it to N
entries (strings "[EXTRA i]", numbers 0 for scores, 1 (normal) for token
types, or the last element repeated for other numeric arrays).
--set-str sets the string KEY to VALUE (UTF-8), added when absent (a chat
template for `kvpin template`, tests/e2e/jinja_e2e.py).
edit()'s `tokens` (Python only) replaces vocabulary entries: (id, text,
token type) sets tokenizer.ggml.tokens[id] and tokenizer.ggml.token_type[id]
(a vocabulary with a template's special tokens, tests/e2e/harmony_e2e.py).

Format (little-endian), as the GGUF specification gives it:
  u32 magic "GGUF" | u32 version | u64 n_tensors | u64 n_kv
  n_kv x (string key | u32 type | value)      string = u64 len + bytes
  n_tensors x (string name | u32 n_dims | u64 ne[n_dims] | u32 type | u64 offset)
  padding to general.alignment (default 32) | tensor data
"""
import struct
import sys

SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
T_STRING, T_ARRAY = 8, 9


class Reader:
    def __init__(self, data):
        self.d, self.o = data, 0

    def take(self, fmt):
        v = struct.unpack_from("<" + fmt, self.d, self.o)
        self.o += struct.calcsize("<" + fmt)
        return v[0]

    def string(self):
        n = self.take("Q")
        s = self.d[self.o:self.o + n]
        self.o += n
        return s

    def value(self, t):
        if t in SCALAR:
            return self.take(SCALAR[t])
        if t == T_STRING:
            return self.string()
        if t == T_ARRAY:
            et, n = self.take("I"), self.take("Q")
            return (et, [self.value(et) for _ in range(n)])
        raise ValueError("unknown GGUF value type %d" % t)


def put_string(out, s):
    out += struct.pack("<Q", len(s)) + s


def put_value(out, t, v):
    if t in SCALAR:
        out += struct.pack("<" + SCALAR[t], v)
    elif t == T_STRING:
        put_string(out, v)
    else:
        et, items = v
        out += struct.pack("<IQ", et, len(items))
        for x in items:
            put_value(out, et, x)


def edit(src, dst, resize, set_strs=(), tokens=()):
    data = open(src, "rb").read()
    r = Reader(data)
    if data[:4] != b"GGUF":
        raise SystemExit("%s: not a GGUF file" % src)
    r.o = 4
    version, n_tensors, n_kv = r.take("I"), r.take("Q"), r.take("Q")
    kvs = []
    for _ in range(n_kv):
        k = r.string()
        t = r.take("I")
        kvs.append([k, t, r.value(t)])
    tensors_start = r.o
    for _ in range(n_tensors):
        r.string()
        nd = r.take("I")
        r.o += 8 * nd + 4 + 8
    tensors_end = r.o
    align = 32
    for k, t, v in kvs:
        if k == b"general.alignment":
            align = v
    data_start = (tensors_end + align - 1) // align * align
    for key, n in resize:
        for kv in kvs:
            if kv[0] == key.encode():
                et, items = kv[2]
                if n <= len(items):
                    items = items[:n]
                else:
                    for i in range(len(items), n):
                        if et == T_STRING:
                            items.append(b"[EXTRA %d]" % i)
                        elif key.endswith("token_type"):
                            items.append(1)
                        elif key.endswith("scores"):
                            items.append(0.0)
                        else:
                            items.append(items[-1])
                kv[2] = (et, items)
                break
        else:
            raise SystemExit("%s: no array %s" % (src, key))
    for tid, text, ttype in tokens:
        for kv in kvs:
            if kv[0] == b"tokenizer.ggml.tokens":
                kv[2][1][tid] = text.encode()
            elif kv[0] == b"tokenizer.ggml.token_type":
                kv[2][1][tid] = ttype
    for key, value in set_strs:
        for kv in kvs:
            if kv[0] == key.encode():
                kv[1], kv[2] = T_STRING, value.encode()
                break
        else:
            kvs.append([key.encode(), T_STRING, value.encode()])
    out = bytearray(b"GGUF")
    out += struct.pack("<IQQ", version, n_tensors, len(kvs))
    for k, t, v in kvs:
        put_string(out, k)
        out += struct.pack("<I", t)
        put_value(out, t, v)
    out += data[tensors_start:tensors_end]
    out += b"\0" * ((align - len(out) % align) % align)
    out += data[data_start:]
    open(dst, "wb").write(out)


def main(argv):
    if len(argv) < 3 or ("--resize" not in argv and "--set-str" not in argv):
        print(__doc__, file=sys.stderr)
        return 2
    src, dst, rest = argv[0], argv[1], argv[2:]
    resize, set_strs = [], []
    while rest:
        if rest[0] not in ("--resize", "--set-str") or len(rest) < 3:
            print("gguf_edit.py: expected --resize KEY N or --set-str KEY VALUE", file=sys.stderr)
            return 2
        if rest[0] == "--resize":
            resize.append((rest[1], int(rest[2])))
        else:
            set_strs.append((rest[1], rest[2]))
        rest = rest[3:]
    edit(src, dst, resize, set_strs)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
