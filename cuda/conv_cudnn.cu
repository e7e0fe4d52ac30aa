/* cuDNN for the image classifiers (conv_cudnn.h): convolutions (system.conv = cudnn), batch
 * norm's training passes (system.batchnorm = cudnn) and pooling (system.pool = cudnn). The library is opened with
 * dlopen and its functions looked up by name into a table typed from cudnn.h's own declarations, so the build needs
 * only the header and a machine without cuDNN only loses these options. In the CUDA emulation the table points at
 * cuda/emu/cudnn.cpp's functions instead. Per convolution shape (batch, input, window, stride, padding) the descriptors
 * and the three algorithms are made once and cached: the first algorithm cuDNN's heuristics rank that succeeds, is
 * deterministic and needs at most WS_MAX bytes of workspace; per batch-norm shape its two descriptors, per pooling
 * shape its three. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cudnn.h>

#include "conv_cudnn.h"
#include "cuda_check.h"

#define WS_MAX ((size_t)512 << 20) /* workspace per algorithm at most */
#define CACHE 64 /* shapes remembered (ResNet-50 has 23 per batch size); past that the oldest go */

#define CUDNN_FUNCS(X)                                                                                                 \
  X(cudnnCreate)                                                                                                       \
  X(cudnnDestroy)                                                                                                      \
  X(cudnnSetStream) X(cudnnGetErrorString) X(cudnnGetVersion) X(cudnnCreateTensorDescriptor)                           \
      X(cudnnSetTensor4dDescriptor) X(cudnnDestroyTensorDescriptor) X(cudnnCreateFilterDescriptor)                     \
          X(cudnnSetFilter4dDescriptor) X(cudnnDestroyFilterDescriptor) X(cudnnCreateConvolutionDescriptor)            \
              X(cudnnSetConvolution2dDescriptor) X(cudnnSetConvolutionMathType) X(cudnnDestroyConvolutionDescriptor)   \
                  X(cudnnGetConvolutionForwardAlgorithm_v7) X(cudnnGetConvolutionBackwardDataAlgorithm_v7)             \
                      X(cudnnGetConvolutionBackwardFilterAlgorithm_v7) X(cudnnConvolutionForward)                      \
                          X(cudnnConvolutionBackwardData) X(cudnnConvolutionBackwardFilter)                            \
                              X(cudnnBatchNormalizationForwardTraining) X(cudnnBatchNormalizationBackward)             \
                                  X(cudnnCreatePoolingDescriptor) X(cudnnSetPooling2dDescriptor)                       \
                                      X(cudnnDestroyPoolingDescriptor) X(cudnnPoolingForward) X(cudnnPoolingBackward)

typedef struct {
#define FIELD(f) decltype(&::f) f;
  CUDNN_FUNCS(FIELD)
#undef FIELD
} fns_t;

typedef struct {
  int key[8]; /* B, C, H, W, OC, K, stride, pad */
  cudnnTensorDescriptor_t x, y;
  cudnnFilterDescriptor_t w;
  cudnnConvolutionDescriptor_t conv;
  cudnnConvolutionFwdAlgo_t fwd;
  cudnnConvolutionBwdDataAlgo_t bwd_data;
  cudnnConvolutionBwdFilterAlgo_t bwd_filter;
  size_t ws_fwd, ws_data, ws_filter;
} shape_t;

typedef struct {
  int key[3];                   /* B, C, HW */
  cudnnTensorDescriptor_t x, p; /* x (B, C, HW, 1): spatial statistics over B x HW; p (1, C, 1, 1) */
} bn_shape_t;

typedef struct {
  int key[9];                   /* B, C, H, W, KH, KW, stride, pad, avg */
  cudnnTensorDescriptor_t x, y; /* (B, C, H, W), (B, C, OH, OW) */
  cudnnPoolingDescriptor_t pool;
} pool_shape_t;

struct dt_cudnn {
  void *lib;
  fns_t f;
  cudnnHandle_t h;
  int tf32, n, next; /* shapes[0, n) in use; when all are, shapes[next] is reused next */
  shape_t shapes[CACHE];
  int n_bn, next_bn; /* the same for bn[] */
  bn_shape_t bn[CACHE];
  int n_pool, next_pool; /* and for pool[] */
  pool_shape_t pool[CACHE];
  void *ws;
  size_t ws_bytes;
  char version[32];
};

#define CUDNN_TRY(c, call)                                                                                   \
  do {                                                                                                       \
    cudnnStatus_t st_ = (call);                                                                              \
    if (st_ != CUDNN_STATUS_SUCCESS)                                                                         \
      return DT_ERR(DT_ERR_CUDA, "%s:%d: %s failed: %s", __FILE__, __LINE__, #call, (c)->f.cudnnGetErrorString(st_)); \
  } while (0)

#ifdef DT_CUDA_EMU_RUNTIME
/* The emulation's cuDNN (cuda/emu/cudnn.cpp), linked in: a handle that is not a library */
static void *load(fns_t *f, char *why, size_t n) {
  (void)why, (void)n;
#define LINK(fn) f->fn = &::fn;
  CUDNN_FUNCS(LINK)
#undef LINK
  return (void *)f;
}
static void unload(void *lib) { (void)lib; }
static const char *path_of(const fns_t *f) {
  (void)f;
  return "(the CUDA emulation's)";
}
#else
static void unload(void *lib) { dlclose(lib); }
static const char *path_of(const fns_t *f) {
  Dl_info info;
  return dladdr((const void *)f->cudnnGetVersion, &info) && info.dli_fname ? info.dli_fname : "";
}

/* dlopen cuDNN and look every function up; the library handle, or NULL with *why saying why */
static void *load(fns_t *f, char *why, size_t n) {
  void *lib = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    snprintf(why, n, "cannot load cuDNN (%s)", dlerror());
    return NULL;
  }
#define LOAD(fn)                                                                     \
  if (!(f->fn = (decltype(f->fn))dlsym(lib, #fn))) {                                 \
    snprintf(why, n, "libcudnn.so.9 has no %s", #fn);                                \
    dlclose(lib);                                                                    \
    return NULL;                                                                     \
  }
  CUDNN_FUNCS(LOAD)
#undef LOAD
  return lib;
}
#endif

static void version_of(const fns_t *f, char *out, size_t n) {
  size_t v = f->cudnnGetVersion();
  snprintf(out, n, "cuDNN %zu.%zu.%zu", v / 10000, v / 100 % 100, v % 100);
}

void dt_cudnn_print_version(FILE *out) {
  fns_t f;
  char why[512];
  void *lib = load(&f, why, sizeof why);
  if (!lib) {
    fprintf(out, "cudnn: %s: system.conv, system.batchnorm and system.pool = cudnn unavailable\n", why);
    return;
  }
  char v[32];
  version_of(&f, v, sizeof v);
  fprintf(out, "cudnn: %s %s (the %d functions system.conv, system.batchnorm and system.pool = cudnn use found)\n",
          v + 6, path_of(&f), (int)(sizeof f / sizeof(void *)));
  unload(lib);
}

dt_status_t dt_cudnn_open(dt_cudnn_t **out, cudaStream_t s, int tf32) {
  *out = NULL;
  dt_cudnn_t *c = (dt_cudnn_t *)calloc(1, sizeof *c);
  if (!c) return DT_ERR(DT_ERR_NOMEM, "cudnn: out of memory");
  char why[512];
  if (!(c->lib = load(&c->f, why, sizeof why))) {
    free(c);
    return DT_ERR(DT_ERR_UNSUPPORTED, "system.conv/batchnorm/pool = cudnn: %s; = own needs none", why);
  }
  c->tf32 = tf32;
  version_of(&c->f, c->version, sizeof c->version);
  cudnnStatus_t st = c->f.cudnnCreate(&c->h);
  if (st == CUDNN_STATUS_SUCCESS) st = c->f.cudnnSetStream(c->h, s);
  if (st != CUDNN_STATUS_SUCCESS) {
    dt_status_t e = DT_ERR(DT_ERR_CUDA, "system.conv/batchnorm/pool = cudnn: %s: cudnnCreate/SetStream: %s", c->version,
                           c->f.cudnnGetErrorString(st));
    dt_cudnn_close(c);
    return e;
  }
  *out = c;
  return DT_OK;
}

static void shape_free(dt_cudnn_t *c, shape_t *p) {
  if (p->x) c->f.cudnnDestroyTensorDescriptor(p->x);
  if (p->y) c->f.cudnnDestroyTensorDescriptor(p->y);
  if (p->w) c->f.cudnnDestroyFilterDescriptor(p->w);
  if (p->conv) c->f.cudnnDestroyConvolutionDescriptor(p->conv);
  memset(p, 0, sizeof *p);
}

static void bn_shape_free(dt_cudnn_t *c, bn_shape_t *p) {
  if (p->x) c->f.cudnnDestroyTensorDescriptor(p->x);
  if (p->p) c->f.cudnnDestroyTensorDescriptor(p->p);
  memset(p, 0, sizeof *p);
}

static void pool_shape_free(dt_cudnn_t *c, pool_shape_t *p) {
  if (p->x) c->f.cudnnDestroyTensorDescriptor(p->x);
  if (p->y) c->f.cudnnDestroyTensorDescriptor(p->y);
  if (p->pool) c->f.cudnnDestroyPoolingDescriptor(p->pool);
  memset(p, 0, sizeof *p);
}

void dt_cudnn_close(dt_cudnn_t *c) {
  if (!c) return;
  for (int i = 0; i < c->n; i++) shape_free(c, &c->shapes[i]);
  for (int i = 0; i < c->n_bn; i++)
    bn_shape_free(c, &c->bn[i]);
  for (int i = 0; i < c->n_pool; i++)
    pool_shape_free(c, &c->pool[i]);
  if (c->h) c->f.cudnnDestroy(c->h);
  cudaFree(c->ws);
  if (c->lib) unload(c->lib);
  free(c);
}

const char *dt_cudnn_version(const dt_cudnn_t *c) { return c->version; }

/* The first ranked algorithm (of n results) that succeeded, is deterministic and fits WS_MAX. */
template <typename Perf, typename Algo>
static dt_status_t pick(const Perf *perf, int n, Algo *algo, size_t *ws, const char *what) {
  for (int i = 0; i < n; i++)
    if (perf[i].status == CUDNN_STATUS_SUCCESS && perf[i].determinism == CUDNN_DETERMINISTIC && perf[i].memory <= WS_MAX) {
      *algo = perf[i].algo;
      *ws = perf[i].memory;
      return DT_OK;
    }
  return DT_ERR(DT_ERR_UNSUPPORTED, "cudnn: no deterministic %s algorithm within %zu MiB of workspace", what,
                WS_MAX >> 20);
}

static dt_status_t algorithms(dt_cudnn_t *c, shape_t *p) {
  enum { N = 16 };
  int n = 0;
  cudnnConvolutionFwdAlgoPerf_t fwd[N];
  CUDNN_TRY(c, c->f.cudnnGetConvolutionForwardAlgorithm_v7(c->h, p->x, p->w, p->conv, p->y, N, &n, fwd));
  DT_TRY(pick(fwd, n, &p->fwd, &p->ws_fwd, "forward"));
  cudnnConvolutionBwdDataAlgoPerf_t data[N];
  CUDNN_TRY(c, c->f.cudnnGetConvolutionBackwardDataAlgorithm_v7(c->h, p->w, p->y, p->conv, p->x, N, &n, data));
  DT_TRY(pick(data, n, &p->bwd_data, &p->ws_data, "backward data"));
  cudnnConvolutionBwdFilterAlgoPerf_t filt[N];
  CUDNN_TRY(c, c->f.cudnnGetConvolutionBackwardFilterAlgorithm_v7(c->h, p->x, p->y, p->conv, p->w, N, &n, filt));
  DT_TRY(pick(filt, n, &p->bwd_filter, &p->ws_filter, "backward filter"));
  return DT_OK;
}

/* The entry a cache of CACHE entries (*n in use) fills next: a free one, or once all are in use the
 * oldest (round robin from *next) */
static int cache_slot(int *n, int *next) {
  if (*n < CACHE) return (*n)++;
  const int i = *next;
  *next = (i + 1) % CACHE;
  return i;
}

/* The cached shape for these sizes, made on first use. */
static dt_status_t shape(dt_cudnn_t *c, const int key[8], shape_t **out) {
  for (int i = 0; i < c->n; i++)
    if (!memcmp(c->shapes[i].key, key, sizeof c->shapes[i].key)) {
      *out = &c->shapes[i];
      return DT_OK;
    }
  shape_t *p = &c->shapes[cache_slot(&c->n, &c->next)];
  shape_free(c, p); /* key all 0: matches nothing until the shape is complete */
  const int B = key[0], C = key[1], H = key[2], W = key[3], OC = key[4], K = key[5], st = key[6], pad = key[7];
  const int OH = (H + 2 * pad - K) / st + 1, OW = (W + 2 * pad - K) / st + 1;
  CUDNN_TRY(c, c->f.cudnnCreateTensorDescriptor(&p->x));
  CUDNN_TRY(c, c->f.cudnnCreateTensorDescriptor(&p->y));
  CUDNN_TRY(c, c->f.cudnnCreateFilterDescriptor(&p->w));
  CUDNN_TRY(c, c->f.cudnnCreateConvolutionDescriptor(&p->conv));
  CUDNN_TRY(c, c->f.cudnnSetTensor4dDescriptor(p->x, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, B, C, H, W));
  CUDNN_TRY(c, c->f.cudnnSetTensor4dDescriptor(p->y, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, B, OC, OH, OW));
  CUDNN_TRY(c, c->f.cudnnSetFilter4dDescriptor(p->w, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, OC, C, K, K));
  CUDNN_TRY(c, c->f.cudnnSetConvolution2dDescriptor(p->conv, pad, pad, st, st, 1, 1, CUDNN_CROSS_CORRELATION,
                                                    CUDNN_DATA_FLOAT));
  CUDNN_TRY(c, c->f.cudnnSetConvolutionMathType(p->conv, c->tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH));
  DT_TRY(algorithms(c, p));
  memcpy(p->key, key, sizeof p->key);
  *out = p;
  return DT_OK;
}

/* The workspace holds at least `bytes` (freed and allocated again when it grows: cudaFree waits for
 * the device, so nothing queued still uses the old one). */
static dt_status_t workspace(dt_cudnn_t *c, size_t bytes) {
  if (bytes <= c->ws_bytes) return DT_OK;
  DT_CUDA_CHECK(cudaFree(c->ws));
  c->ws = NULL;
  c->ws_bytes = 0;
  DT_CUDA_CHECK(cudaMalloc(&c->ws, bytes));
  c->ws_bytes = bytes;
  return DT_OK;
}

dt_status_t dt_cudnn_conv_forward(dt_cudnn_t *c, float *out, const float *inp, const float *w, int B, int C, int H,
                                  int W, int OC, int K, int stride, int pad) {
  const int key[8] = {B, C, H, W, OC, K, stride, pad};
  shape_t *p;
  DT_TRY(shape(c, key, &p));
  DT_TRY(workspace(c, p->ws_fwd));
  const float one = 1.0f, zero = 0.0f;
  CUDNN_TRY(c, c->f.cudnnConvolutionForward(c->h, &one, p->x, inp, p->w, w, p->conv, p->fwd, c->ws, p->ws_fwd, &zero,
                                            p->y, out));
  return DT_OK;
}

dt_status_t dt_cudnn_conv_backward(dt_cudnn_t *c, float *dinp, float *dw, const float *dout, const float *inp,
                                   const float *w, int B, int C, int H, int W, int OC, int K, int stride, int pad) {
  const int key[8] = {B, C, H, W, OC, K, stride, pad};
  shape_t *p;
  DT_TRY(shape(c, key, &p));
  DT_TRY(workspace(c, p->ws_filter > p->ws_data ? p->ws_filter : p->ws_data));
  const float one = 1.0f, zero = 0.0f;
  CUDNN_TRY(c, c->f.cudnnConvolutionBackwardFilter(c->h, &one, p->x, inp, p->y, dout, p->conv, p->bwd_filter, c->ws,
                                                   p->ws_filter, &one, p->w, dw));
  if (dinp)
    CUDNN_TRY(c, c->f.cudnnConvolutionBackwardData(c->h, &one, p->w, w, p->y, dout, p->conv, p->bwd_data, c->ws,
                                                   p->ws_data, &zero, p->x, dinp));
  return DT_OK;
}

/* The cached batch-norm descriptors for these sizes, made on first use. */
static dt_status_t bn_shape(dt_cudnn_t *c, int B, int C, int HW, bn_shape_t **out) {
  const int key[3] = {B, C, HW};
  for (int i = 0; i < c->n_bn; i++)
    if (!memcmp(c->bn[i].key, key, sizeof key)) {
      *out = &c->bn[i];
      return DT_OK;
    }
  bn_shape_t *p = &c->bn[cache_slot(&c->n_bn, &c->next_bn)];
  bn_shape_free(c, p);
  CUDNN_TRY(c, c->f.cudnnCreateTensorDescriptor(&p->x));
  CUDNN_TRY(c, c->f.cudnnCreateTensorDescriptor(&p->p));
  CUDNN_TRY(c, c->f.cudnnSetTensor4dDescriptor(p->x, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, B, C, HW, 1));
  CUDNN_TRY(c, c->f.cudnnSetTensor4dDescriptor(p->p, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, C, 1, 1));
  memcpy(p->key, key, sizeof key);
  *out = p;
  return DT_OK;
}

dt_status_t dt_cudnn_bn_forward(dt_cudnn_t *c, float *out, float *mean, float *rstd, float *running_mean,
                                float *running_var, const float *inp, const float *w, const float *b, double eps,
                                double momentum, int B, int C, int HW) {
  bn_shape_t *p;
  DT_TRY(bn_shape(c, B, C, HW, &p));
  const float one = 1.0f, zero = 0.0f;
  CUDNN_TRY(c, c->f.cudnnBatchNormalizationForwardTraining(c->h, CUDNN_BATCHNORM_SPATIAL, &one, &zero, p->x, inp, p->x,
                                                           out, p->p, w, b, momentum, running_mean, running_var, eps,
                                                           mean, rstd));
  return DT_OK;
}

dt_status_t dt_cudnn_bn_backward(dt_cudnn_t *c, float *dinp, float *dw, float *db, const float *dout, const float *inp,
                                 const float *w, const float *mean, const float *rstd, double eps, int B, int C,
                                 int HW) {
  bn_shape_t *p;
  DT_TRY(bn_shape(c, B, C, HW, &p));
  const float one = 1.0f, zero = 0.0f;
  CUDNN_TRY(c, c->f.cudnnBatchNormalizationBackward(c->h, CUDNN_BATCHNORM_SPATIAL, &one, &zero, &one, &one, p->x, inp,
                                                    p->x, dout, p->x, dinp, p->p, w, dw, db, eps, mean, rstd));
  return DT_OK;
}

/* The cached pooling descriptors for these sizes, made on first use. */
static dt_status_t pool_shape(dt_cudnn_t *c, const int key[9], pool_shape_t **out) {
  for (int i = 0; i < c->n_pool; i++)
    if (!memcmp(c->pool[i].key, key, sizeof c->pool[i].key)) {
      *out = &c->pool[i];
      return DT_OK;
    }
  pool_shape_t *p = &c->pool[cache_slot(&c->n_pool, &c->next_pool)];
  pool_shape_free(c, p);
  const int B = key[0], C = key[1], H = key[2], W = key[3], KH = key[4], KW = key[5], st = key[6], pad = key[7];
  const int OH = (H + 2 * pad - KH) / st + 1, OW = (W + 2 * pad - KW) / st + 1;
  const cudnnPoolingMode_t mode =
      key[8] ? CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING : CUDNN_POOLING_MAX_DETERMINISTIC;
  CUDNN_TRY(c, c->f.cudnnCreateTensorDescriptor(&p->x));
  CUDNN_TRY(c, c->f.cudnnCreateTensorDescriptor(&p->y));
  CUDNN_TRY(c, c->f.cudnnCreatePoolingDescriptor(&p->pool));
  CUDNN_TRY(c, c->f.cudnnSetTensor4dDescriptor(p->x, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, B, C, H, W));
  CUDNN_TRY(c, c->f.cudnnSetTensor4dDescriptor(p->y, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, B, C, OH, OW));
  CUDNN_TRY(c, c->f.cudnnSetPooling2dDescriptor(p->pool, mode, CUDNN_PROPAGATE_NAN, KH, KW, pad, pad, st, st));
  memcpy(p->key, key, sizeof p->key);
  *out = p;
  return DT_OK;
}

dt_status_t dt_cudnn_pool_forward(dt_cudnn_t *c, float *out, const float *inp, int B, int C, int H, int W, int KH,
                                  int KW, int stride, int pad, int avg) {
  const int key[9] = {B, C, H, W, KH, KW, stride, pad, avg};
  pool_shape_t *p;
  DT_TRY(pool_shape(c, key, &p));
  const float one = 1.0f, zero = 0.0f;
  CUDNN_TRY(c, c->f.cudnnPoolingForward(c->h, p->pool, &one, p->x, inp, &zero, p->y, out));
  return DT_OK;
}

dt_status_t dt_cudnn_pool_backward(dt_cudnn_t *c, float *dinp, const float *dout, const float *out, const float *inp,
                                   int B, int C, int H, int W, int KH, int KW, int stride, int pad, int avg) {
  const int key[9] = {B, C, H, W, KH, KW, stride, pad, avg};
  pool_shape_t *p;
  DT_TRY(pool_shape(c, key, &p));
  const float one = 1.0f, zero = 0.0f;
  CUDNN_TRY(c, c->f.cudnnPoolingBackward(c->h, p->pool, &one, p->y, out, p->y, dout, p->x, inp, &zero, p->x, dinp));
  return DT_OK;
}
