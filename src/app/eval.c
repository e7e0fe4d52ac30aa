/* `dtrain eval CONFIG --checkpoint FILE --data SHARD [--batches N] [section.key=value ...]`:
 * mean loss of a checkpoint's weights over the first N sequential batches of SHARD, batch j
 * being tokens [j*B*T, j*B*T + B*T + 1) (inputs the first B*T, targets shifted by one), with B =
 * train.micro_batch and T = model.seq_len. Batches are split over the ranks.
 * The image classifiers (model.arch != gpt2): the test loss and top-1 accuracy of the checkpoint
 * over the whole image set --data (idx: its labels in data.val_labels), normalised with the
 * training set's statistics as in training (data.train is read for them), batch norm in
 * evaluation mode: the numbers training logs as val_loss and val_acc. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt.h"
#include "cli.h"
#include "mpi_check.h"
#include "train.h"
#include "train_cnn.h"

static int usage(FILE *out, int code) {
  fprintf(out,
          "usage: dtrain eval CONFIG.ini --checkpoint FILE --data SHARD_GLOB [--batches N] [section.key=value ...]\n"
          "Prints the mean cross-entropy of the checkpoint's weights over the first N (default 8) batches.\n"
          "Image classifiers (model.arch = cnn | resnet18 | resnet50): the loss and top-1 accuracy over the\n"
          "whole image set SHARD_GLOB (idx: labels from data.val_labels); --batches does not apply.\n");
  return code;
}

/* The image classifiers: the trainer set up on the checkpoint (resume from FILE), --data as its
 * test set, one evaluation pass. */
static int eval_images(dt_config_t *cfg, const char *cfg_path, const char *ckpt, const char *data, int rank) {
  if (snprintf(cfg->val, sizeof cfg->val, "%s", data) >= (int)sizeof cfg->val ||
      snprintf(cfg->resume, sizeof cfg->resume, "%s", ckpt) >= (int)sizeof cfg->resume) {
    if (rank == 0) fprintf(stderr, "dtrain eval: --checkpoint or --data: path too long\n");
    MPI_Finalize();
    return 2;
  }
  cfg->metrics[0] = '\0'; /* no metrics file */
  cfg->global_batch = cfg->grad_accum = cfg->micro_batches = 0;
  static dt_cnn_trainer_t tr;
  double loss = 0, acc = 0;
  dt_status_t st = dt_config_validate(cfg, cfg_path);
  if (st == DT_OK) st = dt_cnn_trainer_init(&tr, cfg, cfg_path);
  if (st == DT_OK && tr.resumed_step < 0) st = DT_ERR(DT_ERR_CONFIG, "%s: no checkpoint loaded", ckpt);
  if (st == DT_OK) st = dt_cnn_trainer_eval(&tr, &loss, &acc);
  if (st != DT_OK) {
    fprintf(stderr, "dtrain: rank %d: %s\n", rank, dt_err_msg());
    MPI_Abort(MPI_COMM_WORLD, st == DT_ERR_CONFIG ? 2 : 1);
    return 1;
  }
  if (rank == 0)
    printf("eval: checkpoint %s data %s images %d loss %.9f accuracy %.6f\n", ckpt, data, tr.val.n, loss, acc);
  dt_cnn_trainer_free(&tr);
  MPI_Finalize();
  return 0;
}

int dt_eval_main(int argc, char **argv) {
  const char *cfg_path = NULL, *ckpt = NULL, *data = NULL;
  int batches = 8;
  char *over[256];
  int n_over = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return usage(stdout, 0);
    if (!strcmp(argv[i], "--checkpoint") && i + 1 < argc) {
      ckpt = argv[++i];
    } else if (!strcmp(argv[i], "--data") && i + 1 < argc) {
      data = argv[++i];
    } else if (!strcmp(argv[i], "--batches") && i + 1 < argc) {
      char *end;
      long v = strtol(argv[++i], &end, 10);
      if (*end || v < 1 || v > 1 << 30) {
        fprintf(stderr, "dtrain eval: --batches: '%s' is not a positive integer\n", argv[i]);
        return 2;
      }
      batches = (int)v;
    } else if (argv[i][0] == '-') {
      fprintf(stderr, "dtrain eval: unknown or incomplete option '%s'\n", argv[i]);
      return usage(stderr, 2);
    } else if (!cfg_path) {
      cfg_path = argv[i];
    } else if (n_over < 256) {
      over[n_over++] = argv[i];
    }
  }
  if (!cfg_path || !ckpt || !data) return usage(stderr, 2);

  int rank;
  dt_mpi_init(&argc, &argv, &rank);
  dt_config_t cfg;
  if (dt_cli_load_config(&cfg, cfg_path, n_over, over) != DT_OK) {
    if (rank == 0) fprintf(stderr, "dtrain: %s\n", dt_err_msg());
    MPI_Finalize();
    return 2;
  }
  if (dt_cnn_trainer_wanted(&cfg)) return eval_images(&cfg, cfg_path, ckpt, data, rank);
  cfg.grad_accum = 0;
  cfg.micro_batches = 0;
  cfg.global_batch = 0;
  static dt_trainer_t tr;
  dt_data_t *d = NULL;
  double loss = 0;
  dt_status_t st = dt_trainer_init_model(&tr, &cfg, cfg_path);
  if (st == DT_OK) st = dt_data_open(&d, data, cfg.vocab_size, tr.T, 0, cfg.seed);
  if (st == DT_OK && (uint64_t)batches > dt_data_num_samples(d) / (uint64_t)tr.B)
    st = DT_ERR(DT_ERR_DATA, "%s: has only %llu batches of %d x %d, --batches %d asked", data,
                (unsigned long long)(dt_data_num_samples(d) / (uint64_t)tr.B), tr.B, tr.T, batches);
  if (st == DT_OK) st = dt_trainer_load_checkpoint(&tr, ckpt, NULL, 0);
  if (st == DT_OK) st = dt_trainer_eval(&tr, d, batches, &loss);
  if (st != DT_OK) {
    fprintf(stderr, "dtrain: rank %d: %s\n", rank, dt_err_msg());
    MPI_Abort(MPI_COMM_WORLD, st == DT_ERR_CONFIG ? 2 : 1);
    return 1;
  }
  if (rank == 0) printf("eval: checkpoint %s data %s batches %d B %d T %d loss %.9f\n", ckpt, data, batches, tr.B, tr.T, loss);
  dt_data_close(d);
  dt_trainer_free(&tr);
  MPI_Finalize();
  return 0;
}
