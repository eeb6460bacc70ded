/* The products y = x W^T: their entry points.
 *
 * Each packs its arguments (product_t), prepares what every block reads (the rows' group sums, or
 * the activations quantised to 8 bits) and runs one block function per 16 outputs on parallel_for.
 * The block functions come from the ISA files (matmul_avx2.c, matmul_avx512.c, matmul_neon.c) or,
 * where none has one, from matmul_generic.c: arch-fallback.h says which. Whichever runs, a row's
 * result is the same sequence of operations whatever rows share the call: a row is computed as it
 * would be alone.
 */
#include "common.h"

/* ---- what the blocks share: group sums, 8-bit activations ------------------------------------- */

/* The rows' sums of x over each group of 32 inputs, in a fixed order (float32 or bf16 x). */
#define DEFINE_GROUP_SUMS(NAME, T, LOAD)                                                         \
    INTERNAL float *NAME(const T *x, int rows, int in) {                                         \
        int groups = in / 32;                                                                    \
        float *sums = malloc(sizeof(float) * rows * groups);                                     \
        if (!sums) return NULL;                                                                  \
        for (int r = 0; r < rows; r++)                                                           \
            for (int g = 0; g < groups; g++) {                                                   \
                float s = 0;                                                                     \
                for (int i = 0; i < 32; i++) s += LOAD(x[(long)r * in + g * 32 + i]);            \
                sums[r * groups + g] = s;                                                        \
            }                                                                                    \
        return sums;                                                                             \
    }
DEFINE_GROUP_SUMS(group_sums_f32, float, load_f32)
DEFINE_GROUP_SUMS(group_sums_bf16, uint16_t, load_bf16)

/* Activations quantised to 8 bits per group of 32 inputs, as llama.cpp's Q8_1 blocks (see
 * q4q8_matmul). Plain C that the compiler vectorises: max, one multiply and round-to-nearest-even
 * per value, each exact whatever the vector width, so the quantised activations are the same on
 * every path. One row an index of parallel_for (ctx: quantize_t). */
typedef struct {
    const float *x;
    q8_rows_t *a;
    int in;
} quantize_t;

static void quantize_row(void *ctx, int r) {
    const quantize_t *t = ctx;
    const int groups = t->in / 32;
    q8_rows_t *a = t->a;
    for (int g = 0; g < groups; g++) {
        const float *xg = t->x + (long)r * t->in + g * 32;
        int8_t *qg = a->q + (long)r * t->in + g * 32;
        float amax = 0;
        for (int i = 0; i < 32; i++) {
            const float v = fabsf(xg[i]);
            amax = v > amax ? v : amax;
        }
        const float inverse = amax > 0 ? 127.0f / amax : 0.0f;
        int sum = 0;
        for (int i = 0; i < 32; i++) {
            qg[i] = (int8_t)nearbyintf(xg[i] * inverse);
            sum += qg[i];
        }
        int half = 0;
        for (int i = 0; i < 16; i++) half += qg[i];
        a->d[r * groups + g] = amax / 127.0f;
        a->s[r * groups + g] = amax / 127.0f * (float)sum;
        a->sum[r * groups + g] = sum;
        a->half_sum[2 * (r * groups + g)] = half;
        a->half_sum[2 * (r * groups + g) + 1] = sum - half;
    }
}

/* Rows of at least this many inputs in all are quantised on the pool (fewer: waking it costs more) */
enum { QUANTIZE_PARALLEL_INPUTS = 8192 };

static int quantize_q8(const float *x, int rows, int in, q8_rows_t *a, int threads) {
    const int groups = in / 32;
    a->q = malloc((size_t)rows * in);
    a->d = malloc(sizeof(float) * 5 * rows * groups);
    if (!a->q || !a->d) {
        free(a->q), free(a->d);
        return 1;
    }
    a->s = a->d + rows * groups;
    a->sum = (int32_t *)(a->s + rows * groups);
    a->half_sum = a->sum + rows * groups;
    quantize_t t = {x, a, in};
    parallel_for(rows, (long)rows * in >= QUANTIZE_PARALLEL_INPUTS ? threads : 1, quantize_row, &t);
    return 0;
}

/* ---- float32 and 8-bit weights, float32 activations ------------------------------------------- */

/* y = x W^T for a float32 weight laid out w [out / 16][in][16] (x, y float32; in a multiple of 32): the products
 * of a float32 model, whose row results must not depend on the row count (a BLAS call's do). */
void f32_matmul(const float *x, const float *w, float *y, int rows, int in, int out, int threads) {
    product_t p = {x, w, NULL, NULL, y, rows, in, out, 0};
    parallel_for(out / 16, threads, f32_blocks, &p);
}

/* y = x W^T for a weight held as int8 in groups of 32 inputs with one scale each (w = scale q, the
 * GGUF Q8_0 block format): q [out / 16][in][16], scales [out / 16][in / 32][16]. A quarter of
 * float32's bytes, half of bf16's. x [rows, in] and y [rows, out] float32; in a multiple of 32. */
int q8_matmul(const float *x, const int8_t *q, const float *scales, float *y, int rows, int in, int out,
              int threads) {
    product_t p = {x, q, scales, NULL, y, rows, in, out, 0};
    parallel_for(out / 16, threads, q8_blocks, &p);
    return p.failed;
}

/* ---- 4-bit weights, float32 activations ------------------------------------------------------- */

/* y = x W^T for a weight held as 4-bit integers in groups of 32 inputs, w = d q + m, q in 0..15 (the
 * GGUF Q4_1 block format), with float32 activations: the 4-bit product of CPUs without AVX512-BF16
 * (AVX2, portable builds). Layout, 16 outputs at a time: q [out / 16][in / 32][16][16] bytes, byte
 * [i][o] of a group holding output o's input i in its low nibble and input i + 16 in its high one;
 * coef [out / 16][in / 32][2][16] float16, d and m as the GGUF file holds them (half the bytes of
 * float32 coefficients: 13 of SmolLM2's 65 MB a step). A group contributes d S + m sum_i x_i with
 * S = sum_i x_i q_i (nibbles converted to float32 rather than placed in the mantissa of 1.0, whose
 * shifts compete with the multiply-adds), the sums of x computed once a call. */
int q4f_matmul(const float *x, const uint8_t *q, const uint16_t *coef, float *y, int rows, int in, int out,
               int threads) {
    float *sums = group_sums_f32(x, rows, in);
    if (!sums) return 1;
    product_t p = {x, q, coef, sums, y, rows, in, out, 0};
    parallel_for(out / 16, threads, q4f_blocks, &p);
    free(sums);
    return p.failed;
}

/* ---- 8-bit activations: integer dot products -------------------------------------------------- */

/* x quantised to 8 bits (quantize_q8), then `blocks` over every 16 outputs: the entry points below,
 * which differ only in their weights' layout. 1 where there was no memory for the activations. */
static int int8_activation_product(index_fn blocks, const float *x, const uint8_t *q, const void *coef, float *y,
                                   int rows, int in, int out, int threads) {
    q8_rows_t a;
    if (quantize_q8(x, rows, in, &a, threads)) return 1;
    product_t p = {x, q, coef, &a, y, rows, in, out, 0};
    parallel_for(out / 16, threads, blocks, &p);
    free(a.q), free(a.d);
    return 0;
}

/* y = x W^T for Q4_1 weights (w = d q + m, q in 0..15, groups of 32 inputs) with the activations
 * quantised to 8 bits in the same groups, as llama.cpp computes its Q4_1 products (its Q8_1 blocks):
 * xq = round(x 127 / max|x|), dx = max|x| / 127, and the group's dot product S = sum_i q_i xq_i is
 * exact integer arithmetic (AVX2 vpmaddubsw, NEON sdot, plain C elsewhere). A group contributes
 * fma(d dx, S, fma(m, sx, acc)) with sx = dx sum_i xq_i: the same float operations in the same order
 * on every path, so every build gives the same bits, and a row never depends on the others.
 *
 * Layout, 16 outputs at a time: q [out / 16][in / 32][8][32] bytes, byte 4o + j of a group's chunk c
 * holding input 4c + j of output o (low nibble) and of output o + 8 (high nibble), o < 8: a 32-bit
 * lane holds one output's four inputs, the shape of vpmaddubsw + vpmaddwd (and of vpdpbusd, sdot).
 * coef [out / 16][in / 32][2][16] float16, d and m, as q4f_matmul's. */
int q4q8_matmul(const float *x, const uint8_t *q, const uint16_t *coef, float *y, int rows, int in, int out,
                int threads) {
    return int8_activation_product(q4q8_blocks, x, q, coef, y, rows, in, out, threads);
}

/* q4q8_matmul for Q5_1's 5-bit values (common.h's FORMAT_Q5): the same coefficients */
int q5q8_matmul(const float *x, const uint8_t *q, const uint16_t *coef, float *y, int rows, int in, int out,
                int threads) {
    return int8_activation_product(q5q8_blocks, x, q, coef, y, rows, in, out, threads);
}

/* q4q8_matmul for Q4_0's groups: q as q4q8's, coef [out / 16][in / 32][16] float16 (d; m = -8 d) */
int q40q8_matmul(const float *x, const uint8_t *q, const uint16_t *coef, float *y, int rows, int in, int out,
                 int threads) {
    return int8_activation_product(q40q8_blocks, x, q, coef, y, rows, in, out, threads);
}

/* q4q8_matmul for the K-quants' 4-bit groups, whose scale and minimum are products of a super-block's
 * and a group's own (Q4_K: d sc and -dmin m, exact in float32, not in float16), formed in the kernel
 * from the file's own fields (coef: common.h's KQ_BYTES layout). The same operations otherwise. */
int q4kq8_matmul(const float *x, const uint8_t *q, const uint8_t *coef, float *y, int rows, int in, int out,
                 int threads) {
    return int8_activation_product(q4kq8_blocks, x, q, coef, y, rows, in, out, threads);
}

/* q4kq8_matmul for Q5_K's 5-bit values: each group's low nibbles as q4q8's, then its high bits
 * (common.h's FORMAT_K5). */
int q5kq8_matmul(const float *x, const uint8_t *q, const uint8_t *coef, float *y, int rows, int in, int out,
                 int threads) {
    return int8_activation_product(q5kq8_blocks, x, q, coef, y, rows, in, out, threads);
}

/* y = x W^T for an 8-bit weight in groups of 32 inputs, w = scale q (Q8_0, the embedded model's LM
 * head), with the activations quantised as for q4q8_matmul: a group contributes fma(scale dx, S, acc)
 * with S = sum_i q_i xq_i in exact integer arithmetic, the same bits on every path.
 * Layout, 16 outputs at a time: q [out / 16][in / 32][8][16][4] bytes, q + 128 as uint8 (byte 4o + j
 * of chunk c: output o's input 4c + j), so vpdpbusd takes the weights as its unsigned operand:
 * sum (q + 128) xq = S + 128 sum(xq), whose second term is the row's; scales [out / 16][in / 32][16]
 * float32. */
int q8q8_matmul(const float *x, const uint8_t *q, const float *scales, float *y, int rows, int in, int out,
                int threads) {
    return int8_activation_product(q8q8_blocks, x, q, scales, y, rows, in, out, threads);
}

/* q8q8_matmul with a scale a 16 inputs: coef as the Q6_K file factors the scales (common.h's
 * Q6K_BYTES), q as q8q8's (int8 values + 128). The K-quants' Q6_K: w = d sc (q - 32) per 16 inputs, q -
 * 32 in -32..31 and d sc exact in float32. Each half group's integer sum S_k contributes fma(scale_k
 * dx, S_k, acc), k = 0, 1. */
int q6q8_matmul(const float *x, const uint8_t *q, const uint8_t *coef, float *y, int rows, int in, int out,
                int threads) {
    return int8_activation_product(q6q8_blocks, x, q, coef, y, rows, in, out, threads);
}

/* q6q8_matmul on Q6_K's values packed in 6 bits (common.h's Q6K_GROUP_BYTES), a quarter fewer bytes
 * to read than q6q8's int8 (a decode step reads them all): the same coefficients and the same bits. */
int q6kq8_matmul(const float *x, const uint8_t *q, const uint8_t *coef, float *y, int rows, int in, int out,
                 int threads) {
    return int8_activation_product(q6kq8_blocks, x, q, coef, y, rows, in, out, threads);
}
