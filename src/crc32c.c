/* CRC32C: slicing-by-8 tables built once, an SSE4.2 path chosen at run time on x86-64, and the
 * GF(2) polynomial arithmetic behind crc32c_combine (after zlib 1.2.12's multmodp/x2nmodp). */
#include "crc32c.h"

#include <pthread.h>
#include <string.h>

#define POLY 0x82F63B78u

static uint32_t tab[8][256];
static uint32_t x2n[64]; /* x2n[k] = x^(2^k) mod P */
static pthread_once_t tab_once = PTHREAD_ONCE_INIT;
static int have_hw; /* set once in tab_init */

/* a * b mod P, bit-reflected (bit 31 holds x^0). */
static uint32_t multmodp(uint32_t a, uint32_t b) {
  uint32_t m = 1u << 31, p = 0;
  for (;;) {
    if (a & m) {
      p ^= b;
      if ((a & (m - 1)) == 0) break;
    }
    m >>= 1;
    b = (b & 1) ? (b >> 1) ^ POLY : b >> 1;
  }
  return p;
}

static void tab_init(void) {
  for (uint32_t n = 0; n < 256; n++) {
    uint32_t c = n;
    for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ POLY : c >> 1;
    tab[0][n] = c;
  }
  for (uint32_t n = 0; n < 256; n++)
    for (int s = 1; s < 8; s++) tab[s][n] = (tab[s - 1][n] >> 8) ^ tab[0][tab[s - 1][n] & 0xff];
#if defined(__x86_64__) && defined(__GNUC__)
  have_hw = __builtin_cpu_supports("sse4.2") ? 1 : 0;
#endif
  uint32_t p = 1u << 30; /* x^1 */
  x2n[0] = p;
  for (int k = 1; k < 64; k++) x2n[k] = p = multmodp(p, p);
}

uint32_t dt_crc32c_sw(uint32_t crc, const void *buf, size_t n) {
  pthread_once(&tab_once, tab_init);
  const unsigned char *b = buf;
  uint32_t c = ~crc;
  while (n && ((uintptr_t)b & 7)) {
    c = (c >> 8) ^ tab[0][(c ^ *b++) & 0xff];
    n--;
  }
  while (n >= 8) {
    uint64_t w;
    memcpy(&w, b, 8); /* little-endian hosts (x86-64, aarch64) */
    w ^= c;
    c = tab[7][w & 0xff] ^ tab[6][(w >> 8) & 0xff] ^ tab[5][(w >> 16) & 0xff] ^ tab[4][(w >> 24) & 0xff] ^
        tab[3][(w >> 32) & 0xff] ^ tab[2][(w >> 40) & 0xff] ^ tab[1][(w >> 48) & 0xff] ^ tab[0][w >> 56];
    b += 8;
    n -= 8;
  }
  while (n--) c = (c >> 8) ^ tab[0][(c ^ *b++) & 0xff];
  return ~c;
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <nmmintrin.h>
__attribute__((target("sse4.2"))) static uint32_t crc32c_hw(uint32_t crc, const void *buf, size_t n) {
  const unsigned char *b = buf;
  uint64_t c = ~crc;
  while (n && ((uintptr_t)b & 7)) {
    c = _mm_crc32_u8((uint32_t)c, *b++);
    n--;
  }
  while (n >= 8) {
    uint64_t w;
    memcpy(&w, b, 8);
    c = _mm_crc32_u64(c, w);
    b += 8;
    n -= 8;
  }
  while (n--) c = _mm_crc32_u8((uint32_t)c, *b++);
  return ~(uint32_t)c;
}

uint32_t dt_crc32c(uint32_t crc, const void *buf, size_t n) {
  pthread_once(&tab_once, tab_init);
  return have_hw ? crc32c_hw(crc, buf, n) : dt_crc32c_sw(crc, buf, n);
}
#else
uint32_t dt_crc32c(uint32_t crc, const void *buf, size_t n) { return dt_crc32c_sw(crc, buf, n); }
#endif

uint32_t dt_crc32c_combine_op(uint64_t len2) {
  pthread_once(&tab_once, tab_init);
  uint32_t p = 1u << 31; /* x^0 */
  unsigned k = 3;        /* bytes -> bits: x^(8 len2) */
  while (len2) {
    if (len2 & 1) p = multmodp(x2n[k & 63], p);
    len2 >>= 1;
    k++;
  }
  return p;
}

uint32_t dt_crc32c_combine_with(uint32_t op, uint32_t crc1, uint32_t crc2) { return multmodp(op, crc1) ^ crc2; }

uint32_t dt_crc32c_combine(uint32_t crc1, uint32_t crc2, uint64_t len2) {
  return dt_crc32c_combine_with(dt_crc32c_combine_op(len2), crc1, crc2);
}
