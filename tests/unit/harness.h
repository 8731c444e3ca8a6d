/*
 * harness.h - the small in-tree unit-test harness.
 *
 * A test program defines test functions and lists them in main:
 *
 *   static void test_magic(void) { CHECK(x == 1); CHECK_EQ_INT(a, b); }
 *   int main(void) { RUN(test_magic); return harness_finish("gguf"); }
 *
 * CHECK* record a failure (file:line and the expression) and keep going, so
 * one run shows every broken assertion. harness_finish prints
 * "<suite>: N passed, N failed" (a check counts once; ", K skipped" when
 * SKIP named parts this CPU cannot run) and returns the exit
 * code. Test data is found relative to the repository root (tests are run
 * from there by `make test`), or from $KVPIN_ROOT.
 */
#ifndef KP_HARNESS_H
#define KP_HARNESS_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int harness_passed, harness_failed, harness_skipped;
static const char *harness_current = "";

#define CHECK(cond)                                                                 \
    do {                                                                            \
        if (cond) {                                                                 \
            harness_passed++;                                                       \
        } else {                                                                    \
            harness_failed++;                                                       \
            fprintf(stderr, "FAIL %s:%d in %s: %s\n", __FILE__, __LINE__,           \
                    harness_current, #cond);                                        \
        }                                                                           \
    } while (0)

#define CHECK_MSG(cond, ...)                                                        \
    do {                                                                            \
        if (cond) {                                                                 \
            harness_passed++;                                                       \
        } else {                                                                    \
            harness_failed++;                                                       \
            fprintf(stderr, "FAIL %s:%d in %s: %s: ", __FILE__, __LINE__,           \
                    harness_current, #cond);                                        \
            fprintf(stderr, __VA_ARGS__);                                           \
            fputc('\n', stderr);                                                    \
        }                                                                           \
    } while (0)

#define CHECK_EQ_INT(a, b)                                                          \
    do {                                                                            \
        long long va_ = (long long)(a), vb_ = (long long)(b);                       \
        CHECK_MSG(va_ == vb_, "%lld != %lld", va_, vb_);                            \
    } while (0)

#define CHECK_EQ_STR(a, b)                                                          \
    do {                                                                            \
        const char *sa_ = (a), *sb_ = (b);                                          \
        CHECK_MSG(sa_ && sb_ && strcmp(sa_, sb_) == 0, "\"%s\" != \"%s\"",          \
                  sa_ ? sa_ : "(null)", sb_ ? sb_ : "(null)");                      \
    } while (0)

#define CHECK_NEAR(a, b, tol)                                                       \
    do {                                                                            \
        double da_ = (double)(a), db_ = (double)(b);                                \
        CHECK_MSG(fabs(da_ - db_) <= (tol), "%.9g vs %.9g (tol %g)", da_, db_,      \
                  (double)(tol));                                                   \
    } while (0)

#define RUN(fn)                                                                     \
    do {                                                                            \
        harness_current = #fn;                                                      \
        fn();                                                                       \
    } while (0)

/* A part of the suite this machine cannot run (a kernel table the CPU
 * lacks): named on its own line "SKIP: <what>" and counted, so the
 * summary says how much was not tested here instead of passing it. */
#define SKIP(...)                                                                   \
    do {                                                                            \
        harness_skipped++;                                                          \
        printf("SKIP: ");                                                           \
        printf(__VA_ARGS__);                                                        \
        printf("\n");                                                               \
    } while (0)

static inline int harness_finish(const char *suite) {
    if (harness_skipped)
        printf("%s: %d passed, %d failed, %d skipped\n", suite, harness_passed, harness_failed, harness_skipped);
    else
        printf("%s: %d passed, %d failed\n", suite, harness_passed, harness_failed);
    return harness_failed ? 1 : 0;
}

/* Path of a file under the repository root: "<root>/<rel>" in a static buffer
 * rotated over 4 slots (enough for one expression's worth of calls). */
static inline const char *harness_path(const char *rel) {
    static char bufs[4][1024];
    static int slot;
    const char *root = getenv("KVPIN_ROOT");
    char *b = bufs[slot++ & 3];
    snprintf(b, sizeof bufs[0], "%s/%s", root && *root ? root : ".", rel);
    return b;
}

/* Reads a whole file into a malloc'd buffer (NUL-terminated); NULL on error. */
static inline char *harness_read_file(const char *path, size_t *len_out) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    if (fseek(f, 0, SEEK_END) != 0) { fclose(f); return NULL; }
    long n = ftell(f);
    if (n < 0 || fseek(f, 0, SEEK_SET) != 0) { fclose(f); return NULL; }
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) { free(buf); buf = NULL; }
    fclose(f);
    if (buf) { buf[n] = 0; if (len_out) *len_out = (size_t)n; }
    return buf;
}

#endif
