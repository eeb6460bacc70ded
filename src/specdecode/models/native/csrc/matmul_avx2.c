/* The product kernels in AVX2 + FMA intrinsics (x86 builds with AVX2, AVX-512 ones included):
 * f32, q8 and q4f; and q4q8, q8q8 where there is no AVX512-VNNI (arch-fallback.h). */
#include "common.h"

#if KERNELS_AVX2

/* ---- float activations: f32, q8, q4f ---------------------------------------------------------- */

/* AVX2 versions of the 4-bit (float32 activations), 8-bit and float32 products: the generic vectors
 * (matmul_generic.c) compile to spills at this width, so these are written with intrinsics. All take
 * a group of 32 inputs x 16 outputs at a time, and a row's group sum runs in four chains (outputs
 * 0-7 and 8-15 of inputs 0-15, the same of inputs 16-31), each in input order. Rows go two at a
 * time, the weights unpacked in registers once for both (rather than unpacking each group once into
 * a float32 tile read by every row, which gains nothing for 1-2 rows and loses for more). A row's
 * operations are the same whichever rows share the call, so its result does not depend on them. */
enum { Q4F = 0, Q8 = 1, F32 = 2 };

static inline __m256 q4f_low(__m256i v) { return _mm256_cvtepi32_ps(_mm256_and_si256(v, _mm256_set1_epi32(15))); }
static inline __m256 q4f_high(__m256i v) { return _mm256_cvtepi32_ps(_mm256_srli_epi32(v, 4)); }

/* w[0..3]: the weights of input i (outputs 0-7, 8-15) and of input i + 16 (the same) of one group */
static inline __attribute__((always_inline)) void unpack_pair(const uint8_t *group, int i, __m256 *w, const int format) {
    if (format == Q4F) { /* byte [i][o]: input i in the low nibble, i + 16 in the high one */
        __m256i v0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(group + i * 16)));
        __m256i v1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(group + i * 16 + 8)));
        w[0] = q4f_low(v0), w[1] = q4f_low(v1), w[2] = q4f_high(v0), w[3] = q4f_high(v1);
    } else if (format == F32) { /* float32 [i][o] */
        for (int j = 0; j < 4; j++) w[j] = _mm256_loadu_ps((const float *)group + ((j >> 1) * 16 + i) * 16 + (j & 1) * 8);
    } else { /* int8 [i][o] */
        for (int j = 0; j < 4; j++)
            w[j] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
                _mm_loadl_epi64((const __m128i *)(group + ((j >> 1) * 16 + i) * 16 + (j & 1) * 8))));
    }
}

/* acc (16 outputs) += the group's contribution from its four chains c */
static inline __attribute__((always_inline)) void finish_group(__m256 *acc, const __m256 *c, const float *cb, int g,
                                                               float sum, const int format) {
    for (int h = 0; h < 2; h++) {
        __m256 s = _mm256_add_ps(c[h], c[h + 2]);
        if (format == Q4F) { /* d S + m sum(x), S = sum of x q; d and m float16 */
            const uint16_t *dm = (const uint16_t *)cb + g * 32 + 8 * h;
            __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)dm));
            __m256 m = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(dm + 16)));
            acc[h] = _mm256_fmadd_ps(d, s, _mm256_fmadd_ps(m, _mm256_set1_ps(sum), acc[h]));
        }
        else if (format == Q8) /* scale S */
            acc[h] = _mm256_fmadd_ps(_mm256_loadu_ps(cb + g * 16 + 8 * h), s, acc[h]);
        else
            acc[h] = _mm256_add_ps(acc[h], s);
    }
}

static inline __attribute__((always_inline)) void group_chains(const float *xg, const __m256 *w, __m256 *c, int i) {
    __m256 lo = _mm256_set1_ps(xg[i]), hi = _mm256_set1_ps(xg[16 + i]);
    c[0] = _mm256_fmadd_ps(lo, w[0], c[0]);
    c[1] = _mm256_fmadd_ps(lo, w[1], c[1]);
    c[2] = _mm256_fmadd_ps(hi, w[2], c[2]);
    c[3] = _mm256_fmadd_ps(hi, w[3], c[3]);
}

static inline __attribute__((always_inline)) int product_block(const float *x, const uint8_t *qb, const float *cb,
                                                               const float *sums, float *y, int rows, int in,
                                                               int out, int nb, const int format) {
    const int groups = in / 32, group_bytes = format == Q4F ? 256 : format == Q8 ? 512 : 2048;
    /* rows two at a time (the last alone if odd): the weights unpacked in registers for both */
    for (int r0 = 0; r0 < rows; r0 += 2) {
        const int R = rows - r0 >= 2 ? 2 : 1;
        const float *xr = x + (long)r0 * in;
        __m256 acc[2][2] = {{_mm256_setzero_ps(), _mm256_setzero_ps()}, {_mm256_setzero_ps(), _mm256_setzero_ps()}};
        for (int g = 0; g < groups; g++) {
            const uint8_t *grp = qb + (long)g * group_bytes;
            for (int line = 0; line < group_bytes; line += 64)
                _mm_prefetch((const char *)(grp + 8 * group_bytes + line), _MM_HINT_T0);
            __m256 c[2][4], w[4];
            for (int r = 0; r < 2; r++)
                for (int j = 0; j < 4; j++) c[r][j] = _mm256_setzero_ps();
            for (int i = 0; i < 16; i++) {
                unpack_pair(grp, i, w, format);
                group_chains(xr + g * 32, w, c[0], i);
                if (R == 2) group_chains(xr + in + g * 32, w, c[1], i);
            }
            for (int r = 0; r < R; r++)
                finish_group(acc[r], c[r], cb, g, format == Q4F ? sums[(long)(r0 + r) * groups + g] : 0, format);
        }
        for (int r = 0; r < R; r++) {
            _mm256_storeu_ps(y + (long)(r0 + r) * out + (long)nb * 16, acc[r][0]);
            _mm256_storeu_ps(y + (long)(r0 + r) * out + (long)nb * 16 + 8, acc[r][1]);
        }
    }
    return 0;
}

static int q4f_block(const float *x, const uint8_t *qb, const uint16_t *cb, const float *sums, float *y, int rows,
                     int in, int out, int nb) {
    return product_block(x, qb, (const float *)cb, sums, y, rows, in, out, nb, Q4F);
}

INTERNAL void q4f_blocks(void *ctx, int nb) {
    product_t *p = ctx;
    if (q4f_block(p->x, (const uint8_t *)p->q + (long)nb * p->in * 8, (const uint16_t *)p->coef + (long)nb * (p->in / 32) * 32,
                  p->extra, p->y, p->rows, p->in, p->out, nb))
        p->failed = 1;
}

INTERNAL void f32_blocks(void *ctx, int nb) {
    const product_t *p = ctx;
    product_block(p->x, (const uint8_t *)((const float *)p->q + (long)nb * p->in * 16), NULL, NULL, p->y, p->rows,
                  p->in, p->out, nb, F32);
}

INTERNAL void q8_blocks(void *ctx, int nb) {
    product_t *p = ctx;
    if (product_block(p->x, (const uint8_t *)p->q + (long)nb * p->in * 16,
                      (const float *)p->coef + (long)nb * (p->in / 32) * 16, NULL, p->y, p->rows, p->in, p->out, nb,
                      Q8))
        p->failed = 1;
}

/* Q6_K's scales d sc of outputs 8h..8h + 7 for the group of 16 inputs j (common.h's Q6K_BYTES): q6q8's
 * and q6kq8's */
static inline __m256 q6k_scales(const void *sb, int j, int h) {
    return _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(q6k_block(sb, j) + 16 * h))),
                         _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(q6k_sc(sb, j) + 8 * h)))));
}

/* ---- 8-bit activations: q4q8, q8q8 on vpmaddubsw (where there is no AVX512-VNNI) ------------- */

#if INT8_PRODUCTS_AVX2
/* 32 bits as 32 bytes, 16 where the bit is set (5-bit values' high bits of one chunk's nibbles) */
static inline __m256i high_bits(const uint8_t *p) {
    int32_t bits;
    memcpy(&bits, p, 4);
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2,
                                            3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    const __m256i v = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32(bits), spread), bit);
    return _mm256_and_si256(_mm256_cmpeq_epi8(v, bit), _mm256_set1_epi8(16));
}

/* 8 bytes as float32 */
static inline __m256 bytes_ps(const uint8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

/* s[r][h] (int16 pairs) = row r's products with chunks c0..c1 - 1 of a group, outputs 8h.. (see below) */
static inline __attribute__((always_inline)) void chunk_sums(const q8_rows_t *a, const uint8_t *grp, __m256i s[4][2],
                                                             int in, int g, int r0, const int R, const int c0,
                                                             const int c1, const int format) {
    const __m256i nibble = _mm256_set1_epi8(15);
    for (int r = 0; r < R; r++) s[r][0] = s[r][1] = _mm256_setzero_si256();
    for (int c = c0; c < c1; c++) {
        __m256i v = _mm256_loadu_si256((const __m256i *)(grp + c * 32));
        __m256i lo = _mm256_and_si256(v, nibble), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), nibble);
        if (FIVE_BITS(format)) {
            lo = _mm256_or_si256(lo, high_bits(grp + 256 + c * 8));
            hi = _mm256_or_si256(hi, high_bits(grp + 256 + c * 8 + 4));
        }
        for (int r = 0; r < R; r++) {
            int32_t chunk;
            memcpy(&chunk, a->q + (long)(r0 + r) * in + g * 32 + c * 4, 4);
            __m256i xb = _mm256_set1_epi32(chunk);
            s[r][0] = _mm256_add_epi16(s[r][0], _mm256_maddubs_epi16(lo, xb));
            s[r][1] = _mm256_add_epi16(s[r][1], _mm256_maddubs_epi16(hi, xb));
            /* the sums stay in registers, chunk by chunk: left to itself GCC re-associates the adds,
             * computes every chunk's products first and spills them to the stack */
            __asm__("" : "+x"(s[r][0]), "+x"(s[r][1]));
        }
    }
}

/* R rows (1-4) of one 16-output block: per chunk of 4 inputs one load and two masks unpack 32
 * weights for all R rows; vpmaddubsw (u8 weight x s8 activation, pairs summed into int16) runs
 * the chunks in int16 (at most 16 products of 15 x 127: 30480, no overflow; with 5-bit values
 * (Q5_1, Q5_K) 8 products of 31 x 127 at most, so 4 chunks at a time), and vpmaddwd sums the pairs
 * into one int32 per output. `format`: common.h's FORMAT_ (the coefficients' layout, the values' bits). */
static inline __attribute__((always_inline)) void q4q8_rows(const q8_rows_t *a, const uint8_t *qb, const void *cb,
                                                            float *y, int in, int out, int nb, int r0, const int R,
                                                            const int format) {
    const int groups = in / 32, group_bytes = Q4Q8_GROUP_BYTES(format), run = FIVE_BITS(format) ? 4 : 8;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[4][2];
    for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (int g = 0; g < groups; g++) {
        const uint8_t *grp = qb + (long)g * group_bytes;
        for (int line = 0; line < group_bytes; line += 64)
            _mm_prefetch((const char *)(grp + 8 * group_bytes + line), _MM_HINT_T0);
        __m256i S[4][2], s[4][2];
        chunk_sums(a, grp, s, in, g, r0, R, 0, run, format);
        for (int r = 0; r < R; r++)
            for (int h = 0; h < 2; h++) S[r][h] = _mm256_madd_epi16(s[r][h], ones);
        if (run < 8) { /* 5-bit values: the other 4 chunks */
            chunk_sums(a, grp, s, in, g, r0, R, 4, 8, format);
            for (int r = 0; r < R; r++)
                for (int h = 0; h < 2; h++) S[r][h] = _mm256_add_epi32(S[r][h], _mm256_madd_epi16(s[r][h], ones));
        }
        const uint8_t *kq = (const uint8_t *)cb + (long)(g / 8) * KQ_BYTES; /* K-quants: the super-block's */
        for (int h = 0; h < 2; h++) {
            __m256 d, m;
            if (format == FORMAT_Q40) { /* m = -8 d */
                d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)cb + g * 16 + 8 * h)));
                m = _mm256_mul_ps(d, _mm256_set1_ps(-8.0f));
            } else if (!K_QUANT(format)) {
                d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)cb + g * 32 + 8 * h)));
                m = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)cb + g * 32 + 16 + 8 * h)));
            } else {
                d = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(kq + 16 * h))),
                                  bytes_ps(kq + KQ_SC + (g % 8) * 16 + 8 * h));
                m = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(kq + 32 + 16 * h))),
                                  bytes_ps(kq + KQ_M + (g % 8) * 16 + 8 * h));
            }
            for (int r = 0; r < R; r++) {
                const int at = (r0 + r) * groups + g;
                acc[r][h] = _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_set1_ps(a->d[at])), _mm256_cvtepi32_ps(S[r][h]),
                                            _mm256_fmadd_ps(m, _mm256_set1_ps(a->s[at]), acc[r][h]));
            }
        }
    }
    for (int r = 0; r < R; r++) {
        _mm256_storeu_ps(y + (long)(r0 + r) * out + (long)nb * 16, acc[r][0]);
        _mm256_storeu_ps(y + (long)(r0 + r) * out + (long)nb * 16 + 8, acc[r][1]);
    }
}
DEFINE_Q4Q8_BLOCKS(4)

/* AVX2 has no unsigned x signed product that cannot saturate here, so the weights are made signed
 * again and their signs moved onto the activations: vpmaddubsw(|w|, sign(xq, w)) pairs stay within
 * 2 x 127 x 127 and vpmaddwd sums them into int32. */
static inline __attribute__((always_inline)) void q8q8_rows(const q8_rows_t *a, const uint8_t *qb, const void *sb,
                                                            float *y, int in, int out, int nb, int r0, const int R,
                                                            const int parts) {
    const int groups = in / 32;
    const __m256i flip = _mm256_set1_epi8((char)0x80), ones = _mm256_set1_epi16(1);
    __m256 acc[4][2];
    for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (int g = 0; g < groups; g++) {
        const uint8_t *grp = qb + (long)g * 512;
        for (int line = 0; line < 512; line += 64) _mm_prefetch((const char *)(grp + 4 * 512 + line), _MM_HINT_T0);
        for (int part = 0; part < parts; part++) { /* the chunks one scale covers */
            __m256i S[4][2];
            for (int r = 0; r < R; r++) S[r][0] = S[r][1] = _mm256_setzero_si256();
            for (int c = part * 8 / parts; c < (part + 1) * 8 / parts; c++)
                for (int h = 0; h < 2; h++) {
                    __m256i w = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(grp + c * 64 + h * 32)), flip);
                    __m256i magnitude = _mm256_sign_epi8(w, w);
                    for (int r = 0; r < R; r++) {
                        int32_t chunk;
                        memcpy(&chunk, a->q + (long)(r0 + r) * in + g * 32 + c * 4, 4);
                        __m256i pairs = _mm256_maddubs_epi16(magnitude, _mm256_sign_epi8(_mm256_set1_epi32(chunk), w));
                        S[r][h] = _mm256_add_epi32(S[r][h], _mm256_madd_epi16(pairs, ones));
                    }
                }
            for (int h = 0; h < 2; h++) {
                const int j = g * parts + part; /* q8q8: float32 scales; q6q8: Q6_K's d and sc (common.h) */
                __m256 scale = parts == 1 ? _mm256_loadu_ps((const float *)sb + j * 16 + 8 * h)
                    : q6k_scales(sb, j, h);
                for (int r = 0; r < R; r++) {
                    const int at = (r0 + r) * groups + g;
                    acc[r][h] = _mm256_fmadd_ps(_mm256_mul_ps(scale, _mm256_set1_ps(a->d[at])),
                                                _mm256_cvtepi32_ps(S[r][h]), acc[r][h]);
                }
            }
        }
    }
    for (int r = 0; r < R; r++) {
        _mm256_storeu_ps(y + (long)(r0 + r) * out + (long)nb * 16, acc[r][0]);
        _mm256_storeu_ps(y + (long)(r0 + r) * out + (long)nb * 16 + 8, acc[r][1]);
    }
}
DEFINE_Q8Q8_BLOCKS(4)
#endif

/* ---- q6kq8: Q6_K's values packed in 6 bits (common.h's Q6K_GROUP_BYTES), every AVX2 build -------- */

#if Q6K_PRODUCTS_AVX2
/* q8q8_rows' q6q8 (a scale a 16 inputs) on a quarter fewer weight bytes: a chunk's 64 values are its
 * 32 bytes of nibbles and 16 of high bits (both lanes take the 16: lane 0 bytes 0-15 at shifts 0 and 4,
 * lane 1 bytes 16-31 at 2 and 6), 0..63 unsigned, so vpmaddubsw takes them as they are (pairs of 63 x
 * 127 at most) and each half group's sum of q xq less 32 sum(xq) is q6q8's sum of (q - 32) xq: the
 * same integers, scaled and added in the same order, so the same bits. */
static inline __attribute__((always_inline)) void q6kq8_rows(const q8_rows_t *a, const uint8_t *qb, const void *sb,
                                                             float *y, int in, int out, int nb, int r0, const int R) {
    const int groups = in / 32;
    const __m256i nibble = _mm256_set1_epi8(15), three = _mm256_set1_epi8(3), ones = _mm256_set1_epi16(1);
    const __m256i shift_lo = _mm256_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2), shift_hi = _mm256_setr_epi32(4, 4, 4, 4, 6, 6, 6, 6);
    __m256 acc[4][2];
    for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (int g = 0; g < groups; g++) {
        const uint8_t *grp = qb + (long)g * Q6K_GROUP_BYTES;
        for (int line = 0; line < Q6K_GROUP_BYTES; line += 64)
            _mm_prefetch((const char *)(grp + 4 * Q6K_GROUP_BYTES + line), _MM_HINT_T0);
        for (int part = 0; part < 2; part++) {
            __m256i S[4][2];
            for (int r = 0; r < R; r++) S[r][0] = S[r][1] = _mm256_setzero_si256();
            for (int c = part * 4; c < part * 4 + 4; c++) {
                const __m256i v = _mm256_loadu_si256((const __m256i *)(grp + c * 32));
                const __m256i bits = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(grp + Q6K_HIGH + c * 16)));
                const __m256i w[2] = {
                    _mm256_or_si256(_mm256_and_si256(v, nibble),
                                    _mm256_slli_epi16(_mm256_and_si256(_mm256_srlv_epi32(bits, shift_lo), three), 4)),
                    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), nibble),
                                    _mm256_slli_epi16(_mm256_and_si256(_mm256_srlv_epi32(bits, shift_hi), three), 4))};
                for (int r = 0; r < R; r++) {
                    int32_t chunk;
                    memcpy(&chunk, a->q + (long)(r0 + r) * in + g * 32 + c * 4, 4);
                    const __m256i xb = _mm256_set1_epi32(chunk);
                    for (int h = 0; h < 2; h++)
                        S[r][h] = _mm256_add_epi32(S[r][h], _mm256_madd_epi16(_mm256_maddubs_epi16(w[h], xb), ones));
                }
            }
            const int j = g * 2 + part;
            for (int h = 0; h < 2; h++) {
                const __m256 scale = q6k_scales(sb, j, h);
                for (int r = 0; r < R; r++) {
                    const int at = (r0 + r) * groups + g;
                    const __m256i q = _mm256_sub_epi32(S[r][h], _mm256_set1_epi32(32 * a->half_sum[2 * at + part]));
                    acc[r][h] = _mm256_fmadd_ps(_mm256_mul_ps(scale, _mm256_set1_ps(a->d[at])), _mm256_cvtepi32_ps(q),
                                                acc[r][h]);
                }
            }
        }
    }
    for (int r = 0; r < R; r++) {
        _mm256_storeu_ps(y + (long)(r0 + r) * out + (long)nb * 16, acc[r][0]);
        _mm256_storeu_ps(y + (long)(r0 + r) * out + (long)nb * 16 + 8, acc[r][1]);
    }
}
DEFINE_Q6KQ8_BLOCKS(4)
#endif

#endif
