/*
 * version.c - `kvpin --version`: what this binary is and what it runs on.
 *
 * KP_VERSION is kvpin.h's; the commit (git rev-parse --short HEAD, "-dirty"
 * when the tree had changes, "unknown" outside a git checkout), the
 * compiler command and the build flags are KP_GIT_COMMIT, KP_BUILD_CC and
 * KP_BUILD_FLAGS from build/<dir>/buildinfo.h, which tools/buildinfo.sh
 * writes and the Makefile passes with -include (rewritten only when its text
 * changes, so this file is recompiled when the commit does). The kernel
 * tables are the ones this CPU gets at run time.
 */
#include <stdio.h>

#include "cli.h"
#include "kernels/attn.h"
#include "kernels/quant.h"

#ifndef KP_GIT_COMMIT
#error "compile with -include build/<dir>/buildinfo.h (see the Makefile)"
#endif

#if defined(__clang__)
#define KP_COMPILER "clang " __clang_version__
#elif defined(__GNUC__)
#define KP_COMPILER "gcc " __VERSION__
#else
#define KP_COMPILER "unknown"
#endif

void cli_print_version(FILE *out) {
    fprintf(out, "kvpin %s\n", KP_VERSION);
    fprintf(out, "commit:    %s\n", KP_GIT_COMMIT);
    fprintf(out, "compiler:  %s (%s)\n", KP_COMPILER, KP_BUILD_CC);
    fprintf(out, "flags:     %s\n", KP_BUILD_FLAGS);
    fprintf(out, "kernels:   %s (matrix), %s (attention)\n", kp_kernels_best()->name, kp_attn_best()->name);
}
