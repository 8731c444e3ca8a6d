/*
 * quant_blocks.h - private to src/kernels/quant_*.c: the block structs of
 * every element type with kernels, and their byte layouts, exactly
 * llama.cpp's (ggml-common.h). Nothing outside src/kernels/ includes this
 * file; the public contract is quant.h.
 *
 * Invariants: each struct has the size and field offsets of the table
 * above it (checked by _Static_assert below); structs are read in place
 * from the model mapping, so they hold only uint8_t/int8_t/uint16_t/
 * int16_t/float fields with the natural alignment quant.h promises. All
 * multi-byte fields are little-endian; `half` is IEEE binary16.
 *
 *   F32, F16, BF16: one element per "block" (4, 2, 2 bytes); no struct.
 *
 *   Q8_0  (32 elements, 34 bytes)     x[i] = d * qs[i]
 *   +0  half d
 *   +2  int8 qs[32]
 *
 *   Q4_0  (32 elements, 18 bytes)     x[i] = d * (q[i] - 8), q in 0..15
 *   +0  half d
 *   +2  uint8 qs[16]   q[j] = qs[j] & 15, q[j+16] = qs[j] >> 4   (j < 16)
 *
 *   Q4_1  (32 elements, 20 bytes)     x[i] = d * q[i] + m, q in 0..15
 *   +0  half d
 *   +2  half m
 *   +4  uint8 qs[16]   q[j] = qs[j] & 15, q[j+16] = qs[j] >> 4   (j < 16)
 *
 *   Q5_0  (32 elements, 22 bytes)     x[i] = d * (q[i] - 16), q in 0..31
 *   +0  half d
 *   +2  uint8 qh[4]    h = qh as a little-endian uint32; bit i of h is bit 4 of q[i]
 *   +6  uint8 qs[16]   low 4 bits as in Q4_1:
 *                      q[j] = (qs[j] & 15) | (h >> j & 1) << 4
 *                      q[j+16] = (qs[j] >> 4) | (h >> (j+16) & 1) << 4
 *
 *   Q5_1  (32 elements, 24 bytes)     x[i] = d * q[i] + m, q in 0..31
 *   +0  half d
 *   +2  half m
 *   +4  uint8 qh[4]    as in Q5_0
 *   +8  uint8 qs[16]   as in Q5_0
 *
 *   MXFP4 (32 elements, 17 bytes; OCP microscaling, ggml's block_mxfp4)
 *   +0  uint8 e        E8M0 shared scale 2^(e - 127)
 *   +1  uint8 qs[16]   E2M1 codes, c[j] = qs[j] & 15, c[j+16] = qs[j] >> 4
 *       An E2M1 code (sign bit 3, 2 exponent bits, 1 mantissa bit) is one of
 *       0, 0.5, 1, 1.5, 2, 3, 4, 6 or their negatives. As ggml, kvpin keeps
 *       the values doubled as integers (kp_mxfp4_values: 0 1 2 3 4 6 8 12,
 *       then negated) and the scale halved:
 *       x[i] = kp_mxfp4_values[c[i]] * 2^(e - 128)   (e = 0, 1: subnormal)
 *
 *   Q8_1  (32 elements, 36 bytes; activations of Q4_1 and Q5_1 only, as
 *   +0  half d         llama.cpp uses it)        x[i] = d * qs[i]
 *   +2  half s         d * (qs[0] + ... + qs[31]), rounded to half: the
 *                      block sum that the "+ m" term of Q4_1/Q5_1 needs
 *   +4  int8 qs[32]
 *
 *   Q4_K  (256 elements = 8 sub-blocks of 32, 144 bytes)
 *   +0  half d         super-block scale of the 6-bit sub-block scales
 *   +2  half dmin      super-block scale of the 6-bit sub-block mins
 *   +4  uint8 scales[12]  8 scales sc[j] and 8 mins m[j], 6 bits each:
 *         j < 4:  sc[j] = scales[j] & 63          m[j] = scales[j+4] & 63
 *         j >= 4: sc[j] = (scales[j+4] & 15) | (scales[j-4] >> 6) << 4
 *                 m[j]  = (scales[j+4] >> 4) | (scales[j]   >> 6) << 4
 *   +16 uint8 qs[128]  4-bit quants; for chunk c < 4 (64 elements) and l < 32:
 *         q[64c + l] = qs[32c + l] & 15,  q[64c + 32 + l] = qs[32c + l] >> 4
 *       x[i] = d * sc[i/32] * q[i] - dmin * m[i/32]
 *
 *   Q5_K  (256 elements = 8 sub-blocks of 32, 176 bytes)
 *   +0  half d         super-block scale of the 6-bit sub-block scales
 *   +2  half dmin      super-block scale of the 6-bit sub-block mins
 *   +4  uint8 scales[12]  sc[8], m[8] packed exactly as Q4_K's
 *   +16 uint8 qh[32]   bit 4 of the quants: for chunk c < 4 (64 elements), l < 32:
 *   +48 uint8 qs[128]    q[64c + l]      = (qs[32c + l] & 15) | (qh[l] >> 2c     & 1) << 4
 *                        q[64c + 32 + l] = (qs[32c + l] >> 4) | (qh[l] >> (2c+1) & 1) << 4
 *       x[i] = d * sc[i/32] * q[i] - dmin * m[i/32],  q in 0..31
 *
 *   Q6_K  (256 elements = 16 sub-blocks of 16, 210 bytes)
 *   +0   uint8 ql[128]  low 4 bits      for half h < 2, l < 32 (base = 128h):
 *   +128 uint8 qh[64]   high 2 bits       q[base+l]    = ql[64h+l] & 15    | (qh[32h+l] >> 0 & 3) << 4
 *   +192 int8 scales[16]                  q[base+l+32] = ql[64h+l+32] & 15 | (qh[32h+l] >> 2 & 3) << 4
 *   +208 half d                           q[base+l+64] = ql[64h+l] >> 4    | (qh[32h+l] >> 4 & 3) << 4
 *                                         q[base+l+96] = ql[64h+l+32] >> 4 | (qh[32h+l] >> 6 & 3) << 4
 *       x[i] = d * scales[i/16] * (q[i] - 32)
 *
 *   Q8_K  (256 elements, 292 bytes; activations only, never in files)
 *   +0   float d
 *   +4   int8 qs[256]      x[i] = d * qs[i]
 *   +260 int16 bsums[16]   bsums[j] = sum of qs[16j .. 16j+15]
 *
 * Dot products pair each weight type with the activation type llama.cpp
 * uses for it (kp_vec_dot_type): F32/F16/BF16 with themselves, Q8_0, Q4_0,
 * Q5_0 and MXFP4 with Q8_0, Q4_1 and Q5_1 with Q8_1, Q4_K, Q5_K and Q6_K with
 * Q8_K. With Q8_1 the dot product of one block is
 *   d_w * d_a * sum(q_w * q_a) + m_w * s_a
 * (the stored s, not the exact sum, as in llama.cpp).
 *
 * Below the structs: the reference reading of the packed fields (the Q4_K/
 * Q5_K scales and mins, the 5-bit and 6-bit quants), inline, shared by the
 * dequantizers (quant_ref.c) and the portable kernels (quant_scalar.c).
 */
#ifndef KP_QUANT_BLOCKS_H
#define KP_QUANT_BLOCKS_H

#include <stddef.h>
#include <string.h>
#include <stdint.h>

#define KP_QK8_0 32
#define KP_QK4_0 32
#define KP_QK4_1 32
#define KP_QK5_0 32
#define KP_QK5_1 32
#define KP_QK8_1 32
#define KP_QK_K 256
#define KP_QK_MXFP4 32

typedef struct {
    uint16_t d; /* half */
    int8_t qs[KP_QK8_0];
} kp_block_q8_0;

typedef struct {
    uint16_t d; /* half */
    uint8_t qs[KP_QK4_0 / 2];
} kp_block_q4_0;

typedef struct {
    uint16_t d; /* half */
    uint16_t m; /* half */
    uint8_t qs[KP_QK4_1 / 2];
} kp_block_q4_1;

/* MXFP4: the table at the top; alignment 1. */
typedef struct {
    uint8_t e;
    uint8_t qs[KP_QK_MXFP4 / 2];
} kp_block_mxfp4;

/* The doubled E2M1 values by code (see kp_block_mxfp4). */
static const int8_t kp_mxfp4_values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/* 2^(e - 128) as a float (e = 0 and 1 give the subnormals 2^-128, 2^-127):
 * an MXFP4 block's scale for the doubled values. */
static inline float kp_e8m0_half(uint8_t e) {
    uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

typedef struct {
    uint16_t d; /* half */
    uint8_t qh[4];
    uint8_t qs[KP_QK5_0 / 2];
} kp_block_q5_0;

typedef struct {
    uint16_t d; /* half */
    uint16_t m; /* half */
    uint8_t qh[4];
    uint8_t qs[KP_QK5_1 / 2];
} kp_block_q5_1;

typedef struct {
    uint16_t d; /* half */
    uint16_t s; /* half: d * sum(qs) */
    int8_t qs[KP_QK8_1];
} kp_block_q8_1;

typedef struct {
    uint16_t d;    /* half: scale of the 6-bit scales */
    uint16_t dmin; /* half: scale of the 6-bit mins */
    uint8_t scales[12];
    uint8_t qs[KP_QK_K / 2];
} kp_block_q4_K;

typedef struct {
    uint16_t d;    /* half: scale of the 6-bit scales */
    uint16_t dmin; /* half: scale of the 6-bit mins */
    uint8_t scales[12];
    uint8_t qh[KP_QK_K / 8];
    uint8_t qs[KP_QK_K / 2];
} kp_block_q5_K;

typedef struct {
    uint8_t ql[KP_QK_K / 2];
    uint8_t qh[KP_QK_K / 4];
    int8_t scales[KP_QK_K / 16];
    uint16_t d; /* half */
} kp_block_q6_K;

typedef struct {
    float d;
    int8_t qs[KP_QK_K];
    int16_t bsums[KP_QK_K / 16];
} kp_block_q8_K;

_Static_assert(sizeof(kp_block_q8_0) == 34, "Q8_0 block is 34 bytes");
_Static_assert(sizeof(kp_block_q4_0) == 18, "Q4_0 block is 18 bytes");
_Static_assert(sizeof(kp_block_q4_1) == 20, "Q4_1 block is 20 bytes");
_Static_assert(sizeof(kp_block_mxfp4) == 17, "MXFP4 block is 17 bytes");
_Static_assert(sizeof(kp_block_q5_0) == 22, "Q5_0 block is 22 bytes");
_Static_assert(sizeof(kp_block_q5_1) == 24, "Q5_1 block is 24 bytes");
_Static_assert(sizeof(kp_block_q8_1) == 36, "Q8_1 block is 36 bytes");
_Static_assert(sizeof(kp_block_q4_K) == 144, "Q4_K block is 144 bytes");
_Static_assert(sizeof(kp_block_q5_K) == 176, "Q5_K block is 176 bytes");
_Static_assert(sizeof(kp_block_q6_K) == 210, "Q6_K block is 210 bytes");
_Static_assert(sizeof(kp_block_q8_K) == 292, "Q8_K block is 292 bytes");
_Static_assert(offsetof(kp_block_q5_K, qh) == 16 && offsetof(kp_block_q5_K, qs) == 48, "Q5_K offsets");
_Static_assert(offsetof(kp_block_q6_K, d) == 208, "Q6_K offsets");
_Static_assert(offsetof(kp_block_q8_K, bsums) == 260, "Q8_K offsets");

/* Q4_K/Q5_K: sc[j], m[j] from the 12 packed scale bytes (table above). */
static inline void unpack_k_scales(const uint8_t q[12], uint8_t sc[8], uint8_t m[8]) {
    for (int j = 0; j < 4; j++) {
        sc[j] = q[j] & 63;
        m[j] = q[j + 4] & 63;
    }
    for (int j = 4; j < 8; j++) {
        sc[j] = (uint8_t)((q[j + 4] & 0xF) | (q[j - 4] >> 6) << 4);
        m[j] = (uint8_t)((q[j + 4] >> 4) | (q[j] >> 6) << 4);
    }
}

/* Q5_0/Q5_1: the 32 quants (0..31) of a block. */
static inline void unpack_q5(const uint8_t qh[4], const uint8_t qs[16], uint8_t q[32]) {
    const uint32_t h = (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 |
                       (uint32_t)qh[3] << 24;
    for (int j = 0; j < 16; j++) {
        q[j] = (uint8_t)((qs[j] & 0xF) | ((h >> j) & 1) << 4);
        q[j + 16] = (uint8_t)((qs[j] >> 4) | ((h >> (j + 16)) & 1) << 4);
    }
}

/* Q5_K: the 256 quants (0..31) of a block. */
static inline void unpack_q5_K(const kp_block_q5_K *x, uint8_t q[KP_QK_K]) {
    for (int c = 0; c < 4; c++) {
        for (int l = 0; l < 32; l++) {
            const uint8_t b = x->qs[32 * c + l], h = x->qh[l];
            q[64 * c + l] = (uint8_t)((b & 0xF) | ((h >> (2 * c)) & 1) << 4);
            q[64 * c + 32 + l] = (uint8_t)((b >> 4) | ((h >> (2 * c + 1)) & 1) << 4);
        }
    }
}

/* Q6_K: the 256 signed quants (q - 32) of a block. */
static inline void unpack_q6_K(const kp_block_q6_K *x, int8_t q[KP_QK_K]) {
    const uint8_t *ql = x->ql, *qh = x->qh;
    for (int h = 0; h < 2; h++, ql += 64, qh += 32, q += 128) {
        for (int l = 0; l < 32; l++) {
            q[l] = (int8_t)(((ql[l] & 0xF) | ((qh[l] >> 0) & 3) << 4) - 32);
            q[l + 32] = (int8_t)(((ql[l + 32] & 0xF) | ((qh[l] >> 2) & 3) << 4) - 32);
            q[l + 64] = (int8_t)(((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4) - 32);
            q[l + 96] = (int8_t)(((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4) - 32);
        }
    }
}

#endif
