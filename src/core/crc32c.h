/* CRC32C (Castagnoli, reflected polynomial 0x82F63B78, init and final xor 0xFFFFFFFF), the
 * checksum of every checkpoint dataset. Slicing-by-8 tables, SSE4.2 crc32 instruction when the
 * CPU has it, and crc32c_combine so that parts checksummed on different ranks can be joined. */
#ifndef DT_CRC32C_H
#define DT_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* Continue a CRC over n more bytes: crc = dt_crc32c(0, buf, n) for a fresh one;
 * dt_crc32c(dt_crc32c(0, a, na), b, nb) == CRC of a||b. dt_crc32c(0, "123456789", 9) = 0xE3069283. */
uint32_t dt_crc32c(uint32_t crc, const void *buf, size_t n);
/* Portable table version (same results; used to test the hardware path). */
uint32_t dt_crc32c_sw(uint32_t crc, const void *buf, size_t n);
/* CRC of a||b from crc1 = CRC(a), crc2 = CRC(b) and len2 = |b| in bytes (zlib's crc32_combine). */
uint32_t dt_crc32c_combine(uint32_t crc1, uint32_t crc2, uint64_t len2);
/* The same in two steps for many joins with one length: op = dt_crc32c_combine_op(len2), then
 * dt_crc32c_combine_with(op, crc1, crc2). */
uint32_t dt_crc32c_combine_op(uint64_t len2);
uint32_t dt_crc32c_combine_with(uint32_t op, uint32_t crc1, uint32_t crc2);

#endif
