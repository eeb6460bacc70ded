/* The portable product kernels: the reference every vector path is tested against, and the ones a
 * build runs where no ISA file has its own (arch-fallback.h). Plain C and GCC/clang vector types.
 *
 * Float activations (f32, q8, q4f): every build without AVX2 + FMA (portable x86, aarch64).
 * 8-bit activations (q4q8, q8q8): builds without AVX512-VNNI, AVX2 or NEON sdot.
 * q4_matmul: a stub that says it is not built, where AVX512-BF16 is missing.
 */
#include "common.h"

#if FLOAT_PRODUCTS_GENERIC
/* ---- vector types and helpers ----------------------------------------------------------------- */

/* Products over weights laid out 16 outputs at a time, in GCC/clang vector types that compile to
 * whatever vectors the build has (two AVX2 registers, one AVX-512 register, four SSE or NEON ones).
 * A call takes its rows 4, 2 or 1 at a time (three rows: four, the last repeated), and each row's
 * result is the same sequence of operations whichever of these runs it: a row is computed as it
 * would be alone. */
typedef float v16f __attribute__((vector_size(64)));
typedef int8_t v16i8 __attribute__((vector_size(16)));
typedef uint8_t v16u8 __attribute__((vector_size(16)));
typedef uint32_t v16u __attribute__((vector_size(64)));

static inline v16f load_v16f(const float *p) {
    v16f v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* Runs ROWS_FN(x, ..., r0, rows, R) over all rows of block nb in chunks of R = 4, 2, 1. */
#define FOR_ROW_CHUNKS(rows, CALL)                                                               \
    for (int r0 = 0; r0 < (rows);) {                                                             \
        int left = (rows) - r0;                                                                  \
        if (left > 2) {                                                                          \
            CALL(4);                                                                             \
            r0 += 4;                                                                             \
        } else if (left == 2) {                                                                  \
            CALL(2);                                                                             \
            r0 += 2;                                                                             \
        } else {                                                                                 \
            CALL(1);                                                                             \
            r0 += 1;                                                                             \
        }                                                                                        \
    }

static inline void row_pointers(const float *x, int in, int r0, int rows, int R, const float **xr) {
    for (int r = 0; r < R; r++) xr[r] = x + (long)(r0 + r < rows ? r0 + r : rows - 1) * in;
}

static inline void store_rows(float *y, const v16f *acc, int out, int nb, int r0, int rows, int R) {
    for (int r = 0; r < R && r0 + r < rows; r++) memcpy(y + (long)(r0 + r) * out + (long)nb * 16, &acc[r], 64);
}

static inline v16f load_half16(const uint16_t *p) {
    v16f v;
    for (int l = 0; l < 16; l++) v[l] = half_to_float(p[l]);
    return v;
}

/* ---- float activations: f32, q8, q4f ---------------------------------------------------------- */

/* q8_matmul (Q8_0 weights: matmul.c): row kernel and block function. */
static inline __attribute__((always_inline)) void q8_rows(const float *x, const int8_t *qb, const float *sb, float *y,
                                                          int in, int out, int nb, int r0, int rows, const int R) {
    const float *xr[4];
    row_pointers(x, in, r0, rows, R, xr);
    v16f acc[4] = {0};
    for (int g = 0; g < in / 32; g++) {
        v16f part[4][2] = {{0}};
        const int8_t *w = qb + (long)g * 32 * 16;
        for (int i = 0; i < 32; i += 2) {
            v16i8 b0, b1;
            memcpy(&b0, w + i * 16, 16);
            memcpy(&b1, w + (i + 1) * 16, 16);
            v16f w0 = __builtin_convertvector(b0, v16f), w1 = __builtin_convertvector(b1, v16f);
            for (int r = 0; r < R; r++) {
                part[r][0] += xr[r][g * 32 + i] * w0;
                part[r][1] += xr[r][g * 32 + i + 1] * w1;
            }
        }
        v16f s = load_v16f(sb + g * 16);
        for (int r = 0; r < R; r++) acc[r] += s * (part[r][0] + part[r][1]);
    }
    store_rows(y, acc, out, nb, r0, rows, R);
}


INTERNAL void q8_blocks(void *ctx, int nb) {
    const product_t *p = ctx;
    const int in = p->in, out = p->out, rows = p->rows;
    const int8_t *qb = (const int8_t *)p->q + (long)nb * in * 16;
    const float *x = p->x, *sb = (const float *)p->coef + (long)nb * (in / 32) * 16;
    float *y = p->y;
#define Q8_CALL(R) q8_rows(x, qb, sb, y, in, out, nb, r0, rows, R)
    FOR_ROW_CHUNKS(rows, Q8_CALL)
#undef Q8_CALL
}

/* f32_matmul (float32 weights: matmul.c): row kernel and block function. */
static inline __attribute__((always_inline)) void f32_rows(const float *x, const float *wb, float *y, int in, int out,
                                                           int nb, int r0, int rows, const int R) {
    const float *xr[4];
    row_pointers(x, in, r0, rows, R, xr);
    v16f part[4][2] = {{0}}, acc[4];
    for (int i = 0; i < in; i += 2) {
        v16f w0 = load_v16f(wb + (long)i * 16), w1 = load_v16f(wb + (long)(i + 1) * 16);
        for (int r = 0; r < R; r++) {
            part[r][0] += xr[r][i] * w0;
            part[r][1] += xr[r][i + 1] * w1;
        }
    }
    for (int r = 0; r < R; r++) acc[r] = part[r][0] + part[r][1];
    store_rows(y, acc, out, nb, r0, rows, R);
}

INTERNAL void f32_blocks(void *ctx, int nb) {
    const product_t *p = ctx;
    const int in = p->in, out = p->out, rows = p->rows;
    const float *x = p->x, *wb = (const float *)p->q + (long)nb * in * 16;
    float *y = p->y;
#define F32_CALL(R) f32_rows(x, wb, y, in, out, nb, r0, rows, R)
    FOR_ROW_CHUNKS(rows, F32_CALL)
#undef F32_CALL
}

/* q4f_matmul (Q4_1 weights: matmul.c): row kernel and block function. */
static inline __attribute__((always_inline)) void q4f_rows(const float *x, const uint8_t *qb, const uint16_t *cb,
                                                           const float *sums, float *y, int in, int out, int nb,
                                                           int r0, int rows, const int R) {
    const int groups = in / 32;
    const float *xr[4], *sr[4];
    row_pointers(x, in, r0, rows, R, xr);
    row_pointers(sums, groups, r0, rows, R, sr);
    v16f acc[4] = {0};
    for (int g = 0; g < groups; g++) {
        v16f part[4][2] = {{0}};
        const uint8_t *w = qb + (long)g * 256;
        __builtin_prefetch(w + 2048);
        __builtin_prefetch(w + 2048 + 64);
        __builtin_prefetch(w + 2048 + 128);
        __builtin_prefetch(w + 2048 + 192);
        __builtin_prefetch(cb + (g + 8) * 32);
        __builtin_prefetch(cb + (g + 8) * 32 + 16);
        for (int i = 0; i < 16; i++) {
            v16u8 b;
            memcpy(&b, w + i * 16, 16);
            v16u v = __builtin_convertvector(b, v16u);
            v16f lo = __builtin_convertvector(v & 15, v16f), hi = __builtin_convertvector(v >> 4, v16f);
            for (int r = 0; r < R; r++) {
                part[r][0] += xr[r][g * 32 + i] * lo;
                part[r][1] += xr[r][g * 32 + 16 + i] * hi;
            }
        }
        v16f d = load_half16(cb + g * 32), m = load_half16(cb + g * 32 + 16);
        for (int r = 0; r < R; r++) acc[r] = d * (part[r][0] + part[r][1]) + (m * sr[r][g] + acc[r]);
    }
    store_rows(y, acc, out, nb, r0, rows, R);
}

static int q4f_block(const float *x, const uint8_t *qb, const uint16_t *cb, const float *sums, float *y, int rows,
                     int in, int out, int nb) {
#define Q4F_CALL(R) q4f_rows(x, qb, cb, sums, y, in, out, nb, r0, rows, R)
    FOR_ROW_CHUNKS(rows, Q4F_CALL)
#undef Q4F_CALL
    return 0;
}

INTERNAL void q4f_blocks(void *ctx, int nb) {
    product_t *p = ctx;
    if (q4f_block(p->x, (const uint8_t *)p->q + (long)nb * p->in * 8, (const uint16_t *)p->coef + (long)nb * (p->in / 32) * 32,
                  p->extra, p->y, p->rows, p->in, p->out, nb))
        p->failed = 1;
}
#endif

/* ---- 8-bit activations: q4q8, q8q8 in plain C (exact, slow) ----------------------------------- */

#if INT8_PRODUCTS_GENERIC
static void q4q8_rows(const q8_rows_t *a, const uint8_t *qb, const void *cb, float *y, int in, int out, int nb,
                      int r0, const int R, const int format) {
    const int groups = in / 32;
    for (int r = r0; r < r0 + R; r++) {
        float acc[16] = {0};
        for (int g = 0; g < groups; g++) {
            const uint8_t *grp = qb + (long)g * Q4Q8_GROUP_BYTES(format);
            const int8_t *xg = a->q + (long)r * in + g * 32;
            int32_t S[16] = {0};
            for (int c = 0; c < 8; c++) {
                uint32_t high[2] = {0, 0}; /* 5-bit values: the chunk's high bits (common.h) */
                if (FIVE_BITS(format))
                    for (int h = 0; h < 2; h++)
                        for (int k = 0; k < 4; k++) high[h] |= (uint32_t)grp[256 + c * 8 + h * 4 + k] << (8 * k);
                for (int o = 0; o < 8; o++)
                    for (int j = 0; j < 4; j++) {
                        const int b = 4 * o + j, byte = grp[c * 32 + b], xi = xg[4 * c + j];
                        S[o] += ((byte & 15) | (int)(high[0] >> b & 1) << 4) * xi;
                        S[o + 8] += ((byte >> 4) | (int)(high[1] >> b & 1) << 4) * xi;
                    }
            }
            const float dx = a->d[r * groups + g], sx = a->s[r * groups + g];
            const uint8_t *kq = (const uint8_t *)cb + (long)(g / 8) * KQ_BYTES; /* K-quants: the super-block's */
            for (int o = 0; o < 16; o++) {
                float d, m;
                if (format == FORMAT_Q40) { /* m = -8 d */
                    d = half_to_float(((const uint16_t *)cb)[g * 16 + o]);
                    m = -8.0f * d;
                } else if (!K_QUANT(format)) {
                    d = half_to_float(((const uint16_t *)cb)[g * 32 + o]);
                    m = half_to_float(((const uint16_t *)cb)[g * 32 + 16 + o]);
                } else {
                    uint16_t dh, mh;
                    memcpy(&dh, kq + 2 * o, 2), memcpy(&mh, kq + 32 + 2 * o, 2);
                    d = half_to_float(dh) * (float)kq[KQ_SC + (g % 8) * 16 + o];
                    m = half_to_float(mh) * (float)kq[KQ_M + (g % 8) * 16 + o];
                }
                acc[o] = fmaf(d * dx, (float)S[o], fmaf(m, sx, acc[o]));
            }
        }
        memcpy(y + (long)r * out + (long)nb * 16, acc, sizeof acc);
    }
}
DEFINE_Q4Q8_BLOCKS(1)

static void q8q8_rows(const q8_rows_t *a, const uint8_t *qb, const void *sb, float *y, int in, int out, int nb,
                      int r0, const int R, const int parts) {
    const int groups = in / 32;
    for (int r = r0; r < r0 + R; r++) {
        float acc[16] = {0};
        for (int g = 0; g < groups; g++) {
            const uint8_t *grp = qb + (long)g * 512;
            const int8_t *xg = a->q + (long)r * in + g * 32;
            const float dx = a->d[r * groups + g];
            for (int part = 0; part < parts; part++) {
                int32_t S[16] = {0};
                for (int c = part * 8 / parts; c < (part + 1) * 8 / parts; c++)
                    for (int o = 0; o < 16; o++)
                        for (int j = 0; j < 4; j++) S[o] += (grp[c * 64 + 4 * o + j] - 128) * xg[4 * c + j];
                const int j = g * parts + part; /* q8q8: float32 scales; q6q8: Q6_K's d and sc (common.h) */
                for (int o = 0; o < 16; o++) {
                    const float scale = parts == 1 ? ((const float *)sb)[j * 16 + o] : q6k_scale(sb, j, o);
                    acc[o] = fmaf(scale * dx, (float)S[o], acc[o]);
                }
            }
        }
        memcpy(y + (long)r * out + (long)nb * 16, acc, sizeof acc);
    }
}
DEFINE_Q8Q8_BLOCKS(1)
#endif

/* ---- q6kq8, where no ISA file has it ----------------------------------------------------------- */

#if Q6K_PRODUCTS_GENERIC
static void q6kq8_rows(const q8_rows_t *a, const uint8_t *qb, const void *sb, float *y, int in, int out, int nb,
                       int r0, const int R) {
    const int groups = in / 32;
    for (int r = r0; r < r0 + R; r++) {
        float acc[16] = {0};
        for (int g = 0; g < groups; g++) {
            const uint8_t *grp = qb + (long)g * Q6K_GROUP_BYTES;
            const int8_t *xg = a->q + (long)r * in + g * 32;
            const float dx = a->d[r * groups + g];
            for (int part = 0; part < 2; part++) { /* q8q8_rows' q6q8, the values read from 6 bits */
                int32_t S[16] = {0};
                for (int c = part * 4; c < part * 4 + 4; c++)
                    for (int o = 0; o < 16; o++)
                        for (int j = 0; j < 4; j++) S[o] += (q6k_value(grp, c, o, j) - 32) * xg[4 * c + j];
                for (int o = 0; o < 16; o++) acc[o] = fmaf(q6k_scale(sb, g * 2 + part, o) * dx, (float)S[o], acc[o]);
            }
        }
        memcpy(y + (long)r * out + (long)nb * 16, acc, sizeof acc);
    }
}
DEFINE_Q6KQ8_BLOCKS(1)
#endif

/* ---- q4_matmul, where AVX512-BF16 is missing -------------------------------------------------- */

#if Q4_BF16_GENERIC
int q4_matmul(const uint16_t *x, const uint8_t *q, const float *coef, uint16_t *y, int rows, int in, int out,
              int threads) {
    return 1; /* not built: the caller uses PyTorch's 4-bit product */
}
#endif
