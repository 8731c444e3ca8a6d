/*
 * gvocab.h - the vocabulary index's layout (internal to src/grammar/):
 * every token that can be allowed by its bytes, sorted by those bytes
 * (rank order), and the byte trie of them in preorder.
 *
 *   rank r: id rank_id[r], bytes bytes[rank_off[r] .. + rank_len[r])
 *           (ascending bytes; equal pieces by id)
 *
 *   trie node k = nodes[k] (preorder, depth >= 1, one 32-byte record so a
 *     walk touches one cache line per node):
 *     its subtree is nodes k .. end-1 and ranks rank .. rank_end-1; the
 *     first `here` of those ranks are the tokens whose piece ends exactly
 *     at k.
 *
 *   kind[id]: KP_GV_NEVER (empty piece, too long), KP_GV_TRIE, KP_GV_EOG;
 *   id_rank[id]: the rank of a KP_GV_TRIE id.
 *
 * A walk keeps one matcher state per depth: node k's state is its
 * parent's (depth - 1) advanced by its byte; a dead state skips to end.
 *
 * Two shortcuts for walks:
 *   tab: for a node with at least KP_GV_TABLE_KIDS children, the index of
 *     its 256-entry child table in ctab[] (child node per byte,
 *     UINT32_MAX: none), else UINT32_MAX; root_tab is the table of the
 *     depth-1 nodes. A walk whose state can only take a few bytes visits
 *     just those children.
 *   sub: for a node with at least KP_GV_SUB_NODES nodes below it, the
 *     index in subs[] of the set of bytes that occur below it, else
 *     UINT32_MAX. A walk whose state loops to itself on all those bytes
 *     accepts the whole subtree without visiting it (string content).
 *   utf8: bit q (a kp_gv_u8 decoder state) is set when every byte string
 *     below the node, read from state q, is well-formed UTF-8 (it may stop
 *     inside a character). With bit KP_GV_U8_START, a walk whose state
 *     loops on the ASCII bytes below and on every whole UTF-8 character
 *     accepts the subtree too (string content in any script).
 */
#ifndef KP_GVOCAB_H
#define KP_GVOCAB_H

#include <stdint.h>

#include "grammar/grammar.h"

enum { KP_GV_NEVER = 0, KP_GV_TRIE = 1, KP_GV_EOG = 2 };

#define KP_GV_MAX_PIECE 4096 /* longer pieces are never allowed */
#define KP_GV_TABLE_KIDS 8
#define KP_GV_SUB_NODES 4

enum { /* UTF-8 decoder states: what the next byte must be */
    KP_GV_U8_START = 0, /* ASCII or a lead byte */
    KP_GV_U8_CONT1,     /* [80-BF], then START */
    KP_GV_U8_CONT2,     /* [80-BF], then CONT1 */
    KP_GV_U8_CONT3,     /* [80-BF], then CONT2 */
    KP_GV_U8_E0,        /* [A0-BF] (after E0), then CONT1 */
    KP_GV_U8_ED,        /* [80-9F] (after ED), then CONT1 */
    KP_GV_U8_F0,        /* [90-BF] (after F0), then CONT2 */
    KP_GV_U8_F4,        /* [80-8F] (after F4), then CONT2 */
    KP_GV_U8_N
};

/* The decoder state after byte b from state q, or -1 (ill-formed). */
static inline int kp_gv_u8_next(int q, uint8_t b) {
    switch (q) {
    case KP_GV_U8_START:
        if (b < 0x80) return KP_GV_U8_START;
        if (b >= 0xC2 && b <= 0xDF) return KP_GV_U8_CONT1;
        if (b == 0xE0) return KP_GV_U8_E0;
        if (b == 0xED) return KP_GV_U8_ED;
        if (b >= 0xE1 && b <= 0xEF) return KP_GV_U8_CONT2;
        if (b == 0xF0) return KP_GV_U8_F0;
        if (b >= 0xF1 && b <= 0xF3) return KP_GV_U8_CONT3;
        if (b == 0xF4) return KP_GV_U8_F4;
        return -1;
    case KP_GV_U8_CONT1: return b >= 0x80 && b <= 0xBF ? KP_GV_U8_START : -1;
    case KP_GV_U8_CONT2: return b >= 0x80 && b <= 0xBF ? KP_GV_U8_CONT1 : -1;
    case KP_GV_U8_CONT3: return b >= 0x80 && b <= 0xBF ? KP_GV_U8_CONT2 : -1;
    case KP_GV_U8_E0: return b >= 0xA0 && b <= 0xBF ? KP_GV_U8_CONT1 : -1;
    case KP_GV_U8_ED: return b >= 0x80 && b <= 0x9F ? KP_GV_U8_CONT1 : -1;
    case KP_GV_U8_F0: return b >= 0x90 && b <= 0xBF ? KP_GV_U8_CONT2 : -1;
    case KP_GV_U8_F4: return b >= 0x80 && b <= 0x8F ? KP_GV_U8_CONT2 : -1;
    }
    return -1;
}

typedef struct {
    uint32_t end, rank, rank_end, here, sub, tab;
    uint16_t depth, max_depth; /* max_depth: of the deepest node below (or itself) */
    uint8_t byte, utf8, pad[2];
} kp_gvnode;

struct kp_gvocab {
    int32_t n_vocab;
    uint32_t n_rank;
    int32_t *rank_id;
    uint32_t *rank_off, *rank_len;
    uint8_t *bytes;
    uint32_t n_nodes;
    kp_gvnode *nodes;
    uint8_t *kind;
    uint32_t *id_rank;
    int32_t *eog;
    uint32_t n_eog;
    uint32_t max_len;
    uint32_t *ctab, root_tab[256];
    uint32_t n_tabs;
    uint64_t *subs; /* 4 words per set */
    uint32_t n_subs;
};

#endif
