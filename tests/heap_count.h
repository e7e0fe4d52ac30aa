/* Leak checks for unit tests: the bytes glibc's malloc has handed out and not had back (arena
 * chunks + mmap'ed blocks, mallinfo2), and whether it counts at all (a sanitizer's allocator
 * leaves mallinfo2 at 0: the caller skips its check then). */
#ifndef DT_TEST_HEAP_COUNT_H
#define DT_TEST_HEAP_COUNT_H
#include <malloc.h>
#include <stdlib.h>

static inline size_t heap_in_use(void) {
  struct mallinfo2 mi = mallinfo2();
  return mi.uordblks + mi.hblkhd;
}

static inline int heap_is_counted(void) {
  const size_t before = heap_in_use();
  void *volatile p = malloc(1 << 20);
  const int counted = p && heap_in_use() >= before + (1 << 20);
  free(p);
  return counted;
}
#endif
