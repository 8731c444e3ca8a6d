/*
 * gvocab.h - the vocabulary index's layout (internal to src/grammar/):
 * every token that can be allowed by its bytes, sorted by those bytes
 * (rank order), and the byte trie of them in preorder.
 *
 *   rank r: id rank_id[r], bytes bytes[rank_off[r] .. + rank_len[r])
 *           (ascending bytes; equal pieces by id)
 *
 *   trie node k (preorder, depth ndepth[k] >= 1, byte nbyte[k]):
 *     its subtree is nodes k .. nend[k]-1 and ranks nrank[k] .. nrank[nend[k]]-1
 *     (nrank has n_nodes + 1 entries); the first nhere[k] of those ranks
 *     are the tokens whose piece ends exactly at k.
 *
 *   kind[id]: KP_GV_NEVER (empty piece, too long), KP_GV_TRIE, KP_GV_EOG;
 *   id_rank[id]: the rank of a KP_GV_TRIE id.
 *
 * A walk keeps one matcher state per depth: node k's state is its
 * parent's (depth - 1) advanced by nbyte[k]; a dead state skips to nend[k].
 */
#ifndef KP_GVOCAB_H
#define KP_GVOCAB_H

#include <stdint.h>

#include "grammar/grammar.h"

enum { KP_GV_NEVER = 0, KP_GV_TRIE = 1, KP_GV_EOG = 2 };

#define KP_GV_MAX_PIECE 4096 /* longer pieces are never allowed */

struct kp_gvocab {
    int32_t n_vocab;
    uint32_t n_rank;
    int32_t *rank_id;
    uint32_t *rank_off, *rank_len;
    uint8_t *bytes;
    uint32_t n_nodes;
    uint8_t *nbyte;
    uint16_t *ndepth;
    uint32_t *nend, *nrank, *nhere;
    uint8_t *kind;
    uint32_t *id_rank;
    int32_t *eog;
    uint32_t n_eog;
    uint32_t max_len;
};

#endif
