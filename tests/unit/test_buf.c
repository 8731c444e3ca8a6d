/*
 * test_buf.c - kp_buf holds exactly the bytes written to it, NUL-terminated,
 * whatever the sizes of the writes; reserve, truncate and take keep their
 * contracts; an impossible size sets oom, which drops later writes until a
 * truncate; kp_grow follows its growth rule (max(need, 2 * cap, 64 bytes'
 * worth)), keeps the elements and refuses sizes that overflow without
 * touching the array.
 */
#include <stdint.h>

#include "harness.h"
#include "base/buf.h"

/* A buffer fed writes of every kind and length equals the same bytes
 * copied into a plain array. */
static void test_appends_match_reference(void) {
    enum { MAX = 200000 };
    static char ref[MAX];
    size_t n = 0;
    kp_buf b = {0};
    CHECK(b.data == NULL);
    uint32_t x = 12345;
    bool nul_ok = true;
    while (n < MAX - 1000) {
        x = x * 1103515245u + 12345u;
        size_t k = (x >> 8) % 700;
        switch ((x >> 4) % 5) {
        case 0: { /* bytes, NUL included */
            char tmp[700];
            for (size_t i = 0; i < k; i++) tmp[i] = (char)(i * 7 + n);
            kp_buf_put(&b, tmp, k);
            memcpy(ref + n, tmp, k);
            n += k;
            break;
        }
        case 1:
            kp_buf_putc(&b, (char)k);
            ref[n++] = (char)k;
            break;
        case 2:
            kp_buf_puts(&b, "hello, world");
            memcpy(ref + n, "hello, world", 12);
            n += 12;
            break;
        case 3: {
            kp_buf_printf(&b, "<%zu:%s>", k, "x");
            int w = snprintf(ref + n, MAX - n, "<%zu:%s>", k, "x");
            n += (size_t)w;
            break;
        }
        default:
            kp_buf_fill(&b, 'z', k);
            memset(ref + n, 'z', k);
            n += k;
        }
        if (b.data[b.len] != 0 || b.cap <= b.len) nul_ok = false;
    }
    CHECK(nul_ok);
    CHECK(!b.oom);
    CHECK_EQ_INT(b.len, n);
    CHECK(memcmp(b.data, ref, n) == 0);
    kp_buf_clear(&b);
    CHECK_EQ_INT(b.len, 0);
    CHECK(b.data && b.data[0] == 0);
    kp_buf_free(&b);
    CHECK(b.data == NULL && b.len == 0 && b.cap == 0);
    kp_buf_free(&b); /* twice is fine */
}

/* After reserve(k), k bytes of writes do not move the data. */
static void test_reserve(void) {
    kp_buf b = {0};
    kp_buf_puts(&b, "abc");
    CHECK(kp_buf_reserve(&b, 5000));
    CHECK(b.cap >= 3 + 5000 + 1);
    const char *before = b.data;
    for (int i = 0; i < 5000; i++) kp_buf_putc(&b, 'q');
    CHECK(b.data == before);
    CHECK_EQ_INT(b.len, 5003);
    CHECK(b.data[5003] == 0);
    kp_buf_free(&b);
}

/* A size that cannot exist sets oom; writes are dropped until truncate. */
static void test_oom_and_truncate(void) {
    kp_buf b = {0};
    kp_buf_puts(&b, "keep");
    size_t mark = b.len;
    kp_buf_puts(&b, "drop");
    CHECK(!kp_buf_reserve(&b, SIZE_MAX - 2));
    CHECK(b.oom);
    CHECK(!kp_buf_puts(&b, "lost"));
    CHECK(!kp_buf_printf(&b, "%d", 1));
    CHECK(!kp_buf_fill(&b, 'x', 1));
    CHECK_EQ_INT(b.len, 8);
    kp_buf_truncate(&b, mark);
    CHECK(!b.oom);
    CHECK_EQ_STR(b.data, "keep");
    CHECK(kp_buf_puts(&b, "!"));
    CHECK_EQ_STR(b.data, "keep!");
    kp_buf_truncate(&b, 100); /* longer than the content: only clears oom */
    CHECK_EQ_INT(b.len, 5);
    kp_buf_free(&b);
}

static void test_take(void) {
    kp_buf b = {0};
    char *s = NULL;
    size_t n = 99;
    CHECK(kp_buf_take(&b, &s, &n)); /* nothing written: "" */
    CHECK(s && s[0] == 0 && n == 0);
    CHECK(b.data == NULL && b.len == 0 && b.cap == 0);
    free(s);
    kp_buf_put(&b, "a\0b", 3);
    CHECK(kp_buf_take(&b, &s, &n));
    CHECK(n == 3 && memcmp(s, "a\0b", 4) == 0);
    CHECK(b.data == NULL);
    free(s);
    kp_buf_puts(&b, "x");
    kp_buf_reserve(&b, SIZE_MAX); /* oom */
    CHECK(!kp_buf_take(&b, &s, &n));
    CHECK(s == NULL && n == 0);
    CHECK(b.data == NULL && !b.oom);
}

static void test_grow(void) {
    int32_t *a = NULL;
    size_t cap = 0;
    CHECK(kp_grow((void **)&a, &cap, 0, sizeof *a)); /* nothing needed */
    CHECK(a == NULL && cap == 0);
    CHECK(kp_grow((void **)&a, &cap, 1, sizeof *a));
    CHECK_EQ_INT(cap, 16); /* 64 bytes of int32_t */
    for (int i = 0; i < 16; i++) a[i] = i;
    CHECK(kp_grow((void **)&a, &cap, 17, sizeof *a));
    CHECK_EQ_INT(cap, 32); /* doubled */
    CHECK(kp_grow((void **)&a, &cap, 1000, sizeof *a));
    CHECK_EQ_INT(cap, 1000); /* more than double: exactly what is needed */
    int32_t *same = a;
    CHECK(kp_grow((void **)&a, &cap, 1000, sizeof *a));
    CHECK(a == same && cap == 1000);
    bool kept = true;
    for (int i = 0; i < 16; i++) kept = kept && a[i] == i;
    CHECK(kept);
    /* appending one at a time: the capacity changes O(log n) times */
    size_t n = 0, changes = 0, prev = cap;
    bool pushed = true;
    for (int i = 0; i < 100000; i++) {
        pushed = pushed && kp_grow((void **)&a, &cap, n + 1, sizeof *a);
        if (!pushed) break;
        if (cap != prev) changes++;
        prev = cap;
        a[n++] = i;
    }
    CHECK(pushed);
    CHECK_EQ_INT(changes, 7); /* 1000 -> 2000 -> ... -> 128000 */
    CHECK(a[99999] == 99999 && a[5] == 5);
    /* sizes that overflow fail and leave the array alone */
    int32_t *keep = a;
    size_t keep_cap = cap;
    CHECK(!kp_grow((void **)&a, &cap, SIZE_MAX / 2, sizeof *a));
    CHECK(a == keep && cap == keep_cap);
    free(a);

    uint8_t *bytes = NULL;
    size_t bcap = 0;
    CHECK(kp_grow((void **)&bytes, &bcap, 5, 1));
    CHECK_EQ_INT(bcap, 64);
    CHECK(kp_grow((void **)&bytes, &bcap, 100000, 1));
    CHECK_EQ_INT(bcap, 100000);
    free(bytes);

    uint32_t *u = NULL;
    uint32_t ucap = 0;
    CHECK(kp_grow_u32((void **)&u, &ucap, 3, sizeof *u));
    CHECK_EQ_INT(ucap, 16);
    CHECK(kp_grow_u32((void **)&u, &ucap, 17, sizeof *u));
    CHECK_EQ_INT(ucap, 32);
    uint32_t *ukeep = u;
    CHECK(!kp_grow_u32((void **)&u, &ucap, 33, SIZE_MAX / 8)); /* 33 * elem overflows */
    CHECK(u == ukeep && ucap == 32);
    free(u);
}

int main(void) {
    RUN(test_appends_match_reference);
    RUN(test_reserve);
    RUN(test_oom_and_truncate);
    RUN(test_take);
    RUN(test_grow);
    return harness_finish("buf");
}
