/* Our own single-precision GEMM for AVX-512 CPUs, in the GotoBLAS/BLIS structure:
 *   for jc (NC columns of C), for pc (KC of K): pack the op(B) block into NR-column panels (it
 *   stays in L2); for each MR-row micro-panel of op(A): pack it (it stays in L1) and run the
 *   MR x NR register-blocked micro-kernel against every B panel. OpenMP threads each take an
 *   independent slab of C. Compiled with -mavx512f -mavx512vl -mavx512bw -mavx512dq -mfma;
 *   gemm.c calls it only when the CPU has those features. */
#include <immintrin.h>
#include <omp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gemm_own.h"

/* Register block: MR rows x NR = 16*NV columns of C in MR*NV zmm accumulators. */
#ifndef DT_GEMM_MR
#define DT_GEMM_MR 14
#endif
#define MR DT_GEMM_MR
#define NV 2
#define NR (16 * NV)
/* Cache block: KC x NC of packed op(B) stays in L2 (NC is set at run time so that it fills about
 * 3/4 of this core's L2: 1024 on a 2 MB L2, 512 on 1 MB, within [NC_MIN, NC_MAX]); MR x KC of
 * packed op(A) stays in L1. DT_GEMM_NC in the environment overrides NC (tuning). */
#ifndef DT_GEMM_KC
#define DT_GEMM_KC 384
#endif
#define NC_MIN 256
#define NC_MAX 2048
#ifndef DT_GEMM_PF
#define DT_GEMM_PF 0 /* software prefetch distance for B in the micro-kernel, in k steps (0: off) */
#endif
#define KC DT_GEMM_KC
/* Below this many flops (2MNK, ~0.25 ms on one core) one thread does it: waking the team costs
 * microseconds on idle cores but a scheduler time slice on oversubscribed ones (OpenBLAS also
 * keeps small products on one thread). */
#define DT_GEMM_PAR_FLOPS 3.2e7

_Static_assert(MR <= 16, "A panels are packed with one masked 16-lane store per k");
_Static_assert(MR > 8, "the last row block's kernels (8, 4, 2 rows) need MR > 8");
_Static_assert(NC_MIN % NR == 0 && NC_MAX % NR == 0, "NC must be a multiple of NR");

#define UNROLL _Pragma("GCC unroll 32")

static inline __mmask16 lanes(int n) { return n >= 16 ? (__mmask16)0xFFFF : n <= 0 ? 0 : (__mmask16)((1u << n) - 1); }

/* In-place transpose of 16 rows of 16 floats: r[i][j] -> r[j][i]. */
static inline void transpose16(__m512 r[16]) {
  __m512 t[16];
  UNROLL for (int i = 0; i < 8; i++) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  /* r[4i+q], 128-bit lane L: column 4L+q of rows 4i..4i+3 */
  UNROLL for (int i = 0; i < 4; i++) {
    __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 1]);
    __m512d c = _mm512_castps_pd(t[4 * i + 2]), d = _mm512_castps_pd(t[4 * i + 3]);
    r[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
    r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
    r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
    r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
  }
  UNROLL for (int q = 0; q < 4; q++) {
    t[q] = _mm512_shuffle_f32x4(r[q], r[4 + q], 0x88);
    t[q + 4] = _mm512_shuffle_f32x4(r[q], r[4 + q], 0xdd);
    t[q + 8] = _mm512_shuffle_f32x4(r[8 + q], r[12 + q], 0x88);
    t[q + 12] = _mm512_shuffle_f32x4(r[8 + q], r[12 + q], 0xdd);
  }
  UNROLL for (int q = 0; q < 4; q++) {
    r[q] = _mm512_shuffle_f32x4(t[q], t[q + 8], 0x88);
    r[q + 8] = _mm512_shuffle_f32x4(t[q], t[q + 8], 0xdd);
    r[q + 4] = _mm512_shuffle_f32x4(t[q + 4], t[q + 12], 0x88);
    r[q + 12] = _mm512_shuffle_f32x4(t[q + 4], t[q + 12], 0xdd);
  }
}

/* The rows the micro-kernel computes for a row block of m rows (kernel() below): MR, or 8, 4 or 2
 * for the last block of a product whose M is not a multiple of MR. */
static inline int kernel_rows_for(int m) { return m > 8 ? MR : m > 4 ? 8 : m > 2 ? 4 : 2; }

/* Pack one MR-row micro-panel of op(A), rows [i0, i0 + m), k in [k0, k0 + kc), in one of two
 * layouts the micro-kernel reads:
 *   transA (op(A)(i, k) = A[k*lda + i]): k-major, dst[k*MR + i] (one masked load per k);
 *   !transA (op(A)(i, k) = A[i*lda + k]): row-major, dst[i*KC + k], each row a plain copy. The
 *   kernel broadcasts a[i*KC + k], a constant displacement from one pointer; transposing 16 x 16
 *   blocks into the k-major layout instead took 4.7% of a ResNet-50 step, most of it in the
 *   convolutions' weight-gradient products (64-512 rows and columns), whose A panels serve few
 *   B panels.
 * Rows m .. kernel_rows_for(m) - 1 are zero. dst needs 16 - MR floats of slack after the panel. */
static void pack_a(int transA, const float *A, long lda, int i0, int k0, int m, int kc, float *dst) {
  if (transA) {
    const __mmask16 mm = lanes(m);
    const float *src = A + (long)k0 * lda + i0;
    for (int k = 0; k < kc; k++) _mm512_storeu_ps(dst + k * MR, _mm512_maskz_loadu_ps(mm, src + k * lda));
    return;
  }
  const int rows = kernel_rows_for(m);
  for (int i = 0; i < rows; i++) {
    float *d = dst + (long)i * KC;
    if (i >= m) {
      memset(d, 0, (size_t)kc * sizeof *d);
      continue;
    }
    const float *src = A + (long)(i0 + i) * lda + k0;
    int k = 0;
    for (; k + 16 <= kc; k += 16)
      _mm512_storeu_ps(d + k, _mm512_loadu_ps(src + k));
    if (k < kc) _mm512_mask_storeu_ps(d + k, lanes(kc - k), _mm512_maskz_loadu_ps(lanes(kc - k), src + k));
  }
}

/* Full panels of an untransposed B, src (kc rows of np * NR floats, ldb apart) into np panels
 * (kc, NR) kc*NR apart. Row by row, so each row of B is read as one sequential stream, with the
 * row PF_ROWS ahead prefetched: B usually comes from memory (a convolution's input or im2col
 * matrix), and reading it panel by panel (128 bytes per row, ldb apart) left the core waiting on
 * DRAM latency: with M = 64 (few row blocks to amortise the packing) a B of 32 MB ran at 70% of the
 * rate of a cached one; row by row, at 80% (Zen 4, bench/gemm_bench). */
#define PF_ROWS 4
static void pack_b_rows(const float *src, long ldb, int kc, int np, float *dst) {
  for (int k = 0; k < kc; k++) {
    const float *r = src + k * ldb;
    if (k + PF_ROWS < kc)
      for (int l = 0; l < np * NR; l += 16)
        _mm_prefetch((const char *)(r + PF_ROWS * ldb + l), _MM_HINT_T0);
    float *d = dst + (long)k * NR;
    for (int p = 0; p < np; p++)
      UNROLL for (int v = 0; v < NV; v++)
          _mm512_store_ps(d + (long)p * kc * NR + 16 * v, _mm512_loadu_ps(r + p * NR + 16 * v));
  }
}

/* Pack NR-column panels [p0, p1) of the op(B) block (k0.., j0..) of kc x nc: panel p is
 * dst + p*kc*NR, (kc, NR), dst[k][j] = op(B)(k0 + k, j0 + p*NR + j), columns past nc zero.
 * op(B)(k, j) = B[k*ldb + j] (!transB) or B[j*ldb + k] (transB). */
static void pack_b(int transB, const float *B, long ldb, int k0, int j0, int kc, int nc, int p0, int p1,
                   float *dst) {
  if (!transB && (p1 - p0) * NR <= nc - p0 * NR) { /* whole panels of B's rows: row by row (below) */
    pack_b_rows(B + (long)k0 * ldb + j0 + p0 * NR, ldb, kc, p1 - p0, dst + (long)p0 * kc * NR);
    return;
  }
  for (int p = p0; p < p1; p++) {
    float *d = dst + (long)p * kc * NR;
    const int j = j0 + p * NR, w = nc - p * NR < NR ? nc - p * NR : NR;
    if (!transB) {
      const float *src = B + (long)k0 * ldb + j;
      if (w == NR) {
        for (int k = 0; k < kc; k++)
          UNROLL for (int v = 0; v < NV; v++) _mm512_store_ps(d + k * NR + 16 * v, _mm512_loadu_ps(src + k * ldb + 16 * v));
      } else {
        for (int k = 0; k < kc; k++)
          UNROLL for (int v = 0; v < NV; v++)
            _mm512_store_ps(d + k * NR + 16 * v, _mm512_maskz_loadu_ps(lanes(w - 16 * v), src + k * ldb + 16 * v));
      }
      continue;
    }
    for (int v = 0; v < NV; v++) {
      const int wv = w - 16 * v; /* valid columns in this 16-wide half */
      for (int kb = 0; kb < kc; kb += 16) {
        const int kn = kc - kb < 16 ? kc - kb : 16;
        const __mmask16 km = lanes(kn);
        __m512 r[16];
        UNROLL for (int jj = 0; jj < 16; jj++)
          r[jj] = jj < wv ? _mm512_maskz_loadu_ps(km, B + (long)(j + 16 * v + jj) * ldb + k0 + kb) : _mm512_setzero_ps();
        transpose16(r);
        if (kn == 16) {
          UNROLL for (int t = 0; t < 16; t++) _mm512_store_ps(d + (kb + t) * NR + 16 * v, r[t]);
        } else {
          for (int t = 0; t < kn; t++) _mm512_store_ps(d + (kb + t) * NR + 16 * v, r[t]);
        }
      }
    }
  }
}

/* Micro-kernel: C[0:m, 0:n] = alpha * sum_k a[k][i] * b[k][j] + beta * C[0:m, 0:n], with
 * a (kc, MR) and b (kc, NR) packed, m <= RB <= MR, n <= NR, C row-major with ldc. beta == 0: C is
 * not read. RB, the rows computed, is a constant at each call (below). */
static inline __attribute__((always_inline)) void kernel_rows(const int RB, const int AROW, int kc,
                                                              const float *restrict a, const float *restrict b,
                                                              float *c, long ldc, int m, int n, float alpha,
                                                              float beta) {
  __m512 acc[MR][NV];
  UNROLL for (int i = 0; i < RB; i++) UNROLL for (int v = 0; v < NV; v++) acc[i][v] = _mm512_setzero_ps();
  for (int i = 0; i < m; i++) {
    _mm_prefetch((const char *)(c + i * ldc), _MM_HINT_T0);
    _mm_prefetch((const char *)(c + i * ldc + NR - 1), _MM_HINT_T0);
  }
  for (int k = 0; k < kc; k++) {
    __m512 bv[NV];
    UNROLL for (int v = 0; v < NV; v++) bv[v] = _mm512_load_ps(b + 16 * v);
#if DT_GEMM_PF
    UNROLL for (int v = 0; v < NV; v++) _mm_prefetch((const char *)(b + DT_GEMM_PF * NR + 16 * v), _MM_HINT_T0);
#endif
    UNROLL for (int i = 0; i < RB; i++) {
      const __m512 ai = _mm512_set1_ps(AROW ? a[i * KC] : a[i]);
      UNROLL for (int v = 0; v < NV; v++) acc[i][v] = _mm512_fmadd_ps(ai, bv[v], acc[i][v]);
    }
    a += AROW ? 1 : MR;
    b += NR;
  }
  const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
  if (m == RB && n == NR) {
    if (beta == 0.0f) {
      UNROLL for (int i = 0; i < RB; i++) UNROLL for (int v = 0; v < NV; v++)
          _mm512_storeu_ps(c + i * ldc + 16 * v, _mm512_mul_ps(va, acc[i][v]));
    } else if (beta == 1.0f) {
      UNROLL for (int i = 0; i < RB; i++) UNROLL for (int v = 0; v < NV; v++) {
        float *p = c + i * ldc + 16 * v;
        _mm512_storeu_ps(p, _mm512_fmadd_ps(va, acc[i][v], _mm512_loadu_ps(p)));
      }
    } else {
      UNROLL for (int i = 0; i < RB; i++) UNROLL for (int v = 0; v < NV; v++) {
        float *p = c + i * ldc + 16 * v;
        _mm512_storeu_ps(p, _mm512_fmadd_ps(va, acc[i][v], _mm512_mul_ps(vb, _mm512_loadu_ps(p))));
      }
    }
    return;
  }
  __mmask16 mk[NV];
  UNROLL for (int v = 0; v < NV; v++) mk[v] = lanes(n - 16 * v);
  UNROLL for (int i = 0; i < RB; i++) {
    if (i >= m) break;
    UNROLL for (int v = 0; v < NV; v++) {
      float *p = c + i * ldc + 16 * v;
      __m512 r = _mm512_mul_ps(va, acc[i][v]);
      if (beta != 0.0f) r = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(mk[v], p), r);
      _mm512_mask_storeu_ps(p, mk[v], r);
    }
  }
}

/* The last row block of a product whose M is not a multiple of MR (64 = 4 x 14 + 8, 128 = 9 x 14 +
 * 2: a convolution's channels) runs a kernel of 8, 4 or 2 rows rather than MR rows of padding: 8
 * rows of 64's last block cost 8 rows of FMAs, not 14 (M = 64 and 128 products ~9% faster). arow:
 * a is packed row-major (pack_a, !transA). */
static inline __attribute__((always_inline)) void kernel_layout(const int AROW, int kc, const float *restrict a,
                                                                const float *restrict b, float *c, long ldc, int m,
                                                                int n, float alpha, float beta) {
  const int rb = kernel_rows_for(m);
  if (rb == MR)
    kernel_rows(MR, AROW, kc, a, b, c, ldc, m, n, alpha, beta);
  else if (rb == 8)
    kernel_rows(8, AROW, kc, a, b, c, ldc, m, n, alpha, beta);
  else if (rb == 4)
    kernel_rows(4, AROW, kc, a, b, c, ldc, m, n, alpha, beta);
  else
    kernel_rows(2, AROW, kc, a, b, c, ldc, m, n, alpha, beta);
}

static void kernel(int arow, int kc, const float *restrict a, const float *restrict b, float *c, long ldc, int m, int n,
                   float alpha, float beta) {
  if (arow)
    kernel_layout(1, kc, a, b, c, ldc, m, n, alpha, beta);
  else
    kernel_layout(0, kc, a, b, c, ldc, m, n, alpha, beta);
}

/* Packing buffers, one set per thread (the caller and each OpenMP worker), allocated on first use
 * and kept for the thread's life: no allocation per call. The B buffer (KC x NC_MAX floats) is
 * freed when its thread exits (a key's destructor): OpenMP runtimes end and start workers as team
 * sizes change, and each new worker allocates its own (it leaked ~20 MB per step at 16 threads). */
static _Thread_local float *tl_bbuf;
static pthread_key_t g_bbuf_key;
static pthread_once_t g_bbuf_once = PTHREAD_ONCE_INIT;
static _Thread_local float tl_abuf[MR * KC + 16] __attribute__((aligned(64))); /* + tail, see pack_a */

static int g_nc; /* NC, chosen once */

static int nc_get(void) {
  int nc = __atomic_load_n(&g_nc, __ATOMIC_RELAXED);
  if (nc) return nc;
  const char *env = getenv("DT_GEMM_NC");
  long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
  if (env && atoi(env) > 0) nc = atoi(env);
  else nc = l2 > 0 ? (int)(l2 * 3 / 4 / (KC * (long)sizeof(float))) : 512;
  nc = nc < NC_MIN ? NC_MIN : nc > NC_MAX ? NC_MAX : nc / NR * NR;
  __atomic_store_n(&g_nc, nc, __ATOMIC_RELAXED);
  return nc;
}

static void bbuf_key_make(void) { pthread_key_create(&g_bbuf_key, free); }

static float *bbuf_get(void) {
  if (!tl_bbuf) {
    tl_bbuf = aligned_alloc(64, sizeof(float) * (size_t)KC * NC_MAX);
    pthread_once(&g_bbuf_once, bbuf_key_make);
    pthread_setspecific(g_bbuf_key, tl_bbuf); /* free(tl_bbuf) at thread exit */
  }
  return tl_bbuf;
}

/* C = beta * C for K == 0 (beta == 0 writes zeros without reading). */
static void scale_c(int M, int N, float beta, float *C, long ldc) {
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++) C[i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[i * ldc + j];
}

/* Exact but slow path, only if the 3 MB packing buffer cannot be allocated. */
static void gemm_naive(int transA, int transB, int M, int N, int K, float alpha, const float *A, long lda,
                       const float *B, long ldb, float beta, float *C, long ldc) {
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++) {
      float s = 0.0f;
      for (int k = 0; k < K; k++) s += (transA ? A[k * lda + i] : A[i * lda + k]) * (transB ? B[j * ldb + k] : B[k * ldb + j]);
      C[i * ldc + j] = alpha * s + (beta == 0.0f ? 0.0f : beta * C[i * ldc + j]);
    }
}

/* One thread's whole product (M, N, K >= 1) with its own packing buffers. */
static void gemm_serial(int transA, int transB, int M, int N, int K, float alpha, const float *A, long lda,
                        const float *B, long ldb, float beta, float *C, long ldc) {
  float *bbuf = bbuf_get(), *abuf = tl_abuf;
  const int NC = nc_get();
  if (!bbuf) {
    gemm_naive(transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  for (int jc = 0; jc < N; jc += NC) {
    const int nc = N - jc < NC ? N - jc : NC;
    const int np = (nc + NR - 1) / NR; /* B panels in this block */
    for (int pc = 0; pc < K; pc += KC) {
      const int kc = K - pc < KC ? K - pc : KC;
      const float beta_eff = pc == 0 ? beta : 1.0f;
      pack_b(transB, B, ldb, pc, jc, kc, nc, 0, np, bbuf);
      for (int i = 0; i < M; i += MR) {
        const int m = M - i < MR ? M - i : MR;
        pack_a(transA, A, lda, i, pc, m, kc, abuf);
        for (int jp = 0; jp < np; jp++) {
          const int n = nc - jp * NR < NR ? nc - jp * NR : NR;
          kernel(!transA, kc, abuf, bbuf + (long)jp * kc * NR, C + i * ldc + jc + jp * NR, ldc, m, n, alpha, beta_eff);
        }
      }
    }
  }
}

/* Rows of C per dynamically scheduled slab when splitting rows (each slab re-packs op(B)). */
#define ROW_SLAB (146 * MR)

/* C (rows [lo, hi) or columns [lo, hi)) on the calling thread. */
static void gemm_slab(int split_n, int lo, int hi, int transA, int transB, int M, int N, int K, float alpha,
                      const float *A, long lda, const float *B, long ldb, float beta, float *C, long ldc) {
  if (hi <= lo) return;
  if (split_n) /* op(B) columns are B's columns (!transB) or rows (transB) */
    gemm_serial(transA, transB, M, hi - lo, K, alpha, A, lda, B + (transB ? lo * ldb : lo), ldb, beta, C + lo, ldc);
  else /* op(A) rows are A's rows (!transA) or columns (transA) */
    gemm_serial(transA, transB, hi - lo, N, K, alpha, A + (transA ? lo : lo * lda), lda, B, ldb, beta, C + lo * ldc, ldc);
}

/* Threads split C into independent slabs, each packing its own operands: no barriers, so one
 * descheduled thread never stalls the other mid-product. Columns are split when op(A) is the
 * smaller operand (every slab re-packs it), rows otherwise. Large products are cut into slabs of
 * NC columns (no extra packing: the serial loop packs op(A) once per NC block anyway) or ROW_SLAB
 * rows, handed out dynamically so a thread that got less CPU does less; others in equal halves. */
void dt__sgemm_avx512(int transA, int transB, int M, int N, int K, float alpha, const float *A, int lda,
                      const float *B, int ldb, float beta, float *C, int ldc) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0 || alpha == 0.0f) {
    scale_c(M, N, beta, C, ldc);
    return;
  }
  const int split_n = M <= N, dim = split_n ? N : M;
  const int unit = split_n ? NR : MR, units = (dim + unit - 1) / unit;
  int nth = omp_get_max_threads();
  if (2.0 * M * N * K < DT_GEMM_PAR_FLOPS || omp_in_parallel()) nth = 1; /* small, or inside a team */
  if (nth > units) nth = units;
  if (nth <= 1) {
    gemm_serial(transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  const int slab = split_n ? nc_get() : ROW_SLAB, nslabs = (dim + slab - 1) / slab;
  /* the whole team, with the threads past nth idle: a smaller team would make the OpenMP runtime
   * end its surplus workers and start new ones at the next full-size region (libgomp does) */
#pragma omp parallel
  {
    const int tid = omp_get_thread_num(), nt = nth < omp_get_num_threads() ? nth : omp_get_num_threads();
    if (nslabs >= 2 * nt) {
#pragma omp for schedule(dynamic, 1) nowait
      for (int c = 0; c < nslabs; c++)
        gemm_slab(split_n, c * slab, (c + 1) * slab < dim ? (c + 1) * slab : dim, transA, transB, M, N, K, alpha, A, lda,
                  B, ldb, beta, C, ldc);
    } else if (tid < nt) {
      const int u0 = (int)((long)units * tid / nt), u1 = (int)((long)units * (tid + 1) / nt);
      gemm_slab(split_n, u0 * unit, u1 * unit < dim ? u1 * unit : dim, transA, transB, M, N, K, alpha, A, lda, B, ldb,
                beta, C, ldc);
    }
  }
}

const char *dt__sgemm_avx512_name(void) {
  static char name[64];
  if (!name[0]) snprintf(name, sizeof name, "own-avx512 %dx%d KC=%d NC=%d", MR, NR, KC, nc_get());
  return name;
}
