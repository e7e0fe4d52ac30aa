/* Winograd convolution for the CPU's 3x3, stride-1, padding-1 layers (issue #25): F(m x m, 3 x 3)
 * with m = 2 or 4 (Lavin and Gray, "Fast Algorithms for Convolutional Neural Networks", 2016).
 *
 * Every m x m tile of the output is Y = AT [ U (.) V ] AT^T, summed over input channels, with
 * U = G g G^T the filter and V = BT d BT^T the (m+2) x (m+2) input tile d, all transformed into
 * the a x a "Winograd domain" (a = m + 2). Summing over channels turns the a*a element-wise
 * products into a*a independent matrix products, one per domain position xi:
 *   M_xi (OC, T) = U_xi (OC, C) V_xi (C, T)          T = tiles of a chunk of images
 * which dt_cpu_sgemm does. The same identity, differentiated, gives backward:
 *   Md = A dY A^T (A = AT^T)    dU_xi += Md_xi V_xi^T    dV_xi = U_xi^T Md_xi
 *   dg = G^T dU G               dd = BT^T dV BT   (added over the overlapping input tiles)
 * Multiplies per output: 9 C OC (direct) against a^2/m^2 C OC (2.25x fewer for m = 2, 4x for
 * m = 4). The transforms' constants are exact in binary for m = 2 (1, 1/2); m = 4's (1/6, 1/24,
 * 5, 8) cost accuracy (about 10x the rounding error), so auto takes m = 2 (conv_winograd.h).
 *
 * Threads: each stage is an `omp for` over independent items (channels or positions xi), every
 * output owned by one thread, and dU accumulates chunk by chunk in a fixed order: the results do
 * not depend on the thread count. Transforms run on blocks of up to WB tiles held as vectors over
 * tiles (one tile row of a zero-padded plane at a time, or up to WB tiles), each an unrolled
 * a x a transform over a vector of tiles in registers. */
#include "dt_build.h"

#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "conv_winograd.h"
#include "ops_cpu.h"

#define WB 64          /* tiles per transform block */
/* Tiles per chunk of images (the products' width; at least one image). Of 64, 128, 256, 512 and
 * 1024 tiles, 128 was fastest for ResNet-50 on 32x32 images. */
#define WINO_TILES 128
#define AMAX 6
#define SKEW 16 /* floats added to the strides between domain positions: power-of-two strides put the
                 * a*a rows a transform writes into the same cache sets (measured: 1.7x slower) */
#define MIN_C 16 /* fewer input channels: im2col (the stem's 3: the products would be 3 deep) */

/* The transforms, row-major: BT (a, a), G (a, 3), AT (m, a); their transposes BTt (a, a), Gt (3, a),
 * A (a, m). Constant tables: the transform functions below unroll over them, so the compiler drops
 * the zero coefficients and the multiplications by 1 and -1. */
static const float BT2[] = {1, 0, -1, 0, 0, 1, 1, 0, 0, -1, 1, 0, 0, 1, 0, -1};
static const float BTt2[] = {1, 0, 0, 0, 0, 1, -1, 1, -1, 1, 1, 0, 0, 0, 0, -1};
static const float G2[] = {1, 0, 0, .5f, .5f, .5f, .5f, -.5f, .5f, 0, 0, 1};
static const float Gt2[] = {1, .5f, .5f, 0, 0, .5f, -.5f, 0, 0, .5f, .5f, 1};
static const float AT2[] = {1, 1, 1, 0, 0, 1, -1, -1};
static const float A2[] = {1, 0, 1, 1, 1, -1, 0, -1};
static const float BT4[] = {4, 0, -5, 0, 1, 0, 0, -4, -4, 1, 1, 0, 0, 4, -4, -1, 1, 0,
                            0, -2, -1, 2, 1, 0, 0, 2, -1, -2, 1, 0, 0, 4, 0, -5, 0, 1};
static const float BTt4[] = {4, 0, 0, 0, 0, 0, 0, -4, 4, -2, 2, 4, -5, -4, -4, -1, -1, 0,
                             0, 1, -1, 2, -2, -5, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 1};
static const float G4[] = {1.0f / 4, 0, 0, -1.0f / 6, -1.0f / 6, -1.0f / 6, -1.0f / 6, 1.0f / 6, -1.0f / 6,
                           1.0f / 24, 1.0f / 12, 1.0f / 6, 1.0f / 24, -1.0f / 12, 1.0f / 6, 0, 0, 1};
static const float Gt4[] = {1.0f / 4, -1.0f / 6, -1.0f / 6, 1.0f / 24, 1.0f / 24, 0, 0, -1.0f / 6, 1.0f / 6,
                            1.0f / 12, -1.0f / 12, 0, 0, -1.0f / 6, -1.0f / 6, 1.0f / 6, 1.0f / 6, 1};
static const float AT4[] = {1, 1, 1, 1, 1, 0, 0, 1, -1, 2, -2, 0, 0, 1, 1, 4, 4, 0, 0, 1, -1, 8, -8, 1};
static const float A4[] = {1, 0, 0, 0, 1, 1, 1, 1, 1, -1, 1, -1, 1, 2, 4, 8, 1, -2, 4, -8, 0, 0, 0, 1};

/* ---- the algorithm's choice -------------------------------------------------------------- */

static int g_algo = -1; /* dt_conv_algo_t, -1 until read from DT_CONV */

dt_status_t dt_conv_algo_init(void) {
  const char *s = getenv("DT_CONV");
  int a = DT_CONV_AUTO;
  dt_status_t st = DT_OK;
  if (s && *s) {
    if (strcmp(s, "auto") == 0) a = DT_CONV_AUTO;
    else if (strcmp(s, "im2col") == 0) a = DT_CONV_IM2COL;
    else if (strcmp(s, "winograd2") == 0) a = DT_CONV_WINOGRAD2;
    else if (strcmp(s, "winograd4") == 0) a = DT_CONV_WINOGRAD4;
    else st = DT_ERR(DT_ERR_CONFIG, "environment DT_CONV='%s': expected auto, im2col, winograd2 or winograd4", s);
  }
  __atomic_store_n(&g_algo, a, __ATOMIC_RELEASE);
  return st;
}

void dt_conv_set_algo(dt_conv_algo_t a) { __atomic_store_n(&g_algo, (int)a, __ATOMIC_RELEASE); }

dt_conv_algo_t dt_conv_algo(void) {
  if (__atomic_load_n(&g_algo, __ATOMIC_ACQUIRE) < 0) dt_conv_algo_init();
  return (dt_conv_algo_t)__atomic_load_n(&g_algo, __ATOMIC_ACQUIRE);
}

const char *dt_conv_algo_name(void) {
  switch (dt_conv_algo()) {
  case DT_CONV_IM2COL: return "im2col (DT_CONV=im2col)";
  case DT_CONV_WINOGRAD2: return "Winograd F(2x2,3x3) (DT_CONV=winograd2)";
  case DT_CONV_WINOGRAD4: return "Winograd F(4x4,3x3) (DT_CONV=winograd4)";
  default: return "Winograd F(2x2,3x3) (DT_CONV=auto)";
  }
}

int dt_conv_winograd_m(int C, int KH, int KW, int stride, int pad) {
  if (C < MIN_C || KH != 3 || KW != 3 || stride != 1 || pad != 1) return 0;
  switch (dt_conv_algo()) {
  case DT_CONV_IM2COL: return 0;
  case DT_CONV_WINOGRAD4: return 4;
  default: return 2;
  }
}

/* ---- sizes ---------------------------------------------------------------------------------- */

typedef struct {
  int m, a, tH, tW, tpi, n; /* tile size, tiles per image (tH x tW), images per chunk */
  int PH, PW;               /* a padded plane: (tH m + 2, tW m + 2) */
  size_t U, dU, V, M, buf;  /* offsets into the scratch */
  size_t ux;                /* U's and dU's stride between domain positions: OC*C + SKEW */
  size_t perthr, total;     /* a thread's buffers */
} wplan_t;

static wplan_t wplan(int m, int C, int OC, int H, int W, int nthr) {
  wplan_t p = {.m = m, .a = m + 2, .tH = (H + m - 1) / m, .tW = (W + m - 1) / m};
  p.tpi = p.tH * p.tW;
  p.PH = p.tH * m + 2, p.PW = p.tW * m + 2;
  p.n = (WINO_TILES + p.tpi - 1) / p.tpi;
  size_t aa = (size_t)p.a * p.a, T = (size_t)p.n * p.tpi;
  p.ux = (size_t)OC * C + SKEW;
  p.U = 0;
  p.dU = aa * p.ux;
  p.V = p.dU + aa * p.ux;
  p.M = p.V + aa * (C * T + SKEW);
  p.buf = p.M + aa * (OC * T + SKEW);
  p.perthr = aa * WB + (size_t)p.PH * p.PW; /* add_tiles' block, a padded plane */
  p.total = p.buf + (size_t)nthr * p.perthr;
  return p;
}

size_t dt_conv_winograd_scratch_floats(int m, int C, int OC, int H, int W, int nthr) {
  return wplan(m, C, OC, H, W, nthr).total;
}

/* ---- transforms --------------------------------------------------------------------------- */

#define UNROLL _Pragma("GCC unroll 8")

/* sum_i r[i] v[i*vs] over the nonzero r[i]: with r constant after inlining, no work for the zeros
 * and none for multiplying by 1 or -1 */
static inline __attribute__((always_inline)) float dot_nz(const float *r, const float *v, int vs, int n) {
  float acc = 0.0f;
  int first = 1;
  UNROLL for (int i = 0; i < n; i++) if (r[i] != 0.0f) {
    acc = first ? r[i] * v[i * vs] : acc + r[i] * v[i * vs];
    first = 0;
  }
  return acc;
}

/* For lanes t < nb: dst(k, l) = sum_{i,j} R[k][i] R[l][j] src(i, j), R (no, ni), with element (i, j)
 * of lane t at src[i*si + j*sj + t*st] and (k, l) at dst[k*di + l*dj + t*dt]. Inlined with R, no,
 * ni, st and dt constant: fully unrolled, one vector of lanes at a time, all in registers. */
static inline __attribute__((always_inline)) void xf(float *restrict dst, size_t di, size_t dj, int dt,
                                                     const float *restrict src, size_t si, size_t sj, int st,
                                                     const float *R, int no, int ni, int nb) {
#pragma omp simd
  for (int t = 0; t < nb; t++) {
    float x[AMAX][AMAX], e[AMAX][AMAX];
    UNROLL for (int i = 0; i < ni; i++) UNROLL for (int j = 0; j < ni; j++) {
      x[i][j] = src[i * si + j * sj + (size_t)t * st];
    }
    UNROLL for (int k = 0; k < no; k++) UNROLL for (int j = 0; j < ni; j++) {
      e[k][j] = dot_nz(R + k * ni, &x[0][j], AMAX, ni); /* R x, column j */
    }
    UNROLL for (int k = 0; k < no; k++) UNROLL for (int l = 0; l < no; l++) {
      dst[k * di + l * dj + (size_t)t * dt] = dot_nz(R + l * ni, e[k], 1, ni); /* (R x) R^T */
    }
  }
}

/* A tile row's nb tiles from a padded plane's rows (pb, row stride PW, tiles m apart) into the
 * domain: dst(k, l) lane t at dst[(k*a + l)*dld + t] = (BT d BT^T)(k, l). */
DT_CPU_VEC static void xf_in2(float *dst, size_t dld, const float *pb, int PW, int nb) {
  xf(dst, 4 * dld, dld, 1, pb, (size_t)PW, 1, 2, BT2, 4, 4, nb);
}
DT_CPU_VEC static void xf_in4(float *dst, size_t dld, const float *pb, int PW, int nb) {
  xf(dst, 6 * dld, dld, 1, pb, (size_t)PW, 1, 4, BT4, 6, 6, nb);
}
/* The domain back to a tile row of outputs: pb[r*PW + s + m*t] = (AT M AT^T)(r, s). */
DT_CPU_VEC static void xf_out2(float *pb, int PW, const float *src, size_t sld, int nb) {
  xf(pb, (size_t)PW, 1, 2, src, 4 * sld, sld, 1, AT2, 2, 4, nb);
}
DT_CPU_VEC static void xf_out4(float *pb, int PW, const float *src, size_t sld, int nb) {
  xf(pb, (size_t)PW, 1, 4, src, 6 * sld, sld, 1, AT4, 4, 6, nb);
}
/* A tile row of output gradients into the domain: dst(k, l) = (A dY A^T)(k, l). */
DT_CPU_VEC static void xf_dout2(float *dst, size_t dld, const float *pb, int PW, int nb) {
  xf(dst, 4 * dld, dld, 1, pb, (size_t)PW, 1, 2, A2, 4, 2, nb);
}
DT_CPU_VEC static void xf_dout4(float *dst, size_t dld, const float *pb, int PW, int nb) {
  xf(dst, 6 * dld, dld, 1, pb, (size_t)PW, 1, 4, A4, 6, 4, nb);
}
/* Domain input gradients back to tiles: buf[(i*a + j)*WB + t] = (BT^T dV BT)(i, j). */
DT_CPU_VEC static void xf_din2(float *buf, const float *src, size_t sld, int nb) {
  xf(buf, 4 * WB, WB, 1, src, 4 * sld, sld, 1, BTt2, 4, 4, nb);
}
DT_CPU_VEC static void xf_din4(float *buf, const float *src, size_t sld, int nb) {
  xf(buf, 6 * WB, WB, 1, src, 6 * sld, sld, 1, BTt4, 6, 6, nb);
}
/* Filters, for channels c < nb held as g[(i*3 + j)*WB + c]: U(k, l) at U[(k*a + l)*uld + c] =
 * (G g G^T)(k, l); and back, g = G^T dU G. (Strided by 9 instead, as the weights lie, the lanes
 * became gathers and scatters: 7x slower.) */
DT_CPU_VEC static void xf_g2(float *U, size_t uld, const float *g, int nb) {
  xf(U, 4 * uld, uld, 1, g, 3 * WB, WB, 1, G2, 4, 3, nb);
}
DT_CPU_VEC static void xf_g4(float *U, size_t uld, const float *g, int nb) {
  xf(U, 6 * uld, uld, 1, g, 3 * WB, WB, 1, G4, 6, 3, nb);
}
DT_CPU_VEC static void xf_dg2(float *g, const float *dU, size_t uld, int nb) {
  xf(g, 3 * WB, WB, 1, dU, 4 * uld, uld, 1, Gt2, 3, 4, nb);
}
DT_CPU_VEC static void xf_dg4(float *g, const float *dU, size_t uld, int nb) {
  xf(g, 3 * WB, WB, 1, dU, 6 * uld, uld, 1, Gt4, 3, 6, nb);
}

/* A plane's tiles go through a zero-padded copy pb (PH, PW) of it, so that moving tiles is a set of
 * strided vector loops without bounds checks: pb holds the input plane at row and column 1 (its
 * padding), an output plane (or its gradient) at 0. Tile (ty, tx) covers pb rows m*ty ... + e - 1,
 * columns m*tx ... + e - 1 (e = a for inputs, m for outputs); tile q of an image is (q / tW, q % tW). */
static void pad_plane(float *restrict pb, const float *restrict plane, int H, int W, const wplan_t *p, int off) {
  memset(pb, 0, (size_t)p->PH * p->PW * sizeof *pb);
  for (int y = 0; y < H; y++)
    memcpy(pb + (size_t)(y + off) * p->PW + off, plane + (size_t)y * W, (size_t)W * sizeof *pb);
}

/* plane (H, W) = pb's window at (off, off) + bias */
static void crop_plane(float *restrict plane, const float *restrict pb, float bias, int H, int W, const wplan_t *p,
                       int off) {
  for (int y = 0; y < H; y++) {
    const float *restrict r = pb + (size_t)(y + off) * p->PW + off;
    float *restrict o = plane + (size_t)y * W;
    for (int x = 0; x < W; x++) o[x] = r[x] + bias;
  }
}

/* pb[(m*ty + i)*PW + m*(tx0 + t) + j] += buf[(i*a + j)*WB + t] for t < nb: the input tiles overlap,
 * so each (i, j) is its own loop (distinct addresses within one) and the loops run in order. */
DT_CPU_VEC static void add_tiles(float *restrict pb, int PW, const float *restrict buf, int m, int nb) {
  const int a = m + 2;
  for (int i = 0; i < a; i++)
    for (int j = 0; j < a; j++) {
      float *restrict s = pb + (size_t)i * PW + j;
      const float *restrict v = buf + (i * a + j) * WB;
      if (m == 2)
        for (int t = 0; t < nb; t++) s[2 * t] += v[t];
      else
        for (int t = 0; t < nb; t++) s[4 * t] += v[t];
    }
}

/* U (a*a, OC, C) = G g G^T for output channel oc, in blocks of WB input channels. */
static void filter_xform(float *U, size_t uld, const float *weight, int m, int C, int oc, float *g) {
  for (int c0 = 0; c0 < C; c0 += WB) {
    int nb = C - c0 < WB ? C - c0 : WB;
    const float *w = weight + ((size_t)oc * C + c0) * 9;
    for (int c = 0; c < nb; c++)
      for (int e = 0; e < 9; e++) g[e * WB + c] = w[c * 9 + e];
    if (m == 2) xf_g2(U + (size_t)oc * C + c0, uld, g, nb);
    else xf_g4(U + (size_t)oc * C + c0, uld, g, nb);
  }
}

/* dweight (OC, C, 3, 3) += G^T dU G for output channel oc. */
static void filter_grad(float *dweight, const float *dU, size_t uld, int m, int C, int oc, float *buf) {
  for (int c0 = 0; c0 < C; c0 += WB) {
    int nb = C - c0 < WB ? C - c0 : WB;
    float *dw = dweight + ((size_t)oc * C + c0) * 9;
    if (m == 2) xf_dg2(buf, dU + (size_t)oc * C + c0, uld, nb);
    else xf_dg4(buf, dU + (size_t)oc * C + c0, uld, nb);
    for (int c = 0; c < nb; c++)
      for (int e = 0; e < 9; e++) dw[c * 9 + e] += buf[e * WB + c];
  }
}

/* ---- forward and backward ------------------------------------------------------------------ */

typedef struct {
  const wplan_t *p;
  int C, OC, H, W, n, b0; /* this chunk: images [b0, b0 + n) */
  size_t T;               /* n * tiles per image: the products' width and the rows' stride */
  size_t vx, mx;          /* V's and M's stride between domain positions: C*T + SKEW, OC*T + SKEW */
} chunk_t;

/* The chunk of images [b0, b0 + at most p->n) of a batch of B. */
static chunk_t chunk_at(const wplan_t *p, int C, int OC, int H, int W, int B, int b0) {
  chunk_t k = {p, C, OC, H, W, B - b0 < p->n ? B - b0 : p->n, b0, 0, 0, 0};
  k.T = (size_t)k.n * p->tpi, k.vx = C * k.T + SKEW, k.mx = OC * k.T + SKEW;
  return k;
}

/* Every tile of the chunk's planes of x (nch channels per image) into the domain: with grad 0, x is
 * the input and D = V (a*a, C, T) = BT d BT^T; with grad 1, x is the output gradient and
 * D = Md (a*a, OC, T) = A dY A^T. */
static void stage_to_domain(float *D, const float *x, int grad, const chunk_t *k, float *pb) {
  const wplan_t *p = k->p;
  const int nch = grad ? k->OC : k->C;
  const size_t ld = grad ? k->mx : k->vx;
#pragma omp for schedule(static)
  for (int ic = 0; ic < k->n * nch; ic++) {
    int i = ic / nch, c = ic % nch;
    pad_plane(pb, x + ((size_t)(k->b0 + i) * nch + c) * k->H * k->W, k->H, k->W, p, !grad);
    for (int ty = 0; ty < p->tH; ty++) {
      float *d = D + (size_t)c * k->T + (size_t)i * p->tpi + (size_t)ty * p->tW;
      const float *r = pb + (size_t)p->m * ty * p->PW;
      if (grad) {
        if (p->m == 2) xf_dout2(d, ld, r, p->PW, p->tW);
        else xf_dout4(d, ld, r, p->PW, p->tW);
      } else {
        if (p->m == 2) xf_in2(d, ld, r, p->PW, p->tW);
        else xf_in4(d, ld, r, p->PW, p->tW);
      }
    }
  }
}

/* M_x (OC, T) = U_x (OC, C) V_x (C, T) for every domain position x, one product per thread */
static void stage_products(float *M, const float *U, const float *V, const chunk_t *k) {
  const int aa = k->p->a * k->p->a;
#pragma omp for schedule(static)
  for (int x = 0; x < aa; x++)
    dt_cpu_sgemm(0, 0, k->OC, (int)k->T, k->C, 1.0f, U + x * k->p->ux, k->C, V + x * k->vx, (int)k->T, 0.0f,
                 M + x * k->mx, (int)k->T);
}

/* out's planes of images [b0, b0+n) = AT M AT^T + bias */
static void stage_output(float *out, const float *M, const float *bias, const chunk_t *k, float *pb) {
  const wplan_t *p = k->p;
#pragma omp for schedule(static)
  for (int io = 0; io < k->n * k->OC; io++) {
    int i = io / k->OC, oc = io % k->OC;
    for (int ty = 0; ty < p->tH; ty++) {
      const float *src = M + (size_t)oc * k->T + (size_t)i * p->tpi + (size_t)ty * p->tW;
      float *r = pb + (size_t)p->m * ty * p->PW;
      if (p->m == 2) xf_out2(r, p->PW, src, k->mx, p->tW);
      else xf_out4(r, p->PW, src, k->mx, p->tW);
    }
    crop_plane(out + ((size_t)(k->b0 + i) * k->OC + oc) * k->H * k->W, pb, bias ? bias[oc] : 0.0f, k->H, k->W, p, 0);
  }
}

void dt_conv_winograd_forward(int m, float *out, float *scratch, const float *inp, const float *weight,
                              const float *bias, int B, int C, int H, int W, int OC, int nthr) {
  const wplan_t p = wplan(m, C, OC, H, W, nthr);
  float *U = scratch + p.U, *V = scratch + p.V, *M = scratch + p.M;
#pragma omp parallel num_threads(nthr)
  {
    float *pb = scratch + p.buf + (size_t)omp_get_thread_num() * p.perthr;
#pragma omp for schedule(static)
    for (int oc = 0; oc < OC; oc++) filter_xform(U, p.ux, weight, m, C, oc, pb);
    for (int b0 = 0; b0 < B; b0 += p.n) {
      const chunk_t k = chunk_at(&p, C, OC, H, W, B, b0);
      stage_to_domain(V, inp, 0, &k, pb);
      stage_products(M, U, V, &k);
      stage_output(out, M, bias, &k, pb);
    }
  }
}

/* dinp's planes of the chunk = BT^T dV BT, added over the overlapping tiles */
static void stage_dinp(float *dinp, const float *dV, const chunk_t *k, float *pb, float *buf) {
  const wplan_t *p = k->p;
  const size_t ld = k->vx;
#pragma omp for schedule(static)
  for (int ic = 0; ic < k->n * k->C; ic++) {
    int i = ic / k->C, c = ic % k->C;
    memset(pb, 0, (size_t)p->PH * p->PW * sizeof *pb);
    for (int ty = 0; ty < p->tH; ty++)
      for (int tx = 0; tx < p->tW; tx += WB) {
        int nb = p->tW - tx < WB ? p->tW - tx : WB;
        const float *src = dV + (size_t)c * k->T + (size_t)i * p->tpi + (size_t)ty * p->tW + tx;
        if (p->m == 2) xf_din2(buf, src, ld, nb);
        else xf_din4(buf, src, ld, nb);
        add_tiles(pb + (size_t)p->m * ty * p->PW + (size_t)p->m * tx, p->PW, buf, p->m, nb);
      }
    crop_plane(dinp + ((size_t)(k->b0 + i) * k->C + c) * k->H * k->W, pb, 0.0f, k->H, k->W, p, 1);
  }
}

/* One chunk's backward: dU (+)= Md V^T, and (dinp) dV = U^T Md into the input planes. */
static void chunk_backward(float *dinp, float *dU, const float *U, float *V, float *M, const float *dout,
                           const float *inp, const chunk_t *k, float *pb, float *buf) {
  const size_t aa = (size_t)k->p->a * k->p->a, uo = k->p->ux;
  stage_to_domain(V, inp, 0, k, pb);
  stage_to_domain(M, dout, 1, k, pb);
#pragma omp for schedule(static)
  for (size_t x = 0; x < aa; x++) {
    float *Vx = V + x * k->vx;
    const float *Mx = M + x * k->mx;
    dt_cpu_sgemm(0, 1, k->OC, k->C, (int)k->T, 1.0f, Mx, (int)k->T, Vx, (int)k->T, k->b0 ? 1.0f : 0.0f, dU + x * uo,
                 k->C); /* the first chunk writes dU, the others add to it */
    if (dinp) /* V_x is no longer needed: dV_x in its place */
      dt_cpu_sgemm(1, 0, k->C, (int)k->T, k->OC, 1.0f, U + x * uo, k->C, Mx, (int)k->T, 0.0f, Vx, (int)k->T);
  }
  if (dinp) stage_dinp(dinp, V, k, pb, buf);
}

void dt_conv_winograd_backward(int m, float *dinp, float *dweight, float *scratch, const float *dout,
                               const float *inp, const float *weight, int B, int C, int H, int W, int OC, int nthr) {
  const wplan_t p = wplan(m, C, OC, H, W, nthr);
  const size_t aa = (size_t)p.a * p.a;
  float *U = scratch + p.U, *dU = scratch + p.dU, *V = scratch + p.V, *M = scratch + p.M;
#pragma omp parallel num_threads(nthr)
  {
    float *buf = scratch + p.buf + (size_t)omp_get_thread_num() * p.perthr, *pb = buf + aa * WB;
#pragma omp for schedule(static)
    for (int oc = 0; oc < OC; oc++) filter_xform(U, p.ux, weight, m, C, oc, buf);
    for (int b0 = 0; b0 < B; b0 += p.n) {
      const chunk_t k = chunk_at(&p, C, OC, H, W, B, b0);
      chunk_backward(dinp, dU, U, V, M, dout, inp, &k, pb, buf);
    }
#pragma omp for schedule(static)
    for (int oc = 0; oc < OC; oc++) filter_grad(dweight, dU, p.ux, m, C, oc, buf);
  }
}
