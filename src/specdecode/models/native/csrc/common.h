/* What the kernel files share: the includes, bf16 loads and stores, parallel_for (threads.c), the
 * vector loads and exp of attention and the MLP's activations, attention's per-item function
 * (attend.c, also run by layers.c), and the products' argument struct, 8-bit activations and
 * block-function macros. */
#ifndef SPECDECODE_COMMON_H
#define SPECDECODE_COMMON_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif
#if defined(__aarch64__) && defined(__ARM_FEATURE_DOTPROD)
#include <arm_neon.h>
#endif

#include "arch-fallback.h"
#include "kernels.h"

/* A function one file defines for the others: not exported from the library. */
#define INTERNAL __attribute__((visibility("hidden")))

/* ---- threads (threads.c) ---------------------------------------------------------------------- */

/* parallel_for(n, threads, fn, ctx): fn(ctx, i) for i in 0..n-1 on `threads` threads, in contiguous
 * shares, on the library's one thread pool (threads.c says how and why not OpenMP). */
typedef void (*index_fn)(void *ctx, int i);
INTERNAL void parallel_for(int n, int threads, index_fn fn, void *ctx);

/* A float16 (the files' d and m) as float32, exactly. */
static inline float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff, bits;
    if (exponent == 0) { /* zero or subnormal: mantissa 2^-24 */
        float f = (float)mantissa * (1.0f / 16777216.0f);
        memcpy(&bits, &f, sizeof bits);
        bits |= sign;
    } else if (exponent == 31) {
        bits = sign | 0x7f800000u | mantissa << 13;
    } else {
        bits = sign | (exponent + 112) << 23 | mantissa << 13;
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* ---- bf16 and float32 loads and stores -------------------------------------------------------- */

static inline float load_f32(float x) { return x; }

static inline float load_bf16(uint16_t x) {
    uint32_t bits = (uint32_t)x << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static inline uint16_t store_bf16(float f) { /* round to nearest even, as PyTorch does */
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    if ((bits & 0x7fffffff) > 0x7f800000) return (uint16_t)((bits >> 16) | 0x40); /* NaN stays NaN */
    bits += 0x7fff + ((bits >> 16) & 1);
    return (uint16_t)(bits >> 16);
}

static inline float store_f32(float f) { return f; }

/* ---- vector loads and exp (attend.c, norm_rope.c's silu_mul and gelu_mul) --------------------- */

#if KERNELS_AVX512
static inline __m512 load16_f32(const float *p) { return _mm512_loadu_ps(p); }
static inline __m512 load16_bf16(const uint16_t *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}

/* 16 at a time: Cephes' expf polynomial, within 1.3 ulp of exp over [-87, 0] (checked). */
static inline __m512 exp16(__m512 x) { /* x <= 88; below -87 it gives exp(-87) */
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
}
#elif KERNELS_AVX2
static inline __m256 load8_f32(const float *p) { return _mm256_loadu_ps(p); }
static inline __m256 load8_bf16(const uint16_t *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}

/* 8 at a time: the same exp polynomial, with 2^n built in the exponent bits. */
static inline __m256 exp8(__m256 x) { /* x clamped to [-87, 88] */
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23); /* 2^n */
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}
#endif

/* ---- attention (attend.c; layers.c runs its items) -------------------------------------------- */

typedef struct {
    const float *q;
    const void *k, *v;
    void *out;
    const int *parents; /* NULL: the new positions are a chain; else a tree (see attend) */
    int queries, heads, group, head_dim, first_length, failed;
    long kv_stride;
    float scale;
    int per;    /* heads an item takes: attend_heads_per_item */
    int window; /* a sliding window's keys (0: every key) */
} attention_t;

/* The heads an item takes (attention_t's per) in a call of `queries` positions on `threads` threads. */
INTERNAL int attend_heads_per_item(int group, int heads, int queries, int threads);
/* One item of attend_f32's arguments `ctx` (an attention_t): a->per heads h.. at position t, item =
 * (h / a->per) * queries + t. */
INTERNAL void attend_f32_item(void *ctx, int item);

/* ---- products (matmul.c and its kernels matmul_*.c) ------------------------------------------- */

/* A product's arguments, for its per-block function (16 outputs at a time) run by parallel_for. */
typedef struct {
    const void *x, *q, *coef, *extra; /* extra: the rows' group sums, or their quantised activations */
    void *y;
    int rows, in, out, failed;
} product_t;

/* The rows' sums of x over each group of 32 inputs, in a fixed order (float32 or bf16 x; matmul.c):
 * [rows][in / 32], malloc'd (NULL when out of memory). */
INTERNAL float *group_sums_f32(const float *x, int rows, int in);
INTERNAL float *group_sums_bf16(const uint16_t *x, int rows, int in);

/* Rows of activations quantised to 8 bits per group of 32 inputs (matmul.c's quantize_q8), as the
 * q4q8 and q8q8 row kernels take them. */
typedef struct {
    int8_t *q;         /* [rows][in] */
    float *d, *s;      /* [rows][in / 32]: dx and sx */
    int32_t *sum;      /* [rows][in / 32]: sum of xq */
    int32_t *half_sum; /* [rows][in / 16]: sum of xq over each 16 inputs (q6q8's groups of scales) */
} q8_rows_t;

/* The block functions parallel_for runs, one 16-output block nb of every row (ctx: a product_t),
 * each defined by the ISA file arch-fallback.h names, or by matmul_generic.c. */
INTERNAL void f32_blocks(void *ctx, int nb);
INTERNAL void q8_blocks(void *ctx, int nb);
INTERNAL void q4f_blocks(void *ctx, int nb); /* extra: the rows' group sums */
INTERNAL void q4q8_blocks(void *ctx, int nb); /* extra: the rows' 8-bit activations (q8_rows_t) */
INTERNAL void q5q8_blocks(void *ctx, int nb); /* the same, 5-bit values (Q5_1; FORMAT_Q5 below) */
INTERNAL void q4kq8_blocks(void *ctx, int nb); /* the same, K-quant coefficients (KQ_BYTES below) */
INTERNAL void q5kq8_blocks(void *ctx, int nb); /* the same, 5-bit values (Q5_K) */
INTERNAL void q40q8_blocks(void *ctx, int nb); /* the same, Q4_0's coefficients (d alone) */
INTERNAL void q8q8_blocks(void *ctx, int nb); /* the same */
INTERNAL void q6q8_blocks(void *ctx, int nb); /* the same, a scale a 16 inputs */
INTERNAL void q6kq8_blocks(void *ctx, int nb); /* q6q8's, on Q6_K's values packed in 6 bits (Q6K_GROUP_BYTES) */

/* CALL(r0, R) over rows 0.. in groups of at most MAX (1, 4 or 8), R a constant in each call, so that
 * each ROWS_FN is compiled for every group size it takes. */
#define FOR_ROW_GROUPS(MAX, rows, CALL) FOR_ROW_GROUPS_(MAX, rows, CALL)
#define FOR_ROW_GROUPS_(MAX, rows, CALL)                                                         \
    for (int r0 = 0; r0 < (rows); r0 += MAX) switch ((rows) - r0 >= MAX ? MAX : (rows) - r0) {  \
        ROW_GROUP_CASES_##MAX(CALL)                                                              \
        default: CALL(r0, 1);                                                                    \
        }
#define ROW_GROUP_CASES_1(CALL)
#define ROW_GROUP_CASES_4(CALL) case 4: CALL(r0, 4); break; case 3: CALL(r0, 3); break; case 2: CALL(r0, 2); break;
#define ROW_GROUP_CASES_8(CALL)                                                                  \
    case 8: CALL(r0, 8); break; case 7: CALL(r0, 7); break; case 6: CALL(r0, 6); break;          \
    case 5: CALL(r0, 5); break; ROW_GROUP_CASES_4(CALL)

/* The K-quants' coefficients (Q4_K, Q5_K), as their files hold them: per 16 outputs and super-block
 * of 256 inputs KQ_BYTES bytes, d [16] float16, -dmin [16] float16, then the 6-bit sc [8][16] and m
 * [8][16] of its groups of 32 as bytes; group j's d = d sc[j] and m = -dmin m[j], products exact in
 * float32 (11 by 6 bits). */
enum { KQ_BYTES = 320, KQ_SC = 64, KQ_M = 192 };
/* The formats q4q8_rows takes (FORMAT): Q4_1 groups (float16 d, m a group) of 4-bit or 5-bit values
 * (Q5_1), K-quant groups of 4-bit (Q4_K) or 5-bit values (Q5_K), and Q4_0 groups (float16 d a group,
 * [16] per 16 outputs: m = -8 d, exact). A group of 5-bit values is its
 * 256 bytes of low nibbles followed by 64 of high bits, 8 a chunk: a little-endian uint32 whose bit b
 * is the high bit of the value in chunk byte b's low nibble, then one for the high nibbles. */
enum { FORMAT_Q4, FORMAT_Q5, FORMAT_K4, FORMAT_K5, FORMAT_Q40 };
#define FIVE_BITS(format) ((format) == FORMAT_Q5 || (format) == FORMAT_K5)
#define K_QUANT(format) ((format) == FORMAT_K4 || (format) == FORMAT_K5)
#define Q4Q8_GROUP_BYTES(format) (FIVE_BITS(format) ? 320 : 256)

/* q4q8_blocks and q5q8_blocks (Q4_1, Q5_1), q4kq8_blocks and q5kq8_blocks (K-quants) over the file's
 * q4q8_rows, rows in groups of at most MAX_ROWS (1, 4 or 8: what the row kernel takes at once): one
 * body, inlined for each FORMAT (a constant there), which sets where a block's values and
 * coefficients start. */
#define Q4Q8_CALL(r0, R) q4q8_rows(p->extra, qb, cb, p->y, in, out, nb, r0, R, format)
#define DEFINE_Q4Q8_BLOCKS(MAX_ROWS)                                                             \
    static inline __attribute__((always_inline)) void q4q8_format_blocks(void *ctx, int nb,      \
                                                                         const int format) {     \
        const product_t *p = ctx;                                                                \
        const int in = p->in, out = p->out;                                                      \
        const uint8_t *qb = (const uint8_t *)p->q + (long)nb * (in / 32) * Q4Q8_GROUP_BYTES(format); \
        const void *cb = K_QUANT(format) /* KQ_BYTES a super-block, or float16 d, m a group */  \
                             ? (const void *)((const uint8_t *)p->coef + (long)nb * (in / 256) * KQ_BYTES) \
                             : (const void *)((const uint16_t *)p->coef +                        \
                                              (long)nb * (in / 32) * (format == FORMAT_Q40 ? 16 : 32)); \
        FOR_ROW_GROUPS(MAX_ROWS, p->rows, Q4Q8_CALL)                                             \
    }                                                                                            \
    INTERNAL void q4q8_blocks(void *ctx, int nb) { q4q8_format_blocks(ctx, nb, FORMAT_Q4); }     \
    INTERNAL void q5q8_blocks(void *ctx, int nb) { q4q8_format_blocks(ctx, nb, FORMAT_Q5); }     \
    INTERNAL void q4kq8_blocks(void *ctx, int nb) { q4q8_format_blocks(ctx, nb, FORMAT_K4); }    \
    INTERNAL void q5kq8_blocks(void *ctx, int nb) { q4q8_format_blocks(ctx, nb, FORMAT_K5); }    \
    INTERNAL void q40q8_blocks(void *ctx, int nb) { q4q8_format_blocks(ctx, nb, FORMAT_Q40); }

/* q8q8_rows(..., PARTS): PARTS scales a group of 32 inputs (1: q8q8's, 2: q6q8's, one a 16) */
#define Q8Q8_CALL(r0, R) q8q8_rows(a, qb, sb, y, in, out, nb, r0, R, 1)
#define Q6Q8_CALL(r0, R) q8q8_rows(a, qb, sb, y, in, out, nb, r0, R, 2)
#define DEFINE_Q8Q8_BLOCKS(MAX_ROWS)                                                             \
    INTERNAL void q8q8_blocks(void *ctx, int nb) {                                               \
        const product_t *p = ctx;                                                                \
        const q8_rows_t *a = p->extra;                                                           \
        const int in = p->in, out = p->out, rows = p->rows;                                      \
        const uint8_t *qb = (const uint8_t *)p->q + (long)nb * in * 16;                          \
        const float *sb = (const float *)p->coef + (long)nb * (in / 32) * 16;                    \
        float *y = p->y;                                                                         \
        FOR_ROW_GROUPS(MAX_ROWS, rows, Q8Q8_CALL)                                                \
    }                                                                                            \
    INTERNAL void q6q8_blocks(void *ctx, int nb) {                                               \
        const product_t *p = ctx;                                                                \
        const q8_rows_t *a = p->extra;                                                           \
        const int in = p->in, out = p->out, rows = p->rows;                                      \
        const uint8_t *qb = (const uint8_t *)p->q + (long)nb * in * 16;                          \
        const uint8_t *sb = (const uint8_t *)p->coef + (long)nb * (in / 256) * Q6K_BYTES;        \
        float *y = p->y;                                                                         \
        FOR_ROW_GROUPS(MAX_ROWS, rows, Q6Q8_CALL)                                                \
    }

/* q6kq8_rows: q6q8's over the packed values (each ISA file that has it, or matmul_generic.c) */
#define Q6KQ8_CALL(r0, R) q6kq8_rows(a, qb, sb, y, in, out, nb, r0, R)
#define DEFINE_Q6KQ8_BLOCKS(MAX_ROWS)                                                            \
    INTERNAL void q6kq8_blocks(void *ctx, int nb) {                                              \
        const product_t *p = ctx;                                                                \
        const q8_rows_t *a = p->extra;                                                           \
        const int in = p->in, out = p->out, rows = p->rows;                                      \
        const uint8_t *qb = (const uint8_t *)p->q + (long)nb * (in / 32) * Q6K_GROUP_BYTES;      \
        const uint8_t *sb = (const uint8_t *)p->coef + (long)nb * (in / 256) * Q6K_BYTES;        \
        float *y = p->y;                                                                         \
        FOR_ROW_GROUPS(MAX_ROWS, rows, Q6KQ8_CALL)                                               \
    }

/* Q6_K's scales as the file factors them, per 16 outputs and super-block of 256 inputs Q6K_BYTES
 * bytes: d [16] float16, then the int8 sc [16 groups][16 outputs] of its groups of 16 inputs; group
 * j's scale d sc[j] is exact in float32 (11 by 8 bits). The row kernels compute each group's 16
 * scales where they use them (q6k_block and q6k_sc: its super-block's bytes and its place there). */
enum { Q6K_BYTES = 32 + 256 };
/* q6kq8's weights, per 16 outputs and group of 32 inputs: Q6_K's q (0..63; w = d sc (q - 32)) in 384
 * bytes, 6 bits each. First 256 bytes of low nibbles as q4q8's (chunk c's byte 4o + j: input 4c + j of
 * output o in its low nibble, of output o + 8 in its high one), then 16 bytes a chunk of the high
 * two bits: chunk byte k holds those of the value in nibble byte k's low nibble (bits 0-1), byte
 * k + 16's low nibble (2-3), byte k's high nibble (4-5) and byte k + 16's high nibble (6-7). */
enum { Q6K_GROUP_BYTES = 384, Q6K_HIGH = 256 };
static inline int q6k_value(const uint8_t *grp, int c, int o, int j) { /* output o's input 4c + j, 0..63 */
    const int b = 4 * (o % 8) + j, high = o >= 8;
    const int nibble = (grp[c * 32 + b] >> (4 * high)) & 15;
    return nibble | (((grp[Q6K_HIGH + c * 16 + b % 16] >> (2 * (b / 16) + 4 * high)) & 3) << 4);
}
static inline const uint8_t *q6k_block(const void *sb, int group16) {
    return (const uint8_t *)sb + (long)(group16 / 16) * Q6K_BYTES;
}
static inline const int8_t *q6k_sc(const void *sb, int group16) { /* its 16 outputs' sc */
    return (const int8_t *)(q6k_block(sb, group16) + 32 + (group16 % 16) * 16);
}
/* output o's scale of a group of 16 inputs (plain C) */
static inline float q6k_scale(const void *sb, int group16, int o) {
    uint16_t h;
    memcpy(&h, q6k_block(sb, group16) + 2 * o, 2);
    return half_to_float(h) * (float)q6k_sc(sb, group16)[o];
}

#endif
