/* A small SVG line-chart writer (svg_chart.h). */
#include "svg_chart.h"

#include <math.h>
#include <string.h>

const char *dt_svg_color(int i) {
  /* Okabe-Ito: distinguishable with the common colour-vision deficiencies */
  static const char *pal[] = {"#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442"};
  return pal[(i % 8 + 8) % 8];
}

void dt_svg_begin(FILE *f, int width, int height) {
  fprintf(f,
          "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
          "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
          "font-family=\"sans-serif\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
          width, height, width, height);
}

void dt_svg_end(FILE *f) { fprintf(f, "</svg>\n"); }

void dt_svg_text(FILE *f, double x, double y, const char *anchor, int size, const char *text) {
  fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"%s\" font-size=\"%d\">", x, y, anchor, size);
  for (const char *c = text; *c; c++) switch (*c) {
      case '<': fputs("&lt;", f); break;
      case '>': fputs("&gt;", f); break;
      case '&': fputs("&amp;", f); break;
      case '"': fputs("&quot;", f); break;
      default:
        if ((unsigned char)*c >= 0x20 || *c == '\t') fputc(*c, f);
    }
  fputs("</text>\n", f);
}

int dt_svg_ticks(double lo, double hi, double *ticks, int max) {
  if (!(hi > lo) || !isfinite(lo) || !isfinite(hi) || max < 1) return 0;
  double raw = (hi - lo) / 4, mag = pow(10, floor(log10(raw))), step = mag;
  if (raw / mag > 5)
    step = 10 * mag;
  else if (raw / mag > 2)
    step = 5 * mag;
  else if (raw / mag > 1)
    step = 2 * mag;
  int n = 0;
  for (double t = ceil(lo / step) * step; t <= hi + step * 1e-9 && n < max; t += step)
    ticks[n++] = fabs(t) < step * 1e-9 ? 0 : t;
  return n;
}

typedef struct {
  double x0, x1, y0, y1; /* data range */
  const dt_svg_panel_t *p;
} frame_t;

static double ty(const frame_t *fr, double y) { return fr->p->log_y ? log10(y) : y; }
static double px(const frame_t *fr, double x) { return fr->p->left + (x - fr->x0) / (fr->x1 - fr->x0) * fr->p->w; }
static double py(const frame_t *fr, double y) {
  return fr->p->top + fr->p->h - (ty(fr, y) - fr->y0) / (fr->y1 - fr->y0) * fr->p->h;
}
static int usable(const frame_t *fr, double x, double y) {
  return isfinite(x) && isfinite(y) && (!fr->p->log_y || y > 0);
}

/* The data range of all usable points (padded 5% in y; a flat range widened). 0 if none. */
static int data_range(frame_t *fr, const dt_svg_series_t *s, int n_series) {
  int any = 0;
  for (int k = 0; k < n_series; k++)
    for (int i = 0; i < s[k].n; i++) {
      if (!usable(fr, s[k].x[i], s[k].y[i])) continue;
      double x = s[k].x[i], y = ty(fr, s[k].y[i]);
      if (!any || x < fr->x0) fr->x0 = x;
      if (!any || x > fr->x1) fr->x1 = x;
      if (!any || y < fr->y0) fr->y0 = y;
      if (!any || y > fr->y1) fr->y1 = y;
      any = 1;
    }
  if (!any) return 0;
  if (fr->x1 <= fr->x0) fr->x1 = fr->x0 + 1;
  double pad = (fr->y1 - fr->y0) * 0.05;
  if (pad <= 0) pad = fabs(fr->y0) * 0.05 + 1e-12;
  fr->y0 -= pad;
  fr->y1 += pad;
  return 1;
}

/* Ticks of a log axis (lo, hi in log10 units) at 1, 2 and 5 times powers of ten, as log10. */
static int log_ticks(double lo, double hi, double *t, int max) {
  static const double m[] = {1, 2, 5};
  int n = 0;
  for (int k = (int)floor(lo); k <= (int)ceil(hi) && n < max; k++)
    for (int j = 0; j < 3 && n < max; j++) {
      double v = log10(m[j]) + k;
      if (v >= lo && v <= hi) t[n++] = v;
    }
  return n;
}

static void axes(FILE *f, const frame_t *fr) {
  const dt_svg_panel_t *p = fr->p;
  double t[8];
  char lab[32];
  int n = dt_svg_ticks(fr->x0, fr->x1, t, 8);
  for (int i = 0; i < n; i++) {
    double x = px(fr, t[i]);
    fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", x, p->top, x, p->top + p->h);
    snprintf(lab, sizeof lab, "%.6g", t[i]);
    dt_svg_text(f, x, p->top + p->h + 14, "middle", 11, lab);
  }
  n = p->log_y ? log_ticks(fr->y0, fr->y1, t, 8) : 0;
  if (n < 2) n = dt_svg_ticks(fr->y0, fr->y1, t, 8);
  for (int i = 0; i < n; i++) {
    double y = p->top + p->h - (t[i] - fr->y0) / (fr->y1 - fr->y0) * p->h;
    fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", p->left, y, p->left + p->w, y);
    snprintf(lab, sizeof lab, "%.6g", p->log_y ? pow(10, t[i]) : t[i]);
    dt_svg_text(f, p->left - 4, y + 4, "end", 11, lab);
  }
  fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" stroke=\"#333\"/>\n", p->left,
          p->top, p->w, p->h);
}

/* A line through the usable points; a non-finite x (a gap row) ends it, an unusable y is passed
 * over (sparse series such as validation loss connect their points). */
static void series(FILE *f, const frame_t *fr, const dt_svg_series_t *s) {
  char clip[32];
  snprintf(clip, sizeof clip, "clip%d", fr->p->id);
  const char *dash = s->dashed ? " stroke-dasharray=\"6,3\"" : "";
  int open = 0;
  for (int i = 0; i < s->n; i++) {
    if (!isfinite(s->x[i]) && open) {
      fputs("\"/>\n", f);
      open = 0;
    }
    if (!usable(fr, s->x[i], s->y[i])) continue;
    if (!open)
      fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\"%s clip-path=\"url(#%s)\" points=\"",
              dt_svg_color(s->color), dash, clip);
    fprintf(f, "%s%.2f,%.2f", open ? " " : "", px(fr, s->x[i]), py(fr, s->y[i]));
    open = 1;
  }
  if (open) fputs("\"/>\n", f);
  if (s->markers)
    for (int i = 0; i < s->n; i++)
      if (usable(fr, s->x[i], s->y[i]))
        fprintf(f, "<circle cx=\"%.2f\" cy=\"%.2f\" r=\"2.5\" fill=\"%s\"/>\n", px(fr, s->x[i]), py(fr, s->y[i]),
                dt_svg_color(s->color));
}

void dt_svg_panel(FILE *f, const dt_svg_panel_t *p, const dt_svg_series_t *s, int n_series) {
  frame_t fr = {.p = p};
  dt_svg_text(f, p->left + p->w / 2, p->top - 8, "middle", 13, p->title);
  dt_svg_text(f, p->left + p->w / 2, p->top + p->h + 30, "middle", 12, p->xlabel);
  fprintf(f, "<g transform=\"translate(%.1f %.1f) rotate(-90)\">", p->left - 46, p->top + p->h / 2);
  dt_svg_text(f, 0, 0, "middle", 12, p->ylabel);
  fputs("</g>\n", f);
  if (!data_range(&fr, s, n_series)) {
    fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" stroke=\"#333\"/>\n", p->left,
            p->top, p->w, p->h);
    dt_svg_text(f, p->left + p->w / 2, p->top + p->h / 2, "middle", 12, "no data");
    return;
  }
  axes(f, &fr);
  fprintf(f, "<g><clipPath id=\"clip%d\"><rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\"/></clipPath>\n",
          p->id, p->left, p->top, p->w, p->h); /* the frame */
  for (int k = 0; k < n_series; k++) series(f, &fr, &s[k]);
  fputs("</g>\n", f);
}
