/* Compute backend interface: memory, kernels and capabilities. A backend owns four arenas laid
 * out by dt_layout_t (params, grads, AdamW m and v) and fills the kernel table dt_kernels_t that
 * the model (gpt2.h: GPT-2's layer order, written once) runs on; the trainer sees this vtable and
 * the model, never which backend it is (capabilities: host_memory, async). The CPU backend is
 * always built, the CUDA backend when configured. Pointers in the struct are host pointers for the
 * CPU backend and device pointers for CUDA; use copy_* to move data. */
#ifndef DT_BACKEND_H
#define DT_BACKEND_H

#include <stddef.h>

#include "comm.h"
#include "model.h"
#include "precision.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dt_backend dt_backend_t;
typedef struct dt_cnn_kernels dt_cnn_kernels_t; /* the image classifiers' kernels: cnn_kernels.h */

typedef enum { DT_BUF_PARAMS, DT_BUF_GRADS, DT_BUF_M, DT_BUF_V } dt_buf_t;
enum { DT_SPARSE_PARAMS = 1, DT_SPARSE_GRADS = 2 }; /* dt_backend_t.sparse */

/* Activation storage: activations, activation gradients and the weights' working copy, be->act_bytes
 * per element (4: float, rounded to be->precision where the model stores them; 2: the 16 bits of a
 * bf16/fp16 value, the CUDA backend's storage with be->store16). Statistics (layernorm means and
 * rstds, losses, log-sum-exps, the attention's state), the fp32 master, gradients and optimizer
 * state are float in every precision. */
typedef void dt_act_t;

typedef struct {
  float lr;           /* this step's learning rate */
  float beta1, beta2, eps, weight_decay;
  float grad_scale;   /* multiply gradients by this first (clipping factor; 1 = none) */
  int t;              /* 1-based step count for bias correction */
} dt_adamw_args_t;

/* The kernel interface: what the model (gpt2.h, GPT-2 written once) runs on. A backend fills one
 * table; every pointer argument is backend memory (host for the CPU, device for CUDA) unless named
 * *_host, every call is queued in order on the backend's compute stream (be->stream), and a
 * kernel returns DT_OK or the launch's error. Formulas and shapes: ops_cpu.h (the CPU twins, the
 * reference); N = B*T rows. Parameter gradients ACCUMULATE (+=), activation gradients are WRITTEN
 * (=). dt_act_t arguments are activation storage (be->act_bytes per element: the activations, their
 * gradients and the weights' working copy be->wparams), float ones float.
 * A new kernel: an entry here, its CPU twin (ops_cpu), the CUDA kernel (cuda/kernels.cu),
 * a case in tests/gpu_parity (docs/architecture.md). */
typedef struct {
  /* memory: alloc returns zeroed memory; download waits until dst holds the data */
  dt_status_t (*alloc)(dt_backend_t *be, void **p, size_t bytes);
  void (*release)(dt_backend_t *be, void *p);
  dt_status_t (*copy)(dt_backend_t *be, void *dst, const void *src, size_t bytes);     /* backend -> backend */
  dt_status_t (*upload)(dt_backend_t *be, void *dst, const void *src_host, size_t bytes);
  dt_status_t (*download)(dt_backend_t *be, void *dst_host, const void *src, size_t bytes);
  /* Gradient group g (model.h layer_begin) is final on the compute stream: work the caller then
   * queues on be->comm_stream runs after it (CUDA: an event; CPU: nothing to do). */
  dt_status_t (*grads_ready)(dt_backend_t *be, int g);
  /* Floats of the attention's per-block state kept from forward to backward (CPU: the row
   * log-sum-exp (B,NH,T); CUDA: the probabilities (B,NH,T,T)) and of its scratch shared by all
   * blocks, for NH local heads. */
  void (*attention_floats)(const dt_backend_t *be, int B, int T, int NH, size_t *state, size_t *scratch);
  /* out[b,t] = (inp in [v0, v0+nrows) ? wte[inp - v0] : 0) + (wpe ? wpe[t] : 0); wte (nrows,C) */
  dt_status_t (*encoder_forward)(dt_backend_t *be, dt_act_t *out, const int *inp, const dt_act_t *wte,
                                 const dt_act_t *wpe, int B, int T, int C, int v0, int nrows);
  /* dwte[inp - v0] += dout for tokens in [v0, v0+nrows), dwpe[t] += sum_b dout (positions in
   * ascending order: deterministic); inp_host: the same tokens on the host */
  dt_status_t (*encoder_backward)(dt_backend_t *be, float *dwte, float *dwpe, const dt_act_t *dout, const int *inp,
                                  const int *inp_host, int B, int T, int C, int v0, int nrows);
  /* out (N,OC) = [resid +] (acc + [bias]) stored rounded, from acc (N,OC) fp32 (tensor parallelism's
   * all-reduced partial products; with act_bytes 4 acc may be out itself); bias, resid may be NULL */
  dt_status_t (*epilogue)(dt_backend_t *be, dt_act_t *out, const float *acc, const dt_act_t *bias,
                          const dt_act_t *resid, int N, int OC);
  /* dst (n floats) = the values of src (n activations); nothing when dst is src (float storage) */
  dt_status_t (*widen)(dt_backend_t *be, float *dst, const dt_act_t *src, size_t n);
  /* layernorm_forward's out, layernorm_backward's dinp, gelu's outputs, crossentropy_backward's
   * dlogits, epilogue's out, linear_forward's out when it has a bias and the attention's out
   * (forward, decode) and dqkv are stored rounded to be->precision (precision.h; the kernels round
   * as they write, sparing the model a rounding pass over them); every other activation the model
   * rounds itself */
  dt_status_t (*layernorm_forward)(dt_backend_t *be, dt_act_t *out, float *mean, float *rstd, const dt_act_t *inp,
                                   const dt_act_t *weight, const dt_act_t *bias, int N, int C);
  dt_status_t (*layernorm_backward)(dt_backend_t *be, dt_act_t *dinp, float *dweight, float *dbias,
                                    const dt_act_t *dresid, const dt_act_t *dout, const dt_act_t *inp,
                                    const dt_act_t *weight, const float *mean, const float *rstd, int N, int C);
  /* out (N,OC) = [resid +] inp W [+ bias]: W (OC,C) nn.Linear (w_in_out = 0, the lm_head) or
   * (C,OC) Conv1D (w_in_out = 1, the blocks); bias, resid may be NULL (resid: Conv1D only) */
  dt_status_t (*linear_forward)(dt_backend_t *be, dt_act_t *out, const dt_act_t *inp, const dt_act_t *w, int w_in_out,
                                const dt_act_t *bias, const dt_act_t *resid, int N, int C, int OC);
  /* dinp = d out / d inp (if dinp), dweight += ..., dbias += sum_N dout (if dbias) */
  dt_status_t (*linear_backward)(dt_backend_t *be, dt_act_t *dinp, float *dweight, float *dbias, const dt_act_t *dout,
                                 const dt_act_t *inp, const dt_act_t *w, int w_in_out, int N, int C, int OC);
  /* The same two with out, dinp fp32 and unrounded whatever the storage, no bias or residual:
   * tensor parallelism's partial products, all-reduced in fp32 before the epilogue stores them */
  dt_status_t (*linear_forward32)(dt_backend_t *be, float *out, const dt_act_t *inp, const dt_act_t *w, int w_in_out,
                                  int N, int C, int OC);
  dt_status_t (*linear_backward32)(dt_backend_t *be, float *dinp, float *dweight, float *dbias, const dt_act_t *dout,
                                   const dt_act_t *inp, const dt_act_t *w, int w_in_out, int N, int C, int OC);
  /* causal self-attention over qkv (B,T,3C) with NH heads into out (B,T,C); state: this block's
   * (attention_floats), scratch: the shared one; backward also gets forward's out */
  dt_status_t (*attention_forward)(dt_backend_t *be, dt_act_t *out, float *state, float *scratch, const dt_act_t *qkv,
                                   int B, int T, int C, int NH);
  dt_status_t (*attention_backward)(dt_backend_t *be, dt_act_t *dqkv, float *scratch, const dt_act_t *dout,
                                    const dt_act_t *out, const dt_act_t *qkv, const float *state, int B, int T, int C,
                                    int NH);
  /* decoding with a key/value cache (gpt2.h dt_gpt2_decode): qkv (B,n,3C) of positions [pos, pos+n);
   * their k and v are stored into kc, vc (B,Tmax,C) at those positions, then out (B,n,C) = the
   * causal attention of each new query over cache positions [0, its own] (ops_cpu.h) */
  dt_status_t (*attention_decode)(dt_backend_t *be, dt_act_t *out, dt_act_t *kc, dt_act_t *vc, const dt_act_t *qkv,
                                  int B, int pos, int n, int Tmax, int C, int NH);
  dt_status_t (*gelu_forward)(dt_backend_t *be, dt_act_t *out, const dt_act_t *inp, size_t n);
  dt_status_t (*gelu_backward)(dt_backend_t *be, dt_act_t *dinp, const dt_act_t *inp, const dt_act_t *dout, size_t n);
  /* softmax over the first V of Vp columns + cross-entropy: losses, lse (N); *loss_sum (one double of
   * backend memory) += the mean loss (summed in float64, rounded to float: the loss a forward
   * reports). The host reads the sum when it needs it (once per step in training), so computing a
   * loss never makes the host wait. */
  dt_status_t (*crossentropy_forward)(dt_backend_t *be, float *losses, float *lse, const dt_act_t *logits,
                                      const int *targets, int N, int V, int Vp, double *loss_sum);
  /* The vocab-parallel cross-entropy in pieces (the model all-reduces between them): logits
   * (N,Vp) hold global columns [v0, v0+Vp) of which the first nv are real vocabulary:
   *   xent_max:    mx[i] = max over the nv columns
   *   xent_sumexp: sum[i] = sum exp(z - mx[i]) (double), tl[i] = z[target - v0] if it is here, else 0
   *   xent_finish: lse = mx + log(sum), losses = lse - tl (mx -> lse, tl -> losses in place),
   *                *loss_sum += mean of the losses (as crossentropy_forward) */
  dt_status_t (*xent_max)(dt_backend_t *be, float *mx, const dt_act_t *logits, int N, int nv, int Vp);
  dt_status_t (*xent_sumexp)(dt_backend_t *be, double *sum, float *tl, const dt_act_t *logits, const float *mx,
                             const int *targets, int N, int nv, int Vp, int v0);
  dt_status_t (*xent_finish)(dt_backend_t *be, float *lse_mx, float *losses_tl, const double *sum, int N,
                             double *loss_sum);
  /* in place: z[i,v] <- (softmax - [v + v0 == target]) * dloss for v < nv, 0 for v in [nv, Vp) */
  dt_status_t (*crossentropy_backward)(dt_backend_t *be, dt_act_t *logits, const float *lse, const int *targets,
                                       float dloss, int N, int nv, int Vp, int v0);
  /* x (n) rounded in place to be->precision (precision.h; fp32 and 16-bit storage: nothing);
   * dst = round(src), stored as activations (the weights' working copy) */
  dt_status_t (*round)(dt_backend_t *be, dt_act_t *x, size_t n);
  dt_status_t (*round_copy)(dt_backend_t *be, dt_act_t *dst, const float *src, size_t n);
  /* *out_host = sum of x[i]^2 over (n) (float64 accumulation) */
  dt_status_t (*sumsq)(dt_backend_t *be, const float *x, size_t n, double *out_host);
  /* x (n) = 0 (ZeRO-2/3 on device arenas: what lies outside the rank's shard after a reduction
   * or a use; host arenas give their pages back instead, zero.h). In a sparse arena (be->sparse)
   * the memory of what lies wholly inside goes back too, once the work queued before is done. */
  dt_status_t (*clear)(dt_backend_t *be, float *x, size_t n);
  /* x (n) has memory again before its next use (zeros where clear gave it back): a sparse arena's
   * gather or backward is about to write there. Nothing to do elsewhere (the CPU's pages come
   * back by themselves). */
  dt_status_t (*populate)(dt_backend_t *be, float *x, size_t n);
  /* x (n) = x / d elementwise, a true division as DT_AVG's (ZeRO-2: the shard's sum over the dp
   * ranks made their mean) */
  dt_status_t (*divide)(dt_backend_t *be, float *x, size_t n, float d);
} dt_kernels_t;

typedef struct {
  const char *name;
  const dt_kernels_t *kernels;
  /* Capabilities (docs/architecture.md: callers ask these, never which backend it is):
   * host_memory: the host may dereference the arenas and what alloc returns;
   * async: work is queued on streams and synchronize means something. */
  int host_memory, async;
  /* Allocate the arenas (and the kernels' scratch) for micro-batches of up to B x T. */
  dt_status_t (*init)(dt_backend_t *be, const dt_layout_t *lay, int B, int T, int threads);
  void (*free)(dt_backend_t *be);
  /* What runs the matmuls, for the run's header ("openblas", "own AVX2 sgemm", "cuBLAS"). */
  const char *(*engine)(const dt_backend_t *be);
  dt_status_t (*zero_grad)(dt_backend_t *be);
  /* Sum of squares of the gradients in the optimizer range [opt_lo, opt_hi) (float64 accumulation). */
  dt_status_t (*grad_sumsq)(dt_backend_t *be, double *out);
  /* One AdamW step over the optimizer range [opt_lo, opt_hi) of the arena (the whole arena
   * unless ZeRO set a range; decay only on tensors with decay=1). */
  dt_status_t (*adamw)(dt_backend_t *be, const dt_adamw_args_t *a);
  /* Copy `count` floats at arena offset `off` between a buffer and host memory. */
  dt_status_t (*copy_to_host)(dt_backend_t *be, dt_buf_t buf, size_t off, size_t count, float *dst);
  dt_status_t (*copy_from_host)(dt_backend_t *be, dt_buf_t buf, size_t off, size_t count, const float *src);
  /* Storage precision of the working parameters, activations and activation gradients
   * (precision.h); init leaves fp32. Call after init, before forward (and before the model carves
   * its activations: it sets act_bytes): allocates the working copy be->wparams for bf16/fp16. */
  dt_status_t (*set_precision)(dt_backend_t *be, dt_precision_t p);
  /* Block until everything queued on the backend (its compute and communication streams) has
   * finished: host timers around device work and host code that hands device memory to another
   * library (a communicator) call it. Nothing to wait for on the CPU. */
  dt_status_t (*synchronize)(dt_backend_t *be);
  /* The image classifiers' kernels (cnn_kernels.h); NULL: this backend has none. */
  const dt_cnn_kernels_t *cnn;
} dt_backend_ops_t;

struct dt_backend {
  const dt_backend_ops_t *ops;
  const dt_kernels_t *k;         /* == ops->kernels */
  const dt_layout_t *lay;
  float *params, *grads, *m, *v; /* arenas of lay->n_params floats (host or device); params is the
                                    fp32 master that AdamW updates and checkpoints hold */
  dt_act_t *wparams;             /* the parameters forward/backward read: == params in fp32, else a
                                    copy rounded to `precision` at the start of every forward, in
                                    activation storage (act_bytes per element) */
  int wparams_by_sync;           /* ZeRO-3 in bf16/fp16 (zero.h dt_zero3_working): the sync strategy makes
                                    and gathers the working copy; the models must not round it */
  int precision;                 /* dt_precision_t, set by set_precision (init: fp32) */
  int act_bytes;                 /* bytes of a dt_act_t element: 4, or 2 when set_precision chose
                                    16-bit storage (store16) */
  int store16;                   /* CUDA: 16-bit storage asked for (system.store16 = auto), set after
                                    init and before set_precision; it takes it for bf16/fp16 with
                                    flash or cuDNN attention (the CPU: float storage, always) */
  float loss_scale;              /* backward differentiates loss * loss_scale (init: 1; fp16 loss
                                    scaling sets it before backward) */
  int B, T;                      /* capacity of a micro-batch */
  int threads;
  unsigned long param_gen;       /* parameter changes so far (adamw, copy_from_host): the model
                                    recomputes cached logits only while it is unchanged */
  void *impl;                    /* backend-private state */
  int device;                    /* CUDA: device ordinal, set by the caller before init (CPU: unused) */
  int tf32;                      /* CUDA: matmuls on TF32 tensor cores (system.tf32), set before init */
  int flash;                     /* CUDA: attention keeps only its rows' log-sum-exp (system.attention
                                    = flash: our fused kernels; cudnn: cuDNN's), set before init */
  int cudnn_att;                 /* CUDA: that attention by cuDNN (system.attention = cudnn; flash set
                                    too), set before init */
  int cudnn_conv;                /* CUDA: the classifiers' convolutions by cuDNN (system.conv = cudnn),
                                    set before init */
  int cudnn_bn;                  /* CUDA: their batch norm's training passes by cuDNN (system.batchnorm
                                    = cudnn; per-rank statistics only), set before init */
  int cudnn_pool;                /* CUDA: their max and global average pooling by cuDNN (system.pool =
                                    cudnn), set before init */
  int sparse;                    /* CUDA: DT_SPARSE_* arenas with memory only where in use (ZeRO-2/3,
                                    cuda/sparse.h), set before init */
  size_t opt_lo, opt_hi;         /* the arena range whose AdamW state this rank holds, set by the
                                    caller before init on a zeroed struct (ZeRO shards; 0, 0 = the
                                    whole arena; dt_backend_t be = {0} for plain use): m and v
                                    then hold opt_hi - opt_lo floats, m[i] for arena offset opt_lo + i,
                                    and copies of DT_BUF_M/V take offsets relative to opt_lo */
  void *stream;                  /* CUDA: the compute stream (cudaStream_t) the kernels run on;
                                    collectives on backend memory pass it; NULL for the CPU */
  void *comm_stream;             /* CUDA: cudaStream_t on which gradient communication for ranges
                                    passed to ready() is ordered after their backward; NULL for CPU */
};

extern const dt_backend_ops_t dt_backend_cpu;
/* Floats of the CPU attention's per-block state (the row log-sum-exp (B, NH, T)) and of its
 * scratch shared by the blocks (per thread, for nthr OpenMP threads), for NH local heads: what
 * its attention_floats kernel reports, and what `dtrain plan` (plan.c) counts. */
void dt_cpu_attention_floats(int B, int T, int NH, int nthr, size_t *state, size_t *scratch);
/* The same for the CUDA attention (backend.c, built without CUDA too: `dtrain plan` counts them
 * everywhere): the probabilities (B, NH, T, T) and their gradient, or with flash the row
 * log-sum-exp and the rows' <dout, out> (B, NH, T) each. */
void dt_cuda_attention_floats(int B, int T, int NH, int flash, size_t *state, size_t *scratch);
/* Whether the CUDA backend stores 16 bits when asked (be->store16) at this precision with this
 * attention (flash: our fused kernels or cuDNN's; the matmul attention multiplies fp32
 * probabilities): its set_precision's rule, and `dtrain plan`'s. */
int dt_cuda_store16_built(dt_precision_t p, int flash);
#ifdef DT_HAVE_CUDA
extern const dt_backend_ops_t dt_backend_cuda;
#endif
/* NULL-terminated registry. */
extern const dt_backend_ops_t *const dt_backends[];
const dt_backend_ops_t *dt_backend_find(const char *name);
/* The arena `buf` of a backend (host or device pointer), NULL for an unknown buffer. */
float *dt_backend_buf(dt_backend_t *be, dt_buf_t buf);
/* Floats in the optimizer range (opt_hi - opt_lo, or the whole arena), and in buffer `buf`. */
size_t dt_backend_opt_floats(const dt_backend_t *be);
size_t dt_backend_buf_floats(const dt_backend_t *be, dt_buf_t buf);
/* DT_ERR_ARG unless [off, off + count) lies inside a known arena (for copy_to/from_host). */
dt_status_t dt_backend_check_range(dt_backend_t *be, dt_buf_t buf, size_t off, size_t count);

#ifdef __cplusplus
}
#endif
#endif
