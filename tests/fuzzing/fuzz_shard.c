/* libFuzzer harness: the token-shard reader (src/data/data.c). The input is written as a shard file
 * and opened the two ways dtrain reads shards: dt_data_read_shard and dt_data_open (header,
 * sizes, every token < vocab), then every batch of the opened data is read. Bad shards must give
 * an error naming the file, never a crash, an out-of-bounds read or a hang. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "data.h"

static char path[64];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  snprintf(path, sizeof path, "/tmp/dtrain-fuzz-shard-%d.bin", (int)getpid());
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  FILE *f = fopen(path, "wb");
  if (!f) return 0;
  fwrite(data, 1, size, f);
  fclose(f);
  uint16_t *tok = NULL;
  uint64_t n = 0;
  if (dt_data_read_shard(path, &tok, &n) == DT_OK) free(tok);
  dt_data_t *d = NULL;
  /* vocab and T from the last input bytes: small T so that short shards have windows */
  int vocab = size ? 1 + data[size - 1] * 200 : 256, T = size > 1 ? 1 + data[size - 2] % 16 : 4;
  if (dt_data_open(&d, path, vocab, T, size % 2, 1234) == DT_OK) {
    int B = 2, in[2 * 16], tg[2 * 16];
    uint64_t N = dt_data_num_samples(d);
    for (uint64_t g = 0; g + B <= N && g < 64; g += B) (void)dt_data_batch(d, g, B, in, tg);
    for (uint64_t j = 0; j < dt_data_num_sequential_batches(d, B) && j < 32; j++)
      (void)dt_data_batch_sequential(d, j, B, in, tg);
    dt_data_close(d);
  }
  unlink(path);
  return 0;
}
