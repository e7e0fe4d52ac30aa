/* Command line: `dtrain CONFIG.ini [section.key=value ...]` and the subcommands. */
#ifndef DT_CLI_H
#define DT_CLI_H

#include "config.h"
#include "status.h"

/* Whole program; returns the process exit status. */
int dt_main(int argc, char **argv);

/* Load CONFIG then apply overrides (argv entries of the form section.key=value) and validate.
 * On error the message is recorded (dt_err_msg) and DT_ERR_CONFIG returned. */
dt_status_t dt_cli_load_config(dt_config_t *cfg, const char *path, int n_over, char **over);
/* DT_ERR_CONFIG (naming model.arch) unless cfg is GPT-2's: `dtrain eval`, `generate`, `plan` know only it. */
dt_status_t dt_cli_gpt2_only(const dt_config_t *cfg, const char *path, const char *tool);

/* `dtrain bench-comm ...` (bench_comm.c): collective benchmark; returns the exit status. */
int dt_bench_comm_main(int argc, char **argv);

#endif
