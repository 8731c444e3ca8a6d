/*
 * unicode.c - UTF-8 reading (lenient and strict) and the GPT-2 byte map.
 *
 * Owns no state: every function is pure arithmetic over its arguments.
 *
 * Lenient decoding (llama.cpp's rules, used on tokenizer input):
 *
 *   first byte   continuation bytes   result
 *   0xxxxxxx     -                    the byte
 *   10xxxxxx     -                    U+FFFD, 1 byte consumed
 *   110xxxxx     1 x 10xxxxxx         value (overlongs kept)
 *   1110xxxx     2 x 10xxxxxx         value (overlongs, surrogates kept)
 *   11110xxx     3 x 10xxxxxx         value if <= U+10FFFF, else U+FFFD/1 byte
 *   11111xxx     -                    U+FFFD, 1 byte consumed
 *   any lead whose continuations are missing or malformed: U+FFFD, 1 byte.
 *
 * Strict decoding (Unicode Table 3-7, drawn in unicode.h): the first byte
 * gives the length and the range the second byte must fall in (E0, ED, F0
 * and F4 narrow it; that is what excludes overlongs, surrogates and values
 * over U+10FFFF); every later byte is 80..BF. The first byte outside its
 * range ends a maximal subpart.
 *
 * GPT-2 byte map: 188 printable bytes map to themselves; the remaining 68
 * (0x00-0x20, 0x7F-0xA0, 0xAD) map in order to U+0100..U+0143.
 */
#include "base/unicode.h"

#include <string.h>

size_t kp_unicode_len_utf8(uint8_t lead) {
    static const uint8_t by_high_nibble[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return by_high_nibble[lead >> 4];
}

static int is_cont(uint8_t b) { return (b & 0xC0) == 0x80; }

uint32_t kp_unicode_decode_lenient(const uint8_t *s, size_t n, size_t *consumed) {
    uint8_t b0 = s[0];
    *consumed = 1;
    if (b0 < 0x80) return b0;
    if (!(b0 & 0x40)) return KP_UNICODE_REPLACEMENT;
    if (!(b0 & 0x20)) {
        if (n < 2 || !is_cont(s[1])) return KP_UNICODE_REPLACEMENT;
        *consumed = 2;
        return ((uint32_t)(b0 & 0x1F) << 6) | (s[1] & 0x3Fu);
    }
    if (!(b0 & 0x10)) {
        if (n < 3 || !is_cont(s[1]) || !is_cont(s[2])) return KP_UNICODE_REPLACEMENT;
        *consumed = 3;
        return ((uint32_t)(b0 & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3Fu);
    }
    if (!(b0 & 0x08)) {
        if (n < 4 || !is_cont(s[1]) || !is_cont(s[2]) || !is_cont(s[3])) return KP_UNICODE_REPLACEMENT;
        uint32_t cpt = ((uint32_t)(b0 & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) |
                       ((uint32_t)(s[2] & 0x3F) << 6) | (s[3] & 0x3Fu);
        if (cpt > 0x10FFFF) return KP_UNICODE_REPLACEMENT;
        *consumed = 4;
        return cpt;
    }
    return KP_UNICODE_REPLACEMENT;
}

size_t kp_unicode_encode(uint32_t cpt, uint8_t out[4]) {
    if (cpt <= 0x7F) {
        out[0] = (uint8_t)cpt;
        return 1;
    }
    if (cpt <= 0x7FF) {
        out[0] = (uint8_t)(0xC0 | (cpt >> 6));
        out[1] = (uint8_t)(0x80 | (cpt & 0x3F));
        return 2;
    }
    if (cpt <= 0xFFFF) {
        out[0] = (uint8_t)(0xE0 | (cpt >> 12));
        out[1] = (uint8_t)(0x80 | ((cpt >> 6) & 0x3F));
        out[2] = (uint8_t)(0x80 | (cpt & 0x3F));
        return 3;
    }
    if (cpt <= 0x10FFFF) {
        out[0] = (uint8_t)(0xF0 | (cpt >> 18));
        out[1] = (uint8_t)(0x80 | ((cpt >> 12) & 0x3F));
        out[2] = (uint8_t)(0x80 | ((cpt >> 6) & 0x3F));
        out[3] = (uint8_t)(0x80 | (cpt & 0x3F));
        return 4;
    }
    return 0;
}

int kp_unicode_utf8_decode(const uint8_t *s, size_t n, uint32_t *cpt) {
    uint8_t b0 = s[0];
    int need;
    uint8_t lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
    uint32_t value;
    if (b0 < 0x80) {
        if (cpt) *cpt = b0;
        return 1;
    }
    if (b0 >= 0xC2 && b0 <= 0xDF) {
        need = 2;
        value = b0 & 0x1Fu;
    } else if (b0 >= 0xE0 && b0 <= 0xEF) {
        need = 3;
        value = b0 & 0x0Fu;
        if (b0 == 0xE0) lo = 0xA0;
        if (b0 == 0xED) hi = 0x9F;
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
        need = 4;
        value = b0 & 0x07u;
        if (b0 == 0xF0) lo = 0x90;
        if (b0 == 0xF4) hi = 0x8F;
    } else {
        return -1;
    }
    for (int i = 1; i < need; i++) {
        if ((size_t)i >= n) return 0;
        uint8_t b = s[i];
        uint8_t l = i == 1 ? lo : 0x80, h = i == 1 ? hi : 0xBF;
        if (b < l || b > h) return -i;
        value = (value << 6) | (b & 0x3Fu);
    }
    if (cpt) *cpt = value;
    return need;
}

bool kp_unicode_utf8_valid(const uint8_t *s, size_t n) {
    for (size_t i = 0; i < n;) {
        int k = kp_unicode_utf8_decode(s + i, n - i, NULL);
        if (k <= 0) return false;
        i += (size_t)k;
    }
    return true;
}

size_t kp_unicode_utf8_repair(const uint8_t *s, size_t n, uint8_t *out) {
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        int step = kp_unicode_utf8_decode(s + i, n - i, NULL);
        if (step > 0) {
            memcpy(out + k, s + i, (size_t)step);
            k += (size_t)step;
            i += (size_t)step;
            continue;
        }
        memcpy(out + k, "\xEF\xBF\xBD", 3);
        k += 3;
        i = step < 0 ? i + (size_t)-step : n; /* 0: a character cut short by the end */
    }
    return k;
}

uint32_t kp_unicode_byte_to_cpt(uint8_t byte) {
    if ((byte >= 0x21 && byte <= 0x7E) || (byte >= 0xA1 && byte <= 0xAC) || byte >= 0xAE) return byte;
    if (byte <= 0x20) return 0x100u + byte;              /* 33 bytes: U+0100..U+0120 */
    if (byte >= 0x7F && byte <= 0xA0) return 0x121u + (byte - 0x7Fu); /* 34: U+0121..U+0142 */
    return 0x143;                                         /* 0xAD */
}

int kp_unicode_cpt_to_byte(uint32_t cpt) {
    if ((cpt >= 0x21 && cpt <= 0x7E) || (cpt >= 0xA1 && cpt <= 0xAC) || (cpt >= 0xAE && cpt <= 0xFF))
        return (int)cpt;
    if (cpt >= 0x100 && cpt <= 0x120) return (int)(cpt - 0x100);
    if (cpt >= 0x121 && cpt <= 0x142) return (int)(0x7F + (cpt - 0x121));
    if (cpt == 0x143) return 0xAD;
    return -1;
}
