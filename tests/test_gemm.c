/* dt_sgemm against a float64 reference: all four transpose combinations, alpha/beta cases (beta = 0
 * must ignore NaN in C), odd sizes, padded leading dimensions, K and N past one cache block, 1 and
 * 2 threads, both engines. Error bound per element:
 *   |c - ref| <= (K + 4) * FLT_EPSILON * (|alpha| sum_k |a_ik||b_kj| + |beta||c0_ij|).
 * The blas_* cases run everywhere. The own_* cases force the own AVX-512 engine (the one DT_GEMM=auto
 * picks on an AVX-512 host) and also compare each of its products with BLAS's (both within the
 * bound of the float64 value, so within twice the bound of each other); on a CPU or a build
 * without AVX-512 they are skipped, and make check's summary counts each of them as SKIP (the
 * Criterion programs report through automake's TAP driver, tests/criterion_tap.sh). */
#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dt_build.h"
#include "gemm.h"
#include "gemm_census.h"

#define SENTINEL 12345.0f

static uint64_t rng = 88172645463325252ull;
static float frand(void) { /* uniform in [-1, 1) */
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return (float)((rng >> 40) * (1.0 / (1ull << 23)) - 1.0);
}

/* Run one product with the current engine and check every element of C, and that C's padding
 * columns (ldc > N) are untouched. Returns the worst error / bound ratio. */
static double check(int ta, int tb, int M, int N, int K, float alpha, float beta, int pad) {
  const int lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
  const int arows = ta ? K : M, brows = tb ? N : K;
  float *A = malloc(sizeof(float) * ((size_t)arows * lda + 1));
  float *B = malloc(sizeof(float) * ((size_t)brows * ldb + 1));
  float *C = malloc(sizeof(float) * ((size_t)M * ldc + 1));
  float *C0 = malloc(sizeof(float) * ((size_t)M * ldc + 1));
  cr_assert(A && B && C && C0);
  for (long i = 0; i < (long)arows * lda; i++) A[i] = frand();
  for (long i = 0; i < (long)brows * ldb; i++) B[i] = frand();
  for (int i = 0; i < M; i++)
    for (int j = 0; j < ldc; j++) C0[(long)i * ldc + j] = j >= N ? SENTINEL : beta == 0.0f ? NAN : frand();
  memcpy(C, C0, sizeof(float) * (size_t)M * ldc);
  dt_sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  float *Cb = NULL; /* the own engine's product again from BLAS */
  if (dt_gemm_engine() == DT_GEMM_OWN) {
    Cb = malloc(sizeof(float) * ((size_t)M * ldc + 1));
    cr_assert(Cb);
    memcpy(Cb, C0, sizeof(float) * (size_t)M * ldc);
    cr_assert_eq(dt_gemm_set_engine(DT_GEMM_BLAS), DT_OK, "%s", dt_err_msg());
    dt_sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, Cb, ldc);
    cr_assert_eq(dt_gemm_set_engine(DT_GEMM_OWN), DT_OK, "%s", dt_err_msg());
  }
  /* Reference operands, contiguous along k: opA[i][k] = op(A)(i, k), opB[j][k] = op(B)(k, j). */
  double *opA = malloc(sizeof(double) * ((size_t)M * K + 1)), *opB = malloc(sizeof(double) * ((size_t)N * K + 1));
  cr_assert(opA && opB);
  for (int i = 0; i < M; i++)
    for (int k = 0; k < K; k++) opA[(long)i * K + k] = ta ? A[(long)k * lda + i] : A[(long)i * lda + k];
  for (int j = 0; j < N; j++)
    for (int k = 0; k < K; k++) opB[(long)j * K + k] = tb ? B[(long)j * ldb + k] : B[(long)k * ldb + j];
  double worst = 0.0;
  for (int i = 0; i < M; i++)
    for (int j = 0; j < ldc; j++) {
      const float got = C[(long)i * ldc + j];
      if (j >= N) {
        cr_assert_eq(got, SENTINEL, "padding C[%d][%d] written (M=%d N=%d K=%d ldc=%d)", i, j, M, N, K, ldc);
        continue;
      }
      double s = 0.0, sa = 0.0;
      const double *a = opA + (long)i * K, *b = opB + (long)j * K;
      for (int k = 0; k < K; k++) {
        s += a[k] * b[k];
        sa += fabs(a[k] * b[k]);
      }
      const double c0 = C0[(long)i * ldc + j];
      const double ref = alpha * s + (beta == 0.0f ? 0.0 : beta * c0);
      const double bound = (K + 4) * (double)FLT_EPSILON * (fabs(alpha) * sa + (beta == 0.0f ? 0.0 : fabs(beta * c0))) + 1e-30;
      const double err = fabs(got - ref);
      cr_assert(err <= bound, "%s ta=%d tb=%d M=%d N=%d K=%d alpha=%g beta=%g pad=%d: C[%d][%d] = %.9g, ref %.9g (bound %.3g)",
                dt_gemm_engine_name(), ta, tb, M, N, K, alpha, beta, pad, i, j, got, ref, bound);
      if (Cb)
        cr_assert(fabs(got - (double)Cb[(long)i * ldc + j]) <= 2 * bound,
                  "own vs BLAS ta=%d tb=%d M=%d N=%d K=%d alpha=%g beta=%g pad=%d: C[%d][%d] = %.9g, BLAS %.9g "
                  "(2 x bound %.3g)",
                  ta, tb, M, N, K, alpha, beta, pad, i, j, got, Cb[(long)i * ldc + j], 2 * bound);
      if (err / bound > worst) worst = err / bound;
    }
  free(opA);
  free(opB);
  free(Cb);
  free(A);
  free(B);
  free(C);
  free(C0);
  return worst;
}

/* 64 and 128: a convolution's channels, whole B panels and the last row block's 8- and 2-row kernels */
static const int sizes[] = {1, 7, 13, 31, 33, 64, 97, 128, 130};
static const int nsizes = sizeof sizes / sizeof sizes[0];
static const int ks[] = {1, 13, 64, 97, 130, 400};
static const int nks = sizeof ks / sizeof ks[0];

/* Every (M, N) pair of odd sizes with a K from a cycled list, for all 4 transposes. */
static void sweep(dt_gemm_engine_t e, int threads) {
  cr_assert_eq(dt_gemm_set_engine(e), DT_OK, "%s", dt_err_msg());
  omp_set_num_threads(threads);
  int n = 0;
  double worst = 0.0;
  for (int t = 0; t < 4; t++)
    for (int mi = 0; mi < nsizes; mi++)
      for (int ni = 0; ni < nsizes; ni++, n++) {
        const int K = ks[n % nks], pad = n % 3 == 0 ? 5 : 0;
        const float alpha = n % 4 == 0 ? 1.0f : n % 4 == 1 ? -0.75f : n % 4 == 2 ? 2.0f : 1.0f;
        const float beta = n % 5 == 0 ? 0.0f : n % 5 == 1 ? 1.0f : n % 5 == 2 ? -1.5f : n % 5 == 3 ? 0.0f : 0.25f;
        double w = check(t & 1, t >> 1, sizes[mi], sizes[ni], K, alpha, beta, pad);
        if (w > worst) worst = w;
      }
  cr_log_info("%s, %d threads: %d products, worst error/bound %.3g", dt_gemm_engine_name(), threads, n, worst);
}

/* Shapes past one KC (384) and NC (<= 1024) block, big enough (> 32 MFLOP) for the threaded paths. */
static void blocks(dt_gemm_engine_t e, int threads, int dynamic) {
  cr_assert_eq(dt_gemm_set_engine(e), DT_OK, "%s", dt_err_msg());
  omp_set_num_threads(threads);
  for (int t = 0; t < 4; t++) {
    check(t & 1, t >> 1, 33, 1100, 777, 1.0f, 0.0f, 3); /* 3 A panels: threads split B panels */
    check(t & 1, t >> 1, 203, 129, 700, 0.5f, 1.0f, 0); /* threads split A panels */
    if (dynamic) {
      check(t & 1, t >> 1, 8200, 48, 48, 1.0f, 1.0f, 1);  /* > 4 row slabs: dynamic schedule */
      check(t & 1, t >> 1, 16, 4200, 256, 1.0f, 0.0f, 0); /* > 4 NC column slabs: dynamic */
    }
  }
}

#ifdef DT_HAVE_AVX512_GEMM
#define OWN_MISSING "this CPU lacks AVX-512 F/VL/BW/DQ"
#else
#define OWN_MISSING "not built (the compiler took no AVX-512 flags)"
#endif
#define OWN_OR_SKIP()                                                                   \
  do {                                                                                  \
    if (!dt_gemm_own_available()) cr_skip_test("own AVX-512 sgemm: " OWN_MISSING); \
  } while (0)

Test(gemm, own_sizes_1thread) { OWN_OR_SKIP(); sweep(DT_GEMM_OWN, 1); }
Test(gemm, own_sizes_2threads) { OWN_OR_SKIP(); sweep(DT_GEMM_OWN, 2); }
Test(gemm, own_blocks_1thread) { OWN_OR_SKIP(); blocks(DT_GEMM_OWN, 1, 0); }
Test(gemm, own_blocks_2threads) { OWN_OR_SKIP(); blocks(DT_GEMM_OWN, 2, 1); }
Test(gemm, blas_sizes) { sweep(DT_GEMM_BLAS, 2); }
Test(gemm, blas_blocks) { blocks(DT_GEMM_BLAS, 2, 0); }

/* K = 0: C = beta * C; beta = 0 writes zeros over NaN; M or N = 0 touches nothing. */
static void degenerate(dt_gemm_engine_t e) {
  cr_assert_eq(dt_gemm_set_engine(e), DT_OK, "%s", dt_err_msg());
  float A[4] = {1, 2, 3, 4}, B[4] = {1, 2, 3, 4}, C[6] = {1, 2, 3, 4, 5, 6};
  dt_sgemm(0, 0, 2, 3, 0, 1.0f, A, 1, B, 3, 2.0f, C, 3);
  for (int i = 0; i < 6; i++) cr_expect_eq(C[i], 2.0f * (i + 1), "%s K=0 beta=2: C[%d] = %g", dt_gemm_engine_name(), i, C[i]);
  for (int i = 0; i < 6; i++) C[i] = NAN;
  dt_sgemm(0, 0, 2, 3, 0, 1.0f, A, 1, B, 3, 0.0f, C, 3);
  for (int i = 0; i < 6; i++) cr_expect_eq(C[i], 0.0f, "%s K=0 beta=0: C[%d] = %g", dt_gemm_engine_name(), i, C[i]);
  dt_sgemm(0, 0, 0, 3, 2, 1.0f, A, 2, B, 3, 0.0f, C, 3);
  dt_sgemm(0, 0, 2, 0, 2, 1.0f, A, 2, B, 1, 0.0f, C, 1);
  for (int i = 0; i < 6; i++) cr_expect_eq(C[i], 0.0f);
}
Test(gemm, own_degenerate) { OWN_OR_SKIP(); degenerate(DT_GEMM_OWN); }
Test(gemm, blas_degenerate) { degenerate(DT_GEMM_BLAS); }

/* The own engine gives every element the same summation order whatever the thread count, so
 * 1 and 2 threads must agree bit for bit (its agreement with BLAS and the float64 reference is
 * check()'s, in the other own_* cases). */
Test(gemm, own_thread_invariant) {
  OWN_OR_SKIP();
  const int M = 150, N = 700, K = 500;
  float *A = malloc(sizeof(float) * M * K), *B = malloc(sizeof(float) * K * N);
  float *C1 = malloc(sizeof(float) * M * N), *C2 = malloc(sizeof(float) * M * N);
  cr_assert(A && B && C1 && C2);
  for (int i = 0; i < M * K; i++) A[i] = frand();
  for (int i = 0; i < K * N; i++) B[i] = frand();
  cr_assert_eq(dt_gemm_set_engine(DT_GEMM_OWN), DT_OK);
  omp_set_num_threads(1);
  dt_sgemm(0, 1, M, N, K, 1.0f, A, K, B, K, 0.0f, C1, N);
  omp_set_num_threads(2);
  dt_sgemm(0, 1, M, N, K, 1.0f, A, K, B, K, 0.0f, C2, N);
  cr_expect(memcmp(C1, C2, sizeof(float) * M * N) == 0, "1-thread and 2-thread results differ");
  free(A);
  free(B);
  free(C1);
  free(C2);
}

/* DT_GEMM selects the engine; a bad value is a configuration error naming the variable. */
Test(gemm, env_selection) {
  setenv("DT_GEMM", "blas", 1);
  cr_assert_eq(dt_gemm_init(), DT_OK);
  cr_expect_eq(dt_gemm_engine(), DT_GEMM_BLAS);
  cr_expect(strncmp(dt_gemm_engine_name(), "blas:", 5) == 0, "%s", dt_gemm_engine_name());
  setenv("DT_GEMM", "auto", 1);
  cr_assert_eq(dt_gemm_init(), DT_OK);
  cr_expect_eq(dt_gemm_engine(), dt_gemm_own_available() ? DT_GEMM_OWN : DT_GEMM_BLAS);
  setenv("DT_GEMM", "own", 1);
  cr_expect_eq(dt_gemm_init(), dt_gemm_own_available() ? DT_OK : DT_ERR_UNSUPPORTED);
  dt_err_clear();
  setenv("DT_GEMM", "fast", 1);
  cr_expect_eq(dt_gemm_init(), DT_ERR_CONFIG);
  cr_expect(strstr(dt_err_msg(), "DT_GEMM") != NULL, "%s", dt_err_msg());
  cr_expect_neq(dt_gemm_engine(), DT_GEMM_AUTO);
}

/* DT_GEMM_CENSUS's table: one row per shape (transposes included), its calls counted, the time
 * of a call inside a parallel region divided among the team, rows largest time first. */
Test(gemm, census) {
  dt_gemm_census_enable(1);
  static float A[64 * 256], B[256 * 96], C[64 * 96];
  for (int i = 0; i < 3; i++)
    dt_sgemm(0, 0, 64, 96, 256, 1.0f, A, 256, B, 96, 0.0f, C, 96);
  dt_sgemm(1, 0, 64, 96, 256, 1.0f, A, 64, B, 96, 0.0f, C, 96); /* another shape: transA */
  dt_sgemm(0, 0, 8, 8, 8, 1.0f, A, 8, B, 8, 0.0f, C, 8);
  dt_gemm_census_row_t r[8];
  int n = dt_gemm_census_rows(r, 8);
  dt_gemm_census_enable(0);
  cr_assert_eq(n, 3, "%d shapes, want 3", n);
  long calls[3] = {0};
  for (int i = 0; i < n; i++) {
    if (i > 0) cr_expect_geq(r[i - 1].seconds, r[i].seconds, "rows not largest time first");
    cr_expect_gt(r[i].seconds, 0.0);
    if (r[i].M == 64 && r[i].N == 96 && r[i].K == 256)
      calls[r[i].ta] += r[i].calls;
    else if (r[i].M == 8 && r[i].N == 8 && r[i].K == 8 && !r[i].ta && !r[i].tb)
      calls[2] += r[i].calls;
  }
  cr_expect(calls[0] == 3 && calls[1] == 1 && calls[2] == 1, "calls NN %ld, TN %ld, small %ld; want 3, 1, 1", calls[0],
            calls[1], calls[2]);
  /* inside a team of 2: each thread's call counts half its time */
  dt_gemm_census_enable(1);
  int team = 0;
#pragma omp parallel num_threads(2)
  {
    dt_gemm_census_add(0, 0, 1, 1, 1, 0.5);
#pragma omp single
    team = omp_get_num_threads();
  }
  n = dt_gemm_census_rows(r, 8);
  dt_gemm_census_enable(0);
  cr_assert_eq(n, 1);
  cr_expect(r[0].calls == team && fabs(r[0].seconds - 0.5) < 1e-9, "%ld calls, %g s; want %d calls, 0.5 s", r[0].calls,
            r[0].seconds, team);
}
