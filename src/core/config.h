/* Run configuration: the dt_config_t struct and the one table of keys that drives the .ini
 * parser, command-line overrides, validation, --help and the echo of the effective config. */
#ifndef DT_CONFIG_H
#define DT_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "status.h"

#define DT_PATH_MAX 1024
#define DT_NAME_MAX 32
#define DT_CONFIG_MAX_KEYS 96

typedef struct {
  /* [model] */
  int n_layer;       /* L */
  int n_head;        /* NH */
  int n_embd;        /* C */
  int vocab_size;    /* V (true vocabulary; padded internally to Vp, a multiple of 128) */
  int seq_len;       /* T (maximum context; also the training sequence length) */
  char arch[DT_NAME_MAX]; /* gpt2 | cnn | resnet18 | resnet50 (the image classifiers: cnn.h) */
  int classes;       /* image classes (the CNNs) */
  int width;         /* CNNs: channels of the first convolution / stage; 0 = the arch's default */
  int hidden;        /* cnn: units of the hidden linear layer */
  int zero_init_residual; /* resnets: each residual branch's last batch norm starts at weight 0 */
  int sync_bn;            /* image classifiers, dp > 1: batch norm's statistics over the dp group (else per rank) */
  /* [train] */
  int micro_batch;   /* B: sequences per rank per micro-step */
  int global_batch;  /* sequences per optimizer step over all ranks; 0 = micro_batch*grad_accum*dp */
  int grad_accum;    /* micro-steps per optimizer step; 0 = derived from global_batch */
  int steps;
  int stop_after;    /* stop this run (with a checkpoint) after this many steps; 0 = run to `steps` */
  double lr;
  double min_lr;
  int warmup;
  char lr_schedule[DT_NAME_MAX]; /* cosine | constant */
  double weight_decay;
  double beta1, beta2, eps;
  double grad_clip;  /* 0 = off */
  uint64_t seed;
  int eval_every;    /* 0 = off */
  int eval_batches;
  int threads;       /* OpenMP threads per rank; 0 = SLURM_CPUS_PER_TASK or OpenMP's default */
  int recompute;     /* train.recompute: activations recomputed in backward */
  int tf32;          /* system.tf32: CUDA fp32 matmuls on TF32 tensor cores */
  char device_comm[DT_NAME_MAX]; /* system.device_comm: nccl | mpi (device buffers over MPI, host-staged) */
  char precision[DT_NAME_MAX]; /* fp32 | bf16 | fp16 (precision.h) */
  double loss_scale_init;      /* fp16: initial dynamic loss scale (a power of two) */
  int loss_scale_window;       /* fp16: grow the scale after this many consecutive unskipped steps */
  char optimizer[DT_NAME_MAX]; /* adamw | sgd (the CNNs only) */
  double momentum;   /* sgd */
  int nesterov;      /* sgd */
  /* [data] */
  char train[DT_PATH_MAX]; /* glob of token shards */
  char val[DT_PATH_MAX];   /* glob of token shards, "" = none */
  int shuffle;             /* shuffle samples per epoch */
  char format[DT_NAME_MAX]; /* tokens | idx | cifar10 */
  char train_labels[DT_PATH_MAX], val_labels[DT_PATH_MAX]; /* idx: the labels files */
  int crop_pad;            /* images: random crop of the image padded by this many pixels; 0 = off */
  int flip;                /* images: random horizontal flips */
  /* [log] */
  char metrics[DT_PATH_MAX]; /* JSONL metrics file, "" = none */
  int log_every;
  int straggler_every; /* per-rank step time spread every N steps; -1 = every log_every, 0 = off */
  /* [parallel] */
  int dp;            /* 0 = auto (world / (tp*pp)) */
  int tp;
  int pp;
  int micro_batches; /* parallel.micro_batches: another name for grad_accum (0 = unset) */
  char pp_balance[DT_NAME_MAX]; /* params | compute (model.h dt_pp_balance_t) */
  int bucket_mb;     /* DDP gradient bucket size in MiB */
  char ddp_comm[DT_NAME_MAX]; /* parallel.ddp_comm: auto | shm | mpi */
  int ddp_probe;     /* every Nth step starts the all-reduce after backward (the overlap report); 0 = never */
  int zero;          /* ZeRO stage: 0 = plain DDP, 1 = AdamW state sharded over dp */
  /* [checkpoint] */
  char ckpt_dir[DT_PATH_MAX];
  int ckpt_every;    /* 0 = only on signal and at the end */
  int ckpt_keep;
  char resume[DT_PATH_MAX]; /* auto | never | PATH */
  /* [system] */
  char backend[DT_NAME_MAX]; /* auto | cpu | cuda */
  char attention[DT_NAME_MAX]; /* system.attention: matmul | flash (the CUDA backend's attention) */
  char store16[DT_NAME_MAX];   /* system.store16: auto | off (the CUDA backend's 16-bit storage) */
  char conv[DT_NAME_MAX];      /* system.conv: own | cudnn (the CUDA backend's convolutions) */
  char batchnorm[DT_NAME_MAX]; /* system.batchnorm: own | cudnn (the CUDA backend's batch norm in training) */
  char pool[DT_NAME_MAX];      /* system.pool: own | cudnn (the CUDA backend's max and global average pooling) */
  double comm_timeout;       /* hang watchdog: seconds one wait for other ranks may take; 0 = off */
  double comm_timeout_start; /* the same for the first collective of the job; 0 = comm_timeout */

  /* Where each key was last set, for messages: index = position in dt_config_keys. */
  char src_file[DT_PATH_MAX];    /* the .ini file loaded, "" if none */
  int key_line[DT_CONFIG_MAX_KEYS]; /* >0: line in src_file; -1: command line; 0: default */
} dt_config_t;

typedef enum { DT_KEY_INT, DT_KEY_U64, DT_KEY_FLOAT, DT_KEY_BOOL, DT_KEY_STR, DT_KEY_ENUM } dt_key_type_t;

typedef struct {
  const char *section;
  const char *key;
  dt_key_type_t type;
  size_t offset;        /* offsetof(dt_config_t, field) */
  size_t size;          /* field size (for strings) */
  const char *def;      /* default, parsed by the same code as user input */
  double min, max;      /* range for numbers */
  const char *choices;  /* "a|b|c" for enums */
  const char *help;
} dt_config_key_t;

/* The table, terminated by a {NULL} entry. */
extern const dt_config_key_t dt_config_keys[];

/* Fill every field with its table default. */
void dt_config_defaults(dt_config_t *cfg);
/* Parse an .ini file into cfg (on top of what is there). Errors: "file:line: key: problem". */
dt_status_t dt_config_load(dt_config_t *cfg, const char *path);
/* Parse an ini text held in memory; `name` is used in messages. */
dt_status_t dt_config_parse_text(dt_config_t *cfg, const char *text, const char *name);
/* Apply "section.key=value" (command line). */
dt_status_t dt_config_override(dt_config_t *cfg, const char *arg);
/* Check ranges already done by the parser; here cross-key consistency that needs no world size. */
dt_status_t dt_config_validate(const dt_config_t *cfg, const char *name);
/* Print every key with type, default, range and meaning. */
void dt_config_help(FILE *out);
/* The same table as man(7) markup (.SS per section, .TP per key), for dtrain --man. */
void dt_config_man(FILE *out);
/* text with man(7)'s special characters escaped (backslash, '-', a '.' or '\'' starting a line). */
void dt_man_text(FILE *out, const char *text);
/* Write the effective configuration as an .ini text (with `prefix` before every line). */
void dt_config_write(const dt_config_t *cfg, FILE *out, const char *prefix);
/* The same into a malloc'd string (caller frees). */
char *dt_config_to_string(const dt_config_t *cfg);

/* Padded vocabulary: V rounded up to a multiple of 128. */
int dt_config_padded_vocab(const dt_config_t *cfg);

#endif
