/* Which instruction sets a build has, and which file defines each product kernel.
 *
 * Every .c file is compiled in every build, and each ISA file wraps its whole content in the one
 * test below that selects it, so the preprocessor picks: an ISA file defines the kernels this table
 * gives it, and matmul_generic.c defines each one that no ISA file did (as ggml-cpu's
 * arch-fallback.h hands an architecture's missing kernels to the generic ones). Decided here from
 * the compiler's predefined macros alone, so that every file of one build agrees.
 */
#ifndef SPECDECODE_ARCH_FALLBACK_H
#define SPECDECODE_ARCH_FALLBACK_H

/* ---- the instruction sets of this build -------------------------------------------------------- */

#if defined(__AVX512F__)
#define KERNELS_AVX512 1 /* matmul_avx512.c; attend.c's and silu_mul's 16-lane variants */
#else
#define KERNELS_AVX512 0
#endif

#if defined(__AVX512F__) && defined(__AVX512BF16__)
#define KERNELS_AVX512_BF16 1
#else
#define KERNELS_AVX512_BF16 0
#endif

#if defined(__AVX512F__) && defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define KERNELS_AVX512_VNNI 1
#else
#define KERNELS_AVX512_VNNI 0
#endif

#if defined(__AVX2__) && defined(__FMA__)
#define KERNELS_AVX2 1 /* matmul_avx2.c (in AVX-512 builds too); attend.c's and silu_mul's 8-lane variants */
#else
#define KERNELS_AVX2 0
#endif

#if defined(__aarch64__) && defined(__ARM_FEATURE_DOTPROD)
#define KERNELS_NEON_DOTPROD 1 /* matmul_neon.c */
#else
#define KERNELS_NEON_DOTPROD 0
#endif

/* ---- which file defines each product kernel ---------------------------------------------------
 *
 *   kernel (block function)            AVX512 VNNI     AVX2            NEON dotprod    otherwise
 *   f32_blocks, q8_blocks, q4f_blocks  (the AVX2 ones) matmul_avx2.c   -               generic
 *   q4q8_blocks, q8q8_blocks           matmul_avx512.c matmul_avx2.c   matmul_neon.c   generic
 *   q6kq8_blocks                       (the AVX2 one)  matmul_avx2.c   -               generic
 *   q4_matmul (bf16 activations)       matmul_avx512.c with AVX512-BF16, else generic's stub (not built)
 *
 * Where two ISA files could define one (an AVX-512 build is an AVX2 build too), the first in the row
 * does. */

#define FLOAT_PRODUCTS_AVX2 KERNELS_AVX2 /* f32, q8, q4f */

#define INT8_PRODUCTS_AVX512 KERNELS_AVX512_VNNI /* q4q8, q8q8: the 8-bit activations' integer products */
#define INT8_PRODUCTS_AVX2 (KERNELS_AVX2 && !INT8_PRODUCTS_AVX512)
#define INT8_PRODUCTS_NEON KERNELS_NEON_DOTPROD

#define Q4_BF16_AVX512 KERNELS_AVX512_BF16

#define Q6K_PRODUCTS_AVX2 KERNELS_AVX2 /* q6kq8: Q6_K's packed 6-bit values (AVX-512 builds included) */

/* ---- the fallback: matmul_generic.c's kernel wherever no ISA file has one ---------------------- */

#define FLOAT_PRODUCTS_GENERIC (!FLOAT_PRODUCTS_AVX2)
#define INT8_PRODUCTS_GENERIC (!INT8_PRODUCTS_AVX512 && !INT8_PRODUCTS_AVX2 && !INT8_PRODUCTS_NEON)
#define Q4_BF16_GENERIC (!Q4_BF16_AVX512)
#define Q6K_PRODUCTS_GENERIC (!Q6K_PRODUCTS_AVX2)

#endif
