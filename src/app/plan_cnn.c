/* Memory planner for the image classifiers (model.arch = cnn | resnet18 | resnet50; plan_cnn.h).
 * The model of what train_cnn.c allocates per rank on the CPU backend, P = the arena (the
 * parameters, then batch norm's running statistics):
 *   params   fp32 master arena                                                 4 B x P
 *            ZeRO-3: this rank's shard of the parameters, the running statistics
 *            whole, and the tensors gathered at a time: the first convolution
 *            (pinned), the one in use and the next one prefetched, bounded by
 *            3 x the largest tensor (a prefetch out of arena order stays until
 *            its use)                                                         4 B x (Pp/dp + Pb + gathered)
 *            (bf16/fp16: the gathered tensors are in the working copy instead)
 *   wparams  bf16/fp16 working copy, emulated in fp32                          4 B x P (mixed only)
 *            ZeRO-3: this rank's shard of it and the gathered tensors         4 B x (Pp/dp + gathered)
 *   grads    fp32 arena, whole under every ZeRO stage (ZeRO-2 shards the
 *            reduction, not this memory)                                       4 B x P
 *   m, v     the optimizer range: P, or P/dp under ZeRO-1/2/3 (SGD keeps its
 *            momentum in m; the backend allocates v for it too, unused)        4 B x P (/dp) each
 *   comm     MPI's temporaries of 2 bucket all-reduces in flight (DDP), 3 buckets under ZeRO (as
 *            the token model's planner, plan.c; a bucket no larger than the gradients); DDP
 *            averaging in shared memory (parallel.ddp_comm auto | shm): the (dp-1)/dp of an arena
 *            this rank touches in its peers' (ddp_shm.c), counted in its RSS
 *   model    dt_cnn_alloc_bytes: activations and their gradients, convolution scratch, statistics
 *   images   the training and test sets in memory (a byte per pixel and label), the sampler's
 *            order (4 B per image) and the batch (B images in fp32)
 * The CUDA backend's device total: the arenas (whole also under ZeRO-3: the classifiers' device
 * arenas are not sparse, dropped parameters are cleared, not freed), dt_cnn_alloc_bytes with its convolution scratch,
 * and the assumed context (plan.h); the images and MPI's buffers stay on the host. Training prints
 * the configured stage against its peak RSS (CPU) or the device memory in use (CUDA) at the end. */
#include "dt_build.h" /* first: with DT_HAVE_CUDA, backend.h declares dt_backend_cuda (its conv scratch) */
#include "plan_cnn.h"

#include <stdio.h>
#include <string.h>

#include "plan.h"
#include "precision.h"
#include "train.h"
#include "train_cnn.h"

#define MIB 1048576.0
#define GB 1e9

static double ceil_div(double a, int b) { return b > 1 ? (double)(((size_t)a + (size_t)b - 1) / (size_t)b) : a; }

void dt_plan_cnn_compute(dt_plan_cnn_t *p, const dt_config_t *cfg, const dt_cnn_t *m, const dt_images_t *train,
                         const dt_images_t *val, int dp, int accum, int threads) {
  memset(p, 0, sizeof *p);
  const double P = (double)(m->lay.n_params + m->bufs.n_params), img = (double)train->C * train->H * train->W;
  const int B = cfg->micro_batch;
  dt_precision_t prec = DT_PREC_FP32;
  dt_precision_parse(cfg->precision, &prec); /* validated by the caller */
  p->dp = dp, p->accum = accum, p->B = B, p->threads = threads, p->zero = cfg->zero;
  p->params_true = m->lay.n_params_true, p->bufs_true = m->bufs.n_params_true, p->arena = P;
  p->n_train = train->n, p->n_val = val ? val->n : 0, p->C = train->C, p->H = train->H, p->W = train->W;
  p->model = dt_cnn_alloc_bytes(m, B, threads, NULL);
#ifdef DT_HAVE_CUDA
  p->model_gpu = dt_cnn_alloc_bytes(m, B, 1, dt_backend_cuda.cnn);
#endif
  p->images = (p->n_train + p->n_val) * (img + 1) + 4.0 * p->n_train + (double)B * (4 * img + 4);
  const double bucket = cfg->bucket_mb * MIB < 4 * P ? cfg->bucket_mb * MIB : 4 * P; /* a small model: one bucket */
  double big = 0; /* ZeRO-3's gathered tensors */
  for (int t = 1; t < m->lay.n_tensors; t++) {
    const dt_tensor_t *x = &m->lay.tensors[t];
    if ((double)x->rows * x->cols > big) big = (double)x->rows * x->cols;
  }
  const double gathered = (double)m->lay.tensors[0].rows * m->lay.tensors[0].cols + 3 * big;
  for (int z = 0; z < DT_PLAN_CNN_STAGES; z++) {
    dt_plan_cnn_zero_t *r = &p->z[z];
    const int mixed = prec != DT_PREC_FP32, z3 = z == 3 && dp > 1;
    const double shard = ceil_div((double)m->lay.n_params, dp);
    /* ZeRO-3 gathers into the master (fp32) or, in bf16/fp16, into the working copy, whose master
     * then keeps only its shard and the running statistics (zero.h) */
    r->params = z3 ? 4 * (shard + m->bufs.n_params + (mixed ? 0 : gathered)) : 4 * P;
    r->wparams = !mixed ? 0 : z3 ? 4 * (shard + gathered) : 4 * P;
    r->grads = 4 * P;
    r->m = r->v = 4 * (z >= 1 ? ceil_div(P, dp) : P);
    r->comm = dp > 1 ? (z >= 1 ? 3 : 2) * bucket : 0;
    if (dp > 1 && z == 0 && strcmp(cfg->ddp_comm, "mpi")) r->comm = 4 * P * (dp - 1) / dp; /* DDP in shared memory */
    r->total = r->params + r->wparams + r->grads + r->m + r->v + r->comm + p->model + p->images;
    /* the arenas and the model's arrays on the device, the images and MPI's buffers on the host */
    if (p->model_gpu > 0)
      r->total_gpu = 4 * P + (mixed ? 4 * P : 0) + r->grads + r->m + r->v + p->model_gpu + DT_PLAN_CUDA_CONTEXT_BYTES;
  }
}

static void row(FILE *out, const char *name, double z0, double z1, double z2, double z3) {
  fprintf(out, "  %-44s %9.3f %9.3f %9.3f %9.3f\n", name, z0 / GB, z1 / GB, z2 / GB, z3 / GB);
}
#define ROW(name, field) row(out, name, p->z[0].field, p->z[1].field, p->z[2].field, p->z[3].field)
#define ROW1(name, v) row(out, name, v, v, v, v)

void dt_plan_cnn_print(const dt_plan_cnn_t *p, const dt_config_t *cfg, FILE *out) {
  const int sgd = !strcmp(cfg->optimizer, "sgd");
  fprintf(out, "plan: %s, images %dx%dx%d, %d classes: %zu parameters + %zu batch-norm running statistics (%.0f "
          "floats per arena)\n", cfg->arch, p->C, p->H, p->W, cfg->classes, p->params_true, p->bufs_true, p->arena);
  fprintf(out, "plan: world %d = dp %d; micro_batch %d x grad_accum %d; precision %s; optimizer %s; bucket %d MiB; "
          "%d CPU threads; %d training and %d test images in memory\n", p->dp, p->dp, p->B, p->accum, cfg->precision,
          cfg->optimizer, cfg->bucket_mb, p->threads, p->n_train, p->n_val);
  fprintf(out, "plan: units: GB = 1e9 bytes; host memory of the CPU backend, and the CUDA backend's device total%s\n",
          p->model_gpu > 0 ? "" : " (not in this build)");
  fprintf(out, "plan: per rank, GB                                  zero0     zero1     zero2     zero3\n");
  ROW("parameters + running statistics (fp32)", params);
  ROW("working copy (bf16/fp16, emulated in fp32)", wparams);
  ROW("gradients (fp32, whole)", grads);
  ROW(sgd ? "SGD momentum (fp32)" : "AdamW m (fp32)", m);
  ROW(sgd ? "second moment (allocated, unused by SGD)" : "AdamW v (fp32)", v);
  ROW(strcmp(cfg->ddp_comm, "mpi") && p->dp > 1 ? "comm: DDP shm peers' slices, ZeRO staging"
                                                : "comm buffers (MPI temporaries, ZeRO staging)", comm);
  ROW1("activations, gradients, scratch (B images)", p->model);
  ROW1("image sets in memory + the batch", p->images);
  ROW("total host RSS (+ libraries and MPI)", total);
  if (p->model_gpu > 0) {
    ROW1("CUDA: activations, gradients, scratch", p->model_gpu);
    ROW("CUDA: total device (incl. 0.5 GiB context)", total_gpu);
  }
  fprintf(out, "plan: configured parallel.zero = %d\n", p->zero);
}

void dt_plan_cnn_print_rss(const dt_plan_cnn_t *p, FILE *out) {
  int z = p->zero >= 0 && p->zero < DT_PLAN_CNN_STAGES ? p->zero : 0;
  dt_plan_print_rss_line(out, "CPU backend", z, p->z[z].total);
}

void dt_plan_cnn_print_device(const dt_plan_cnn_t *p, double used, FILE *out) {
  int z = p->zero >= 0 && p->zero < DT_PLAN_CNN_STAGES ? p->zero : 0;
  dt_plan_print_device_line(out, used, z, p->z[z].total_gpu);
}

dt_status_t dt_plan_cnn_run(const dt_config_t *cfg, const char *name, int world, int threads, FILE *out) {
  int dp = 0, accum = 0;
  DT_TRY(dt_train_batch_plan(cfg, name, world, &dp, &accum));
  dt_images_t train, val;
  dt_cnn_t m;
  dt_cnn_config_t mc;
  memset(&train, 0, sizeof train), memset(&val, 0, sizeof val), memset(&m, 0, sizeof m);
  dt_status_t st = dt_cnn_open_set(&train, cfg, cfg->train, cfg->train_labels);
  if (st == DT_OK && cfg->val[0]) st = dt_cnn_open_set(&val, cfg, cfg->val, cfg->val_labels);
  if (st == DT_OK) st = dt_cnn_model_config(cfg, &train, &mc);
  if (st == DT_OK) st = dt_cnn_build(&m, &mc);
  if (st == DT_OK) {
    static dt_plan_cnn_t p;
    dt_plan_cnn_compute(&p, cfg, &m, &train, cfg->val[0] ? &val : NULL, dp, accum, threads);
    fprintf(out, "plan: %s\n", name);
    dt_plan_cnn_print(&p, cfg, out);
  }
  dt_cnn_free(&m);
  dt_images_close(&train);
  dt_images_close(&val);
  return st;
}
