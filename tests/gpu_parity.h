/* Shared pieces of the kernel-parity program (tests/gpu_parity*.cu): device/host helpers that
 * exit on failure (a test program), the comparison that prints one row per case, and the case
 * groups of the other files. */
#ifndef DT_GPU_PARITY_H
#define DT_GPU_PARITY_H

#include <cuda_runtime.h>
#include <stddef.h>

extern "C" {
#include "model.h"
#include "status.h"
}

extern int g_fail, g_cases;

void gp_check(cudaError_t rc, const char *what, int line);
void gp_try(dt_status_t st, const char *what, int line);
#define GP_CK(call) gp_check((call), #call, __LINE__)
#define GP_TRY(call) gp_try((call), #call, __LINE__)

void *gp_dev(size_t bytes);
void *gp_host(size_t bytes);
float *gp_up(const float *h, size_t n);   /* a device copy of h (n floats) */
float *gp_down(const float *d, size_t n); /* a malloc'd host copy of d, after a device sync */
float *gp_rand(dt_rng_t *r, size_t n, float scale, int prec);
/* One row: normalised max error max|gpu - cpu| / max|cpu| against tol; non-finite values fail
 * unless both sides agree. Returns 1 on pass. */
int gp_compare(const char *op, const char *shape, int prec, const float *gpu, const float *cpu, size_t n, double tol);
/* tolerance: fp32 math as written (1 ulp-ish), or one bf16/fp16 rounding step of the outputs */
double gp_tol(int prec, double fp32);

/* tests/gpu_parity_ops.cu */
void gp_attention_softmax(int B, int NH, int T, int prec, dt_rng_t *r);
void gp_crossentropy(int N, int V, int Vp, int prec, dt_rng_t *r);
void gp_crossentropy_huge(dt_rng_t *r);
void gp_optimizer(size_t n, dt_rng_t *r);
void gp_attention_decode(int B, int NH, int hs, int pos, int n, int Tmax, int prec, dt_rng_t *r);
void gp_attention_flash(int B, int NH, int hs, int T, int prec, dt_rng_t *r);
void gp_convert16(size_t n, dt_rng_t *r);
/* tests/gpu_parity_tp.cu */
void gp_tensor_parallel(int prec, dt_rng_t *r);
/* tests/gpu_parity_cnn.cu */
void gp_cnn_all(dt_rng_t *r);
/* tests/gpu_parity_store.cu: the 16-bit storage instantiations against the float path, bit for bit */
void gp_store16_all(dt_rng_t *r, int small);
/* tests/gpu_parity_backend.cu */
void gp_backend_all(int small);

#endif
