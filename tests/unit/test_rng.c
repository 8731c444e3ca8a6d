/*
 * test_rng.c - base/rng against outside references:
 *
 *   - kp_splitmix64 gives the stream of java.util.SplittableRandom (the
 *     same algorithm by the same authors: state += 0x9E3779B97F4A7C15,
 *     output mix64(state)): new SplittableRandom(1234567).nextLong() x 5
 *     and new SplittableRandom(0).nextLong() x 4, printed by jshell;
 *   - kp_rng_seed(seed) is those four splitmix64 outputs;
 *   - kp_rng_next from the state {1, 2, 3, 4} gives the first ten outputs of
 *     the authors' xoshiro256** (the reference sequence other ports check);
 *   - kp_rng_unit is the top 53 bits times 2^-53, in [0, 1).
 */
#include <stdbool.h>
#include <stdint.h>

#include "harness.h"
#include "base/rng.h"

static void test_splitmix64(void) {
    static const uint64_t want[] = {6457827717110365317ull, 3203168211198807973ull, 9817491932198370423ull,
                                    4593380528125082431ull, 16408922859458223821ull};
    uint64_t state = 1234567;
    bool same = true;
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) same = same && kp_splitmix64(&state) == want[i];
    CHECK(same);
    CHECK(state == 1234567 + 5 * 0x9E3779B97F4A7C15ull);
    /* the output is mix64 of the stepped state */
    CHECK(kp_mix64(1234567 + 0x9E3779B97F4A7C15ull) == want[0]);
}

static void test_seed(void) {
    static const uint64_t from_zero[] = {16294208416658607535ull, 7960286522194355700ull, 487617019471545679ull,
                                         17909611376780542444ull};
    kp_rng r;
    kp_rng_seed(&r, 0);
    CHECK(memcmp(r.s, from_zero, sizeof from_zero) == 0);
}

static void test_xoshiro256starstar(void) {
    static const uint64_t want[] = {11520ull,
                                    0ull,
                                    1509978240ull,
                                    1215971899390074240ull,
                                    1216172134540287360ull,
                                    607988272756665600ull,
                                    16172922978634559625ull,
                                    8476171486693032832ull,
                                    10595114339597558777ull,
                                    2904607092377533576ull};
    kp_rng r = {{1, 2, 3, 4}};
    int same = 0;
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) same += kp_rng_next(&r) == want[i];
    CHECK_EQ_INT(same, 10);
}

static void test_unit(void) {
    kp_rng r = {{1, 2, 3, 4}};
    CHECK(kp_rng_unit(&r) == 5 * 0x1.0p-53); /* 11520 >> 11 = 5 */
    CHECK(kp_rng_unit(&r) == 0.0);          /* the second output is 0 */
    kp_rng_seed(&r, 42);
    bool in_range = true;
    double sum = 0;
    for (int i = 0; i < 100000; i++) {
        double u = kp_rng_unit(&r);
        in_range = in_range && u >= 0.0 && u < 1.0;
        sum += u;
    }
    CHECK(in_range);
    CHECK_NEAR(sum / 100000, 0.5, 0.005); /* 5 sigma of the mean of 1e5 uniforms is 0.0046 */
}

int main(void) {
    RUN(test_splitmix64);
    RUN(test_seed);
    RUN(test_xoshiro256starstar);
    RUN(test_unit);
    return harness_finish("rng");
}
