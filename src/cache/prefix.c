/*
 * prefix.c - the prefix index: a radix tree over token ids whose nodes hold
 * references to the KV pool blocks of their positions (see prefix.h for
 * the API and the sequence contract).
 *
 * What it owns: the tree (nodes, token runs, block tables), one reference
 * in the kp_kvpool per block-table entry of every node, the pins, the LRU
 * list, the record of evicted runs. It borrows the pool.
 *
 * The tree. Edges are token runs of any length; a node's path is the
 * concatenation of the runs from the root. Example with block size B = 4,
 * after indexing A = 1 2 3 4 5 6, then B = 1 2 3 7 8 (which reused
 * "1 2 3" of A), then C = 9 9:
 *
 *                    root (depth 0)
 *                   /              \
 *         [1 2 3]  0..3             [9 9]  0..2
 *         blocks {0: X}             blocks {0: Z}
 *          /             \
 *   [4 5 6]  3..6        [7 8]  3..5
 *   blocks {0: X, 1: Y}  blocks {0: X', 1: W}
 *
 * Children are sorted by their run's first token (binary search); no two
 * children start with the same token; every non-root run is non-empty.
 * A node's `depth` is the length of its path; its run covers path
 * positions [depth - n_tokens, depth) = [d0, d1).
 *
 * Blocks. Position p of a path lives in block index p / B, row p % B, as in
 * a kp_kvseq. A node holds one block reference for every block index its
 * run touches, d0/B .. (d1-1)/B:
 *
 *   block index:          0                1
 *   positions:       0  1  2  3  |  4  5  6  7
 *   path of [4 5 6]: 1  2  3  4  |  5  6            X = 1 2 3 4   Y = 5 6 . .
 *   path of [7 8]:   1  2  3  7  |  8               X'= 1 2 3 7   W = 8 . . .
 *   [1 2 3]:         1  2  3  .                     X   (rows 0..2)
 *
 * A run that ends mid-block shares that block index with its children:
 * [1 2 3] and [4 5 6] hold the same block X (two index references), while
 * [7 8] holds X', the copy B's sequence made when it took "1 2 3" from the
 * cache and then wrote position 3. The invariant that makes this work:
 *
 *   (V) for a node and each block index i it holds, its block's rows for
 *       the path positions [i*B, min((i+1)*B, d1)) hold the K/V of exactly
 *       that path, including the rows of ancestors' positions in block i.
 *
 * So a sequence reusing n positions takes, for each block index, the block
 * of the deepest path node touching that index below n. The index never
 * writes rows. Sequences keep (V) by construction: kp_pfx_acquire gives a
 * private copy of a partial last block (copy-on-write with kp_kvpool_copy),
 * so the first position a sequence writes is never in a block anyone else
 * reads at that row; a sequence only appends, so the rows it indexed with
 * kp_pfx_insert stay as they were. Blocks of a node are the sequence's own
 * blocks at insert time: the prefix that was already indexed is kept
 * (stored once), only the new positions take the sequence's blocks.
 *
 * Splits. Inserting 1 2 3 7 8 into a tree holding [1 2 3 4 5 6] splits the
 * edge at depth 3: a new node U takes the head of the run, the old node
 * keeps the tail (and its identity: leases and pins point at it):
 *
 *   [1 2 3 4 5 6]{X,Y}    ==>    [1 2 3]{X}  --+-- [4 5 6]{X,Y}   (old node)
 *                                              +-- [7 8]{X',W}    (new leaf)
 *
 * X is referenced once more (by U and the old node) because depth 3 is
 * mid-block. A leaf that no pin covers grows in place when its own path is
 * extended (decode steps do not build chains of one-token nodes); if it
 * ended mid-block, that block index then takes the extending sequence's
 * block, which holds every row of the longer path (a marked leaf gets a
 * child instead). When a node is left with one child and nothing points
 * at it (no lease, pin or mark on it), it is merged into that child; a
 * block index held by both keeps the child's block ((V) holds for it).
 *
 * Holds and pins. `hold` counts the leases on a node or below it, `pin`
 * the pins on it or below; hold_here / pin_here count those on the node
 * itself. A node with hold > 0 or pin > 0 is never evicted. Only leaves
 * are evicted, least recently used first (the LRU list, head = most
 * recent; a touch moves a whole path to the head). Eviction drops the
 * index's references; the bytes come back only for blocks nobody else uses.
 * Pinned bytes are capped: what the blocks on pinned paths (each once) and
 * the snapshots at their ends hold, a block's window rows only while it
 * has them (under a window budget most of a long pinned path has none).
 *
 * Evicted record: a ring of (hash of path[0..d0], d0 + 1, d1) for each
 * evicted leaf: when a later query leaves the cache at depth d0 with the
 * evicted run's first token next, kp_pfx_match says "evicted". The hash is
 * only advisory (a collision mislabels a report, never a hit).
 *
 * Window rows (kvpool.h's window arena, under a window budget only). A
 * block may have lost its WINDOW layers' rows. kp_pfx_match then cuts the
 * reuse to the latest resume point whose window is held
 * (kp_pfx_window_resume, which reads the blocks kp_pfx_acquire would take:
 * path_block), and kp_pfx_drop_windows gives rows up under pressure,
 * sparing the window before every end (mark_ends: leaves, pins, branches,
 * and the resume points the engine marks, kp_pfx_mark: where a message
 * started or a prompt ended; a marked node is never merged into its child
 * nor grown in place, so it stays an end):
 *
 *   path  [0 ........ 64) --+-- [64 .... 80)  leaf      ends: 64 (branch), 80, 72
 *                           +-- [64 .. 72)    leaf
 *   W = 16, B = 16: blocks 3 (48..63) and 4 (64..79) keep their window rows,
 *   blocks 0..2 may give them up
 *
 * Memory accounting: idx_refs[b] counts the index's references to pool
 * block b; a block is "index memory" once if idx_refs[b] > 0; sequences'
 * references are the pool refcount minus idx_refs[b].
 *
 * Time: LRU order and last_used use a logical clock (one tick per
 * operation); pin expiry uses the caller's `now` (no clock calls here).
 *
 * Cost: match, acquire, insert and pin compare the query's tokens along one
 * path (O(n) plus a binary search per node); an eviction step scans the LRU
 * list from its tail for an unheld, unpinned leaf; stats and pinned-byte
 * counts scan the pool's blocks or the pinned paths.
 */
#include "cache/prefix.h"

#include "base/buf.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

struct kp_pfx_node {
    kp_pfx_node *parent;         /* NULL for the root */
    kp_pfx_node **children;      /* sorted by children[i]->tokens[0] */
    uint32_t n_children, cap_children;
    int32_t *tokens;          /* the run: path positions [depth - n_tokens, depth) */
    uint32_t n_tokens, cap_tokens;
    uint32_t depth;
    int32_t *blocks;          /* block indexes first..last of the run, one reference each */
    uint32_t n_blocks, cap_blocks;
    uint32_t hold, hold_here; /* leases on this node or below / on this node */
    uint32_t pin, pin_here;   /* pins likewise */
    uint64_t last_used;       /* logical clock */
    uint64_t hits;
    kp_pfx_state *snaps;         /* recurrent-state snapshots at positions in (d0, d1],
                                    sorted; their blocks are index references */
    uint32_t n_snaps, cap_snaps;
    uint32_t min_end;            /* kp_pfx_drop_windows scratch: the shallowest end
                                    (leaf, branch, pin or mark) in this node's subtree */
    uint32_t min_hard;           /* ... leaf, branch or pin only */
    bool mark;                   /* a resume point ends here (kp_pfx_mark: a message's
                                    start, a prompt's end): never merged into its child
                                    nor grown in place, an end for kp_pfx_drop_windows */
    kp_pfx_node *lru_prev;       /* towards the most recently used */
    kp_pfx_node *lru_next;       /* towards the least recently used */
};

typedef struct {
    uint64_t hash;       /* kp_pfx_hash(path, prefix_len) */
    uint32_t prefix_len; /* evicted node's d0 + 1: its parent's path plus its first token */
    uint32_t evicted_len;
} pfx_evicted;

typedef struct {
    uint64_t id;
    kp_pfx_node *node;
    int64_t expires; /* 0: never */
} pfx_pin_entry;

struct kp_pfx_index {
    kp_kvpool *pool;   /* borrowed */
    kp_pfx_config cfg;
    uint32_t B;        /* positions per block */
    uint64_t block_bytes;
    uint32_t n_pool_blocks;

    kp_pfx_node root;
    kp_pfx_node *lru_head, *lru_tail; /* every non-root node */
    uint32_t n_nodes;

    uint32_t *idx_refs;    /* [n_pool_blocks] the index's references per block */
    uint32_t n_idx_blocks; /* blocks with idx_refs > 0 */
    uint32_t *mark;        /* [n_pool_blocks] scratch for counting distinct blocks */
    uint32_t epoch;

    pfx_evicted *evicted;  /* ring of cfg.evicted_record_size */
    uint32_t n_evicted, evicted_next;

    pfx_pin_entry *pins;
    uint32_t n_pins, cap_pins;
    uint64_t next_pin_id;
    uint32_t n_leases;

    int32_t *path;         /* scratch: a path's tokens */
    uint32_t path_cap;

    uint64_t tick;
    uint64_t n_evictions, evicted_bytes, n_lookups, n_hits, reused_tokens;
    uint64_t window_drops; /* blocks whose window rows kp_pfx_drop_windows dropped */
    uint64_t state_bytes;  /* a recurrent state's bytes (0: no snapshots) */
    uint32_t state_blocks; /* pool blocks of one snapshot */
    uint64_t state_evictions;
};

/* ---- small helpers ------------------------------------------------------ */

static uint32_t node_start(const kp_pfx_node *n) { return n->depth - n->n_tokens; }
static uint32_t first_block(const kp_pfx_index *p, const kp_pfx_node *n) { return node_start(n) / p->B; }
static uint32_t blocks_for(const kp_pfx_index *p, uint32_t start, uint32_t end) {
    return (end - 1) / p->B - start / p->B + 1;
}

uint64_t kp_pfx_hash(const int32_t *tokens, uint32_t n) {
    uint64_t h = 0x9e3779b97f4a7c15ull;
    for (uint32_t i = 0; i < n; i++) {
        h ^= (uint32_t)tokens[i];
        h *= 0xbf58476d1ce4e5b9ull;
        h ^= h >> 31;
    }
    h ^= n;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return h;
}

/* Slot of the child whose run starts with tok (or where it would go). */
static uint32_t child_slot(const kp_pfx_node *n, int32_t tok, bool *found) {
    uint32_t lo = 0, hi = n->n_children;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (n->children[mid]->tokens[0] < tok) lo = mid + 1;
        else hi = mid;
    }
    *found = lo < n->n_children && n->children[lo]->tokens[0] == tok;
    return lo;
}

static bool path_reserve(kp_pfx_index *p, uint32_t n) {
    return kp_grow_u32((void **)&p->path, &p->path_cap, n ? n : 1, sizeof(int32_t));
}

/* Writes the path tokens of n into p->path[0..n->depth) (capacity checked by caller). */
static void fill_path(kp_pfx_index *p, const kp_pfx_node *n) {
    for (; n->parent; n = n->parent)
        memcpy(p->path + node_start(n), n->tokens, (size_t)n->n_tokens * sizeof(int32_t));
}

/* ---- the index's block references --------------------------------------- */

static void idx_ref(kp_pfx_index *p, int32_t b) {
    kp_kvpool_ref(p->pool, b);
    if (p->idx_refs[b]++ == 0) p->n_idx_blocks++;
}

/* Drops one index reference; returns the bytes returned to the pool. */
static uint64_t idx_unref(kp_pfx_index *p, int32_t b) {
    assert(p->idx_refs[b] > 0);
    bool last = kp_kvpool_refcount(p->pool, b) == 1;
    if (--p->idx_refs[b] == 0) p->n_idx_blocks--;
    kp_kvpool_unref(p->pool, b);
    return last ? p->block_bytes : 0;
}

/* An index snapshot's blocks go back; returns the bytes returned to the pool. */
static uint64_t snap_release(kp_pfx_index *p, kp_pfx_state *sn) {
    uint64_t freed = 0;
    for (uint32_t i = 0; i < sn->n_blocks; i++) freed += idx_unref(p, sn->blocks[i]);
    free(sn->blocks);
    memset(sn, 0, sizeof *sn);
    return freed;
}

/* Drops snapshot i of node n; returns the bytes returned to the pool. */
static uint64_t snap_remove(kp_pfx_index *p, kp_pfx_node *n, uint32_t i) {
    uint64_t freed = snap_release(p, &n->snaps[i]);
    memmove(n->snaps + i, n->snaps + i + 1, (size_t)(n->n_snaps - i - 1) * sizeof *n->snaps);
    n->n_snaps--;
    return freed;
}

/* Reads a snapshot's state bytes into dst. */
static void snap_load(const kp_pfx_index *p, const kp_pfx_state *sn, float *dst) {
    uint64_t fb = kp_kvpool_full_bytes(p->pool), left = p->state_bytes;
    uint8_t *d = (uint8_t *)dst;
    for (uint32_t i = 0; i < sn->n_blocks; i++, d += fb, left -= fb)
        kp_kvpool_get(p->pool, sn->blocks[i], d, left < fb ? left : fb);
}

void kp_pfx_state_load(const kp_pfx_index *p, const kp_pfx_state *s, float *state) { snap_load(p, s, state); }

/* The snapshot at a pinned node's end is where the pin resumes: kept. */
static bool snap_evictable(const kp_pfx_node *n, uint32_t i) { return !(n->pin_here && n->snaps[i].pos == n->depth); }

/* ---- LRU list ----------------------------------------------------------- */

static void lru_unlink(kp_pfx_index *p, kp_pfx_node *n) {
    if (n->lru_prev) n->lru_prev->lru_next = n->lru_next;
    else p->lru_head = n->lru_next;
    if (n->lru_next) n->lru_next->lru_prev = n->lru_prev;
    else p->lru_tail = n->lru_prev;
    n->lru_prev = n->lru_next = NULL;
}

static void lru_push_front(kp_pfx_index *p, kp_pfx_node *n) {
    n->lru_prev = NULL;
    n->lru_next = p->lru_head;
    if (p->lru_head) p->lru_head->lru_prev = n;
    else p->lru_tail = n;
    p->lru_head = n;
}

/* Puts u just before n (towards the most recent end). */
static void lru_insert_before(kp_pfx_index *p, kp_pfx_node *u, kp_pfx_node *n) {
    u->lru_next = n;
    u->lru_prev = n->lru_prev;
    if (n->lru_prev) n->lru_prev->lru_next = u;
    else p->lru_head = u;
    n->lru_prev = u;
}

/* Marks the path ending at n as used now. */
static void touch_path(kp_pfx_index *p, kp_pfx_node *n) {
    p->tick++;
    for (; n->parent; n = n->parent) {
        n->last_used = p->tick;
        lru_unlink(p, n);
        lru_push_front(p, n);
    }
}

/* ---- nodes -------------------------------------------------------------- */

static void node_free(kp_pfx_node *n) {
    if (!n) return;
    free(n->snaps); /* the array only: whoever drops a snapshot releases its blocks */
    free(n->children);
    free(n->tokens);
    free(n->blocks);
    free(n);
}

/* A detached node for run tokens[0..n_tokens) ending at depth; block table
 * allocated (n_blocks set) but not filled. NULL on allocation failure. */
static kp_pfx_node *node_new(const kp_pfx_index *p, const int32_t *tokens, uint32_t n_tokens, uint32_t depth,
                          uint32_t cap_children) {
    kp_pfx_node *n = calloc(1, sizeof *n);
    if (!n) return NULL;
    n->depth = depth;
    n->n_tokens = n->cap_tokens = n_tokens;
    n->n_blocks = n->cap_blocks = blocks_for(p, depth - n_tokens, depth);
    n->tokens = malloc((size_t)n_tokens * sizeof(int32_t));
    n->blocks = malloc((size_t)n->n_blocks * sizeof(int32_t));
    if (cap_children) {
        n->children = malloc((size_t)cap_children * sizeof(kp_pfx_node *));
        n->cap_children = cap_children;
    }
    if (!n->tokens || !n->blocks || (cap_children && !n->children)) {
        node_free(n);
        return NULL;
    }
    memcpy(n->tokens, tokens, (size_t)n_tokens * sizeof(int32_t));
    return n;
}

static void hold_path(kp_pfx_node *n) {
    n->hold_here++;
    for (; n; n = n->parent) n->hold++;
}

static void unhold_path(kp_pfx_node *n) {
    assert(n->hold_here > 0);
    n->hold_here--;
    for (; n; n = n->parent) n->hold--;
}

/* Splits n's run at absolute depth `at` (start < at < depth): a new node
 * takes the head and becomes n's parent; n keeps the tail, its children,
 * holds and pins. Returns the new node, NULL (nothing changed) when out of
 * memory. The new node has room for a second child. */
static kp_pfx_node *split(kp_pfx_index *p, kp_pfx_node *n, uint32_t at) {
    uint32_t d0 = node_start(n);
    assert(n->parent && d0 < at && at < n->depth);
    kp_pfx_node *u = node_new(p, n->tokens, at - d0, at, 2);
    if (!u) return NULL;
    uint32_t ns = 0; /* snapshots at or before `at` go to the head */
    while (ns < n->n_snaps && n->snaps[ns].pos <= at) ns++;
    if (ns) {
        if (!(u->snaps = malloc((size_t)ns * sizeof *u->snaps))) {
            node_free(u);
            return NULL;
        }
        memcpy(u->snaps, n->snaps, (size_t)ns * sizeof *u->snaps);
        u->n_snaps = u->cap_snaps = ns;
        memmove(n->snaps, n->snaps + ns, (size_t)(n->n_snaps - ns) * sizeof *n->snaps);
        n->n_snaps -= ns;
    }
    kp_pfx_node *parent = n->parent;
    bool found;
    uint32_t s = child_slot(parent, n->tokens[0], &found); /* before n's run changes */
    assert(found && parent->children[s] == n);
    /* blocks: u takes the leading entries; n keeps indexes at/B onwards */
    uint32_t drop = at / p->B - d0 / p->B;
    memcpy(u->blocks, n->blocks, (size_t)u->n_blocks * sizeof(int32_t));
    if (u->n_blocks > drop) idx_ref(p, n->blocks[drop]); /* mid-block: both hold it */
    memmove(n->blocks, n->blocks + drop, (size_t)(n->n_blocks - drop) * sizeof(int32_t));
    n->n_blocks -= drop;
    memmove(n->tokens, n->tokens + (at - d0), (size_t)(n->depth - at) * sizeof(int32_t));
    n->n_tokens = n->depth - at;
    /* u replaces n under n's parent (same first token, same slot) */
    parent->children[s] = u;
    u->parent = parent;
    u->children[0] = n;
    u->n_children = 1;
    n->parent = u;
    u->hold = n->hold;
    u->pin = n->pin;
    u->last_used = n->last_used;
    u->hits = n->hits;
    lru_insert_before(p, u, n);
    p->n_nodes++;
    return u;
}

/* If n (not the root) has one child and no lease or pin of its own, merges
 * it into that child; the child keeps its identity. Returns bytes returned
 * to the pool (a mid-block boundary may drop n's copy of a block). A merge
 * is optional: skipped when memory is short. */
static uint64_t try_merge(kp_pfx_index *p, kp_pfx_node *n) {
    if (!n->parent || n->n_children != 1 || n->hold_here || n->pin_here || n->mark) return 0;
    kp_pfx_node *c = n->children[0];
    uint32_t overlap = n->depth % p->B ? 1 : 0;
    uint32_t nt = n->n_tokens + c->n_tokens, nb = n->n_blocks - overlap + c->n_blocks;
    int32_t *tokens = malloc((size_t)nt * sizeof(int32_t));
    int32_t *blocks = malloc((size_t)nb * sizeof(int32_t));
    uint32_t ns = n->n_snaps + c->n_snaps;
    kp_pfx_state *snaps = ns ? malloc((size_t)ns * sizeof *snaps) : NULL;
    if (!tokens || !blocks || (ns && !snaps)) {
        free(tokens);
        free(blocks);
        free(snaps);
        return 0;
    }
    if (ns) { /* n's positions come before c's */
        if (n->n_snaps) memcpy(snaps, n->snaps, (size_t)n->n_snaps * sizeof *snaps);
        if (c->n_snaps) memcpy(snaps + n->n_snaps, c->snaps, (size_t)c->n_snaps * sizeof *snaps);
    }
    free(c->snaps);
    c->snaps = snaps;
    c->n_snaps = c->cap_snaps = ns;
    n->n_snaps = 0;
    uint64_t freed = 0;
    memcpy(tokens, n->tokens, (size_t)n->n_tokens * sizeof(int32_t));
    memcpy(tokens + n->n_tokens, c->tokens, (size_t)c->n_tokens * sizeof(int32_t));
    memcpy(blocks, n->blocks, (size_t)(n->n_blocks - overlap) * sizeof(int32_t));
    memcpy(blocks + n->n_blocks - overlap, c->blocks, (size_t)c->n_blocks * sizeof(int32_t));
    if (overlap) freed = idx_unref(p, n->blocks[n->n_blocks - 1]); /* the child's block serves (V) */
    free(c->tokens);
    free(c->blocks);
    c->tokens = tokens;
    c->n_tokens = c->cap_tokens = nt;
    c->blocks = blocks;
    c->n_blocks = c->cap_blocks = nb;
    if (n->hits > c->hits) c->hits = n->hits;
    kp_pfx_node *parent = n->parent;
    bool found;
    uint32_t s = child_slot(parent, n->tokens[0], &found);
    assert(found && parent->children[s] == n);
    parent->children[s] = c;
    c->parent = parent;
    lru_unlink(p, n);
    n->n_children = 0;
    node_free(n);
    p->n_nodes--;
    return freed;
}

/* Fills a new node's block table from seq and takes the index references. */
static void take_seq_blocks(kp_pfx_index *p, kp_pfx_node *n, const kp_kvseq *seq) {
    uint32_t f = first_block(p, n);
    for (uint32_t i = 0; i < n->n_blocks; i++) {
        n->blocks[i] = seq->blocks[f + i];
        idx_ref(p, n->blocks[i]);
    }
}

/* Links the detached node c under parent at slot (room checked by the caller). */
static void link_child(kp_pfx_index *p, kp_pfx_node *parent, uint32_t slot, kp_pfx_node *c) {
    assert(parent->n_children < parent->cap_children);
    memmove(parent->children + slot + 1, parent->children + slot,
            (size_t)(parent->n_children - slot) * sizeof(kp_pfx_node *));
    parent->children[slot] = c;
    parent->n_children++;
    c->parent = parent;
    lru_push_front(p, c);
    p->n_nodes++;
}

/* Extends leaf n (depth m) with tokens[m..end) from seq. */
static kp_status extend_leaf(kp_pfx_index *p, kp_pfx_node *n, const int32_t *tokens, uint32_t end,
                             const kp_kvseq *seq, kp_error *err) {
    uint32_t m = n->depth, d0 = node_start(n);
    uint32_t nt = end - d0, nb = blocks_for(p, d0, end);
    if (!kp_grow_u32((void **)&n->tokens, &n->cap_tokens, nt, sizeof(int32_t)) ||
        !kp_grow_u32((void **)&n->blocks, &n->cap_blocks, nb, sizeof(int32_t)))
        return kp_fail(err, KP_ENOMEM, "out of memory extending a prefix-index run");
    memcpy(n->tokens + n->n_tokens, tokens + m, (size_t)(end - m) * sizeof(int32_t));
    uint32_t f = d0 / p->B;
    if (m % p->B) {
        /* the shared block index: the sequence's block holds all its rows */
        uint32_t j = m / p->B;
        int32_t old = n->blocks[j - f], mine = seq->blocks[j];
        if (old != mine) {
            idx_ref(p, mine);
            n->blocks[j - f] = mine;
            idx_unref(p, old);
        }
    }
    for (uint32_t i = n->n_blocks; i < nb; i++) {
        n->blocks[i] = seq->blocks[f + i];
        idx_ref(p, n->blocks[i]);
    }
    n->n_blocks = nb;
    n->n_tokens = nt;
    n->depth = end;
    return KP_OK;
}

/* Follows tokens[0..n) down the tree. Returns how many matched; *node_out
 * is the node whose run the walk ended on (the root if none) and *off how
 * many of its run's tokens matched (== n_tokens at a node boundary). */
static uint32_t descend(const kp_pfx_index *p, const int32_t *tokens, uint32_t n, kp_pfx_node **node_out,
                        uint32_t *off) {
    kp_pfx_node *node = (kp_pfx_node *)&p->root; /* the tree is only read here */
    uint32_t m = 0, k = 0;
    while (m < n) {
        bool found;
        uint32_t s = child_slot(node, tokens[m], &found);
        if (!found) break;
        kp_pfx_node *c = node->children[s];
        k = 1;
        while (k < c->n_tokens && m + k < n && c->tokens[k] == tokens[m + k]) k++;
        m += k;
        node = c;
        if (k < c->n_tokens) break;
    }
    *node_out = node;
    *off = node->parent ? k : 0;
    return m;
}

/* ---- eviction ----------------------------------------------------------- */

static void record_evicted(kp_pfx_index *p, kp_pfx_node *leaf) {
    uint32_t size = p->cfg.evicted_record_size;
    if (!size || !path_reserve(p, leaf->depth)) return;
    fill_path(p, leaf);
    uint32_t len = node_start(leaf) + 1;
    pfx_evicted *e = &p->evicted[p->evicted_next];
    e->hash = kp_pfx_hash(p->path, len);
    e->prefix_len = len;
    e->evicted_len = leaf->depth;
    p->evicted_next = (p->evicted_next + 1) % size;
    if (p->n_evicted < size) p->n_evicted++;
}

/* Removes an unheld, unpinned leaf; returns bytes returned to the pool. */
static uint64_t evict_leaf(kp_pfx_index *p, kp_pfx_node *leaf) {
    assert(leaf->parent && !leaf->n_children && !leaf->hold && !leaf->pin);
    record_evicted(p, leaf);
    kp_pfx_node *parent = leaf->parent;
    bool found;
    uint32_t s = child_slot(parent, leaf->tokens[0], &found);
    assert(found && parent->children[s] == leaf);
    memmove(parent->children + s, parent->children + s + 1,
            (size_t)(parent->n_children - s - 1) * sizeof(kp_pfx_node *));
    parent->n_children--;
    uint64_t freed = 0;
    for (uint32_t i = 0; i < leaf->n_blocks; i++) freed += idx_unref(p, leaf->blocks[i]);
    while (leaf->n_snaps) freed += snap_remove(p, leaf, leaf->n_snaps - 1);
    lru_unlink(p, leaf);
    node_free(leaf);
    p->n_nodes--;
    p->n_evictions++;
    freed += try_merge(p, parent);
    p->evicted_bytes += freed;
    return freed;
}

/* Evicts until bytes_needed came back or nothing is left: each round the
 * least recently used of the LRU unheld, unpinned leaf and the LRU
 * evictable snapshot (a leaf wins a tie: its snapshots go with it). The
 * snapshot search scans every node's snapshots: O(nodes + snapshots). */
static uint64_t evict_lru(kp_pfx_index *p, uint64_t bytes_needed) {
    uint64_t freed = 0;
    while (freed < bytes_needed) {
        kp_pfx_node *v = p->lru_tail;
        while (v && (v->n_children || v->hold || v->pin)) v = v->lru_prev;
        kp_pfx_node *sn = NULL;
        uint32_t si = 0;
        uint64_t oldest = v ? v->last_used : UINT64_MAX;
        if (p->state_bytes)
            for (kp_pfx_node *x = p->lru_head; x; x = x->lru_next)
                for (uint32_t i = 0; i < x->n_snaps; i++)
                    if (x->snaps[i].last_used < oldest && snap_evictable(x, i)) {
                        oldest = x->snaps[i].last_used;
                        sn = x;
                        si = i;
                    }
        if (sn) {
            uint64_t got = snap_remove(p, sn, si);
            p->state_evictions++;
            p->evicted_bytes += got;
            freed += got;
            continue;
        }
        if (!v) break;
        freed += evict_leaf(p, v);
    }
    return freed;
}

/* ---- window rows (kvpool.h's window arena) ------------------------------ */

/* The block kp_pfx_acquire takes for block index j when it reuses up to
 * the end node `end` (the deepest path node touching j). */
static int32_t path_block(const kp_pfx_index *p, const kp_pfx_node *end, uint32_t j) {
    const kp_pfx_node *x = end;
    while (first_block(p, x) > j) x = x->parent;
    assert(x->parent && j - first_block(p, x) < x->n_blocks);
    return x->blocks[j - first_block(p, x)];
}

uint32_t kp_pfx_window_resume(const kp_pfx_index *p, const int32_t *tokens, uint32_t r) {
    if (!kp_kvpool_window_budgeted(p->pool)) return r;
    uint32_t W = kp_kvpool_config_of(p->pool)->window, B = p->B;
    while (r > 0) {
        kp_pfx_node *node;
        uint32_t off, m = descend(p, tokens, r, &node, &off);
        assert(m == r);
        (void)m;
        /* a query at r reads [r - W + 1, r]: the rows of [lo, r) must be held */
        uint32_t lo = r + 1 > W ? r + 1 - W : 0, cut = UINT32_MAX;
        if (lo >= r) return r;
        for (uint32_t j = (r - 1) / B + 1; j-- > lo / B;)
            if (!kp_kvpool_has_window(p->pool, path_block(p, node, j))) {
                cut = j;
                break;
            }
        if (cut == UINT32_MAX) return r;
        r = cut * B; /* every resume point in (cut * B, r] reads a row of block cut */
    }
    return 0;
}

/* Sets min_end of every node: the shallowest end in its subtree
 * (UINT32_MAX: none). An end is where a resume point is likely: a leaf's
 * depth, a pinned node's, a branch's (a node with several children:
 * prompts parted there, as a conversation's next turn from the answer the
 * previous one was given) and a marked one's (kp_pfx_mark: where a
 * message started or a prompt ended). */
static void mark_ends(kp_pfx_index *p) {
    for (kp_pfx_node *n = p->lru_head; n; n = n->lru_next) n->min_end = n->min_hard = UINT32_MAX;
    for (kp_pfx_node *n = p->lru_head; n; n = n->lru_next) {
        if (n->n_children != 1 || n->pin_here)
            for (kp_pfx_node *x = n; x->parent && x->min_hard > n->depth; x = x->parent) x->min_hard = n->depth;
        if (n->n_children != 1 || n->pin_here || n->mark)
            for (kp_pfx_node *x = n; x->parent && x->min_end > n->depth; x = x->parent) x->min_end = n->depth;
    }
}

/* True when no running sequence reads block b's window rows: every
 * reference to it is the index's or marked done (kvpool.h's window
 * readers), and it has them. */
static bool window_unread(const kp_pfx_index *p, int32_t b) {
    return kp_kvpool_window_readers(p->pool, b) == p->idx_refs[b] && kp_kvpool_has_window(p->pool, b);
}

/* One pass of kp_pfx_drop_windows over the LRU list (marks: spare the
 * windows before marked ends too), adding to *got up to n_needed. */
static void drop_pass(kp_pfx_index *p, uint32_t n_needed, uint32_t *got, bool marks) {
    uint32_t W = kp_kvpool_config_of(p->pool)->window, B = p->B;
    /* least recently used first; the nodes one touch left with the same
     * last_used (a path, root-most nearest the head) shallowest first, so
     * a conversation gives up its oldest resume points first */
    for (kp_pfx_node *last = p->lru_tail; last && *got < n_needed;) {
        kp_pfx_node *first = last;
        while (first->lru_prev && first->lru_prev->last_used == last->last_used) first = first->lru_prev;
        for (kp_pfx_node *n = first;; n = n->lru_next) {
            uint32_t f = first_block(p, n), end = marks ? n->min_end : n->min_hard;
            for (uint32_t i = 0; i < n->n_blocks && *got < n_needed; i++) {
                int32_t b = n->blocks[i];
                /* a resume point at an end e reads [e - W, e) (e - 1 too, the
                 * full hit's recomputed last position): keep block f + i if it
                 * reaches into that run of the nearest end below */
                if ((uint64_t)(f + i + 1) * B + W > end || !window_unread(p, b)) continue;
                kp_kvpool_drop_window(p->pool, b);
                (*got)++;
            }
            if (n == last) break;
        }
        last = first->lru_prev;
    }
}

uint32_t kp_pfx_drop_windows(kp_pfx_index *p, uint32_t n_needed) {
    if (!kp_kvpool_window_budgeted(p->pool) || n_needed == 0) return 0;
    uint32_t got = 0;
    mark_ends(p);
    drop_pass(p, n_needed, &got, true);
    /* the windows before marked ends (messages' starts) are the first resume points to go, oldest first */
    if (got < n_needed) drop_pass(p, n_needed, &got, false);
    p->window_drops += got;
    return got;
}

void kp_pfx_window_spare(kp_pfx_index *p, uint8_t *out) {
    memset(out, 0, p->n_pool_blocks);
    if (!kp_kvpool_window_budgeted(p->pool)) return;
    uint32_t W = kp_kvpool_config_of(p->pool)->window, B = p->B;
    mark_ends(p);
    for (kp_pfx_node *n = p->lru_head; n; n = n->lru_next) /* drop_pass's test, the second pass's ends */
        for (uint32_t i = 0, f = first_block(p, n); i < n->n_blocks; i++) {
            int32_t b = n->blocks[i];
            if ((uint64_t)(f + i + 1) * B + W <= n->min_hard && window_unread(p, b)) out[b] = 1;
        }
}

kp_status kp_pfx_mark(kp_pfx_index *p, const int32_t *tokens, uint32_t n, kp_error *err) {
    if (n == 0) return KP_OK;
    kp_pfx_node *node;
    uint32_t off, m = descend(p, tokens, n, &node, &off);
    if (m < n) return kp_fail(err, KP_ENOTFOUND, "cannot mark position %u: only %u tokens are cached", n, m);
    if (off < node->n_tokens && !(node = split(p, node, n)))
        return kp_fail(err, KP_ENOMEM, "out of memory splitting a run to mark a resume point");
    node->mark = true;
    return KP_OK;
}

/* ---- public API --------------------------------------------------------- */

kp_status kp_pfx_new(kp_pfx_index **out, kp_kvpool *pool, const kp_pfx_config *cfg, kp_error *err) {
    *out = NULL;
    if (!pool) return kp_fail(err, KP_EINVAL, "the prefix index needs a KV pool");
    kp_pfx_index *p = calloc(1, sizeof *p);
    if (!p) return kp_fail(err, KP_ENOMEM, "out of memory creating the prefix index");
    p->pool = pool;
    p->B = kp_kvpool_config_of(pool)->block_size;
    p->block_bytes = kp_kvpool_block_bytes(pool);
    p->n_pool_blocks = kp_kvpool_n_blocks(pool);
    if (cfg) {
        p->cfg = *cfg;
    } else {
        /* half of each arena: the blocks' rows and, under a window budget, the window slots' */
        p->cfg.pinned_cap_bytes = (uint64_t)p->n_pool_blocks / 2 * kp_kvpool_full_bytes(pool) +
                                  (uint64_t)kp_kvpool_n_slots(pool) / 2 * kp_kvpool_window_bytes(pool);
        p->cfg.evicted_record_size = 256;
    }
    p->idx_refs = calloc(p->n_pool_blocks, sizeof(uint32_t));
    p->mark = calloc(p->n_pool_blocks, sizeof(uint32_t));
    if (p->cfg.evicted_record_size)
        p->evicted = calloc(p->cfg.evicted_record_size, sizeof(pfx_evicted));
    if (!p->idx_refs || !p->mark || (p->cfg.evicted_record_size && !p->evicted)) {
        kp_pfx_free(p);
        return kp_fail(err, KP_ENOMEM, "out of memory creating the prefix index");
    }
    *out = p;
    return KP_OK;
}

void kp_pfx_free(kp_pfx_index *p) {
    if (!p) return;
    /* post-order: free the last child's subtree first */
    kp_pfx_node *n = &p->root;
    for (;;) {
        if (n->n_children) {
            n = n->children[n->n_children - 1];
            continue;
        }
        if (!n->parent) break;
        kp_pfx_node *parent = n->parent;
        for (uint32_t i = 0; i < n->n_blocks; i++) idx_unref(p, n->blocks[i]);
        for (uint32_t i = 0; i < n->n_snaps; i++) snap_release(p, &n->snaps[i]);
        node_free(n);
        parent->n_children--;
        n = parent;
    }
    free(p->root.children);
    free(p->idx_refs);
    free(p->mark);
    free(p->evicted);
    free(p->pins);
    free(p->path);
    free(p);
}

void kp_pfx_match(const kp_pfx_index *p, const int32_t *tokens, uint32_t n, kp_pfx_match_result *out) {
    memset(out, 0, sizeof *out);
    out->cached_next = -1;
    kp_pfx_node *node;
    uint32_t off;
    uint32_t m = descend(p, tokens, n, &node, &off);
    out->n_match = m;
    out->n_reuse = m == n && n > 0 ? n - 1 : m;
    uint32_t resume = kp_pfx_window_resume(p, tokens, out->n_reuse);
    if (resume < out->n_reuse) {
        out->window_cut_from = out->n_reuse;
        out->n_reuse = resume;
    }
    resume = kp_pfx_resume(p, tokens, out->n_reuse);
    if (resume < out->n_reuse) {
        out->state_cut_from = out->n_reuse;
        out->n_reuse = resume;
    }
    if (node->parent) {
        out->edge_start = node_start(node);
        out->edge_end = node->depth;
    }
    if (off < node->n_tokens) {
        out->cached_next = node->tokens[off];
        out->n_continuations = 1;
    } else {
        out->n_continuations = node->n_children;
        if (node->n_children == 1) out->cached_next = node->children[0]->tokens[0];
    }
    if (m < n && p->n_evicted) {
        uint64_t h = kp_pfx_hash(tokens, m + 1);
        uint32_t size = p->cfg.evicted_record_size;
        for (uint32_t i = 0; i < p->n_evicted; i++) {
            const pfx_evicted *e = &p->evicted[(p->evicted_next + size - 1 - i) % size];
            if (e->prefix_len == m + 1 && e->hash == h) {
                out->evicted = true;
                out->evicted_len = e->evicted_len;
                break;
            }
        }
    }
}

kp_status kp_pfx_acquire(kp_pfx_index *p, const int32_t *tokens, uint32_t n_reuse, kp_kvseq *seq,
                      kp_pfx_lease *lease, kp_error *err) {
    if (seq->n_blocks || seq->n_pos)
        return kp_fail(err, KP_EINVAL, "kp_pfx_acquire needs an empty sequence (it has %u positions)", seq->n_pos);
    if (lease && lease->node)
        return kp_fail(err, KP_EINVAL, "kp_pfx_acquire: the lease already holds a path; release it first");
    if (n_reuse == 0) {
        p->n_lookups++;
        return KP_OK;
    }
    kp_pfx_node *node;
    uint32_t off;
    uint32_t m = descend(p, tokens, n_reuse, &node, &off);
    if (m < n_reuse)
        return kp_fail(err, KP_EINVAL, "only %u of the %u positions to reuse are cached", m, n_reuse);
    uint32_t B = p->B, nb = (uint32_t)(((uint64_t)n_reuse + B - 1) / B);
    kp_pfx_state *snap = NULL; /* with states: the snapshot at n_reuse, on node (its run holds n_reuse) */
    float *state = NULL;
    if (p->state_bytes) {
        for (uint32_t i = 0; i < node->n_snaps; i++)
            if (node->snaps[i].pos == n_reuse) snap = &node->snaps[i];
        if (!snap)
            return kp_fail(err, KP_EINVAL, "no recurrent-state snapshot at position %u to resume from", n_reuse);
        if (seq->rstate) return kp_fail(err, KP_EINVAL, "kp_pfx_acquire needs a sequence without a state");
        if (!(state = malloc((size_t)p->state_bytes)))
            return kp_fail(err, KP_ENOMEM, "out of memory for a recurrent state");
        snap_load(p, snap, state); /* now: the partial block's copy below may evict the snapshot */
    }
    bool fresh = seq->blocks == NULL;
    if (!kp_grow_u32((void **)&seq->blocks, &seq->cap_blocks, nb, sizeof(int32_t))) {
        free(state);
        return kp_fail(err, KP_ENOMEM, "out of memory growing a block table");
    }
    /* each block index from the deepest path node touching it below n_reuse */
    uint32_t lo = nb;
    for (kp_pfx_node *x = node; x->parent && lo > 0; x = x->parent) {
        uint32_t e = x->depth < n_reuse ? x->depth : n_reuse;
        uint32_t f = first_block(p, x), last = (e - 1) / B;
        if (last >= lo) last = lo - 1;
        for (uint32_t i = f; i <= last; i++) seq->blocks[i] = x->blocks[i - f];
        if (f < lo) lo = f;
    }
    assert(lo == 0);
    hold_path(node); /* protects the path if the copy below must evict */
    for (uint32_t i = 0; i < nb; i++) kp_kvpool_ref(p->pool, seq->blocks[i]);
    if (n_reuse % B) {
        int32_t copy;
        kp_status st = kp_kvpool_alloc(p->pool, &copy, NULL);
        if (st == KP_EFULL) {
            evict_lru(p, p->block_bytes);
            st = kp_kvpool_alloc(p->pool, &copy, NULL);
        }
        /* the copy takes the window rows too (a window slot, with a budget) */
        if (st == KP_OK && (st = kp_kvpool_copy(p->pool, copy, seq->blocks[nb - 1], NULL)) != KP_OK)
            kp_kvpool_unref(p->pool, copy);
        if (st != KP_OK) {
            for (uint32_t i = 0; i < nb; i++) kp_kvpool_unref(p->pool, seq->blocks[i]);
            if (fresh) { /* leave *seq as it came */
                free(seq->blocks);
                seq->blocks = NULL;
                seq->cap_blocks = 0;
            }
            unhold_path(node);
            try_merge(p, node);
            free(state);
            return kp_fail(err, KP_EFULL,
                           "KV pool full: no block (or window slot) for the copy of the partial block at "
                           "position %u",
                           n_reuse - 1);
        }
        kp_kvpool_unref(p->pool, seq->blocks[nb - 1]);
        seq->blocks[nb - 1] = copy;
    }
    seq->n_blocks = nb;
    seq->n_pos = n_reuse;
    touch_path(p, node);
    if (state) {
        seq->rstate = state;
        seq->rstate_pos = n_reuse;
        for (uint32_t i = 0; i < node->n_snaps; i++) /* unless the copy's eviction took it */
            if (node->snaps[i].pos == n_reuse) node->snaps[i].last_used = p->tick;
    }
    for (kp_pfx_node *x = node; x->parent; x = x->parent) x->hits++;
    p->n_lookups++;
    p->n_hits++;
    p->reused_tokens += n_reuse;
    if (lease) {
        lease->node = node;
        p->n_leases++;
    } else {
        unhold_path(node);
        try_merge(p, node);
    }
    return KP_OK;
}

kp_status kp_pfx_insert(kp_pfx_index *p, const int32_t *tokens, uint32_t n, const kp_kvseq *seq,
                     kp_pfx_lease *lease, uint32_t *n_added, kp_error *err) {
    if (n_added) *n_added = 0;
    if (n == 0) return KP_OK;
    if (seq->n_pos < n || seq->n_blocks < ((uint64_t)n + p->B - 1) / p->B)
        return kp_fail(err, KP_EINVAL, "cannot index %u positions from a sequence of %u (%u blocks)", n,
                       seq->n_pos, seq->n_blocks);
    kp_pfx_node *node = &p->root, *target = NULL;
    uint32_t m = 0, added = 0;
    while (!target) {
        if (m == n) {
            target = node;
            break;
        }
        bool found;
        uint32_t s = child_slot(node, tokens[m], &found);
        if (!found) {
            if (node->parent && node->n_children == 0 && node->pin == 0 && !node->mark) {
                kp_status st = extend_leaf(p, node, tokens, n, seq, err);
                if (st != KP_OK) return st;
                target = node;
            } else {
                kp_pfx_node *c = node_new(p, tokens + m, n - m, n, 0);
                if (!c || !kp_grow_u32((void **)&node->children, &node->cap_children,
                                       node->n_children + 1, sizeof(kp_pfx_node *))) {
                    node_free(c);
                    return kp_fail(err, KP_ENOMEM, "out of memory adding a prefix-index node");
                }
                take_seq_blocks(p, c, seq);
                link_child(p, node, s, c);
                target = c;
            }
            added = n - m;
            break;
        }
        kp_pfx_node *c = node->children[s];
        uint32_t k = 1;
        while (k < c->n_tokens && m + k < n && c->tokens[k] == tokens[m + k]) k++;
        if (k == c->n_tokens) {
            node = c;
            m += k;
            continue;
        }
        if (m + k == n) { /* the tokens end inside c's run: all cached */
            target = c;
            break;
        }
        /* diverges mid-run at depth m + k: split there, add the new tail */
        uint32_t at = m + k;
        kp_pfx_node *leaf = node_new(p, tokens + at, n - at, n, 0);
        kp_pfx_node *u = leaf ? split(p, c, at) : NULL;
        if (!u) {
            node_free(leaf);
            return kp_fail(err, KP_ENOMEM, "out of memory splitting a prefix-index run");
        }
        take_seq_blocks(p, leaf, seq);
        link_child(p, u, child_slot(u, tokens[at], &found), leaf);
        target = leaf;
        added = n - at;
    }
    touch_path(p, target);
    if (lease) {
        kp_pfx_node *old = lease->node;
        hold_path(target);
        lease->node = target;
        if (old) {
            unhold_path(old);
            try_merge(p, old);
        } else {
            p->n_leases++;
        }
    }
    if (n_added) *n_added = added;
    return KP_OK;
}

/* ---- recurrent-state snapshots (prefix.h's top) ------------------------- */

kp_status kp_pfx_set_state(kp_pfx_index *p, uint64_t state_bytes, kp_error *err) {
    if (p->n_nodes) return kp_fail(err, KP_EINVAL, "state snapshots are turned on before anything is indexed");
    uint64_t fb = kp_kvpool_full_bytes(p->pool);
    if (state_bytes && !fb) return kp_fail(err, KP_EINVAL, "a pool without full-layer rows cannot hold states");
    p->state_bytes = state_bytes;
    p->state_blocks = state_bytes ? (uint32_t)((state_bytes + fb - 1) / fb) : 0;
    return KP_OK;
}

uint64_t kp_pfx_state_bytes(const kp_pfx_index *p) { return p->state_bytes; }
uint32_t kp_pfx_state_blocks(const kp_pfx_index *p) { return p->state_blocks; }

void kp_pfx_state_drop(kp_pfx_index *p, kp_pfx_state *s) {
    for (uint32_t i = 0; i < s->n_blocks; i++) kp_kvpool_unref(p->pool, s->blocks[i]);
    free(s->blocks);
    memset(s, 0, sizeof *s);
}

kp_status kp_pfx_state_save(kp_pfx_index *p, const float *state, uint32_t pos, kp_pfx_state *out, kp_error *err) {
    memset(out, 0, sizeof *out);
    if (!p->state_bytes) return kp_fail(err, KP_EINVAL, "the prefix index keeps no recurrent states");
    if (!(out->blocks = malloc((size_t)p->state_blocks * sizeof *out->blocks)))
        return kp_fail(err, KP_ENOMEM, "out of memory for a state snapshot");
    out->pos = pos;
    while (out->n_blocks < p->state_blocks) {
        if (kp_kvpool_alloc(p->pool, &out->blocks[out->n_blocks], NULL) == KP_OK) {
            out->n_blocks++;
            continue;
        }
        if (evict_lru(p, (uint64_t)(p->state_blocks - out->n_blocks) * p->block_bytes) == 0) {
            kp_pfx_state_drop(p, out);
            return kp_fail(err, KP_EFULL, "KV pool full: no room for a state snapshot of %u blocks", p->state_blocks);
        }
    }
    uint64_t fb = kp_kvpool_full_bytes(p->pool), left = p->state_bytes;
    const uint8_t *src = (const uint8_t *)state;
    for (uint32_t i = 0; i < out->n_blocks; i++, src += fb, left -= fb)
        kp_kvpool_put(p->pool, out->blocks[i], src, left < fb ? left : fb);
    return KP_OK;
}

kp_status kp_pfx_add_state(kp_pfx_index *p, const int32_t *tokens, kp_pfx_state *s, kp_error *err) {
    if (!p->state_bytes || !s->blocks || s->pos == 0 || s->n_blocks != p->state_blocks)
        return kp_fail(err, KP_EINVAL, "not a state snapshot of this index");
    kp_pfx_node *node;
    uint32_t off;
    if (descend(p, tokens, s->pos, &node, &off) < s->pos)
        return kp_fail(err, KP_ENOTFOUND, "the %u positions of a state snapshot are not cached", s->pos);
    uint32_t i = 0; /* node's run holds pos: d0 < pos <= d1 */
    while (i < node->n_snaps && node->snaps[i].pos < s->pos) i++;
    if (i < node->n_snaps && node->snaps[i].pos == s->pos) { /* stored once */
        kp_pfx_state_drop(p, s);
        return KP_OK;
    }
    if (!kp_grow_u32((void **)&node->snaps, &node->cap_snaps, node->n_snaps + 1, sizeof *node->snaps))
        return kp_fail(err, KP_ENOMEM, "out of memory adding a state snapshot");
    memmove(node->snaps + i + 1, node->snaps + i, (size_t)(node->n_snaps - i) * sizeof *node->snaps);
    node->n_snaps++;
    for (uint32_t k = 0; k < s->n_blocks; k++) /* the caller's references become the index's */
        if (p->idx_refs[s->blocks[k]]++ == 0) p->n_idx_blocks++;
    node->snaps[i] = *s;
    node->snaps[i].last_used = ++p->tick;
    memset(s, 0, sizeof *s);
    return KP_OK;
}

bool kp_pfx_state_read(const kp_pfx_index *p, const int32_t *tokens, uint32_t pos, float *dst) {
    kp_pfx_node *node;
    uint32_t off;
    if (!p->state_bytes || pos == 0 || descend(p, tokens, pos, &node, &off) < pos) return false;
    for (uint32_t i = 0; i < node->n_snaps; i++) /* node's run holds pos: d0 < pos <= d1 */
        if (node->snaps[i].pos == pos) {
            snap_load(p, &node->snaps[i], dst);
            return true;
        }
    return false;
}

/* The latest snapshot position <= r on the cached path tokens[0..r). */
static uint32_t state_resume(const kp_pfx_index *p, const int32_t *tokens, uint32_t r) {
    if (!p->state_bytes || r == 0) return r;
    kp_pfx_node *node;
    uint32_t off;
    uint32_t m = descend(p, tokens, r, &node, &off);
    assert(m == r);
    (void)m;
    for (; node->parent; node = node->parent) /* deeper nodes hold later positions */
        for (uint32_t i = node->n_snaps; i-- > 0;)
            if (node->snaps[i].pos <= r) return node->snaps[i].pos;
    return 0;
}

uint32_t kp_pfx_resume(const kp_pfx_index *p, const int32_t *tokens, uint32_t r) {
    for (;;) {
        uint32_t w = kp_pfx_window_resume(p, tokens, r), s = state_resume(p, tokens, w);
        if (s == r) return r;
        r = s;
    }
}

uint32_t kp_pfx_state_evictable_blocks(const kp_pfx_index *p) {
    uint32_t n = 0;
    for (const kp_pfx_node *x = p->lru_head; x; x = x->lru_next)
        for (uint32_t i = 0; i < x->n_snaps; i++)
            if (snap_evictable(x, i)) n += x->snaps[i].n_blocks;
    return n;
}

void kp_pfx_release(kp_pfx_index *p, kp_pfx_lease *lease) {
    if (!lease || !lease->node) return;
    kp_pfx_node *n = lease->node;
    lease->node = NULL;
    unhold_path(n);
    p->n_leases--;
    try_merge(p, n);
}

uint64_t kp_pfx_evict(kp_pfx_index *p, uint64_t bytes_needed, int64_t now) {
    kp_pfx_expire(p, now);
    return evict_lru(p, bytes_needed);
}

/* The bytes block b holds: its main-arena rows, and its window rows when
 * it has them (under a window budget a block may have dropped them;
 * without one, full + window = block_bytes). */
static uint64_t held_bytes(const kp_pfx_index *p, int32_t b) {
    return kp_kvpool_full_bytes(p->pool) + (kp_kvpool_has_window(p->pool, b) ? kp_kvpool_window_bytes(p->pool) : 0);
}

/* Bytes the distinct blocks on pinned paths hold (held_bytes: what each
 * really holds, window rows only where kept), plus on the path of extra
 * (may be NULL). */
static uint64_t count_pinned_bytes(kp_pfx_index *p, const kp_pfx_node *extra) {
    if (++p->epoch == 0) {
        memset(p->mark, 0, (size_t)p->n_pool_blocks * sizeof(uint32_t));
        p->epoch = 1;
    }
    uint64_t bytes = 0;
    for (uint32_t i = 0; i <= p->n_pins; i++) {
        const kp_pfx_node *n = i < p->n_pins ? p->pins[i].node : extra;
        for (uint32_t k = 0; n && k < n->n_snaps; k++) /* the snapshot the pin resumes from */
            if (n->snaps[k].pos == n->depth)
                for (uint32_t j = 0; j < n->snaps[k].n_blocks; j++)
                    if (p->mark[n->snaps[k].blocks[j]] != p->epoch) {
                        p->mark[n->snaps[k].blocks[j]] = p->epoch;
                        bytes += held_bytes(p, n->snaps[k].blocks[j]);
                    }
        for (; n && n->parent; n = n->parent)
            for (uint32_t b = 0; b < n->n_blocks; b++)
                if (p->mark[n->blocks[b]] != p->epoch) {
                    p->mark[n->blocks[b]] = p->epoch;
                    bytes += held_bytes(p, n->blocks[b]);
                }
    }
    return bytes;
}

kp_status kp_pfx_pin(kp_pfx_index *p, const int32_t *tokens, uint32_t n, int64_t ttl_seconds, int64_t now,
                  uint64_t *id, kp_error *err) {
    *id = 0;
    if (n == 0) return kp_fail(err, KP_EINVAL, "cannot pin an empty prefix");
    if (ttl_seconds < 0) return kp_fail(err, KP_EINVAL, "pin ttl %lld is negative", (long long)ttl_seconds);
    kp_pfx_node *node;
    uint32_t off;
    uint32_t m = descend(p, tokens, n, &node, &off);
    if (m < n) return kp_fail(err, KP_ENOTFOUND, "cannot pin: only %u of the %u tokens are cached", m, n);
    bool did_split = false;
    if (off < node->n_tokens) {
        kp_pfx_node *u = split(p, node, n);
        if (!u) return kp_fail(err, KP_ENOMEM, "out of memory splitting a run to pin it");
        node = u;
        did_split = true;
    }
    uint64_t bytes = count_pinned_bytes(p, node);
    if (bytes > p->cfg.pinned_cap_bytes) {
        if (did_split) try_merge(p, node);
        return kp_fail(err, KP_EFULL, "pinning %u tokens would make %llu pinned bytes, over the cap of %llu", n,
                       (unsigned long long)bytes, (unsigned long long)p->cfg.pinned_cap_bytes);
    }
    if (!kp_grow_u32((void **)&p->pins, &p->cap_pins, p->n_pins + 1, sizeof(pfx_pin_entry))) {
        if (did_split) try_merge(p, node);
        return kp_fail(err, KP_ENOMEM, "out of memory recording a pin");
    }
    node->pin_here++;
    for (kp_pfx_node *x = node; x; x = x->parent) x->pin++;
    pfx_pin_entry *e = &p->pins[p->n_pins++];
    e->id = ++p->next_pin_id;
    e->node = node;
    e->expires = ttl_seconds ? now + ttl_seconds : 0;
    touch_path(p, node);
    *id = e->id;
    return KP_OK;
}

static void unpin_at(kp_pfx_index *p, uint32_t i) {
    kp_pfx_node *n = p->pins[i].node;
    p->pins[i] = p->pins[--p->n_pins];
    assert(n->pin_here > 0);
    n->pin_here--;
    for (kp_pfx_node *x = n; x; x = x->parent) x->pin--;
    try_merge(p, n);
}

kp_status kp_pfx_unpin(kp_pfx_index *p, uint64_t id, kp_error *err) {
    for (uint32_t i = 0; i < p->n_pins; i++)
        if (p->pins[i].id == id) {
            unpin_at(p, i);
            return KP_OK;
        }
    return kp_fail(err, KP_ENOTFOUND, "no pin with id %llu (expired or never made)", (unsigned long long)id);
}

uint32_t kp_pfx_expire(kp_pfx_index *p, int64_t now) {
    uint32_t n = 0;
    for (uint32_t i = 0; i < p->n_pins;) {
        if (p->pins[i].expires && p->pins[i].expires <= now) {
            unpin_at(p, i);
            n++;
        } else {
            i++;
        }
    }
    return n;
}

void kp_pfx_get_stats(kp_pfx_index *p, kp_pfx_stats *out) {
    memset(out, 0, sizeof *out);
    uint64_t bb = p->block_bytes;
    out->block_bytes = bb;
    out->budget_bytes = (uint64_t)p->n_pool_blocks * bb;
    out->used_bytes = (uint64_t)(p->n_pool_blocks - kp_kvpool_n_free(p->pool)) * bb;
    out->free_bytes = out->budget_bytes - out->used_bytes;
    out->index_bytes = (uint64_t)p->n_idx_blocks * bb;
    for (uint32_t b = 0; b < p->n_pool_blocks; b++)
        if (p->idx_refs[b] && kp_kvpool_has_window(p->pool, (int32_t)b)) out->index_window_blocks++;
    out->pinned_bytes = count_pinned_bytes(p, NULL);
    out->pinned_cap_bytes = p->cfg.pinned_cap_bytes;
    for (uint32_t b = 0; b < p->n_pool_blocks; b++) {
        if (!p->idx_refs[b]) continue;
        uint32_t seq_refs = kp_kvpool_refcount(p->pool, (int32_t)b) - p->idx_refs[b];
        if (seq_refs) {
            out->shared_bytes += bb;
            out->saved_bytes += seq_refs * bb;
        }
    }
    for (const kp_pfx_node *n = p->lru_head; n; n = n->lru_next) {
        out->n_nodes++;
        if (!n->n_children) out->n_leaves++;
        out->cached_tokens += n->n_tokens;
        out->n_states += n->n_snaps;
    }
    out->state_bytes = (uint64_t)out->n_states * p->state_blocks * bb;
    out->state_evictions = p->state_evictions;
    out->n_pins = p->n_pins;
    out->n_leases = p->n_leases;
    out->n_evictions = p->n_evictions;
    out->evicted_bytes = p->evicted_bytes;
    out->n_lookups = p->n_lookups;
    out->n_hits = p->n_hits;
    out->reused_tokens = p->reused_tokens;
    out->window_drops = p->window_drops;
}

/* Preorder successor (root excluded from the walk; NULL at the end). */
static kp_pfx_node *next_preorder(kp_pfx_node *n) {
    if (n->n_children) return n->children[0];
    for (; n->parent; n = n->parent) {
        bool found;
        uint32_t s = child_slot(n->parent, n->tokens[0], &found);
        if (s + 1 < n->parent->n_children) return n->parent->children[s + 1];
    }
    return NULL;
}

kp_status kp_pfx_walk(kp_pfx_index *p, kp_pfx_walk_fn fn, void *ctx, kp_error *err) {
    for (kp_pfx_node *n = next_preorder(&p->root); n; n = next_preorder(n)) {
        if (!path_reserve(p, n->depth)) return kp_fail(err, KP_ENOMEM, "out of memory walking the prefix index");
        /* preorder: the ancestors already wrote path[0..start) */
        memcpy(p->path + node_start(n), n->tokens, (size_t)n->n_tokens * sizeof(int32_t));
        kp_pfx_node_info info = {
            .path = p->path,
            .start = node_start(n),
            .end = n->depth,
            .blocks = n->blocks,
            .first_block = first_block(p, n),
            .n_blocks = n->n_blocks,
            .n_children = n->n_children,
            .n_holders = n->hold,
            .n_pins = n->pin,
            .last_used = n->last_used,
            .hits = n->hits,
        };
        if (fn(&info, ctx)) break;
    }
    return KP_OK;
}

/* A leaf's blocks that no other index node holds (a mid-block start shares
 * the parent's last block when it is the same block). */
static uint32_t own_blocks(const kp_pfx_node *leaf) {
    const kp_pfx_node *parent = leaf->parent;
    bool shares = parent->parent && parent->blocks[parent->n_blocks - 1] == leaf->blocks[0];
    return leaf->n_blocks - (shares ? 1 : 0);
}

kp_status kp_pfx_top(kp_pfx_index *p, kp_pfx_prefix_info *out, uint32_t max, uint32_t *n_out, kp_error *err) {
    *n_out = 0;
    if (max == 0) return KP_OK;
    /* the max deepest leaves, by insertion into out (kept sorted) */
    const kp_pfx_node **pick = calloc(max, sizeof *pick);
    if (!pick) return kp_fail(err, KP_ENOMEM, "out of memory listing cached prefixes");
    uint32_t n_pick = 0;
    for (const kp_pfx_node *n = p->lru_head; n; n = n->lru_next) {
        if (n->n_children) continue;
        uint32_t i = n_pick < max ? n_pick++ : max;
        while (i > 0 && pick[i - 1]->depth < n->depth) {
            if (i < max) pick[i] = pick[i - 1];
            i--;
        }
        if (i < max) pick[i] = n;
    }
    for (uint32_t i = 0; i < n_pick; i++) {
        const kp_pfx_node *n = pick[i];
        if (!path_reserve(p, n->depth)) {
            free(pick);
            return kp_fail(err, KP_ENOMEM, "out of memory listing cached prefixes");
        }
        fill_path(p, n);
        kp_pfx_prefix_info *o = &out[i];
        o->hash = kp_pfx_hash(p->path, n->depth);
        o->n_tokens = n->depth;
        o->n_head = n->depth < KP_PFX_HEAD_TOKENS ? n->depth : KP_PFX_HEAD_TOKENS;
        memcpy(o->head, p->path, (size_t)o->n_head * sizeof(int32_t));
        o->bytes = (uint64_t)((n->depth + p->B - 1) / p->B) * p->block_bytes;
        o->own_bytes = (uint64_t)own_blocks(n) * p->block_bytes;
        o->n_holders = n->hold;
        o->pinned = n->pin > 0;
        o->last_used = n->last_used;
        o->hits = n->hits;
    }
    free(pick);
    *n_out = n_pick;
    return KP_OK;
}

kp_status kp_pfx_check(kp_pfx_index *p, kp_error *err) {
    const kp_pfx_node *root = &p->root;
    if (root->n_tokens || root->depth || root->n_blocks || root->hold_here || root->pin_here)
        return kp_fail(err, KP_EFORMAT, "prefix index: the root has a run, blocks, a lease or a pin");
    uint32_t *refs = calloc(p->n_pool_blocks ? p->n_pool_blocks : 1, sizeof(uint32_t));
    if (!refs) return kp_fail(err, KP_ENOMEM, "out of memory checking the prefix index");
    kp_status st = KP_OK;
    uint64_t leases = 0, pins = 0;
    uint32_t n_nodes = 0;
    for (kp_pfx_node *n = &p->root; n && st == KP_OK; n = next_preorder(n)) {
        uint32_t hold = n->hold_here, pin = n->pin_here;
        leases += n->hold_here;
        pins += n->pin_here;
        for (uint32_t i = 0; i < n->n_children; i++) {
            const kp_pfx_node *c = n->children[i];
            hold += c->hold;
            pin += c->pin;
            if (c->parent != n)
                st = kp_fail(err, KP_EFORMAT, "prefix index: child %u at depth %u has a wrong parent", i, n->depth);
            else if (i > 0 && n->children[i - 1]->tokens[0] >= c->tokens[0])
                st = kp_fail(err, KP_EFORMAT, "prefix index: children at depth %u are not sorted/distinct", n->depth);
        }
        if (st != KP_OK) break;
        if (hold != n->hold || pin != n->pin) {
            st = kp_fail(err, KP_EFORMAT, "prefix index: node at depth %u counts %u holds / %u pins, expected %u / %u",
                         n->depth, n->hold, n->pin, hold, pin);
            break;
        }
        if (!n->parent) continue;
        n_nodes++;
        if (n->n_tokens == 0 || n->depth != n->parent->depth + n->n_tokens) {
            st = kp_fail(err, KP_EFORMAT, "prefix index: node at depth %u has a run of %u after depth %u",
                         n->depth, n->n_tokens, n->parent->depth);
            break;
        }
        if (n->n_blocks != blocks_for(p, node_start(n), n->depth)) {
            st = kp_fail(err, KP_EFORMAT, "prefix index: run %u..%u holds %u blocks", node_start(n), n->depth,
                         n->n_blocks);
            break;
        }
        if (n->last_used > p->tick) {
            st = kp_fail(err, KP_EFORMAT, "prefix index: node used in the future");
            break;
        }
        for (uint32_t i = 0; i < n->n_blocks; i++) {
            int32_t b = n->blocks[i];
            if (b < 0 || (uint32_t)b >= p->n_pool_blocks) {
                st = kp_fail(err, KP_EFORMAT, "prefix index: block id %d out of range", b);
                break;
            }
            refs[b]++;
        }
        for (uint32_t i = 0; i < n->n_snaps && st == KP_OK; i++) {
            const kp_pfx_state *sn = &n->snaps[i];
            if (sn->pos <= node_start(n) || sn->pos > n->depth || (i && sn->pos <= n->snaps[i - 1].pos) ||
                sn->n_blocks != p->state_blocks) {
                st = kp_fail(err, KP_EFORMAT, "prefix index: a state snapshot at %u on run %u..%u (or its blocks)",
                             sn->pos, node_start(n), n->depth);
                break;
            }
            for (uint32_t k = 0; k < sn->n_blocks; k++) {
                if (sn->blocks[k] < 0 || (uint32_t)sn->blocks[k] >= p->n_pool_blocks) {
                    st = kp_fail(err, KP_EFORMAT, "prefix index: snapshot block id %d out of range", sn->blocks[k]);
                    break;
                }
                refs[sn->blocks[k]]++;
            }
        }
        if (st != KP_OK) break;
    }
    uint32_t distinct = 0;
    for (uint32_t b = 0; b < p->n_pool_blocks && st == KP_OK; b++) {
        if (refs[b]) distinct++;
        if (refs[b] != p->idx_refs[b])
            st = kp_fail(err, KP_EFORMAT, "prefix index: block %u has %u node references, %u counted", b, refs[b],
                         p->idx_refs[b]);
        else if (kp_kvpool_refcount(p->pool, (int32_t)b) < refs[b])
            st = kp_fail(err, KP_EFORMAT, "prefix index: block %u has refcount %u below the index's %u", b,
                         kp_kvpool_refcount(p->pool, (int32_t)b), refs[b]);
    }
    free(refs);
    if (st != KP_OK) return st;
    if (distinct != p->n_idx_blocks)
        return kp_fail(err, KP_EFORMAT, "prefix index: %u distinct blocks, %u counted", distinct, p->n_idx_blocks);
    if (n_nodes != p->n_nodes)
        return kp_fail(err, KP_EFORMAT, "prefix index: %u nodes in the tree, %u counted", n_nodes, p->n_nodes);
    uint32_t in_lru = 0;
    for (const kp_pfx_node *n = p->lru_head; n; n = n->lru_next) {
        if (++in_lru > n_nodes || !n->parent || (n->lru_next ? n->lru_next->lru_prev != n : p->lru_tail != n))
            return kp_fail(err, KP_EFORMAT, "prefix index: the LRU list is broken");
    }
    if (in_lru != n_nodes || (p->lru_head && p->lru_head->lru_prev))
        return kp_fail(err, KP_EFORMAT, "prefix index: the LRU list has %u of %u nodes", in_lru, n_nodes);
    if (leases != p->n_leases || pins != p->n_pins)
        return kp_fail(err, KP_EFORMAT, "prefix index: %llu leases / %llu pins on nodes, %u / %u counted",
                       (unsigned long long)leases, (unsigned long long)pins, p->n_leases, p->n_pins);
    for (uint32_t i = 0; i < p->n_pins; i++)
        if (p->pins[i].node->pin_here == 0)
            return kp_fail(err, KP_EFORMAT, "prefix index: pin %llu points at an unpinned node",
                           (unsigned long long)p->pins[i].id);
    uint64_t pinned = count_pinned_bytes(p, NULL);
    if (pinned > p->cfg.pinned_cap_bytes)
        return kp_fail(err, KP_EFORMAT, "prefix index: %llu pinned bytes over the cap of %llu",
                       (unsigned long long)pinned, (unsigned long long)p->cfg.pinned_cap_bytes);
    return KP_OK;
}
