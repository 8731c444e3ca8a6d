/*
 * reasoning.c - a reply's reasoning, split from its content (reasoning.h).
 *
 * One pass over the text: skip whitespace, match the opening marker (or a
 * prefix of it, which holds everything), skip whitespace, search the
 * closing marker; without it the end of the text is held back as far as it
 * could still be the start of the marker or whitespace before it. Given
 * the answer for a shorter prefix, a decided split is kept and the search
 * resumes where it stopped, so a stream's scans cost its length once.
 * Harmony mode reads the reply's first two messages (harmony.h) at each
 * call; only the search for the end of an open analysis message resumes.
 */
#include "serve/reasoning.h"

#include <string.h>

#include "serve/harmony.h"

static bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

static size_t skip_space(const char *t, size_t i, size_t len) {
    while (i < len && is_space(t[i])) i++;
    return i;
}

/* The end of t[from..len) without a tail that is a proper prefix of mark
 * and without the whitespace before that. */
static size_t held_tail(const char *t, size_t from, size_t len, const char *mark) {
    size_t ml = strlen(mark), end = len;
    for (size_t k = ml - 1; k > 0; k--)
        if (len - from >= k && !memcmp(t + len - k, mark, k)) {
            end = len - k;
            break;
        }
    while (end > from && is_space(t[end - 1])) end--;
    return end;
}

/* Where the first occurrence of mark in t[from..len) starts, or len. */
static size_t find(const char *t, size_t from, size_t len, const char *mark) {
    size_t ml = strlen(mark);
    for (size_t i = from; i + ml <= len; i++)
        if (t[i] == mark[0] && !memcmp(t + i, mark, ml)) return i;
    return len;
}

static size_t rtrim_to(const char *t, size_t from, size_t n) {
    while (n > from && is_space(t[n - 1])) n--;
    return n;
}

/* Harmony: message m (starting at start) holds the content, or is a call. */
static void harmony_content(const char *t, size_t len, bool final, const kp_harmony_msg *m, size_t start,
                            kp_reasoning_split *out) {
    size_t nl;
    if (kp_harmony_call_name(m, t, &nl)) {
        out->content_from = out->content_to = start;
        return;
    }
    size_t c = skip_space(t, m->body_from, len);
    out->content_from = c < len || final ? c : len;
    size_t e = m->closed ? m->body_to : final ? len : kp_harmony_safe_end(t, m->body_from, len);
    e = rtrim_to(t, m->body_from, e);
    out->content_to = e > out->content_from ? e : out->content_from;
}

static void harmony_scan(const char *t, size_t len, bool final, const kp_reasoning_split *prev,
                         kp_reasoning_split *out) {
    kp_harmony_msg m, n;
    kp_harmony_read_result r = kp_harmony_read(t, len, 0, true, &m);
    if (r == KP_HARMONY_PARTIAL && !final) {
        out->state = KP_REASONING_UNDECIDED;
        out->content_from = len;
        return;
    }
    if (r != KP_HARMONY_MSG) return; /* not harmony: all content */
    size_t nl;
    if (!kp_harmony_channel_is(&m, t, "analysis") || kp_harmony_call_name(&m, t, &nl)) {
        harmony_content(t, len, final, &m, 0, out);
        return;
    }
    (void)prev;
    out->reason_from = skip_space(t, m.body_from, len);
    if (!m.closed) {
        out->state = KP_REASONING_OPEN;
        size_t e = final ? len : kp_harmony_safe_end(t, m.body_from, len);
        e = rtrim_to(t, out->reason_from, e);
        out->reason_to = e > out->reason_from ? e : out->reason_from;
        out->content_from = len;
        return;
    }
    out->state = KP_REASONING_CLOSED;
    out->reason_to = rtrim_to(t, out->reason_from, m.body_to);
    out->close_end = m.end;
    r = kp_harmony_read(t, len, m.end, false, &n);
    if (r == KP_HARMONY_MSG) {
        harmony_content(t, len, final, &n, m.end, out);
    } else if (r == KP_HARMONY_NONE) { /* plain text after the reasoning */
        size_t c = skip_space(t, m.end, len);
        out->content_from = c < len || final ? c : len;
    } else {
        out->content_from = len; /* a header on its way, or nothing yet */
    }
}

void kp_reasoning_scan(const char *text, size_t len, const kp_reasoning_markers *m, bool starts_open, bool final,
                       const kp_reasoning_split *prev, kp_reasoning_split *out) {
    if (m && m->harmony) {
        memset(out, 0, sizeof *out);
        out->state = KP_REASONING_NONE;
        out->content_to = len;
        harmony_scan(text, len, final, prev, out);
        if (out->content_to < out->content_from) out->content_to = out->content_from;
        return;
    }
    if (prev && (prev->state == KP_REASONING_CLOSED || prev->state == KP_REASONING_NONE)) {
        *out = *prev; /* decided: only where the content starts can still move (whitespace) */
        if (out->state == KP_REASONING_CLOSED) out->content_from = skip_space(text, prev->close_end, len);
        out->content_to = len;
        return;
    }
    memset(out, 0, sizeof *out);
    out->state = KP_REASONING_NONE;
    out->content_to = len;
    if (!m || !m->open || !m->close || !*m->open || !*m->close) return;
    size_t i = skip_space(text, 0, len);
    if (!starts_open) {
        size_t ol = strlen(m->open), have = len - i;
        if (have >= ol && !memcmp(text + i, m->open, ol)) {
            i += ol;
        } else if (!final && have < ol && !memcmp(text + i, m->open, have)) {
            out->state = KP_REASONING_UNDECIDED; /* nothing, or the marker's start */
            out->content_from = len;
            return;
        } else {
            return; /* no reasoning */
        }
    }
    size_t from = skip_space(text, i, len);
    size_t start = prev && prev->state == KP_REASONING_OPEN && prev->searched > from ? prev->searched : from;
    size_t close = find(text, start, len, m->close);
    out->reason_from = from;
    if (close == len) {
        out->state = KP_REASONING_OPEN;
        size_t cl = strlen(m->close);
        out->searched = len >= cl ? len - cl + 1 : 0; /* a marker may end past len */
        if (out->searched < from) out->searched = from;
        out->reason_to = final ? held_tail(text, from, len, " ") : held_tail(text, from, len, m->close);
        if (out->reason_to < from) out->reason_to = from;
        out->content_from = len;
        return;
    }
    size_t to = close;
    while (to > from && is_space(text[to - 1])) to--;
    out->state = KP_REASONING_CLOSED;
    out->reason_to = to;
    out->close_end = close + strlen(m->close);
    size_t c = skip_space(text, out->close_end, len);
    out->content_from = c < len || final ? c : len;
}

bool kp_reasoning_prompt_opens(const char *prompt, size_t len, const kp_reasoning_markers *m) {
    if (!m || !m->open || !*m->open || !prompt) return false;
    while (len > 0 && is_space(prompt[len - 1])) len--;
    size_t ol = strlen(m->open);
    return len >= ol && !memcmp(prompt + len - ol, m->open, ol);
}
