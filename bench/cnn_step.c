/* CNN training step benchmark (issue #25): forward + backward + SGD (momentum 0.9, weight decay
 * 5e-4) of a CNN model (src/model/cnn.h) on random images, one process, `--threads` OpenMP
 * threads; prints the machine, the matmul engine, per-phase medians and a RESULT line. Compared
 * with PyTorch by bench/cnn_step.sh (bench/torch_cnn.py: the same model, batch and optimizer).
 *   usage: bench/cnn_step [--arch resnet50|resnet18|cnn] [--batch 32] [--image 3,32,32] [--width 64]
 *                         [--classes 10] [--hidden 128] [--steps 5] [--warmup 2] [--threads N] */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cnn.h"
#include "conv_winograd.h"
#include "kmath.h"
#include "ops_cpu.h"
#include "profile.h"
#include "timer.h"

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static void machine(void) {
  char line[256], model[160] = "unknown";
  FILE *f = fopen("/proc/cpuinfo", "r");
  while (f && fgets(line, sizeof line, f))
    if (!strncmp(line, "model name", 10)) {
      char *p = strchr(line, ':');
      if (p) snprintf(model, sizeof model, "%s", p + 2);
      model[strcspn(model, "\n")] = 0;
      break;
    }
  if (f) fclose(f);
  const char *isa = __builtin_cpu_supports("avx512f") ? "AVX-512" : __builtin_cpu_supports("avx2") ? "AVX2" : "SSE";
  const char *ct = getenv("OPENBLAS_CORETYPE");
  printf("# cpu: %s (%s); matmul: %s; 3x3 convolutions: %s; OPENBLAS_CORETYPE=%s\n", model, isa, dt_cpu_gemm_engine(),
         dt_conv_algo_name(), ct ? ct : "(unset)");
}

int main(int argc, char **argv) {
  dt_cnn_config_t c = {.arch = DT_CNN_RESNET50, .C = 3, .H = 32, .W = 32, .classes = 10, .width = 64, .hidden = 128};
  int B = 32, steps = 5, warmup = 2, threads = omp_get_max_threads();
  const char *arch = "resnet50";
  for (int i = 1; i + 1 < argc; i += 2) {
    const char *k = argv[i], *v = argv[i + 1];
    if (!strcmp(k, "--arch")) arch = v;
    else if (!strcmp(k, "--batch")) B = atoi(v);
    else if (!strcmp(k, "--image")) sscanf(v, "%d,%d,%d", &c.C, &c.H, &c.W);
    else if (!strcmp(k, "--width")) c.width = atoi(v);
    else if (!strcmp(k, "--classes")) c.classes = atoi(v);
    else if (!strcmp(k, "--hidden")) c.hidden = atoi(v);
    else if (!strcmp(k, "--steps")) steps = atoi(v);
    else if (!strcmp(k, "--warmup")) warmup = atoi(v);
    else if (!strcmp(k, "--threads")) threads = atoi(v);
    else {
      fprintf(stderr, "cnn_step: unknown option %s (usage in bench/cnn_step.c)\n", k);
      return 2;
    }
  }
  omp_set_num_threads(threads);
  dt_cnn_t m;
  /* the CPU backend's kernels and memory, without arenas (this program holds its own) */
  dt_backend_t be = {.ops = &dt_backend_cpu, .k = dt_backend_cpu.kernels, .threads = threads};
  if (dt_cnn_arch_parse(arch, &c.arch) || dt_cnn_build(&m, &c) || dt_cnn_alloc(&m, &be, B)) {
    fprintf(stderr, "cnn_step: %s\n", dt_err_msg());
    return 1;
  }
  size_t np = m.lay.n_params, nx = (size_t)B * c.C * c.H * c.W;
  float *p = malloc(np * sizeof *p), *g = calloc(np, sizeof *g), *mo = calloc(np, sizeof *mo);
  float *bufs = malloc(m.bufs.n_params * sizeof *bufs), *x = malloc(nx * sizeof *x);
  int *y = malloc((size_t)B * sizeof *y);
  dt_cnn_init_params(&m, p, bufs, 1);
  dt_rng_t r;
  dt_rng_seed(&r, 3);
  for (size_t i = 0; i < nx; i++) x[i] = (float)dt_rng_normal(&r);
  for (int i = 0; i < B; i++) y[i] = (int)(dt_rng_next(&r) % (uint64_t)c.classes);
  machine();
  printf("# bench/cnn_step: %s %dx%dx%d width %d, %zu parameters, batch %d, threads %d, steps %d after %d warm-up\n",
         arch, c.C, c.H, c.W, c.width, m.lay.n_params_true, B, threads, steps, warmup);
  double *t[4], *prof[DT_PROF_N];
  for (int k = 0; k < 4; k++) t[k] = calloc((size_t)steps, sizeof(double));
  for (int k = 0; k < DT_PROF_N; k++) prof[k] = calloc((size_t)steps, sizeof(double));
  dt_profile.enabled = 1;
  for (int s = 0; s < warmup + steps; s++) {
    memset(dt_profile.sec, 0, sizeof dt_profile.sec);
    double t0 = dt_time_now();
    memset(g, 0, np * sizeof *g);
    double loss = 0;
    dt_status_t st = dt_cnn_forward(&m, p, bufs, x, y, 1, &loss, NULL);
    double t1 = dt_time_now();
    if (st == DT_OK) st = dt_cnn_backward(&m, p, g, 1.0f / (float)B);
    if (st != DT_OK) {
      fprintf(stderr, "cnn_step: %s\n", dt_err_msg());
      return 1;
    }
    double t2 = dt_time_now();
#pragma omp parallel for simd schedule(static)
    for (size_t k = 0; k < np; k++) p[k] = dt_sgd_update(p[k], g[k], &mo[k], 0.01f, 0.9f, 5e-4f, 0);
    double t3 = dt_time_now();
    if (s >= warmup) t[0][s - warmup] = t3 - t0, t[1][s - warmup] = t1 - t0, t[2][s - warmup] = t2 - t1,
                     t[3][s - warmup] = t3 - t2;
    for (int k = 0; s >= warmup && k < DT_PROF_N; k++) prof[k][s - warmup] = dt_profile.sec[k];
    printf("# step %d: loss %.9g %.1f ms\n", s + 1, loss, 1e3 * (t3 - t0));
  }
  double ms = 1e3 * median(t[0], steps);
  printf("# medians: forward %.1f ms, backward %.1f ms, sgd %.1f ms\n", 1e3 * median(t[1], steps),
         1e3 * median(t[2], steps), 1e3 * median(t[3], steps));
  printf("# per op kind, forward + backward (median ms, share of the median step):\n");
  double accounted = 0;
  for (int k = 0; k < DT_PROF_N; k++) {
    double mk = 1e3 * median(prof[k], steps);
    accounted += mk;
    if (mk > 0) printf("#   %-13s %8.1f ms %5.1f%%\n", dt_prof_names[k], mk, 100 * mk / ms);
  }
  printf("#   %-13s %8.1f ms %5.1f%% (loss, gradient bookkeeping, sgd)\n", "(other)", ms - accounted,
         100 * (ms - accounted) / ms);
  printf("RESULT dtrain %s batch=%d threads=%d step_ms=%.1f images_per_s=%.1f\n", arch, B, threads, ms, B / ms * 1e3);
  dt_cnn_free(&m);
  free(p), free(g), free(mo), free(bufs), free(x), free(y);
  for (int k = 0; k < 4; k++) free(t[k]);
  for (int k = 0; k < DT_PROF_N; k++) free(prof[k]);
  return 0;
}
