/* GPT-2 model description: dimensions and the layout of the parameter arena.
 * Parameters live in one float arena carved into named tensors, block-major:
 *   wte (Vp, C), wpe (T, C),
 *   for each block l: ln_1.weight (C), ln_1.bias (C), attn.c_attn.weight (C, 3C), attn.c_attn.bias (3C),
 *                     attn.c_proj.weight (C, C), attn.c_proj.bias (C), ln_2.weight (C), ln_2.bias (C),
 *                     mlp.c_fc.weight (C, 4C), mlp.c_fc.bias (4C), mlp.c_proj.weight (4C, C), mlp.c_proj.bias (C)
 *   ln_f.weight (C), ln_f.bias (C).
 * The blocks' weights are stored (in, out) like Hugging Face's Conv1D: y = x W + b; wte (Vp, C)
 * is also the tied lm_head, used as logits = x wte^T. So every tensor has the layout of its
 * checkpoint dataset and checkpoints copy without transposing. Each tensor starts on a
 * DT_ALIGN-float boundary.
 * Gradients and AdamW moments use the same layout in their own arenas. Block-major order means
 * backward finalises gradients from the end of the arena downwards (ln_f, block L-1, ..., wte). */
#ifndef DT_MODEL_H
#define DT_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "status.h"

#define DT_ALIGN 16 /* floats (64 bytes) */

/* Per-block tensor indices (in arena order within a block). */
enum {
  DT_LN1W, DT_LN1B, DT_QKVW, DT_QKVB, DT_ATTPROJW, DT_ATTPROJB,
  DT_LN2W, DT_LN2B, DT_FCW, DT_FCB, DT_FCPROJW, DT_FCPROJB,
  DT_BLOCK_TENSORS
};

typedef struct {
  int L, NH, C, V, Vp, T; /* layers, heads, channels, vocab, padded vocab, max sequence length */
} dt_dims_t;

typedef struct {
  char name[48];   /* Hugging Face GPT2LMHeadModel name without the "transformer." prefix, e.g. "h.3.mlp.c_fc.weight" */
  size_t offset;   /* in floats, into the arena */
  int rows, cols;  /* shape as stored here: (rows, cols); 1-D tensors have rows = 1 */
  int ndim;        /* 1 or 2 as in the HF state_dict; 4 for convolution weights (model/cnn.h) */
  int kh, kw;      /* ndim = 4: the kernel's size; the file shape is (rows, cols / (kh * kw), kh, kw) */
  int decay;       /* 1 = weight decay applies (2-D weights incl. embeddings) */
  int layer;       /* block index, -1 for embeddings, L for ln_f */
  /* Tensor parallelism (dt_layout_init_tp): rows, cols above are the LOCAL shard's shape; the
   * global tensor is (grows, gcols). split says which of our storage dims is cut: the local
   * extent along it is nblk equal blocks, block b sitting at global index g0 + b*gstride (c_attn
   * and its bias: 3 blocks, its q, k and v parts, gstride = C; everything else 1 block).
   * DT_SPLIT_NONE = replicated (every tp rank holds the whole tensor). tp = 1: all replicated. */
  int grows, gcols;
  int split;       /* DT_SPLIT_NONE | DT_SPLIT_ROWS | DT_SPLIT_COLS */
  int nblk, g0, gstride;
  /* Pipeline parallelism (dt_layout_init_mp): absent = the tensor lives on another stage (rows =
   * cols = 0, no arena space; name and global shape kept); tied_copy = wte on the last stage when
   * that is not the first: the lm_head's copy of the tied embedding, equal to the first stage's
   * (gradients summed between the two), written to checkpoints and counted in norms once, there. */
  int absent, tied_copy;
} dt_tensor_t;

enum { DT_SPLIT_NONE = 0, DT_SPLIT_ROWS = 1, DT_SPLIT_COLS = 2 };

typedef struct {
  dt_dims_t d;
  int n_tensors;
  dt_tensor_t *tensors;    /* n_tensors entries, arena order */
  size_t n_params;         /* arena size in floats incl. alignment padding */
  size_t n_params_true;    /* parameters excluding padding and padded vocab rows */
  size_t *layer_begin;     /* L+2 entries: arena offset where group g begins; groups: 0 = embeddings,
                              1..L = blocks, L+1 = ln_f; layer_begin[L+2] = n_params (array has L+3) */
  int tp, tp_rank;         /* tensor-parallel degree and this rank's index (1, 0 = whole model) */
  int pp, pp_rank;         /* pipeline stages and this rank's stage (layouts built field by field: 0) */
  int l0, l1;              /* blocks [l0, l1) are on this stage (dt_layout_stage reads them) */
} dt_layout_t;

/* Points in forward/backward where a model calls its layer hook for group l (ZeRO-3 gathers the
 * group's parameters before it runs and frees them after): GPT-2 per block, the CNNs per tensor. */
typedef enum { DT_HOOK_FWD, DT_HOOK_FWD_DONE, DT_HOOK_BWD, DT_HOOK_BWD_DONE } dt_hook_phase_t;
typedef dt_status_t (*dt_layer_hook_fn)(void *ctx, int l, dt_hook_phase_t phase);

/* Called by a model's backward (GPT-2's, the CNNs') each time the gradients in arena range
 * [lo, hi) are final for this micro-batch (ranges arrive in decreasing order and tile the arena). */
typedef void (*dt_grad_ready_fn)(void *ctx, size_t lo, size_t hi);

dt_dims_t dt_dims_from_config(const dt_config_t *cfg);
dt_status_t dt_layout_init(dt_layout_t *lay, dt_dims_t d);
/* Megatron-style tensor-parallel shard of rank tp_rank of tp (tp = 1: same as dt_layout_init).
 * lay->d keeps the GLOBAL dims; the arena holds only this rank's shards (tensor order unchanged):
 *   wte (Vp, C): vocab rows [r*Vp/tp, (r+1)*Vp/tp)          (row split)
 *   attn.c_attn.weight (C, 3C) / .bias (3C): columns of this rank's heads in each of q, k, v
 *                                       (3 blocks of C/tp, gstride C)
 *   attn.c_proj.weight (C, C): input rows of this rank's heads (row split)
 *   mlp.c_fc.weight (C, 4C) / .bias: column block of 4C/tp   mlp.c_proj.weight (4C, C): row block
 *   wpe, ln_*, attn.c_proj.bias, mlp.c_proj.bias: replicated.
 * DT_ERR_CONFIG naming parallel.tp unless n_head % tp == 0 and Vp % tp == 0. n_params_true stays
 * the global count. */
dt_status_t dt_layout_init_tp(dt_layout_t *lay, dt_dims_t d, int tp, int tp_rank);
/* Pipeline stage pp_rank of pp of that tp shard: contiguous blocks balanced by parameter count or
 * by compute (dt_pp_split over dt_pp_weights), wte and wpe on the first stage, ln_f and a tied copy of
 * wte on the last. Tensors of other stages stay in the table, marked absent, so tensor indices,
 * dt_layout_block and the layer_begin groups keep their global meaning (absent groups are empty
 * ranges). DT_ERR_CONFIG naming parallel.pp unless 1 <= pp <= n_layer. pp = 1: dt_layout_init_tp. */
typedef enum { DT_PP_BALANCE_PARAMS = 0, DT_PP_BALANCE_COMPUTE = 1 } dt_pp_balance_t;
dt_status_t dt_layout_init_mp(dt_layout_t *lay, dt_dims_t d, int tp, int tp_rank, int pp, int pp_rank,
                              dt_pp_balance_t balance);
/* What dt_pp_split balances for `balance`: PARAMS = dt_layout_pp_groups (the embeddings, a block,
 * ln_f + the wte copy); COMPUTE = training FLOPs per token (forward + backward, as
 * dt_model_flops_per_token): a block 72 C^2 + 12 T C, the head's lm_head 6 C Vp, the embedding
 * lookup 0. */
dt_status_t dt_pp_weights(dt_dims_t d, int tp, dt_pp_balance_t balance, double *emb, double *blk, double *head);
/* parallel.pp_balance of a validated config. */
dt_pp_balance_t dt_pp_balance_of(const dt_config_t *cfg);
/* Parameter floats per tp rank (alignment included) of the groups pp balances: the embeddings
 * (wte + wpe), one block, ln_f, and wte alone (the last stage's head is ln_f + a copy of wte). */
dt_status_t dt_layout_pp_groups(dt_dims_t d, int tp, double *emb, double *blk, double *lnf, double *wte);
/* Blocks per stage: contiguous, each stage >= 1 block, minimising the largest stage's parameters
 * where stage 0 also carries emb and stage pp-1 head (same-size blocks); among the splits that
 * reach that minimum, the one with the fewest blocks on its busiest stage. blocks: pp entries
 * (pp <= DT_PP_SPLIT_MAX; n_layer is at most that). */
void dt_pp_split(int L, int pp, double emb, double blk, double head, int *blocks);
#define DT_PP_SPLIT_MAX 1024
/* This rank's blocks [*l0, *l1) (all of them for pp <= 1, incl. layouts built field by field),
 * and whether it holds the embeddings (first) and ln_f + lm_head (last). */
static inline void dt_layout_stage(const dt_layout_t *lay, int *l0, int *l1, int *first, int *last) {
  int pp = lay->pp > 1;
  *l0 = pp ? lay->l0 : 0;
  *l1 = pp ? lay->l1 : lay->d.L;
  *first = !pp || lay->pp_rank == 0;
  *last = !pp || lay->pp_rank == lay->pp - 1;
}
/* Local arena offset of global element (gr, gc) of tensor t, or -1 if this shard does not hold it. */
long dt_tensor_local_index(const dt_tensor_t *t, int gr, int gc);
/* 1 if the tensor is split over tp ranks (its gradient's squares are summed over tp). */
static inline int dt_tensor_sharded(const dt_tensor_t *t) { return t->split != DT_SPLIT_NONE; }
/* Global shape; layouts built field by field (tests) may leave grows/gcols 0: then the local one. */
static inline int dt_tensor_grows(const dt_tensor_t *t) { return t->grows > 0 ? t->grows : t->rows; }
static inline int dt_tensor_gcols(const dt_tensor_t *t) { return t->gcols > 0 ? t->gcols : t->cols; }
void dt_layout_free(dt_layout_t *lay);
/* Index of a tensor in the block (one of DT_LN1W...) of layer l. */
const dt_tensor_t *dt_layout_block(const dt_layout_t *lay, int l, int which);
const dt_tensor_t *dt_layout_find(const dt_layout_t *lay, const char *name);

/* GPT-2 initialisation into a host arena of lay->n_params floats (zeroed first); with tp > 1
 * this rank's shard of exactly the tp = 1 initialisation (same seed, same numbers):
 * weights N(0, 0.02), residual projections (attn.c_proj, mlp.c_proj) N(0, 0.02/sqrt(2L)),
 * biases 0, layernorm weight 1 bias 0, padded vocab rows 0. Deterministic in seed. */
void dt_model_init_params(const dt_layout_t *lay, float *params, uint64_t seed);
/* The same, writing only arena floats [lo, hi) (ZeRO-3: each rank makes its own shard; the
 * values equal the full initialisation's; tp > 1 always writes the whole shard). */
void dt_model_init_params_range(const dt_layout_t *lay, float *params, uint64_t seed, size_t lo, size_t hi);

/* FLOPs per optimizer step for `tokens` tokens (fwd+bwd): 6*tokens*(12*L*C^2 + C*Vp) + 12*L*T*C*tokens. */
double dt_model_flops_per_token(const dt_dims_t *d, int T);

/* Deterministic RNG used for init (and anything else seeded): splitmix64 / xoshiro-style. */
typedef struct { uint64_t s; } dt_rng_t;
void dt_rng_seed(dt_rng_t *r, uint64_t seed);
uint64_t dt_rng_next(dt_rng_t *r);
double dt_rng_uniform(dt_rng_t *r);   /* [0, 1) */
double dt_rng_normal(dt_rng_t *r);    /* N(0, 1), Box-Muller */

#endif
