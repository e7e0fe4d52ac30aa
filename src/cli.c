/* Command-line front end: parses arguments, dispatches subcommands, turns errors into exit
 * statuses (2 = bad configuration or usage, 1 = runtime failure). */
#include "cli.h"

#include "dt_build.h" /* autoconf: PACKAGE_VERSION */
#include "mesh.h"

#include <stdio.h>
#include <string.h>


static void usage(FILE *out) {
  fprintf(out,
          "usage: dtrain CONFIG.ini [section.key=value ...]   train\n"
          "       dtrain layout [--backend auto|cpu|cuda] [--dp N --tp N --pp N]   print the rank layout\n"
          "       dtrain --help | --version\n"
          "\n"
          "Keys on the command line override the file. Configuration keys:\n");
  dt_config_help(out);
}

dt_status_t dt_cli_load_config(dt_config_t *cfg, const char *path, int n_over, char **over) {
  dt_config_defaults(cfg);
  DT_TRY(dt_config_load(cfg, path));
  for (int i = 0; i < n_over; i++) DT_TRY(dt_config_override(cfg, over[i]));
  return dt_config_validate(cfg, path);
}

int dt_main(int argc, char **argv) {
  if (argc > 1 && !strcmp(argv[1], "layout")) return dt_layout_main(argc - 1, argv + 1);
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
    usage(stdout);
    return 0;
  }
  if (!strcmp(argv[1], "--version")) {
    printf("dtrain %s\n", PACKAGE_VERSION);
    return 0;
  }
  dt_config_t cfg;
  if (dt_cli_load_config(&cfg, argv[1], argc - 2, argv + 2) != DT_OK) {
    fprintf(stderr, "dtrain: %s\n", dt_err_msg());
    return 2;
  }
  dt_config_write(&cfg, stdout, "# ");
  return 0;
}
