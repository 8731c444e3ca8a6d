/*
 * probe.h - what this machine can do at most: streaming read bandwidth and
 * int8 multiply-add peak, measured on the engine's own thread pool.
 *
 * `kvpin bench` sets its measured speeds against these two ceilings: a
 * decode step reads every weight once (bound by read bandwidth), a prompt
 * batch multiplies them (bound by the int8 dot-product rate the quant
 * kernels use). Both figures are in base units: bytes per second of data
 * read, and operations per second with one int8 multiply-add counted as 2
 * operations (as GOPS are usually counted).
 *
 * Each probe runs for a fraction of a second: read bandwidth over a buffer
 * larger than the last-level cache, the int8 peak for about 30 ms per
 * thread, best of a few repetitions. The instruction set is chosen at run
 * time as the quant kernels choose theirs (dispatch.c): AVX-512 VNNI, else
 * AVX2, else portable C; `scalar` forces the portable C loops (the bench's
 * --scalar). Timings are the caller's business: nothing here is cached.
 *
 * A NULL pool runs everything in the calling thread.
 */
#ifndef KP_PROBE_H
#define KP_PROBE_H

#include <stdbool.h>
#include <stddef.h>

#include "base/status.h"
#include "base/threadpool.h"

/* The last-level cache's size in bytes as CPU 0 sees it: the highest level
 * under /sys/devices/system/cpu/cpu0/cache/, else
 * sysconf(_SC_LEVEL3_CACHE_SIZE), else 32 MiB. The kernel's figure comes
 * first: on a virtual machine of a many-chiplet CPU glibc's can be the sum
 * over every chiplet (320 MiB for 32 MiB slices on a Zen 4 EPYC). */
size_t kp_probe_llc_bytes(void);

/* The read probe's default buffer: max(4 x the last-level cache, 256 MiB). */
size_t kp_probe_default_bytes(void);

/* Streaming read bandwidth: a buffer of `bytes` (>= 64 KiB) is mapped and
 * written once, then every pool thread sums contiguous slices of it with
 * the widest loads the CPU has (AVX-512, AVX2, else 64-bit scalar; the
 * scalar loop when `scalar`); *bytes_per_s is the best of `reps` (>= 1)
 * passes: bytes read over wall time. KP_ENOMEM when the buffer cannot be
 * mapped (SIZE_MAX, say), KP_EINVAL for a size or reps out of range. */
kp_status kp_probe_read_bw(kp_threads *pool, size_t bytes, int reps, bool scalar, double *bytes_per_s,
                           kp_error *err);

/* The read probe until it is stable: passes of kp_probe_read_bw's loop
 * (the buffer mapped once) until the best three agree within 5%, at least
 * min_reps and at most max_reps of them (1 <= min_reps <= max_reps <= 64).
 * best is the ceiling a decode step is held to; median and min tell how
 * much the machine moved (shared machines do); stable says whether the
 * best three agreed before max_reps. Errors as kp_probe_read_bw. */
typedef struct {
    double best, median, min; /* bytes per second */
    int passes;
    bool stable;
} kp_probe_bw;
kp_status kp_probe_read_bw_stable(kp_threads *pool, size_t bytes, int min_reps, int max_reps, bool scalar,
                                  kp_probe_bw *out, kp_error *err);

/* Int8 multiply-add peak of every pool thread together, in operations per
 * second (2 per multiply-add), from register-resident loops of independent
 * accumulator chains: vpdpbusd on 512-bit vectors ("avx512vnni": AVX512
 * F/VL/BW and VNNI), vpmaddubsw + vpmaddwd + vpaddd on 256-bit ("avx2"),
 * else int32 multiply-adds ("scalar"; forced by `scalar`). *isa receives
 * the name of the loop that ran (static string; may be NULL). Best of 3. */
kp_status kp_probe_int8_peak(kp_threads *pool, bool scalar, const char **isa, double *ops_per_s, kp_error *err);

/* The same with the loop named by isa ("avx512vnni", "avx2", "scalar"):
 * KP_EUNSUPPORTED when this CPU lacks what it needs, KP_EINVAL for an
 * unknown name. */
kp_status kp_probe_int8_peak_isa(kp_threads *pool, const char *isa, double *ops_per_s, kp_error *err);

/* Float multiply-add peak of every pool thread together, in FLOP per
 * second (2 per multiply-add), by the same register-resident chains: F32
 * fused multiply-adds on the widest vectors the CPU has ("avx512 fma",
 * "avx2 fma", "scalar fma" when scalar), or, with bf16 on a CPU with
 * AVX512_BF16, bfloat16 dot products ("avx512bf16 dot", VDPBF16PS: the
 * instruction of --attn-precision bf16). *isa: the loop that ran (static;
 * may be NULL). Best of 3. */
kp_status kp_probe_float_peak(kp_threads *pool, bool bf16, bool scalar, const char **isa, double *flops,
                              kp_error *err);

#endif
