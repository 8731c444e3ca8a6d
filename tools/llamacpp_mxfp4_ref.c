/*
 * llamacpp_mxfp4_ref.c - tests/data/quant_more/mxfp4_ref.bin: rows of
 * floats and their MXFP4 encodings by llama.cpp's own quantize_row_mxfp4_ref
 * (libggml-base.so, loaded with dlopen), so no kvpin code computes the
 * expected bytes.
 *
 *   llamacpp_mxfp4_ref LIBGGML_BASE.so OUT.bin
 *
 * Inputs: 64 blocks of 32 floats chosen to reach every branch of the
 * quantizer: Gaussian-like blocks from 2^-30 to 2^30 (the scale byte from
 * near 0 to over 150), blocks of multiples of 0.25 under a largest |x| of 6
 * (so that many values fall exactly halfway between two codes: the tie goes
 * to the lower code), an all-zero block (scale 0), a block of values near
 * 2^-121 (scale bytes 2 and 3), all-negative blocks and a spike per block.
 * Not below: a block whose largest |x| is under 2^-125 makes llama.cpp
 * convert a negative float to uint8_t, which C leaves undefined (x86 gives
 * e.g. 244, a scale of 2^116); kvpin writes scale 0 there (quant_ref.c). Format
 * (little-endian): "KPMX", u32 n_blocks, f32 inputs[n_blocks * 32], then
 * n_blocks x 17 bytes of ggml's block_mxfp4.
 *
 * Build: cc -O1 -o llamacpp_mxfp4_ref tools/llamacpp_mxfp4_ref.c -ldl -lm
 * (tests/data/quant_more/README.md says which llama.cpp made the file).
 */
#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define N_BLOCKS 64

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: llamacpp_mxfp4_ref LIBGGML_BASE.so OUT.bin\n");
        return 2;
    }
    void *h = dlopen(argv[1], RTLD_NOW);
    if (!h) {
        fprintf(stderr, "dlopen %s: %s\n", argv[1], dlerror());
        return 1;
    }
    void (*quantize)(const float *, void *, int64_t);
    *(void **)&quantize = dlsym(h, "quantize_row_mxfp4_ref");
    if (!quantize) {
        fprintf(stderr, "%s has no quantize_row_mxfp4_ref\n", argv[1]);
        return 1;
    }
    static float x[N_BLOCKS * 32];
    static uint8_t q[N_BLOCKS * 17];
    uint64_t s = 88172645463325252ull;
    for (int i = 0; i < N_BLOCKS * 32; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        double u = (double)(s >> 11) * 0x1p-53;
        int b = i / 32, j = i % 32;
        float v = (float)((u - 0.5) * ldexp(1.0, (b * 7) % 61 - 30)); /* scales 2^-30 .. 2^30 */
        if (b % 8 == 1) v = (float)((int)((u - 0.5) * 48)) * 0.25f; /* multiples of 0.25 */
        if (b % 8 == 1 && j == 0) v = 6.0f;                        /* amax 6: steps of 0.5 */
        if (b % 8 == 3) v = -fabsf(v);                             /* all negative */
        if (b % 8 == 5 && j == 7) v *= 64;                         /* a spike */
        if (b == 6) v = 0;                                          /* all zero */
        if (b == 14) v = (float)((u - 0.5) * 0x1p-120);             /* the smallest scales (e = 2, 3) */
        x[i] = v;
    }
    quantize(x, q, N_BLOCKS * 32);
    FILE *o = fopen(argv[2], "wb");
    uint32_t n = N_BLOCKS;
    if (!o || fwrite("KPMX", 1, 4, o) != 4 || fwrite(&n, 4, 1, o) != 1 || fwrite(x, sizeof x, 1, o) != 1 ||
        fwrite(q, sizeof q, 1, o) != 1 || fclose(o) != 0) {
        fprintf(stderr, "cannot write %s\n", argv[2]);
        return 1;
    }
    printf("%s: %d blocks\n", argv[2], N_BLOCKS);
    return 0;
}
