/* Config parser: defaults, every error class, overrides, and the echo round trip. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "config.h"

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
  expect_invalid("[train]\nprecision = bf16\n[parallel]\nzero = 3\n",
                 "t.ini:4: parallel.zero: stage 3 with train.precision = bf16 is not implemented yet (fp32 only)");
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
