/*
 * volatile.c - volatile system text dropped from prompts (volatile.h).
 *
 * Owns the compiled patterns (immutable after kp_volatile_new, so any
 * number of threads strip at once; each match gets its own match data).
 * kp_volatile_strip walks the system messages twice at most: once to see
 * whether anything matches (the common case is no: the messages are
 * returned as they are, no copy), then on a deep copy to cut.
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "serve/volatile.h"

#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The known clients' per-session text: a name for the report, the
 * expression, and what it is. */
static const struct {
    const char *name;
    const char *regex;
} VOLATILE_BUILTINS[] = {
    /* Claude Code: the first system block, one line whose tail changes with
     * each session's first prompt (CLAUDE_CODE_ATTRIBUTION_HEADER=0 turns it
     * off in the client) */
    {"claude-code-billing", "x-anthropic-billing-header:[^\\n]*\\n?"},
};

struct kp_volatile {
    uint32_t n;
    pcre2_code *code[KP_VOLATILE_MAX];
    char *name[KP_VOLATILE_MAX];
};

static kp_status add(kp_volatile *v, const char *name, const char *regex, kp_error *err) {
    if (v->n == KP_VOLATILE_MAX)
        return kp_fail(err, KP_ERANGE, "more than %d volatile patterns", KP_VOLATILE_MAX);
    int ec;
    PCRE2_SIZE off;
    pcre2_code *c = pcre2_compile((PCRE2_SPTR)regex, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_ANCHORED, &ec, &off,
                                  NULL);
    if (!c) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(ec, msg, sizeof msg);
        return kp_fail(err, KP_EINVAL, "volatile pattern \"%.200s\": %s at offset %zu", regex, (const char *)msg,
                       (size_t)off);
    }
    char *nm = strdup(name);
    if (!nm) {
        pcre2_code_free(c);
        return kp_fail(err, KP_ENOMEM, "out of memory for a volatile pattern");
    }
    v->code[v->n] = c;
    v->name[v->n] = nm;
    v->n++;
    return KP_OK;
}

kp_status kp_volatile_new(kp_volatile **out, bool builtins, const char *const *patterns, size_t n, kp_error *err) {
    *out = NULL;
    kp_volatile *v = calloc(1, sizeof *v);
    if (!v) return kp_fail(err, KP_ENOMEM, "out of memory for the volatile patterns");
    kp_status st = KP_OK;
    for (size_t i = 0; builtins && st == KP_OK && i < sizeof VOLATILE_BUILTINS / sizeof *VOLATILE_BUILTINS; i++)
        st = add(v, VOLATILE_BUILTINS[i].name, VOLATILE_BUILTINS[i].regex, err);
    for (size_t i = 0; st == KP_OK && i < n; i++) st = add(v, patterns[i], patterns[i], err);
    if (st != KP_OK) {
        kp_volatile_free(v);
        return st;
    }
    *out = v;
    return KP_OK;
}

void kp_volatile_free(kp_volatile *v) {
    if (!v) return;
    for (uint32_t i = 0; i < v->n; i++) {
        pcre2_code_free(v->code[i]);
        free(v->name[i]);
    }
    free(v);
}

uint32_t kp_volatile_count(const kp_volatile *v) { return v ? v->n : 0; }

const char *kp_volatile_name(const kp_volatile *v, uint32_t i) { return v && i < v->n ? v->name[i] : NULL; }

/* The bytes of text[0..len) the patterns take from its start, applied in
 * turn until none matches (a pattern can only shorten the text, so this
 * ends); *mask gets the patterns that matched. */
static size_t volatile_span(const kp_volatile *v, const char *text, size_t len, uint32_t *mask) {
    size_t cut = 0;
    bool again = true;
    /* one pair: only where the whole match ends is read (PCRE2 fills what fits) */
    pcre2_match_data *md = pcre2_match_data_create(1, NULL);
    if (!md) return 0;
    while (again && cut < len) {
        again = false;
        for (uint32_t i = 0; i < v->n; i++) {
            int rc = pcre2_match(v->code[i], (PCRE2_SPTR)(text + cut), len - cut, 0, 0, md, NULL);
            size_t end = rc >= 0 ? pcre2_get_ovector_pointer(md)[1] : 0;
            if (end > 0) {
                cut += end;
                *mask |= 1u << i;
                again = true;
            }
        }
    }
    pcre2_match_data_free(md);
    return cut;
}

/* The text of a string value without its volatile start, when it has one:
 * true with *cut > 0. */
static bool strip_text(const kp_volatile *v, const json_t *s, size_t *cut, uint32_t *mask) {
    *cut = json_is_string(s) ? volatile_span(v, json_string_value(s), json_string_length(s), mask) : 0;
    return *cut > 0;
}

/* One system message's content (a string, or an array of parts): counts
 * what matches; when edit, cuts it in place (the content then may be left
 * "" or [] for the caller to drop). */
static void strip_content(const kp_volatile *v, json_t *msg, bool edit, kp_volatile_report *rep) {
    json_t *content = json_object_get(msg, "content");
    size_t cut;
    if (json_is_string(content)) {
        if (!strip_text(v, content, &cut, &rep->patterns)) return;
        rep->texts++;
        rep->bytes += (uint32_t)cut;
        if (edit)
            json_object_set_new(msg, "content", json_stringn(json_string_value(content) + cut,
                                                             json_string_length(content) - cut));
        return;
    }
    for (size_t i = 0; json_is_array(content) && i < json_array_size(content);) {
        json_t *part = json_array_get(content, i);
        json_t *text = json_object_get(part, "text");
        if (!strip_text(v, text, &cut, &rep->patterns)) {
            i++;
            continue;
        }
        rep->texts++;
        rep->bytes += (uint32_t)cut;
        if (!edit) {
            i++;
        } else if (cut == json_string_length(text)) {
            json_array_remove(content, i);
        } else {
            json_object_set_new(part, "text", json_stringn(json_string_value(text) + cut, json_string_length(text) - cut));
            i++;
        }
    }
}

static bool is_system(const json_t *msg) {
    const char *role = json_string_value(json_object_get(msg, "role"));
    return role && (!strcmp(role, "system") || !strcmp(role, "developer"));
}

static bool emptied(const json_t *msg) {
    const json_t *c = json_object_get(msg, "content");
    return (json_is_string(c) && json_string_length(c) == 0) || (json_is_array(c) && json_array_size(c) == 0);
}

json_t *kp_volatile_strip(const kp_volatile *v, const json_t *messages, kp_volatile_report *rep) {
    kp_volatile_report r = {0, 0, 0};
    size_t i;
    json_t *m;
    if (v && v->n && json_is_array(messages))
        json_array_foreach(messages, i, m) if (is_system(m)) strip_content(v, m, false, &r);
    if (rep) *rep = r;
    if (r.texts == 0) return json_incref((json_t *)messages);
    json_t *copy = json_deep_copy(messages);
    if (!copy) return NULL;
    kp_volatile_report again = {0, 0, 0};
    for (i = 0; i < json_array_size(copy);) {
        m = json_array_get(copy, i);
        if (!is_system(m)) {
            i++;
            continue;
        }
        strip_content(v, m, true, &again);
        if (emptied(m) && json_array_size(copy) > 1) json_array_remove(copy, i);
        else i++;
    }
    return copy;
}

json_t *kp_volatile_report_json(const kp_volatile *v, const kp_volatile_report *rep) {
    if (!rep || rep->texts == 0) return NULL;
    json_t *names = json_array();
    for (uint32_t i = 0; i < kp_volatile_count(v); i++)
        if (rep->patterns & (1u << i)) json_array_append_new(names, json_string(kp_volatile_name(v, i)));
    return json_pack("{s:I, s:I, s:o}", "texts", (json_int_t)rep->texts, "bytes", (json_int_t)rep->bytes, "patterns",
                     names);
}
