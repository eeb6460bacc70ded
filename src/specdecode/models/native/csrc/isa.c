/* What this build runs, as plan.py's kernel plan and kernels.py report it. */
#include "common.h"

/* The instruction set this library was built for. */
const char *kernels_isa(void) {
#if defined(__AVX512BF16__)
    return "avx512-bf16";
#elif defined(__AVX512F__)
    return "avx512";
#elif defined(__AVX2__) && defined(__FMA__)
    return "avx2-fma";
#elif defined(__aarch64__) && defined(__ARM_FEATURE_DOTPROD)
    return "neon-dotprod";
#elif defined(__aarch64__)
    return "aarch64";
#else
    return "portable";
#endif
}

/* Whether q4_matmul is built (AVX512-BF16): else it returns 1 and the caller uses PyTorch's 4-bit product. */
int q4_available(void) { return Q4_BF16_AVX512; }

/* Which vector integer dot product this build's q4q8_matmul runs on: 2 vpdpbusd (AVX512-VNNI), 1
 * vpmaddubsw (AVX2), 3 sdot (NEON), 0 none (plain C: exact, slow). */
int q4q8_vector(void) {
#if INT8_PRODUCTS_AVX512
    return 2;
#elif INT8_PRODUCTS_AVX2
    return 1;
#elif INT8_PRODUCTS_NEON
    return 3;
#else
    return 0;
#endif
}

int q6kq8_vector(void) { return Q6K_PRODUCTS_AVX2; }
