/*
 * bigmem.h - allocations of the large buffers that are streamed on every
 * token (floor 0): the repacked weights and the KV cache's arenas.
 *
 * A decode step reads every weight once, hundreds of MB in 4 KiB pages, so
 * each core walks the page tables once per 4 KiB and its hardware
 * prefetcher starts over at each page. kp_big_alloc aligns such a buffer
 * to 2 MiB and asks the kernel for transparent huge pages on it
 * (madvise MADV_HUGEPAGE, which Debian's default THP mode "madvise"
 * honours; where it is off or absent the buffer is ordinary memory). One
 * core streaming repacked Q4_0 rows from DRAM: 25-28 -> 37-38 GB/s, Q8_0
 * 24 -> 32 GB/s.
 *
 * The memory is uninitialised, as malloc's; free it with kp_big_free.
 */
#ifndef KP_BIGMEM_H
#define KP_BIGMEM_H

#include <stddef.h>

/* n bytes (n > 0) aligned to 64 bytes, in huge pages where the kernel
 * gives them; NULL when out of memory. */
void *kp_big_alloc(size_t n);

/* Frees a kp_big_alloc buffer (NULL: nothing). */
void kp_big_free(void *p);

#endif
