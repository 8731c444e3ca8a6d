/*
 * chat_calls.c - the way back: tool calls read out of generated text, the
 * holdback of streamed text that may still become a call, and the form of
 * a forced call (chat.h: kp_chat_parse_tool_calls, kp_chat_tool_holdback,
 * kp_chat_call_form_build).
 *
 * Owns no state. One left-to-right scan cuts a text into content and
 * call blocks for both the parser and the holdback, so they cannot
 * disagree; its comment below draws the block layout of each family.
 */
#include "serve/chat.h"

#include <assert.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "base/rng.h"
#include "base/canon.h"
#include "serve/chat_impl.h"

/* ------------------------------------------------------------------ */
/* Tool calls in generated text                                        */
/*
 * The text is cut into blocks by one left-to-right scan that both the
 * parser and the holdback use, so they always agree on where a call
 * starts and ends. Qwen (Hermes layout):
 *
 *   content ... <tool_call>  ws  {json object}  ws  </tool_call>  ws  <tool_call> ...
 *               ^ block start    ^js           ^je                ^ block end
 *
 * The object's extent is found by counting braces and brackets outside
 * strings (jansson then parses exactly text[js..je)); a '<' outside a
 * string cannot be JSON and ends the attempt at once, so a missing '}'
 * does not swallow the next block. At each '<' the scan asks
 * hermes_block what starts there:
 *
 *   MARK_NONE   not a block (the tag or what follows it does not match);
 *               resume where the mismatch was
 *   MARK_OPEN   the text ends inside what may still become a block
 *   MARK_DONE   a block with a complete object; its end is after
 *               "</tool_call>", or the end of the text when the closing
 *               tag is missing or cut off
 *
 * A DONE block whose object is a well-formed call extends the current run
 * of calls; anything else that is not whitespace (content, a malformed
 * block) starts the run over. The calls are the run left at the end of the
 * text. Each decision depends only on the bytes up to the point where it
 * is made, and an OPEN block at the end counts as a possible call for the
 * holdback, so the holdback of a prefix never passes the run of the whole
 * text and never moves back as the text grows.
 *
 * The generic format uses the same scan with blocks that start at '{'
 * (generic_block: the object {"tool_calls": [...]}, whose calls are
 * checked and returned together).
 *
 * Llama 3.1 has no markup: the message is calls from its first byte or
 * not at all, so its scan walks objects from the start (after whitespace
 * and an optional <|python_tag|>), ';' and whitespace between them.
 *
 * Compared with the reference parsers (llama.cpp common/chat-parser.cpp,
 * vLLM's hermes and llama3_json parsers):
 *   - Qwen: llama.cpp also takes bare JSON, <function=name>, <tools>,
 *     ```json fences and text between calls (for Hermes 2 Pro fine-tunes);
 *     kvpin reads only the <tool_call> blocks the Qwen templates teach, and
 *     since the content is a prefix of the text, only calls that end the
 *     message. Like vLLM, kvpin reads a complete object whose closing tag
 *     is missing at the end of the text; llama.cpp returns such a text as
 *     content once generation has finished.
 *   - Llama 3.1: llama.cpp reads one call at the start of the message,
 *     with "parameters" (optionally after "type": "function") and the rest
 *     as content; vLLM reads several separated by "; " and accepts
 *     "arguments". kvpin reads several, separated by ';' and/or whitespace,
 *     under either key, and only when they are the whole message. The
 *     built-in tool form <|python_tag|>name.call(...) is content: kvpin
 *     renders no built-in tools.
 *   - one malformed call makes llama.cpp and vLLM return the whole text as
 *     content; kvpin keeps the calls that follow it (Qwen).
 */

#define TOOL_CALL_OPEN "<tool_call>"
#define TOOL_CALL_CLOSE "</tool_call>"
#define PYTHON_TAG "<|python_tag|>"

static bool ascii_space(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

static size_t skip_space(const char *t, size_t len, size_t i) {
    while (i < len && ascii_space(t[i])) i++;
    return i;
}

/* The length of t[0..n) without its trailing ASCII whitespace. */
static size_t rtrim_len(const char *t, size_t n) {
    while (n > 0 && ascii_space(t[n - 1])) n--;
    return n;
}

static bool all_space(const char *t, size_t from, size_t to) {
    return skip_space(t, to, from) == to;
}

typedef enum { MARK_NONE, MARK_OPEN, MARK_DONE } chat_mark;

/* Does the literal lit occur at t[i]? MARK_DONE with *at after it; MARK_OPEN
 * when the text ends inside it; MARK_NONE with *at on the first mismatch. */
static chat_mark match_literal(const char *t, size_t len, size_t i, const char *lit, size_t *at) {
    for (size_t k = 0; lit[k]; k++) {
        if (i + k == len) return MARK_OPEN;
        if (t[i + k] != lit[k]) {
            *at = i + k;
            return MARK_NONE;
        }
    }
    *at = i + strlen(lit);
    return MARK_DONE;
}

/* The JSON object starting with the '{' at t[js]: MARK_DONE with *je after
 * its closing brace, MARK_OPEN when the text ends first, MARK_NONE with *je
 * on a '<' outside strings. Only the nesting is checked here. */
static chat_mark json_extent(const char *t, size_t len, size_t js, size_t *je) {
    return (chat_mark)kp_chat_json_extent(t, len, js, je);
}

int kp_chat_json_extent(const char *t, size_t len, size_t js, size_t *je) {
    assert(js < len && t[js] == '{');
    size_t depth = 0;
    bool in_string = false, escaped = false;
    for (size_t i = js; i < len; i++) {
        char c = t[i];
        if (in_string) {
            if (escaped) escaped = false;
            else if (c == '\\') escaped = true;
            else if (c == '"') in_string = false;
        } else if (c == '"') {
            in_string = true;
        } else if (c == '{' || c == '[') {
            depth++;
        } else if (c == '}' || c == ']') {
            if (--depth == 0) {
                *je = i + 1;
                return MARK_DONE;
            }
        } else if (c == '<') {
            *je = i;
            return MARK_NONE;
        }
    }
    return MARK_OPEN;
}

/* What starts at the '<' at t[i] (see the comment above). DONE: the block
 * is t[i..*end) and its object t[*js..*je). NONE: *next (> i) is where to
 * look for the next block. */
static chat_mark hermes_block(const char *t, size_t len, size_t i, size_t *js, size_t *je,
                              size_t *end, size_t *next) {
    size_t at = i + 1;
    chat_mark m = match_literal(t, len, i, TOOL_CALL_OPEN, &at);
    if (m != MARK_DONE) {
        *next = at > i ? at : i + 1;
        return m;
    }
    at = skip_space(t, len, at);
    if (at == len) return MARK_OPEN;
    if (t[at] != '{') {
        *next = at;
        return MARK_NONE;
    }
    *js = at;
    m = json_extent(t, len, at, je);
    if (m != MARK_DONE) {
        *next = *je;
        return m;
    }
    at = skip_space(t, len, *je);
    size_t close_end = 0;
    m = match_literal(t, len, at, TOOL_CALL_CLOSE, &close_end);
    if (at == len || m == MARK_OPEN) {
        *end = len; /* closing tag missing or cut off: the object is complete */
        return MARK_DONE;
    }
    if (m == MARK_NONE) {
        *next = close_end;
        return MARK_NONE;
    }
    *end = close_end;
    return MARK_DONE;
}

/* The generic format's block at the '{' at t[i]: the object
 * {"tool_calls": [...]} ("tool_calls" its first member, JSON whitespace
 * allowed between the tokens), as hermes_block says it. */
static chat_mark generic_block(const char *t, size_t len, size_t i, size_t *js, size_t *je,
                               size_t *end, size_t *next) {
    static const char *const header[] = {"\"tool_calls\"", ":", "["};
    size_t at = i + 1;
    *next = i + 1;
    for (size_t k = 0; k < 3; k++) {
        at = skip_space(t, len, at);
        if (at == len) return MARK_OPEN;
        chat_mark m = match_literal(t, len, at, header[k], &at);
        if (m != MARK_DONE) return m;
    }
    *js = i;
    chat_mark m = json_extent(t, len, i, je);
    if (m == MARK_NONE) *next = *je > i ? *je : i + 1;
    if (m == MARK_DONE) *end = *je;
    return m;
}

static bool generic_family(kp_chat_family f) {
    return f > KP_CHAT_UNKNOWN && f < KP_CHAT_FAMILY_COUNT && !kp_chat_family_has_tools(f);
}

/* A decoded call: the name (a borrowed view into the parsed object) and
 * the arguments as owned canonical JSON. */
typedef struct {
    json_t *object; /* the parsed call object, owned */
    const char *name;
    size_t name_len;
    char *args; /* owned */
    size_t args_len;
} chat_decoded;

static void decoded_free(chat_decoded *d) {
    json_decref(d->object);
    free(d->args);
    memset(d, 0, sizeof *d);
}

/* The call value obj (a reference the function takes over): *ok says
 * whether it is a well-formed call; when out is non-NULL and *ok, out
 * receives it (the caller frees it with decoded_free). KP_ENOMEM only. */
static kp_status decode_value(json_t *obj, kp_chat_family f, bool *ok, chat_decoded *out) {
    *ok = false;
    const json_t *name = json_object_get(obj, "name");
    const char *own = f == KP_CHAT_LLAMA31 ? "parameters" : "arguments";
    const char *other = f == KP_CHAT_LLAMA31 ? "arguments" : "parameters";
    const json_t *args = json_object_get(obj, own);
    if (!args) args = json_object_get(obj, other);
    char *canon = NULL;
    size_t canon_len = 0;
    kp_status st = KP_OK;
    if (json_is_object(obj) && json_is_string(name) && json_string_length(name) > 0) {
        if (!args || json_is_null(args)) {
            canon = malloc(3);
            if (!canon) st = KP_ENOMEM;
            else memcpy(canon, "{}", 3), canon_len = 2;
        } else if (json_is_object(args)) {
            st = kp_canon_dump(args, &canon, &canon_len, NULL);
        } else if (json_is_string(args)) {
            /* arguments written as a JSON text, the OpenAI wire form */
            st = kp_canon_text(json_string_value(args), json_string_length(args), &canon,
                               &canon_len, NULL);
            if (st == KP_OK && canon[0] != '{') {
                free(canon);
                canon = NULL;
            }
        }
        /* too deep, or otherwise not canonicalizable: not a call */
        if (st != KP_OK && st != KP_ENOMEM) st = KP_OK;
    }
    if (st == KP_OK && canon) {
        *ok = true;
        if (out) {
            out->object = obj;
            out->name = json_string_value(name);
            out->name_len = json_string_length(name);
            out->args = canon;
            out->args_len = canon_len;
            return KP_OK;
        }
    }
    free(canon);
    json_decref(obj);
    return st;
}

/* JSON text t[0..len) parsed as kvpin reads calls: NULL when it is not
 * JSON (*st KP_OK) or memory ran out (*st KP_ENOMEM). */
static json_t *load_call_json(const char *t, size_t len, kp_status *st) {
    json_error_t jerr;
    json_t *v = json_loadb(t, len, JSON_DECODE_INT_AS_REAL | JSON_REJECT_DUPLICATES, &jerr);
    *st = !v && json_error_code(&jerr) == json_error_out_of_memory ? KP_ENOMEM : KP_OK;
    return v;
}

/* The call object t[0..len), as decode_value. */
static kp_status decode_call(const char *t, size_t len, kp_chat_family f, bool *ok,
                             chat_decoded *out) {
    kp_status st;
    json_t *obj = load_call_json(t, len, &st);
    *ok = false;
    return obj ? decode_value(obj, f, ok, out) : st;
}

/* The generic block object t[0..len): *ok when it is an object whose
 * "tool_calls" is a non-empty array of well-formed calls. KP_ENOMEM only. */
static kp_status generic_check(const char *t, size_t len, bool *ok) {
    kp_status st;
    json_t *obj = load_call_json(t, len, &st);
    const json_t *arr = json_object_get(obj, "tool_calls");
    *ok = json_array_size(arr) > 0;
    for (size_t k = 0; *ok && st == KP_OK && k < json_array_size(arr); k++)
        st = decode_value(json_incref(json_array_get(arr, k)), KP_CHAT_UNKNOWN, ok, NULL);
    json_decref(obj);
    if (st != KP_OK) *ok = false;
    return st;
}

/* The objects of the calls found, as spans text[js..je) of the text. */
typedef struct {
    struct {
        size_t js, je;
    } *v;
    size_t n, cap;
} chat_spans;

static bool spans_push(chat_spans *s, size_t js, size_t je) {
    if (!kp_grow((void **)&s->v, &s->cap, s->n + 1, sizeof *s->v)) return false;
    s->v[s->n].js = js;
    s->v[s->n].je = je;
    s->n++;
    return true;
}

static void spans_free(chat_spans *s) {
    free(s->v);
    memset(s, 0, sizeof *s);
}

/* Where the scan for Qwen calls starts: after a leading <think>...</think>
 * for qwen3 (len when that block is never closed: no call can follow). */
static size_t hermes_scan_start(kp_chat_family f, const char *t, size_t len) {
    if (f != KP_CHAT_QWEN3) return 0;
    size_t i = skip_space(t, len, 0), at;
    if (match_literal(t, len, i, "<think>", &at) != MARK_DONE) return 0;
    const char *close = kp_chat_find(t + at, len - at, "</think>");
    return close ? (size_t)(close - t) + strlen("</think>") : len;
}

/* The scan of Qwen blocks (see the comment at the top of this section).
 * complete: the text is final (an OPEN block is content) rather than still
 * growing (an OPEN block may become a call). Returns the start of the run
 * of calls that ends the text, or SIZE_MAX when there is none; with spans
 * non-NULL, the run's objects go there. KP_ENOMEM only. */
static kp_status hermes_scan(kp_chat_family f, const char *t, size_t len, bool complete,
                             size_t *run, chat_spans *spans) {
    size_t from = hermes_scan_start(f, t, len);
    size_t pos = from, prev_end = from;
    bool generic = generic_family(f); /* blocks start at '{' (generic_block) */
    *run = SIZE_MAX;
    while (pos < len) {
        const char *lt = memchr(t + pos, generic ? '{' : '<', len - pos);
        if (!lt) break;
        size_t i = (size_t)(lt - t), js = 0, je = 0, end = 0, next = i + 1;
        chat_mark m = generic ? generic_block(t, len, i, &js, &je, &end, &next)
                              : hermes_block(t, len, i, &js, &je, &end, &next);
        if (m == MARK_NONE) {
            assert(next > i);
            pos = next;
            continue;
        }
        if (!all_space(t, prev_end, i)) *run = SIZE_MAX;
        if (m == MARK_OPEN) {
            if (complete) *run = SIZE_MAX;
            else if (*run == SIZE_MAX) *run = i;
            return KP_OK;
        }
        bool ok = false;
        if ((generic ? generic_check(t + js, je - js, &ok) : decode_call(t + js, je - js, f, &ok, NULL)) !=
            KP_OK)
            return KP_ENOMEM;
        if (!ok) {
            *run = SIZE_MAX;
        } else {
            if (*run == SIZE_MAX) {
                *run = i;
                if (spans) spans->n = 0;
            }
            if (spans && !spans_push(spans, js, je)) return KP_ENOMEM;
        }
        prev_end = pos = end;
    }
    if (!all_space(t, prev_end, len)) *run = SIZE_MAX;
    return KP_OK;
}

/* The Llama 3.1 message: calls from its first byte, or none. Same contract
 * as hermes_scan; the run, when there is one, starts at 0. */
static kp_status llama31_scan(const char *t, size_t len, bool complete, size_t *run,
                              chat_spans *spans) {
    *run = SIZE_MAX;
    size_t at = skip_space(t, len, 0), next = 0;
    if (at == len) {
        if (!complete) *run = 0;
        return KP_OK;
    }
    if (t[at] == '<') {
        chat_mark m = match_literal(t, len, at, PYTHON_TAG, &next);
        if (m == MARK_OPEN && !complete) *run = 0;
        if (m != MARK_DONE) return KP_OK;
        at = skip_space(t, len, next);
    }
    size_t n_calls = 0;
    for (;;) {
        if (at == len) {
            if (!complete || n_calls > 0) *run = 0;
            return KP_OK;
        }
        if (t[at] != '{') return KP_OK;
        size_t je = 0;
        chat_mark m = json_extent(t, len, at, &je);
        if (m == MARK_OPEN && !complete) *run = 0;
        if (m != MARK_DONE) return KP_OK;
        bool ok = false;
        if (decode_call(t + at, je - at, KP_CHAT_LLAMA31, &ok, NULL) != KP_OK) return KP_ENOMEM;
        if (!ok) return KP_OK;
        if (spans && !spans_push(spans, at, je)) return KP_ENOMEM;
        n_calls++;
        at = je;
        while (at < len && (ascii_space(t[at]) || t[at] == ';')) at++;
    }
}

static kp_status scan_calls(kp_chat_family f, const char *t, size_t len, bool complete,
                            size_t *run, chat_spans *spans) {
    if (f == KP_CHAT_LLAMA31) return llama31_scan(t, len, complete, run, spans);
    return hermes_scan(f, t, len, complete, run, spans);
}

/* "call_" and 24 characters of [A-Za-z0-9] from splitmix64 draws seeded by
 * the seed and the index. */
static void tool_call_id(uint64_t seed, size_t index, char out[5 + 24 + 1]) {
    static const char alphabet[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    uint64_t state = seed ^ ((uint64_t)index * 0xD1B54A32D192ED03ull);
    memcpy(out, "call_", 5);
    for (int draw = 0; draw < 4; draw++) {
        uint64_t z = kp_splitmix64(&state);
        for (int k = 0; k < 6; k++) {
            out[5 + draw * 6 + k] = alphabet[z % 62];
            z /= 62;
        }
    }
    out[29] = 0;
}

/* {"id", "type": "function", "function": {"name", "arguments"}} or NULL. */
static json_t *tool_call_object(const chat_decoded *d, uint64_t seed, size_t index) {
    return kp_chat_call_object(d->name, d->name_len, d->args, d->args_len, seed, index);
}

json_t *kp_chat_call_object(const char *name, size_t name_len, const char *args, size_t args_len, uint64_t seed,
                            size_t index) {
    char id[30];
    tool_call_id(seed, index, id);
    json_t *fn = json_object(), *call = json_object();
    bool ok = fn && call && !json_object_set_new(call, "id", json_string(id)) &&
              !json_object_set_new(call, "type", json_string("function")) &&
              !json_object_set_new(fn, "name", json_stringn(name, name_len)) &&
              !json_object_set_new(fn, "arguments", json_stringn(args, args_len));
    if (ok && !json_object_set_new(call, "function", fn)) return call;
    if (!ok) json_decref(fn);
    json_decref(call);
    return NULL;
}

static kp_status parse_oom(kp_error *err) {
    return kp_fail(err, KP_ENOMEM, "out of memory reading tool calls");
}

kp_status kp_chat_parse_tool_calls(kp_chat_family f, const char *text, size_t len,
                                   uint64_t id_seed, json_t **calls, size_t *content_len,
                                   kp_error *err) {
    *calls = NULL;
    *content_len = len;
    if (!kp_chat_family_has_tools(f) && !generic_family(f)) return KP_OK;
    chat_spans spans = {0};
    size_t run = SIZE_MAX;
    if (scan_calls(f, text, len, true, &run, &spans) != KP_OK) {
        spans_free(&spans);
        return parse_oom(err);
    }
    if (run == SIZE_MAX) {
        spans_free(&spans);
        *content_len = rtrim_len(text, len);
        return KP_OK;
    }
    assert(spans.n > 0);
    json_t *arr = json_array();
    kp_status st = arr ? KP_OK : KP_ENOMEM;
    for (size_t k = 0; st == KP_OK && k < spans.n; k++) {
        const char *js = text + spans.v[k].js;
        size_t jlen = spans.v[k].je - spans.v[k].js;
        /* a generic block holds an array of calls, a native one a call */
        json_t *block = generic_family(f) ? load_call_json(js, jlen, &st) : NULL;
        const json_t *list = json_object_get(block, "tool_calls");
        size_t n_in = block ? json_array_size(list) : 1;
        if (generic_family(f) && !block && st == KP_OK) st = KP_ENOMEM; /* parsed by the scan */
        for (size_t j = 0; st == KP_OK && j < n_in; j++) {
            chat_decoded d = {0};
            bool ok = false;
            st = block ? decode_value(json_incref(json_array_get(list, j)), f, &ok, &d)
                       : decode_call(js, jlen, f, &ok, &d);
            assert(st != KP_OK || ok); /* the scan accepted it */
            if (st != KP_OK) break;
            json_t *call = tool_call_object(&d, id_seed, json_array_size(arr));
            decoded_free(&d);
            if (!call || json_array_append_new(arr, call)) st = KP_ENOMEM;
        }
        json_decref(block);
    }
    spans_free(&spans);
    if (st != KP_OK) {
        json_decref(arr);
        return parse_oom(err);
    }
    *calls = arr;
    *content_len = rtrim_len(text, run);
    return KP_OK;
}

size_t kp_chat_tool_holdback(kp_chat_family f, const char *text, size_t len) {
    if (!kp_chat_family_has_tools(f) && !generic_family(f)) return len;
    size_t run = SIZE_MAX;
    /* out of memory parsing a block's JSON: hold everything from the start
     * of the run it might belong to, which is never wrong, only late */
    if (scan_calls(f, text, len, false, &run, NULL) != KP_OK) return 0;
    return rtrim_len(text, run == SIZE_MAX ? len : run);
}

/* ------------------------------------------------------------------ */
/* What a forced call looks like                                       */

void kp_chat_call_form_free(kp_chat_call_form *form) {
    if (!form) return;
    free(form->prefix);
    free(form->suffix);
    json_decref(form->schema);
    memset(form, 0, sizeof *form);
}

static bool form_literal(char **out, size_t *len, const char *s) {
    *len = strlen(s);
    *out = strdup(s);
    return *out != NULL;
}

static int strcmp_ptr(const char *const *a, const char *const *b) { return strcmp(*a, *b); }

/* A copy of schema with every "properties" in key order and objects with
 * properties closed (additionalProperties false) unless they say. */
json_t *kp_chat_forced_schema(const json_t *schema) {
    if (json_is_array(schema)) {
        json_t *a = json_array();
        size_t i;
        const json_t *v;
        json_array_foreach(schema, i, v) json_array_append_new(a, kp_chat_forced_schema(v));
        return a;
    }
    if (!json_is_object(schema)) return json_deep_copy(schema);
    json_t *o = json_object();
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)schema, k, v) {
        if (!strcmp(k, "properties") && json_is_object(v)) {
            size_t n = json_object_size(v), j = 0;
            const char **keys = malloc((n ? n : 1) * sizeof *keys);
            const char *pk;
            json_t *pv;
            json_object_foreach(v, pk, pv) if (keys) keys[j++] = pk;
            if (keys) {
                qsort(keys, n, sizeof *keys, (int (*)(const void *, const void *))strcmp_ptr);
                json_t *props = json_object();
                for (j = 0; j < n; j++) json_object_set_new(props, keys[j], kp_chat_forced_schema(json_object_get(v, keys[j])));
                json_object_set_new(o, k, props);
                free(keys);
            }
        } else if (!strcmp(k, "enum") || !strcmp(k, "const") || !strcmp(k, "default") || !strcmp(k, "examples")) {
            json_object_set_new(o, k, json_deep_copy(v)); /* values, not schemas */
        } else {
            json_object_set_new(o, k, kp_chat_forced_schema(v));
        }
    }
    if (json_object_get(o, "properties") && !json_object_get(o, "additionalProperties"))
        json_object_set_new(o, "additionalProperties", json_false());
    return o;
}

/* The schema of one call of tool t (tools[i]): name as const, the
 * arguments under key as the tool's parameters schema (an object schema:
 * "type": "object" is added when the schema has no type; none at all is an
 * empty parameter list) into *out. */
static kp_status form_call_schema(const json_t *t, size_t i, const char *key, json_t **out,
                                  kp_error *err) {
    const json_t *fn = json_object_get(t, "function");
    const json_t *params = json_object_get(fn, "parameters");
    json_t *args;
    if (!params || json_is_null(params)) {
        args = json_pack("{s:s, s:{}, s:b}", "type", "object", "properties", "additionalProperties", 0);
    } else if (!json_is_object(params)) {
        return kp_fail(err, KP_EINVAL, "tools[%zu].function.parameters must be a JSON Schema object",
                       i);
    } else {
        const json_t *type = json_object_get(params, "type");
        bool object = !type || (json_is_string(type) && !strcmp(json_string_value(type), "object"));
        for (size_t k = 0; json_is_array(type) && k < json_array_size(type); k++) {
            const json_t *x = json_array_get(type, k);
            object = object || (json_is_string(x) && !strcmp(json_string_value(x), "object"));
        }
        if (!object)
            return kp_fail(err, KP_EINVAL,
                           "tools[%zu].function.parameters: the arguments of a call are a JSON "
                           "object, so the schema's type must be \"object\"",
                           i);
        args = kp_chat_forced_schema(params); /* arguments written back in key order */
        if (args && !type) json_object_set_new(args, "type", json_string("object"));
        else if (args && json_is_array(type)) json_object_set_new(args, "type", json_string("object"));
    }
    json_t *call = args ? json_pack("{s:s, s:{s:{s:O}, s:o}, s:[s,s], s:b}", "type", "object",
                                    "properties", "name", "const", json_object_get(fn, "name"),
                                    key, args, "required", "name", key,
                                    "additionalProperties", 0)
                        : NULL;
    *out = call;
    return call ? KP_OK : kp_chat_oom(err);
}

kp_status kp_chat_call_form_build(kp_chat_family f, const json_t *tools, const char *name,
                                  bool parallel, kp_chat_call_form *form, kp_error *err) {
    memset(form, 0, sizeof *form);
    if ((unsigned)f >= KP_CHAT_FAMILY_COUNT || f == KP_CHAT_UNKNOWN)
        return kp_fail(err, KP_EUNSUPPORTED, "unknown chat template family");
    if (!json_is_array(tools) || json_array_size(tools) == 0)
        return kp_fail(err, KP_EINVAL, "tools: forcing a call needs a non-empty tools array");
    const char *key = f == KP_CHAT_LLAMA31 ? "parameters" : "arguments";
    json_t *any = json_array();
    if (!any) return kp_chat_oom(err);
    kp_status st = KP_OK;
    for (size_t i = 0; st == KP_OK && i < json_array_size(tools); i++) {
        const json_t *t = json_array_get(tools, i), *type = json_object_get(t, "type");
        const json_t *fn = json_object_get(t, "function");
        const json_t *fname = json_object_get(fn, "name");
        if (!json_is_object(t) || !json_is_object(fn) || !json_is_string(fname) ||
            json_string_length(fname) == 0 ||
            (type && !(json_is_string(type) && !strcmp(json_string_value(type), "function")))) {
            st = kp_fail(err, KP_EINVAL,
                         "tools[%zu] must be {\"type\": \"function\", \"function\": {\"name\": ...}}",
                         i);
            break;
        }
        if (name && strcmp(json_string_value(fname), name) != 0) continue;
        json_t *call = NULL;
        st = form_call_schema(t, i, key, &call, err);
        if (st == KP_OK && json_array_append_new(any, call)) st = kp_chat_oom(err);
    }
    if (st == KP_OK && json_array_size(any) == 0)
        st = kp_fail(err, KP_EINVAL, "tool_choice: no function named \"%.64s\" in tools", name);
    json_t *one = NULL;
    if (st == KP_OK) {
        one = json_array_size(any) == 1 ? json_incref(json_array_get(any, 0))
                                        : json_pack("{s:O}", "anyOf", any);
        if (!one) st = kp_chat_oom(err);
    }
    json_decref(any);
    if (st != KP_OK) return st;
    bool ok;
    if (kp_chat_family_has_tools(f)) { /* one call in the template's own syntax */
        bool qwen = f != KP_CHAT_LLAMA31;
        form->schema = one;
        ok = form_literal(&form->prefix, &form->prefix_len, qwen ? TOOL_CALL_OPEN "\n" : "") &&
             form_literal(&form->suffix, &form->suffix_len, qwen ? "\n" TOOL_CALL_CLOSE : "");
    } else {
        form->schema = json_pack("{s:s, s:{s:{s:s, s:o, s:i}}, s:[s], s:b}", "type", "object",
                                 "properties", "tool_calls", "type", "array", "items", one,
                                 "minItems", 1, "required", "tool_calls",
                                 "additionalProperties", 0);
        if (form->schema && !parallel)
            json_object_set_new(json_object_get(json_object_get(form->schema, "properties"),
                                                "tool_calls"),
                                "maxItems", json_integer(1));
        ok = form->schema && form_literal(&form->prefix, &form->prefix_len, "") &&
             form_literal(&form->suffix, &form->suffix_len, "");
    }
    if (!ok) {
        kp_chat_call_form_free(form);
        return kp_chat_oom(err);
    }
    return KP_OK;
}

