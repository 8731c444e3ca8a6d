/*
 * standalone.c - runs a libFuzzer target's LLVMFuzzerTestOneInput over
 * files, without libFuzzer: the build that `make test` uses (gcc, ASan and
 * UBSan) to replay every seed and every saved crash of each target, so a
 * fixed crash stays fixed.
 *
 *   build/asan/fuzz_NAME FILE|DIR ...   each file once; directories are
 *                                       read one level deep, in name order
 *
 * Calls LLVMFuzzerInitialize first when the target defines it (a weak
 * reference). Prints "fuzz_NAME: N inputs" and exits 0; a failed property
 * traps, a sanitizer report aborts, either way a non-zero exit.
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv) __attribute__((weak));

static int run_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "%s: cannot open\n", path);
        return -1;
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    /* exactly n bytes on the heap, as libFuzzer hands them over */
    uint8_t *buf = malloc(n > 0 ? (size_t)n : 1);
    if (!buf || (n > 0 && fread(buf, 1, (size_t)n, f) != (size_t)n)) {
        fprintf(stderr, "%s: cannot read\n", path);
        fclose(f);
        free(buf);
        return -1;
    }
    fclose(f);
    LLVMFuzzerTestOneInput(buf, (size_t)(n > 0 ? n : 0));
    free(buf);
    return 1;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int run_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    char **names = NULL;
    size_t n = 0, cap = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.' || !strcmp(e->d_name, "README.md")) continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 64;
            char **nn = realloc(names, cap * sizeof *nn);
            if (!nn) break;
            names = nn;
        }
        size_t l = strlen(dir) + strlen(e->d_name) + 2;
        if (!(names[n] = malloc(l))) break;
        snprintf(names[n++], l, "%s/%s", dir, e->d_name);
    }
    closedir(d);
    if (n) qsort(names, n, sizeof *names, cmp_str);
    int count = 0;
    for (size_t i = 0; i < n; i++) {
        struct stat st;
        if (stat(names[i], &st) == 0 && S_ISREG(st.st_mode) && run_file(names[i]) > 0) count++;
        free(names[i]);
    }
    free(names);
    return count;
}

int main(int argc, char **argv) {
    if (LLVMFuzzerInitialize) LLVMFuzzerInitialize(&argc, &argv);
    int total = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        int r = stat(argv[i], &st) == 0 && S_ISDIR(st.st_mode) ? run_dir(argv[i]) : run_file(argv[i]);
        if (r < 0) {
            fprintf(stderr, "%s: cannot read\n", argv[i]);
            return 1;
        }
        total += r;
    }
    const char *slash = strrchr(argv[0], '/');
    printf("%s: %d inputs\n", slash ? slash + 1 : argv[0], total);
    return 0;
}
