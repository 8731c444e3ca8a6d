/*
 * canon.c - `kvpin canon`: the canonical bytes (RFC 8785) of a JSON document.
 *
 * Reads one JSON document from FILE (or stdin for "-" or no argument) and
 * writes its canonical form to stdout, with no newline after it unless
 * --newline is given, so `kvpin canon a.json | sha256sum` hashes exactly
 * the canonical bytes. Bad input exits 1 with the position of the error:
 * "kvpin canon: request.json:3:14: string or '}' expected near ','".
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/canon.h"
#include "cli.h"

enum { O_NEWLINE = CLI_OWN };
static const cli_opt canon_tab[] = {{"newline", NULL, NULL, NULL, "end the output with a newline", O_NEWLINE}, {0}};

static void canon_usage(FILE *out) {
    fprintf(out,
            "usage: kvpin canon [options] [FILE|-]\n"
            "Prints the canonical JSON (RFC 8785) of the document in FILE (stdin when\n"
            "FILE is - or missing): members sorted by name (UTF-16 order), no\n"
            "whitespace, numbers as JavaScript prints them, minimal string escapes.\n"
            "Duplicate member names, NaN and numbers beyond a double are errors.\n");
    cli_print_options(out, canon_tab);
}

int cmd_canon(int argc, char **argv) {
    const char *path = NULL;
    bool newline = false;
    cli_args a;
    cli_args_init(&a, "canon", canon_tab, canon_usage, argc, argv);
    for (int k; (k = cli_args_next(&a)) != CLI_END;) {
        if (k == CLI_STOP) return a.rc;
        if (k == O_NEWLINE) newline = true;
    }
    if (a.first_arg < argc) path = argv[a.first_arg];
    if (a.first_arg + 1 < argc) {
        fprintf(stderr, "kvpin canon: one input file only ('%s' and '%s')\n", path, argv[a.first_arg + 1]);
        return 2;
    }
    if (!path) path = "-";
    const char *name = strcmp(path, "-") ? path : "<stdin>";

    size_t len;
    char *text = cli_read_all(path, &len);
    if (!text) return 1;
    char *out = NULL;
    size_t out_len = 0;
    kp_error err = {0};
    kp_status st = kp_canon_text(text, len, &out, &out_len, &err);
    free(text);
    if (st != KP_OK) {
        /* parse errors start with "LINE:COL: " (see canon.h) */
        fprintf(stderr, "kvpin canon: %s:%s%s\n", name, st == KP_EFORMAT ? "" : " ", err.msg);
        return 1;
    }
    int rc = 0;
    if (fwrite(out, 1, out_len, stdout) != out_len || (newline && putchar('\n') == EOF) ||
        fflush(stdout) != 0) {
        fprintf(stderr, "kvpin canon: cannot write the output\n");
        rc = 1;
    }
    free(out);
    return rc;
}
