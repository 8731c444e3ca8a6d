/*
 * llamacpp_quant_ref.c - makes the llama.cpp reference data in
 * tests/data/quant_more/ by calling llama.cpp's own libraries (the prebuilt
 * CPU build that bench/ installs from npm, see bench/README.md), loaded with
 * dlopen, so nothing of kvpin takes part in computing a reference.
 *
 *   llamacpp_quant_ref vectors LIBDIR OUT.bin
 *       Inputs chosen to reach every branch of the reference quantizers
 *       (Gaussian rows of several scales, outliers, constant and zero blocks,
 *       all-positive and all-negative blocks, exact rounding ties, tiny and
 *       large magnitudes) and their encodings by quantize_row_{q4_1, q5_0,
 *       q5_1, q5_K, q8_1}_ref from libggml-base.so. Format (little-endian):
 *
 *         "KPQR" | u32 version 1 | u32 n_rows | u32 row_len (256)
 *         f32 inputs[n_rows * row_len]
 *         then for each type: u32 ggml type id | u32 n_bytes | the encoded rows
 *
 *   llamacpp_quant_ref quantize LIBDIR IN.gguf OUT.gguf FTYPE
 *       llama_model_quantize with llama-quantize --pure's parameters (no
 *       importance matrix, default output/token-embedding types) and the
 *       llama_ftype number FTYPE (3 Q4_1, 8 Q5_0, 9 Q5_1, 15 Q4_K_M,
 *       17 Q5_K_M, 18 Q6_K, 2 Q4_0 ...).
 *
 *   llamacpp_quant_ref table LIBDIR FILE.gguf
 *       One line per tensor, read with ggml's own GGUF reader:
 *       "name type_name n_bytes fnv1a64(data)"; first a line
 *       "general.file_type N".
 *
 * LIBDIR is bench/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64.
 * tests/data/quant_more/make.sh runs the whole procedure. Build:
 *   cc -O1 -o llamacpp_quant_ref tools/llamacpp_quant_ref.c -ldl -lm
 */
#include <dlfcn.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ggml type ids */
enum { T_Q4_1 = 3, T_Q5_0 = 6, T_Q5_1 = 7, T_Q8_1 = 9, T_Q5_K = 13 };

/* llama_model_quantize_params of the libllama these binaries were built
 * from (include/llama.h of that release); filled by
 * llama_model_quantize_default_params, only ftype and pure are changed. */
typedef struct {
    int32_t nthread;
    int32_t ftype;
    int32_t output_tensor_type;
    int32_t token_embedding_type;
    bool allow_requantize;
    bool quantize_output_tensor;
    bool only_copy;
    bool pure;
    bool keep_split;
    bool dry_run;
    const void *imatrix;
    const void *kv_overrides;
    const void *tt_overrides;
    const int32_t *prune_layers;
    size_t max_buf_size;
} lq_params;

struct gguf_init_params_ {
    bool no_alloc;
    void **ctx;
};

static void *open_lib(const char *dir, const char *name) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    void *h = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
    if (!h) {
        fprintf(stderr, "dlopen %s: %s\n", path, dlerror());
        exit(1);
    }
    return h;
}

static void *sym(void *h, const char *name) {
    void *p = dlsym(h, name);
    if (!p) {
        fprintf(stderr, "dlsym %s: %s\n", name, dlerror());
        exit(1);
    }
    return p;
}

/* ---- inputs ---- */

static uint64_t rng = 0x9E3779B97F4A7C15ull;

static uint64_t next_u64(void) {
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return rng * 0x2545F4914F6CDD1Dull;
}

static double unit(void) { return (double)(next_u64() >> 11) * 0x1p-53; }

static float gauss(void) {
    return (float)(sqrt(-2.0 * log(unit() + 0x1p-60)) * cos(6.283185307179586 * unit()));
}

enum { ROW = 256, N_ROWS = 48 };

static void make_inputs(float *x) {
    for (int r = 0; r < N_ROWS; r++) {
        float *v = x + r * ROW;
        const int kind = r % 16;
        const float scale = (float)ldexp(1.0, (int)(next_u64() % 16) - 10);
        for (int i = 0; i < ROW; i++) v[i] = gauss() * scale;
        switch (kind) {
        case 0: break;                                          /* plain Gaussian */
        case 1: v[next_u64() % ROW] *= 30; v[7] *= -25; break;  /* outliers */
        case 2:                                                 /* constant and zero blocks */
            for (int i = 0; i < 32; i++) v[i] = 0.75f;
            for (int i = 32; i < 64; i++) v[i] = -1.5f;
            for (int i = 64; i < 96; i++) v[i] = 0.0f;
            break;
        case 3: for (int i = 0; i < ROW; i++) v[i] = fabsf(v[i]) + scale; break;  /* all positive */
        case 4: for (int i = 0; i < ROW; i++) v[i] = -fabsf(v[i]) - scale; break; /* all negative */
        case 5: /* exact ties: multiples of 1/32 and of 1/64 around a fixed absmax */
            for (int i = 0; i < ROW; i++) v[i] = (float)((int)(next_u64() % 65) - 32) / 32.0f;
            for (int b = 0; b < ROW; b += 32) v[b] = -1.0f;
            break;
        case 6: for (int i = 0; i < ROW; i++) v[i] = gauss() * 1e-6f; break;  /* tiny */
        case 7: for (int i = 0; i < ROW; i++) v[i] = gauss() * 900.0f; break; /* large */
        case 8: /* one spike per 32-block, the rest zero */
            for (int i = 0; i < ROW; i++) v[i] = (i % 32 == (i / 32) % 32) ? gauss() : 0.0f;
            break;
        case 9: /* sub-blocks of very different magnitudes (K-quant scales) */
            for (int i = 0; i < ROW; i++) v[i] *= (float)ldexp(1.0, (i / 32) - 4);
            break;
        case 10: /* uniform, asymmetric */
            for (int i = 0; i < ROW; i++) v[i] = (float)(unit() * 3.0 - 0.5) * scale;
            break;
        case 11: /* few distinct values */
            for (int i = 0; i < ROW; i++) v[i] = (float)((int)(next_u64() % 5) - 1) * 0.25f;
            break;
        case 12: /* zero sub-block inside a non-zero super-block, and an all-zero half */
            for (int i = 96; i < 128; i++) v[i] = 0.0f;
            for (int i = 160; i < 256; i++) v[i] *= 1e-3f;
            break;
        case 13: /* subnormal-half scales */
            for (int i = 0; i < ROW; i++) v[i] = gauss() * 3e-5f;
            break;
        case 14: /* mostly positive with a negative min */
            for (int i = 0; i < ROW; i++) v[i] = fabsf(v[i]);
            v[40] = -0.01f * scale;
            break;
        default: /* heavy tails */
            for (int i = 0; i < ROW; i++) {
                const double u = unit() - 0.5;
                v[i] = (float)(scale * 0.05 * tan(3.1 * u));
            }
            break;
        }
    }
}

static void put_u32(FILE *f, uint32_t v) {
    uint8_t b[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    fwrite(b, 1, 4, f);
}

typedef void (*qfn)(const float *, void *, int64_t);

static int cmd_vectors(const char *dir, const char *out) {
    void *base = open_lib(dir, "libggml-base.so");
    static const struct { const char *fn; uint32_t type; size_t block_bytes, block; } types[] = {
        {"quantize_row_q4_1_ref", T_Q4_1, 20, 32}, {"quantize_row_q5_0_ref", T_Q5_0, 22, 32},
        {"quantize_row_q5_1_ref", T_Q5_1, 24, 32}, {"quantize_row_q5_K_ref", T_Q5_K, 176, 256},
        {"quantize_row_q8_1_ref", T_Q8_1, 36, 32},
    };
    static float x[N_ROWS * ROW];
    make_inputs(x);
    FILE *f = fopen(out, "wb");
    if (!f) {
        perror(out);
        return 1;
    }
    fwrite("KPQR", 1, 4, f);
    put_u32(f, 1);
    put_u32(f, N_ROWS);
    put_u32(f, ROW);
    fwrite(x, sizeof(float), N_ROWS * ROW, f);
    static uint8_t buf[N_ROWS * ROW * 2];
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        qfn q = (qfn)sym(base, types[t].fn);
        const size_t row_bytes = ROW / types[t].block * types[t].block_bytes;
        for (int r = 0; r < N_ROWS; r++) q(x + r * ROW, buf + r * row_bytes, ROW);
        put_u32(f, types[t].type);
        put_u32(f, (uint32_t)(row_bytes * N_ROWS));
        fwrite(buf, 1, row_bytes * N_ROWS, f);
    }
    return fclose(f) == 0 ? 0 : 1;
}

static int cmd_quantize(const char *dir, const char *in, const char *out, int ftype) {
    open_lib(dir, "libggml-base.so");
    open_lib(dir, "libggml.v0.4.0.so");
    void *llama = open_lib(dir, "libllama.v0.4.0.so");
    lq_params (*defaults)(void) = (lq_params(*)(void))sym(llama, "llama_model_quantize_default_params");
    uint32_t (*quantize)(const char *, const char *, const lq_params *) =
        (uint32_t(*)(const char *, const char *, const lq_params *))sym(llama, "llama_model_quantize");
    void (*backend_init)(void) = (void (*)(void))sym(llama, "llama_backend_init");
    backend_init();
    lq_params p = defaults();
    p.ftype = ftype;
    p.pure = true;
    p.nthread = 1;
    return quantize(in, out, &p) == 0 ? 0 : 1;
}

static int cmd_table(const char *dir, const char *path) {
    void *base = open_lib(dir, "libggml-base.so");
    void *(*init)(const char *, struct gguf_init_params_) =
        (void *(*)(const char *, struct gguf_init_params_))sym(base, "gguf_init_from_file");
    int64_t (*n_tensors)(const void *) = (int64_t(*)(const void *))sym(base, "gguf_get_n_tensors");
    const char *(*t_name)(const void *, int64_t) =
        (const char *(*)(const void *, int64_t))sym(base, "gguf_get_tensor_name");
    size_t (*t_off)(const void *, int64_t) = (size_t(*)(const void *, int64_t))sym(base, "gguf_get_tensor_offset");
    size_t (*t_size)(const void *, int64_t) = (size_t(*)(const void *, int64_t))sym(base, "gguf_get_tensor_size");
    int (*t_type)(const void *, int64_t) = (int (*)(const void *, int64_t))sym(base, "gguf_get_tensor_type");
    size_t (*data_off)(const void *) = (size_t(*)(const void *))sym(base, "gguf_get_data_offset");
    int64_t (*find_key)(const void *, const char *) = (int64_t(*)(const void *, const char *))sym(base, "gguf_find_key");
    uint32_t (*get_u32)(const void *, int64_t) = (uint32_t(*)(const void *, int64_t))sym(base, "gguf_get_val_u32");
    const char *(*type_name)(int) = (const char *(*)(int))sym(base, "ggml_type_name");

    struct gguf_init_params_ ip = {true, NULL};
    void *g = init(path, ip);
    if (!g) {
        fprintf(stderr, "%s: not a GGUF file\n", path);
        return 1;
    }
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        return 1;
    }
    const int64_t k = find_key(g, "general.file_type");
    printf("general.file_type %d\n", k >= 0 ? (int)get_u32(g, k) : -1);
    for (int64_t i = 0; i < n_tensors(g); i++) {
        const size_t n = t_size(g, i);
        uint8_t *b = malloc(n);
        if (!b || fseek(f, (long)(data_off(g) + t_off(g, i)), SEEK_SET) != 0 || fread(b, 1, n, f) != n) {
            fprintf(stderr, "%s: cannot read tensor %s\n", path, t_name(g, i));
            return 1;
        }
        uint64_t h = 0xcbf29ce484222325ull;
        for (size_t j = 0; j < n; j++) h = (h ^ b[j]) * 0x100000001b3ull;
        printf("%s %s %zu %016llx\n", t_name(g, i), type_name(t_type(g, i)), n, (unsigned long long)h);
        free(b);
    }
    fclose(f);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 4 && !strcmp(argv[1], "vectors")) return cmd_vectors(argv[2], argv[3]);
    if (argc == 6 && !strcmp(argv[1], "quantize")) return cmd_quantize(argv[2], argv[3], argv[4], atoi(argv[5]));
    if (argc == 4 && !strcmp(argv[1], "table")) return cmd_table(argv[2], argv[3]);
    fprintf(stderr, "usage: llamacpp_quant_ref vectors LIBDIR OUT.bin\n"
                    "       llamacpp_quant_ref quantize LIBDIR IN.gguf OUT.gguf FTYPE\n"
                    "       llamacpp_quant_ref table LIBDIR FILE.gguf\n");
    return 2;
}
