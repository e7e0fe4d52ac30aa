/* Independent double-precision forwards of GPT-2's layers (naive loops) and the central
 * finite-difference check the layer and whole-model gradient tests use (tests/test_layers.c,
 * tests/test_model.c). Tolerance reasoning: the reference forwards are fed the same
 * (float-representable) inputs as the float kernels, and the derivative is the central difference
 * (f(x+h) - f(x-h)) / 2h with h = 1e-5: truncation error ~h^2 * f''' ~ 1e-10 and rounding ~1e-16 *
 * |f| / h ~ 1e-11, so the FD gradient is exact to ~1e-9 absolute. The analytic gradients come from
 * the float32 kernels, whose rounding error is ~1e-7 relative per operation, growing with sqrt of
 * the sum lengths here (<= 256 terms) to well under 1e-5 of the tensor's largest gradient. A formula
 * bug (missing term, wrong scale, wrong index) gives errors of order 1e-1 or larger. Criterion:
 * max|analytic - fd| <= FD_TOL * max|fd| per tensor, FD_TOL = 1e-4. */
#ifndef DT_TEST_REF_GPT2_H
#define DT_TEST_REF_GPT2_H

#include <stddef.h>
#include <stdint.h>

#define FD_TOL 1e-4
#define FD_H 1e-5

typedef double (*objective_fn)(void *ctx);

/* x[0..n) ~ N(0, s^2) from dtrain's RNG seeded with seed */
void fill_normal(float *x, size_t n, double s, uint64_t seed);
/* a malloc'd double copy of x[0..n) */
double *to_double(const float *x, size_t n);
/* Central differences of f over x[0..n) (double inputs the objective reads) against `analytic`
 * (cr_expect: max|analytic - fd| <= FD_TOL * max|fd|, and fd not identically zero). */
void fd_check(const char *what, double *x, size_t n, const float *analytic, objective_fn f, void *ctx);
/* cr_expect: max|a - b| <= tol * max|b| */
void expect_close(const char *what, const float *a, const double *b, size_t n, double tol);
double dot(const double *a, const double *b, size_t n);

void ref_layernorm(double *out, const double *x, const double *w, const double *b, int N, int C);
/* out = x W^T + b with W (OC, C) (nn.Linear: the lm_head) or, conv1d = 1, out = x W + b with
 * W (C, OC) (Hugging Face's Conv1D: the blocks' weights); b may be NULL */
void ref_linear(double *out, const double *x, const double *W, const double *b, int N, int C, int OC, int conv1d);
void ref_matmul(double *out, const double *x, const double *W, const double *b, int N, int C, int OC);
void ref_conv1d(double *out, const double *x, const double *W, const double *b, int N, int C, int OC);
/* causal multi-head attention of qkv (B, T, 3C) -> out (B, T, C) */
void ref_attention(double *out, const double *qkv, int B, int T, int C, int NH);
double ref_gelu(double x);
/* mean cross-entropy over N rows of V real logits (row stride Vp) */
double ref_crossentropy(const double *logits, const int *tgt, int N, int V, int Vp);

#endif
