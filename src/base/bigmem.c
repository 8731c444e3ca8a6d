/*
 * bigmem.c - see bigmem.h. Buffers of a huge page or more are aligned and
 * sized to whole 2 MiB pages (aligned_alloc, so free() releases them) and
 * advised MADV_HUGEPAGE before anything touches them, so that the first
 * touch of each 2 MiB can fault in a huge page. Smaller buffers are plain
 * 64-byte aligned allocations.
 */
#include "base/bigmem.h"

#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>

#define HUGE_PAGE ((size_t)2 << 20)

void *kp_big_alloc(size_t n) {
    if (n == 0) n = 1;
    if (n < HUGE_PAGE) return aligned_alloc(64, (n + 63) & ~(size_t)63);
    if (n > SIZE_MAX - HUGE_PAGE) return NULL;
    size_t size = (n + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1);
    void *p = aligned_alloc(HUGE_PAGE, size);
#ifdef MADV_HUGEPAGE
    if (p) (void)madvise(p, size, MADV_HUGEPAGE); /* advice only: without it, ordinary pages */
#endif
    return p;
}

void kp_big_free(void *p) { free(p); }
