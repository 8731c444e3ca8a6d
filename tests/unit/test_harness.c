/*
 * test_harness.c - the test harness itself (tests/unit/harness.h): a part
 * a suite skips on this CPU is counted and named, never passed silently.
 *
 * Oracle: the summary line's own format, as harness.h documents it and
 * tests/run_all.sh reads it: "<suite>: N passed, N failed, K skipped", and
 * a "SKIP: <what>" line per skipped part.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

int main(void) {
    char path[] = "/tmp/kvpin-harness-XXXXXX";
    int fd = mkstemp(path);
    FILE *saved = fdopen(dup(1), "w");
    if (fd < 0 || !saved || !freopen(path, "w", stdout)) return 2;
    SKIP("table %s (this CPU lacks it)", "avx9000");
    SKIP("a second part");
    CHECK(harness_skipped == 2);
    harness_finish("inner");
    fflush(stdout);
    FILE *in = fopen(path, "r");
    char buf[512] = "";
    size_t n = in ? fread(buf, 1, sizeof buf - 1, in) : 0;
    buf[n] = 0;
    if (in) fclose(in);
    unlink(path);
    /* back to the real stdout for this suite's own summary */
    dup2(fileno(saved), 1);
    stdout = saved;
    harness_skipped = 0;
    CHECK_MSG(strstr(buf, "SKIP: table avx9000 (this CPU lacks it)\n") != NULL, "%s", buf);
    CHECK_MSG(strstr(buf, "SKIP: a second part\n") != NULL, "%s", buf);
    CHECK_MSG(strstr(buf, "inner: 1 passed, 0 failed, 2 skipped\n") != NULL, "%s", buf);
    return harness_finish("harness");
}
