/* The memory planner's reports (see plan.h; the model and its arithmetic are plan.c's): the
 * per-rank table of `dtrain plan` and its fit verdicts and roofline, the lines a training run
 * prints at start (the plan) and at the end (measured peak RSS and device memory against it),
 * and the `dtrain plan` command line. */
#include "plan.h"

#include <ctype.h>
#include <math.h>
#include <omp.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "cli.h"
#include "mesh.h"
#include "pipeline.h"
#include "plan_cnn.h"
#include "precision.h"
#include "roofline.h"
#include "train.h"
#include "train_cnn.h"

#define GB 1e9
#define GIB 1073741824.0
#define MIB 1048576.0

static double ceil_div(double x, int n) { return ceil(x / n); }

#define pl dt_plan_line /* this file prints most of the report: the short name */

void dt_plan_line(FILE *o, const char *prefix, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs(prefix, o);
  vfprintf(o, fmt, ap);
  fputc('\n', o);
  va_end(ap);
}

static void row(FILE *o, const char *prefix, const char *label, const dt_plan_t *p, size_t off) {
  char line[256];
  int n = snprintf(line, sizeof line, "  %-44s", label);
  for (int z = 0; z < DT_PLAN_ZERO_STAGES; z++)
    n += snprintf(line + n, sizeof line - (size_t)n, " %9.3f", *(const double *)((const char *)&p->z[z] + off) / GB);
  pl(o, prefix, "%s", line);
}

/* n with thousands separators: 1,557,611,200 */
static const char *commas(size_t n, char buf[32]) {
  char raw[32];
  int len = snprintf(raw, sizeof raw, "%zu", n), k = 0;
  for (int i = 0; i < len; i++) {
    if (i > 0 && (len - i) % 3 == 0) buf[k++] = ',';
    buf[k++] = raw[i];
  }
  buf[k] = '\0';
  return buf;
}

#define ROW(label, field) row(o, prefix, label, p, offsetof(dt_plan_zero_t, field))

/* The model, the layout and what the whole model needs on one rank. */
static void print_model(const dt_plan_t *p, FILE *o, const char *prefix) {
  const dt_plan_in_t *in = &p->in;
  const dt_dims_t *d = &in->d;
  const int dp = in->dp, world = in->dp * in->tp * in->pp;
  const char *prec = dt_precision_name((dt_precision_t)in->precision);
  const double n = (double)p->n_arena;
  char b1[32], b2[32];
  pl(o, prefix, "plan: GPT-2 L=%d NH=%d C=%d V=%d (padded %d) T=%d: %s parameters, %s floats per arena "
     "(padded vocabulary rows and %d-float alignment)", d->L, d->NH, d->C, d->V, d->Vp, d->T, commas(p->n_true, b1),
     commas(p->n_arena, b2), DT_ALIGN);
  pl(o, prefix, "plan: world %d = dp %d x tp %d x pp %d; micro_batch %d x seq_len %d x grad_accum %d; precision %s; "
     "bucket %d MiB; %d CPU threads", world, dp, in->tp, in->pp, in->B, in->T, in->accum, prec, in->bucket_mb,
     in->threads);
  pl(o, prefix, "plan: units: GB = 1e9 bytes, GiB = 2^30 bytes");
  pl(o, prefix, "plan: whole model on one rank (%.4g floats; 4 B each in fp32):", n);
  pl(o, prefix, "  parameters (fp32)        %.4g x 4 B  = %7.2f GB", n, 4 * n / GB);
  pl(o, prefix, "  gradients (fp32)         %.4g x 4 B  = %7.2f GB", n, 4 * n / GB);
  pl(o, prefix, "  AdamW m + v (fp32)       %.4g x 8 B  = %7.2f GB", n, 8 * n / GB);
  pl(o, prefix, "  mixed precision: fp32 master + m + v = %.4g x 12 B = %.2f GB, plus a 16-bit working copy "
     "%.4g x 2 B = %.2f GB", n, 12 * n / GB, n, 2 * n / GB);
  pl(o, prefix, "    (%s emulates bf16/fp16 storage in fp32: a working copy of %.4g x 4 B = %.2f GB%s)",
     in->store16 ? "the CPU backend" : "dtrain", n, 4 * n / GB,
     in->store16 ? "; this run's CUDA backend stores the 16 bits" : " here");
  pl(o, prefix, "  ZeRO over dp=%d, per rank: stage 1 shards m + v: %.2f / %d = %.2f GB; stage 2 also the gradients: "
     "%.2f / %d = %.2f GB; stage 3 also the parameters: %.2f / %d = %.2f GB", dp, 8 * n / GB, dp,
     8 * ceil_div(n, dp) / GB, 4 * n / GB, dp, 4 * ceil_div(n, dp) / GB, 4 * n / GB, dp, 4 * ceil_div(n, dp) / GB);
  if (in->pp > 1) {
    char line[1024];
    int k = 0;
    for (int s = 0; s < in->pp && k < (int)sizeof line - 64; s++)
      k += snprintf(line + k, sizeof line - (size_t)k, " %d:%d blk/%.4g", s, p->stage_blocks[s], p->stage_params[s]);
    pl(o, prefix, "plan: pipeline stages (blocks/parameters per tp rank):%s", line);
  }
}

/* Per rank for ZeRO stages 0-3 (the worst pipeline stage): each buffer, the totals, whether they fit. */
static void print_ranks(const dt_plan_t *p, FILE *o, const char *prefix) {
  const dt_plan_in_t *in = &p->in;
  const int mixed = in->precision != DT_PREC_FP32;
  pl(o, prefix, "plan: per rank, GB (worst pipeline stage)       %9s %9s %9s %9s", "zero0", "zero1", "zero2", "zero3");
  ROW("parameters (fp32 master)", params);
  if (mixed) ROW("working copy (CPU: emulated 16-bit, fp32)", wparams);
  ROW("gradients (fp32)", grads);
  ROW("AdamW m (fp32)", m);
  ROW("AdamW v (fp32)", v);
  ROW("zero3 gathered params (emb+ln_f+2 blocks)", gather);
  ROW(in->ddp_shm && in->dp > 1 ? "comm: DDP shm peers' slices, ZeRO staging"
                                 : "comm buffers (MPI temporaries, ZeRO staging)", comm);
  ROW("activations, CPU backend", act_cpu);
  ROW(in->cudnn   ? "activations, CUDA backend (cuDNN attention)"
      : in->flash ? "activations, CUDA backend (flash attention)"
                  : "activations, CUDA backend (keeps B*NH*T*T)",
      act_gpu);
  ROW("workspace CPU (token batch)", work_cpu);
  ROW("workspace GPU (context+cuBLAS, assumed)", work_gpu);
  ROW("total host RSS, CPU backend", total_cpu);
  ROW("total device, CUDA backend", total_gpu);
  char line[256];
  int k = snprintf(line, sizeof line, "  %-44s", "total device, CUDA backend, GiB");
  for (int z = 0; z < DT_PLAN_ZERO_STAGES; z++)
    k += snprintf(line + k, sizeof line - (size_t)k, " %9.3f", p->z[z].total_gpu / GIB);
  pl(o, prefix, "%s", line);
  char lab[64];
  snprintf(lab, sizeof lab, "fits %.4g GiB device memory?", in->device_mem / GIB);
  k = snprintf(line, sizeof line, "  %-44s", lab);
  for (int z = 0; z < DT_PLAN_ZERO_STAGES; z++)
    k += snprintf(line + k, sizeof line - (size_t)k, " %9s", p->z[z].total_gpu <= in->device_mem ? "fits" : "NO");
  pl(o, prefix, "%s", line);
  ROW(in->recompute ? "activations, CPU, without recompute" : "activations, CPU, train.recompute = true", act_cpu_alt);
  ROW(in->recompute ? "activations, GPU, without recompute" : "activations, GPU, train.recompute = true", act_gpu_rc);
  ROW(in->recompute ? "device total without recompute" : "device total with recompute", total_gpu_rc);
  k = snprintf(line, sizeof line, "  %-44s", in->recompute ? "fits without recompute?" : "fits with recompute?");
  for (int z = 0; z < DT_PLAN_ZERO_STAGES; z++)
    k += snprintf(line + k, sizeof line - (size_t)k, " %9s", p->z[z].total_gpu_rc <= in->device_mem ? "fits" : "NO");
  pl(o, prefix, "%s", line);
  if (in->pp > 1) {
    k = snprintf(line, sizeof line, "  %-44s", "worst pipeline stage");
    for (int z = 0; z < DT_PLAN_ZERO_STAGES; z++)
      k += snprintf(line + k, sizeof line - (size_t)k, " %9d", p->z[z].pp_stage);
    pl(o, prefix, "%s", line);
  }
}

/* pp > 1: each stage under the configured ZeRO stage (its ranks differ only in their tp shard). */
static void print_stages(const dt_plan_t *p, FILE *o, const char *prefix) {
  const dt_plan_in_t *in = &p->in;
  if (in->pp > 1) { /* the per-rank table: ranks of one stage differ only in their tp shard */
    const int zc = in->zero >= 0 && in->zero < DT_PLAN_ZERO_STAGES ? in->zero : 0;
    pl(o, prefix, "plan: per pipeline stage (zero%d), GB per rank: %5s %6s %9s %9s %9s %9s %9s %9s %9s", zc, "stage",
       "blocks", "params", "grads", "adam m+v", "act cpu", "total cpu", "act gpu", "total gpu");
    for (int s = 0; s < in->pp && s < 64; s++) {
      const dt_plan_zero_t *r = &p->stage[s];
      pl(o, prefix, "plan: %*s %5d %6d %9.3f %9.3f %9.3f %9.3f %9.3f %9.3f %9.3f", 32, "", s, p->stage_blocks[s],
         (r->params + r->wparams) / GB, r->grads / GB, (r->m + r->v) / GB, r->act_cpu / GB, r->total_cpu / GB,
         r->act_gpu / GB, r->total_gpu / GB);
    }
    if (in->pp > 64) pl(o, prefix, "plan: (%d more stages)", in->pp - 64);
  }
}

/* What the tables leave out: the CUDA backend's host copies, ZeRO on the device, recomputation. */
static void print_notes(const dt_plan_t *p, FILE *o, const char *prefix) {
  const dt_plan_in_t *in = &p->in;
  const double n = (double)p->n_arena;
  pl(o, prefix, "plan: host memory with the CUDA backend (not in the device totals): a copy of the parameters %.3f GB "
     "(initial weights, checkpoint staging), + m, v %.3f GB once a checkpoint is written or read", 4 * n / GB,
     8 * n / GB);
  pl(o, prefix, "plan: the CUDA backend's ZeRO-2/3 arenas have memory only where in use (CUDA virtual memory, 2 MiB "
     "granules): its device rows count the shard, the gathered blocks and, for the gradients, the embeddings', "
     "ln_f's, 2 blocks' and one bucket that backward holds before reducing them");
  if (in->ddp_shm && in->dp > 1)
    pl(o, prefix, "plan: zero0 on the CPU backend averages the gradients in shared memory (parallel.ddp_comm = auto "
       "finding all dp ranks on one node, or shm): no MPI temporaries, but each rank touches %.3f GB ((dp-1)/dp of "
       "an arena) in its peers' arenas, shared pages that the node holds once and each rank's RSS counts; the "
       "device total keeps MPI's 2 buckets", 4 * n * (in->dp - 1) / in->dp / GB);
  if (in->zero >= 0)
    pl(o, prefix, "plan: configured parallel.zero = %d", in->zero);
  else
    pl(o, prefix, "plan: ZeRO is not in this build (no parallel.zero): stages 1-3 are what it would need");
  pl(o, prefix, "plan: train.recompute = %s: both backends keep each block's output and recompute one block's "
     "activations in backward", in->recompute ? "true" : "false");
}

/* The datasheet roofline of one optimizer step on A100 and H100. */
static void print_roofline(const dt_plan_t *p, FILE *o, const char *prefix) {
  const dt_plan_in_t *in = &p->in;
  const dt_dims_t *d = &in->d;
  const int dp = in->dp;
  const dt_plan_roof_t *f = &p->roof;
  const int zc = in->zero >= 0 && in->zero < DT_PLAN_ZERO_STAGES ? in->zero : 0;
  const double tokens = (double)in->B * in->T * in->accum * dp;
  pl(o, prefix, "roofline: per rank per optimizer step (zero%d, worst rank; GPU datasheet peaks, never measured on a "
     "GPU)", zc);
  pl(o, prefix, "roofline: FLOPs %.4g = %.4g per token (dt_model_flops_per_token) x %d tokens / (tp %d x pp %d)", f->flops,
     dt_model_flops_per_token(d, in->T), in->B * in->T * in->accum, in->tp, in->pp);
  pl(o, prefix, "roofline: HBM bytes (4 B storage): weights read %.3g GB, gradients r/w %.3g GB, activations w+r %.3g GB, "
     "optimizer r/w %.3g GB", f->w_read / GB, f->g_rw / GB, f->act_rw / GB, f->opt_rw / GB);
  pl(o, prefix, "roofline: communication sent per rank: dp gradients zero0 %.3g GB (all-reduce 2(n-1)/n), zero1-2 %.3g "
     "GB (reduce-scatter + all-gather), zero3 %.3g GB (3(n-1)/n); tp %.3g GB; pp %.3g GB", f->dp_bytes[0] / GB,
     f->dp_bytes[1] / GB, f->dp_bytes[3] / GB, f->tp_bytes / GB, f->pp_bytes / GB);
  pl(o, prefix, "roofline: time = max(FLOPs/peak, bytes/HBM) x bubble %.3f + comm (no overlap); links: NVLink inside a "
     "node of 8 GPUs, InfiniBand (1 NIC per GPU) beyond", f->bubble);
  if (in->pp > 1)
    pl(o, prefix, "roofline: bubble: 1F1B over %d stages x %d micro-batches simulated with each stage's FLOPs: %.3f "
       "(equal stages: 1 + (pp-1)/m = %.3f; the busiest stage does %.2fx the mean)", in->pp, in->accum, f->bubble,
       1.0 + (in->pp - 1.0) / in->accum, p->stage_flops_share);
  pl(o, prefix, "roofline: %-15s %-5s %9s %9s %9s %9s %9s %12s  %s", "gpu", "math", "peak TF", "compute s", "memory s",
     "comm s", "step s", "tokens/s", "bound");
  const dt_gpu_spec_t *gs[2] = {&dt_gpu_a100, &dt_gpu_h100};
  static const char *mname[3] = {"fp32", "tf32", "bf16"};
  for (int g = 0; g < 2; g++)
    for (int m = 0; m < 3; m++) {
      double tf, tm, tc, t = dt_plan_step_time(p, gs[g], m, &tf, &tm, &tc);
      double peak = m == 0 ? gs[g]->fp32 : m == 1 ? gs[g]->tf32 : gs[g]->bf16;
      const char *bound = tc > fmax(tf, tm) ? "communication" : tf >= tm ? "compute" : "memory";
      pl(o, prefix, "roofline: %-15s %-5s %9.1f %9.4f %9.4f %9.4f %9.4f %12.4g  %s%s", gs[g]->name, mname[m], peak / 1e12,
         tf, tm, tc, t, tokens / t, bound,
         m == 0 ? " (dtrain's CUDA path, system.tf32 = false: cuBLAS SGEMM, fp32 storage)"
         : m == 2 ? " (train.precision = bf16: layer matmuls on bf16 tensor cores, fp32 storage; the attention's "
                    "products run fp32/TF32, counted here at the bf16 peak)"
                  : " (system.tf32 = true: TF32 matmuls, fp32 storage)");
    }
}

void dt_plan_print(const dt_plan_t *p, FILE *o, const char *prefix) {
  print_model(p, o, prefix);
  print_ranks(p, o, prefix);
  print_stages(p, o, prefix);
  print_notes(p, o, prefix);
  print_roofline(p, o, prefix);
}

double dt_plan_parse_bytes(const char *s) {
  char *end = NULL;
  double v = strtod(s, &end);
  if (end == s || !(v >= 0) || !isfinite(v)) return -1;
  static const struct {
    const char *suf;
    double mul;
  } u[] = {{"", 1},         {"B", 1},          {"K", 1024.0},      {"KiB", 1024.0},   {"KB", 1e3},
           {"M", MIB},      {"MiB", MIB},      {"MB", 1e6},        {"G", GIB},        {"GiB", GIB},
           {"GB", 1e9},     {"T", GIB * 1024}, {"TiB", GIB * 1024}, {"TB", 1e12}};
  for (size_t i = 0; i < sizeof u / sizeof u[0]; i++)
    if (!strcmp(end, u[i].suf)) return v * u[i].mul;
  return -1;
}

/* A "VmXXX:   123 kB" field of /proc/self/status in bytes, -1 if unknown. */
static double proc_status_bytes(const char *field) {
  FILE *f = fopen("/proc/self/status", "r");
  if (!f) return -1;
  char line[256];
  double kb = -1;
  size_t n = strlen(field);
  while (fgets(line, sizeof line, f))
    if (!strncmp(line, field, n) && line[n] == ':') kb = strtod(line + n + 1, NULL);
  fclose(f);
  return kb < 0 ? -1 : kb * 1024;
}

double dt_plan_peak_rss(void) { return proc_status_bytes("VmHWM"); }

static double baseline_rss = -1;
void dt_plan_note_baseline(void) { baseline_rss = proc_status_bytes("VmRSS"); }

static int plan_for(dt_plan_t *p, const dt_config_t *cfg, const char *name, int world, int threads) {
  dt_plan_in_t in;
  if (dt_plan_input(&in, cfg, name, world, threads, 80 * GIB) != DT_OK || dt_plan_compute(p, &in) != DT_OK) {
    dt_err_clear();
    return -1;
  }
  return 0;
}

void dt_plan_print_run(const dt_config_t *cfg, const char *name, int world, int threads, int device, FILE *out) {
  static dt_plan_t p;
  if (plan_for(&p, cfg, name, world, threads) != 0) return;
  dt_plan_print(&p, out, "# ");
  if (device) dt_kroof_print(&p, out, "# ");
}

void dt_plan_print_rss(const dt_config_t *cfg, const char *name, int world, int threads, int device, int ckpt,
                       FILE *out) {
  static dt_plan_t p;
  double rss = dt_plan_peak_rss();
  if (rss < 0) return;
  int z = 0;
  if (plan_for(&p, cfg, name, world, threads) == 0) z = p.in.zero >= 0 && p.in.zero < DT_PLAN_ZERO_STAGES ? p.in.zero : 0;
  const dt_plan_zero_t *r = &p.z[z];
  double plan = !device ? r->total_cpu : ckpt ? r->host_gpu_ckpt : r->host_gpu;
  const char *what = !device ? "CPU backend" : ckpt ? "CUDA backend, host copies of params, m, v" :
                                                      "CUDA backend, host copy of params, no checkpoint yet";
  dt_plan_print_rss_line(out, what, z, plan);
}

void dt_plan_print_rss_line(FILE *out, const char *what, int zero, double plan) {
  double rss = dt_plan_peak_rss();
  if (rss < 0) return;
  fprintf(out, "# memory: rank 0 peak RSS (VmHWM) %.1f MiB; planned host total (%s, zero%d) %.1f MiB (%+.1f%%)",
          rss / MIB, what, zero, plan / MIB, 100 * (plan - rss) / rss);
  if (baseline_rss >= 0)
    fprintf(out, "; + %.1f MiB resident before the model (libraries, MPI, CUDA runtime) = %.1f MiB (%+.1f%%)",
            baseline_rss / MIB, (plan + baseline_rss) / MIB, 100 * (plan + baseline_rss - rss) / rss);
  fputc('\n', out);
}

void dt_plan_print_device(const dt_config_t *cfg, const char *name, int world, int threads, double used, FILE *out) {
  static dt_plan_t p;
  int z = 0;
  if (plan_for(&p, cfg, name, world, threads) != 0) return;
  z = p.in.zero >= 0 && p.in.zero < DT_PLAN_ZERO_STAGES ? p.in.zero : 0;
  dt_plan_print_device_line(out, used, z, p.z[z].total_gpu);
}

void dt_plan_print_device_line(FILE *out, double used, int zero, double plan) {
  fprintf(out, "# memory: rank 0 device memory in use %.1f MiB (cudaMemGetInfo: context and library workspaces "
          "included); planned device total (CUDA backend, zero%d) %.1f MiB (%+.1f%%)\n",
          used / MIB, zero, plan / MIB, used > 0 ? 100 * (plan - used) / used : 0.0);
}

/* ---- `dtrain plan` ---------------------------------------------------------------------------- */

static int usage(FILE *out, int code) {
  fprintf(out,
          "usage: dtrain plan CONFIG.ini [section.key=value ...] [--world N] [--device-mem 80GiB]\n"
          "Per-rank memory of the configured model and layout for ZeRO stages 0-3 (parameters, working\n"
          "copy, gradients, AdamW moments, activations of the CPU and CUDA backends, buffers), whether it\n"
          "fits --device-mem (default 80GiB; suffixes B K M G T = powers of 1024, KB MB GB TB = of 1000,\n"
          "KiB MiB GiB TiB), a datasheet roofline of one step on A100 and H100, and one of the CUDA\n"
          "backend's kernels by class on H100 (and H200): FLOPs, HBM bytes, predicted ms, as built and\n"
          "with 16-bit activations (not built yet). --world defaults to\n"
          "parallel.dp x tp x pp (dp = 0 read as 1). For the image classifiers (model.arch = cnn |\n"
          "resnet18 | resnet50): host memory per rank for ZeRO 0-2 on the CPU backend (the image sets\n"
          "are opened for their sizes; no GPU rows or roofline yet).\n");
  return code;
}

int dt_plan_main(int argc, char **argv) {
  const char *cfg_path = NULL;
  int world = 0;
  double mem = 80 * GIB;
  char *over[256];
  int n_over = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return usage(stdout, 0);
    if (!strcmp(argv[i], "--world") && i + 1 < argc) {
      char *end;
      long v = strtol(argv[++i], &end, 10);
      if (*end || v < 1 || v > 1 << 24) {
        fprintf(stderr, "dtrain plan: --world: '%s' is not a positive integer\n", argv[i]);
        return 2;
      }
      world = (int)v;
    } else if (!strcmp(argv[i], "--device-mem") && i + 1 < argc) {
      mem = dt_plan_parse_bytes(argv[++i]);
      if (mem <= 0) {
        fprintf(stderr, "dtrain plan: --device-mem: '%s' is not a size like 80GiB, 40GB or 8e10\n", argv[i]);
        return 2;
      }
    } else if (argv[i][0] == '-') {
      fprintf(stderr, "dtrain plan: unknown or incomplete option '%s'\n", argv[i]);
      return usage(stderr, 2);
    } else if (!cfg_path) {
      cfg_path = argv[i];
    } else if (n_over < 256) {
      over[n_over++] = argv[i];
    } else {
      fprintf(stderr, "dtrain plan: more than 256 overrides\n");
      return 2;
    }
  }
  if (!cfg_path) return usage(stderr, 2);
  dt_config_t cfg;
  dt_config_defaults(&cfg);
  dt_status_t st = dt_config_load(&cfg, cfg_path);
  for (int i = 0; st == DT_OK && i < n_over; i++) st = dt_config_override(&cfg, over[i]);
  const char *env = getenv("SLURM_CPUS_PER_TASK");
  int threads = cfg.threads > 0 ? cfg.threads : env && atoi(env) > 0 ? atoi(env) : omp_get_max_threads();
  if (st == DT_OK && dt_cnn_trainer_wanted(&cfg)) { /* the image classifiers (plan_cnn.c) */
    st = dt_config_validate(&cfg, cfg_path);
    if (st == DT_OK) st = dt_plan_cnn_run(&cfg, cfg_path, world ? world : cfg.dp > 0 ? cfg.dp : 1, threads, stdout);
    if (st == DT_OK) return 0;
    fprintf(stderr, "dtrain plan: %s\n", dt_err_msg());
    return 2;
  }
  if (st == DT_OK) { /* layouts dtrain cannot run (tp not dividing the vocab, ...) can still be planned */
    int tp = cfg.tp, pp = cfg.pp;
    cfg.tp = cfg.pp = 1;
    st = dt_config_validate(&cfg, cfg_path);
    cfg.tp = tp;
    cfg.pp = pp;
  }
  dt_plan_in_t in;
  static dt_plan_t p;
  if (st == DT_OK) st = dt_plan_input(&in, &cfg, cfg_path, world, threads, mem);
  if (st == DT_OK) st = dt_plan_compute(&p, &in);
  if (st != DT_OK) {
    fprintf(stderr, "dtrain plan: %s\n", dt_err_msg());
    return 2;
  }
  printf("plan: %s\n", cfg_path);
  dt_plan_print(&p, stdout, "");
  dt_kroof_print(&p, stdout, "");
  return 0;
}
