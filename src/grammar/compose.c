/*
 * compose.c - grammars made of parts (grammar.h kp_grammar_compile_alts):
 * literal bytes, JSON documents of schemas and raw text, in alternatives
 * repeated with a separator.
 *
 *   root  ::= call next{0,max_count-1} SUFFIX
 *   call  ::= alt | alt | ...                 the first alternatives
 *   next  ::= alt | alt | ...                 the more alternatives
 *   alt   ::= piece*
 *   piece:  LIT    its bytes
 *           JSON   a reference to the schema's rule (schema.c, kp_schema_into)
 *           TEXT   a rule ( [^excluded] )+ over code points
 *           a run of one group: a rule ( run | "" )
 */
#include <stdlib.h>
#include <string.h>

#include "grammar/gram_impl.h"

static kp_status fail_builder(kp_builder *b, kp_error *err) {
    bool big = b->too_big;
    kp_builder_free(b);
    return kp_fail(err, big ? KP_ERANGE : KP_ENOMEM, big ? "composed grammar: too large" : "composed grammar: out of memory");
}

/* The element of one piece (not grouped). */
static bool piece_elem(kp_builder *b, const kp_gpiece *p, kp_gseq *s, kp_status *st, kp_error *err) {
    if (p->kind == KP_GPIECE_LIT) return kp_gseq_lit(b, s, p->bytes, p->len);
    if (p->kind == KP_GPIECE_JSON) {
        uint32_t r = kp_schema_into(b, p->schema, 0, st, err);
        return r != UINT32_MAX && kp_gseq_push(b, s, KP_GE(KP_GE_REF, r));
    }
    kp_gcrange ex[64];
    size_t n = 0;
    for (size_t i = 0; i < p->len && n < 64; i++) ex[n++] = (kp_gcrange){(unsigned char)p->bytes[i], (unsigned char)p->bytes[i]};
    ex[n < 64 ? n++ : 63] = (kp_gcrange){0, 0x1F}; /* no control characters either */
    uint32_t ch;
    if (!kp_builder_class(b, ex, n, true, &ch)) return false;
    uint32_t r = kp_builder_as_rule(b, ch);
    return r != UINT32_MAX && kp_gseq_push(b, s, kp_builder_rep(b, r, 1, KP_GREP_INF));
}

/* The rule of alternative a. */
static uint32_t alt_rule(kp_builder *b, const kp_galt *a, size_t k, kp_status *st, kp_error *err) {
    uint32_t r = kp_builder_rule(b, "alt%zu", k);
    kp_gseq s = {0};
    bool ok = r != UINT32_MAX;
    for (size_t i = 0; ok && i < a->n;) {
        if (!a->pieces[i].group) {
            ok = piece_elem(b, &a->pieces[i++], &s, st, err);
            continue;
        }
        uint32_t g = a->pieces[i].group, gr = kp_builder_rule(b, "alt%zu.group%u", k, g);
        kp_gseq gs = {0};
        ok = gr != UINT32_MAX;
        for (; ok && i < a->n && a->pieces[i].group == g; i++) ok = piece_elem(b, &a->pieces[i], &gs, st, err);
        kp_gseq empty = {0};
        ok = ok && kp_builder_alt(b, gr, &gs) && kp_builder_alt(b, gr, &empty) &&
             kp_gseq_push(b, &s, KP_GE(KP_GE_REF, gr));
        kp_gseq_free(&gs);
    }
    ok = ok && kp_builder_alt(b, r, &s);
    kp_gseq_free(&s);
    return ok ? r : UINT32_MAX;
}

/* A rule with one alternative per element of alts[0..n) (named what). */
static uint32_t any_rule(kp_builder *b, const kp_galt *alts, size_t n, const char *what, kp_status *st, kp_error *err) {
    uint32_t any = kp_builder_rule(b, "%s", what);
    for (size_t k = 0; any != UINT32_MAX && k < n; k++) {
        uint32_t r = alt_rule(b, &alts[k], k, st, err);
        if (r == UINT32_MAX || !kp_builder_alt1(b, any, KP_GE(KP_GE_REF, r))) return UINT32_MAX;
    }
    return any;
}

kp_status kp_grammar_compile_alts(const kp_galt *first, size_t n_first, const kp_galt *more, size_t n_more,
                                  uint32_t max_count, const char *suffix, size_t suffix_len, kp_grammar **out,
                                  kp_error *err) {
    *out = NULL;
    if (!n_first) return kp_fail(err, KP_EINVAL, "composed grammar: no alternatives");
    for (size_t k = 0; k < n_first + n_more; k++)
        if (!(k < n_first ? first[k] : more[k - n_first]).n)
            return kp_fail(err, KP_EINVAL, "composed grammar: an alternative is empty");
    kp_builder b;
    kp_builder_init(&b);
    kp_status st = KP_OK;
    uint32_t root = kp_builder_rule(&b, "root");
    uint32_t f = root == UINT32_MAX ? UINT32_MAX : any_rule(&b, first, n_first, "call", &st, err);
    uint32_t m = n_more && max_count > 1 && f != UINT32_MAX ? any_rule(&b, more, n_more, "next", &st, err) : 0;
    if (st != KP_OK) {
        kp_builder_free(&b);
        return st;
    }
    kp_gseq s = {0};
    bool ok = f != UINT32_MAX && m != UINT32_MAX && kp_gseq_push(&b, &s, KP_GE(KP_GE_REF, f));
    if (ok && n_more && max_count > 1)
        ok = kp_gseq_push(&b, &s, kp_builder_rep(&b, m, 0, max_count - 1 >= KP_GREP_INF ? KP_GREP_INF - 1 : max_count - 1));
    ok = ok && kp_gseq_lit(&b, &s, suffix, suffix_len) && kp_builder_alt(&b, root, &s);
    kp_gseq_free(&s);
    if (!ok) return fail_builder(&b, err);
    return kp_builder_finish(&b, root, out, err);
}
