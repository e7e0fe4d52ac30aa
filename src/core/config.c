/* The configuration table and everything it drives: .ini parsing, command-line overrides,
 * range and consistency checks, --help, and writing the effective configuration back out. */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define OFF(f) offsetof(dt_config_t, f), sizeof(((dt_config_t *)0)->f)
#define BIG 1e18

/* clang-format off */
const dt_config_key_t dt_config_keys[] = {
  {"model", "n_layer",    DT_KEY_INT,   OFF(n_layer),    "4",    1, 1024, NULL, "transformer blocks (L)"},
  {"model", "n_head",     DT_KEY_INT,   OFF(n_head),     "4",    1, 1024, NULL, "attention heads (NH); n_embd must divide by it"},
  {"model", "n_embd",     DT_KEY_INT,   OFF(n_embd),     "128",  1, 65536, NULL, "embedding width (C)"},
  {"model", "vocab_size", DT_KEY_INT,   OFF(vocab_size), "256",  2, 1 << 24, NULL, "vocabulary size V (padded to a multiple of 128 internally)"},
  {"model", "seq_len",    DT_KEY_INT,   OFF(seq_len),    "64",   1, 1 << 20, NULL, "sequence length T (also the position table size)"},
  {"model", "arch",       DT_KEY_ENUM,  OFF(arch),       "gpt2", 0, 0, "gpt2|cnn|resnet18|resnet50", "the network: GPT-2 (the keys above), or an image classifier trained on data.format = idx|cifar10: cnn (2 x conv-BN-ReLU-maxpool, 2 linear layers), resnet18 / resnet50 (torchvision's, CIFAR stem); the classifiers train with data parallelism (batch norm synchronised: model.sync_bn), ZeRO 1-3 and bf16/fp16, on the cpu and cuda backends (no tp or pp yet: README, Status)"},
  {"model", "classes",    DT_KEY_INT,   OFF(classes),    "10", 2, 1 << 20, NULL, "image classifiers: classes (labels must be below it)"},
  {"model", "width",      DT_KEY_INT,   OFF(width),      "0", 0, 1 << 16, NULL, "image classifiers: channels of cnn's first convolution (the second has twice as many) or of a resnet's stem and first stage; 0 = 32 for cnn, 64 for the resnets (torchvision's)"},
  {"model", "hidden",     DT_KEY_INT,   OFF(hidden),     "128", 1, 1 << 20, NULL, "cnn: units of the hidden linear layer"},
  {"model", "sync_bn", DT_KEY_BOOL, OFF(sync_bn), "true", 0, 0, NULL, "image classifiers with dp > 1: batch norm's training statistics over the whole global batch, summed over the dp ranks (torch.nn.SyncBatchNorm; dp = N x B trains as dp = 1 x N*B); false = each rank's own micro-batch (plain BatchNorm under PyTorch DDP), rank 0's running statistics broadcast to the others after every step (DDP's broadcast_buffers)"},
  {"model", "zero_init_residual", DT_KEY_BOOL, OFF(zero_init_residual), "false", 0, 0, NULL, "resnets: every residual branch's last batch norm starts at weight 0 (torchvision's zero_init_residual)"},

  {"train", "micro_batch",  DT_KEY_INT,   OFF(micro_batch),  "8",   1, 1 << 20, NULL, "sequences per rank per micro-step (B)"},
  {"train", "global_batch", DT_KEY_INT,   OFF(global_batch), "0",   0, 1 << 30, NULL, "sequences per optimizer step over all ranks; 0 = micro_batch*grad_accum*dp"},
  {"train", "grad_accum",   DT_KEY_INT,   OFF(grad_accum),   "0",   0, 1 << 20, NULL, "micro-steps per optimizer step; 0 = from global_batch (1 if both 0)"},
  {"train", "steps",        DT_KEY_INT,   OFF(steps),        "100", 0, 1 << 30, NULL, "optimizer steps to run"},
  {"train", "stop_after",   DT_KEY_INT,   OFF(stop_after),   "0",   0, 1 << 30, NULL, "end this run with a checkpoint after N steps (the schedule still spans `steps`); 0 = off"},
  {"train", "lr",           DT_KEY_FLOAT, OFF(lr),           "3e-4", 0, 10, NULL, "peak learning rate"},
  {"train", "min_lr",       DT_KEY_FLOAT, OFF(min_lr),       "0",   0, 10, NULL, "learning rate at the end of the cosine schedule"},
  {"train", "warmup",       DT_KEY_INT,   OFF(warmup),       "0",   0, 1 << 30, NULL, "linear warmup steps: lr*(step+1)/warmup for step < warmup"},
  {"train", "lr_schedule",  DT_KEY_ENUM,  OFF(lr_schedule),  "cosine", 0, 0, "cosine|constant", "after warmup: cosine from lr down to min_lr at step `steps` (README), or constant"},
  {"train", "weight_decay", DT_KEY_FLOAT, OFF(weight_decay), "0.1", 0, 10, NULL, "weight decay: GPT-2, AdamW's decoupled decay on 2-D weights (embeddings included); the image classifiers, every parameter (train.optimizer)"},
  {"train", "beta1",        DT_KEY_FLOAT, OFF(beta1),        "0.9", 0, 0.999999, NULL, "AdamW beta1"},
  {"train", "beta2",        DT_KEY_FLOAT, OFF(beta2),        "0.95", 0, 0.999999999, NULL, "AdamW beta2"},
  {"train", "eps",          DT_KEY_FLOAT, OFF(eps),          "1e-8", 0, 1, NULL, "AdamW epsilon"},
  {"train", "grad_clip",    DT_KEY_FLOAT, OFF(grad_clip),    "1.0", 0, BIG, NULL, "clip the global gradient norm to this; 0 = off"},
  {"train", "seed",         DT_KEY_U64,   OFF(seed),         "1337", 0, BIG, NULL, "seed for weight init and data shuffling"},
  {"train", "eval_every",   DT_KEY_INT,   OFF(eval_every),   "0",   0, 1 << 30, NULL, "validation loss every N steps (and at the end); 0 = off"},
  {"train", "eval_batches", DT_KEY_INT,   OFF(eval_batches), "8",   1, 1 << 20, NULL, "micro-batches per validation"},
  {"train", "recompute",    DT_KEY_BOOL,  OFF(recompute),    "false", 0, 0, NULL, "activation recomputation (both backends): keep only each block's output and recompute the block's activations in backward; one more forward of compute per step, bitwise the same results; activations kept per block B*T*C floats instead of (16C + NH + 4)*B*T (dtrain plan shows both)"},
  {"train", "threads",      DT_KEY_INT,   OFF(threads),      "0",   0, 4096, NULL, "OpenMP threads per rank; 0 = SLURM_CPUS_PER_TASK, else OMP_NUM_THREADS, else the rank's CPUs"},
  {"train", "precision",    DT_KEY_ENUM,  OFF(precision),    "fp32", 0, 0, "fp32|bf16|fp16", "storage precision of working weights, activations and activation gradients (fp32 master weights, AdamW state and gradient accumulation in every mode); fp16 adds dynamic loss scaling (README: Mixed precision)"},
  {"train", "loss_scale_init",   DT_KEY_FLOAT, OFF(loss_scale_init),   "65536", 1, 1e30, NULL, "fp16 only: initial loss scale, a power of two (GradScaler init_scale)"},
  {"train", "loss_scale_window", DT_KEY_INT,   OFF(loss_scale_window), "2000", 1, 1 << 30, NULL, "fp16 only: double the loss scale after this many consecutive steps without inf/NaN gradients (GradScaler growth_interval); a step with inf/NaN on any rank is skipped and halves it"},
  {"train", "optimizer",    DT_KEY_ENUM,  OFF(optimizer),    "adamw", 0, 0, "adamw|sgd", "image classifiers: AdamW (beta1, beta2, eps) or SGD with momentum (torch.optim.SGD); both decay every parameter by weight_decay (SGD: added to the gradient, AdamW: decoupled); GPT-2 trains with AdamW"},
  {"train", "momentum",     DT_KEY_FLOAT, OFF(momentum),     "0", 0, 0.999999, NULL, "sgd: momentum (torch.optim.SGD's; 0 = plain SGD)"},
  {"train", "nesterov",     DT_KEY_BOOL,  OFF(nesterov),     "false", 0, 0, NULL, "sgd: Nesterov momentum"},

  {"data", "train",   DT_KEY_STR,  OFF(train),   "data/austen_train_*.bin", 0, 0, NULL, "training data (data.format): a glob of token shards (llm.c format), an IDX images file, or a glob of CIFAR-10 batch files"},
  {"data", "val",     DT_KEY_STR,  OFF(val),     "", 0, 0, NULL, "validation data in the same form as train; empty = none"},
  {"data", "shuffle", DT_KEY_BOOL, OFF(shuffle), "true", 0, 0, NULL, "shuffle training samples each epoch (seeded)"},
  {"data", "format",  DT_KEY_ENUM, OFF(format),  "tokens", 0, 0, "tokens|idx|cifar10", "tokens: llm.c token shards (GPT-2); idx: MNIST / Fashion-MNIST IDX images (gzip or plain) in train / val with their labels in train_labels / val_labels; cifar10: CIFAR-10 binary batch files (a glob each) in train / val; image sets are normalised per channel with the training set's mean and standard deviation"},
  {"data", "train_labels", DT_KEY_STR, OFF(train_labels), "", 0, 0, NULL, "idx: the training labels file"},
  {"data", "val_labels",   DT_KEY_STR, OFF(val_labels),   "", 0, 0, NULL, "idx: the validation labels file"},
  {"data", "crop_pad", DT_KEY_INT,  OFF(crop_pad), "0", 0, 64, NULL, "images: random crop of each training image padded by this many zero pixels each side (torchvision RandomCrop(size, padding)); 0 = off"},
  {"data", "flip",     DT_KEY_BOOL, OFF(flip),     "false", 0, 0, NULL, "images: random horizontal flip of each training image (p = 1/2)"},

  {"log", "metrics", DT_KEY_STR, OFF(metrics),   "", 0, 0, NULL, "JSONL metrics file written by rank 0; with {rank} in the name every rank writes its own; empty = none"},
  {"log", "every",   DT_KEY_INT, OFF(log_every), "1", 1, 1 << 30, NULL, "print a step row every N steps"},
  {"log", "straggler_every", DT_KEY_INT, OFF(straggler_every), "-1", -1, 1 << 30, NULL, "every N steps rank 0 prints the min, median and max over ranks of the step time outside communication waits and the slowest rank (a `# straggler:` line; the same fields in that step's JSONL row); -1 = every log.every steps, 0 = off"},

  {"parallel", "dp",        DT_KEY_INT, OFF(dp),        "0", 0, 1 << 20, NULL, "data-parallel ranks; 0 = auto (world size / (tp*pp))"},
  {"parallel", "tp",        DT_KEY_INT, OFF(tp),        "1", 1, 1 << 20, NULL, "tensor-parallel ranks (Megatron-style, both backends; must divide n_head and the padded vocab)"},
  {"parallel", "pp",        DT_KEY_INT, OFF(pp),        "1", 1, 1 << 20, NULL, "pipeline-parallel stages (both backends; at most n_layer): contiguous blocks balanced by parameter count, embeddings on the first stage, ln_f and the tied lm_head on the last, 1F1B schedule; with zero <= 2"},
  {"parallel", "pp_balance", DT_KEY_ENUM, OFF(pp_balance), "params", 0, 0, "params|compute", "what pipeline stages balance: parameters (memory; the embeddings count on the first stage, ln_f and the wte copy on the last) or training FLOPs per token (the lm_head counts, the embedding lookup does not: faster steps, more memory on the first stage)"},
  {"parallel", "micro_batches", DT_KEY_INT, OFF(micro_batches), "0", 0, 1 << 20, NULL, "micro-batches per optimizer step that 1F1B pipelines (bubble (pp-1)/(micro_batches+pp-1)): another name for train.grad_accum; 0 = from it or global_batch"},
  {"parallel", "zero",      DT_KEY_INT, OFF(zero),      "0", 0, 3, NULL, "ZeRO stage over the dp group: 0 = DDP (full state on every rank), 1 = AdamW m, v sharded (gradients reduce-scattered, each rank updates its shard, parameters all-gathered); 2 = gradients sharded too (each bucket reduced to its owners during backward, the rest freed); 3 (FSDP) = parameters sharded too (each block, for the image classifiers each parameter tensor, gathered before its forward and backward, the next one prefetched, freed after; with bf16/fp16 the working copy is what is gathered, the fp32 master stays sharded); the cuda backend runs every stage over NCCL, stages 2 and 3 with device memory only where in use (CUDA virtual memory; not yet run on a GPU)"},
  {"parallel", "bucket_mb", DT_KEY_INT, OFF(bucket_mb), "25", 1, 1 << 16, NULL, "gradient all-reduce bucket size in MiB"},
  {"parallel", "ddp_comm",  DT_KEY_ENUM, OFF(ddp_comm), "auto", 0, 0, "auto|shm|mpi", "how DDP (zero = 0, dp > 1) averages the gradients of the cpu backend: shm = in shared memory, each rank averaging its claim of every finished bucket straight from all dp ranks' gradient arenas (one pass, no copies; the arenas live in /dev/shm; needs all dp ranks on one node); mpi = MPI's nonblocking all-reduce per bucket, tested between layers; auto = shm when all dp ranks share a node and /dev/shm has room, else mpi; the start line says which. The cuda backend uses system.device_comm"},
  {"parallel", "ddp_probe", DT_KEY_INT, OFF(ddp_probe), "10", 0, 1 << 30, NULL, "every Nth step from step 2 (zero = 0, dp > 1) starts the gradient all-reduce after backward instead of during it (same sums), so the end-of-run '# ddp:' line compares the two and says how much of the all-reduce the overlap hides; 0 = never (the line then gives only the wait)"},

  {"checkpoint", "dir",    DT_KEY_STR, OFF(ckpt_dir),   "checkpoints", 0, 0, NULL, "directory for checkpoint files; empty = no checkpoints (none written, whatever every says; resume = auto starts fresh)"},
  {"checkpoint", "every",  DT_KEY_INT, OFF(ckpt_every), "0", 0, 1 << 30, NULL, "write a checkpoint every N steps; 0 = only at the end"},
  {"checkpoint", "keep",   DT_KEY_INT, OFF(ckpt_keep),  "3", 1, 1 << 20, NULL, "keep the newest K checkpoints"},
  {"checkpoint", "resume", DT_KEY_STR, OFF(resume),     "auto", 0, 0, NULL, "auto (newest complete checkpoint in dir) | never | PATH"},

  {"system", "backend", DT_KEY_ENUM, OFF(backend), "auto", 0, 0, "auto|cpu|cuda", "compute backend; auto = cuda when built in and every rank has a usable GPU, else cpu (with a note)"},
  {"system", "attention", DT_KEY_ENUM, OFF(attention), "matmul", 0, 0, "matmul|flash|cudnn", "cuda backend's attention: matmul = cuBLAS products over the (B, NH, T, T) probabilities, kept for backward; flash = our fused kernels (cuda/attention.cu): only the row log-sum-exp (B, NH, T) kept, backward recomputes the probabilities, far less memory; its first version ran 9.4x slower than matmul on an H200 (docs/gpu-runs.md), the tiled rewrite is not measured yet (so not the default); cudnn = cuDNN's fused attention (cuda/attention_cudnn.cpp), for train.precision = bf16 or fp16 only: on the model's 16-bit buffers with system.store16 = auto, else on 16-bit copies of q, k, v (the same memory as flash plus copies of one block's tensors); never run on a GPU yet (not the default); the cpu backend's attention is flash-style whatever this says"},
  {"system", "device_comm", DT_KEY_ENUM, OFF(device_comm), "nccl", 0, 0, "nccl|mpi", "cuda backend's communication of device buffers (gradients, ZeRO shards, tp all-reduces, pp transfers): nccl = NCCL on the GPUs' streams; mpi = the MPI communicators, each call staged through pinned host memory (for MPIs or fabrics without NCCL; two copies per call and no overlap with compute, so slower); the start line says which, and whether MPI reports itself CUDA-aware (dtrain stages either way)"},
  {"system", "conv", DT_KEY_ENUM, OFF(conv), "own", 0, 0, "own|cudnn", "cuda backend's convolutions (image classifiers): own = im2col + cuBLAS (cuda/backend_cuda_cnn.cu); cudnn = cuDNN (loaded at run time, deterministic algorithms only; checked on the CUDA emulation's cuDNN, NOT YET RUN ON A GPU, so not the default); the cpu backend and GPT-2 ignore it"},
  {"system", "batchnorm", DT_KEY_ENUM, OFF(batchnorm), "own", 0, 0, "own|cudnn", "cuda backend's batch norm in training (image classifiers): own = cuda/kernels_cnn.cu's (the ReLU fused, synchronised batch norm possible); cudnn = cuDNN's (per-rank statistics only: with dp > 1 it needs model.sync_bn = false; checked on the CUDA emulation's cuDNN, NOT YET RUN ON A GPU); the cpu backend and GPT-2 ignore it"},
  {"system", "pool", DT_KEY_ENUM, OFF(pool), "own", 0, 0, "own|cudnn", "cuda backend's max and global average pooling (image classifiers): own = cuda/kernels_cnn.cu's (max pooling keeps its argmax for backward); cudnn = cuDNN's (deterministic max pooling, whose backward finds the maximum again in the pooling's input and output; checked on the CUDA emulation's cuDNN, NOT YET RUN ON A GPU); the cpu backend and GPT-2 ignore it"},
  {"system", "tf32", DT_KEY_BOOL, OFF(tf32), "false", 0, 0, NULL, "cuda backend: matmuls of fp32 storage on TF32 tensor cores (inputs rounded to 10 mantissa bits, fp32 accumulation), as torch.backends.cuda.matmul.allow_tf32; off by default, as in PyTorch; the cpu backend computes in fp32 whatever this says"},
  {"system", "store16", DT_KEY_ENUM, OFF(store16), "auto", 0, 0, "auto|off", "cuda backend with train.precision = bf16 or fp16: auto = activations, activation gradients and the weights' working copy stored in 16 bits (half the memory and traffic; products on 16-bit operands with fp32 accumulation, fp32 master weights, gradients and AdamW state) where it is implemented: system.attention = flash or cudnn (tensor parallelism sums its partial products in fp32 before they are stored); elsewhere, and with off, float values rounded to the precision (what the cpu backend always does; the same numbers). The start line says which. Not yet run on a GPU"},
  {"system", "comm_timeout", DT_KEY_FLOAT, OFF(comm_timeout), "300", 0, 1e7, NULL, "hang watchdog: seconds a rank may wait in one collective, point-to-point transfer or checkpoint barrier; past it the job ends with one line naming the rank, step, operation and the ranks that did not arrive, exit status 75 (requeue); keep it above the longest checkpoint write; 0 = off"},
  {"system", "comm_timeout_start", DT_KEY_FLOAT, OFF(comm_timeout_start), "120", 0, 1e7, NULL, "hang watchdog: the deadline of the first collective after start (a rank that never arrives); 0 = comm_timeout"},
  {NULL, NULL, 0, 0, 0, NULL, 0, 0, NULL, NULL},
};
/* clang-format on */

static const char *type_name(dt_key_type_t t) {
  switch (t) {
    case DT_KEY_INT: return "int";
    case DT_KEY_U64: return "uint64";
    case DT_KEY_FLOAT: return "float";
    case DT_KEY_BOOL: return "bool";
    case DT_KEY_STR: return "string";
    case DT_KEY_ENUM: return "enum";
  }
  return "?";
}

static int key_index(const char *section, const char *key) {
  for (int i = 0; dt_config_keys[i].key; i++)
    if (strcmp(dt_config_keys[i].section, section) == 0 && strcmp(dt_config_keys[i].key, key) == 0)
      return i;
  return -1;
}

static int section_known(const char *section) {
  for (int i = 0; dt_config_keys[i].key; i++)
    if (strcmp(dt_config_keys[i].section, section) == 0) return 1;
  return 0;
}

static int choice_ok(const char *choices, const char *v) {
  size_t n = strlen(v);
  for (const char *p = choices; *p;) {
    const char *bar = strchr(p, '|');
    size_t len = bar ? (size_t)(bar - p) : strlen(p);
    if (len == n && strncmp(p, v, n) == 0) return 1;
    p += len + (bar ? 1 : 0);
  }
  return 0;
}

/* Parse `val` into the field of key k. On failure write the problem into why. */
static int set_value(dt_config_t *cfg, const dt_config_key_t *k, const char *val, char *why, size_t whylen) {
  char *field = (char *)cfg + k->offset;
  char *end = NULL;
  errno = 0;
  switch (k->type) {
    case DT_KEY_INT: {
      long v = strtol(val, &end, 10);
      if (*val == '\0' || *end != '\0' || errno) {
        snprintf(why, whylen, "'%s' is not an integer", val);
        return 0;
      }
      if ((double)v < k->min || (double)v > k->max) {
        snprintf(why, whylen, "%ld is out of range [%.0f, %.0f]", v, k->min, k->max);
        return 0;
      }
      *(int *)field = (int)v;
      return 1;
    }
    case DT_KEY_U64: {
      if (*val == '-') {
        snprintf(why, whylen, "'%s' is not a non-negative integer", val);
        return 0;
      }
      unsigned long long v = strtoull(val, &end, 10);
      if (*val == '\0' || *end != '\0' || errno) {
        snprintf(why, whylen, "'%s' is not a non-negative integer", val);
        return 0;
      }
      *(uint64_t *)field = (uint64_t)v;
      return 1;
    }
    case DT_KEY_FLOAT: {
      double v = strtod(val, &end);
      if (*val == '\0' || *end != '\0' || errno || !isfinite(v)) {
        snprintf(why, whylen, "'%s' is not a number", val);
        return 0;
      }
      if (v < k->min || v > k->max) {
        snprintf(why, whylen, "%g is out of range [%g, %g]", v, k->min, k->max);
        return 0;
      }
      *(double *)field = v;
      return 1;
    }
    case DT_KEY_BOOL: {
      if (!strcmp(val, "true") || !strcmp(val, "1") || !strcmp(val, "yes") || !strcmp(val, "on")) {
        *(int *)field = 1;
        return 1;
      }
      if (!strcmp(val, "false") || !strcmp(val, "0") || !strcmp(val, "no") || !strcmp(val, "off")) {
        *(int *)field = 0;
        return 1;
      }
      snprintf(why, whylen, "'%s' is not a boolean (true/false)", val);
      return 0;
    }
    case DT_KEY_ENUM:
      if (!choice_ok(k->choices, val)) {
        snprintf(why, whylen, "'%s' is not one of %s", val, k->choices);
        return 0;
      }
      /* fall through */
    case DT_KEY_STR:
      if (strlen(val) >= k->size) {
        snprintf(why, whylen, "value is longer than %zu characters", k->size - 1);
        return 0;
      }
      strcpy(field, val);
      return 1;
  }
  snprintf(why, whylen, "internal: unknown key type");
  return 0;
}

void dt_config_defaults(dt_config_t *cfg) {
  memset(cfg, 0, sizeof *cfg);
  char why[256];
  for (int i = 0; dt_config_keys[i].key; i++) {
    int ok = set_value(cfg, &dt_config_keys[i], dt_config_keys[i].def, why, sizeof why);
    (void)ok; /* the table's own defaults are checked by test_config */
  }
}

static char *trim(char *s) {
  while (isspace((unsigned char)*s)) s++;
  char *e = s + strlen(s);
  while (e > s && isspace((unsigned char)e[-1])) *--e = '\0';
  return s;
}

dt_status_t dt_config_parse_text(dt_config_t *cfg, const char *text, const char *name) {
  char section[64] = "";
  int lineno = 0;
  const char *p = text;
  char buf[4096];
  while (*p) {
    const char *nl = strchr(p, '\n');
    size_t len = nl ? (size_t)(nl - p) : strlen(p);
    lineno++;
    if (len >= sizeof buf)
      return DT_ERR(DT_ERR_CONFIG, "%s:%d: line is longer than %zu characters", name, lineno, sizeof buf - 1);
    memcpy(buf, p, len);
    buf[len] = '\0';
    p += len + (nl ? 1 : 0);
    /* comments: whole-line # or ;, and " #" / " ;" after a value */
    for (char *c = buf; *c; c++) {
      if ((*c == '#' || *c == ';') && (c == buf || isspace((unsigned char)c[-1]))) {
        *c = '\0';
        break;
      }
    }
    char *s = trim(buf);
    if (*s == '\0') continue;
    if (*s == '[') {
      char *close = strchr(s, ']');
      if (!close || close[1] != '\0')
        return DT_ERR(DT_ERR_CONFIG, "%s:%d: malformed section header '%s'", name, lineno, s);
      *close = '\0';
      char *sec = trim(s + 1);
      if (!section_known(sec))
        return DT_ERR(DT_ERR_CONFIG, "%s:%d: [%s]: unknown section", name, lineno, sec);
      snprintf(section, sizeof section, "%s", sec);
      continue;
    }
    char *eq = strchr(s, '=');
    if (!eq) return DT_ERR(DT_ERR_CONFIG, "%s:%d: expected 'key = value', got '%s'", name, lineno, s);
    *eq = '\0';
    char *key = trim(s), *val = trim(eq + 1);
    /* optional quotes around a value */
    size_t vl = strlen(val);
    if (vl >= 2 && val[0] == '"' && val[vl - 1] == '"') {
      val[vl - 1] = '\0';
      val++;
    }
    if (section[0] == '\0')
      return DT_ERR(DT_ERR_CONFIG, "%s:%d: %s: key outside of any [section]", name, lineno, key);
    int i = key_index(section, key);
    if (i < 0) return DT_ERR(DT_ERR_CONFIG, "%s:%d: %s.%s: unknown key", name, lineno, section, key);
    char why[256];
    if (!set_value(cfg, &dt_config_keys[i], val, why, sizeof why))
      return DT_ERR(DT_ERR_CONFIG, "%s:%d: %s.%s: %s", name, lineno, section, key, why);
    cfg->key_line[i] = lineno;
  }
  return DT_OK;
}

dt_status_t dt_config_load(dt_config_t *cfg, const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return DT_ERR(DT_ERR_CONFIG, "%s: cannot open: %s", path, strerror(errno));
  if (fseek(f, 0, SEEK_END) != 0) {
    fclose(f);
    return DT_ERR(DT_ERR_CONFIG, "%s: cannot read", path);
  }
  long n = ftell(f);
  rewind(f);
  if (n < 0 || n > (1 << 20)) {
    fclose(f);
    return DT_ERR(DT_ERR_CONFIG, "%s: not a configuration file (size %ld)", path, n);
  }
  char *text = malloc((size_t)n + 1);
  if (!text) {
    fclose(f);
    return DT_ERR(DT_ERR_NOMEM, "%s: out of memory", path);
  }
  size_t got = fread(text, 1, (size_t)n, f);
  fclose(f);
  text[got] = '\0';
  if (strlen(text) != got) {
    free(text);
    return DT_ERR(DT_ERR_CONFIG, "%s: contains a NUL byte (not a text file)", path);
  }
  snprintf(cfg->src_file, sizeof cfg->src_file, "%s", path);
  dt_status_t st = dt_config_parse_text(cfg, text, path);
  free(text);
  return st;
}

dt_status_t dt_config_override(dt_config_t *cfg, const char *arg) {
  const char *dot = strchr(arg, '.');
  const char *eq = strchr(arg, '=');
  if (!dot || !eq || dot > eq)
    return DT_ERR(DT_ERR_CONFIG, "command line: '%s': expected section.key=value", arg);
  char section[64], key[64];
  size_t sl = (size_t)(dot - arg), kl = (size_t)(eq - dot - 1);
  if (sl >= sizeof section || kl >= sizeof key)
    return DT_ERR(DT_ERR_CONFIG, "command line: '%s': name too long", arg);
  memcpy(section, arg, sl);
  section[sl] = '\0';
  memcpy(key, dot + 1, kl);
  key[kl] = '\0';
  if (!section_known(section)) return DT_ERR(DT_ERR_CONFIG, "command line: [%s]: unknown section", section);
  int i = key_index(section, key);
  if (i < 0) return DT_ERR(DT_ERR_CONFIG, "command line: %s.%s: unknown key", section, key);
  char why[256];
  if (!set_value(cfg, &dt_config_keys[i], eq + 1, why, sizeof why))
    return DT_ERR(DT_ERR_CONFIG, "command line: %s.%s: %s", section, key, why);
  cfg->key_line[i] = -1;
  return DT_OK;
}

/* "file:line: section.key" or "command line: section.key" for the place a key was set. */
static void where(const dt_config_t *cfg, const char *name, const char *section, const char *key, char *out,
                  size_t n) {
  int i = key_index(section, key);
  int line = i >= 0 ? cfg->key_line[i] : 0;
  if (line > 0)
    snprintf(out, n, "%s:%d: %s.%s", name, line, section, key);
  else if (line < 0)
    snprintf(out, n, "command line: %s.%s", section, key);
  else
    snprintf(out, n, "%s: %s.%s (default)", name, section, key);
}

/* The image classifiers (model.arch != gpt2): their data formats, and what they do not have yet. */
static dt_status_t validate_images(const dt_config_t *cfg, const char *name, char *w, size_t wn) {
  const int gpt2 = !strcmp(cfg->arch, "gpt2"), tokens = !strcmp(cfg->format, "tokens");
  if (gpt2 != tokens) {
    where(cfg, name, "data", "format", w, wn);
    return DT_ERR(DT_ERR_CONFIG, "%s: %s data for model.arch = %s (gpt2 reads tokens; cnn, resnet18, resnet50 read idx "
                  "or cifar10)", w, cfg->format, cfg->arch);
  }
  if (gpt2) return DT_OK;
  if (!strcmp(cfg->format, "idx") && (!cfg->train_labels[0] || (cfg->val[0] && !cfg->val_labels[0]))) {
    where(cfg, name, "data", cfg->train_labels[0] ? "val_labels" : "train_labels", w, wn);
    return DT_ERR(DT_ERR_CONFIG, "%s: data.format = idx needs the labels file of each image file", w);
  }
  struct { const char *section, *key; int bad; const char *what; } no[] = {
    {"parallel", "tp", cfg->tp > 1, "tensor parallelism is"},
    {"parallel", "pp", cfg->pp > 1, "pipeline parallelism is"},
    {"train", "recompute", cfg->recompute, "recomputation is"},
  };
  for (size_t i = 0; i < sizeof no / sizeof no[0]; i++)
    if (no[i].bad) {
      where(cfg, name, no[i].section, no[i].key, w, wn);
      return DT_ERR(DT_ERR_CONFIG, "%s: %s not implemented for the image classifiers yet (model.arch = %s trains "
                    "with data parallelism and ZeRO 1-3)", w, no[i].what, cfg->arch);
    }
  return DT_OK;
}

dt_status_t dt_config_validate(const dt_config_t *cfg, const char *name) {
  char w[DT_PATH_MAX + 128];
  DT_TRY(validate_images(cfg, name, w, sizeof w));
  if (cfg->n_embd % cfg->n_head != 0) {
    where(cfg, name, "model", "n_embd", w, sizeof w);
    return DT_ERR(DT_ERR_CONFIG, "%s: n_embd %d is not divisible by n_head %d", w, cfg->n_embd, cfg->n_head);
  }
  if (cfg->global_batch > 0 && cfg->global_batch % cfg->micro_batch != 0) {
    where(cfg, name, "train", "global_batch", w, sizeof w);
    return DT_ERR(DT_ERR_CONFIG, "%s: %d is not a multiple of micro_batch %d", w, cfg->global_batch,
                  cfg->micro_batch);
  }
  if (cfg->global_batch > 0 && cfg->grad_accum > 0 && cfg->global_batch % (cfg->micro_batch * cfg->grad_accum)) {
    where(cfg, name, "train", "global_batch", w, sizeof w);
    return DT_ERR(DT_ERR_CONFIG, "%s: %d is not a multiple of micro_batch*grad_accum = %d", w,
                  cfg->global_batch, cfg->micro_batch * cfg->grad_accum);
  }
  if (cfg->min_lr > cfg->lr) {
    where(cfg, name, "train", "min_lr", w, sizeof w);
    return DT_ERR(DT_ERR_CONFIG, "%s: %g is larger than lr %g", w, cfg->min_lr, cfg->lr);
  }
  if (cfg->train[0] == '\0') {
    where(cfg, name, "data", "train", w, sizeof w);
    return DT_ERR(DT_ERR_CONFIG, "%s: must name the training shards", w);
  }
  int exp2 = 0;
  if (frexp(cfg->loss_scale_init, &exp2) != 0.5) {
    where(cfg, name, "train", "loss_scale_init", w, sizeof w);
    return DT_ERR(DT_ERR_CONFIG, "%s: %g is not a power of two (unscaling must be exact)", w, cfg->loss_scale_init);
  }
  if (cfg->pp > cfg->n_layer) {
    where(cfg, name, "parallel", "pp", w, sizeof w);
    return DT_ERR(DT_ERR_CONFIG, "%s: %d stages for model.n_layer = %d blocks (each stage needs at least one)", w,
                  cfg->pp, cfg->n_layer);
  }
  if (cfg->pp > 1 && cfg->zero > 2) {
    where(cfg, name, "parallel", "zero", w, sizeof w);
    return DT_ERR(DT_ERR_CONFIG, "%s: ZeRO stage %d with parallel.pp = %d is not implemented yet (zero <= 2 with pp > 1)",
                  w, cfg->zero, cfg->pp);
  }
  if (cfg->micro_batches > 0 && cfg->grad_accum > 0 && cfg->micro_batches != cfg->grad_accum) {
    where(cfg, name, "parallel", "micro_batches", w, sizeof w);
    return DT_ERR(DT_ERR_CONFIG, "%s: %d disagrees with train.grad_accum = %d (the same number: give one)", w,
                  cfg->micro_batches, cfg->grad_accum);
  }
  if (cfg->tp > 1 && (cfg->n_head % cfg->tp != 0 || dt_config_padded_vocab(cfg) % cfg->tp != 0)) {
    where(cfg, name, "parallel", "tp", w, sizeof w);
    return DT_ERR(DT_ERR_CONFIG, "%s: %d must divide model.n_head %d and the padded vocab %d", w, cfg->tp, cfg->n_head,
                  dt_config_padded_vocab(cfg));
  }
  return DT_OK;
}

static void format_value(const dt_config_t *cfg, const dt_config_key_t *k, char *out, size_t n) {
  const char *field = (const char *)cfg + k->offset;
  switch (k->type) {
    case DT_KEY_INT: snprintf(out, n, "%d", *(const int *)field); break;
    case DT_KEY_U64: snprintf(out, n, "%" PRIu64, *(const uint64_t *)field); break;
    case DT_KEY_FLOAT: snprintf(out, n, "%.9g", *(const double *)field); break;
    case DT_KEY_BOOL: snprintf(out, n, "%s", *(const int *)field ? "true" : "false"); break;
    case DT_KEY_STR:
    case DT_KEY_ENUM: snprintf(out, n, "%s", field); break;
  }
}

void dt_config_help(FILE *out) {
  const char *sec = "";
  for (int i = 0; dt_config_keys[i].key; i++) {
    const dt_config_key_t *k = &dt_config_keys[i];
    if (strcmp(sec, k->section) != 0) {
      fprintf(out, "\n[%s]\n", k->section);
      sec = k->section;
    }
    char range[96] = "";
    if (k->type == DT_KEY_INT || k->type == DT_KEY_FLOAT) {
      if (k->max >= BIG)
        snprintf(range, sizeof range, k->type == DT_KEY_INT ? " >= %.0f" : " >= %g", k->min);
      else
        snprintf(range, sizeof range, k->type == DT_KEY_INT ? " in [%.0f, %.0f]" : " in [%g, %g]", k->min, k->max);
    } else if (k->type == DT_KEY_ENUM) {
      snprintf(range, sizeof range, " one of %s", k->choices);
    }
    fprintf(out, "  %-13s %-6s default \"%s\"%s\n      %s\n", k->key, type_name(k->type), k->def, range, k->help);
  }
}

void dt_man_text(FILE *out, const char *text) {
  for (const char *c = text; *c; c++) {
    if ((*c == '.' || *c == '\'') && (c == text || c[-1] == '\n')) fputs("\\&", out);
    if (*c == '\\')
      fputs("\\e", out);
    else if (*c == '-')
      fputs("\\-", out);
    else
      fputc(*c, out);
  }
}

void dt_config_man(FILE *out) {
  const char *sec = "";
  for (int i = 0; dt_config_keys[i].key; i++) {
    const dt_config_key_t *k = &dt_config_keys[i];
    if (strcmp(sec, k->section) != 0) {
      fprintf(out, ".SS [%s]\n", k->section);
      sec = k->section;
    }
    char range[96] = "";
    if (k->type == DT_KEY_INT || k->type == DT_KEY_FLOAT) {
      if (k->max >= BIG)
        snprintf(range, sizeof range, k->type == DT_KEY_INT ? ", >= %.0f" : ", >= %g", k->min);
      else
        snprintf(range, sizeof range, k->type == DT_KEY_INT ? ", in [%.0f, %.0f]" : ", in [%g, %g]", k->min, k->max);
    } else if (k->type == DT_KEY_ENUM) {
      snprintf(range, sizeof range, ", one of %s", k->choices);
    }
    char head[256];
    snprintf(head, sizeof head, "%s (%s, default \"%s\"%s)", k->key, type_name(k->type), k->def, range);
    fputs(".TP\n.B ", out);
    dt_man_text(out, head);
    fputc('\n', out);
    dt_man_text(out, k->help);
    fputc('\n', out);
  }
}

void dt_config_write(const dt_config_t *cfg, FILE *out, const char *prefix) {
  const char *sec = "";
  char v[DT_PATH_MAX + 32];
  for (int i = 0; dt_config_keys[i].key; i++) {
    const dt_config_key_t *k = &dt_config_keys[i];
    if (strcmp(sec, k->section) != 0) {
      fprintf(out, "%s[%s]\n", prefix, k->section);
      sec = k->section;
    }
    format_value(cfg, k, v, sizeof v);
    fprintf(out, "%s%s = %s\n", prefix, k->key, v);
  }
}

char *dt_config_to_string(const dt_config_t *cfg) {
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  if (!f) return NULL;
  dt_config_write(cfg, f, "");
  fclose(f);
  return buf;
}

int dt_config_padded_vocab(const dt_config_t *cfg) { return (cfg->vocab_size + 127) / 128 * 128; }
