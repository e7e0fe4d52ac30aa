/* system.attention = cudnn: cuDNN's fused causal attention over 16-bit copies of q, k, v
 * (attention_cudnn.h). Host code only (the copies are convert16.cu's), compiled by the C++
 * compiler: the one file of cuda/ that needs more than C. cuDNN's frontend builds
 * each operation graph (forward: q k^T, scale, causal mask, softmax with its statistics, times v;
 * backward: the same with dq, dk, dv), checks that an engine supports it, and runs it. Exceptions
 * stop at this file's functions, which return dt_status_t like the rest of the backend.
 * Tensors in cuDNN's (batch, heads, sequence, head size) order, with strides into our row-major
 * (B, T, 3C) qkv and (B, T, C) out, so nothing is permuted: only converted to 16 bits and back. */
#include "dt_build.h"

#include "attention_cudnn.h"

#include <dlfcn.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "convert16.h"
#include "cuda_check.h"

/* The real thing needs the frontend's headers and real CUDA; the CUDA emulation (cuda/emu: its
 * cuda_runtime.h defines DT_CUDA_EMU_RUNTIME) builds the refusals below */
#if defined(DT_HAVE_CUDNN_FRONTEND) && !defined(DT_CUDA_EMU_RUNTIME)

#include <exception>
#include <memory>
#include <unordered_map>
#include <vector>

#define NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING
#include <cudnn_frontend.h>

namespace fe = cudnn_frontend;
namespace cudnn_frontend {
void *cudnn_dlhandle = nullptr; /* the frontend looks cuDNN's functions up in this library */
}

#define GRAPHS 8 /* shapes remembered (forward and backward count apart); past that the oldest go */

enum { UID_Q = 1, UID_K, UID_V, UID_O, UID_STATS, UID_DO, UID_DQ, UID_DK, UID_DV };

typedef struct {
  int key[5]; /* backward?, B, T, NH, head size; key[1] == 0: empty */
  std::shared_ptr<fe::graph::Graph> g;
  int64_t ws; /* its workspace bytes */
} graph_t;

struct dt_cudnn_att {
  cudnnHandle_t h;
  cudaStream_t s;
  int fp16, n, next, nondet; /* graphs[0, n) built; nondet: backward without the deterministic engine */
  graph_t graphs[GRAPHS];
  void *ws, *buf;           /* workspace; the 16-bit copies: qkv, out, dout, dqkv */
  size_t ws_bytes, buf_bytes;
  char name[96];
};

#define FE_TRY(call)                                                                                       \
  do {                                                                                                     \
    fe::error_t e_ = (call);                                                                               \
    if (!e_.is_good()) return DT_ERR(DT_ERR_CUDA, "cudnn attention: %s: %s", #call, e_.get_message().c_str()); \
  } while (0)

static dt_status_t to16(dt_cudnn_att_t *a, void *dst, const float *src, size_t n) {
  return dt_cu_to16(dst, src, n, a->fp16, a->s);
}
static dt_status_t from16(dt_cudnn_att_t *a, float *dst, const void *src, size_t n) {
  return dt_cu_from16(dst, src, n, a->fp16, a->s);
}

/* Device memory of at least `bytes` in *p (grown, never shrunk; the stream drained first). */
static dt_status_t grow(dt_cudnn_att_t *a, void **p, size_t *have, size_t bytes) {
  if (bytes <= *have && *p) return DT_OK;
  DT_CUDA_CHECK(cudaStreamSynchronize(a->s));
  if (*p) DT_CUDA_CHECK(cudaFree(*p));
  *p = NULL;
  *have = 0;
  DT_CUDA_CHECK(cudaMalloc(p, bytes ? bytes : 1));
  *have = bytes;
  return DT_OK;
}

/* ---- the graphs ---------------------------------------------------------------------------- */

/* Forward (bwd 0) or backward graph for (B, T, NH, hs), validated by the frontend; det:
 * deterministic backward; sm > 0: for that compute capability (no device needed), else the
 * current device's. */
static dt_status_t make_graph(std::shared_ptr<fe::graph::Graph> &out, int fp16, int sm, int bwd, int B, int T, int NH,
                              int hs, int det) {
  auto g = std::make_shared<fe::graph::Graph>();
  if (sm > 0) g->set_sm_version(sm); /* before the nodes: each copies the graph's context */
  g->set_io_data_type(fp16 ? fe::DataType_t::HALF : fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  const int64_t C = (int64_t)NH * hs, C3 = 3 * C;
  const std::vector<int64_t> dim = {B, NH, T, hs}, s3 = {T * C3, hs, C3, 1}, s1 = {T * C, hs, C, 1};
  const std::vector<int64_t> sdim = {B, NH, T, 1}, sst = {(int64_t)NH * T, T, 1, 1};
  auto tensor = [&](const char *name, int64_t uid, const std::vector<int64_t> &stride) {
    return g->tensor(fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(dim).set_stride(stride));
  };
  auto Q = tensor("Q", UID_Q, s3), K = tensor("K", UID_K, s3), V = tensor("V", UID_V, s3);
  const float scale = 1.0f / sqrtf((float)hs);
  if (!bwd) {
    auto opt = fe::graph::SDPA_attributes()
                   .set_name("dtrain_attention")
                   .set_generate_stats(true)
                   .set_attn_scale(scale)
                   .set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
                   .set_diagonal_band_right_bound(0);
    auto outs = g->sdpa(Q, K, V, opt);
    outs[0]->set_output(true).set_dim(dim).set_stride(s1).set_uid(UID_O);
    outs[1]->set_output(true).set_data_type(fe::DataType_t::FLOAT).set_dim(sdim).set_stride(sst).set_uid(UID_STATS);
  } else {
    auto O = tensor("O", UID_O, s1), dO = tensor("dO", UID_DO, s1);
    auto S = g->tensor(fe::graph::Tensor_attributes()
                           .set_name("Stats")
                           .set_uid(UID_STATS)
                           .set_dim(sdim)
                           .set_stride(sst)
                           .set_data_type(fe::DataType_t::FLOAT));
    auto opt = fe::graph::SDPA_backward_attributes()
                   .set_name("dtrain_attention_backward")
                   .set_attn_scale(scale)
                   .set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
                   .set_diagonal_band_right_bound(0)
                   .set_deterministic_algorithm(det != 0);
    auto d = g->sdpa_backward(Q, K, V, O, dO, S, opt);
    d[0]->set_output(true).set_dim(dim).set_stride(s3).set_uid(UID_DQ);
    d[1]->set_output(true).set_dim(dim).set_stride(s3).set_uid(UID_DK);
    d[2]->set_output(true).set_dim(dim).set_stride(s3).set_uid(UID_DV);
  }
  FE_TRY(g->validate());
  out = g;
  return DT_OK;
}

static dt_status_t build(dt_cudnn_att_t *a, graph_t *gt, int bwd, int B, int T, int NH, int hs, int det) {
  std::shared_ptr<fe::graph::Graph> g;
  DT_TRY(make_graph(g, a->fp16, 0, bwd, B, T, NH, hs, det));
  FE_TRY(g->build_operation_graph(a->h));
  FE_TRY(g->create_execution_plans({fe::HeurMode_t::A}));
  FE_TRY(g->check_support(a->h));
  FE_TRY(g->build_plans(a->h));
  int64_t ws = 0;
  FE_TRY(g->get_workspace_size(ws));
  gt->g = g;
  gt->ws = ws;
  return DT_OK;
}

/* The cached graph for the key, built on first use. The backward asks for cuDNN's deterministic
 * algorithm (the same result on every run, as the rest of dtrain); where no engine has one, it
 * takes the other and says so once. */
static dt_status_t graph_for(dt_cudnn_att_t *a, graph_t **out, int bwd, int B, int T, int NH, int hs) {
  const int key[5] = {bwd, B, T, NH, hs};
  for (int i = 0; i < a->n; i++)
    if (!memcmp(a->graphs[i].key, key, sizeof key)) {
      *out = &a->graphs[i];
      return DT_OK;
    }
  graph_t *gt = &a->graphs[a->n < GRAPHS ? a->n++ : a->next];
  if (a->n == GRAPHS) a->next = (int)(gt - a->graphs + 1) % GRAPHS;
  gt->g.reset();
  memset(gt->key, 0, sizeof gt->key);
  dt_status_t st;
  try {
    st = build(a, gt, bwd, B, T, NH, hs, 1);
    if (st != DT_OK && bwd) {
      char first[400];
      snprintf(first, sizeof first, "%s", dt_err_msg());
      dt_err_clear();
      st = build(a, gt, bwd, B, T, NH, hs, 0);
      if (st == DT_OK && !a->nondet++)
        fprintf(stderr, "# cudnn attention: no deterministic backward here (%s); using cuDNN's other one\n", first);
    }
  } catch (const std::exception &e) {
    st = DT_ERR(DT_ERR_CUDA, "cudnn attention: building the graph: %s", e.what());
  }
  if (st != DT_OK) return st;
  memcpy(gt->key, key, sizeof key);
  DT_TRY(grow(a, &a->ws, &a->ws_bytes, (size_t)gt->ws));
  *out = gt;
  return DT_OK;
}

static dt_status_t run(dt_cudnn_att_t *a, graph_t *gt, std::unordered_map<int64_t, void *> &pack) {
  try {
    FE_TRY(gt->g->execute(a->h, pack, a->ws));
  } catch (const std::exception &e) {
    return DT_ERR(DT_ERR_CUDA, "cudnn attention: %s", e.what());
  }
  return DT_OK;
}

/* ---- the interface --------------------------------------------------------------------------- */

static dt_status_t load(void) {
  if (!fe::cudnn_dlhandle && !(fe::cudnn_dlhandle = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_LOCAL)))
    return DT_ERR(DT_ERR_UNSUPPORTED, "system.attention = cudnn: cannot load cuDNN (%s)", dlerror());
  return DT_OK;
}

dt_status_t dt_cudnn_att_validate(int sm, int fp16, int bwd, int B, int T, int NH, int hs) {
  DT_TRY(load());
  std::shared_ptr<fe::graph::Graph> g;
  try {
    return make_graph(g, fp16, sm, bwd, B, T, NH, hs, 1);
  } catch (const std::exception &e) {
    return DT_ERR(DT_ERR_CUDA, "cudnn attention: %s", e.what());
  }
}

dt_status_t dt_cudnn_att_open(dt_cudnn_att_t **out, cudaStream_t s, int fp16) {
  *out = NULL;
  DT_TRY(load());
  dt_cudnn_att_t *a = new (std::nothrow) dt_cudnn_att_t();
  if (!a) return DT_ERR(DT_ERR_NOMEM, "cudnn attention: out of memory");
  a->s = s;
  a->fp16 = fp16;
  size_t v = 0;
  try {
    v = fe::detail::get_backend_version();
    if (fe::detail::create_handle(&a->h) != CUDNN_STATUS_SUCCESS || fe::detail::set_stream(a->h, s) != CUDNN_STATUS_SUCCESS) {
      delete a;
      return DT_ERR(DT_ERR_CUDA, "system.attention = cudnn: cuDNN %zu could not make a handle on this device", v);
    }
  } catch (const std::exception &e) {
    delete a;
    return DT_ERR(DT_ERR_UNSUPPORTED, "system.attention = cudnn: %s", e.what());
  }
  snprintf(a->name, sizeof a->name, "cuDNN %zu.%zu.%zu fused attention (%s)", v / 10000, v / 100 % 100, v % 100,
           fp16 ? "fp16" : "bf16");
  *out = a;
  return DT_OK;
}

void dt_cudnn_att_close(dt_cudnn_att_t *a) {
  if (!a) return;
  if (a->ws) cudaFree(a->ws);
  if (a->buf) cudaFree(a->buf);
  try {
    if (a->h) fe::detail::destroy_handle(a->h);
  } catch (const std::exception &) {
  }
  delete a;
}

const char *dt_cudnn_att_name(const dt_cudnn_att_t *a) { return a ? a->name : "cuDNN fused attention"; }

/* The 16-bit copies' space for a (B, T, C) batch: qkv (3), out (1), dout (1), dqkv (3). */
static dt_status_t copies(dt_cudnn_att_t *a, int B, int T, int C, char **qkv, char **o, char **dout, char **dqkv) {
  const size_t btc = (size_t)B * T * C, bytes = 8 * btc * 2;
  DT_TRY(grow(a, &a->buf, &a->buf_bytes, bytes));
  *qkv = (char *)a->buf, *o = *qkv + 3 * btc * 2, *dout = *o + btc * 2, *dqkv = *dout + btc * 2;
  return DT_OK;
}

dt_status_t dt_cudnn_att_forward(dt_cudnn_att_t *a, void *out, float *lse, const void *qkv, int in16, int B, int T,
                                 int C, int NH) {
  char *q16, *o16, *do16, *dq16;
  graph_t *gt;
  DT_TRY(graph_for(a, &gt, 0, B, T, NH, C / NH));
  const size_t btc = (size_t)B * T * C;
  if (in16) { /* the model's own 16-bit buffers: no copies */
    q16 = (char *)qkv, o16 = (char *)out;
  } else {
    DT_TRY(copies(a, B, T, C, &q16, &o16, &do16, &dq16));
    DT_TRY(to16(a, q16, (const float *)qkv, 3 * btc));
  }
  std::unordered_map<int64_t, void *> pack = {{UID_Q, q16}, {UID_K, q16 + 2 * (size_t)C}, {UID_V, q16 + 4 * (size_t)C},
                                              {UID_O, o16}, {UID_STATS, lse}};
  DT_TRY(run(a, gt, pack));
  return in16 ? DT_OK : from16(a, (float *)out, o16, btc);
}

dt_status_t dt_cudnn_att_backward(dt_cudnn_att_t *a, void *dqkv, const void *dout, const void *out, const void *qkv,
                                  const float *lse, int in16, int B, int T, int C, int NH) {
  char *q16, *o16, *do16, *dq16;
  graph_t *gt;
  DT_TRY(graph_for(a, &gt, 1, B, T, NH, C / NH));
  const size_t btc = (size_t)B * T * C, c2 = 2 * (size_t)C; /* bytes of C 16-bit values */
  if (in16) { /* the model's own 16-bit buffers: no copies */
    q16 = (char *)qkv, o16 = (char *)out, do16 = (char *)dout, dq16 = (char *)dqkv;
  } else {
    DT_TRY(copies(a, B, T, C, &q16, &o16, &do16, &dq16));
    DT_TRY(to16(a, q16, (const float *)qkv, 3 * btc));
    DT_TRY(to16(a, o16, (const float *)out, btc));
    DT_TRY(to16(a, do16, (const float *)dout, btc));
  }
  std::unordered_map<int64_t, void *> pack = {
      {UID_Q, q16},  {UID_K, q16 + c2},   {UID_V, q16 + 2 * c2},  {UID_O, o16},           {UID_DO, do16},
      {UID_STATS, (void *)lse}, {UID_DQ, dq16}, {UID_DK, dq16 + c2}, {UID_DV, dq16 + 2 * c2}};
  DT_TRY(run(a, gt, pack));
  return in16 ? DT_OK : from16(a, (float *)dqkv, dq16, 3 * btc);
}

#else /* no cuDNN frontend headers at build time, or the CUDA emulation */

#ifdef DT_CUDA_EMU_RUNTIME
#define NO_CUDNN_ATT "the CUDA emulation has no cuDNN (flash is its twin)"
#else
#define NO_CUDNN_ATT \
  "this build has no cuDNN frontend headers (scripts/install-deps.sh fetches them; ./configure --with-cudnn-frontend=DIR)"
#endif

dt_status_t dt_cudnn_att_open(dt_cudnn_att_t **out, cudaStream_t s, int fp16) {
  (void)s, (void)fp16;
  *out = NULL;
  return DT_ERR(DT_ERR_UNSUPPORTED, "system.attention = cudnn: %s", NO_CUDNN_ATT);
}
void dt_cudnn_att_close(dt_cudnn_att_t *a) { (void)a; }
const char *dt_cudnn_att_name(const dt_cudnn_att_t *a) {
  (void)a;
  return "cuDNN fused attention (not in this build)";
}
dt_status_t dt_cudnn_att_validate(int sm, int fp16, int bwd, int B, int T, int NH, int hs) {
  (void)sm, (void)fp16, (void)bwd, (void)B, (void)T, (void)NH, (void)hs;
  return DT_ERR(DT_ERR_UNSUPPORTED, "system.attention = cudnn: %s", NO_CUDNN_ATT);
}
dt_status_t dt_cudnn_att_forward(dt_cudnn_att_t *a, void *out, float *lse, const void *qkv, int in16, int B, int T,
                                 int C, int NH) {
  (void)a, (void)out, (void)lse, (void)qkv, (void)in16, (void)B, (void)T, (void)C, (void)NH;
  return DT_ERR(DT_ERR_INTERNAL, "cudnn attention: not in this build");
}
dt_status_t dt_cudnn_att_backward(dt_cudnn_att_t *a, void *dqkv, const void *dout, const void *out, const void *qkv,
                                  const float *lse, int in16, int B, int T, int C, int NH) {
  (void)a, (void)dqkv, (void)dout, (void)out, (void)qkv, (void)lse, (void)in16, (void)B, (void)T, (void)C, (void)NH;
  return DT_ERR(DT_ERR_INTERNAL, "cudnn attention: not in this build");
}

#endif
