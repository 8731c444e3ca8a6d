/*
 * plot.h - small SVG charts for the command line's reports (`kvpin bench
 * --plot`): panels of points and lines with axes, units and a legend,
 * readable in any browser, parseable as XML.
 *
 * A chart is a grid of panels; a panel has its x and y labels and series
 * added to it (points, or a line through points). Every value is copied.
 * cli_plot_write draws each panel with axes from 0 (or the smallest value,
 * when negative) to a round number at or above the largest value of its
 * series, so the ranges always cover the data, and writes
 *
 *   <g class="panel" data-title= data-xmin= data-xmax= data-ymin= data-ymax=>
 *     <circle class="point" data-series= data-x= data-y= .../>   (points)
 *     <polyline class="line" data-series= .../>                 (lines)
 *     <polyline class="join" data-series= .../>                 (points joined)
 *
 * so a test can read what was drawn. Plain C, no library state.
 */
#ifndef KVPIN_CLI_PLOT_H
#define KVPIN_CLI_PLOT_H

#include <stdbool.h>
#include <stdio.h>

#define CLI_PLOT_MAX_PANELS 4
#define CLI_PLOT_MAX_SERIES 12
#define CLI_PLOT_MAX_POINTS 64

typedef struct {
    char name[64];
    char colour[16];
    bool line; /* a line through the points (sorted by x) instead of dots */
    bool joined; /* dots, and a solid line joining them in x order (cli_plot_join) */
    int n;
    double x[CLI_PLOT_MAX_POINTS], y[CLI_PLOT_MAX_POINTS];
} cli_plot_series;

typedef struct {
    char title[96], xlabel[64], ylabel[64];
    int n_series;
    cli_plot_series s[CLI_PLOT_MAX_SERIES];
} cli_plot_panel;

typedef struct {
    char title[160];
    int n_panels;
    cli_plot_panel p[CLI_PLOT_MAX_PANELS];
} cli_plot_chart;

/* A new panel (NULL when there are CLI_PLOT_MAX_PANELS already). */
cli_plot_panel *cli_plot_add_panel(cli_plot_chart *c, const char *title, const char *xlabel, const char *ylabel);

/* The series called name in p, made (with colour, as a line or points) when
 * new; NULL when the panel is full. */
cli_plot_series *cli_plot_series_of(cli_plot_panel *p, const char *name, const char *colour, bool line);

/* Draws the series' dots joined by a solid line (class "join") in x order. */
void cli_plot_join(cli_plot_series *s);

/* Adds (x, y) to the series (dropped past CLI_PLOT_MAX_POINTS). */
void cli_plot_point(cli_plot_series *s, double x, double y);

/* Writes the chart as a standalone SVG document to path. false and a
 * message on stderr when the file cannot be written. */
bool cli_plot_write(const cli_plot_chart *c, const char *path);

#endif
