/*
 * test_tok.c - the tokenizer against llama.cpp's reference vectors.
 *
 * References used (none of them produced by kvpin):
 *   - tests/data/vocab/ggml-vocab-*.gguf(.inp/.out): llama.cpp's tokenizer
 *     test vectors (46 strings each, add_special = false, parse_special =
 *     false), see tests/data/vocab/README.md;
 *   - stories260K.gguf.inp/.out and gen-qwen2-f32.gguf.inp/.out: the same
 *     46 strings tokenized by llama.cpp de3ff815ea7d with those models;
 *   - token lists of golden prompts (llama.cpp's llama_tokenize with the
 *     model's own add_special default), copied from the goldens' JSON;
 *   - hand-derived results on tiny in-memory vocabularies, where the SPM /
 *     BPE rules give the answer by inspection;
 *   - the UTF-8 standard (W3C replacement rule) for the streaming decoder.
 */
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "gguf/gguf.h"
#include "harness.h"
#include "tok/tok.h"
#include "tok/tok_impl.h" /* white-box: the SPM word-cut switch */

#define VOCAB_DIR "tests/data/vocab/"
#define SPM_SPACE "\xe2\x96\x81"

static const char *const upstream_vocabs[] = {
    "deepseek-coder", "deepseek-llm", "falcon", "gpt-2", "llama-spm",
    "mpt", "phi-3", "refact", "starcoder",
};

/* ---- helpers ---- */

static kp_tok_vocab *load_path(const char *rel) {
    kp_gguf *g = NULL;
    kp_error err = {0};
    const char *path = harness_path(rel);
    if (kp_gguf_open(&g, path, &err) != KP_OK) {
        fprintf(stderr, "cannot open %s: %s\n", path, err.msg);
        return NULL;
    }
    kp_tok_vocab *v = NULL;
    if (kp_tok_vocab_load(&v, g, &err) != KP_OK) fprintf(stderr, "cannot load %s: %s\n", path, err.msg);
    kp_gguf_close(g); /* the vocabulary must not borrow from the file */
    return v;
}

static kp_tok_vocab *load_vocab(const char *name) {
    char rel[256];
    snprintf(rel, sizeof rel, VOCAB_DIR "ggml-vocab-%s.gguf", name);
    return load_path(rel);
}

/* The bundled model: models/stories260K.gguf (or a copy in tests/data). */
static kp_tok_vocab *load_stories(void) {
    FILE *f = fopen(harness_path("models/stories260K.gguf"), "rb");
    if (f) {
        fclose(f);
        return load_path("models/stories260K.gguf");
    }
    return load_path("tests/data/stories260K.gguf");
}

static kp_tok_vocab *load_qwen2(void) { return load_path(VOCAB_DIR "gen-qwen2-vocab.gguf"); }

typedef struct {
    int32_t *ids;
    size_t n;
} idvec;

static idvec enc(const kp_tok_vocab *v, const char *text, size_t len, bool add_special, bool parse_special) {
    idvec r = {0};
    kp_error err = {0};
    kp_status st = kp_tok_encode(v, text, len, add_special, parse_special, &r.ids, &r.n, &err);
    CHECK_MSG(st == KP_OK, "kp_tok_encode: %s", err.msg);
    return r;
}

static idvec encs(const kp_tok_vocab *v, const char *text, bool add_special, bool parse_special) {
    return enc(v, text, strlen(text), add_special, parse_special);
}

static bool ids_eq(idvec a, const int32_t *b, size_t n) {
    return a.n == n && (n == 0 || memcmp(a.ids, b, n * sizeof *b) == 0);
}

static bool idvec_has(idvec a, int32_t id) {
    for (size_t i = 0; i < a.n; i++)
        if (a.ids[i] == id) return true;
    return false;
}

/* a ++ b ++ c */
static idvec cat3(idvec a, const int32_t *mid, size_t n_mid, idvec c) {
    idvec r = {malloc((a.n + n_mid + c.n + 1) * sizeof(int32_t)), a.n + n_mid + c.n};
    memcpy(r.ids, a.ids, a.n * sizeof(int32_t));
    memcpy(r.ids + a.n, mid, n_mid * sizeof(int32_t));
    memcpy(r.ids + a.n + n_mid, c.ids, c.n * sizeof(int32_t));
    return r;
}

/* Concatenated pieces (special = false) into a malloc'd buffer. */
static char *pieces(const kp_tok_vocab *v, idvec ids, size_t *len) {
    size_t cap = 16, n = 0;
    char *out = malloc(cap);
    size_t bad = 0;
    for (size_t i = 0; i < ids.n; i++) {
        size_t pl;
        const char *p = kp_tok_piece_view(v, ids.ids[i], false, &pl);
        if (!p) {
            bad++;
            continue;
        }
        while (n + pl + 1 > cap) out = realloc(out, cap *= 2);
        memcpy(out + n, p, pl);
        n += pl;
    }
    CHECK_MSG(bad == 0, "%zu ids without a piece", bad);
    out[n] = 0;
    *len = n;
    return out;
}

/* Independent strict UTF-8 check (RFC 3629). */
static bool utf8_valid(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        size_t k;
        uint32_t cp;
        if (c < 0x80) {
            i++;
            continue;
        }
        if ((c & 0xE0) == 0xC0) {
            k = 1;
            cp = c & 0x1F;
        } else if ((c & 0xF0) == 0xE0) {
            k = 2;
            cp = c & 0x0F;
        } else if ((c & 0xF8) == 0xF0) {
            k = 3;
            cp = c & 0x07;
        } else {
            return false;
        }
        if (n - i <= k) return false;
        for (size_t j = 1; j <= k; j++) {
            if ((s[i + j] & 0xC0) != 0x80) return false;
            cp = (cp << 6) | (s[i + j] & 0x3F);
        }
        if ((k == 1 && cp < 0x80) || (k == 2 && cp < 0x800) || (k == 3 && cp < 0x10000)) return false;
        if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
        i += k + 1;
    }
    return true;
}

/* The 46 strings of an .inp file (split on "\n__ggml_vocab_test__\n"). */
typedef struct {
    char *buf;
    const char *s[64];
    size_t len[64];
    int n;
} cases;

static bool read_cases(const char *rel, cases *c) {
    size_t n;
    memset(c, 0, sizeof *c);
    c->buf = harness_read_file(harness_path(rel), &n);
    if (!c->buf) return false;
    const char *sep = "\n__ggml_vocab_test__\n";
    char *p = c->buf;
    for (char *q; (q = strstr(p, sep)) && c->n < 64; p = q + strlen(sep)) {
        c->s[c->n] = p;
        c->len[c->n] = (size_t)(q - p);
        c->n++;
    }
    return true;
}

/* Line i of an .out file as ids. */
static bool parse_out_line(const char **cursor, idvec *out) {
    const char *p = *cursor;
    if (!*p) return false;
    const char *eol = strchr(p, '\n');
    if (!eol) eol = p + strlen(p);
    out->ids = malloc(((size_t)(eol - p) / 2 + 1) * sizeof(int32_t));
    out->n = 0;
    while (p < eol) {
        char *end;
        long x = strtol(p, &end, 10);
        if (end == p) break;
        out->ids[out->n++] = (int32_t)x;
        p = end;
    }
    *cursor = *eol ? eol + 1 : eol;
    return true;
}

/* Checks every case of inp/out against v; returns the number of mismatches. */
static int check_vectors(const kp_tok_vocab *v, const char *name, const char *inp_rel, const char *out_rel) {
    cases c;
    size_t out_len;
    char *out = harness_read_file(harness_path(out_rel), &out_len);
    bool ok = read_cases(inp_rel, &c);
    CHECK_MSG(ok && out, "%s: cannot read %s / %s", name, inp_rel, out_rel);
    if (!ok || !out) {
        free(c.buf);
        free(out);
        return 1;
    }
    CHECK_EQ_INT(c.n, 46);
    int bad = 0;
    const char *cur = out;
    for (int i = 0; i < c.n; i++) {
        idvec exp;
        if (!parse_out_line(&cur, &exp)) {
            CHECK_MSG(0, "%s: .out has fewer lines than cases", name);
            bad++;
            break;
        }
        idvec got = enc(v, c.s[i], c.len[i], false, false);
        bool same = ids_eq(got, exp.ids, exp.n);
        CHECK_MSG(same, "%s case %d ('%.*s'): %zu ids, expected %zu", name, i, (int)c.len[i], c.s[i],
                  got.n, exp.n);
        if (!same) bad++;
        free(got.ids);
        free(exp.ids);
    }
    free(c.buf);
    free(out);
    return bad;
}

/* ---- reference vectors ---- */

static void test_upstream_vectors(void) {
    for (size_t k = 0; k < sizeof upstream_vocabs / sizeof upstream_vocabs[0]; k++) {
        const char *name = upstream_vocabs[k];
        kp_tok_vocab *v = load_vocab(name);
        CHECK_MSG(v != NULL, "load %s", name);
        if (!v) continue;
        char inp[256], out[256];
        snprintf(inp, sizeof inp, VOCAB_DIR "ggml-vocab-%s.gguf.inp", name);
        snprintf(out, sizeof out, VOCAB_DIR "ggml-vocab-%s.gguf.out", name);
        int bad = check_vectors(v, name, inp, out);
        if (bad) fprintf(stderr, "%s: %d of 46 cases differ\n", name, bad);
        CHECK(kp_tok_pre_warning(v) == NULL);
        kp_tok_vocab_free(v);
    }
}

static void test_golden_vectors(void) {
    kp_tok_vocab *s = load_stories();
    CHECK_MSG(s != NULL, "the bundled model models/stories260K.gguf is missing");
    if (s) {
        CHECK_EQ_INT(check_vectors(s, "stories260K", VOCAB_DIR "stories260K.gguf.inp",
                                   VOCAB_DIR "stories260K.gguf.out"), 0);
        kp_tok_vocab_free(s);
    }
    kp_tok_vocab *q = load_qwen2();
    CHECK(q != NULL);
    if (q) {
        CHECK_EQ_STR(kp_tok_pre_name(q), "qwen2");
        CHECK_EQ_INT(check_vectors(q, "gen-qwen2", VOCAB_DIR "gen-qwen2-f32.gguf.inp",
                                   VOCAB_DIR "gen-qwen2-f32.gguf.out"), 0);
        kp_tok_vocab_free(q);
    }
}

/* Prompts of the goldens, tokenized by llama.cpp with the model's default add_special. */
static void test_golden_prompts(void) {
    static const char *once = "Once upon a time";
    static const char *lily = "Lily and Tom went to the park. They saw a big dog and";
    static const char *json = "{\"name\": \"get_weather\", \"parameters\": {\"type\": \"object\"}}";

    kp_tok_vocab *s = load_stories();
    if (s) {
        static const int32_t e_once[] = {1, 403, 407, 261, 378};
        static const int32_t e_lily[] = {1, 317, 269, 274, 287, 263, 377, 267, 265, 282,
                                         295, 433, 426, 342, 394, 261, 370, 400, 428, 269};
        static const int32_t e_json[] = {1, 410, 126, 436, 416, 314, 411, 436, 467, 313, 428, 316,
                                         98, 424, 411, 294, 386, 436, 432, 313, 427, 295, 314, 316,
                                         285, 419, 436, 467, 410, 126, 436, 413, 422, 427, 411, 436,
                                         467, 313, 414, 430, 449, 411, 429, 413, 436, 128, 128};
        CHECK(kp_tok_add_bos(s)); /* no add_bos_token key: SPM adds BOS */
        idvec r = encs(s, once, true, false);
        CHECK(ids_eq(r, e_once, sizeof e_once / 4));
        free(r.ids);
        r = encs(s, lily, true, false);
        CHECK(ids_eq(r, e_lily, sizeof e_lily / 4));
        free(r.ids);
        r = encs(s, json, true, false);
        CHECK(ids_eq(r, e_json, sizeof e_json / 4));
        free(r.ids);
        r = encs(s, "", true, false); /* the empty prompt is BOS alone */
        CHECK(r.n == 1 && r.ids[0] == 1);
        free(r.ids);
        kp_tok_vocab_free(s);
    }

    kp_tok_vocab *q = load_qwen2();
    if (q) {
        static const int32_t e_once[] = {46, 1198, 510, 261, 257, 640};
        static const int32_t e_lily[] = {43, 813, 290, 309, 296, 1816, 284, 262, 279, 668,
                                         13, 1119, 473, 86, 257, 1263, 466, 70, 290};
        static const int32_t e_json[] = {90, 1, 77, 480, 1298, 366, 1136, 62, 732, 1032,
                                         1600, 366, 1845, 321, 316, 364, 1298, 1391, 1, 774,
                                         431, 1298, 366, 672, 752, 1, 92, 92};
        CHECK(!kp_tok_add_bos(q)); /* add_bos_token = false */
        idvec r = encs(q, once, true, false);
        CHECK(ids_eq(r, e_once, sizeof e_once / 4));
        free(r.ids);
        r = encs(q, lily, true, false);
        CHECK(ids_eq(r, e_lily, sizeof e_lily / 4));
        free(r.ids);
        r = encs(q, json, true, false);
        CHECK(ids_eq(r, e_json, sizeof e_json / 4));
        free(r.ids);
        r = encs(q, "", true, false); /* no BOS: nothing at all */
        CHECK_EQ_INT(r.n, 0);
        free(r.ids);
        kp_tok_vocab_free(q);
    }

    /* llama-2-tiny-random's vocabulary is ggml-vocab-llama-spm's, token for token */
    kp_tok_vocab *l = load_vocab("llama-spm");
    if (l) {
        static const int32_t e_lily[] = {1, 365, 2354, 322, 4335, 3512, 304, 278,
                                         14089, 29889, 2688, 4446, 263, 4802, 11203, 322};
        static const int32_t e_json[] = {1, 8853, 978, 1115, 376, 657, 29918, 705, 1624, 613,
                                         376, 16744, 1115, 8853, 1853, 1115, 376, 3318, 29908, 930};
        idvec r = encs(l, lily, true, false);
        CHECK(ids_eq(r, e_lily, sizeof e_lily / 4));
        free(r.ids);
        r = encs(l, json, true, false);
        CHECK(ids_eq(r, e_json, sizeof e_json / 4));
        free(r.ids);
        kp_tok_vocab_free(l);
    }
}

/* ---- vocabulary properties ---- */

static void test_properties(void) {
    kp_tok_vocab *s = load_stories();
    if (s) {
        CHECK_EQ_STR(kp_tok_model_name(s), "llama");
        CHECK_EQ_STR(kp_tok_pre_name(s), "default");
        CHECK_EQ_INT(kp_tok_n_vocab(s), 512);
        CHECK_EQ_INT(kp_tok_bos(s), 1);
        CHECK_EQ_INT(kp_tok_eos(s), 2);
        CHECK_EQ_INT(kp_tok_unk(s), 0);
        CHECK_EQ_INT(kp_tok_pad(s), -1); /* padding_token_id = 0xFFFFFFFF: unset */
        CHECK(kp_tok_add_bos(s) && !kp_tok_add_eos(s) && kp_tok_add_space_prefix(s));
        CHECK(kp_tok_is_eog(s, 2) && !kp_tok_is_eog(s, 1) && !kp_tok_is_eog(s, 300));
        CHECK(!kp_tok_is_eog(s, -1) && !kp_tok_is_eog(s, 512));
        CHECK(kp_tok_is_control(s, 1) && !kp_tok_is_control(s, 300));
        CHECK_EQ_INT(kp_tok_nl(s), kp_tok_find(s, "<0x0A>", 6));
        size_t len;
        CHECK_EQ_STR(kp_tok_text(s, 1, &len), "<s>");
        CHECK_EQ_INT(len, 3);
        CHECK(kp_tok_text(s, 512, &len) == NULL && len == 0);
        CHECK(kp_tok_attr(s, 3) & 32); /* <0x00> is a byte token */
        kp_tok_vocab_free(s);
    }
    kp_tok_vocab *q = load_qwen2();
    if (q) {
        CHECK_EQ_STR(kp_tok_model_name(q), "gpt2");
        /* bos = eos = 0 ("!"): llama.cpp puts the eos id in its end-of-generation set */
        CHECK(kp_tok_is_eog(q, 0) && !kp_tok_is_eog(q, 1));
        CHECK(!kp_tok_add_bos(q) && !kp_tok_add_space_prefix(q));
        CHECK_EQ_INT(kp_tok_nl(q), 198); /* GPT-2's "Ċ" */
        kp_tok_vocab_free(q);
    }
    kp_tok_vocab *g = load_vocab("gpt-2");
    if (g) {
        CHECK(!kp_tok_add_bos(g)); /* BPE without add_bos_token: no BOS */
        CHECK(kp_tok_is_eog(g, 50256) && kp_tok_is_control(g, 50256));
        idvec r = encs(g, "Hello", true, false);
        CHECK(!idvec_has(r, 50256));
        free(r.ids);
        kp_tok_vocab_free(g);
    }
    kp_tok_vocab *d = load_vocab("deepseek-coder");
    if (d) {
        CHECK(kp_tok_add_bos(d)); /* add_bos_token = true */
        idvec r = encs(d, "Hello", true, false);
        CHECK(r.n >= 1 && r.ids[0] == 32013);
        free(r.ids);
        CHECK(kp_tok_is_eog(d, 32014));
        kp_tok_vocab_free(d);
    }
    kp_tok_vocab *p = load_vocab("phi-3");
    if (p) {
        CHECK(kp_tok_is_eog(p, 32000) && kp_tok_is_eog(p, 32007)); /* <|endoftext|>, <|end|> */
        kp_tok_vocab_free(p);
    }
}

static void test_bert_refused(void) {
    kp_gguf *g = NULL;
    kp_error err = {0};
    CHECK(kp_gguf_open(&g, harness_path(VOCAB_DIR "ggml-vocab-bert-bge.gguf"), &err) == KP_OK);
    if (!g) return;
    kp_tok_vocab *v = (kp_tok_vocab *)1;
    CHECK_EQ_INT(kp_tok_vocab_load(&v, g, &err), KP_EUNSUPPORTED);
    CHECK(v == NULL);
    CHECK_EQ_STR(err.msg, "unsupported tokenizer model 'bert'");
    kp_gguf_close(g);
}

/* ---- special tokens ---- */

static void test_special_tokens(void) {
    kp_tok_vocab *g = load_vocab("gpt-2");
    if (g) {
        /* as plain text, GPT-2 spells "<|endoftext|>" as < | end of text | > */
        static const int32_t plain[] = {27, 91, 437, 1659, 5239, 91, 29};
        static const int32_t eot[] = {50256};
        idvec r = encs(g, "<|endoftext|>", false, false);
        CHECK(ids_eq(r, plain, 7));
        free(r.ids);
        r = encs(g, "<|endoftext|>", false, true);
        CHECK(ids_eq(r, eot, 1));
        free(r.ids);
        idvec a = encs(g, "Hello", false, false), c = encs(g, "world", false, false);
        idvec want = cat3(a, eot, 1, c);
        r = encs(g, "Hello<|endoftext|>world", false, true);
        CHECK(ids_eq(r, want.ids, want.n));
        free(r.ids);
        free(want.ids);
        free(a.ids);
        free(c.ids);
        kp_tok_vocab_free(g);
    }

    kp_tok_vocab *l = load_vocab("llama-spm");
    if (l) {
        /* after a special token the next piece gets its own leading space */
        static const int32_t bos[] = {1};
        idvec a = encs(l, "Hi", false, false), c = encs(l, "there", false, false);
        idvec want = cat3(a, bos, 1, c);
        idvec r = encs(l, "Hi<s>there", false, true);
        CHECK(ids_eq(r, want.ids, want.n));
        free(r.ids);
        free(want.ids);
        r = encs(l, "Hi<s>there", false, false);
        CHECK(!idvec_has(r, 1));
        size_t n;
        char *txt = pieces(l, r, &n);
        CHECK_EQ_STR(txt, " Hi<s>there");
        free(txt);
        free(r.ids);
        free(a.ids);
        free(c.ids);
        /* control pieces are empty unless asked for */
        char buf[16];
        size_t len = 99;
        CHECK_EQ_INT(kp_tok_piece(l, 1, false, buf, sizeof buf, &len, NULL), KP_OK);
        CHECK_EQ_INT(len, 0);
        CHECK_EQ_INT(kp_tok_piece(l, 1, true, buf, sizeof buf, &len, NULL), KP_OK);
        CHECK(len == 3 && memcmp(buf, "<s>", 3) == 0);
        CHECK_EQ_INT(kp_tok_piece(l, 1, true, buf, 2, &len, NULL), KP_ERANGE);
        kp_tok_vocab_free(l);
    }

    /* user-defined tokens are matched without parse_special */
    kp_tok_vocab *m = load_vocab("mpt");
    if (m) {
        int32_t three = kp_tok_find(m, "   ", 3);
        CHECK_EQ_INT(three, 50275);
        CHECK(kp_tok_attr(m, three) & 16); /* USER_DEFINED */
        idvec r = encs(m, "a   b", false, false);
        CHECK(r.n == 3 && r.ids[1] == three);
        free(r.ids);
        kp_tok_vocab_free(m);
    }
    kp_tok_vocab *d = load_vocab("deepseek-coder");
    if (d) {
        const char *bos_text = "<\xef\xbd\x9c" "begin\xe2\x96\x81" "of\xe2\x96\x81" "sentence\xef\xbd\x9c>";
        idvec r = encs(d, bos_text, false, true);
        CHECK(r.n == 1 && r.ids[0] == 32013);
        free(r.ids);
        r = encs(d, bos_text, false, false);
        CHECK(r.n > 1 && !idvec_has(r, 32013));
        size_t n;
        char *txt = pieces(d, r, &n);
        CHECK_EQ_STR(txt, bos_text);
        free(txt);
        free(r.ids);
        r = encs(d, "\xc3\xbc", false, false); /* "ü" is a user-defined token there */
        CHECK(r.n == 1 && r.ids[0] == 32009);
        free(r.ids);
        kp_tok_vocab_free(d);
    }
}

/* ---- round trips ---- */

static void roundtrip_vocab(const kp_tok_vocab *v, const char *name, const char *inp_rel, bool check_detok) {
    cases c;
    if (!read_cases(inp_rel, &c)) {
        CHECK_MSG(0, "%s: cannot read %s", name, inp_rel);
        return;
    }
    bool spm = kp_tok_model_kind(v) == KP_TOK_MODEL_SPM;
    for (int i = 0; i < c.n; i++) {
        idvec ids = enc(v, c.s[i], c.len[i], false, false);
        size_t n;
        char *txt = pieces(v, ids, &n);
        /* SPM pieces carry the space the tokenizer put in front */
        bool same = spm ? (c.len[i] == 0 ? n == 0 : n == c.len[i] + 1 && txt[0] == ' ' &&
                                                          memcmp(txt + 1, c.s[i], c.len[i]) == 0)
                        : n == c.len[i] && memcmp(txt, c.s[i], n) == 0;
        CHECK_MSG(same, "%s case %d: pieces do not spell the text", name, i);
        free(txt);
        if (check_detok) {
            char *d;
            size_t dn;
            CHECK_EQ_INT(kp_tok_detokenize(v, ids.ids, ids.n, false, false, &d, &dn, NULL), KP_OK);
            CHECK_MSG(dn == c.len[i] && memcmp(d, c.s[i], dn) == 0, "%s case %d: detokenize", name, i);
            free(d);
        }
        /* the stream gives the same bytes, in valid UTF-8 chunks */
        kp_tok_stream *st;
        CHECK_EQ_INT(kp_tok_stream_new(&st, v, false, NULL), KP_OK);
        char *acc = malloc(c.len[i] + 8);
        size_t an = 0;
        bool chunks_ok = true;
        for (size_t k = 0; k < ids.n; k++) {
            const char *b;
            size_t bn;
            CHECK_EQ_INT(kp_tok_stream_push(st, ids.ids[k], &b, &bn, NULL), KP_OK);
            if (!utf8_valid((const unsigned char *)b, bn)) chunks_ok = false;
            if (an + bn <= c.len[i] + 1) memcpy(acc + an, b, bn);
            an += bn;
        }
        const char *b;
        size_t bn;
        kp_tok_stream_flush(st, &b, &bn);
        CHECK_EQ_INT(bn, 0);
        CHECK(chunks_ok);
        size_t skip = spm && c.len[i] ? 1 : 0;
        CHECK_MSG(an == c.len[i] + skip && memcmp(acc + skip, c.s[i], c.len[i]) == 0,
                  "%s case %d: stream", name, i);
        free(acc);
        kp_tok_stream_free(st);
        free(ids.ids);
    }
    free(c.buf);
}

static void test_roundtrip(void) {
    for (size_t k = 0; k < sizeof upstream_vocabs / sizeof upstream_vocabs[0]; k++) {
        kp_tok_vocab *v = load_vocab(upstream_vocabs[k]);
        if (!v) continue;
        char inp[256];
        snprintf(inp, sizeof inp, VOCAB_DIR "ggml-vocab-%s.gguf.inp", upstream_vocabs[k]);
        /* SPM removes the leading space; these BPE pre-tokenizers do no space cleaning */
        const char *n = upstream_vocabs[k];
        bool detok = kp_tok_model_kind(v) == KP_TOK_MODEL_SPM || strncmp(n, "deepseek", 8) == 0;
        roundtrip_vocab(v, n, inp, detok);
        kp_tok_vocab_free(v);
    }
    kp_tok_vocab *s = load_stories();
    if (s) {
        roundtrip_vocab(s, "stories260K", VOCAB_DIR "stories260K.gguf.inp", true);
        kp_tok_vocab_free(s);
    }
    kp_tok_vocab *q = load_qwen2();
    if (q) {
        roundtrip_vocab(q, "gen-qwen2", VOCAB_DIR "gen-qwen2-f32.gguf.inp", true);
        kp_tok_vocab_free(q);
    }
}

static void test_detokenize_rules(void) {
    kp_tok_vocab *l = load_vocab("llama-spm");
    if (l) {
        idvec r = encs(l, "Hello world", true, false); /* [BOS, ▁Hello, ▁world] */
        char *d;
        size_t n;
        /* with BOS in front the leading space stays (llama_detokenize) */
        CHECK_EQ_INT(kp_tok_detokenize(l, r.ids, r.n, false, false, &d, &n, NULL), KP_OK);
        CHECK_EQ_STR(d, " Hello world");
        free(d);
        CHECK_EQ_INT(kp_tok_detokenize(l, r.ids, r.n, true, true, &d, &n, NULL), KP_OK);
        CHECK_EQ_STR(d, " Hello world");
        free(d);
        CHECK_EQ_INT(kp_tok_detokenize(l, r.ids, r.n, false, true, &d, &n, NULL), KP_OK);
        CHECK_EQ_STR(d, "<s> Hello world");
        free(d);
        CHECK_EQ_INT(kp_tok_detokenize(l, r.ids + 1, r.n - 1, false, false, &d, &n, NULL), KP_OK);
        CHECK_EQ_STR(d, "Hello world");
        free(d);
        int32_t bad[] = {1, 32000};
        CHECK_EQ_INT(kp_tok_detokenize(l, bad, 2, false, false, &d, &n, NULL), KP_EINVAL);
        free(r.ids);
        kp_tok_vocab_free(l);
    }
    kp_tok_vocab *g = load_vocab("gpt-2");
    if (g) {
        /* gpt-2 cleans tokenization spaces: " ," -> "," and " 's" -> "'s" */
        idvec r = encs(g, "Hello , it 's", false, false);
        char *d;
        size_t n;
        CHECK_EQ_INT(kp_tok_detokenize(g, r.ids, r.n, false, false, &d, &n, NULL), KP_OK);
        CHECK_EQ_STR(d, "Hello, it's");
        free(d);
        free(r.ids);
        kp_tok_vocab_free(g);
    }
}

/* ---- streaming ---- */

static void test_stream_bytes(void) {
    kp_tok_vocab *s = load_stories();
    if (!s) return;
    /* "🦙" has no piece in stories260K: four byte tokens */
    idvec r = encs(s, "\xf0\x9f\xa6\x99", false, false);
    int32_t b_f0 = kp_tok_find(s, "<0xF0>", 6), b_9f = kp_tok_find(s, "<0x9F>", 6);
    int32_t b_a6 = kp_tok_find(s, "<0xA6>", 6), b_99 = kp_tok_find(s, "<0x99>", 6);
    CHECK(r.n >= 4 && r.ids[r.n - 4] == b_f0 && r.ids[r.n - 3] == b_9f && r.ids[r.n - 2] == b_a6 &&
          r.ids[r.n - 1] == b_99);
    free(r.ids);

    kp_tok_stream *st;
    CHECK_EQ_INT(kp_tok_stream_new(&st, s, false, NULL), KP_OK);
    const char *b;
    size_t n;
    int32_t seq[] = {b_f0, b_9f, b_a6};
    for (int i = 0; i < 3; i++) {
        CHECK_EQ_INT(kp_tok_stream_push(st, seq[i], &b, &n, NULL), KP_OK);
        CHECK_EQ_INT(n, 0); /* held back: incomplete */
    }
    CHECK_EQ_INT(kp_tok_stream_push(st, b_99, &b, &n, NULL), KP_OK);
    CHECK(n == 4 && memcmp(b, "\xf0\x9f\xa6\x99", 4) == 0);

    /* an interrupted sequence is one U+FFFD, then the rest as usual */
    int32_t a = kp_tok_find(s, "a", 1);
    CHECK(a >= 0);
    CHECK_EQ_INT(kp_tok_stream_push(st, b_f0, &b, &n, NULL), KP_OK);
    CHECK_EQ_INT(kp_tok_stream_push(st, b_9f, &b, &n, NULL), KP_OK);
    CHECK_EQ_INT(kp_tok_stream_push(st, a, &b, &n, NULL), KP_OK);
    CHECK(n == 4 && memcmp(b, "\xef\xbf\xbd" "a", 4) == 0);
    /* bytes that can never start a character: one U+FFFD each */
    CHECK_EQ_INT(kp_tok_stream_push(st, kp_tok_find(s, "<0xFF>", 6), &b, &n, NULL), KP_OK);
    CHECK(n == 3 && memcmp(b, "\xef\xbf\xbd", 3) == 0);
    /* ED A0 (a surrogate) is two maximal subparts: two U+FFFD */
    CHECK_EQ_INT(kp_tok_stream_push(st, kp_tok_find(s, "<0xED>", 6), &b, &n, NULL), KP_OK);
    CHECK_EQ_INT(n, 0);
    CHECK_EQ_INT(kp_tok_stream_push(st, kp_tok_find(s, "<0xA0>", 6), &b, &n, NULL), KP_OK);
    CHECK(n == 6 && memcmp(b, "\xef\xbf\xbd\xef\xbf\xbd", 6) == 0);
    /* an out-of-range id leaves the stream untouched */
    CHECK_EQ_INT(kp_tok_stream_push(st, b_f0, &b, &n, NULL), KP_OK);
    CHECK_EQ_INT(kp_tok_stream_push(st, 512, &b, &n, NULL), KP_EINVAL);
    CHECK_EQ_INT(kp_tok_stream_push(st, -1, &b, &n, NULL), KP_EINVAL);
    /* flush turns the held-back byte into U+FFFD and resets */
    kp_tok_stream_flush(st, &b, &n);
    CHECK(n == 3 && memcmp(b, "\xef\xbf\xbd", 3) == 0);
    kp_tok_stream_flush(st, &b, &n);
    CHECK_EQ_INT(n, 0);
    /* control tokens print nothing unless the stream renders specials */
    CHECK_EQ_INT(kp_tok_stream_push(st, 1, &b, &n, NULL), KP_OK);
    CHECK_EQ_INT(n, 0);
    kp_tok_stream_free(st);
    CHECK_EQ_INT(kp_tok_stream_new(&st, s, true, NULL), KP_OK);
    CHECK_EQ_INT(kp_tok_stream_push(st, 1, &b, &n, NULL), KP_OK);
    CHECK(n == 3 && memcmp(b, "<s>", 3) == 0);
    kp_tok_stream_free(st);
    kp_tok_stream_free(NULL);
    kp_tok_vocab_free(s);

    /* BPE: GPT-2 splits "🦙" into byte-level pieces that are not UTF-8 alone */
    kp_tok_vocab *g = load_vocab("gpt-2");
    if (g) {
        idvec e = encs(g, "\xf0\x9f\xa6\x99\xf0\x9f\xa6\x99", false, false);
        CHECK(e.n >= 2);
        kp_tok_stream *gs;
        CHECK_EQ_INT(kp_tok_stream_new(&gs, g, false, NULL), KP_OK);
        char acc[16];
        size_t an = 0;
        int held = 0;
        for (size_t i = 0; i < e.n; i++) {
            CHECK_EQ_INT(kp_tok_stream_push(gs, e.ids[i], &b, &n, NULL), KP_OK);
            if (n == 0) held++;
            CHECK(n % 4 == 0 && an + n <= sizeof acc);
            if (an + n <= sizeof acc) memcpy(acc + an, b, n);
            an += n;
        }
        CHECK(held > 0);
        CHECK(an == 8 && memcmp(acc, "\xf0\x9f\xa6\x99\xf0\x9f\xa6\x99", 8) == 0);
        free(e.ids);
        kp_tok_stream_free(gs);
        kp_tok_vocab_free(g);
    }
}

/* ---- robustness ---- */

static void test_invalid_input(void) {
    kp_tok_vocab *s = load_stories();
    kp_tok_vocab *g = load_vocab("gpt-2");
    if (s) {
        /* SPM spells bytes that are not UTF-8 with byte tokens */
        idvec r = encs(s, "a\xff" "b\xc3", false, false);
        CHECK(idvec_has(r, kp_tok_find(s, "<0xFF>", 6)) && idvec_has(r, kp_tok_find(s, "<0xC3>", 6)));
        size_t n;
        char *t = pieces(s, r, &n);
        CHECK(n == 5 && memcmp(t, " a\xff" "b\xc3", 5) == 0);
        free(t);
        free(r.ids);
        /* bytes including NUL */
        r = enc(s, "x\0y", 3, false, false);
        t = pieces(s, r, &n);
        CHECK(n == 4 && memcmp(t, " x\0y", 4) == 0);
        free(t);
        free(r.ids);
    }
    if (g) {
        /* BPE reads each malformed byte as U+FFFD, as llama.cpp does */
        idvec bad = encs(g, "a\xff" "b", false, false);
        idvec rep = encs(g, "a\xef\xbf\xbd" "b", false, false);
        CHECK(bad.n > 0 && ids_eq(bad, rep.ids, rep.n));
        free(bad.ids);
        free(rep.ids);
        bad = encs(g, "\xc3(\xe2\x82\xf0\x9f\x98", false, false);
        rep = encs(g, "\xef\xbf\xbd(\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd", false, false);
        CHECK(ids_eq(bad, rep.ids, rep.n));
        free(bad.ids);
        free(rep.ids);
        /* a surrogate (ED A0 80) passes through as its own bytes */
        bad = encs(g, "x\xed\xa0\x80y", false, false);
        size_t n;
        char *t = pieces(g, bad, &n);
        CHECK(n == 5 && memcmp(t, "x\xed\xa0\x80y", 5) == 0);
        free(t);
        free(bad.ids);
        /* bad arguments */
        int32_t *ids;
        CHECK_EQ_INT(kp_tok_encode(g, NULL, 3, false, false, &ids, &n, NULL), KP_EINVAL);
        CHECK_EQ_INT(kp_tok_encode(g, "abc", 3, false, false, NULL, &n, NULL), KP_EINVAL);
        char buf[8];
        CHECK_EQ_INT(kp_tok_piece(g, 50257, false, buf, sizeof buf, &n, NULL), KP_EINVAL);
        CHECK_EQ_INT(kp_tok_piece(g, -5, false, buf, sizeof buf, &n, NULL), KP_EINVAL);
        CHECK(kp_tok_piece_view(g, 50257, false, &n) == NULL);
    }
    kp_tok_vocab_free(s);
    kp_tok_vocab_free(g);
    kp_tok_vocab_free(NULL);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Long runs of one character must not take quadratic time. */
static void test_long_inputs(void) {
    const size_t n = 100000;
    char *text = malloc(n + 8);
    const char fills[] = {'a', ' ', '\n', '3', '!'};
    const char *names[] = {"gpt-2", "llama-spm", "deepseek-llm", "falcon"};
    for (size_t k = 0; k < 4; k++) {
        kp_tok_vocab *v = load_vocab(names[k]);
        if (!v) continue;
        for (size_t f = 0; f < sizeof fills; f++) {
            memset(text, fills[f], n);
            memcpy(text + n, "\xe4\xb8\x80x", 4); /* a CJK letter and a letter at the end */
            double t0 = now_s();
            idvec r = enc(v, text, n + 4, false, false);
            double dt = now_s() - t0;
            CHECK_MSG(dt < 20.0, "%s: %zu x '%c' took %.1f s", names[k], n, fills[f], dt);
            size_t pn;
            char *p = pieces(v, r, &pn);
            size_t skip = kp_tok_model_kind(v) == KP_TOK_MODEL_SPM ? 1 : 0;
            CHECK_MSG(pn == n + 4 + skip && memcmp(p + skip, text, n + 4) == 0, "%s: long '%c' round trip",
                      names[k], fills[f]);
            free(p);
            free(r.ids);
        }
        kp_tok_vocab_free(v);
    }
    free(text);
}

/* Merging SPM text word by word must give exactly what one merge over the
 * whole text gives (tok_merge.c explains why it may). */
static void test_spm_word_cuts(void) {
    static const char *const pool[] = {" ", "  ", "a", "the", SPM_SPACE, "\xe2", "\x96", "\x81", "\xf0",
                                       "\xc3\xa9", "\n", "\t", "Hello", "world", "<s>", "\xff",
                                       "ab", "\xe2\x96", "x", "\xe4\xb8\x80", "Once upon", " time,"};
    const size_t n_pool = sizeof pool / sizeof pool[0];
    kp_tok_vocab *vs[2] = {load_vocab("llama-spm"), load_stories()};
    for (int k = 0; k < 2; k++) {
        kp_tok_vocab *v = vs[k];
        if (!v) continue;
        CHECK(v->spm_word_cuts);
        uint32_t seed = 7;
        int bad = 0;
        for (int it = 0; it < 3000; it++) {
            char t[512];
            size_t n = 0;
            seed = seed * 1664525u + 1013904223u;
            for (int j = (int)(seed >> 27); j > 0; j--) {
                seed = seed * 1664525u + 1013904223u;
                const char *p = pool[(seed >> 8) % n_pool];
                memcpy(t + n, p, strlen(p));
                n += strlen(p);
            }
            v->spm_word_cuts = true;
            idvec a = enc(v, t, n, false, false);
            v->spm_word_cuts = false;
            idvec b = enc(v, t, n, false, false);
            if (!ids_eq(a, b.ids, b.n)) bad++;
            free(a.ids);
            free(b.ids);
        }
        v->spm_word_cuts = true;
        CHECK_EQ_INT(bad, 0);
        kp_tok_vocab_free(v);
    }
}

/* ---- tiny in-memory GGUF images ---- */

typedef struct {
    uint8_t *d;
    size_t n, cap;
    uint64_t n_kv;
} gw;

static void gw_put(gw *w, const void *p, size_t n) {
    while (w->n + n > w->cap) w->d = realloc(w->d, w->cap = w->cap ? w->cap * 2 : 256);
    memcpy(w->d + w->n, p, n);
    w->n += n;
}
static void gw_u32(gw *w, uint32_t x) { gw_put(w, &x, 4); }
static void gw_u64(gw *w, uint64_t x) { gw_put(w, &x, 8); }
static void gw_str(gw *w, const char *s) {
    gw_u64(w, strlen(s));
    gw_put(w, s, strlen(s));
}
static void gw_begin(gw *w) {
    memset(w, 0, sizeof *w);
    gw_put(w, "GGUF", 4);
    gw_u32(w, 3);
    gw_u64(w, 0); /* tensors */
    gw_u64(w, 0); /* kv count, patched by gw_open */
}
static void kv_str(gw *w, const char *k, const char *v) {
    gw_str(w, k);
    gw_u32(w, 8);
    gw_str(w, v);
    w->n_kv++;
}
static void kv_u32(gw *w, const char *k, uint32_t v) {
    gw_str(w, k);
    gw_u32(w, 4);
    gw_u32(w, v);
    w->n_kv++;
}
static void kv_bool(gw *w, const char *k, bool v) {
    uint8_t b = v;
    gw_str(w, k);
    gw_u32(w, 7);
    gw_put(w, &b, 1);
    w->n_kv++;
}
static void kv_strs(gw *w, const char *k, const char *const *s, size_t n) {
    gw_str(w, k);
    gw_u32(w, 9);
    gw_u32(w, 8);
    gw_u64(w, n);
    for (size_t i = 0; i < n; i++) gw_str(w, s[i]);
    w->n_kv++;
}
static void kv_f32s(gw *w, const char *k, const float *v, size_t n) {
    gw_str(w, k);
    gw_u32(w, 9);
    gw_u32(w, 6);
    gw_u64(w, n);
    gw_put(w, v, n * 4);
    w->n_kv++;
}
static void kv_i32s(gw *w, const char *k, const int32_t *v, size_t n) {
    gw_str(w, k);
    gw_u32(w, 9);
    gw_u32(w, 5);
    gw_u64(w, n);
    gw_put(w, v, n * 4);
    w->n_kv++;
}

/* Loads the image; returns the status and fills *out / err. */
static kp_status gw_load(gw *w, kp_tok_vocab **out, kp_error *err) {
    memcpy(w->d + 16, &w->n_kv, 8);
    kp_gguf *g = NULL;
    *out = NULL;
    kp_status st = kp_gguf_open_memory(&g, w->d, w->n, "mem.gguf", err);
    CHECK_MSG(st == KP_OK, "kp_gguf_open_memory: %s", err->msg);
    if (st == KP_OK) {
        st = kp_tok_vocab_load(out, g, err);
        kp_gguf_close(g);
    }
    free(w->d);
    w->d = NULL;
    return st;
}


/* A hand-made SPM vocabulary: answers follow from the scores by inspection. */
static void spm_tiny(gw *w, bool space_prefix) {
    static const char *const toks[] = {"<unk>", "<s>", "</s>", SPM_SPACE, "a", "b", SPM_SPACE "a", "ab",
                                       SPM_SPACE "ab", "<0x63>", "aa"};
    static const float scores[] = {0, 0, 0, -1, -2, -2, -3, -1.5f, -5, 0, -1};
    static const int32_t types[] = {2, 3, 3, 1, 1, 1, 1, 1, 1, 6, 1};
    gw_begin(w);
    kv_str(w, "tokenizer.ggml.model", "llama");
    kv_strs(w, "tokenizer.ggml.tokens", toks, 11);
    kv_f32s(w, "tokenizer.ggml.scores", scores, 11);
    kv_i32s(w, "tokenizer.ggml.token_type", types, 11);
    if (!space_prefix) kv_bool(w, "tokenizer.ggml.add_space_prefix", false);
}

static void test_tiny_spm(void) {
    gw w;
    kp_tok_vocab *v;
    kp_error err = {0};
    spm_tiny(&w, true);
    CHECK_EQ_INT(gw_load(&w, &v, &err), KP_OK);
    if (v) {
        /* "▁ab": ab (-1.5) beats ▁a (-3), then ▁+ab forms ▁ab */
        static const int32_t e1[] = {8};
        idvec r = encs(v, "ab", false, false);
        CHECK(ids_eq(r, e1, 1));
        free(r.ids);
        /* "c" has only its byte token; "d" has nothing: <unk> */
        static const int32_t e2[] = {8, 9, 0};
        r = encs(v, "abcd", false, false);
        CHECK(ids_eq(r, e2, 3));
        free(r.ids);
        /* no pair of "▁ba" is a token: three single pieces */
        static const int32_t e3[] = {3, 5, 4};
        r = encs(v, "ba", false, false);
        CHECK(ids_eq(r, e3, 3));
        free(r.ids);
        static const int32_t e4[] = {1, 8};
        r = encs(v, "ab", true, false); /* BOS by default */
        CHECK(ids_eq(r, e4, 2));
        free(r.ids);
        kp_tok_vocab_free(v);
    }
    spm_tiny(&w, false);
    CHECK_EQ_INT(gw_load(&w, &v, &err), KP_OK);
    if (v) {
        /* equal scores: the leftmost pair merges first -> "aa" + "a" */
        static const int32_t e[] = {10, 4};
        idvec r = encs(v, "aaa", false, false);
        CHECK(ids_eq(r, e, 2));
        free(r.ids);
        CHECK(!kp_tok_add_space_prefix(v));
        kp_tok_vocab_free(v);
    }
}

static void bpe_tiny(gw *w, const char *const *merges, size_t n_merges, const char *pre) {
    /* "Ġ" is GPT-2's space; "x y" holds a raw space, which no byte maps to */
    static const char *const toks[] = {"a", "b", "c", "ab", "bc", "abc", "\xc4\xa0", "\304\240a", "x y"};
    gw_begin(w);
    kv_str(w, "tokenizer.ggml.model", "gpt2");
    if (pre) kv_str(w, "tokenizer.ggml.pre", pre);
    kv_strs(w, "tokenizer.ggml.tokens", toks, 9);
    if (merges) kv_strs(w, "tokenizer.ggml.merges", merges, n_merges);
}

static void test_tiny_bpe(void) {
    gw w;
    kp_tok_vocab *v;
    kp_error err = {0};
    static const char *const m1[] = {"a b", "ab c", "\xc4\xa0 a"};
    bpe_tiny(&w, m1, 3, "gpt-2");
    CHECK_EQ_INT(gw_load(&w, &v, &err), KP_OK);
    if (v) {
        static const int32_t e1[] = {5};
        idvec r = encs(v, "abc", false, false);
        CHECK(ids_eq(r, e1, 1));
        free(r.ids);
        /* " a" is one word (GPT-2 regex) and one token; "d" is no token and is dropped */
        static const int32_t e2[] = {3, 7};
        r = encs(v, "ab ad", false, false);
        CHECK(ids_eq(r, e2, 2));
        free(r.ids);
        CHECK(kp_tok_pre_warning(v) == NULL);
        /* pieces map GPT-2 code points back to bytes; a code point outside the
         * map gets llama.cpp's marker (llama_decode_text) */
        size_t n;
        const char *p = kp_tok_piece_view(v, 7, false, &n);
        CHECK(n == 2 && memcmp(p, " a", 2) == 0);
        p = kp_tok_piece_view(v, 8, false, &n);
        CHECK(n == 20 && memcmp(p, "x[UNK_BYTE_0x20x y]y", 20) == 0);
        kp_tok_vocab_free(v);
    }
    /* ranks decide: "b c" (rank 0) before "a b" (rank 1) -> a + bc */
    static const char *const m2[] = {"b c", "a b", "ab c"};
    bpe_tiny(&w, m2, 3, "gpt-2");
    CHECK_EQ_INT(gw_load(&w, &v, &err), KP_OK);
    if (v) {
        static const int32_t e[] = {0, 4};
        idvec r = encs(v, "abc", false, false);
        CHECK(ids_eq(r, e, 2));
        free(r.ids);
        kp_tok_vocab_free(v);
    }
    /* an unknown pre-tokenizer is not fatal: default regexes and a warning */
    bpe_tiny(&w, m1, 3, "no-such-pre");
    CHECK_EQ_INT(gw_load(&w, &v, &err), KP_OK);
    if (v) {
        CHECK_EQ_STR(kp_tok_pre_name(v), "default");
        CHECK(kp_tok_pre_warning(v) != NULL && strstr(kp_tok_pre_warning(v), "no-such-pre") != NULL);
        CHECK(kp_tok_warnings(v) != NULL);
        kp_tok_vocab_free(v);
    }
    bpe_tiny(&w, m1, 3, NULL);
    CHECK_EQ_INT(gw_load(&w, &v, &err), KP_OK);
    if (v) {
        CHECK(kp_tok_pre_warning(v) != NULL);
        CHECK(kp_tok_bos(v) == -1 && !kp_tok_add_bos(v)); /* default id 11 is outside 9 tokens */
        kp_tok_vocab_free(v);
    }
}

static void expect_load_error(gw *w, kp_status want, const char *needle, const char *what) {
    kp_tok_vocab *v = (kp_tok_vocab *)1;
    kp_error err = {0};
    kp_status st = gw_load(w, &v, &err);
    CHECK_MSG(st == want, "%s: status %d (%s), expected %d", what, st, err.msg, want);
    CHECK_MSG(v == NULL, "%s: vocabulary returned on error", what);
    CHECK_MSG(strstr(err.msg, needle) != NULL, "%s: message '%s' lacks '%s'", what, err.msg, needle);
    if (st == KP_OK) kp_tok_vocab_free(v);
}

static void test_malformed(void) {
    gw w;
    static const char *const toks[] = {"<unk>", "<s>", "</s>", "a", "b"};
    static const char *const dup[] = {"<unk>", "<s>", "</s>", "a", "a"};
    static const float sc[] = {0, 0, 0, -1, -1};
    static const int32_t ty[] = {2, 3, 3, 1, 1};

    gw_begin(&w);
    kv_str(&w, "tokenizer.ggml.model", "llama");
    expect_load_error(&w, KP_EFORMAT, "tokenizer.ggml.tokens", "missing tokens");

    gw_begin(&w);
    kv_str(&w, "tokenizer.ggml.model", "llama");
    kv_i32s(&w, "tokenizer.ggml.tokens", ty, 5);
    expect_load_error(&w, KP_EFORMAT, "tokenizer.ggml.tokens", "tokens of the wrong type");

    gw_begin(&w);
    kv_str(&w, "tokenizer.ggml.model", "llama");
    kv_strs(&w, "tokenizer.ggml.tokens", toks, 0);
    expect_load_error(&w, KP_EFORMAT, "tokenizer.ggml.tokens", "no tokens");

    gw_begin(&w);
    kv_strs(&w, "tokenizer.ggml.tokens", toks, 5);
    expect_load_error(&w, KP_EFORMAT, "tokenizer.ggml.model", "missing model");

    gw_begin(&w);
    kv_str(&w, "tokenizer.ggml.model", "t5");
    kv_strs(&w, "tokenizer.ggml.tokens", toks, 5);
    expect_load_error(&w, KP_EUNSUPPORTED, "unsupported tokenizer model 't5'", "t5");

    gw_begin(&w);
    kv_str(&w, "tokenizer.ggml.model", "llama");
    kv_strs(&w, "tokenizer.ggml.tokens", toks, 5);
    kv_f32s(&w, "tokenizer.ggml.scores", sc, 4);
    expect_load_error(&w, KP_EFORMAT, "tokenizer.ggml.scores", "short scores");

    gw_begin(&w);
    kv_str(&w, "tokenizer.ggml.model", "llama");
    kv_strs(&w, "tokenizer.ggml.tokens", toks, 5);
    kv_strs(&w, "tokenizer.ggml.scores", toks, 5);
    expect_load_error(&w, KP_EFORMAT, "tokenizer.ggml.scores", "scores of strings");

    gw_begin(&w);
    kv_str(&w, "tokenizer.ggml.model", "llama");
    kv_strs(&w, "tokenizer.ggml.tokens", toks, 5);
    kv_i32s(&w, "tokenizer.ggml.token_type", ty, 3);
    expect_load_error(&w, KP_EFORMAT, "tokenizer.ggml.token_type", "short token types");

    gw_begin(&w);
    kv_str(&w, "tokenizer.ggml.model", "llama");
    kv_strs(&w, "tokenizer.ggml.tokens", dup, 5);
    expect_load_error(&w, KP_EFORMAT, "duplicate token", "duplicate tokens");

    gw_begin(&w);
    kv_str(&w, "tokenizer.ggml.model", "llama");
    kv_strs(&w, "tokenizer.ggml.tokens", toks, 5);
    kv_u32(&w, "tokenizer.ggml.bos_token_id", 5);
    expect_load_error(&w, KP_EFORMAT, "bos_token_id = 5", "bos out of range");

    gw_begin(&w);
    kv_str(&w, "tokenizer.ggml.model", "llama");
    kv_strs(&w, "tokenizer.ggml.tokens", toks, 5);
    kv_u32(&w, "tokenizer.ggml.eos_token_id", 1000);
    expect_load_error(&w, KP_EFORMAT, "eos_token_id", "eos out of range");

    gw_begin(&w);
    kv_str(&w, "tokenizer.ggml.model", "llama");
    kv_strs(&w, "tokenizer.ggml.tokens", toks, 5);
    kv_str(&w, "tokenizer.ggml.bos_token_id", "1");
    expect_load_error(&w, KP_EFORMAT, "bos_token_id", "bos of the wrong type");

    /* 0xFFFFFFFF means "unset" (stories260K uses it): the default stays */
    gw_begin(&w);
    kv_str(&w, "tokenizer.ggml.model", "llama");
    kv_strs(&w, "tokenizer.ggml.tokens", toks, 5);
    kv_u32(&w, "tokenizer.ggml.bos_token_id", 0xFFFFFFFFu);
    kv_u32(&w, "tokenizer.ggml.padding_token_id", 77); /* optional id out of range: a warning */
    kp_tok_vocab *v;
    kp_error err = {0};
    CHECK_EQ_INT(gw_load(&w, &v, &err), KP_OK);
    if (v) {
        CHECK_EQ_INT(kp_tok_bos(v), 1);
        CHECK_EQ_INT(kp_tok_pad(v), -1);
        CHECK(kp_tok_warnings(v) != NULL && strstr(kp_tok_warnings(v), "padding_token_id") != NULL);
        kp_tok_vocab_free(v);
    }

    static const char *const m_ok[] = {"a b"};
    static const char *const m_unknown[] = {"a b", "a zz"};
    static const char *const m_nospace[] = {"ab"};
    bpe_tiny(&w, NULL, 0, "gpt-2");
    expect_load_error(&w, KP_EFORMAT, "tokenizer.ggml.merges", "missing merges");
    bpe_tiny(&w, m_unknown, 2, "gpt-2");
    expect_load_error(&w, KP_EFORMAT, "merge 1 ('a zz')", "merge of an unknown piece");
    bpe_tiny(&w, m_nospace, 1, "gpt-2");
    expect_load_error(&w, KP_EFORMAT, "merge 0", "merge without a space");
    bpe_tiny(&w, m_ok, 1, "gpt-2");
    kv_bool(&w, "tokenizer.ggml.add_bos_token", true); /* no usable bos id in 9 tokens */
    expect_load_error(&w, KP_EFORMAT, "add_bos_token", "add_bos without bos");

    CHECK_EQ_INT(kp_tok_vocab_load(NULL, NULL, NULL), KP_EINVAL);
}

static idvec enc_plain(const kp_tok_vocab *v, const char *text, const kp_tok_range *r, size_t n_r) {
    idvec out = {0};
    kp_error err = {0};
    kp_status st = kp_tok_encode_plain(v, text, strlen(text), false, r, n_r, &out.ids, &out.n, &err);
    CHECK_MSG(st == KP_OK, "kp_tok_encode_plain: %s", err.msg);
    return out;
}

/* kp_tok_encode_plain against kp_tok_encode: no ranges is parse_special,
 * a range over everything is plain text, and a control token's text is a
 * token exactly where it lies outside every range (whole, or cut by a
 * range's edge: then it is text). Every case's expected ids are spelled
 * with kp_tok_encode on the same vocabulary, which test_special_tokens
 * holds to llama.cpp. */
static void test_encode_plain(void) {
    kp_tok_vocab *g = load_vocab("gpt-2");
    if (g) {
        const char *t = "Hi<|endoftext|> a <|endoftext|>b";
        size_t n = strlen(t);
        idvec special = encs(g, t, false, true), text = encs(g, t, false, false);
        idvec none = enc_plain(g, t, NULL, 0);
        kp_tok_range all = {0, n};
        idvec whole = enc_plain(g, t, &all, 1);
        CHECK(none.n == special.n && !memcmp(none.ids, special.ids, none.n * sizeof *none.ids));
        CHECK(whole.n == text.n && !memcmp(whole.ids, text.ids, whole.n * sizeof *whole.ids));
        /* the second control text is the client's: only the first is a token */
        kp_tok_range second = {15, n - 15}; /* " a <|endoftext|>b" */
        idvec mixed = enc_plain(g, t, &second, 1);
        idvec head = encs(g, "Hi", false, false), tail = encs(g, " a <|endoftext|>b", false, false);
        static const int32_t eot[] = {50256};
        idvec want = cat3(head, eot, 1, tail);
        CHECK(ids_eq(mixed, want.ids, want.n));
        /* a range that cuts the first control text: text too */
        kp_tok_range cut = {5, 1}, ranges2[2] = {{5, 1}, {20, 2}};
        idvec c1 = enc_plain(g, t, &cut, 1);
        int n_eot = 0;
        for (size_t i = 0; i < c1.n; i++) n_eot += c1.ids[i] == 50256;
        CHECK_EQ_INT(n_eot, 1); /* the second one, outside every range, is still a token */
        idvec c2 = enc_plain(g, t, ranges2, 2);
        CHECK(!idvec_has(c2, 50256));
        /* ranges out of order, overlapping or past the text are refused */
        kp_tok_range bad1[2] = {{10, 2}, {5, 1}}, bad2 = {n - 1, 2}, bad3[2] = {{3, 4}, {5, 2}};
        int32_t *ids = NULL;
        size_t ni = 0;
        kp_error err = {0};
        CHECK(kp_tok_encode_plain(g, t, n, false, bad1, 2, &ids, &ni, &err) == KP_EINVAL && !ids);
        CHECK(kp_tok_encode_plain(g, t, n, false, &bad2, 1, &ids, &ni, &err) == KP_EINVAL && !ids);
        CHECK(kp_tok_encode_plain(g, t, n, false, bad3, 2, &ids, &ni, &err) == KP_EINVAL && !ids);
        free(special.ids), free(text.ids), free(none.ids), free(whole.ids), free(mixed.ids);
        free(head.ids), free(tail.ids), free(want.ids), free(c1.ids), free(c2.ids);
        kp_tok_vocab_free(g);
    }
    kp_tok_vocab *st = load_stories();
    if (st) { /* SentencePiece: </s> and <s> in the client's text stay text */
        const char *t = "<s>user: a </s> b <s>";
        kp_tok_range client = {9, strlen(t) - 9};
        idvec r = enc_plain(st, t, &client, 1);
        CHECK(r.n > 2 && r.ids[0] == kp_tok_bos(st));
        int controls = 0;
        for (size_t i = 1; i < r.n; i++) controls += r.ids[i] == kp_tok_bos(st) || r.ids[i] == kp_tok_eos(st);
        CHECK_EQ_INT(controls, 0);
        free(r.ids);
        kp_tok_vocab_free(st);
    }
}

int main(void) {
    RUN(test_encode_plain);
    RUN(test_upstream_vectors);
    RUN(test_golden_vectors);
    RUN(test_golden_prompts);
    RUN(test_properties);
    RUN(test_bert_refused);
    RUN(test_special_tokens);
    RUN(test_roundtrip);
    RUN(test_detokenize_rules);
    RUN(test_stream_bytes);
    RUN(test_invalid_input);
    RUN(test_long_inputs);
    RUN(test_spm_word_cuts);
    RUN(test_tiny_spm);
    RUN(test_tiny_bpe);
    RUN(test_malformed);
    return harness_finish("tok");
}
