/* The image classifiers' kernel interface: what src/model/cnn.c (the convolutional networks'
 * operations, written once) runs on besides dt_kernels_t (the linear layer, the cross-entropy,
 * rounding, memory). A backend that has them points dt_backend_ops_t.cnn at its table; NULL: it has
 * none, and the classifiers' trainer refuses it by name.
 *
 * Conventions as dt_kernels_t's: every pointer is backend memory, every call is queued in order on
 * be->stream and returns DT_OK or the launch's error; PARAMETER gradients ACCUMULATE (+=),
 * ACTIVATION gradients are WRITTEN (=). Formulas, shapes and layouts (NCHW images, PyTorch's weight
 * layouts): ops_cnn_cpu.h, whose functions are the CPU backend's table (backend_cpu_cnn.c) and the
 * reference a new backend's kernels are checked against. Square windows: K x K. */
#ifndef DT_CNN_KERNELS_H
#define DT_CNN_KERNELS_H

#include <stddef.h>

#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

struct dt_cnn_kernels {
  /* Floats of scratch the convolution kernels need for this backend's threads or streams. */
  size_t (*conv2d_scratch_floats)(const dt_backend_t *be, int C, int K, int OC, int OH, int OW, int stride,
                                  int pad);
  dt_status_t (*conv2d_forward)(dt_backend_t *be, float *out, float *scratch, const float *inp, const float *weight,
                                const float *bias, int B, int C, int H, int W, int OC, int K, int stride, int pad);
  dt_status_t (*conv2d_backward)(dt_backend_t *be, float *dinp, float *dweight, float *dbias, float *scratch,
                                 const float *dout, const float *inp, const float *weight, int B, int C, int H, int W,
                                 int OC, int K, int stride, int pad);
  /* batch norm in the pieces that synchronised batch norm all-reduces between (ops_cnn_cpu.h) */
  dt_status_t (*bn_stats)(dt_backend_t *be, float *mean, float *var, const float *inp, int B, int C, int HW);
  dt_status_t (*bn_running)(dt_backend_t *be, float *running_mean, float *running_var, const float *mean,
                            const float *var, int C, float momentum, double n);
  dt_status_t (*bn_forward)(dt_backend_t *be, float *out, float *rstd, const float *inp, const float *mean,
                            const float *var, const float *weight, const float *bias, float eps, int relu, int B, int C,
                            int HW);
  dt_status_t (*bn_backward_reduce)(dt_backend_t *be, float *sdy, float *sdyx, float *dweight, float *dbias,
                                    const float *dout, const float *relu_out, const float *inp, const float *mean,
                                    const float *rstd, int B, int C, int HW);
  dt_status_t (*bn_backward)(dt_backend_t *be, float *dinp, const float *dout, const float *relu_out, const float *inp,
                             const float *mean, const float *rstd, const float *weight, const float *sdy,
                             const float *sdyx, double count, int B, int C, int HW);
  /* Optional: batch norm's training passes in one call each, which the model makes instead of the
   * pieces above when be->cudnn_bn is set (the CUDA backend's: cuDNN's, system.batchnorm = cudnn),
   * over this rank's statistics only (never with synchronised batch norm). Forward: bn_running's (n
   * = B x HW) and bn_forward's results, the mean and rstd saved for backward. Backward: dinp
   * written, dweight, dbias accumulated; dout is consumed (with a ReLU: masked by relu_out > 0 in
   * place). */
  dt_status_t (*bn_train_forward)(dt_backend_t *be, float *out, float *mean, float *rstd, float *running_mean,
                                  float *running_var, const float *inp, const float *weight, const float *bias,
                                  float eps, float momentum, int relu, int B, int C, int HW);
  dt_status_t (*bn_train_backward)(dt_backend_t *be, float *dinp, float *dweight, float *dbias, float *dout,
                                   const float *relu_out, const float *inp, const float *mean, const float *rstd,
                                   const float *weight, float eps, int B, int C, int HW);
  dt_status_t (*relu_forward)(dt_backend_t *be, float *out, const float *inp, size_t n);
  dt_status_t (*relu_backward)(dt_backend_t *be, float *dinp, const float *dout, const float *out, size_t n);
  dt_status_t (*maxpool_forward)(dt_backend_t *be, float *out, int *idx, const float *inp, int B, int C, int H, int W,
                                 int K, int stride, int pad);
  dt_status_t (*maxpool_backward)(dt_backend_t *be, float *dinp, const float *dout, const int *idx, int B, int C, int H,
                                  int W, int K, int stride, int pad);
  dt_status_t (*gap_forward)(dt_backend_t *be, float *out, const float *inp, int B, int C, int HW);
  dt_status_t (*gap_backward)(dt_backend_t *be, float *dinp, const float *dout, int B, int C, int HW);
  /* Optional: pooling by one library call each, which the model makes instead of maxpool_* and gap_*
   * when be->cudnn_pool is set (the CUDA backend's: cuDNN's, system.pool = cudnn): a KH x KW window
   * (avg 0: its maximum; 1: its mean, padding counted; a window of the whole plane is global average
   * pooling). Backward reads the forward's input and output instead of an argmax (dinp written). */
  dt_status_t (*pool_forward)(dt_backend_t *be, float *out, const float *inp, int B, int C, int H, int W, int KH,
                              int KW, int stride, int pad, int avg);
  dt_status_t (*pool_backward)(dt_backend_t *be, float *dinp, const float *dout, const float *out, const float *inp,
                               int B, int C, int H, int W, int KH, int KW, int stride, int pad, int avg);
  /* out = a + b (n), with relu max(a + b, 0) (a residual add with its ReLU); out may alias a */
  dt_status_t (*add)(dt_backend_t *be, float *out, const float *a, const float *b, int relu, size_t n);
  /* The optimizers over n parameters, each gradient times `scale` first (kmath.h's dt_sgd_update
   * and dt_adamw_update per element; m, v: their state for the same n) */
  dt_status_t (*sgd)(dt_backend_t *be, float *p, const float *g, float *m, size_t n, float scale, float lr,
                     float momentum, float weight_decay, int nesterov);
  dt_status_t (*adamw)(dt_backend_t *be, float *p, const float *g, float *m, float *v, size_t n, float scale, float lr,
                       float beta1, float beta2, float eps, float weight_decay, float bc1, float bc2);
};

extern const dt_cnn_kernels_t dt_cpu_cnn_kernels;

#ifdef __cplusplus
}
#endif
#endif
