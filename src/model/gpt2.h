/* GPT-2 written once: the layer order of forward and backward over a backend's kernel table
 * (backend.h dt_kernels_t), with everything that belongs to the model rather than to a backend:
 * tensor parallelism's collectives (Megatron-LM, over tp_comm), the pipeline stage cut and its
 * activation sets (slots), activation recomputation, the bf16/fp16 rounding points (precision.h),
 * ZeRO-3's layer hooks, the gradient-ready groups for DDP, the in-place cross-entropy backward and
 * the carving of the activation arena (the attention's share sized by the backend). Every backend
 * trains through the same code; docs/architecture.md shows where it sits. */
#ifndef DT_GPT2_H
#define DT_GPT2_H

#include <stddef.h>

#include "backend.h"
#include "comm.h"
#include "model.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dt_gpt2_state dt_gpt2_state_t;

typedef struct {
  dt_backend_t *be;             /* memory + kernels (initialised before dt_gpt2_init) */
  int slots;                    /* activation sets (pipeline micro-batches in flight) */
  int recompute;                /* keep only each block's input; backward recomputes the block's
                                   activations (bitwise the same results, one more forward) */
  dt_comm_t *tp_comm;           /* tensor-parallel group on backend memory, set after init (NULL =
                                   no TP). With lay->tp > 1 (the layout is this rank's shard,
                                   dt_layout_init_tp) its size and rank must match lay->tp and
                                   lay->tp_rank (forward checks). Collectives pass be->stream. */
  dt_layer_hook_fn layer_hook;  /* set after init (NULL = none): called around every block's
                                   forward and backward; an error stops the pass */
  void *hook_ctx;
  dt_gpt2_state_t *st;          /* activations and the bookkeeping of each set (gpt2.c) */
} dt_gpt2_t;

/* Carve the activations of this rank's stage (be->lay: its blocks, the loss on the last stage)
 * for `slots` micro-batches of be->B x be->T in flight (slots < 1: 1), with or without
 * recomputation, in backend memory. */
dt_status_t dt_gpt2_init(dt_gpt2_t *m, dt_backend_t *be, int slots, int recompute);
void dt_gpt2_free(dt_gpt2_t *m);

/* Floats of the activation arena for a stage of nl blocks (with the final layernorm, lm_head and
 * loss if `last`) at tensor-parallel degree tp keeping `slots` micro-batches (one
 * activation-gradient scratch), with or without recomputation, when the backend's attention keeps
 * att_state floats per block and micro-batch and att_scratch floats shared
 * (dt_kernels_t.attention_floats): exactly what dt_gpt2_init allocates. Not counted: the (B, T)
 * int copies of each set's inputs and targets. */
size_t dt_gpt2_activation_floats(const dt_dims_t *d, int tp, int nl, int last, int slots, int B, int T, int recompute,
                                 size_t att_state, size_t att_scratch);
/* The same in bytes with activations of act_bytes each (be->act_bytes: 4, or 2 for 16-bit storage)
 * and the statistics and attention state in floats. */
size_t dt_gpt2_activation_bytes(const dt_dims_t *d, int tp, int nl, int last, int slots, int B, int T, int recompute,
                                size_t att_state, size_t att_scratch, int act_bytes);

/* One stage's forward of a micro-batch into activation set `slot` (0 <= slot < slots; a set stays
 * valid until its backward, so 1F1B keeps several micro-batches in flight). The first stage embeds
 * `inputs` (host int32 (B, T)); the others start from x_in (B, T, C) in backend memory, the
 * previous stage's y_out. The last stage computes the mean cross-entropy over B*T when targets
 * (host int32 (B, T)) are given: into *loss (host; the host waits for the forward), or, with loss
 * NULL, added to the model's loss sum in backend memory (dt_gpt2_loss_sum reads it: a training step
 * reads its micro-batches' losses once). The others write y_out (B, T, C) in backend memory for the
 * next stage (x_in, y_out: activation storage, be->act_bytes per element). B and T may be smaller
 * than the capacity. */
dt_status_t dt_gpt2_stage_forward(dt_gpt2_t *m, int slot, const int *inputs, const int *targets, const dt_act_t *x_in,
                                  int B, int T, float *loss, dt_act_t *y_out);
/* Backward of set `slot`: the last stage from the loss, the others from dy (B, T, C) = d loss /
 * d y_out (the next stage's dx). Gradients ACCUMULATE (+=) into be->grads, scaled so that the loss
 * is divided by `accum` (micro-steps per optimizer step) and multiplied by be->loss_scale; ready()
 * reports this stage's gradient groups as they become final (absent groups are empty ranges). All
 * but the first stage write dx (B, T, C) = d loss / d x_in for the previous stage. */
dt_status_t dt_gpt2_stage_backward(dt_gpt2_t *m, int slot, int accum, const dt_act_t *dy, dt_act_t *dx,
                                   dt_grad_ready_fn ready, void *ctx);
/* *sum_host = the sum of the mean losses of the forwards with targets and loss NULL since the last
 * call (0 on a stage without the loss), and the sum starts again from 0. */
dt_status_t dt_gpt2_loss_sum(dt_gpt2_t *m, double *sum_host);
/* The whole model (one pipeline stage): set 0. */
dt_status_t dt_gpt2_forward(dt_gpt2_t *m, const int *inputs, const int *targets, int B, int T, float *loss);
dt_status_t dt_gpt2_backward(dt_gpt2_t *m, int accum, dt_grad_ready_fn ready, void *ctx);
/* Logits of the last forward: (B, T, Vp) host copy, for tests (tp = pp = 1). After a backward
 * (which turned them into dlogits in place) they are recomputed, bitwise equal, as long as no
 * parameter changed. */
dt_status_t dt_gpt2_logits_to_host(dt_gpt2_t *m, float *dst);
/* Sums of squares of this rank's gradients for the global norm (float64): with tp = pp = 1 the
 * optimizer range's, all in *sharded; otherwise per tensor inside the optimizer range, without
 * pp's tied copy of wte (the first stage counts wte; the caller sums the stages), split into the
 * tensors sharded over tp (*sharded: the caller sums it over the tp group) and the replicated ones
 * (*replicated, equal on every tp rank: counted once). */
dt_status_t dt_gpt2_grad_sumsq(dt_gpt2_t *m, double *sharded, double *replicated);

/* ---- decoding with a key/value cache (gpt2_decode.c; `dtrain generate`) ----
 * One sequence (B = 1) on one pipeline stage (pp = 1), any tp. The cache holds every block's keys
 * and values of positions [0, pos) (Tmax <= model.seq_len positions, (L, 2, Tmax, C/tp) floats of
 * backend memory); a decode step runs the training code's embedding, blocks (the attention over
 * the cache) and head on the n new tokens only, so a prefix is never recomputed. Activations use
 * set 0 (n <= the model's B x T capacity). The parameters must not change while a cache is in use
 * (their bf16/fp16 working copy is made at dt_gpt2_kv_init). */
typedef struct dt_gpt2_kv dt_gpt2_kv_t;
dt_status_t dt_gpt2_kv_init(dt_gpt2_t *m, int Tmax, dt_gpt2_kv_t **out);
void dt_gpt2_kv_free(dt_gpt2_t *m, dt_gpt2_kv_t *kv);
/* Positions held so far (the next token's position). */
int dt_gpt2_kv_pos(const dt_gpt2_kv_t *kv);
/* Forward of tokens[0..n) (host) at positions [pos, pos + n): their keys and values join the
 * cache; the last one's logits are then read by dt_gpt2_kv_logits. */
dt_status_t dt_gpt2_decode(dt_gpt2_t *m, dt_gpt2_kv_t *kv, const int *tokens, int n);
/* The logits of the last row of set 0's latest forward (a decode step, or dt_gpt2_forward without
 * targets: the uncached reference): V floats on the host, gathered over tp. Collective over tp. */
dt_status_t dt_gpt2_kv_logits(dt_gpt2_t *m, dt_gpt2_kv_t *kv, float *logits_host);

#ifdef __cplusplus
}
#endif
#endif
