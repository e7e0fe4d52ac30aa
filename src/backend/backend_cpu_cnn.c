/* The CPU backend's image-classifier kernels (cnn_kernels.h): ops_cnn_cpu.c's functions over host
 * memory, on be->threads OpenMP threads (the convolutions' per-thread scratch and partial weight
 * gradients: results depend on that count, as they did before this table). */
#include <omp.h>

#include "cnn_kernels.h"
#include "kmath.h"
#include "ops_cnn_cpu.h"
#include "ops_cpu.h"

static int nthr(const dt_backend_t *be) { return be->threads > 0 ? be->threads : omp_get_max_threads(); }

static size_t conv_scratch(const dt_backend_t *be, int C, int K, int OC, int OH, int OW, int stride, int pad) {
  return dt_conv2d_scratch_floats(C, K, K, OC, OH, OW, stride, pad, nthr(be));
}

static dt_status_t conv_forward(dt_backend_t *be, float *out, float *scratch, const float *inp, const float *w,
                                const float *bias, int B, int C, int H, int W, int OC, int K, int stride, int pad) {
  dt_conv2d_forward(out, scratch, inp, w, bias, B, C, H, W, OC, K, K, stride, pad, nthr(be));
  return DT_OK;
}

static dt_status_t conv_backward(dt_backend_t *be, float *dinp, float *dw, float *db, float *scratch,
                                 const float *dout, const float *inp, const float *w, int B, int C, int H, int W,
                                 int OC, int K, int stride, int pad) {
  dt_conv2d_backward(dinp, dw, db, scratch, dout, inp, w, B, C, H, W, OC, K, K, stride, pad, nthr(be));
  return DT_OK;
}

static dt_status_t bn_stats(dt_backend_t *be, float *mean, float *var, const float *inp, int B, int C, int HW) {
  (void)be;
  dt_batchnorm_stats(mean, var, inp, B, C, HW);
  return DT_OK;
}

static dt_status_t bn_running(dt_backend_t *be, float *rm, float *rv, const float *mean, const float *var, int C,
                              float momentum, double n) {
  (void)be;
  dt_batchnorm_running(rm, rv, mean, var, C, momentum, n);
  return DT_OK;
}

static dt_status_t bn_forward(dt_backend_t *be, float *out, float *rstd, const float *inp, const float *mean,
                              const float *var, const float *w, const float *b, float eps, int relu, int B, int C,
                              int HW) {
  (void)be;
  dt_batchnorm_forward(out, rstd, inp, mean, var, w, b, eps, relu, B, C, HW);
  return DT_OK;
}

static dt_status_t bn_backward_reduce(dt_backend_t *be, float *sdy, float *sdyx, float *dw, float *db,
                                      const float *dout, const float *relu_out, const float *inp, const float *mean,
                                      const float *rstd, int B, int C, int HW) {
  (void)be;
  dt_batchnorm_backward_reduce(sdy, sdyx, dw, db, dout, relu_out, inp, mean, rstd, B, C, HW);
  return DT_OK;
}

static dt_status_t bn_backward(dt_backend_t *be, float *dinp, const float *dout, const float *relu_out,
                               const float *inp, const float *mean, const float *rstd, const float *w, const float *sdy,
                               const float *sdyx, double count, int B, int C, int HW) {
  (void)be;
  dt_batchnorm_backward(dinp, dout, relu_out, inp, mean, rstd, w, sdy, sdyx, count, B, C, HW);
  return DT_OK;
}

static dt_status_t relu_forward(dt_backend_t *be, float *out, const float *inp, size_t n) {
  (void)be;
  dt_relu_forward(out, inp, n);
  return DT_OK;
}

static dt_status_t relu_backward(dt_backend_t *be, float *dinp, const float *dout, const float *out, size_t n) {
  (void)be;
  dt_relu_backward(dinp, dout, out, n);
  return DT_OK;
}

static dt_status_t maxpool_forward(dt_backend_t *be, float *out, int *idx, const float *inp, int B, int C, int H,
                                   int W, int K, int stride, int pad) {
  (void)be;
  dt_maxpool_forward(out, idx, inp, B, C, H, W, K, stride, pad);
  return DT_OK;
}

static dt_status_t maxpool_backward(dt_backend_t *be, float *dinp, const float *dout, const int *idx, int B, int C,
                                    int H, int W, int K, int stride, int pad) {
  (void)be;
  dt_maxpool_backward(dinp, dout, idx, B, C, H, W, dt_conv_out(H, K, stride, pad), dt_conv_out(W, K, stride, pad));
  return DT_OK;
}

static dt_status_t gap_forward(dt_backend_t *be, float *out, const float *inp, int B, int C, int HW) {
  (void)be;
  dt_global_avgpool_forward(out, inp, B, C, HW);
  return DT_OK;
}

static dt_status_t gap_backward(dt_backend_t *be, float *dinp, const float *dout, int B, int C, int HW) {
  (void)be;
  dt_global_avgpool_backward(dinp, dout, B, C, HW);
  return DT_OK;
}

static dt_status_t add(dt_backend_t *be, float *out, const float *a, const float *b, int relu, size_t n) {
  (void)be;
  if (relu) dt_add_relu_forward(out, a, b, n);
  else dt_residual_forward(out, a, b, n);
  return DT_OK;
}

static dt_status_t sgd(dt_backend_t *be, float *p, const float *g, float *m, size_t n, float scale, float lr,
                       float momentum, float wd, int nesterov) {
  const long N = (long)n;
#pragma omp parallel for schedule(static) num_threads(nthr(be))
  for (long i = 0; i < N; i++) p[i] = dt_sgd_update(p[i], g[i] * scale, &m[i], lr, momentum, wd, nesterov);
  return DT_OK;
}

static dt_status_t adamw(dt_backend_t *be, float *p, const float *g, float *m, float *v, size_t n, float scale,
                         float lr, float b1, float b2, float eps, float wd, float bc1, float bc2) {
  const long N = (long)n;
#pragma omp parallel for schedule(static) num_threads(nthr(be))
  for (long i = 0; i < N; i++) p[i] = dt_adamw_update(p[i], g[i] * scale, &m[i], &v[i], lr, b1, b2, eps, wd, bc1, bc2);
  return DT_OK;
}

const dt_cnn_kernels_t dt_cpu_cnn_kernels = {
    .conv2d_scratch_floats = conv_scratch,
    .conv2d_forward = conv_forward,
    .conv2d_backward = conv_backward,
    .bn_stats = bn_stats,
    .bn_running = bn_running,
    .bn_forward = bn_forward,
    .bn_backward_reduce = bn_backward_reduce,
    .bn_backward = bn_backward,
    .relu_forward = relu_forward,
    .relu_backward = relu_backward,
    .maxpool_forward = maxpool_forward,
    .maxpool_backward = maxpool_backward,
    .gap_forward = gap_forward,
    .gap_backward = gap_backward,
    .add = add,
    .sgd = sgd,
    .adamw = adamw,
};
