/*
 * heatmap.h - `kvpin inspect --html FILE`: the attention of every step of
 * one layer and query head over the growing KV cache, as a page.
 *
 * Rows are steps (the prefill's last position, then each decode step),
 * columns cached positions; row r has n_prompt + r cells, so the page shows
 * the cache growing by one key per step. Prompt and generated positions
 * are marked apart. The page is one HTML file with no script and no
 * network; every cell carries data-p (position) and data-v (its weight).
 */
#ifndef KVPIN_CLI_HEATMAP_H
#define KVPIN_CLI_HEATMAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tok/tok.h"

typedef struct {
    float *w;          /* rows of weights, row r at row[r].off, row[r].n floats */
    struct cli_heat_row {
        size_t off;
        uint32_t n;
    } *row;
    size_t n_rows, cap_rows;
    size_t used, cap;
    int32_t *pos_tok;  /* the token at each position: the prompt's, then the decoded ones */
    size_t n_pos, cap_pos;
    bool oom;
} cli_heat;

/* Appends a step's weights over positions 0..n-1 (copied). */
void cli_heat_row(cli_heat *h, const float *w, uint32_t n);

/* Notes the token at the next position. */
void cli_heat_token(cli_heat *h, int32_t tok);

/* Writes the page: model, layer, head, kv-head and the prompt length in
 * the title. false and a message on stderr when it cannot be written. */
bool cli_heat_write(const cli_heat *h, const char *path, const kp_tok_vocab *v, const char *model, int layer,
                    int head, int kv_head, uint32_t n_prompt);

void cli_heat_free(cli_heat *h);

#endif
