/* Command-line front end: parses arguments, dispatches subcommands, and turns errors into exit
 * statuses (0 ok, 2 bad configuration or usage, 1 runtime failure, 75 "requeue": stopped by a
 * signal after a checkpoint, or ended by the hang watchdog). Inside an MPI job any failure after
 * MPI_Init ends the whole job via MPI_Abort, so no rank is left waiting in a collective. */
#include "cli.h"

#include <hdf5.h>
#include <mpi.h>
#include <omp.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "data.h"
#include "dt_cuda.h"
#include "fault.h"
#include "dt_build.h" /* autoconf: PACKAGE_VERSION */
#include "mesh.h"
#include "mpi_check.h"
#include "plan.h"
#include "plot.h"
#include "train.h"
#include "train_cnn.h"
#include "watchdog.h"

#define DT_STR_(x) #x
#define DT_STR(x) DT_STR_(x)

/* The usage text, shared by --help and the man page (--man): each command with what it does, then
 * paragraphs. */
static const char *const commands[][2] = {
    {"CONFIG.ini [section.key=value ...]", "train a GPT-2 model"},
    {"prep [--help] [--tokenizer byte|gpt2] OUTPREFIX FILE...", "text files -> token shards"},
    {"prep --decode [--tokenizer byte|gpt2] SHARD...", "token shards -> text"},
    {"layout [--help] ...", "print the rank/device layout of this launch"},
    {"eval CONFIG --checkpoint FILE --data SHARDS [--batches N]", "loss of a checkpoint (classifiers: and accuracy)"},
    {"generate [--help] CONFIG [--checkpoint FILE|DIR] [--prompt TEXT] [--tokens N] ...",
     "sample text from a checkpoint (key/value cache)"},
    {"bench-comm [--help] [--max-bytes N] ...", "time and check the communicator's collectives"},
    {"plan [--help] CONFIG [section.key=value ...] [--world N] [--device-mem 80GiB]",
     "per-rank memory (ZeRO 0-3) and GPU roofline; image classifiers: host memory"},
    {"plot [--help] [-o OUT.svg] [--peak-tflops P] METRICS.jsonl...", "training curves of runs as one SVG picture"},
    {"--help | --version | --man", "this text, the versions of dtrain and its libraries, the man page"},
};
static const char *const paragraphs[] = {
    "Run under srun, sbatch or mpirun for several ranks; one rank per device or CPU socket. "
    "Keys given on the command line override the file. Exit status: 0 done, 1 runtime error, "
    "2 bad configuration or usage, " DT_STR(DT_EXIT_REQUEUE) " stopped by SIGUSR1/SIGTERM after a checkpoint, or ended by "
    "the hang watchdog (a rank waited longer than system.comm_timeout for others; no checkpoint): requeue.",
    "parallel.tp = N: Megatron-style tensor parallelism over N consecutive ranks; parallel.pp = N: N pipeline "
    "stages run 1F1B; parallel.zero = 1|2|3: ZeRO over dp (1|2 with pp > 1). tp and pp on both backends "
    "(cuda: emulation-tested, not yet on GPUs); ZeRO 1-3 on both (cuda: stages 2 and 3 with device memory "
    "only where in use, CUDA virtual memory, emulation-tested).",
    "train.precision = bf16 | fp16 (fp16 with dynamic loss scaling) works on the CPU backend by rounding "
    "float storage (emulated: for numerics, not speed).",
    "The CUDA backend is compiled in when configured; one GPU checked (docs/gpu-runs.md), multi-GPU "
    "NCCL never run on GPUs; its bf16/fp16 layer products run on 16-bit tensor cores, and with "
    "system.attention = flash or cudnn it stores 16 bits (system.store16): built and emulation-tested, never "
    "run on a GPU.",
};
#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

/* Text wrapped at 100 columns. */
static void wrap(FILE *out, const char *text) {
  int col = 0;
  for (const char *p = text; *p;) {
    size_t w = strcspn(p, " ");
    if (col && col + 1 + (int)w > 100) {
      fputc('\n', out);
      col = 0;
    } else if (col) {
      fputc(' ', out);
      col++;
    }
    fwrite(p, 1, w, out);
    col += (int)w;
    p += w;
    while (*p == ' ') p++;
  }
  fputc('\n', out);
}

static void usage(FILE *out) {
  for (size_t i = 0; i < N_OF(commands); i++) {
    int n = fprintf(out, "%s dtrain %s", i ? "      " : "usage:", commands[i][0]);
    if (n >= 62) n = fprintf(out, "\n") - 1; /* a long command: its meaning on the next line */
    fprintf(out, "%*s%s\n", 62 - n, "", commands[i][1]);
  }
  for (size_t i = 0; i < N_OF(paragraphs); i++) {
    fputc('\n', out);
    wrap(out, paragraphs[i]);
  }
  fprintf(out, "\nConfiguration keys (.ini sections):\n");
  dt_config_help(out);
}

/* dtrain(1) in man(7) markup, from the same tables as --help and the configuration key table. */
static void man_page(FILE *out) {
  fprintf(out, ".TH DTRAIN 1 \"\" \"dtrain %s\" \"User Commands\"\n.SH NAME\n"
               "dtrain \\- train GPT-2-class models on Slurm GPU and CPU clusters (MPI, NCCL, HDF5)\n.SH SYNOPSIS\n",
          PACKAGE_VERSION);
  for (size_t i = 0; i < N_OF(commands); i++) {
    fputs(".TP\n.B dtrain ", out);
    dt_man_text(out, commands[i][0]);
    fputc('\n', out);
    dt_man_text(out, commands[i][1]);
    fputc('\n', out);
  }
  fputs(".SH DESCRIPTION\n", out);
  for (size_t i = 0; i < N_OF(paragraphs); i++) {
    fputs(".PP\n", out);
    dt_man_text(out, paragraphs[i]);
    fputc('\n', out);
  }
  fputs(".SH CONFIGURATION\nAn .ini file with the sections below; any key can be given on the command line as "
        "section.key=value.\n", out);
  dt_config_man(out);
  fputs(".SH FILES\n$DTRAIN_HOME/share/dtrain: inputs/ (configurations), sbatch/ (job templates), validation/ "
        "(the cluster acceptance suite), scripts/get-data.sh (the bundled corpus).\n"
        ".SH SEE ALSO\nThe README of the source tree; validation/README.md.\n", out);
}

/* Version of dtrain and of the libraries it runs on (validation/ records them). MPI allows
 * MPI_Get_library_version before MPI_Init. */
static void print_version(void) {
  char mv[MPI_MAX_LIBRARY_VERSION_STRING] = "";
  int n = 0;
  MPI_Get_library_version(mv, &n);
  mv[strcspn(mv, "\n,")] = '\0';
  unsigned maj = 0, min = 0, rel = 0;
  H5get_libversion(&maj, &min, &rel);
  printf("dtrain %s\n", PACKAGE_VERSION);
  printf("mpi: %s\n", mv);
  printf("hdf5: %u.%u.%u\n", maj, min, rel);
  printf("blas: %s\n", DT_BLAS_NAME);
  fflush(stdout);
  dt_cuda_print_versions(stdout);
}

dt_status_t dt_cli_load_config(dt_config_t *cfg, const char *path, int n_over, char **over) {
  dt_config_defaults(cfg);
  DT_TRY(dt_config_load(cfg, path));
  for (int i = 0; i < n_over; i++) DT_TRY(dt_config_override(cfg, over[i]));
  return dt_config_validate(cfg, path);
}

static int exit_code_for(dt_status_t st) {
  return (st == DT_ERR_CONFIG || st == DT_ERR_LAUNCH || st == DT_ERR_ARG) ? 2 : 1;
}

/* Print the recorded error once per failing rank and end the whole job. */
static int fail(dt_status_t st, int mpi_up) {
  char host[64] = "?";
  gethostname(host, sizeof host);
  int rank = dt_err_rank();
  if (dt_err_msg()[0])
    fprintf(stderr, "dtrain: rank %d (%s): %s\n", rank, host, dt_err_msg());
  else
    fprintf(stderr, "dtrain: rank %d (%s): %s\n", rank, host, dt_status_str(st));
  fflush(stderr);
  int code = exit_code_for(st);
  if (mpi_up) {
    int size = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size > 1) MPI_Abort(MPI_COMM_WORLD, code);
    MPI_Finalize();
  }
  return code;
}

dt_status_t dt_cli_gpt2_only(const dt_config_t *cfg, const char *path, const char *tool) {
  if (!dt_cnn_trainer_wanted(cfg)) return DT_OK;
  return DT_ERR(DT_ERR_CONFIG, "%s: model.arch = %s: `dtrain %s` knows only GPT-2 so far (an image classifier's test "
                "loss and accuracy are in its training rows: train.eval_every)", path, cfg->arch, tool);
}

/* model.arch = cnn | resnet18 | resnet50 (train_cnn.h) */
static int train_cnn(const dt_config_t *cfg, const char *name) {
  dt_train_install_signals();
  dt_plan_note_baseline(); /* RSS before any model memory, for the peak-RSS line at the end */
  static dt_cnn_trainer_t tr;
  dt_status_t st = dt_cnn_trainer_init(&tr, cfg, name);
  if (st == DT_OK) st = dt_cnn_trainer_run(&tr);
  if (st != DT_OK) return fail(st, 1);
  int code = tr.stopped_by_signal ? DT_EXIT_REQUEUE : 0;
  dt_cnn_trainer_free(&tr);
  dt_wd_stop();
  MPI_Finalize();
  return code;
}

static int train_main(int argc, char **argv) {
  int rank = 0;
  dt_mpi_init(&argc, &argv, &rank);
  int world = 1, dp, accum;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  dt_config_t cfg;
  dt_status_t st = dt_cli_load_config(&cfg, argv[1], argc - 2, argv + 2);
  if (st == DT_OK) st = dt_train_batch_plan(&cfg, argv[1], world, &dp, &accum);
  /* the hang watchdog's first collective: a rank that never arrives ends the job */
  if (st == DT_OK && dt_fault("stall_start", rank, -1)) raise(SIGSTOP); /* test-only (fault.h) */
  if (st == DT_OK) st = dt_wd_start(cfg.comm_timeout, cfg.comm_timeout_start);
  const dt_backend_ops_t *ops = NULL;
  int devices = 0;
  if (st == DT_OK) st = dt_train_pick_backend(&cfg, argv[1], &ops, &devices); /* collective, same verdict */
  if (st == DT_ERR_MPI) return fail(st, 1);
  if (st != DT_OK) {
    /* Same file on every rank, same verdict: rank 0 says it, all exit 2 without work. */
    if (rank == 0) fprintf(stderr, "dtrain: %s\n", dt_err_msg());
    MPI_Finalize();
    return 2;
  }
  if (dt_cnn_trainer_wanted(&cfg)) return train_cnn(&cfg, argv[1]);
  dt_train_install_signals();
  dt_plan_note_baseline(); /* RSS before any model memory, for the peak-RSS line at the end */
  static dt_trainer_t tr;
  st = dt_trainer_init(&tr, &cfg, argv[1]);
  if (st == DT_OK) st = dt_trainer_run(&tr);
  if (st != DT_OK) return fail(st, 1);
  int code = tr.stopped_by_signal ? DT_EXIT_REQUEUE : 0;
  dt_trainer_free(&tr);
  dt_wd_stop();
  MPI_Finalize();
  return code;
}

int dt_main(int argc, char **argv) {
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  const char *cmd = argv[1];
  if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h")) {
    usage(stdout);
    return 0;
  }
  if (!strcmp(cmd, "--man")) {
    man_page(stdout);
    return 0;
  }
  if (!strcmp(cmd, "--version")) {
    print_version();
    return 0;
  }
  if (!strcmp(cmd, "prep")) return dt_prep_main(argc - 1, argv + 1);
  if (!strcmp(cmd, "layout")) return dt_layout_main(argc - 1, argv + 1);
  if (!strcmp(cmd, "plot")) return dt_plot_main(argc - 1, argv + 1);
  if (!strcmp(cmd, "eval")) return dt_eval_main(argc - 1, argv + 1);
  if (!strcmp(cmd, "generate")) return dt_generate_main(argc - 1, argv + 1);
  if (!strcmp(cmd, "plan")) return dt_plan_main(argc - 1, argv + 1);
  if (!strcmp(cmd, "bench-comm")) return dt_bench_comm_main(argc - 1, argv + 1);
  if (cmd[0] == '-') {
    fprintf(stderr, "dtrain: unknown option '%s' (see dtrain --help)\n", cmd);
    return 2;
  }
  return train_main(argc, argv);
}
