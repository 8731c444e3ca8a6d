/*
 * canon.h - canonical JSON bytes (RFC 8785, the JSON Canonicalization
 * Scheme) (floor 0).
 *
 * Two JSON documents that mean the same thing (same members in any order,
 * any whitespace, any escaping, "1E2" or "100.0" for 100) have the same
 * canonical bytes. kvpin serializes tool schemas and tool-call arguments
 * this way, so a client that reorders keys still sends a byte-identical
 * prompt and hits the prefix cache.
 *
 *   {"b": [1E2, 0.50], "a": "\u00e9\/"}   ->   {"a":"é/","b":[100,0.5]}
 *
 * The rules (RFC 8785 section 3.2):
 *
 *   whitespace  none between tokens
 *   literals    null true false
 *   numbers     IEEE-754 doubles printed as ECMAScript Number::toString:
 *               shortest digits that read back to the same double;
 *               integer form below 1e21 ("100", "1e+21"), fraction form
 *               for 1e-6 <= |x| < 1e21 ("0.000001", "1e-7"); -0 is "0";
 *               NaN and infinities are refused
 *   strings     \b \t \n \f \r \" \\ as two-character escapes, other
 *               controls below U+0020 as \u00xx (lowercase hex), every other
 *               character as its UTF-8 bytes (including "/", DEL, U+2028)
 *   objects     members sorted by name, names compared as arrays of UTF-16
 *               code units (so U+1F600, D83D DE00, sorts before U+FB33)
 *   arrays      order kept
 *
 * Integers are doubles too: 9007199254740993 comes out as 9007199254740992,
 * as in every I-JSON consumer (JavaScript, RFC 7493).
 *
 * All functions are pure: no global state, safe from any number of threads.
 */
#ifndef KP_CANON_H
#define KP_CANON_H

#include <jansson.h>
#include <stddef.h>

#include "base/status.h"

/* Containers nested deeper than this are refused (KP_ERANGE): the writer
 * recurses once per level, and a json_t built by code may even be cyclic. */
#define KP_CANON_MAX_DEPTH 512

/* Room for any number kp_canon_number writes, with its NUL
 * ("-1.7976931348623157e+308" is 24 bytes, "-0.0000012345678901234567" 25). */
#define KP_CANON_NUMBER_MAX 32

/* Writes the canonical text of the double x into out (NUL-terminated) and
 * returns its length; returns 0 and writes "" when x is NaN or infinite. */
size_t kp_canon_number(double x, char out[KP_CANON_NUMBER_MAX]);

/* The canonical bytes of the JSON value v (borrowed, not modified; any
 * type may be the top level). On success *out is a malloc'd NUL-terminated
 * string the caller frees and *len its length (strings may hold U+0000,
 * escaped as \u0000, so the text itself never holds a NUL byte).
 * Errors: KP_EINVAL for a non-finite real or a string that is not valid
 * UTF-8 (possible only for values built with jansson's *_nocheck calls),
 * KP_ERANGE for nesting deeper than KP_CANON_MAX_DEPTH, KP_ENOMEM. On error
 * *out is NULL and *len 0. */
kp_status kp_canon_dump(const json_t *v, char **out, size_t *len, kp_error *err);

/* Parses the JSON text json[0..len) and returns its canonical bytes as
 * kp_canon_dump does. Any JSON value may be the top level; text after it
 * other than whitespace is an error. Every number is read as a double
 * (jansson's JSON_DECODE_INT_AS_REAL), numbers too large for a double are
 * refused, an object that repeats a member name is refused (RFC 8785
 * requires unique names), \u0000 is allowed in string values but not in
 * member names (jansson's parser refuses it there).
 * A parse error returns KP_EFORMAT with a message that starts with
 * "LINE:COLUMN: " (1-based, as jansson counts them) so a caller can put a
 * file name in front: "request.json:3:14: string or '}' expected near ','".
 * Other errors as kp_canon_dump. */
kp_status kp_canon_text(const char *json, size_t len, char **out, size_t *out_len,
                        kp_error *err);

#endif
