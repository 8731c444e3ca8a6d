/*
 * tok_merge.c - the two merge loops: SentencePiece (by score) and BPE (by
 * rank), their shared priority queue, and the BPE merge table.
 *
 * Both loops follow llama.cpp's llm_tokenizer_spm / llm_tokenizer_bpe
 * sessions step for step, so the ids come out identical:
 *
 *   1. cut the text into symbols (SPM: UTF-8 characters by lead byte; BPE:
 *      one symbol per byte of the word, i.e. per GPT-2 code point), kept as
 *      a doubly linked list over an array;
 *   2. push every adjacent pair that forms a token (SPM) or a ranked merge
 *      (BPE) into a priority queue;
 *   3. pop the best pair; skip it when either side changed since it was
 *      pushed; otherwise merge the right symbol into the left one and push
 *      the two new neighbouring pairs;
 *   4. emit each remaining symbol's token, or its byte fallback.
 *
 *   symbols:  [ 0 ]<->[ 1 ]<->[ 2 ]<->[ 3 ]      start/n index the text;
 *              "▁h"   "e"     "l"     "lo"      a merged-away symbol has n = 0
 *
 * Queue order (a min-heap on one 64-bit key, ties impossible to observe):
 *   SPM:  key = (~sortable(score)) << 32 | left   highest score, then leftmost
 *   BPE:  key = rank << 32 | left                 lowest rank, then leftmost
 * A popped pair is stale iff n(left) + n(right) != the size recorded at push
 * time: symbols only grow, so equal sizes mean both sides are unchanged.
 *
 * SPM cut at word starts: when no token of the vocabulary has "▁" after a
 * byte other than the end of another "▁" (tok_load.c checks this:
 * v->spm_word_cuts), no token can span the point just before a "▁" symbol
 * that follows a non-"▁" symbol, so no pair across it is ever queued and the
 * text splits there into independent runs. Each run is merged on its own,
 * which gives the same ids (merges in one run never change another's
 * candidates, and within a run the pop order is unchanged) with small,
 * cache-friendly queues instead of one queue over the whole text.
 *
 *   "▁the▁cat▁▁sat"  ->  runs [▁the] [▁cat] [▁▁sat]   (a "▁" after a "▁"
 *                                                      is not a cut)
 *
 * The merge table maps (left id, right id) to (rank, merged id) with open
 * addressing; ids stand for strings because every merge side is a token
 * (tok_load.c refuses files where it is not).
 *
 * Owns no global state; all scratch lives in a kp_tok_scratch per encode call.
 */
#include <stdlib.h>
#include <string.h>

#include "tok/tok_impl.h"
#include "base/buf.h"
#include "base/rng.h"
#include "base/unicode.h"

#define U2581 "\xe2\x96\x81" /* the SentencePiece space */

typedef struct {
    uint32_t start, n;  /* bytes of the text / word */
    int32_t prev, next; /* neighbours, -1 at the ends */
    int32_t id;         /* BPE: token of the symbol's text, -1 if none */
} tok_sym;

/* The right side of a queued pair is always left's current neighbour when
 * the pair is still valid (left only changes by absorbing that neighbour,
 * which changes its size), so only left and the size are kept. */
typedef struct {
    uint64_t key;
    int32_t left;
    uint32_t size;      /* n(left) + n(right) at push time */
    int32_t result;     /* BPE: merged token id */
} tok_bigram;

struct kp_tok_scratch {
    tok_sym *syms;
    size_t syms_cap;
    tok_bigram *heap;
    size_t heap_n, heap_cap;
    uint8_t *buf;       /* BPE: the GPT-2 encoded word */
    size_t buf_cap;
};

kp_tok_scratch *kp_tok_scratch_new(void) { return calloc(1, sizeof(kp_tok_scratch)); }

void kp_tok_scratch_free(kp_tok_scratch *s) {
    if (!s) return;
    free(s->syms);
    free(s->heap);
    free(s->buf);
    free(s);
}

static kp_status oom(size_t n, size_t elem, kp_error *err) {
    return kp_fail(err, KP_ENOMEM, "tokenizer: out of memory (%zu x %zu bytes)", n, elem);
}

kp_status kp_tok_ids_push(kp_tok_ids *a, int32_t id, kp_error *err) {
    if (!kp_grow((void **)&a->ids, &a->cap, a->n + 1, sizeof(int32_t)))
        return oom(a->n + 1, sizeof(int32_t), err);
    a->ids[a->n++] = id;
    return KP_OK;
}

/* ---- min-heap of bigrams ---- */

static kp_status heap_push(kp_tok_scratch *s, tok_bigram b, kp_error *err) {
    if (!kp_grow((void **)&s->heap, &s->heap_cap, s->heap_n + 1, sizeof(tok_bigram)))
        return oom(s->heap_n + 1, sizeof(tok_bigram), err);
    size_t i = s->heap_n++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (s->heap[parent].key <= b.key) break;
        s->heap[i] = s->heap[parent];
        i = parent;
    }
    s->heap[i] = b;
    return KP_OK;
}

static tok_bigram heap_pop(kp_tok_scratch *s) {
    tok_bigram top = s->heap[0];
    tok_bigram last = s->heap[--s->heap_n];
    size_t n = s->heap_n, i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && s->heap[c + 1].key < s->heap[c].key) c++;
        if (last.key <= s->heap[c].key) break;
        s->heap[i] = s->heap[c];
        i = c;
    }
    if (n > 0) s->heap[i] = last;
    return top;
}

/* Maps a float to a uint32 whose unsigned order is the float's order. */
static uint32_t float_order(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* ---- SPM ---- */

static kp_status spm_try_add(const kp_tok_vocab *v, kp_tok_scratch *s, const char *text, int32_t left,
                             int32_t right, kp_error *err) {
    if (left < 0 || right < 0) return KP_OK;
    const tok_sym *l = &s->syms[left], *r = &s->syms[right];
    uint32_t size = l->n + r->n;
    if (size > v->max_token_len) return KP_OK; /* no token is that long */
    int32_t id = kp_tok_lookup(v, text + l->start, size);
    if (id < 0) return KP_OK;
    tok_bigram b = {((uint64_t)(~float_order(v->scores[id])) << 32) | (uint32_t)left, left, size, id};
    return heap_push(s, b, err);
}

/* Merges the run of symbols starting at `first` (linked by next, ending at
 * -1) and appends its ids. */
static kp_status spm_run(const kp_tok_vocab *v, kp_tok_scratch *s, const char *text, int32_t first,
                         kp_tok_ids *out, kp_error *err) {
    kp_status st;
    s->heap_n = 0;
    for (int32_t i = first; s->syms[i].next >= 0; i = s->syms[i].next)
        if ((st = spm_try_add(v, s, text, i, s->syms[i].next, err)) != KP_OK) return st;

    while (s->heap_n > 0) {
        tok_bigram b = heap_pop(s);
        tok_sym *l = &s->syms[b.left];
        if (l->n == 0 || l->next < 0) continue;
        tok_sym *r = &s->syms[l->next];
        if (r->n == 0 || l->n + r->n != b.size) continue;
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) s->syms[r->next].prev = b.left;
        if ((st = spm_try_add(v, s, text, l->prev, b.left, err)) != KP_OK) return st;
        if ((st = spm_try_add(v, s, text, b.left, s->syms[b.left].next, err)) != KP_OK) return st;
    }

    /* a symbol that is not a token is spelled with byte tokens */
    for (int32_t i = first; i != -1; i = s->syms[i].next) {
        const tok_sym *sym = &s->syms[i];
        int32_t id = kp_tok_lookup(v, text + sym->start, sym->n);
        if (id >= 0) {
            if ((st = kp_tok_ids_push(out, id, err)) != KP_OK) return st;
            continue;
        }
        for (uint32_t j = 0; j < sym->n; j++) {
            int32_t bt = v->byte_tok[(uint8_t)text[sym->start + j]];
            if (bt < 0) bt = v->unk; /* no byte token at all: llama.cpp would throw */
            if (bt >= 0 && (st = kp_tok_ids_push(out, bt, err)) != KP_OK) return st;
        }
    }
    return KP_OK;
}

kp_status kp_tok_spm_tokenize(const kp_tok_vocab *v, kp_tok_scratch *s, const char *text, size_t len,
                           kp_tok_ids *out, kp_error *err) {
    kp_status st;
    if (len == 0) return KP_OK;
    /* symbols: one per UTF-8 character (by lead byte, clamped to the end) */
    if (!kp_grow((void **)&s->syms, &s->syms_cap, len, sizeof(tok_sym))) return oom(len, sizeof(tok_sym), err);
    int32_t n_sym = 0;
    for (size_t off = 0; off < len;) {
        size_t n = kp_unicode_len_utf8((uint8_t)text[off]);
        if (n > len - off) n = len - off;
        tok_sym *sym = &s->syms[n_sym];
        sym->start = (uint32_t)off;
        sym->n = (uint32_t)n;
        sym->prev = n_sym - 1;
        off += n;
        sym->next = off == len ? -1 : n_sym + 1;
        sym->id = -1;
        n_sym++;
    }
    /* cut the list into independent runs (see the top comment) */
    if (v->spm_word_cuts) {
        for (int32_t i = 1; i < n_sym; i++) {
            const tok_sym *sym = &s->syms[i];
            if (sym->n == 3 && memcmp(text + sym->start, U2581, 3) == 0 &&
                (sym->start < 3 || memcmp(text + sym->start - 3, U2581, 3) != 0)) {
                s->syms[i - 1].next = -1;
                s->syms[i].prev = -1;
            }
        }
    }
    /* runs start where prev is -1; find the next start before merging */
    for (int32_t first = 0; first < n_sym;) {
        int32_t next_run = first + 1;
        while (next_run < n_sym && s->syms[next_run].prev >= 0) next_run++;
        if ((st = spm_run(v, s, text, first, out, err)) != KP_OK) return st;
        first = next_run;
    }
    return KP_OK;
}

/* ---- BPE ---- */

static kp_status bpe_try_add(const kp_tok_vocab *v, kp_tok_scratch *s, int32_t left, int32_t right,
                             kp_error *err) {
    if (left < 0 || right < 0) return KP_OK;
    const tok_sym *l = &s->syms[left], *r = &s->syms[right];
    if (l->id < 0 || r->id < 0) return KP_OK; /* only tokens appear in merges */
    int32_t result;
    int32_t rank = kp_tok_merges_find(&v->merges, l->id, r->id, &result);
    if (rank < 0) return KP_OK;
    tok_bigram b = {((uint64_t)(uint32_t)rank << 32) | (uint32_t)left, left, l->n + r->n, result};
    return heap_push(s, b, err);
}

kp_status kp_tok_bpe_word(const kp_tok_vocab *v, kp_tok_scratch *s, const uint8_t *word, size_t len,
                       kp_tok_ids *out, kp_error *err) {
    kp_status st;
    if (len == 0) return KP_OK;
    if (v->ignore_merges) {
        /* a word that is itself a token is emitted whole */
        if (!kp_grow((void **)&s->buf, &s->buf_cap, 2 * len, 1)) return oom(2 * len, 1, err);
        size_t n = 0;
        for (size_t i = 0; i < len; i++) n += kp_unicode_encode(kp_unicode_byte_to_cpt(word[i]), s->buf + n);
        int32_t id = kp_tok_lookup(v, (const char *)s->buf, n);
        if (id >= 0) return kp_tok_ids_push(out, id, err);
    }
    if (!kp_grow((void **)&s->syms, &s->syms_cap, len, sizeof(tok_sym))) return oom(len, sizeof(tok_sym), err);
    int32_t n_sym = (int32_t)len;
    for (int32_t i = 0; i < n_sym; i++) {
        tok_sym *sym = &s->syms[i];
        sym->start = (uint32_t)i;
        sym->n = 1;
        sym->prev = i - 1;
        sym->next = i + 1 < n_sym ? i + 1 : -1;
        sym->id = v->byte_tok[word[i]];
    }
    s->heap_n = 0;
    for (int32_t i = 1; i < n_sym; i++)
        if ((st = bpe_try_add(v, s, i - 1, i, err)) != KP_OK) return st;

    while (s->heap_n > 0) {
        tok_bigram b = heap_pop(s);
        tok_sym *l = &s->syms[b.left];
        if (l->n == 0 || l->next < 0) continue;
        tok_sym *r = &s->syms[l->next];
        if (r->n == 0 || l->n + r->n != b.size) continue;
        l->n += r->n;
        l->id = b.result;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) s->syms[r->next].prev = b.left;
        if ((st = bpe_try_add(v, s, l->prev, b.left, err)) != KP_OK) return st;
        if ((st = bpe_try_add(v, s, b.left, s->syms[b.left].next, err)) != KP_OK) return st;
    }

    for (int32_t i = 0; i != -1; i = s->syms[i].next) {
        const tok_sym *sym = &s->syms[i];
        if (sym->id >= 0) {
            if ((st = kp_tok_ids_push(out, sym->id, err)) != KP_OK) return st;
            continue;
        }
        /* not a token: llama.cpp looks up each byte of the encoded text */
        for (uint32_t j = 0; j < sym->n; j++) {
            const int32_t *fb = v->byte_fallback[word[sym->start + j]];
            for (int k = 0; k < 2; k++)
                if (fb[k] >= 0 && (st = kp_tok_ids_push(out, fb[k], err)) != KP_OK) return st;
        }
    }
    return KP_OK;
}

/* ---- merge table ---- */

kp_status kp_tok_merges_init(kp_tok_merges *m, size_t n_merges, kp_error *err) {
    memset(m, 0, sizeof *m);
    size_t cap = 16;
    while (cap < 2 * n_merges) cap *= 2;
    m->keys = malloc(cap * sizeof *m->keys);
    m->ranks = malloc(cap * sizeof *m->ranks);
    m->results = malloc(cap * sizeof *m->results);
    if (!m->keys || !m->ranks || !m->results) {
        kp_tok_merges_free(m);
        return kp_fail(err, KP_ENOMEM, "tokenizer: out of memory for %zu merges", n_merges);
    }
    for (size_t i = 0; i < cap; i++) m->keys[i] = KP_TOK_MERGE_EMPTY;
    m->mask = cap - 1;
    return KP_OK;
}

void kp_tok_merges_free(kp_tok_merges *m) {
    free(m->keys);
    free(m->ranks);
    free(m->results);
    memset(m, 0, sizeof *m);
}

void kp_tok_merges_add(kp_tok_merges *m, int32_t left, int32_t right, int32_t rank, int32_t result) {
    uint64_t key = ((uint64_t)(uint32_t)left << 32) | (uint32_t)right;
    for (uint64_t i = kp_mix64(key) & m->mask;; i = (i + 1) & m->mask) {
        if (m->keys[i] == key) return; /* first rank wins */
        if (m->keys[i] == KP_TOK_MERGE_EMPTY) {
            m->keys[i] = key;
            m->ranks[i] = rank;
            m->results[i] = result;
            return;
        }
    }
}

int32_t kp_tok_merges_find(const kp_tok_merges *m, int32_t left, int32_t right, int32_t *result) {
    if (!m->keys) return -1;
    uint64_t key = ((uint64_t)(uint32_t)left << 32) | (uint32_t)right;
    for (uint64_t i = kp_mix64(key) & m->mask;; i = (i + 1) & m->mask) {
        if (m->keys[i] == key) {
            *result = m->results[i];
            return m->ranks[i];
        }
        if (m->keys[i] == KP_TOK_MERGE_EMPTY) return -1;
    }
}
