/*
 * plot.c - SVG charts (plot.h).
 *
 * Layout: panels side by side, PANEL_W x PANEL_H each, under the title;
 * inside a panel a margin for the tick labels, the plot area, and the
 * legend under it. Axis maxima are round numbers (nice_max) at or above
 * the largest value; tick labels use %g. Text is XML-escaped.
 */
#include "plot.h"

#include <errno.h>
#include <math.h>
#include <string.h>

#define PANEL_W 460
#define PANEL_H 380
#define M_LEFT 64
#define M_RIGHT 16
#define M_TOP 56
#define M_BOTTOM 110 /* x labels, the axis title, the legend */

cli_plot_panel *cli_plot_add_panel(cli_plot_chart *c, const char *title, const char *xlabel, const char *ylabel) {
    if (c->n_panels == CLI_PLOT_MAX_PANELS) return NULL;
    cli_plot_panel *p = &c->p[c->n_panels++];
    memset(p, 0, sizeof *p);
    snprintf(p->title, sizeof p->title, "%s", title);
    snprintf(p->xlabel, sizeof p->xlabel, "%s", xlabel);
    snprintf(p->ylabel, sizeof p->ylabel, "%s", ylabel);
    return p;
}

cli_plot_series *cli_plot_series_of(cli_plot_panel *p, const char *name, const char *colour, bool line) {
    for (int i = 0; i < p->n_series; i++)
        if (!strcmp(p->s[i].name, name)) return &p->s[i];
    if (p->n_series == CLI_PLOT_MAX_SERIES) return NULL;
    cli_plot_series *s = &p->s[p->n_series++];
    memset(s, 0, sizeof *s);
    snprintf(s->name, sizeof s->name, "%s", name);
    snprintf(s->colour, sizeof s->colour, "%s", colour);
    s->line = line;
    return s;
}

void cli_plot_join(cli_plot_series *s) {
    if (s) s->joined = true;
}

void cli_plot_point(cli_plot_series *s, double x, double y) {
    if (!s || s->n == CLI_PLOT_MAX_POINTS || !isfinite(x) || !isfinite(y)) return;
    s->x[s->n] = x;
    s->y[s->n] = y;
    s->n++;
}

static void put_escaped(FILE *f, const char *t) {
    for (; *t; t++) {
        switch (*t) {
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '&': fputs("&amp;", f); break;
        case '"': fputs("&quot;", f); break;
        default: fputc(*t, f);
        }
    }
}

/* The smallest of 1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8 x 10^k at or above v
 * (1 for v <= 0): five ticks of round numbers, at most 25% of empty room. */
static double nice_max(double v) {
    static const double STEPS[] = {1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10};
    if (!(v > 0)) return 1;
    double p = pow(10, floor(log10(v))), r = v / p;
    int i = 0;
    while (STEPS[i] < r * (1 - 1e-12)) i++;
    return STEPS[i] * p;
}

static double nice_min(double v) { return v >= 0 ? 0 : -nice_max(-v); }

static void panel(FILE *f, const cli_plot_panel *p, int ox) {
    double xmin = 0, xmax = 0, ymin = 0, ymax = 0;
    for (int i = 0; i < p->n_series; i++)
        for (int k = 0; k < p->s[i].n; k++) {
            xmax = fmax(xmax, p->s[i].x[k]);
            xmin = fmin(xmin, p->s[i].x[k]);
            ymax = fmax(ymax, p->s[i].y[k]);
            ymin = fmin(ymin, p->s[i].y[k]);
        }
    xmax = nice_max(xmax), ymax = nice_max(ymax), xmin = nice_min(xmin), ymin = nice_min(ymin);
    const double L = ox + M_LEFT, R = ox + PANEL_W - M_RIGHT, T = M_TOP, B = PANEL_H - M_BOTTOM;
#define SX(v) (L + (R - L) * ((v) - xmin) / (xmax - xmin))
#define SY(v) (B - (B - T) * ((v) - ymin) / (ymax - ymin))
    fprintf(f, "<g class=\"panel\" data-title=\"");
    put_escaped(f, p->title);
    fprintf(f, "\" data-xmin=\"%g\" data-xmax=\"%g\" data-ymin=\"%g\" data-ymax=\"%g\">\n", xmin, xmax, ymin, ymax);
    fprintf(f, "<text x=\"%g\" y=\"%d\" class=\"ptitle\">", L, M_TOP - 14);
    put_escaped(f, p->title);
    fprintf(f, "</text>\n");
    for (int i = 0; i <= 5; i++) {
        double xv = xmin + (xmax - xmin) * i / 5, yv = ymin + (ymax - ymin) * i / 5;
        fprintf(f, "<line x1=\"%g\" y1=\"%g\" x2=\"%g\" y2=\"%g\" class=\"grid\"/>\n", L, SY(yv), R, SY(yv));
        fprintf(f, "<text x=\"%g\" y=\"%g\" text-anchor=\"end\">%g</text>\n", L - 5, SY(yv) + 4, yv);
        fprintf(f, "<text x=\"%g\" y=\"%g\" text-anchor=\"middle\">%g</text>\n", SX(xv), B + 16, xv);
    }
    fprintf(f, "<line x1=\"%g\" y1=\"%g\" x2=\"%g\" y2=\"%g\" class=\"axis\"/>\n", L, B, R, B);
    fprintf(f, "<line x1=\"%g\" y1=\"%g\" x2=\"%g\" y2=\"%g\" class=\"axis\"/>\n", L, T, L, B);
    fprintf(f, "<text x=\"%g\" y=\"%g\" text-anchor=\"middle\">", (L + R) / 2, B + 36);
    put_escaped(f, p->xlabel);
    fprintf(f, "</text>\n<text x=\"%d\" y=\"%g\" text-anchor=\"middle\" transform=\"rotate(-90 %d %g)\">", ox + 16,
            (T + B) / 2, ox + 16, (T + B) / 2);
    put_escaped(f, p->ylabel);
    fprintf(f, "</text>\n");
    for (int i = 0; i < p->n_series; i++) {
        const cli_plot_series *s = &p->s[i];
        /* the points in x order, for lines */
        int order[CLI_PLOT_MAX_POINTS];
        for (int k = 0; k < s->n; k++) order[k] = k;
        for (int a = 1; a < s->n; a++)
            for (int b = a; b > 0 && s->x[order[b]] < s->x[order[b - 1]]; b--) {
                int t = order[b];
                order[b] = order[b - 1];
                order[b - 1] = t;
            }
        if ((s->line && s->n > 0) || (s->joined && s->n > 1)) {
            fprintf(f, "<polyline class=\"%s\" data-series=\"", s->line ? "line" : "join");
            put_escaped(f, s->name);
            fprintf(f, "\" fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\"%s points=\"", s->colour,
                    s->line ? " stroke-dasharray=\"5 3\"" : "");
            for (int k = 0; k < s->n; k++) fprintf(f, "%s%g,%g", k ? " " : "", SX(s->x[order[k]]), SY(s->y[order[k]]));
            fprintf(f, "\"/>\n");
        }
        if (!s->line) {
            for (int k = 0; k < s->n; k++) {
                fprintf(f, "<circle class=\"point\" data-series=\"");
                put_escaped(f, s->name);
                fprintf(f, "\" data-x=\"%.6g\" data-y=\"%.6g\" cx=\"%g\" cy=\"%g\" r=\"4\" fill=\"%s\"/>\n", s->x[k],
                        s->y[k], SX(s->x[k]), SY(s->y[k]), s->colour);
            }
        }
        /* the legend, one row per series */
        double ly = B + 56 + 16 * i;
        if (s->line)
            fprintf(f, "<line x1=\"%g\" y1=\"%g\" x2=\"%g\" y2=\"%g\" stroke=\"%s\" stroke-dasharray=\"5 3\"/>\n", L,
                    ly - 4, L + 14, ly - 4, s->colour);
        else
            fprintf(f, "<circle cx=\"%g\" cy=\"%g\" r=\"4\" fill=\"%s\"/>\n", L + 7, ly - 4, s->colour);
        fprintf(f, "<text x=\"%g\" y=\"%g\">", L + 20, ly);
        put_escaped(f, s->name);
        fprintf(f, "</text>\n");
    }
#undef SX
#undef SY
    fprintf(f, "</g>\n");
}

bool cli_plot_write(const cli_plot_chart *c, const char *path) {
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "kvpin: cannot write %s: %s\n", path, strerror(errno));
        return false;
    }
    int w = PANEL_W * (c->n_panels ? c->n_panels : 1), h = PANEL_H + 12 * CLI_PLOT_MAX_SERIES / 2;
    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
               "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\">\n"
               "<style>text{font:12px sans-serif;fill:#333}.ptitle{font-weight:bold;font-size:13px}"
               ".grid{stroke:#eee}.axis{stroke:#888}</style>\n"
               "<rect width=\"100%%\" height=\"100%%\" fill=\"#fff\"/>\n<text x=\"16\" y=\"22\" class=\"ptitle\">",
            w, h, w, h);
    put_escaped(f, c->title);
    fprintf(f, "</text>\n");
    for (int i = 0; i < c->n_panels; i++) panel(f, &c->p[i], i * PANEL_W);
    fprintf(f, "</svg>\n");
    bool ok = !ferror(f);
    if (fclose(f) != 0) ok = false;
    if (!ok) fprintf(stderr, "kvpin: cannot write %s\n", path);
    return ok;
}
