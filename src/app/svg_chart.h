/* A small SVG line-chart writer for `dtrain plot`: panels with linear axes, 1-2-5 ticks, grid,
 * labels and several series (solid or dashed lines, optional point markers). No dependencies:
 * the output opens in any browser. */
#ifndef DT_SVG_CHART_H
#define DT_SVG_CHART_H

#include <stdio.h>

/* One series: n points (x[i], y[i]); a non-finite y breaks the line there. */
typedef struct {
  const double *x, *y;
  int n;
  int color;   /* palette index (dt_svg_color) */
  int dashed;  /* 1: dashed line */
  int markers; /* 1: a dot on every point (sparse series such as validation loss) */
} dt_svg_series_t;

/* A panel at (left, top) of size w x h pixels in the picture; id: unique in the picture (names its
 * clip path). log_y: logarithmic y axis (points with y <= 0 skipped). */
typedef struct {
  int id;
  double left, top, w, h;
  const char *title, *xlabel, *ylabel;
  int log_y;
} dt_svg_panel_t;

/* Palette colour i (cycles through 8 colours that stay apart for colour-blind readers). */
const char *dt_svg_color(int i);

/* <svg> header and a white background, and the closing tag. */
void dt_svg_begin(FILE *f, int width, int height);
void dt_svg_end(FILE *f);

/* Text at (x, y) (anchor "start", "middle" or "end"; XML-escaped). */
void dt_svg_text(FILE *f, double x, double y, const char *anchor, int size, const char *text);

/* A panel: frame, ticks, grid, labels, then the series clipped to the frame. Axis ranges come from
 * the finite points of all series; a panel with none says "no data". */
void dt_svg_panel(FILE *f, const dt_svg_panel_t *p, const dt_svg_series_t *s, int n_series);

/* About 4-6 tick values from lo to hi at a 1-2-5 step (linear); returns how many (at most max). */
int dt_svg_ticks(double lo, double hi, double *ticks, int max);

#endif
