/* libFuzzer harness: the .ini parser, the command-line overrides and the cross-key validation
 * (src/core/config.c). The input is an ini text; lines starting with "!" are applied as overrides
 * ("!train.lr=1e-3") after it. Any crash, leak, hang or sanitizer report is a bug: bad input must
 * only ever produce an error status. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *text = malloc(size + 1);
  if (!text) return 0;
  memcpy(text, data, size);
  text[size] = '\0';
  /* the overrides: "!" lines, cut out of the text (a NUL inside ends the text, as a file read would) */
  char *over[64];
  int n_over = 0;
  for (char *p = text; *p && n_over < 64;) {
    char *nl = strchr(p, '\n');
    if (*p == '!') {
      over[n_over++] = p + 1;
      *p = ';'; /* the ini line becomes a comment */
    }
    if (!nl) break;
    p = nl + 1;
  }
  static dt_config_t cfg; /* large (paths): not on the stack */
  dt_config_defaults(&cfg);
  if (dt_config_parse_text(&cfg, text, "fuzz.ini") == DT_OK) {
    for (int i = 0; i < n_over; i++) {
      char *a = strdup(over[i]);
      if (!a) break;
      a[strcspn(a, "\n")] = '\0';
      dt_status_t st = dt_config_override(&cfg, a);
      free(a);
      if (st != DT_OK) break;
    }
    (void)dt_config_validate(&cfg, "fuzz.ini");
    (void)dt_config_padded_vocab(&cfg);
  }
  free(text);
  return 0;
}
