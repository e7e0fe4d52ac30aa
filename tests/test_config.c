/* Config parser: defaults, every error class, overrides, and the echo round trip. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "heap_count.h"

static dt_status_t parse(dt_config_t *c, const char *text) {
  dt_err_clear();
  dt_config_defaults(c);
  return dt_config_parse_text(c, text, "t.ini");
}

Test(config, table_defaults_parse) {
  /* Every default in the table must be accepted by its own parser. */
  for (int i = 0; dt_config_keys[i].key; i++) {
    dt_config_t c;
    char line[2048];
    snprintf(line, sizeof line, "[%s]\n%s = %s\n", dt_config_keys[i].section, dt_config_keys[i].key,
             dt_config_keys[i].def);
    cr_expect_eq(parse(&c, line), DT_OK, "default of %s.%s: %s", dt_config_keys[i].section,
                 dt_config_keys[i].key, dt_err_msg());
  }
  cr_assert(sizeof(((dt_config_t *)0)->key_line) / sizeof(int) > 40);
}

Test(config, values) {
  dt_config_t c;
  cr_assert_eq(parse(&c, "# comment\n[model]\nn_layer = 12 ; trailing\n n_head=12\n[train]\nlr = 6e-4\n"
                         "lr_schedule = constant\nseed = 18446744073709551615\n[data]\nshuffle = false\n"
                         "train = \"a b/*.bin\"\n"),
               DT_OK, "%s", dt_err_msg());
  cr_expect_eq(c.n_layer, 12);
  cr_expect_eq(c.n_head, 12);
  cr_expect_float_eq(c.lr, 6e-4, 1e-15);
  cr_expect_str_eq(c.lr_schedule, "constant");
  cr_expect_eq(c.seed, UINT64_MAX);
  cr_expect_eq(c.shuffle, 0);
  cr_expect_str_eq(c.train, "a b/*.bin");
  cr_expect_eq(c.key_line[0], 3);
}

static void expect_err(const char *text, const char *msg) {
  dt_config_t c;
  cr_expect_eq(parse(&c, text), DT_ERR_CONFIG, "accepted: %s", text);
  cr_expect(strstr(dt_err_msg(), msg) != NULL, "message '%s' lacks '%s'", dt_err_msg(), msg);
}

Test(config, errors) {
  expect_err("[modle]\nn_layer=1\n", "t.ini:1: [modle]: unknown section");
  expect_err("[model]\nn_layers=1\n", "t.ini:2: model.n_layers: unknown key");
  expect_err("[model]\n\nn_layer=x\n", "t.ini:3: model.n_layer: 'x' is not an integer");
  expect_err("[model]\nn_layer=1.5\n", "model.n_layer: '1.5' is not an integer");
  expect_err("[model]\nn_layer=0\n", "model.n_layer: 0 is out of range");
  expect_err("[train]\nlr=fast\n", "train.lr: 'fast' is not a number");
  expect_err("[train]\nlr=-1\n", "train.lr: -1 is out of range");
  expect_err("[train]\nlr=nan\n", "train.lr: 'nan' is not a number");
  expect_err("[train]\nseed=-3\n", "train.seed: '-3' is not a non-negative integer");
  expect_err("[train]\nlr_schedule=linear\n", "train.lr_schedule: 'linear' is not one of cosine|constant");
  expect_err("[data]\nshuffle=maybe\n", "data.shuffle: 'maybe' is not a boolean");
  expect_err("[train]\n\nprecision = fp8\n", "t.ini:3: train.precision: 'fp8' is not one of fp32|bf16|fp16");
  expect_err("[train]\nloss_scale_window = 0\n", "t.ini:2: train.loss_scale_window: 0 is out of range");
  expect_err("[train]\nloss_scale_init = 0.5\n", "t.ini:2: train.loss_scale_init: 0.5 is out of range");
  expect_err("n_layer=1\n", "t.ini:1: n_layer: key outside of any [section]");
  expect_err("[model\n", "t.ini:1: malformed section header");
  expect_err("[model]\nn_layer\n", "t.ini:2: expected 'key = value'");
}

static void expect_invalid(const char *text, const char *msg) {
  dt_config_t c;
  cr_assert_eq(parse(&c, text), DT_OK, "%s", dt_err_msg());
  cr_expect_eq(dt_config_validate(&c, "t.ini"), DT_ERR_CONFIG, "accepted: %s", text);
  cr_expect(strstr(dt_err_msg(), msg) != NULL, "message '%s' lacks '%s'", dt_err_msg(), msg);
}

Test(config, consistency) {
  expect_invalid("[model]\nn_embd = 100\nn_head = 3\n", "t.ini:2: model.n_embd: n_embd 100 is not divisible by n_head 3");
  expect_invalid("[train]\nmicro_batch = 4\nglobal_batch = 10\n", "t.ini:3: train.global_batch: 10 is not a multiple of micro_batch 4");
  expect_invalid("[train]\nmicro_batch = 4\ngrad_accum = 3\nglobal_batch = 16\n", "not a multiple of micro_batch*grad_accum = 12");
  expect_invalid("[train]\nlr = 1e-3\nmin_lr = 1e-2\n", "t.ini:3: train.min_lr");
  expect_invalid("[model]\nn_head = 8\n[parallel]\ntp = 3\n", "t.ini:4: parallel.tp: 3 must divide model.n_head 8");
  expect_invalid("[train]\nprecision = fp16\nloss_scale_init = 1000\n",
                 "t.ini:3: train.loss_scale_init: 1000 is not a power of two");
  dt_config_t c;
  cr_assert_eq(parse(&c, "[model]\nn_head = 3\n"), DT_OK);
  cr_assert_eq(dt_config_override(&c, "model.n_embd=100"), DT_OK);
  cr_expect_eq(dt_config_validate(&c, "t.ini"), DT_ERR_CONFIG);
  cr_expect(strstr(dt_err_msg(), "command line: model.n_embd") != NULL, "%s", dt_err_msg());
}

Test(config, overrides) {
  dt_config_t c;
  cr_assert_eq(parse(&c, "[train]\nsteps = 5\n"), DT_OK);
  cr_assert_eq(dt_config_override(&c, "train.steps=7"), DT_OK);
  cr_expect_eq(c.steps, 7);
  dt_err_clear();
  cr_expect_eq(dt_config_override(&c, "train.stepz=7"), DT_ERR_CONFIG);
  cr_expect(strstr(dt_err_msg(), "command line: train.stepz: unknown key") != NULL, "%s", dt_err_msg());
  dt_err_clear();
  cr_expect_eq(dt_config_override(&c, "steps=7"), DT_ERR_CONFIG);
  dt_err_clear();
  cr_expect_eq(dt_config_override(&c, "train.steps=-1"), DT_ERR_CONFIG);
}

Test(config, echo_round_trip) {
  dt_config_t a, b;
  cr_assert_eq(parse(&a, "[model]\nn_layer = 3\n[train]\nlr = 0.00123\nseed = 99\n[data]\ntrain = x/*.bin\n"), DT_OK);
  char *text = dt_config_to_string(&a);
  cr_assert_not_null(text);
  cr_assert_eq(parse(&b, text), DT_OK, "%s", dt_err_msg());
  free(text);
  memset(a.key_line, 0, sizeof a.key_line);
  memset(b.key_line, 0, sizeof b.key_line);
  cr_expect_eq(memcmp(&a, &b, sizeof a), 0, "effective config does not round-trip");
}

Test(config, load_file_errors) {
  dt_config_t c;
  dt_config_defaults(&c);
  dt_err_clear();
  cr_expect_eq(dt_config_load(&c, "/nonexistent/x.ini"), DT_ERR_CONFIG);
  cr_expect(strstr(dt_err_msg(), "/nonexistent/x.ini: cannot open") != NULL, "%s", dt_err_msg());
}

/* dt_config_validate's rules, each at its edge: a row's text is valid (want NULL) or refused with a
 * message containing want (naming the key and where it was set). */
#define CNN "[model]\narch = cnn\n[data]\nformat = idx\ntrain_labels = l\n" /* a valid classifier, in [data] */
Test(config, validate_rules_at_their_edges) {
  static const struct {
    const char *text, *want;
  } rows[] = {
      {"[model]\nn_embd = 96\nn_head = 4\n", NULL},
      {"[train]\nmicro_batch = 8\nglobal_batch = 16\n", NULL}, /* grad_accum 0: from global_batch */
      {"[train]\nmicro_batch = 4\ngrad_accum = 2\nglobal_batch = 16\n", NULL},
      {"[train]\nmicro_batch = 4\ngrad_accum = 3\nglobal_batch = 0\n", NULL},
      {"[train]\nmicro_batch = 2\nglobal_batch = 1\n",
       "t.ini:3: train.global_batch: 1 is not a multiple of micro_batch 2"},
      {"[train]\nmicro_batch = 1\ngrad_accum = 2\nglobal_batch = 1\n",
       "t.ini:4: train.global_batch: 1 is not a multiple"},
      {"[parallel]\nmicro_batches = 2\n", NULL}, /* grad_accum 0: from global_batch */
      {"[train]\ngrad_accum = 1\n[parallel]\nmicro_batches = 2\n", "t.ini:4: parallel.micro_batches: 2 disagrees"},
      {"[train]\nlr = 1e-3\nmin_lr = 1e-3\n", NULL},
      {"[data]\ntrain =\n", "t.ini:2: data.train: must name the training shards"},
      {"[train]\nloss_scale_init = 1024\n", NULL},
      {"[parallel]\nzero = 3\n", NULL},
      {"[train]\nprecision = bf16\n[parallel]\nzero = 3\n", NULL}, /* the working copy gathered (zero.h) */
      {"[model]\nn_layer = 4\n[parallel]\npp = 4\n", NULL},
      {"[model]\nn_layer = 4\n[parallel]\npp = 5\n", "t.ini:4: parallel.pp: 5 stages for model.n_layer = 4"},
      {"[parallel]\npp = 2\nzero = 2\n", NULL},
      {"[parallel]\npp = 2\nzero = 3\n", "t.ini:3: parallel.zero: ZeRO stage 3 with parallel.pp = 2"},
      {"[train]\ngrad_accum = 2\n[parallel]\nmicro_batches = 2\n", NULL},
      {"[train]\ngrad_accum = 2\n[parallel]\nmicro_batches = 1\n", "t.ini:4: parallel.micro_batches: 1 disagrees"},
      {"[model]\nn_embd = 96\nn_head = 6\n[parallel]\ntp = 2\n", NULL},
      {"[model]\nn_embd = 96\nn_head = 6\n[parallel]\ntp = 3\n", "t.ini:5: parallel.tp: 3 must divide"}, /* vocab */
      {"[model]\nn_embd = 96\nn_head = 6\n[parallel]\ntp = 4\n", "t.ini:5: parallel.tp: 4 must divide"}, /* heads */
      {CNN, NULL},
      {CNN "val = v\nval_labels = w\n", NULL},
      {CNN "val = v\n", "t.ini: data.val_labels (default): data.format = idx needs the labels file"},
      {"[model]\narch = cnn\n[data]\nformat = idx\n", "t.ini: data.train_labels (default): data.format = idx"},
      {"[model]\narch = cnn\n", "t.ini: data.format (default): tokens data for model.arch = cnn"},
      {"[data]\nformat = cifar10\n", "t.ini:2: data.format: cifar10 data for model.arch = gpt2"},
      {CNN "[parallel]\ntp = 2\n", "t.ini:7: parallel.tp: tensor parallelism is not implemented"},
      {CNN "[parallel]\npp = 2\n", "t.ini:7: parallel.pp: pipeline parallelism is not implemented"},
      {CNN "[train]\nrecompute = true\n", "t.ini:7: train.recompute: recomputation is not implemented"},
  };
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
    dt_config_t c;
    cr_assert_eq(parse(&c, rows[i].text), DT_OK, "row %zu: %s", i, dt_err_msg());
    dt_status_t st = dt_config_validate(&c, "t.ini");
    if (!rows[i].want) {
      cr_expect_eq(st, DT_OK, "row %zu refused: %s", i, dt_err_msg());
      continue;
    }
    cr_expect_eq(st, DT_ERR_CONFIG, "row %zu accepted:\n%s", i, rows[i].text);
    cr_expect(strstr(dt_err_msg(), rows[i].want) != NULL, "row %zu: message '%s' lacks '%s'", i, dt_err_msg(),
              rows[i].want);
  }
}

Test(config, parser_edges) {
  dt_config_t c;
  /* the last line without a newline: nothing after the string's end is read */
  const char text[] = "[model]\nn_layer = 3\0n_head = x\n";
  cr_expect_eq(parse(&c, text), DT_OK, "%s", dt_err_msg());
  cr_expect_eq(c.n_layer, 3);
  /* lines up to 4095 characters (a long trailing comment) */
  static char line[4200];
  const char *head = "[model]\nn_layer = 5 #";
  size_t pre = strlen(head);
  memcpy(line, head, pre);
  memset(line + pre, 'a', sizeof line - pre - 1);
  line[8 + 4095] = '\0'; /* line 2: "n_layer = 5 #aaa..." of 4095 characters */
  cr_expect_eq(parse(&c, line), DT_OK, "%s", dt_err_msg());
  cr_expect_eq(c.n_layer, 5);
  line[8 + 4095] = 'a', line[8 + 4096] = '\0';
  cr_expect_eq(parse(&c, line), DT_ERR_CONFIG, "a line of 4096 characters accepted");
  cr_expect(strstr(dt_err_msg(), "t.ini:2: line is longer than 4095 characters") != NULL, "%s", dt_err_msg());
  /* files: an empty one is all defaults, a valid one loads */
  char path[] = "/tmp/dtrain-test-config-XXXXXX";
  int fd = mkstemp(path);
  cr_assert(fd >= 0);
  close(fd);
  dt_config_defaults(&c);
  dt_err_clear();
  cr_expect_eq(dt_config_load(&c, path), DT_OK, "an empty file: %s", dt_err_msg());
  FILE *f = fopen(path, "w");
  fputs("[train]\nsteps = 17\n", f);
  fclose(f);
  cr_expect_eq(dt_config_load(&c, path), DT_OK, "%s", dt_err_msg());
  cr_expect_eq(c.steps, 17);
  unlink(path);
}

/* --help and --man: every key once, under its own section's header, with its range */
static char *text_of(void (*print)(FILE *)) {
  char *buf = NULL;
  size_t n = 0;
  FILE *f = open_memstream(&buf, &n);
  print(f);
  fclose(f);
  return buf;
}

Test(config, help_and_man_list_every_key_under_its_section) {
  char *help = text_of(dt_config_help), *man = text_of(dt_config_man);
  const char *sec = "", *h = help, *m = man;
  for (int i = 0; dt_config_keys[i].key; i++) {
    const dt_config_key_t *k = &dt_config_keys[i];
    char want[128];
    if (strcmp(sec, k->section)) { /* a new section: its header comes next */
      sec = k->section;
      snprintf(want, sizeof want, "\n[%s]\n", sec);
      cr_assert((h = strstr(h, want)) != NULL, "help: no header %s in order", want + 1);
      snprintf(want, sizeof want, ".SS [%s]\n", sec);
      cr_assert((m = strstr(m, want)) != NULL, "man: no header %s in order", want);
    }
    snprintf(want, sizeof want, "\n  %-13s ", k->key);
    const char *at = strstr(h, want), *next = strstr(h + 1, "\n[");
    cr_assert(at && (!next || at < next), "help: %s.%s not under [%s]", sec, k->key, sec);
    h = at + 1;
    snprintf(want, sizeof want, ".B %s (", k->key);
    at = strstr(m, want), next = strstr(m + 1, ".SS [");
    cr_assert(at && (!next || at < next), "man: %s.%s not under [%s]", sec, k->key, sec);
    m = at + 1;
  }
  cr_expect(strstr(help, "\n  n_layer       int    default \"4\" in [1, 1024]\n      transformer blocks (L)\n"));
  cr_expect(strstr(help, "\n  lr            float  default \"3e-4\" in [0, 10]\n"));
  cr_expect(strstr(help, "\n  seed          uint64 default \"1337\"\n"));
  cr_expect(strstr(help, "\n  precision     enum   default \"fp32\" one of fp32|bf16|fp16\n"));
  cr_expect(strstr(man, ".TP\n.B n_layer (int, default \"4\", in [1, 1024])\ntransformer blocks (L)\n.TP\n"));
  cr_expect(strstr(man, ".B micro_batch (int, default \"8\", in [1, 1048576])\n"));
  cr_expect(strstr(man, ".B lr (float, default \"3e\\-4\", in [0, 10])\n"));
  cr_expect(strstr(man, ".B precision (enum, default \"fp32\", one of fp32|bf16|fp16)\n"));
  free(help), free(man);
  char *esc = NULL;
  size_t n = 0;
  FILE *f = open_memstream(&esc, &n);
  dt_man_text(f, ".a-b\\c\n'd.e\n");
  fclose(f);
  cr_expect_str_eq(esc, "\\&.a\\-b\\ec\n\\&'d.e\n");
  free(esc);
}

/* The ranges --help prints for the numeric keys (the ini reference's), pinned: a change to one is a
 * change of the interface, made here and in the README on purpose. */
static const char pinned_ranges[] =
    "model.n_layer in [1, 1024]\n"
    "model.n_head in [1, 1024]\n"
    "model.n_embd in [1, 65536]\n"
    "model.vocab_size in [2, 16777216]\n"
    "model.seq_len in [1, 1048576]\n"
    "model.classes in [2, 1048576]\n"
    "model.width in [0, 65536]\n"
    "model.hidden in [1, 1048576]\n"
    "train.micro_batch in [1, 1048576]\n"
    "train.global_batch in [0, 1073741824]\n"
    "train.grad_accum in [0, 1048576]\n"
    "train.steps in [0, 1073741824]\n"
    "train.stop_after in [0, 1073741824]\n"
    "train.lr in [0, 10]\n"
    "train.min_lr in [0, 10]\n"
    "train.warmup in [0, 1073741824]\n"
    "train.weight_decay in [0, 10]\n"
    "train.beta1 in [0, 0.999999]\n"
    "train.beta2 in [0, 1]\n"
    "train.eps in [0, 1]\n"
    "train.grad_clip >= 0\n"
    "train.eval_every in [0, 1073741824]\n"
    "train.eval_batches in [1, 1048576]\n"
    "train.threads in [0, 4096]\n"
    "train.loss_scale_init >= 1\n"
    "train.loss_scale_window in [1, 1073741824]\n"
    "train.momentum in [0, 0.999999]\n"
    "data.crop_pad in [0, 64]\n"
    "log.every in [1, 1073741824]\n"
    "log.straggler_every in [-1, 1073741824]\n"
    "parallel.dp in [0, 1048576]\n"
    "parallel.tp in [1, 1048576]\n"
    "parallel.pp in [1, 1048576]\n"
    "parallel.micro_batches in [0, 1048576]\n"
    "parallel.zero in [0, 3]\n"
    "parallel.bucket_mb in [1, 65536]\n"
    "parallel.ddp_probe in [0, 1073741824]\n"
    "checkpoint.every in [0, 1073741824]\n"
    "checkpoint.keep in [1, 1048576]\n"
    "system.comm_timeout in [0, 1e+07]\n"
    "system.comm_timeout_start in [0, 1e+07]\n";

Test(config, numeric_ranges_are_the_documented_ones) {
  char *help = text_of(dt_config_help), *got = NULL, sec[32] = "";
  size_t n = 0;
  FILE *f = open_memstream(&got, &n);
  for (char *line = strtok(help, "\n"); line; line = strtok(NULL, "\n")) {
    char key[64], type[16];
    if (sscanf(line, "[%31[^]]]", sec) == 1) continue;
    if (sscanf(line, "  %63s %15s default", key, type) != 2 || (strcmp(type, "int") && strcmp(type, "float"))) continue;
    const char *r = strchr(strchr(line, '"') + 1, '"') + 1; /* after the default */
    fprintf(f, "%s.%s%s\n", sec, key, r);
  }
  fclose(f);
  cr_expect_str_eq(got, pinned_ranges);
  free(got), free(help);
}

Test(config, booleans_and_long_names) {
  static const char *const yes[] = {"true", "1", "yes", "on"}, *const no[] = {"false", "0", "no", "off"};
  dt_config_t c;
  dt_config_defaults(&c);
  char arg[128];
  for (int i = 0; i < 4; i++) {
    snprintf(arg, sizeof arg, "data.shuffle=%s", no[i]);
    cr_expect_eq(dt_config_override(&c, arg), DT_OK, "%s: %s", arg, dt_err_msg());
    cr_expect_eq(c.shuffle, 0, "%s", arg);
    snprintf(arg, sizeof arg, "data.shuffle=%s", yes[i]);
    cr_expect_eq(dt_config_override(&c, arg), DT_OK, "%s: %s", arg, dt_err_msg());
    cr_expect_eq(c.shuffle, 1, "%s", arg);
  }
  /* section and key names of 64 characters or more: refused as too long */
  char name[65];
  memset(name, 'x', 64), name[64] = '\0';
  snprintf(arg, sizeof arg, "%s.steps=1", name);
  dt_err_clear();
  cr_expect_eq(dt_config_override(&c, arg), DT_ERR_CONFIG);
  cr_expect(strstr(dt_err_msg(), "name too long") != NULL, "%s", dt_err_msg());
  snprintf(arg, sizeof arg, "train.%s=1", name);
  dt_err_clear();
  cr_expect_eq(dt_config_override(&c, arg), DT_ERR_CONFIG);
  cr_expect(strstr(dt_err_msg(), "name too long") != NULL, "%s", dt_err_msg());
  /* the man page: one ".TP" paragraph per key, each on its own line */
  char *man = text_of(dt_config_man);
  int keys = 0, tp = 0;
  while (dt_config_keys[keys].key) keys++;
  for (const char *p = man; (p = strstr(p, "\n.TP\n.B ")); p++) tp++;
  cr_expect_eq(tp, keys, "%d paragraphs for %d keys", tp, keys);
  free(man);
}

Test(config, values_at_their_limits) {
  dt_config_t c;
  /* a float at its maximum, a string of 1023 characters, an empty quoted string */
  cr_expect_eq(parse(&c, "[train]\nlr = 10\n"), DT_OK, "%s", dt_err_msg());
  static char text[1100];
  int n = snprintf(text, sizeof text, "[data]\nval = ");
  memset(text + n, 'v', 1023);
  cr_expect_eq(parse(&c, text), DT_OK, "a 1023-character value: %s", dt_err_msg());
  text[n + 1023] = 'v';
  expect_err(text, "t.ini:2: data.val: value is longer than 1023 characters");
  cr_expect_eq(parse(&c, "[data]\nval = \"\"\ntrain = \"x\"\n"), DT_OK, "%s", dt_err_msg());
  cr_expect_str_eq(c.val, "");
  cr_expect_str_eq(c.train, "x");
  expect_err("[train]\nseed = 12x\n", "t.ini:2: train.seed: '12x' is not a non-negative integer");
  expect_err("[train]\nloss_scale_init = 1.2676506002282294e30\n", "train.loss_scale_init: 1.26765e+30 is out of range");
  /* a section name of 64 characters: too long for any section, named as unknown */
  char head[80];
  memset(head, 's', sizeof head);
  head[0] = '[', head[65] = ']', head[66] = '\n', head[67] = '\0';
  expect_err(head, "t.ini:1: [ssss");
  /* the first key of the table by override */
  cr_expect_eq(dt_config_override(&c, "model.n_layer=3"), DT_OK, "%s", dt_err_msg());
  cr_expect_eq(c.n_layer, 3);
  /* the padded vocabulary: the next multiple of 128 */
  const int v[][2] = {{1, 128}, {128, 128}, {129, 256}, {256, 256}, {50257, 50304}};
  for (int i = 0; i < 5; i++) {
    c.vocab_size = v[i][0];
    cr_expect_eq(dt_config_padded_vocab(&c), v[i][1], "vocab %d", v[i][0]);
  }
}

Test(config, load_records_the_file_and_takes_one_mib) {
  char path[] = "/tmp/dtrain-test-config-XXXXXX";
  int fd = mkstemp(path);
  cr_assert(fd >= 0);
  FILE *f = fdopen(fd, "w");
  fputs("[train]\nsteps = 9\n", f);
  for (long n = 18; n < (1 << 20) - 1; n++) fputc(n % 64 == 63 ? '\n' : '#', f); /* comments up to 1 MiB - 1 */
  fputc('\n', f);
  fclose(f);
  dt_config_t c;
  dt_config_defaults(&c);
  dt_err_clear();
  cr_expect_eq(dt_config_load(&c, path), DT_OK, "a file of exactly 1 MiB: %s", dt_err_msg());
  cr_expect_eq(c.steps, 9);
  cr_expect_str_eq(c.src_file, path);
  f = fopen(path, "a");
  fputc('\n', f);
  fclose(f);
  dt_err_clear();
  cr_expect_eq(dt_config_load(&c, path), DT_ERR_CONFIG, "a file of 1 MiB + 1 byte accepted");
  cr_expect(strstr(dt_err_msg(), "not a configuration file (size 1048577)") != NULL, "%s", dt_err_msg());
  unlink(path);
}

static int open_fds(void) {
  int n = 0;
  DIR *d = opendir("/proc/self/fd");
  for (struct dirent *e; d && (e = readdir(d));) n += e->d_name[0] != '.';
  if (d) closedir(d);
  return n;
}

Test(config, load_closes_and_frees_on_every_path) {
  if (!heap_is_counted()) cr_skip_test("mallinfo2 does not count this allocator's blocks (a sanitizer build)");
  char path[] = "/tmp/dtrain-test-config-XXXXXX";
  int fd = mkstemp(path);
  cr_assert(fd >= 0);
  close(fd);
  dt_config_t c;
  const int fds = open_fds();
  for (int k = 0; k < 3; k++) { /* valid (64 KiB of comments), a NUL byte, over 1 MiB */
    FILE *f = fopen(path, "w");
    const long n = k == 2 ? (1 << 20) + 1 : 1 << 16;
    for (long i = 0; i < n; i++) fputc(i == 100 && k == 1 ? '\0' : i % 64 == 63 ? '\n' : '#', f);
    fclose(f);
    dt_config_defaults(&c);
    dt_err_clear();
    const size_t heap = heap_in_use();
    dt_status_t st = dt_config_load(&c, path);
    cr_expect_eq(st, k == 0 ? DT_OK : DT_ERR_CONFIG, "case %d: %s", k, dt_err_msg());
    cr_expect_eq(open_fds(), fds, "case %d: a file left open", k);
    cr_expect_lt(heap_in_use(), heap + 4096, "case %d: %zu bytes not freed", k, heap_in_use() - heap);
  }
  unlink(path);
}

Test(config, overrides_and_echo_in_their_shapes) {
  dt_config_t c;
  dt_config_defaults(&c);
  const char *bad[] = {"steps=1", "train.steps", "a=b.c"};
  for (int i = 0; i < 3; i++) {
    dt_err_clear();
    cr_expect_eq(dt_config_override(&c, bad[i]), DT_ERR_CONFIG, "'%s' accepted", bad[i]);
    cr_expect(strstr(dt_err_msg(), "expected section.key=value") != NULL, "'%s': %s", bad[i], dt_err_msg());
  }
  cr_assert_eq(parse(&c, "[data]\ntrain = ab\"\n"), DT_OK, "%s", dt_err_msg());
  cr_expect_str_eq(c.train, "ab\""); /* quotes come off only in pairs */
  /* the echo (checkpoints' ini, the run's header): each section once, before its keys */
  char *text = dt_config_to_string(&c);
  const char *secs[] = {"[model]", "[train]", "[data]", "[log]", "[parallel]", "[checkpoint]", "[system]"};
  const char *prev = text;
  for (int i = 0; i < 7; i++) {
    const char *at = strstr(text, secs[i]);
    cr_expect(at && !strstr(at + 1, secs[i]), "%s: not exactly once", secs[i]);
    cr_expect(at >= prev, "%s out of order", secs[i]);
    prev = at ? at : prev;
  }
  int headers = 0;
  for (const char *p = text; (p = strchr(p, '[')); p++) headers += p == text || p[-1] == '\n';
  cr_expect_eq(headers, 7, "%d section headers", headers);
  free(text);
  char *man = text_of(dt_config_man);
  cr_expect(strstr(man, ".B grad_clip (float, default \"1.0\", >= 0)\n"), "man: grad_clip's range");
  free(man);
}
