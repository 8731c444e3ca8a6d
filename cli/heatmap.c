/*
 * heatmap.c - the inspect page (heatmap.h).
 *
 * Grows three arrays (rows' weights, each row's offset and length, the
 * position tokens) with kp_grow; an allocation failure sets oom and drops the rest
 * (the page then says it is incomplete). The page is a table: a header
 * row of position numbers and token pieces (prompt columns shaded apart
 * from generated ones), one row per step; a cell's background is its
 * weight (white 0 .. dark blue 1), the exact value in its title.
 */
#include "heatmap.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"

void cli_heat_row(cli_heat *h, const float *w, uint32_t n) {
    if (h->oom) return;
    if (!kp_grow((void **)&h->w, &h->cap, h->used + n, sizeof *h->w) ||
        !kp_grow((void **)&h->row, &h->cap_rows, h->n_rows + 1, sizeof *h->row)) {
        h->oom = true;
        return;
    }
    memcpy(h->w + h->used, w, (size_t)n * sizeof *w);
    h->row[h->n_rows].off = h->used;
    h->row[h->n_rows++].n = n;
    h->used += n;
}

void cli_heat_token(cli_heat *h, int32_t tok) {
    if (h->oom || !kp_grow((void **)&h->pos_tok, &h->cap_pos, h->n_pos + 1, sizeof *h->pos_tok)) {
        h->oom = true;
        return;
    }
    h->pos_tok[h->n_pos++] = tok;
}

static void put_html(FILE *f, const char *t, size_t n) {
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)t[i];
        if (ch == '<') fputs("&lt;", f);
        else if (ch == '>') fputs("&gt;", f);
        else if (ch == '&') fputs("&amp;", f);
        else if (ch == '"') fputs("&quot;", f);
        else if (ch == '\n') fputs("\\n", f);
        else if (ch < 0x20) fprintf(f, "\\x%02x", ch);
        else fputc(ch, f);
    }
}

bool cli_heat_write(const cli_heat *h, const char *path, const kp_tok_vocab *v, const char *model, int layer,
                    int head, int kv_head, uint32_t n_prompt) {
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "kvpin inspect: cannot write %s: %s\n", path, strerror(errno));
        return false;
    }
    uint32_t cols = 0;
    for (size_t r = 0; r < h->n_rows; r++) cols = h->row[r].n > cols ? h->row[r].n : cols;
    fprintf(f, "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>kvpin inspect: attention"
               "</title>\n<style>body{font:14px system-ui,sans-serif;margin:18px;color:#1d1d1b}"
               "table{border-collapse:collapse;font:11px ui-monospace,monospace}"
               "td,th{border:1px solid #fff;padding:0;min-width:34px;height:22px;text-align:center}"
               "th{font-weight:normal;color:#555;vertical-align:bottom}"
               "th.prompt{background:#eef3f8}th.gen{background:#fdf0e6}th.step{text-align:right;padding:0 6px;"
               "white-space:nowrap}td.empty{background:repeating-linear-gradient(45deg,#fff,#fff 3px,#e2e2e2 3px,#e2e2e2 5px)}td.first-gen,th.first-gen{border-left:2px solid"
               " #d1603d}.legend span{display:inline-block;width:14px;height:12px;vertical-align:-2px}"
               "</style></head><body>\n<h1 style=\"font-size:18px\">Attention over the growing KV cache</h1>\n"
               "<p>");
    put_html(f, model, strlen(model));
    fprintf(f, ", layer %d, query head %d (kv-head %d). Each row is one step: the prefill's last position,"
               " then every decode step, whose new token is the next column. Row <i>r</i> scores against"
               " %u + <i>r</i> cached keys: the first decode against %u, the second against %u. Columns:"
               " <span style=\"background:#eef3f8\">prompt positions</span>,"
               " <span style=\"background:#fdf0e6\">generated positions</span>.</p>\n",
            layer, head, kv_head, n_prompt, n_prompt + 1, n_prompt + 2);
    fprintf(f, "<p class=\"legend\">weight: <span style=\"background:#fff;border:1px solid #ccc\"></span> 0 "
               "<span style=\"background:rgb(128,160,205)\"></span> 0.5 "
               "<span style=\"background:rgb(0,64,155)\"></span> 1</p>\n");
    if (h->oom) fprintf(f, "<p><b>out of memory: the steps after the last row shown are missing</b></p>\n");
    fprintf(f, "<table id=\"heat\" data-rows=\"%zu\" data-cols=\"%u\" data-prompt=\"%u\">\n<tr><th></th>", h->n_rows,
            cols, n_prompt);
    for (uint32_t p = 0; p < cols; p++) {
        size_t pl = 0;
        const char *piece = p < h->n_pos ? kp_tok_piece_view(v, h->pos_tok[p], true, &pl) : "";
        fprintf(f, "<th class=\"%s%s\" data-p=\"%u\">%u<br>", p < n_prompt ? "prompt" : "gen",
                p == n_prompt ? " first-gen" : "", p, p);
        put_html(f, piece ? piece : "", pl > 12 ? 12 : pl);
        fprintf(f, "</th>");
    }
    fprintf(f, "</tr>\n");
    for (size_t r = 0; r < h->n_rows; r++) {
        const float *w = h->w + h->row[r].off;
        uint32_t n = h->row[r].n;
        fprintf(f, "<tr class=\"step\" data-step=\"%zu\" data-keys=\"%u\"><th class=\"step\">%s %zu: %u keys</th>",
                r, n, r ? "decode" : "prefill", r, n);
        for (uint32_t p = 0; p < cols; p++) {
            if (p >= n) {
                fprintf(f, "<td class=\"empty%s\"></td>", p == n_prompt ? " first-gen" : "");
                continue;
            }
            double x = w[p] < 0 ? 0 : w[p] > 1 ? 1 : w[p];
            int R = (int)(255 - 255 * x), G = (int)(255 - 191 * x), B = (int)(255 - 100 * x);
            fprintf(f, "<td class=\"%s%s\" data-p=\"%u\" data-v=\"%.6f\" title=\"position %u: %.4f\" "
                       "style=\"background:rgb(%d,%d,%d)\"></td>",
                    p < n_prompt ? "prompt" : "gen", p == n_prompt ? " first-gen" : "", p, (double)w[p], p,
                    (double)w[p], R, G, B);
        }
        fprintf(f, "</tr>\n");
    }
    fprintf(f, "</table>\n</body></html>\n");
    bool ok = !ferror(f);
    if (fclose(f) != 0) ok = false;
    if (!ok) fprintf(stderr, "kvpin inspect: cannot write %s\n", path);
    return ok;
}

void cli_heat_free(cli_heat *h) {
    free(h->w);
    free(h->row);
    free(h->pos_tok);
    memset(h, 0, sizeof *h);
}
