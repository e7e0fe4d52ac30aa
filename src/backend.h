/* Compute backend interface. The training loop sees only this vtable; the CPU backend is always
 * built, the CUDA backend when configured. A backend owns four arenas laid out by dt_layout_t:
 * params, grads, AdamW m and v, plus its activations for a fixed (B, T). Pointers in the struct
 * are host pointers for the CPU backend and device pointers for CUDA; use copy_* to move data. */
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

/* Called by backward each time the gradients in arena range [lo, hi) are final for this
 * micro-batch (ranges arrive in decreasing order and tile the arena). */
typedef void (*dt_grad_ready_fn)(void *ctx, size_t lo, size_t hi);

typedef enum { DT_BUF_PARAMS, DT_BUF_GRADS, DT_BUF_M, DT_BUF_V } dt_buf_t;

/* Points in forward/backward where a layer hook is called for block l (ZeRO-3 gathers a block's
 * parameters before it runs and frees them after). */
typedef enum { DT_HOOK_FWD, DT_HOOK_FWD_DONE, DT_HOOK_BWD, DT_HOOK_BWD_DONE } dt_hook_phase_t;
typedef dt_status_t (*dt_layer_hook_fn)(void *ctx, int l, dt_hook_phase_t phase);

typedef struct {
  float lr;           /* this step's learning rate */
  float beta1, beta2, eps, weight_decay;
  float grad_scale;   /* multiply gradients by this first (clipping factor; 1 = none) */
  int t;              /* 1-based step count for bias correction */
} dt_adamw_args_t;

typedef struct {
  const char *name;
  /* Allocate arenas and activations for micro-batches of B x T. */
  dt_status_t (*init)(dt_backend_t *be, const dt_layout_t *lay, int B, int T, int threads);
  void (*free)(dt_backend_t *be);
  /* Forward pass; with targets != NULL compute the mean cross-entropy loss over B*T into *loss.
   * inputs, targets: host int32 (B, T). B and T may be smaller than at init. */
  dt_status_t (*forward)(dt_backend_t *be, const int *inputs, const int *targets, int B, int T, float *loss);
  /* Backward pass of the last forward; gradients ACCUMULATE (+=) into the grads arena, scaled so
   * that the loss is divided by `accum` (micro-steps per optimizer step) and multiplied by
   * be->loss_scale. */
  dt_status_t (*backward)(dt_backend_t *be, int accum, dt_grad_ready_fn ready, void *ctx);
  dt_status_t (*zero_grad)(dt_backend_t *be);
  /* Sum of squares of the gradients in the optimizer range [opt_lo, opt_hi) (float64 accumulation). */
  dt_status_t (*grad_sumsq)(dt_backend_t *be, double *out);
  /* One AdamW step over the optimizer range [opt_lo, opt_hi) of the arena (the whole arena
   * unless ZeRO set a range; decay only on tensors with decay=1). */
  dt_status_t (*adamw)(dt_backend_t *be, const dt_adamw_args_t *a);
  /* Copy `count` floats at arena offset `off` between a buffer and host memory. */
  dt_status_t (*copy_to_host)(dt_backend_t *be, dt_buf_t buf, size_t off, size_t count, float *dst);
  dt_status_t (*copy_from_host)(dt_backend_t *be, dt_buf_t buf, size_t off, size_t count, const float *src);
  /* Logits of the last forward: (B, T, Vp) host copy, for tests. May be NULL if unsupported. */
  dt_status_t (*logits_to_host)(dt_backend_t *be, float *dst);
  /* Storage precision of the working parameters, activations and activation gradients
   * (precision.h); init leaves fp32. Call after init, before forward: allocates the working copy
   * be->wparams for bf16/fp16. */
  dt_status_t (*set_precision)(dt_backend_t *be, dt_precision_t p);
  /* Pipeline parallelism (a layout from dt_layout_init_mp; NULL = not supported, CUDA). One
   * stage's forward of a micro-batch into activation set `slot` (0 <= slot < be->slots; a set
   * stays valid until its backward, so 1F1B keeps several micro-batches in flight). The first stage
   * embeds `inputs` (host int32 (B, T)); the others start from x_in (B, T, C), the previous
   * stage's y_out. The last stage computes the loss (with targets); the others write y_out (B, T,
   * C) for the next stage. forward/backward above are the whole model's (pp = 1, slot 0). */
  dt_status_t (*stage_forward)(dt_backend_t *be, int slot, const int *inputs, const int *targets, const float *x_in,
                               int B, int T, float *loss, float *y_out);
  /* Backward of set `slot`: the last stage from the loss, the others from dy (B, T, C) = d loss /
   * d y_out (the next stage's dx). Gradients accumulate as in backward; ready() reports this
   * stage's groups (absent groups are empty ranges). All but the first stage write dx (B, T, C) =
   * d loss / d x_in for the previous stage. */
  dt_status_t (*stage_backward)(dt_backend_t *be, int slot, int accum, const float *dy, float *dx,
                                dt_grad_ready_fn ready, void *ctx);
  /* Block until everything queued on the backend (its compute and communication streams) has
   * finished: host timers around device work and host code that hands device memory to another
   * library (a communicator) call it. Nothing to wait for on the CPU. */
  dt_status_t (*synchronize)(dt_backend_t *be);
} dt_backend_ops_t;

struct dt_backend {
  const dt_backend_ops_t *ops;
  const dt_layout_t *lay;
  float *params, *grads, *m, *v; /* arenas of lay->n_params floats (host or device); params is the
                                    fp32 master that AdamW updates and checkpoints hold */
  float *wparams;                /* the parameters forward/backward read: == params in fp32, else a
                                    copy rounded to `precision` at the start of every forward */
  int precision;                 /* dt_precision_t, set by set_precision (init: fp32) */
  float loss_scale;              /* backward differentiates loss * loss_scale (init: 1; fp16 loss
                                    scaling sets it before backward) */
  int B, T;                      /* activation capacity */
  int slots;                     /* activation sets (pipeline micro-batches in flight), set by the
                                    caller before init on a zeroed struct (0 = 1; stage_forward) */
  int recompute;                 /* CPU, set before init: keep only each block's input and
                                    recompute the block's activations in backward (bitwise the same
                                    results, one more forward of compute, far less memory) */
  int threads;
  void *impl;                    /* backend-private state */
  int device;                    /* CUDA: device ordinal, set by the caller before init (CPU: unused) */
  dt_layer_hook_fn layer_hook;   /* set after init (CPU backend; NULL = none): called around every
                                    block's forward and backward; an error stops the pass */
  void *hook_ctx;
  size_t opt_lo, opt_hi;         /* the arena range whose AdamW state this rank holds, set by the
                                    caller before init on a zeroed struct (ZeRO shards; 0, 0 = the
                                    whole arena; dt_backend_t be = {0} for plain use): m and v
                                    then hold opt_hi - opt_lo floats, m[i] for arena offset opt_lo + i,
                                    and copies of DT_BUF_M/V take offsets relative to opt_lo */
  void *comm_stream;             /* CUDA: cudaStream_t on which gradient communication for ranges
                                    passed to ready() is ordered after their backward; NULL for CPU */
  dt_comm_t *tp_comm;            /* tensor-parallel group, set by the caller AFTER init (init
                                    zeroes the struct): NULL = no TP. With lay->tp > 1 (the layout
                                    is this rank's shard, dt_layout_init_tp) its size and rank must
                                    match lay->tp and lay->tp_rank (forward checks). CPU only:
                                    forward/backward all-reduce over it (Megatron-LM scheme, see
                                    backend_cpu.c), grad_sumsq returns the GLOBAL model's sum of
                                    squares (sharded tensors summed over tp, replicated ones once),
                                    logits_to_host is unsupported. The CUDA backend rejects tp > 1. */
};

extern const dt_backend_ops_t dt_backend_cpu;
/* Floats of the CPU backend's activation arena for capacity (B, T) with nthr OpenMP threads (the
 * attention scratch is per thread): exactly what cpu init allocates, and what `dtrain plan`
 * (plan.c) reports, so the two cannot drift. Not counted: the (B, T) int copies of inputs and
 * targets. */
size_t dt_cpu_activation_floats(const dt_dims_t *d, int B, int T, int nthr);
/* The same for one rank of tensor parallelism tp (local heads, hidden and vocab widths). */
size_t dt_cpu_activation_floats_tp(const dt_dims_t *d, int tp, int B, int T, int nthr);
/* The same for a pipeline stage of nl blocks (with the final layernorm, lm_head and loss if
 * `last`) keeping `slots` micro-batches of activations (one activation-gradient scratch), with
 * activation recomputation (be->recompute) or without. */
size_t dt_cpu_activation_floats_stage(const dt_dims_t *d, int tp, int nl, int last, int slots, int B, int T, int nthr,
                                      int recompute);
#ifdef DT_HAVE_CUDA
extern const dt_backend_ops_t dt_backend_cuda;
/* Floats of the CUDA backend's activation arena for capacity (B, T) (keeps (B, NH, T, T)
 * attention probabilities and their gradient); plan.c's dt_plan_gpu_activation_floats mirrors it. */
size_t dt_cuda_activation_floats(const dt_dims_t *d, int B, int T);
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
