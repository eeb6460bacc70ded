/* Causal attention of new positions over a KV cache, one (position, head) at a time.
 *
 * Why C: PyTorch's fused attention is not row-invariant, so a position had to take one call of its
 * own. Here a position's arithmetic is the same whatever else shares the call.
 *
 * attend: query t sees the first first_length + t keys; or, with `parents` (a draft tree: node t's
 *   parent among the new positions, -1 for the cache's last token), the cache's first
 *   first_length - 1 keys and then its ancestors' and its own, root first: the keys it would see in
 *   a chain of them. Either way key j of a query's keys sits at position j and the query at the
 *   last; with a sliding `window` (> 0) it sees only the last `window` of them (positions
 *   p - window < j <= p, llama.cpp's standard sliding window), computed as if they were all. q: [queries, heads, head_dim] float32; out (the same shape), k and v (one layer
 *   of the cache, [kv_heads, positions, head_dim], kv_stride elements between kv heads) in bf16 or
 *   float32; head_dim a multiple of 2 LANES (the bf16 dot product takes 32), at most MAX_HEAD_DIM.
 *
 * attend_one (one position and head) has an AVX-512, an AVX2 and a portable variant; attend (the
 * items over parallel_for, the draft tree's key order) is shared.
 */
#include "common.h"

/* Key j's cache slot: j itself, or past `split` (a draft tree's node) the slot `tail` lists. */
#define SLOT(j) ((j) < split ? (j) : tail[(j) - split])

/* One (position, head): scores[j] = scale q.k_j, softmax over j < length, out = sum_j w_j v_j.
 * With AVX-512, keys go 16 at a time: each key's products summed by one fixed tree that leaves the
 * 16 scores in one vector, and a vector exp (exp16, common.h), rather than a reduction and a libm
 * expf per key. scores holds length rounded up to 16. */

#if KERNELS_AVX512
/* ---- attend_one: AVX-512 ---------------------------------------------------------------------- */

/* The lane sums of 16 vectors: out[4 L + m] = sum of a[L + 4 m] (callers put key 4 (s % 4) + s / 4
 * in slot s, so out[i] is key i's). */
static inline __m512 sum_lanes16(const __m512 *a) {
    __m512 u[8], v[4], w[2];
    for (int m = 0; m < 8; m++) /* 128-bit lanes: [a0+a2, a1+a3] of a[2m], then of a[2m + 1] */
        u[m] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * m], a[2 * m + 1], 0x44),
                             _mm512_shuffle_f32x4(a[2 * m], a[2 * m + 1], 0xEE));
    for (int m = 0; m < 4; m++) /* 128-bit lane L: a[4m + L]'s four partial sums */
        v[m] = _mm512_add_ps(_mm512_shuffle_f32x4(u[2 * m], u[2 * m + 1], 0x88),
                             _mm512_shuffle_f32x4(u[2 * m], u[2 * m + 1], 0xDD));
    for (int m = 0; m < 2; m++)
        w[m] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * m], v[2 * m + 1]), _mm512_unpackhi_ps(v[2 * m], v[2 * m + 1]));
    return _mm512_add_ps(_mm512_shuffle_ps(w[0], w[1], 0x44), _mm512_shuffle_ps(w[0], w[1], 0xEE));
}

/* The lanes of a block of 16 keys that hold keys (left: keys from the block's first on). */
static inline __mmask16 tail_mask(int left) { return left >= 16 ? 0xFFFF : (__mmask16)((1u << left) - 1); }

#define DEFINE_ATTEND_ONE(NAME, T, LOAD16, STORE, Q, PREPARE, SCORE)                             \
    static void NAME(const float *q, const T *k, const T *v, T *out, int length,                \
                     int head_dim, float scale, float *scores, int split, const int *tail) {     \
        int n = head_dim / 16, blocks = (length + 15) / 16;                                      \
        __m512 o[MAX_HEAD_DIM / 16], best = _mm512_set1_ps(-INFINITY);                           \
        Q qv[MAX_HEAD_DIM / 16];                                                                 \
        PREPARE(qv, q, n);                                                                       \
        for (int b = 0; b < blocks; b++) {                                                       \
            __m512 acc[16];                                                                      \
            for (int s = 0; s < 16; s++) {                                                       \
                int j = b * 16 + 4 * (s % 4) + s / 4;                                            \
                const T *kj = k + (long)SLOT(j < length ? j : length - 1) * head_dim;            \
                acc[s] = SCORE(qv, kj, n);                                                       \
            }                                                                                    \
            __mmask16 valid = tail_mask(length - b * 16);                                        \
            __m512 sv = _mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), valid,                     \
                                           _mm512_mul_ps(sum_lanes16(acc), _mm512_set1_ps(scale))); \
            _mm512_storeu_ps(scores + b * 16, sv);                                               \
            best = _mm512_max_ps(best, sv);                                                      \
        }                                                                                        \
        __m512 top = _mm512_set1_ps(_mm512_reduce_max_ps(best)), total = _mm512_setzero_ps();    \
        for (int b = 0; b < blocks; b++) {                                                       \
            __mmask16 valid = tail_mask(length - b * 16);                                        \
            __m512 w = _mm512_maskz_mov_ps(valid, exp16(_mm512_sub_ps(_mm512_loadu_ps(scores + b * 16), top))); \
            _mm512_storeu_ps(scores + b * 16, w);                                                \
            total = _mm512_add_ps(total, w);                                                     \
        }                                                                                        \
        for (int c = 0; c < n; c++) o[c] = _mm512_setzero_ps();                                  \
        for (int j = 0; j < length; j++) {                                                       \
            const T *vj = v + (long)SLOT(j) * head_dim;                                          \
            __m512 w = _mm512_set1_ps(scores[j]);                                                \
            for (int c = 0; c < n; c++) o[c] = _mm512_fmadd_ps(w, LOAD16(vj + c * 16), o[c]);    \
        }                                                                                        \
        __m512 sum = _mm512_set1_ps(_mm512_reduce_add_ps(total));                                \
        for (int c = 0; c < n; c++) {                                                            \
            float y[16];                                                                         \
            _mm512_storeu_ps(y, _mm512_div_ps(o[c], sum));                                       \
            for (int l = 0; l < 16; l++) out[c * 16 + l] = STORE(y[l]);                          \
        }                                                                                        \
    }

/* q.k of one key as 16 lanes of partial sums. Float32 products; or, with AVX512-BF16 and a bf16
 * cache, the bf16 dot product of q rounded to bf16 (as PyTorch's bf16 attention rounds it) with the
 * key as stored: exact products, 32 dims an instruction, no conversion of the key (head_dim a
 * multiple of 32: kernels.py checks). */
static inline void prepare_f32(__m512 *qv, const float *q, int n) {
    for (int c = 0; c < n; c++) qv[c] = _mm512_loadu_ps(q + c * 16);
}
static inline __m512 score_f32(const __m512 *qv, const float *key, int n) {
    __m512 acc = _mm512_mul_ps(qv[0], load16_f32(key));
    for (int c = 1; c < n; c++) acc = _mm512_fmadd_ps(qv[c], load16_f32(key + c * 16), acc);
    return acc;
}
DEFINE_ATTEND_ONE(attend_one_f32, float, load16_f32, store_f32, __m512, prepare_f32, score_f32)

#if KERNELS_AVX512_BF16
static inline void prepare_bf16(__m512bh *qv, const float *q, int n) {
    for (int c = 0; c < n / 2; c++)
        qv[c] = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(q + c * 32 + 16), _mm512_loadu_ps(q + c * 32));
}
static inline __m512 score_bf16(const __m512bh *qv, const uint16_t *key, int n) {
    __m512 acc = _mm512_dpbf16_ps(_mm512_setzero_ps(), qv[0], (__m512bh)_mm512_loadu_si512(key));
    for (int c = 1; c < n / 2; c++) acc = _mm512_dpbf16_ps(acc, qv[c], (__m512bh)_mm512_loadu_si512(key + c * 32));
    return acc;
}
DEFINE_ATTEND_ONE(attend_one_bf16, uint16_t, load16_bf16, store_bf16, __m512bh, prepare_bf16, score_bf16)
#else
static inline __m512 score_bf16(const __m512 *qv, const uint16_t *key, int n) {
    __m512 acc = _mm512_mul_ps(qv[0], load16_bf16(key));
    for (int c = 1; c < n; c++) acc = _mm512_fmadd_ps(qv[c], load16_bf16(key + c * 16), acc);
    return acc;
}
DEFINE_ATTEND_ONE(attend_one_bf16, uint16_t, load16_bf16, store_bf16, __m512, prepare_f32, score_bf16)
#endif

#elif KERNELS_AVX2
/* ---- attend_one: AVX2 ------------------------------------------------------------------------- */

/* AVX2: the same design 8 keys at a time (a fixed tree of horizontal adds leaves their 8 scores in one
 * vector), and the same exp polynomial with 2^n built in the exponent bits. */

/* out[s] = the sum of a[s]'s 8 lanes */
static inline __m256 sum_lanes8(const __m256 *a) {
    __m256 t0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3])); /* a0-a3: lanes 0-3 | 4-7 */
    __m256 t1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
    return _mm256_add_ps(_mm256_permute2f128_ps(t0, t1, 0x20), _mm256_permute2f128_ps(t0, t1, 0x31));
}

/* all-ones in the lanes of a block of 8 keys that hold keys (left: keys from the block's first on) */
static inline __m256 tail_mask8(int left) {
    return _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(left), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)));
}

static inline float lanes_max8(__m256 x) {
    float y[8], m = -INFINITY;
    _mm256_storeu_ps(y, x);
    for (int l = 0; l < 8; l++) m = y[l] > m ? y[l] : m;
    return m;
}

#define DEFINE_ATTEND_ONE(NAME, T, LOAD8, STORE)                                                 \
    static void NAME(const float *q, const T *k, const T *v, T *out, int length,                \
                     int head_dim, float scale, float *scores, int split, const int *tail) {     \
        int n = head_dim / 8, blocks = (length + 7) / 8;                                         \
        __m256 qv[MAX_HEAD_DIM / 8], o[MAX_HEAD_DIM / 8], best = _mm256_set1_ps(-INFINITY);      \
        for (int c = 0; c < n; c++) qv[c] = _mm256_loadu_ps(q + c * 8);                          \
        for (int b = 0; b < blocks; b++) {                                                       \
            __m256 acc[8];                                                                       \
            for (int s = 0; s < 8; s++) {                                                        \
                int j = b * 8 + s;                                                               \
                const T *kj = k + (long)SLOT(j < length ? j : length - 1) * head_dim;            \
                acc[s] = _mm256_mul_ps(qv[0], LOAD8(kj));                                        \
                for (int c = 1; c < n; c++) acc[s] = _mm256_fmadd_ps(qv[c], LOAD8(kj + c * 8), acc[s]); \
            }                                                                                    \
            __m256 sv = _mm256_blendv_ps(_mm256_set1_ps(-INFINITY),                              \
                                         _mm256_mul_ps(sum_lanes8(acc), _mm256_set1_ps(scale)),  \
                                         tail_mask8(length - b * 8));                            \
            _mm256_storeu_ps(scores + b * 8, sv);                                                \
            best = _mm256_max_ps(best, sv);                                                      \
        }                                                                                        \
        __m256 top = _mm256_set1_ps(lanes_max8(best)), total = _mm256_setzero_ps();              \
        for (int b = 0; b < blocks; b++) {                                                       \
            __m256 w = _mm256_and_ps(tail_mask8(length - b * 8),                                 \
                                     exp8(_mm256_sub_ps(_mm256_loadu_ps(scores + b * 8), top))); \
            _mm256_storeu_ps(scores + b * 8, w);                                                 \
            total = _mm256_add_ps(total, w);                                                     \
        }                                                                                        \
        for (int c = 0; c < n; c++) o[c] = _mm256_setzero_ps();                                  \
        for (int j = 0; j < length; j++) {                                                       \
            const T *vj = v + (long)SLOT(j) * head_dim;                                          \
            __m256 w = _mm256_set1_ps(scores[j]);                                                \
            for (int c = 0; c < n; c++) o[c] = _mm256_fmadd_ps(w, LOAD8(vj + c * 8), o[c]);      \
        }                                                                                        \
        float t[8], sum = 0;                                                                     \
        _mm256_storeu_ps(t, total);                                                              \
        for (int l = 0; l < 8; l++) sum += t[l];                                                 \
        for (int c = 0; c < n; c++) {                                                            \
            float y[8];                                                                          \
            _mm256_storeu_ps(y, _mm256_div_ps(o[c], _mm256_set1_ps(sum)));                       \
            for (int l = 0; l < 8; l++) out[c * 8 + l] = STORE(y[l]);                            \
        }                                                                                        \
    }

DEFINE_ATTEND_ONE(attend_one_f32, float, load8_f32, store_f32)
DEFINE_ATTEND_ONE(attend_one_bf16, uint16_t, load8_bf16, store_bf16)

/* attend_heads: G (1-3) query heads of one kv head (a GQA group) at one position, each key and value
 * loaded once for all of them (a head alone reads them from L2 at a load per multiply-add). The
 * same operations as attend_one for each head, in the same order (its lane sums are sum_lanes8's
 * tree, 4 keys at a time), so the results are bit-identical to G calls of attend_one. scores:
 * G x (length rounded up to 16). */
#define ATTEND_HEADS_AT_ONCE 3

/* out[s] (s < 4) = the sum of a[s]'s 8 lanes, by sum_lanes8's tree; in the low 128 bits */
static inline __m128 sum_lanes4(const __m256 *a) {
    __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
    return _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
}

#define DEFINE_ATTEND_HEADS(NAME, T, LOAD8, STORE)                                               \
    static inline __attribute__((always_inline)) void NAME##_g(                                 \
        const float *q, const T *k, const T *v, T *out, int length, int head_dim, float scale,  \
        float *scores, int split, const int *tail, const int G) {                                \
        const int n = head_dim / 8, blocks = (length + 7) / 8, stride = (length + 15) & ~15;    \
        __m256 best[ATTEND_HEADS_AT_ONCE];                                                       \
        for (int g = 0; g < G; g++) best[g] = _mm256_set1_ps(-INFINITY);                         \
        for (int b = 0; b < blocks; b++) {                                                       \
            __m128 half[ATTEND_HEADS_AT_ONCE][2];                                                \
            for (int part = 0; part < 2; part++) { /* keys 4 part .. 4 part + 3 of the block */ \
                const T *kj[4];                                                                  \
                for (int s = 0; s < 4; s++) {                                                    \
                    int j = b * 8 + 4 * part + s;                                                \
                    kj[s] = k + (long)SLOT(j < length ? j : length - 1) * head_dim;              \
                }                                                                                \
                __m256 acc[ATTEND_HEADS_AT_ONCE][4];                                             \
                for (int s = 0; s < 4; s++) {                                                    \
                    __m256 key = LOAD8(kj[s]);                                                   \
                    for (int g = 0; g < G; g++) acc[g][s] = _mm256_mul_ps(_mm256_loadu_ps(q + g * head_dim), key); \
                }                                                                                \
                for (int c = 1; c < n; c++)                                                      \
                    for (int s = 0; s < 4; s++) {                                                \
                        __m256 key = LOAD8(kj[s] + c * 8);                                       \
                        for (int g = 0; g < G; g++)                                              \
                            acc[g][s] = _mm256_fmadd_ps(_mm256_loadu_ps(q + g * head_dim + c * 8), key, acc[g][s]); \
                    }                                                                            \
                for (int g = 0; g < G; g++) half[g][part] = sum_lanes4(acc[g]);                  \
            }                                                                                    \
            for (int g = 0; g < G; g++) {                                                        \
                __m256 sum = _mm256_insertf128_ps(_mm256_castps128_ps256(half[g][0]), half[g][1], 1); \
                __m256 sv = _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), _mm256_mul_ps(sum, _mm256_set1_ps(scale)), \
                                             tail_mask8(length - b * 8));                        \
                _mm256_storeu_ps(scores + g * stride + b * 8, sv);                               \
                best[g] = _mm256_max_ps(best[g], sv);                                            \
            }                                                                                    \
        }                                                                                        \
        float total[ATTEND_HEADS_AT_ONCE];                                                       \
        for (int g = 0; g < G; g++) {                                                            \
            __m256 top = _mm256_set1_ps(lanes_max8(best[g])), sum = _mm256_setzero_ps();        \
            float *sg = scores + g * stride;                                                     \
            for (int b = 0; b < blocks; b++) {                                                   \
                __m256 w = _mm256_and_ps(tail_mask8(length - b * 8), exp8(_mm256_sub_ps(_mm256_loadu_ps(sg + b * 8), top))); \
                _mm256_storeu_ps(sg + b * 8, w);                                                 \
                sum = _mm256_add_ps(sum, w);                                                     \
            }                                                                                    \
            float t[8];                                                                          \
            _mm256_storeu_ps(t, sum);                                                            \
            total[g] = 0;                                                                        \
            for (int l = 0; l < 8; l++) total[g] += t[l];                                        \
        }                                                                                        \
        for (int c0 = 0; c0 < n; c0 += 4) { /* 32 dims of every head at a time */               \
            __m256 o[ATTEND_HEADS_AT_ONCE][4];                                                   \
            for (int g = 0; g < G; g++)                                                          \
                for (int c = 0; c < 4; c++) o[g][c] = _mm256_setzero_ps();                       \
            for (int j = 0; j < length; j++) {                                                   \
                const T *vj = v + (long)SLOT(j) * head_dim + c0 * 8;                             \
                __m256 w[ATTEND_HEADS_AT_ONCE];                                                  \
                for (int g = 0; g < G; g++) w[g] = _mm256_set1_ps(scores[g * stride + j]);       \
                for (int c = 0; c < 4; c++) {                                                    \
                    __m256 value = LOAD8(vj + c * 8);                                            \
                    for (int g = 0; g < G; g++) o[g][c] = _mm256_fmadd_ps(w[g], value, o[g][c]); \
                }                                                                                \
            }                                                                                    \
            for (int g = 0; g < G; g++)                                                          \
                for (int c = 0; c < 4; c++) {                                                    \
                    float y[8];                                                                  \
                    _mm256_storeu_ps(y, _mm256_div_ps(o[g][c], _mm256_set1_ps(total[g])));       \
                    for (int l = 0; l < 8; l++) out[g * head_dim + (c0 + c) * 8 + l] = STORE(y[l]); \
                }                                                                                \
        }                                                                                        \
    }                                                                                            \
    static void NAME(const float *q, const T *k, const T *v, T *out, int G, int length, int head_dim, \
                     float scale, float *scores, int split, const int *tail) {                   \
        if (G == 3) NAME##_g(q, k, v, out, length, head_dim, scale, scores, split, tail, 3);     \
        else if (G == 2) NAME##_g(q, k, v, out, length, head_dim, scale, scores, split, tail, 2); \
        else NAME##_g(q, k, v, out, length, head_dim, scale, scores, split, tail, 1);            \
    }

DEFINE_ATTEND_HEADS(attend_heads_f32, float, load8_f32, store_f32)
DEFINE_ATTEND_HEADS(attend_heads_bf16, uint16_t, load8_bf16, store_bf16)

#else
/* ---- attend_one: portable --------------------------------------------------------------------- */

#define DEFINE_ATTEND_ONE(NAME, T, LOAD, STORE)                                                  \
    static void NAME(const float *q, const T *k, const T *v, T *out, int length,                \
                     int head_dim, float scale, float *scores, int split, const int *tail) {     \
        float best = -INFINITY;                                                                  \
        for (int j = 0; j < length; j++) {                                                       \
            const T *kj = k + (long)SLOT(j) * head_dim;                                          \
            float acc[LANES] = {0};                                                              \
            for (int d = 0; d < head_dim; d += LANES)                                            \
                for (int l = 0; l < LANES; l++) acc[l] += q[d + l] * LOAD(kj[d + l]);            \
            float s = 0;                                                                         \
            for (int l = 0; l < LANES; l++) s += acc[l];                                         \
            scores[j] = s * scale;                                                               \
            if (scores[j] > best) best = scores[j];                                              \
        }                                                                                        \
        float o[MAX_HEAD_DIM] = {0}, total = 0;                                                  \
        for (int j = 0; j < length; j++) {                                                       \
            const T *vj = v + (long)SLOT(j) * head_dim;                                          \
            float w = expf(scores[j] - best);                                                    \
            total += w;                                                                          \
            for (int d = 0; d < head_dim; d++) o[d] += w * LOAD(vj[d]);                          \
        }                                                                                        \
        for (int d = 0; d < head_dim; d++) out[d] = STORE(o[d] / total);                         \
    }

DEFINE_ATTEND_ONE(attend_one_f32, float, load_f32, store_f32)
DEFINE_ATTEND_ONE(attend_one_bf16, uint16_t, load_bf16, store_bf16)

#endif

/* ---- attend: the (head, position) items over parallel_for ------------------------------------- */

#ifndef ATTEND_HEADS_AT_ONCE
#define ATTEND_HEADS_AT_ONCE 1 /* the path has no attend_heads: a head at a time */
#define attend_heads_f32(q, k, v, out, G, ...) attend_one_f32(q, k, v, out, __VA_ARGS__)
#define attend_heads_bf16(q, k, v, out, G, ...) attend_one_bf16(q, k, v, out, __VA_ARGS__)
#endif

/* How many heads of a GQA group of `group` an item takes when a call has `queries` positions in
 * all: a divisor of the group, at most ATTEND_HEADS_AT_ONCE, and 1 where fewer items than 2 a
 * thread would leave threads idle. */
INTERNAL int attend_heads_per_item(int group, int heads, int queries, int threads) {
    for (int per = ATTEND_HEADS_AT_ONCE; per > 1; per--)
        if (group % per == 0 && queries * (heads / per) >= 2 * threads) return per;
    return 1;
}

#define DEFINE_ATTEND(NAME, T, HEADS)                                                            \
    INTERNAL void NAME##_item(void *ctx, int item) { /* a->per heads at one position: a head      \
                                                       group's positions in turn, its keys and    \
                                                       values still cached */                     \
        attention_t *a = ctx;                                                                    \
        int h = item / a->queries * a->per, t = item % a->queries, length = a->first_length + t; \
        int stride = (length + 15) & ~15;                                                        \
        float *scores = malloc(sizeof(float) * stride * a->per + sizeof(int) * (t + 1));         \
        if (!scores) {                                                                           \
            a->failed = 1;                                                                       \
            return;                                                                              \
        }                                                                                        \
        int split = length, *tail = (int *)(scores + stride * a->per), depth = 0;                \
        if (a->parents) { /* the cache, then the node's ancestors and itself, root first */      \
            for (int node = t; node >= 0; node = a->parents[node]) depth++;                      \
            split = a->first_length - 1, length = split + depth;                                 \
            for (int node = t, d = depth - 1; node >= 0; node = a->parents[node], d--)           \
                tail[d] = split + node;                                                          \
        }                                                                                        \
        int lo = a->window > 0 && length > a->window ? length - a->window : 0;                   \
        if (lo) { /* a sliding window: keys lo.. only, as keys 0.. of slots from lo on */        \
            int drop = lo > split ? lo - split : 0; /* the tree's path nodes before the window */ \
            for (int d = drop; d < length - split; d++) tail[d - drop] = tail[d] - lo;           \
            split = split - lo + drop, length -= lo;                                             \
        }                                                                                        \
        long kv = (long)(h / a->group) * a->kv_stride + (long)lo * a->head_dim;                  \
        long at = ((long)t * a->heads + h) * a->head_dim;                                        \
        HEADS(a->q + at, (const T *)a->k + kv, (const T *)a->v + kv, (T *)a->out + at, a->per, length, \
              a->head_dim, a->scale, scores, split, tail);                                       \
        free(scores);                                                                            \
    }                                                                                            \
    int NAME(const float *q, const T *k, const T *v, T *out, int queries, int heads,             \
             int kv_heads, int head_dim, long kv_stride, int first_length, const int *parents,   \
             int window, float scale, int threads) {                                             \
        attention_t a = {q, k, v, out, parents, queries, heads, heads / kv_heads, head_dim,      \
                         first_length, 0, kv_stride, scale,                                      \
                         attend_heads_per_item(heads / kv_heads, heads, queries, threads), window}; \
        parallel_for(queries * (heads / a.per), threads, NAME##_item, &a);                       \
        return a.failed;                                                                         \
    }

DEFINE_ATTEND(attend_f32, float, attend_heads_f32)
DEFINE_ATTEND(attend_bf16, uint16_t, attend_heads_bf16)
