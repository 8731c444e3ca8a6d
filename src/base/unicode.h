/*
 * unicode.h - the small UTF-8 toolbox of kvpin.
 *
 * Three groups of pure functions (no tables to initialise, no state):
 *
 *   1. llama.cpp's lenient UTF-8 reading, used when a tokenizer must turn
 *      arbitrary bytes into code points exactly as llama.cpp does
 *      (kp_unicode_len_utf8, kp_unicode_decode_lenient);
 *   2. the one strict UTF-8 decoder (kp_unicode_utf8_decode), used wherever
 *      text must be valid: the streaming detokenizer (holds back incomplete
 *      characters, replaces invalid bytes with U+FFFD) and /detokenize, the
 *      miss doctor's characters and escapes, canonical JSON's validity check
 *      and member order, chat templates' whitespace stripping;
 *   3. the GPT-2 byte-level mapping between the 256 byte values and 256
 *      printable code points (kp_unicode_byte_to_cpt, kp_unicode_cpt_to_byte).
 */
#ifndef KP_UNICODE_H
#define KP_UNICODE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KP_UNICODE_REPLACEMENT 0xFFFDu

/* Length llama.cpp assigns to a UTF-8 sequence from its first byte alone,
 * by the top four bits: 0x00-0xBF -> 1 (continuation bytes included),
 * 0xC0-0xDF -> 2, 0xE0-0xEF -> 3, 0xF0-0xFF -> 4. The caller clamps it to
 * the bytes that remain. Used to cut text into SPM/BPE symbols. */
size_t kp_unicode_len_utf8(uint8_t lead);

/* Decodes one code point from s[0..n) (n >= 1) the way llama.cpp's
 * unicode_cpts_from_utf8 does: the continuation bytes must be 10xxxxxx and
 * present, but overlong forms and surrogates are accepted as decoded. Any
 * malformed start yields U+FFFD and consumes exactly one byte. One
 * deliberate difference: a 4-byte form whose value exceeds U+10FFFF (which
 * llama.cpp cannot re-encode and throws on) is malformed here too.
 * *consumed (>= 1) receives the number of bytes used. */
uint32_t kp_unicode_decode_lenient(const uint8_t *s, size_t n, size_t *consumed);

/* Encodes cpt (<= 0x10FFFF; surrogates are encoded as their 3-byte form)
 * into out; returns the byte count 1..4, or 0 when cpt > 0x10FFFF. */
size_t kp_unicode_encode(uint32_t cpt, uint8_t out[4]);

/* Strict UTF-8 decoding of the character that starts at s[0..n), n >= 1.
 * Well-formed means one of the byte sequences of the Unicode Standard's
 * Table 3-7 (Unicode 15.0, section 3.9; the same set as RFC 3629):
 *
 *   code points          byte 1   byte 2   byte 3   byte 4
 *   U+0000..U+007F       00..7F
 *   U+0080..U+07FF       C2..DF   80..BF
 *   U+0800..U+0FFF       E0       A0..BF   80..BF
 *   U+1000..U+CFFF       E1..EC   80..BF   80..BF
 *   U+D000..U+D7FF       ED       80..9F   80..BF
 *   U+E000..U+FFFF       EE..EF   80..BF   80..BF
 *   U+10000..U+3FFFF     F0       90..BF   80..BF   80..BF
 *   U+40000..U+FFFFF     F1..F3   80..BF   80..BF   80..BF
 *   U+100000..U+10FFFF   F4       80..8F   80..BF   80..BF
 *
 * so overlong forms (C0, C1, E0 80..9F, F0 80..8F), surrogates (ED A0..BF)
 * and values over U+10FFFF (F4 90..BF, F5..FF) are errors. Returns
 *
 *   k = 1..4   s[0..k) is well-formed; *cpt (when cpt is not NULL)
 *              receives its code point;
 *   0          truncated: s[0..n) is a proper beginning of a well-formed
 *              sequence (more bytes would be needed); *cpt untouched;
 *   -k, 1..3   ill-formed: s[0..k) is a maximal subpart, the longest
 *              beginning of a well-formed sequence that s starts with, or
 *              the lone first byte when none starts with it (section 3.9,
 *              "U+FFFD Substitution of Maximal Subparts": replace those k
 *              bytes with one U+FFFD and go on at s[k]); *cpt untouched. */
int kp_unicode_utf8_decode(const uint8_t *s, size_t n, uint32_t *cpt);

/* True when s[0..n) is a sequence of well-formed characters (as above),
 * none cut short by the end; true for n == 0. */
bool kp_unicode_utf8_valid(const uint8_t *s, size_t n);

/* Copies s[0..n) to out, every maximal subpart that is not well-formed
 * (and a character cut short by the end) replaced by one U+FFFD, so the
 * result is valid UTF-8 that keeps every well-formed character. out holds
 * at least 3 * n bytes (a byte becomes at most one 3-byte U+FFFD). Returns
 * the bytes written. */
size_t kp_unicode_utf8_repair(const uint8_t *s, size_t n, uint8_t *out);

/* GPT-2 byte-level mapping: the printable bytes '!'..'~', 0xA1..0xAC and
 * 0xAE..0xFF map to themselves; the other 68 bytes map, in increasing byte
 * order, to U+0100, U+0101, ... (so ' ' -> U+0120 'Ġ', '\n' -> U+010A 'Ċ'). */
uint32_t kp_unicode_byte_to_cpt(uint8_t byte);

/* Inverse of kp_unicode_byte_to_cpt; -1 for a code point outside the mapping. */
int kp_unicode_cpt_to_byte(uint32_t cpt);

#endif
