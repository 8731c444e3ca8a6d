/*
 * kvpool.c - block pool and block tables (see kvpool.h for the layout).
 *
 * Invariants: a block is on the free list iff its refcount is 0; the free
 * list is a stack of ids; memory is one allocation of n_blocks * block_bytes,
 * made once, so the budget is never exceeded. Run r of a (layer, head) pair
 * hr = layer * n_head_kv + head: the K runs of that pair start at
 * hr * n_blocks * (k_run + v_run), its V runs n_blocks * k_run later.
 */
#include "kv/kvpool.h"

#include "base/bigmem.h"
#include "base/buf.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

struct kp_kvpool {
    kp_kvpool_config cfg;
    uint64_t block_bytes;  /* full_bytes + window_bytes: a block with its window rows */
    uint64_t full_bytes, window_bytes; /* one block's rows in the main / window arena */
    uint64_t k_run, v_run; /* bytes of one K (V) run: block_size * row bytes */
    size_t k_row, v_row;   /* bytes of one K (V) row */
    uint32_t n_blocks;
    uint8_t *mem;          /* the main arena: n_blocks runs per (layer, head) of its layers */
    uint32_t *refcount;
    uint32_t *win_done;    /* [n_blocks]: references marked done with the block's window rows */
    int32_t *free_stack;
    uint32_t n_free;
    /* the window arena (n_win_layers > 0) */
    uint8_t *is_window;    /* [n_layer]: 1 for a layer whose rows live in the window arena */
    uint32_t *arena_layer; /* [n_layer]: the layer's index among its arena's layers */
    uint32_t n_win_layers;
    bool budgeted;         /* window slots apart (window_budget_bytes); else slot == block */
    uint32_t n_slots;
    uint8_t *win_mem;      /* n_slots runs per (window layer, head) */
    int32_t *win_slot;     /* [n_blocks]: the block's window slot, -1 when it has none */
    int32_t *slot_stack;   /* free slots, lowest on top */
    uint32_t n_free_slots;
};

kp_status kp_kvpool_check_type(kp_dtype t, uint32_t head_dim, const char *what, kp_error *err) {
    if (t != KP_DTYPE_F32 && t != KP_DTYPE_F16 && t != KP_DTYPE_Q8_0 && t != KP_DTYPE_Q4_0)
        return kp_fail(err, KP_EINVAL, "%s cache type must be f32, f16, q8_0 or q4_0, not %s", what,
                       kp_dtype_name(t));
    if ((t == KP_DTYPE_Q8_0 || t == KP_DTYPE_Q4_0) && head_dim % 32)
        return kp_fail(err, KP_EINVAL,
                       "%s cache type %s stores blocks of 32 values, but the model's head_dim is %u "
                       "(not a multiple of 32): use f16 or f32",
                       what, t == KP_DTYPE_Q8_0 ? "q8_0" : "q4_0", head_dim);
    return KP_OK;
}

kp_status kp_kvpool_new(kp_kvpool **out, const kp_kvpool_config *cfg, kp_error *err) {
    *out = NULL;
    if (cfg->block_size == 0 || cfg->block_size > 4096)
        return kp_fail(err, KP_EINVAL, "KV block size %u out of range 1..4096", cfg->block_size);
    if (!cfg->n_layer || !cfg->n_head_kv || !cfg->head_dim)
        return kp_fail(err, KP_EINVAL, "KV pool needs layers, heads and head_dim");
    kp_status st = kp_kvpool_check_type(cfg->kv_type, cfg->head_dim, "K", err);
    if (st == KP_OK) st = kp_kvpool_check_type(cfg->kv_type_v, cfg->head_dim, "V", err);
    if (st != KP_OK) return st;
    kp_kvpool *p = calloc(1, sizeof *p);
    if (!p) return kp_fail(err, KP_ENOMEM, "out of memory creating the KV pool");
    p->cfg = *cfg;
    p->cfg.window_layers = NULL;
    p->is_window = calloc(cfg->n_layer, 1);
    p->arena_layer = calloc(cfg->n_layer, sizeof *p->arena_layer);
    if (!p->is_window || !p->arena_layer) {
        kp_kvpool_free(p);
        return kp_fail(err, KP_ENOMEM, "out of memory creating the KV pool");
    }
    uint32_t n_full = 0;
    for (uint32_t l = 0; l < cfg->n_layer; l++) {
        p->is_window[l] = cfg->window_layers && cfg->window_layers[l];
        p->arena_layer[l] = p->is_window[l] ? p->n_win_layers++ : n_full++;
    }
    if (p->n_win_layers) p->cfg.window_layers = p->is_window;
    else p->cfg.window_budget_bytes = 0;
    p->k_row = kp_dtype_row_size(p->cfg.kv_type, cfg->head_dim);
    p->v_row = kp_dtype_row_size(p->cfg.kv_type_v, cfg->head_dim);
    p->k_run = (uint64_t)cfg->block_size * p->k_row;
    p->v_run = (uint64_t)cfg->block_size * p->v_row;
    p->full_bytes = (p->k_run + p->v_run) * n_full * cfg->n_head_kv;
    p->window_bytes = (p->k_run + p->v_run) * p->n_win_layers * cfg->n_head_kv;
    p->block_bytes = p->full_bytes + p->window_bytes;
    p->budgeted = p->cfg.window_budget_bytes > 0;
    uint64_t nb, ns;
    if (p->budgeted) {
        ns = p->cfg.window_budget_bytes / p->window_bytes;
        uint64_t rest = cfg->budget_bytes > ns * p->window_bytes ? cfg->budget_bytes - ns * p->window_bytes : 0;
        nb = p->full_bytes ? rest / p->full_bytes : ns;
        if (ns == 0) {
            unsigned long long wb = p->window_bytes;
            kp_kvpool_free(p);
            return kp_fail(err, KP_EINVAL, "window budget of %llu bytes is smaller than one block's window rows "
                                           "(%llu bytes)", (unsigned long long)cfg->window_budget_bytes, wb);
        }
    } else {
        nb = cfg->budget_bytes / p->block_bytes;
        ns = nb;
    }
    if (nb == 0) {
        unsigned long long bb = p->block_bytes;
        kp_kvpool_free(p);
        return kp_fail(err, KP_EINVAL, "KV budget of %llu bytes is smaller than one block (%llu bytes)",
                       (unsigned long long)cfg->budget_bytes, bb);
    }
    if (nb > INT32_MAX) nb = INT32_MAX;
    if (ns > nb) ns = nb; /* a slot per block at most */
    p->n_blocks = (uint32_t)nb;
    p->n_slots = (uint32_t)ns;
    p->mem = kp_big_alloc((size_t)(nb * p->full_bytes) + 1);
    p->refcount = calloc(nb, sizeof(uint32_t));
    p->win_done = calloc(nb, sizeof(uint32_t));
    p->free_stack = malloc(nb * sizeof(int32_t));
    p->win_slot = malloc(nb * sizeof(int32_t));
    p->slot_stack = malloc(ns * sizeof(int32_t));
    p->win_mem = p->n_win_layers ? kp_big_alloc((size_t)(ns * p->window_bytes)) : NULL;
    if (!p->mem || !p->refcount || !p->win_done || !p->free_stack || !p->win_slot || !p->slot_stack ||
        (p->n_win_layers && !p->win_mem)) {
        kp_kvpool_free(p);
        return kp_fail(err, KP_ENOMEM, "out of memory for a KV pool of %llu blocks",
                       (unsigned long long)nb);
    }
    /* lowest ids on top of the stack */
    for (uint32_t i = 0; i < p->n_blocks; i++) p->free_stack[i] = (int32_t)(p->n_blocks - 1 - i);
    p->n_free = p->n_blocks;
    for (uint32_t i = 0; i < p->n_blocks; i++) p->win_slot[i] = p->budgeted ? -1 : (int32_t)i;
    for (uint32_t i = 0; i < p->n_slots; i++) p->slot_stack[i] = (int32_t)(p->n_slots - 1 - i);
    p->n_free_slots = p->budgeted ? p->n_slots : 0;
    *out = p;
    return KP_OK;
}

void kp_kvpool_free(kp_kvpool *p) {
    if (!p) return;
    kp_big_free(p->mem);
    free(p->refcount);
    free(p->win_done);
    free(p->free_stack);
    free(p->is_window);
    free(p->arena_layer);
    kp_big_free(p->win_mem);
    free(p->win_slot);
    free(p->slot_stack);
    free(p);
}

const kp_kvpool_config *kp_kvpool_config_of(const kp_kvpool *p) { return &p->cfg; }
uint32_t kp_kvpool_n_blocks(const kp_kvpool *p) { return p->n_blocks; }
uint32_t kp_kvpool_n_free(const kp_kvpool *p) { return p->n_free; }
uint64_t kp_kvpool_block_bytes(const kp_kvpool *p) { return p->block_bytes; }
size_t kp_kvpool_k_row_bytes(const kp_kvpool *p) { return p->k_row; }
size_t kp_kvpool_v_row_bytes(const kp_kvpool *p) { return p->v_row; }

kp_status kp_kvpool_alloc(kp_kvpool *p, int32_t *id, kp_error *err) {
    if (p->n_free == 0)
        return kp_fail(err, KP_EFULL, "KV pool full: all %u blocks of %u positions are in use",
                       p->n_blocks, p->cfg.block_size);
    int32_t b = p->free_stack[--p->n_free];
    assert(p->refcount[b] == 0);
    assert(!p->budgeted || p->win_slot[b] < 0);
    p->refcount[b] = 1;
    *id = b;
    return KP_OK;
}

void kp_kvpool_ref(kp_kvpool *p, int32_t id) {
    assert(id >= 0 && (uint32_t)id < p->n_blocks && p->refcount[id] > 0);
    p->refcount[id]++;
}

void kp_kvpool_unref(kp_kvpool *p, int32_t id) {
    assert(id >= 0 && (uint32_t)id < p->n_blocks && p->refcount[id] > 0);
    assert(p->win_done[id] < p->refcount[id]); /* the reference dropped is not marked done (or was undone) */
    if (--p->refcount[id] == 0) {
        assert(p->win_done[id] == 0); /* the holders undo their marks first */
        kp_kvpool_drop_window(p, id);
        p->free_stack[p->n_free++] = id;
    }
}

uint32_t kp_kvpool_refcount(const kp_kvpool *p, int32_t id) {
    assert(id >= 0 && (uint32_t)id < p->n_blocks);
    return p->refcount[id];
}

bool kp_kvpool_window_budgeted(const kp_kvpool *p) { return p->budgeted; }
uint32_t kp_kvpool_n_slots(const kp_kvpool *p) { return p->n_win_layers ? p->n_slots : 0; }
uint32_t kp_kvpool_n_free_slots(const kp_kvpool *p) { return p->n_free_slots; }
uint64_t kp_kvpool_full_bytes(const kp_kvpool *p) { return p->full_bytes; }
uint64_t kp_kvpool_window_bytes(const kp_kvpool *p) { return p->window_bytes; }
bool kp_kvpool_is_window_layer(const kp_kvpool *p, uint32_t layer) { return p->is_window[layer]; }

bool kp_kvpool_has_window(const kp_kvpool *p, int32_t block) {
    assert(block >= 0 && (uint32_t)block < p->n_blocks);
    return p->win_slot[block] >= 0;
}

kp_status kp_kvpool_attach_window(kp_kvpool *p, int32_t block, kp_error *err) {
    assert(block >= 0 && (uint32_t)block < p->n_blocks && p->refcount[block] > 0);
    if (p->win_slot[block] >= 0) return KP_OK;
    if (p->n_free_slots == 0)
        return kp_fail(err, KP_EFULL, "window budget full: all %u window slots of %u positions are in use",
                       p->n_slots, p->cfg.block_size);
    p->win_slot[block] = p->slot_stack[--p->n_free_slots];
    return KP_OK;
}

void kp_kvpool_window_done(kp_kvpool *p, int32_t block) {
    assert(block >= 0 && (uint32_t)block < p->n_blocks && p->win_done[block] < p->refcount[block]);
    p->win_done[block]++;
}

void kp_kvpool_window_undone(kp_kvpool *p, int32_t block) {
    assert(block >= 0 && (uint32_t)block < p->n_blocks && p->win_done[block] > 0);
    p->win_done[block]--;
}

uint32_t kp_kvpool_window_readers(const kp_kvpool *p, int32_t block) {
    assert(block >= 0 && (uint32_t)block < p->n_blocks);
    return p->refcount[block] - p->win_done[block];
}

void kp_kvpool_drop_window(kp_kvpool *p, int32_t block) {
    assert(block >= 0 && (uint32_t)block < p->n_blocks);
    if (!p->budgeted || p->win_slot[block] < 0) return;
    p->slot_stack[p->n_free_slots++] = p->win_slot[block];
    p->win_slot[block] = -1;
}

/* The K (is_v false) or V run of (layer, head) of block b, in its arena. */
static uint8_t *run_at(const kp_kvpool *p, uint32_t layer, uint32_t head, bool is_v, int32_t block) {
    uint64_t hr = (uint64_t)p->arena_layer[layer] * p->cfg.n_head_kv + head, n = p->n_blocks;
    uint8_t *base = p->mem;
    if (p->is_window[layer]) {
        block = p->win_slot[block];
        assert(block >= 0); /* nobody reads window rows that were dropped */
        n = p->n_slots;
        base = p->win_mem;
    }
    uint8_t *pair = base + hr * n * (p->k_run + p->v_run);
    return is_v ? pair + n * p->k_run + (uint64_t)block * p->v_run : pair + (uint64_t)block * p->k_run;
}

kp_status kp_kvpool_copy(kp_kvpool *p, int32_t dst, int32_t src, kp_error *err) {
    bool win = p->n_win_layers && p->win_slot[src] >= 0;
    if (win) {
        kp_status st = kp_kvpool_attach_window(p, dst, err);
        if (st != KP_OK) return st;
    }
    for (uint32_t l = 0; l < p->cfg.n_layer; l++) {
        if (p->is_window[l] && !win) continue;
        for (uint32_t h = 0; h < p->cfg.n_head_kv; h++) {
            memcpy(run_at(p, l, h, false, dst), run_at(p, l, h, false, src), p->k_run);
            memcpy(run_at(p, l, h, true, dst), run_at(p, l, h, true, src), p->v_run);
        }
    }
    return KP_OK;
}

void *kp_kvpool_k(const kp_kvpool *p, int32_t block, uint32_t layer, uint32_t head) {
    return run_at(p, layer, head, false, block);
}

void *kp_kvpool_v(const kp_kvpool *p, int32_t block, uint32_t layer, uint32_t head) {
    return run_at(p, layer, head, true, block);
}

/* Copies n bytes between buf and the block's main-arena runs, in layout
 * order (put: buf to block). */
static void block_bytes_io(const kp_kvpool *p, int32_t block, uint8_t *buf, uint64_t n, bool put) {
    assert(block >= 0 && (uint32_t)block < p->n_blocks && p->refcount[block] > 0 && n <= p->full_bytes);
    for (uint32_t l = 0; l < p->cfg.n_layer && n; l++) {
        if (p->is_window[l]) continue;
        for (uint32_t h = 0; h < p->cfg.n_head_kv && n; h++)
            for (int v = 0; v < 2 && n; v++) {
                uint64_t run = v ? p->v_run : p->k_run, m = n < run ? n : run;
                uint8_t *at = run_at(p, l, h, v, block);
                if (put) memcpy(at, buf, (size_t)m);
                else memcpy(buf, at, (size_t)m);
                buf += m;
                n -= m;
            }
    }
}

void kp_kvpool_put(kp_kvpool *p, int32_t block, const void *src, uint64_t n) {
    block_bytes_io(p, block, (uint8_t *)(uintptr_t)src, n, true);
}

void kp_kvpool_get(const kp_kvpool *p, int32_t block, void *dst, uint64_t n) { block_bytes_io(p, block, dst, n, false); }

kp_status kp_kvseq_reserve(kp_kvseq *s, kp_kvpool *p, uint32_t n_pos, kp_error *err) {
    uint32_t B = p->cfg.block_size;
    uint32_t need = (uint32_t)(((uint64_t)n_pos + B - 1) / B);
    if (!kp_grow_u32((void **)&s->blocks, &s->cap_blocks, need, sizeof(int32_t)))
        return kp_fail(err, KP_ENOMEM, "out of memory growing a block table");
    while (s->n_blocks < need) {
        kp_status st = kp_kvpool_alloc(p, &s->blocks[s->n_blocks], err);
        if (st != KP_OK) return st;
        s->n_blocks++;
    }
    return KP_OK;
}

void kp_kvseq_truncate(kp_kvseq *s, kp_kvpool *p, uint32_t n_pos) {
    uint32_t B = p->cfg.block_size;
    uint32_t keep = (uint32_t)(((uint64_t)n_pos + B - 1) / B);
    while (s->n_blocks > keep) {
        int32_t b = s->blocks[--s->n_blocks];
        if (s->n_blocks < s->win_done) kp_kvpool_window_undone(p, b);
        kp_kvpool_unref(p, b);
    }
    if (s->win_done > keep) s->win_done = keep;
    if (s->n_pos > n_pos) s->n_pos = n_pos;
}

void kp_kvseq_release(kp_kvseq *s, kp_kvpool *p) {
    kp_kvseq_truncate(s, p, 0);
    free(s->blocks);
    free(s->rstate);
    memset(s, 0, sizeof *s);
}
