/* Decoding with a key/value cache (gpt2.h): the training code's embedding, blocks and head run on
 * the new tokens only; each block's attention (the backend's attention_decode) appends their keys
 * and values to the layer's cache and attends over all cached positions. With tensor parallelism
 * each rank caches its own heads (C/tp channels) and the last row's logits are gathered. */
#include <stdlib.h>
#include <string.h>

#include "gpt2_int.h"

struct dt_gpt2_kv {
  dt_act_t *cache; /* (L, 2, Tmax, Cl): per block its keys then its values (activation storage) */
  dt_act_t *gather; /* tp > 1: (Vp) the last row's logits of every rank (activation storage) */
  int Tmax, pos;
};

int dt_gpt2_kv_pos(const dt_gpt2_kv_t *kv) { return kv->pos; }

void dt_gpt2_kv_free(dt_gpt2_t *m, dt_gpt2_kv_t *kv) {
  if (!kv) return;
  if (kv->cache) m->be->k->release(m->be, kv->cache);
  if (kv->gather) m->be->k->release(m->be, kv->gather);
  free(kv);
}

dt_status_t dt_gpt2_kv_init(dt_gpt2_t *m, int Tmax, dt_gpt2_kv_t **out) {
  dt_backend_t *be = m->be;
  const dt_layout_t *lay = be->lay;
  const dt_gpt2_state_t *s = m->st;
  *out = NULL;
  if (!s->first || !s->last)
    return DT_ERR(DT_ERR_UNSUPPORTED, "gpt2: decoding with pipeline parallelism (parallel.pp=%d): use pp = 1", lay->pp);
  if (Tmax < 1 || Tmax > lay->d.T)
    return DT_ERR(DT_ERR_ARG, "gpt2: a key/value cache of %d positions (model.seq_len is %d)", Tmax, lay->d.T);
  dt_gpt2_kv_t *kv = calloc(1, sizeof *kv);
  if (!kv) return DT_ERR(DT_ERR_NOMEM, "gpt2: out of memory");
  kv->Tmax = Tmax;
  const size_t n = (size_t)lay->d.L * 2 * Tmax * s->Cl;
  dt_status_t st = be->k->alloc(be, &kv->cache, n * s->esz);
  if (st == DT_OK && s->tp > 1) st = be->k->alloc(be, &kv->gather, (size_t)lay->d.Vp * s->esz);
  if (st == DT_OK && be->wparams != be->params) st = be->k->round_copy(be, be->wparams, be->params, lay->n_params);
  if (st != DT_OK) {
    dt_gpt2_kv_free(m, kv);
    return st;
  }
  *out = kv;
  return DT_OK;
}

dt_status_t dt_gpt2_decode(dt_gpt2_t *m, dt_gpt2_kv_t *kv, const int *tokens, int n) {
  dt_backend_t *be = m->be;
  const dt_layout_t *lay = be->lay;
  dt_gpt2_state_t *s = m->st;
  acts_t *a = &s->acts[0];
  const int C = lay->d.C, V = lay->d.V;
  if (n < 1 || (size_t)n > s->bt || kv->pos + n > kv->Tmax)
    return DT_ERR(DT_ERR_ARG, "gpt2: decoding %d tokens at position %d (cache of %d positions, %zu rows of activations)",
                  n, kv->pos, kv->Tmax, s->bt);
  for (int i = 0; i < n; i++)
    if (tokens[i] < 0 || tokens[i] >= V)
      return DT_ERR(DT_ERR_DATA, "gpt2: token %d at position %d is outside [0, %d)", tokens[i], kv->pos + i, V);
  if (s->tp > 1 && (!m->tp_comm || m->tp_comm->size != s->tp))
    return DT_ERR(DT_ERR_ARG, "gpt2: decoding a tensor-parallel shard needs tp_comm");
  memcpy(a->h_inputs, tokens, (size_t)n * sizeof(int));
  DT_TRY(be->k->upload(be, a->inputs, tokens, (size_t)n * sizeof(int)));
  a->B = 1;
  a->T = n;
  a->have_fwd = 1;
  a->have_targets = 0;
  RUN(DT_PROF_ENCODER, dt_gpt2__encoder_forward(m, a->encoded, a->inputs, 1, n, kv->pos));
  STORE(a->encoded, (size_t)n * C);
  const dt_act_t *x = a->encoded;
  for (int l = 0; l < lay->d.L; l++) {
    if (m->layer_hook) DT_TRY(m->layer_hook(m->hook_ctx, l, DT_HOOK_FWD));
    const block_t y = dt_gpt2__block_views(m, a, (size_t)l);
    dt_act_t *k = ACT(s, kv->cache, (size_t)l * 2 * kv->Tmax * s->Cl);
    const kv_layer_t kvl = {k, ACT(s, k, (size_t)kv->Tmax * s->Cl), kv->pos, kv->Tmax};
    DT_TRY(dt_gpt2__block_forward(m, &y, x, l, 1, n, &kvl));
    x = y.res3;
    if (m->layer_hook) DT_TRY(m->layer_hook(m->hook_ctx, l, DT_HOOK_FWD_DONE));
  }
  DT_TRY(dt_gpt2__head_forward(m, a, x, n, NULL));
  kv->pos += n;
  return DT_OK;
}

dt_status_t dt_gpt2_kv_logits(dt_gpt2_t *m, dt_gpt2_kv_t *kv, float *logits_host) {
  dt_backend_t *be = m->be;
  const dt_gpt2_state_t *s = m->st;
  const acts_t *a = &s->acts[0];
  if (!a->have_fwd || a->logits_gone) return DT_ERR(DT_ERR_ARG, "gpt2: no logits of a forward to read");
  const dt_act_t *row = ACT(s, a->logits, (size_t)(a->B * a->T - 1) * s->Vpl); /* (Vpl) */
  if (s->tp > 1) { /* gathered as they are stored: floats, or the bytes of 16-bit values */
    const int f = s->esz == sizeof(float);
    DT_TRY(m->tp_comm->ops->allgather(m->tp_comm, row, kv->gather, f ? (size_t)s->Vpl : (size_t)s->Vpl * s->esz,
                                      f ? DT_F32 : DT_U8, be->stream, NULL));
    row = kv->gather;
  }
  return dt_gpt2__act_to_host(m, logits_host, row, (size_t)be->lay->d.V);
}
