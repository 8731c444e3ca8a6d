/*
 * tables.h - private to src/kernels/: the kernel tables, one per file and
 * instruction set. dispatch.c alone chooses among them and hands them out
 * (kp_kernels_* in quant.h); a SIMD file may name the portable table it
 * falls back to. Nothing outside src/kernels/ includes this file.
 *
 * Each table is a constant object defined by its file; the SIMD ones exist
 * only in x86-64 builds, and using one is correct only on a CPU with the
 * extensions named (dispatch.c checks).
 */
#ifndef KP_KERNELS_TABLES_H
#define KP_KERNELS_TABLES_H

#include "kernels/quant.h"

/* quant_scalar.c: portable C, every type. */
extern const kp_kernels kp_quant_scalar_kernels;

#endif
