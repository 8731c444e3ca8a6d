/*
 * numrange.h - JSON numbers within bounds as grammar rules (floor 4,
 * internal to src/grammar/: schema.c compiles JSON Schema's minimum,
 * maximum, exclusiveMinimum and exclusiveMaximum with it).
 *
 * A range is written out digit by digit, the way a regular expression
 * for 0..255 is: [lo, hi] splits by digit count, and a run of equal
 * length splits at the first digit where lo and hi differ:
 *
 *   integers in [7, 342]:  [7-9] | [1-9][0-9] | [1-2][0-9][0-9] | 3[0-3][0-9] | 34[0-2]
 *
 * so every document the rule matches is in range and every integer in
 * range has exactly one spelling that matches (no leading zeros; "0"; "-"
 * for negatives; "-0" never for an integer). A number (not only an
 * integer) is an integer part in range followed by a fraction that keeps
 * it there: any fraction where the integer part is strictly inside the
 * bounds, only zeros at an inclusive upper bound (3 <= 3.000), at least
 * one nonzero digit above an exclusive lower one (0 < 0.5), none at all
 * at an exclusive upper one. Numbers with bounds have no exponent. The
 * bounds themselves are integers (a schema's fractional bound is refused
 * by the caller for numbers, rounded inward for integers), at most
 * KP_GNUM_MAX in magnitude: the integer part of any JSON number the
 * grammars write has at most 18 digits.
 */
#ifndef KP_GRAMMAR_NUMRANGE_H
#define KP_GRAMMAR_NUMRANGE_H

#include <stdbool.h>
#include <stdint.h>

#include "grammar/gram_impl.h"

#define KP_GNUM_MAX 999999999999999999LL /* 18 nines */

/* Adds to rule the alternatives of the numbers x with lo <= x <= hi (or
 * lo < x, x < hi with the exclusive flags), integers only when integer.
 * Both bounds within [-KP_GNUM_MAX, KP_GNUM_MAX]. Returns false when out
 * of memory or over the builder's size cap (b->oom / b->too_big), and
 * sets *empty (the rule gained no alternative) when no number is in the
 * range, which the caller reports. */
bool kp_gnum_range(kp_builder *b, uint32_t rule, int64_t lo, bool lo_excl, int64_t hi, bool hi_excl, bool integer,
                   bool *empty);

#endif
