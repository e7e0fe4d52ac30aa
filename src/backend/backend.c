/* Backend-independent pieces of the backend interface (backend.h): the registry and the arena
 * lookups every backend's copy functions share. */
#include "dt_build.h" /* DT_HAVE_CUDA (before backend.h, which declares dt_backend_cuda under it) */
#include "backend.h"

#include <string.h>

/* Preferred first: "auto" picks dt_backends[0]. */
const dt_backend_ops_t *const dt_backends[] = {
#ifdef DT_HAVE_CUDA
    &dt_backend_cuda,
#endif
    &dt_backend_cpu,
    NULL,
};

const dt_backend_ops_t *dt_backend_find(const char *name) {
  if (!name || strcmp(name, "auto") == 0) return dt_backends[0];
  for (int i = 0; dt_backends[i]; i++)
    if (strcmp(dt_backends[i]->name, name) == 0) return dt_backends[i];
  return NULL;
}

void dt_cuda_attention_floats(int B, int T, int NH, int flash, size_t *state, size_t *scratch) {
  *state = *scratch = (size_t)B * NH * T * (flash ? 1 : T);
}

float *dt_backend_buf(dt_backend_t *be, dt_buf_t buf) {
  switch (buf) {
    case DT_BUF_PARAMS: return be->params;
    case DT_BUF_GRADS: return be->grads;
    case DT_BUF_M: return be->m;
    case DT_BUF_V: return be->v;
  }
  return NULL;
}

size_t dt_backend_buf_floats(const dt_backend_t *be, dt_buf_t buf) {
  return (buf == DT_BUF_M || buf == DT_BUF_V) ? dt_backend_opt_floats(be) : be->lay->n_params;
}

size_t dt_backend_opt_floats(const dt_backend_t *be) {
  return be->opt_hi > be->opt_lo ? be->opt_hi - be->opt_lo : be->lay->n_params;
}

dt_status_t dt_backend_check_range(dt_backend_t *be, dt_buf_t buf, size_t off, size_t count) {
  if (!dt_backend_buf(be, buf)) return DT_ERR(DT_ERR_ARG, "%s backend: unknown buffer %d", be->ops->name, (int)buf);
  size_t n = dt_backend_buf_floats(be, buf);
  if (off > n || count > n - off)
    return DT_ERR(DT_ERR_ARG, "%s backend: copy of %zu floats at %zu exceeds the buffer of %zu", be->ops->name, count,
                  off, n);
  return DT_OK;
}

int dt_cuda_store16_built(dt_precision_t p, int flash) { return p != DT_PREC_FP32 && flash; }
