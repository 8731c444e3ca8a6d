/*
 * dtype.c - the table of ggml/GGUF tensor types (see dtype.h).
 *
 * Block geometries follow ggml's type traits: QK_K = 256 for the K-quants,
 * 32 for the legacy block types. The table is constant; nothing here mutates.
 */
#include "gguf/dtype.h"

#include <strings.h>

#define T(id, nm, bs, ts, k) [id] = {nm, bs, ts, k}

static const kp_dtype_info dtype_table[KP_DTYPE_COUNT_] = {
    T(KP_DTYPE_F32, "F32", 1, 4, true),
    T(KP_DTYPE_F16, "F16", 1, 2, true),
    T(KP_DTYPE_Q4_0, "Q4_0", 32, 18, true),
    T(KP_DTYPE_Q4_1, "Q4_1", 32, 20, true),
    T(KP_DTYPE_Q5_0, "Q5_0", 32, 22, true),
    T(KP_DTYPE_Q5_1, "Q5_1", 32, 24, true),
    T(KP_DTYPE_Q8_0, "Q8_0", 32, 34, true),
    T(KP_DTYPE_Q8_1, "Q8_1", 32, 36, false),
    T(KP_DTYPE_Q2_K, "Q2_K", 256, 84, false),
    T(KP_DTYPE_Q3_K, "Q3_K", 256, 110, false),
    T(KP_DTYPE_Q4_K, "Q4_K", 256, 144, true),
    T(KP_DTYPE_Q5_K, "Q5_K", 256, 176, true),
    T(KP_DTYPE_Q6_K, "Q6_K", 256, 210, true),
    T(KP_DTYPE_Q8_K, "Q8_K", 256, 292, true),
    T(KP_DTYPE_IQ2_XXS, "IQ2_XXS", 256, 66, false),
    T(KP_DTYPE_IQ2_XS, "IQ2_XS", 256, 74, false),
    T(KP_DTYPE_IQ3_XXS, "IQ3_XXS", 256, 98, false),
    T(KP_DTYPE_IQ1_S, "IQ1_S", 256, 50, false),
    T(KP_DTYPE_IQ4_NL, "IQ4_NL", 32, 18, false),
    T(KP_DTYPE_IQ3_S, "IQ3_S", 256, 110, false),
    T(KP_DTYPE_IQ2_S, "IQ2_S", 256, 82, false),
    T(KP_DTYPE_IQ4_XS, "IQ4_XS", 256, 136, false),
    T(KP_DTYPE_I8, "I8", 1, 1, false),
    T(KP_DTYPE_I16, "I16", 1, 2, false),
    T(KP_DTYPE_I32, "I32", 1, 4, false),
    T(KP_DTYPE_I64, "I64", 1, 8, false),
    T(KP_DTYPE_F64, "F64", 1, 8, false),
    T(KP_DTYPE_IQ1_M, "IQ1_M", 256, 56, false),
    T(KP_DTYPE_BF16, "BF16", 1, 2, true),
    T(KP_DTYPE_TQ1_0, "TQ1_0", 256, 54, false),
    T(KP_DTYPE_TQ2_0, "TQ2_0", 256, 66, false),
    T(KP_DTYPE_MXFP4, "MXFP4", 32, 17, true),
};

const kp_dtype_info *kp_dtype_get(uint32_t id) {
    if (id >= KP_DTYPE_COUNT_ || dtype_table[id].name == NULL) return NULL;
    return &dtype_table[id];
}

const char *kp_dtype_name(uint32_t id) {
    const kp_dtype_info *t = kp_dtype_get(id);
    return t ? t->name : "?";
}

size_t kp_dtype_row_size(uint32_t id, int64_t n) {
    const kp_dtype_info *t = kp_dtype_get(id);
    if (!t || n < 0 || n % t->block_size != 0) return 0;
    return (size_t)(n / t->block_size) * t->type_size;
}

bool kp_dtype_parse(const char *name, kp_dtype *out) {
    for (uint32_t i = 0; i < KP_DTYPE_COUNT_; i++) {
        if (dtype_table[i].name && strcasecmp(dtype_table[i].name, name) == 0) {
            *out = (kp_dtype)i;
            return true;
        }
    }
    return false;
}
