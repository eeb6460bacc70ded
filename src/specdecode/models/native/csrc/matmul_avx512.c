/* The product kernels in AVX-512 intrinsics: q4q8 and q8q8 on AVX512-VNNI's vpdpbusd, and q4_matmul
 * (4-bit weights, bf16 activations) on AVX512-BF16's dot product. An AVX-512 build runs
 * matmul_avx2.c's float products, and its q4q8 and q8q8 where there is no VNNI (arch-fallback.h). */
#include "common.h"

#if KERNELS_AVX512

/* ---- 8-bit activations: q4q8, q8q8 on vpdpbusd ----------------------------------------------- */

#if INT8_PRODUCTS_AVX512
/* R rows (1-8) of one 16-output block with AVX512-VNNI: per chunk of 4 inputs the 32 packed bytes
 * are loaded into both halves of a vector, the high half shifted by 4, and one mask gives the 64
 * weights (16 outputs x 4 inputs); vpdpbusd adds each output's 4 products to its int32 lane, for
 * all R rows from one unpacking. */
static inline __attribute__((always_inline)) void q4q8_rows(const q8_rows_t *a, const uint8_t *qb, const void *cb,
                                                            float *y, int in, int out, int nb, int r0, const int R,
                                                            const int format) {
    const int groups = in / 32, group_bytes = Q4Q8_GROUP_BYTES(format);
    const __m512i nibble = _mm512_set1_epi8(15), sixteen = _mm512_set1_epi8(16);
    const __m512i shift = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1);
    __m512 acc[8];
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    for (int g = 0; g < groups; g++) {
        const uint8_t *grp = qb + (long)g * group_bytes;
        for (int line = 0; line < group_bytes; line += 64)
            _mm_prefetch((const char *)(grp + 8 * group_bytes + line), _MM_HINT_T0);
        __m512i S[8];
        for (int r = 0; r < R; r++) S[r] = _mm512_setzero_si512();
        for (int c = 0; c < 8; c++) {
            __m512i v = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(grp + c * 32)));
            __m512i w = _mm512_and_si512(_mm512_srlv_epi16(v, shift), nibble);
            if (FIVE_BITS(format)) { /* the chunk's 64 high bits are the lanes' own, in order: 16 where set */
                uint64_t bits;
                memcpy(&bits, grp + 256 + c * 8, 8);
                w = _mm512_mask_add_epi8(w, (__mmask64)bits, w, sixteen);
            }
            for (int r = 0; r < R; r++) {
                int32_t chunk;
                memcpy(&chunk, a->q + (long)(r0 + r) * in + g * 32 + c * 4, 4);
                S[r] = _mm512_dpbusd_epi32(S[r], w, _mm512_set1_epi32(chunk));
            }
        }
        __m512 d, m;
        if (format == FORMAT_Q40) { /* m = -8 d */
            d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)cb + g * 16)));
            m = _mm512_mul_ps(d, _mm512_set1_ps(-8.0f));
        } else if (!K_QUANT(format)) {
            d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)cb + g * 32)));
            m = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)cb + g * 32 + 16)));
        } else { /* K-quants: the super-block's d and -dmin times the group's 6-bit sc and m */
            const uint8_t *kq = (const uint8_t *)cb + (long)(g / 8) * KQ_BYTES;
            d = _mm512_mul_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)kq)),
                              _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(
                                  _mm_loadu_si128((const __m128i *)(kq + KQ_SC + (g % 8) * 16)))));
            m = _mm512_mul_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(kq + 32))),
                              _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(
                                  _mm_loadu_si128((const __m128i *)(kq + KQ_M + (g % 8) * 16)))));
        }
        for (int r = 0; r < R; r++) {
            const int at = (r0 + r) * groups + g;
            acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_set1_ps(a->d[at])), _mm512_cvtepi32_ps(S[r]),
                                     _mm512_fmadd_ps(m, _mm512_set1_ps(a->s[at]), acc[r]));
        }
    }
    for (int r = 0; r < R; r++) _mm512_storeu_ps(y + (long)(r0 + r) * out + (long)nb * 16, acc[r]);
}
DEFINE_Q4Q8_BLOCKS(8)

/* R rows (1-8) of one 16-output block with AVX512-VNNI: vpdpbusd takes the weights' bytes (q + 128)
 * as its unsigned operand; the row's 128 sum(xq) is taken off the exact integer sums. */
static inline __attribute__((always_inline)) void q8q8_rows(const q8_rows_t *a, const uint8_t *qb, const void *sb,
                                                            float *y, int in, int out, int nb, int r0, const int R,
                                                            const int parts) {
    const int groups = in / 32;
    __m512 acc[8];
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    for (int g = 0; g < groups; g++) {
        const uint8_t *grp = qb + (long)g * 512;
        for (int line = 0; line < 512; line += 64) _mm_prefetch((const char *)(grp + 4 * 512 + line), _MM_HINT_T0);
        for (int part = 0; part < parts; part++) { /* the chunks one scale covers */
            __m512i S[8];
            for (int r = 0; r < R; r++) S[r] = _mm512_setzero_si512();
            for (int c = part * 8 / parts; c < (part + 1) * 8 / parts; c++) {
                __m512i w = _mm512_loadu_si512((const void *)(grp + c * 64));
                for (int r = 0; r < R; r++) {
                    int32_t chunk;
                    memcpy(&chunk, a->q + (long)(r0 + r) * in + g * 32 + c * 4, 4);
                    S[r] = _mm512_dpbusd_epi32(S[r], w, _mm512_set1_epi32(chunk));
                }
            }
            const int j = g * parts + part; /* q8q8: float32 scales; q6q8: Q6_K's d and sc (common.h) */
            __m512 scale = parts == 1 ? _mm512_loadu_ps((const float *)sb + j * 16)
                : _mm512_mul_ps(
                      _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)q6k_block(sb, j))),
                      _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)q6k_sc(sb, j)))));
            for (int r = 0; r < R; r++) {
                const int at = (r0 + r) * groups + g;
                const int32_t xsum = parts == 1 ? a->sum[at] : a->half_sum[2 * at + part];
                __m512i exact = _mm512_sub_epi32(S[r], _mm512_set1_epi32(128 * xsum));
                acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(scale, _mm512_set1_ps(a->d[at])), _mm512_cvtepi32_ps(exact),
                                         acc[r]);
            }
        }
    }
    for (int r = 0; r < R; r++) _mm512_storeu_ps(y + (long)(r0 + r) * out + (long)nb * 16, acc[r]);
}
DEFINE_Q8Q8_BLOCKS(8)
#endif

/* ---- 4-bit weights, bf16 activations: q4_matmul on AVX512-BF16 ------------------------------- */

#if Q4_BF16_AVX512
/* y = x W^T for a weight held as 4-bit integers in groups of 32 inputs, w = d q + m, q in 0..15 (the
 * GGUF Q4_1 block format), with bf16 activations x [rows, in] and bf16 out y [rows, out]; in a
 * multiple of 32, out of 16. AVX512-BF16 only (q4_available() says whether it was built): each
 * weight is unpacked once per call for up to 8 rows and multiplied with the bf16 dot product
 * (32 products a vector instruction, each exact, summed in float32).
 *
 * Layout, 16 outputs at a time: q [out / 16][in / 4][32] bytes, byte 2o + j of a 4-input chunk
 * holding output o's input j in its low nibble and input j + 2 in its high one; coef
 * [out / 16][in / 32][2][16] float32, a = 16 d and b = m - 16 d per group and output.
 * Unpacking: a nibble placed in the mantissa of bf16 1.0 reads (16 + q) / 16 exactly, so a group's
 * dot product S = sum_i x_i (16 + q_i) / 16 and its contribution is a S + b sum_i x_i (the group
 * sums of x are computed once per call). A row's result is the same sequence of operations
 * whatever the other rows are. */
static inline __attribute__((always_inline)) void q4_rows(const uint16_t *x, const uint8_t *qb, const float *cb,
                                                         const float *sums, uint16_t *y, int in, int out,
                                                         int nb, int r0, int rows, const int R) {
    const int groups = in / 32;
    const uint16_t *xr[8];
    const float *sr[8];
    for (int r = 0; r < R; r++) {
        int row = r0 + r < rows ? r0 + r : rows - 1;
        xr[r] = x + (long)row * in;
        sr[r] = sums + (long)row * groups;
    }
    const __m512i nibble = _mm512_set1_epi16(0x78), one = _mm512_set1_epi16(0x3F80);
    __m512 acc[8];
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    for (int g = 0; g < groups; g++) {
        __m512 part[8][2];
        for (int r = 0; r < R; r++) part[r][0] = part[r][1] = _mm512_setzero_ps();
        const uint8_t *w = qb + (long)g * 256;
        /* a group's 256 bytes of weights and 128 of coefficients, fetched 8 groups ahead: in cache by the
         * time their group comes */
        for (int line = 0; line < 256; line += 64) _mm_prefetch((const char *)(w + 2048 + line), _MM_HINT_T0);
        _mm_prefetch((const char *)(cb + (g + 8) * 32), _MM_HINT_T0);
        _mm_prefetch((const char *)(cb + (g + 8) * 32 + 16), _MM_HINT_T0);
        for (int c = 0; c < 8; c++) {
            __m512i v = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(w + c * 32)));
            /* (v << 3) & 0x78 | 0x3F80: the low nibble as (16 + q) / 16; (v >> 1) the high one */
            __m512bh lo = (__m512bh)_mm512_ternarylogic_epi32(_mm512_slli_epi16(v, 3), nibble, one, 0xEA);
            __m512bh hi = (__m512bh)_mm512_ternarylogic_epi32(_mm512_srli_epi16(v, 1), nibble, one, 0xEA);
            int i = g * 32 + c * 4;
            for (int r = 0; r < R; r++) {
                int32_t x01, x23;
                memcpy(&x01, xr[r] + i, 4);
                memcpy(&x23, xr[r] + i + 2, 4);
                part[r][0] = _mm512_dpbf16_ps(part[r][0], lo, (__m512bh)_mm512_set1_epi32(x01));
                part[r][1] = _mm512_dpbf16_ps(part[r][1], hi, (__m512bh)_mm512_set1_epi32(x23));
            }
        }
        __m512 a = _mm512_loadu_ps(cb + g * 32), b = _mm512_loadu_ps(cb + g * 32 + 16);
        for (int r = 0; r < R; r++)
            acc[r] = _mm512_fmadd_ps(a, _mm512_add_ps(part[r][0], part[r][1]),
                                     _mm512_fmadd_ps(b, _mm512_set1_ps(sr[r][g]), acc[r]));
    }
    for (int r = 0; r < R && r0 + r < rows; r++)
        _mm256_storeu_si256((__m256i *)(y + (long)(r0 + r) * out + (long)nb * 16),
                            (__m256i)_mm512_cvtneps_pbh(acc[r]));
}

static void q4_blocks(void *ctx, int nb) {
    const product_t *p = ctx;
    const int in = p->in, out = p->out, rows = p->rows;
    const uint16_t *x = p->x;
    const uint8_t *qb = (const uint8_t *)p->q + (long)nb * in * 8;
    const float *cb = (const float *)p->coef + (long)nb * (in / 32) * 32, *sums = p->extra;
    uint16_t *y = p->y;
    for (int r0 = 0; r0 < rows;) {
        int left = rows - r0;
        if (left > 4) {
            q4_rows(x, qb, cb, sums, y, in, out, nb, r0, rows, 8);
            r0 += 8;
        } else if (left > 2) {
            q4_rows(x, qb, cb, sums, y, in, out, nb, r0, rows, 4);
            r0 += 4;
        } else if (left == 2) {
            q4_rows(x, qb, cb, sums, y, in, out, nb, r0, rows, 2);
            r0 += 2;
        } else {
            q4_rows(x, qb, cb, sums, y, in, out, nb, r0, rows, 1);
            r0 += 1;
        }
    }
}

int q4_matmul(const uint16_t *x, const uint8_t *q, const float *coef, uint16_t *y, int rows, int in, int out,
              int threads) {
    float *sums = group_sums_bf16(x, rows, in);
    if (!sums) return 1;
    product_t p = {x, q, coef, sums, y, rows, in, out, 0};
    parallel_for(out / 16, threads, q4_blocks, &p);
    free(sums);
    return 0;
}
#endif

#endif
