/* Internals of the GPT-2 model shared by its two files: gpt2.c (activations, training forward
 * and backward) and gpt2_decode.c (decoding with a key/value cache, which runs the same block
 * forward: the layer order exists once). Not for other callers. */
#ifndef DT_GPT2_INT_H
#define DT_GPT2_INT_H

#include "gpt2.h"
#include "profile.h"

/* One activation set (a micro-batch in flight). The (B, T, C) stage input sits in `encoded`.
 * lnf..lse exist on the last stage only (NULL elsewhere). dt_act_t: activation storage of
 * be->act_bytes per element (ACT below moves through it); float: statistics, float always. */
typedef struct {
  dt_act_t *encoded;                /* (B,T,C) */
  dt_act_t *ln1;                    /* (L,B,T,C) */
  float *ln1_mean, *ln1_rstd;       /* (L,B,T), (L,B,T) */
  dt_act_t *qkv;                    /* (L,B,T,3Cl) */
  dt_act_t *atty;                   /* (L,B,T,Cl) */
  float *att;                       /* (L, the backend's attention state) */
  dt_act_t *residual2;              /* (L,B,T,C) */
  dt_act_t *ln2;
  float *ln2_mean, *ln2_rstd;
  dt_act_t *fch, *fch_gelu;         /* (L,B,T,4Cl) */
  dt_act_t *residual3;              /* (L,B,T,C) */
  dt_act_t *lnf;                    /* (B,T,C) */
  float *lnf_mean, *lnf_rstd;       /* (B,T), (B,T) */
  dt_act_t *logits;                 /* (B,T,Vpl); backward turns them into dlogits in place */
  float *losses, *lse;              /* (B,T) */
  /* activation-gradient scratch, one layer's worth (written with '='), shared by the sets */
  dt_act_t *dres;                   /* (B,T,C) gradient of the residual stream */
  dt_act_t *dtmp;                   /* (B,T,C) */
  dt_act_t *dqkv;                   /* (B,T,3Cl) */
  dt_act_t *dfch;                   /* (B,T,4Cl) */
  float *attscr;                    /* the attention's shared scratch */
  float *xtmp;                      /* tp > 1 only: (B,T) doubles for the vocab-parallel cross-entropy */
  float *tpacc;                     /* tp > 1 with 16-bit storage: (B,T,C) fp32 partial sums, all-reduced */
  int *inputs, *targets;            /* (B,T) copies of this set's forward batch, backend memory */
  int *h_inputs;                    /* (B,T) host copy of the inputs */
  int B, T;                         /* of that forward */
  int have_fwd, have_targets;
  int logits_gone;                  /* backward overwrote logits with dlogits */
  unsigned long logits_gen;         /* be->param_gen at that forward */
} acts_t;

struct dt_gpt2_state {
  void *arena;
  int *ints, *h_ints;       /* inputs and targets of every set (backend memory), host inputs */
  double *loss;             /* backend memory: [0] the loss sum (dt_gpt2_loss_sum), [1] one forward's */
  acts_t *acts;             /* m->slots sets */
  int l0, l1, first, last;  /* pipeline stage: blocks [l0, l1), embeddings, ln_f + lm_head */
  size_t bt, btc, btcl;     /* capacity strides: B*T, B*T*C, B*T*Cl */
  size_t att;               /* attention state floats per block */
  size_t esz;               /* be->act_bytes at init: bytes of an activation element */
  int tp, Cl, NHl, Vpl, v0; /* tensor parallelism: degree, local C, heads, vocab rows, first vocab row */
};

/* Element i of activation storage p (s->esz bytes each). */
#define ACT(s, p, i) ((dt_act_t *)((char *)(p) + (size_t)(i) * (s)->esz))

/* One block's activations in a set: its own (stored per block) or, with recompute, the shared
 * one-block scratch; the block's output res3 is always its own (the next block's input). */
typedef struct {
  dt_act_t *ln1;
  float *ln1_mean, *ln1_rstd;
  dt_act_t *qkv, *atty;
  float *att;
  dt_act_t *res2, *ln2;
  float *ln2_mean, *ln2_rstd;
  dt_act_t *fch, *fchg, *res3;
} block_t;

/* One layer's key/value cache for decoding: k, v (B, Tmax, Cl) and the first new position
 * (gpt2_decode.c); NULL in training. */
typedef struct {
  dt_act_t *k, *v;
  int pos, Tmax;
} kv_layer_t;

/* A kernel call, timed by kind (profile.h), its failure returned. */
#define RUN(kind, call)           \
  do {                            \
    dt_status_t st_ = DT_OK;      \
    DT_PROF(kind, st_ = (call));  \
    DT_TRY(st_);                  \
  } while (0)
/* An activation or activation gradient just written: round it to the storage precision. */
#define STORE(x, n) DT_TRY(be->k->round(be, (x), (size_t)(n)))

/* The embedding of positions [pos, pos + T) (vocab-parallel with tp > 1). */
dt_status_t dt_gpt2__encoder_forward(dt_gpt2_t *m, dt_act_t *out, const int *inp, int B, int T, int pos);
/* Block j's views (stage index) in set a. */
block_t dt_gpt2__block_views(const dt_gpt2_t *m, const acts_t *a, size_t j);
/* Forward of block l from x into y; with kv, attention over the cache (decoding). */
dt_status_t dt_gpt2__block_forward(dt_gpt2_t *m, const block_t *y, const dt_act_t *x, int l, int B, int T,
                                   const kv_layer_t *kv);
/* n activations at src (backend memory, the model's storage) as floats into dst (host). */
dt_status_t dt_gpt2__act_to_host(dt_gpt2_t *m, float *dst, const dt_act_t *src, size_t n);
/* ln_f, the lm_head's logits and, if a has targets, the loss. */
dt_status_t dt_gpt2__head_forward(dt_gpt2_t *m, acts_t *a, const dt_act_t *x, int N, float *loss);

#endif
