/* `dtrain plot`: training curves from metrics JSONL files (log.metrics) as one SVG picture: loss
 * and validation loss, learning rate, gradient norm, tokens/s and the model's FLOP rate (model
 * FLOP utilisation against a given peak), several runs overlaid. Reads
 * flat JSON objects, one per line; writes FILE.tmp and renames it, so nothing half-written stays. */
#include "plot.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "svg_chart.h"

enum { K_STEP, K_TOKENS, K_LOSS, K_VAL, K_LR, K_GN, K_TOKS, K_GF, K_N };
static const char *key_names[K_N] = {"step", "tokens", "loss", "val_loss", "lr", "grad_norm", "tok_per_s", "gflops"};

typedef struct {
  const char *path;
  double *v[K_N]; /* column k, n rows; NaN = absent in that row (a NaN row also breaks the lines) */
  int n, cap;
  int has_tokens; /* every row has "tokens" */
} run_t;

/* ---- reading ------------------------------------------------------------------------------ */

/* Skip a JSON string starting at *p == '"'; copy up to n-1 bytes of it into out (may be NULL). */
static const char *skip_string(const char *p, char *out, size_t n) {
  size_t k = 0;
  for (p++; *p && *p != '"'; p++) {
    if (*p == '\\' && p[1]) p++;
    if (out && k + 1 < n) out[k++] = *p;
  }
  if (out) out[k] = '\0';
  return *p == '"' ? p + 1 : NULL;
}

static const char *ws(const char *p) {
  while (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n') p++;
  return p;
}

/* One flat JSON object into row[K_N] (absent or null keys: NaN). Returns NULL or what is wrong. */
static const char *parse_row(const char *p, double *row) {
  for (int k = 0; k < K_N; k++) row[k] = NAN;
  p = ws(p);
  if (*p++ != '{') return "not a JSON object";
  p = ws(p);
  if (*p == '}') return NULL;
  for (;;) {
    char key[64];
    if (*p != '"' || !(p = skip_string(p, key, sizeof key))) return "expected a quoted key";
    p = ws(p);
    if (*p++ != ':') return "expected ':'";
    p = ws(p);
    double v = NAN;
    if (*p == '"') {
      if (!(p = skip_string(p, NULL, 0))) return "unterminated string";
    } else if (!strncmp(p, "null", 4) || !strncmp(p, "true", 4)) {
      p += 4;
    } else if (!strncmp(p, "false", 5)) {
      p += 5;
    } else if (*p == '{' || *p == '[') {
      return "nested objects and arrays are not metrics";
    } else {
      char *end;
      errno = 0;
      v = strtod(p, &end);
      if (end == p) return "expected a value";
      p = end;
    }
    for (int k = 0; k < K_N; k++)
      if (!strcmp(key, key_names[k])) row[k] = v;
    p = ws(p);
    if (*p == '}') return *ws(p + 1) ? "text after the object" : NULL;
    if (*p++ != ',') return "expected ',' or '}'";
    p = ws(p);
  }
}

static int push(run_t *r, const double *row) {
  if (r->n == r->cap) {
    int cap = r->cap ? 2 * r->cap : 256;
    for (int k = 0; k < K_N; k++) {
      double *v = realloc(r->v[k], (size_t)cap * sizeof *v);
      if (!v) return 0;
      r->v[k] = v;
    }
    r->cap = cap;
  }
  for (int k = 0; k < K_N; k++) r->v[k][r->n] = row[k];
  r->n++;
  return 1;
}

/* Read one metrics file; 0 on success, else prints one line naming file and line. */
static int read_run(run_t *r, const char *path) {
  FILE *f = fopen(path, "r");
  if (!f) {
    fprintf(stderr, "dtrain plot: %s: %s\n", path, strerror(errno));
    return 0;
  }
  char line[8192];
  int lineno = 0, ok = 1, rows = 0, tokens = 0;
  double prev = -INFINITY;
  while (ok && fgets(line, sizeof line, f)) {
    lineno++;
    if (!strchr(line, '\n') && !feof(f)) {
      fprintf(stderr, "dtrain plot: %s:%d: line longer than %zu bytes\n", path, lineno, sizeof line - 1);
      ok = 0;
      break;
    }
    if (!*ws(line)) continue;
    double row[K_N], gap[K_N];
    const char *err = parse_row(line, row);
    if (err || !isfinite(row[K_STEP])) {
      fprintf(stderr, "dtrain plot: %s:%d: %s\n", path, lineno, err ? err : "no numeric \"step\"");
      ok = 0;
      break;
    }
    for (int k = 0; k < K_N; k++) gap[k] = NAN;
    if (row[K_STEP] <= prev) ok = push(r, gap); /* a resumed run went back: a new line */
    ok = ok && push(r, row);
    prev = row[K_STEP];
    rows++;
    tokens += isfinite(row[K_TOKENS]);
  }
  fclose(f);
  if (ok && rows == 0) {
    fprintf(stderr, "dtrain plot: %s: no metrics rows\n", path);
    ok = 0;
  }
  r->path = path;
  r->has_tokens = rows > 0 && tokens == rows;
  return ok;
}

/* ---- drawing ------------------------------------------------------------------------------ */

#define W 1000
#define H 1045

static void legend(FILE *f, const run_t *runs, int n) {
  double x = 70, y = 24;
  for (int i = 0; i < n; i++) {
    const char *base = strrchr(runs[i].path, '/');
    base = base ? base + 1 : runs[i].path;
    if (x > W - 200) {
      x = 70;
      y += 18;
    }
    fprintf(f, "<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\" stroke=\"%s\" stroke-width=\"3\"/>\n", x, y - 4,
            x + 24, y - 4, dt_svg_color(i));
    dt_svg_text(f, x + 30, y, "start", 12, base);
    x += 30 + 7.5 * (double)strlen(base) + 24;
  }
}

/* Panel k (0..4) of the 2 x 3 grid: columns yk against x (x = NULL: each run's step). */
static void panel(FILE *f, int k, const char *title, const char *xl, const char *yl, int log_y, const run_t *runs,
                  int n, int use_tokens, int yk, int with_val) {
  dt_svg_series_t s[64];
  int ns = 0;
  for (int i = 0; i < n && ns + 2 <= 64; i++) {
    const double *x = runs[i].v[use_tokens ? K_TOKENS : K_STEP];
    s[ns++] = (dt_svg_series_t){.x = x, .y = runs[i].v[yk], .n = runs[i].n, .color = i};
    if (with_val) s[ns++] = (dt_svg_series_t){.x = x, .y = runs[i].v[K_VAL], .n = runs[i].n, .color = i, .dashed = 1,
                                              .markers = 1};
  }
  dt_svg_panel_t p = {.id = k, .left = 80 + (k % 2) * (W / 2), .top = 70 + (k / 2) * 325, .w = W / 2 - 120, .h = 250,
                      .title = title, .xlabel = xl, .ylabel = yl, .log_y = log_y};
  dt_svg_panel(f, &p, s, ns);
}

/* peak_tflops > 0: the FLOP-rate panel is the model FLOP utilisation, gflops / peak (the runs'
 * gflops columns are scaled in place) */
static void draw(FILE *f, run_t *runs, int n, double peak_tflops) {
  int tok = 1;
  for (int i = 0; i < n; i++) tok &= runs[i].has_tokens;
  dt_svg_begin(f, W, H);
  legend(f, runs, n);
  panel(f, 0, "loss (solid: train, dashed: validation)", tok ? "tokens" : "step", "loss", 0, runs, n, tok, K_LOSS, 1);
  panel(f, 1, "learning rate", "step", "lr", 0, runs, n, 0, K_LR, 0);
  panel(f, 2, "gradient norm (before clipping)", "step", "grad norm (log)", 1, runs, n, 0, K_GN, 0);
  panel(f, 3, "throughput", "step", "tokens/s", 0, runs, n, 0, K_TOKS, 0);
  if (peak_tflops > 0) {
    char title[96];
    snprintf(title, sizeof title, "model FLOP utilisation (of a %g TFLOP/s peak)", peak_tflops);
    for (int i = 0; i < n; i++)
      for (int r = 0; r < runs[i].n; r++) runs[i].v[K_GF][r] /= 1e3 * peak_tflops;
    panel(f, 4, title, "step", "MFU", 0, runs, n, 0, K_GF, 0);
  } else {
    panel(f, 4, "model FLOP rate (6N + attention per token)", "step", "GFLOP/s", 0, runs, n, 0, K_GF, 0);
  }
  dt_svg_end(f);
}

/* ---- command ------------------------------------------------------------------------------ */

static int usage(FILE *out, int status) {
  fprintf(out,
          "usage: dtrain plot [-o OUT.svg] [--peak-tflops P] METRICS.jsonl...\n"
          "  Loss and validation loss (against tokens when every row has \"tokens\", else step), learning\n"
          "  rate, gradient norm, tokens/s and the model FLOP rate of one or more runs (log.metrics files)\n"
          "  in one SVG picture.\n"
          "  -o OUT.svg         where to write it (default: the first file with .jsonl replaced by .svg)\n"
          "  --peak-tflops P    draw model FLOP utilisation (MFU) instead of GFLOP/s: P is the whole\n"
          "                     job's peak, as the logged gflops are the job's (e.g. 4 H100s in bf16:\n"
          "                     4 x 989 = 3956)\n");
  return status;
}

static void free_runs(run_t *runs, int n) {
  for (int i = 0; i < n; i++)
    for (int k = 0; k < K_N; k++) free(runs[i].v[k]);
  free(runs);
}

int dt_plot_main(int argc, char **argv) {
  const char *out = NULL;
  double peak = 0;
  const char **files = calloc((size_t)argc, sizeof *files);
  int n = 0;
  if (!files) return 1;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      free(files);
      return usage(stdout, 0);
    }
    if (!strcmp(argv[i], "--peak-tflops") && i + 1 < argc) {
      char *end = NULL;
      peak = strtod(argv[++i], &end);
      if (!end || *end || !(peak > 0) || !isfinite(peak)) {
        fprintf(stderr, "dtrain plot: --peak-tflops %s: not a positive number\n", argv[i]);
        free(files);
        return 2;
      }
      continue;
    }
    if (argv[i][0] == '-' && (strcmp(argv[i], "-o") || i + 1 >= argc)) {
      fprintf(stderr, "dtrain plot: bad argument '%s'\n", argv[i]);
      free(files);
      return usage(stderr, 2);
    }
    if (argv[i][0] == '-')
      out = argv[++i];
    else
      files[n++] = argv[i];
  }
  if (n < 1) {
    free(files);
    return usage(stderr, 2);
  }
  size_t len = out ? strlen(out) : 0;
  if (out && (len < 4 || strcmp(out + len - 4, ".svg"))) {
    fprintf(stderr, "dtrain plot: -o %s: only SVG is written (name it .svg; rsvg-convert makes a PNG of it)\n", out);
    free(files);
    return 2;
  }
  run_t *runs = calloc((size_t)n, sizeof *runs);
  if (!runs) {
    free(files);
    return 1;
  }
  for (int i = 0; i < n; i++)
    if (!read_run(&runs[i], files[i])) {
      free_runs(runs, n);
      free(files);
      return 2;
    }
  char def[4096], tmp[4200];
  if (!out) {
    const char *in = files[0];
    size_t l = strlen(in);
    int strip = l > 6 && !strcmp(in + l - 6, ".jsonl");
    snprintf(def, sizeof def, "%.*s.svg", (int)(strip ? l - 6 : l), in);
    out = def;
  }
  snprintf(tmp, sizeof tmp, "%s.tmp", out);
  FILE *f = fopen(tmp, "w");
  int ok = f != NULL;
  if (ok) {
    draw(f, runs, n, peak);
    ok = !ferror(f);
    ok = (fclose(f) == 0) && ok;
    ok = ok && rename(tmp, out) == 0;
    if (!ok) remove(tmp);
  }
  free_runs(runs, n);
  free(files);
  if (!ok) {
    fprintf(stderr, "dtrain plot: cannot write %s: %s\n", out, strerror(errno));
    return 1;
  }
  printf("dtrain plot: wrote %s (%d run%s)\n", out, n, n == 1 ? "" : "s");
  return 0;
}
