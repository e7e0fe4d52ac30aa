/* CRC32C: RFC 3720 (iSCSI) test vectors, hardware path == table path, and combine == direct. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <string.h>

#include "crc32c.h"

Test(crc32c, known_vectors) {
  unsigned char b[32];
  cr_expect_eq(dt_crc32c(0, "123456789", 9), 0xE3069283u);
  cr_expect_eq(dt_crc32c_sw(0, "123456789", 9), 0xE3069283u);
  cr_expect_eq(dt_crc32c(0, "", 0), 0u);
  memset(b, 0, 32);
  cr_expect_eq(dt_crc32c(0, b, 32), 0x8A9136AAu);
  memset(b, 0xff, 32);
  cr_expect_eq(dt_crc32c(0, b, 32), 0x62A8AB43u);
  for (int i = 0; i < 32; i++) b[i] = (unsigned char)i;
  cr_expect_eq(dt_crc32c(0, b, 32), 0x46DD794Eu);
  cr_expect_eq(dt_crc32c_sw(0, b, 32), 0x46DD794Eu);
  for (int i = 0; i < 32; i++) b[i] = (unsigned char)(31 - i);
  cr_expect_eq(dt_crc32c(0, b, 32), 0x113FDB5Cu);
}

static uint64_t rng = 88172645463325252ull;
static uint64_t next(void) {
  rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
  return rng;
}

/* 160000 bytes: lengths up to three rounds of the 3-stream path (3 x 3 x 16384 bytes) and tails. */
Test(crc32c, hw_equals_table_any_alignment_and_length) {
  static unsigned char buf[160000];
  for (size_t i = 0; i < sizeof buf; i++) buf[i] = (unsigned char)next();
  for (int k = 0; k < 300; k++) {
    size_t off = next() % 64, n = next() % (sizeof buf - 64);
    uint32_t c0 = k % 2 ? (uint32_t)next() : 0; /* also continuing a previous CRC */
    cr_assert_eq(dt_crc32c(c0, buf + off, n), dt_crc32c_sw(c0, buf + off, n), "off %zu n %zu", off, n);
  }
}

Test(crc32c, incremental_and_combine_equal_direct) {
  static unsigned char buf[4096];
  for (size_t i = 0; i < sizeof buf; i++) buf[i] = (unsigned char)next();
  uint32_t full = dt_crc32c(0, buf, sizeof buf);
  for (int k = 0; k < 200; k++) {
    size_t a = next() % sizeof buf;
    uint32_t c1 = dt_crc32c(0, buf, a), c2 = dt_crc32c(0, buf + a, sizeof buf - a);
    cr_assert_eq(dt_crc32c(c1, buf + a, sizeof buf - a), full, "split %zu", a);
    cr_assert_eq(dt_crc32c_combine(c1, c2, sizeof buf - a), full, "combine at %zu", a);
  }
  /* three parts, second op reused */
  uint32_t p[4], op = dt_crc32c_combine_op(1024);
  for (int i = 0; i < 4; i++) p[i] = dt_crc32c(0, buf + 1024 * i, 1024);
  uint32_t c = p[0];
  for (int i = 1; i < 4; i++) c = dt_crc32c_combine_with(op, c, p[i]);
  cr_expect_eq(c, full);
  cr_expect_eq(dt_crc32c_combine(full, 0, 0), full); /* empty second part */
}
