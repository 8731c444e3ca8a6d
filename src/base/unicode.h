/*
 * unicode.h - the small UTF-8 toolbox the tokenizer needs.
 *
 * Three groups of pure functions (no tables to initialise, no state):
 *
 *   1. llama.cpp's lenient UTF-8 reading, used when a tokenizer must turn
 *      arbitrary bytes into code points exactly as llama.cpp does
 *      (kp_unicode_len_utf8, kp_unicode_decode_lenient);
 *   2. strict UTF-8 checking for output (kp_unicode_utf8_next), used by the
 *      streaming detokenizer to hold back incomplete characters and to
 *      replace invalid bytes with U+FFFD;
 *   3. the GPT-2 byte-level mapping between the 256 byte values and 256
 *      printable code points (kp_unicode_byte_to_cpt, kp_unicode_cpt_to_byte).
 */
#ifndef KP_UNICODE_H
#define KP_UNICODE_H

#include <stddef.h>
#include <stdint.h>

#define UNICODE_REPLACEMENT 0xFFFDu

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

/* Strict UTF-8 (RFC 3629: no overlongs, no surrogates, <= U+10FFFF) look at
 * the sequence starting at s[0..n), n >= 1. Returns
 *   k > 0   a valid character of k bytes starts here;
 *   0       the n bytes are a valid but incomplete beginning (more needed);
 *   -k < 0  the first k bytes are a maximal invalid subpart (W3C/Unicode
 *           "best practice"): replace them with one U+FFFD and go on. */
int kp_unicode_utf8_next(const uint8_t *s, size_t n);

/* GPT-2 byte-level mapping: the printable bytes '!'..'~', 0xA1..0xAC and
 * 0xAE..0xFF map to themselves; the other 68 bytes map, in increasing byte
 * order, to U+0100, U+0101, ... (so ' ' -> U+0120 'Ġ', '\n' -> U+010A 'Ċ'). */
uint32_t kp_unicode_byte_to_cpt(uint8_t byte);

/* Inverse of kp_unicode_byte_to_cpt; -1 for a code point outside the mapping. */
int kp_unicode_cpt_to_byte(uint32_t cpt);

#endif
