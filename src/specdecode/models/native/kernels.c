/* The native backend's small per-token operations, each row computed alone in a fixed order.
 *
 * Why C: PyTorch dispatches each small op in ~2 us; a layer's RMSNorm is eight of them (2.3 ms of a
 * 14 ms step), its RoPE and cache writes ~16, and its fused attention is not row-invariant, so it
 * took one call per position (~70 us each). Here a row's arithmetic is the same instructions in the
 * same order whatever else shares the call, so a position computes bit-identically alone or inside
 * a verification of k tokens.
 *
 * rms_norm: x, out [rows, dim], weight [dim], in bf16 or float32; dim a multiple of LANES.
 * silu_mul: the MLP's silu(gate) * up.
 * rope_store: RoPE of the new q and k; k and v written into the cache (one call instead of ~16 ops).
 * attend: causal attention of new positions over a KV cache, one (position, head) at a time; query
 *   t sees the first first_length + t keys. q: [queries, heads, head_dim] float32; out (the same
 *   shape), k and v (one layer of the cache, [kv_heads, positions, head_dim], kv_stride elements
 *   between kv heads) in bf16 or float32; head_dim a multiple of 2 LANES (the bf16 dot product
 *   takes 32), at most MAX_HEAD_DIM.
 * The caller (kernels.py) checks the shapes.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#define LANES 16
#define MAX_HEAD_DIM 256

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

/* Llama's RMSNorm as transformers computes it: h = x / sqrt(mean(x^2) + eps) in float32, rounded to
 * the activation dtype, then multiplied by the weight. */
#define DEFINE_RMS_NORM(NAME, T, LOAD, STORE)                                                    \
    void NAME(const T *x, const T *weight, T *out, int rows, int dim, float eps) {               \
        for (int r = 0; r < rows; r++) {                                                         \
            const T *xr = x + (long)r * dim;                                                     \
            T *yr = out + (long)r * dim;                                                         \
            float acc[LANES] = {0}, total = 0;                                                   \
            for (int d = 0; d < dim; d += LANES)                                                 \
                for (int l = 0; l < LANES; l++) acc[l] += LOAD(xr[d + l]) * LOAD(xr[d + l]);     \
            for (int l = 0; l < LANES; l++) total += acc[l];                                     \
            float inv = 1.0f / sqrtf(total / dim + eps);                                         \
            for (int d = 0; d < dim; d++)                                                        \
                yr[d] = STORE(LOAD(weight[d]) * LOAD(STORE(LOAD(xr[d]) * inv)));                 \
        }                                                                                        \
    }

DEFINE_RMS_NORM(rms_norm_f32, float, load_f32, store_f32)
DEFINE_RMS_NORM(rms_norm_bf16, uint16_t, load_bf16, store_bf16)

/* RoPE (rotate-half form) of a forward's new q and k, k and v stored into the cache.
 * qkv [rows, (heads + 2 kv_heads) head_dim] in the cache's dtype; cos, sin [rows, head_dim] the rows'
 * positions; q_out [rows, heads, head_dim] float32; k, v: the cache layer, written at positions
 * first.. (kv_stride elements between kv heads). */
#define DEFINE_ROPE_STORE(NAME, T, LOAD, STORE)                                                  \
    void NAME(const T *qkv, const T *cos, const T *sin, float *q_out, T *k, T *v, int rows,      \
              int heads, int kv_heads, int head_dim, long kv_stride, int first) {                \
        int half = head_dim / 2, width = (heads + 2 * kv_heads) * head_dim;                      \
        for (int r = 0; r < rows; r++) {                                                         \
            const T *row = qkv + (long)r * width, *c = cos + (long)r * head_dim,                 \
                    *s = sin + (long)r * head_dim;                                               \
            for (int h = 0; h < heads + kv_heads; h++) {                                         \
                const T *x = row + (long)h * head_dim;                                           \
                float rotated[MAX_HEAD_DIM];                                                     \
                for (int d = 0; d < head_dim; d++) {                                             \
                    float partner = d < half ? -LOAD(x[d + half]) : LOAD(x[d - half]);          \
                    rotated[d] = LOAD(x[d]) * LOAD(c[d]) + partner * LOAD(s[d]);                 \
                }                                                                                \
                if (h < heads)                                                                   \
                    memcpy(q_out + ((long)r * heads + h) * head_dim, rotated, sizeof(float) * head_dim); \
                else                                                                             \
                    for (int d = 0; d < head_dim; d++)                                           \
                        k[(h - heads) * kv_stride + (long)(first + r) * head_dim + d] = STORE(rotated[d]); \
            }                                                                                    \
            for (int h = 0; h < kv_heads; h++)                                                   \
                memcpy(v + h * kv_stride + (long)(first + r) * head_dim,                         \
                       row + (long)(heads + kv_heads + h) * head_dim, sizeof(T) * head_dim);     \
        }                                                                                        \
    }

DEFINE_ROPE_STORE(rope_store_f32, float, load_f32, store_f32)
DEFINE_ROPE_STORE(rope_store_bf16, uint16_t, load_bf16, store_bf16)

/* One (position, head): scores[j] = scale q.k_j, softmax over j < length, out = sum_j w_j v_j.
 * With AVX-512, keys go 16 at a time: each key's products summed by one fixed tree that leaves the
 * 16 scores in one vector, and a vector exp (Cephes' expf polynomial: within 1.3 ulp of exp over
 * [-87, 0], checked). Measured against a reduction and a libm expf per key: 1.5-1.7x faster over 30
 * layers at 256 and 800 cached positions. scores holds length rounded up to 16. */
#if defined(__AVX512F__)
static inline __m512 load16_f32(const float *p) { return _mm512_loadu_ps(p); }
static inline __m512 load16_bf16(const uint16_t *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}

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

/* The lanes of a block of 16 keys that hold keys (left: keys from the block's first on). */
static inline __mmask16 tail_mask(int left) { return left >= 16 ? 0xFFFF : (__mmask16)((1u << left) - 1); }

#define DEFINE_ATTEND_ONE(NAME, T, LOAD16, STORE, Q, PREPARE, SCORE)                             \
    static void NAME(const float *q, const T *k, const T *v, T *out, int length,                \
                     int head_dim, float scale, float *scores) {                                 \
        int n = head_dim / 16, blocks = (length + 15) / 16;                                      \
        __m512 o[MAX_HEAD_DIM / 16], best = _mm512_set1_ps(-INFINITY);                           \
        Q qv[MAX_HEAD_DIM / 16];                                                                 \
        PREPARE(qv, q, n);                                                                       \
        for (int b = 0; b < blocks; b++) {                                                       \
            __m512 acc[16];                                                                      \
            for (int s = 0; s < 16; s++) {                                                       \
                int j = b * 16 + 4 * (s % 4) + s / 4;                                            \
                const T *kj = k + (long)(j < length ? j : length - 1) * head_dim;                \
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
            const T *vj = v + (long)j * head_dim;                                                \
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

#if defined(__AVX512BF16__)
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
#else
#define DEFINE_ATTEND_ONE(NAME, T, LOAD, STORE)                                                  \
    static void NAME(const float *q, const T *k, const T *v, T *out, int length,                \
                     int head_dim, float scale, float *scores) {                                 \
        float best = -INFINITY;                                                                  \
        for (int j = 0; j < length; j++) {                                                       \
            const T *kj = k + (long)j * head_dim;                                                \
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
            const T *vj = v + (long)j * head_dim;                                                \
            float w = expf(scores[j] - best);                                                    \
            total += w;                                                                          \
            for (int d = 0; d < head_dim; d++) o[d] += w * LOAD(vj[d]);                          \
        }                                                                                        \
        for (int d = 0; d < head_dim; d++) out[d] = STORE(o[d] / total);                         \
    }

DEFINE_ATTEND_ONE(attend_one_f32, float, load_f32, store_f32)
DEFINE_ATTEND_ONE(attend_one_bf16, uint16_t, load_bf16, store_bf16)

#endif

/* The MLP's activation: gate_up [rows, 2 width] (gate | up) -> out [rows, width] = silu(gate) * up
 * in float32, rounded once to the activation dtype (one call instead of PyTorch's chunk, silu and
 * mul: ~0.5 ms of a step). With AVX-512, 16 at a time through exp16. */
#if defined(__AVX512F__)
#define DEFINE_SILU_MUL(NAME, T, LOAD, LOAD16, STORE)                                            \
    void NAME(const T *gate_up, T *out, int rows, int width) {                                   \
        for (int r = 0; r < rows; r++) {                                                         \
            const T *g = gate_up + (long)r * 2 * width, *u = g + width;                          \
            T *o = out + (long)r * width;                                                        \
            int d = 0;                                                                           \
            for (; d + 16 <= width; d += 16) {                                                   \
                __m512 x = LOAD16(g + d), e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), x));      \
                float y[16];                                                                     \
                _mm512_storeu_ps(y, _mm512_mul_ps(_mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), e)), \
                                                  LOAD16(u + d)));                               \
                for (int l = 0; l < 16; l++) o[d + l] = STORE(y[l]);                             \
            }                                                                                    \
            for (; d < width; d++) o[d] = STORE(LOAD(g[d]) / (1.0f + expf(-LOAD(g[d]))) * LOAD(u[d])); \
        }                                                                                        \
    }
DEFINE_SILU_MUL(silu_mul_f32, float, load_f32, load16_f32, store_f32)
DEFINE_SILU_MUL(silu_mul_bf16, uint16_t, load_bf16, load16_bf16, store_bf16)
#else
#define DEFINE_SILU_MUL(NAME, T, LOAD, STORE)                                                    \
    void NAME(const T *gate_up, T *out, int rows, int width) {                                   \
        for (int r = 0; r < rows; r++)                                                           \
            for (int d = 0; d < width; d++) {                                                    \
                float g = LOAD(gate_up[(long)r * 2 * width + d]);                                \
                out[(long)r * width + d] = STORE(g / (1.0f + expf(-g)) * LOAD(gate_up[(long)r * 2 * width + width + d])); \
            }                                                                                    \
    }
DEFINE_SILU_MUL(silu_mul_f32, float, load_f32, store_f32)
DEFINE_SILU_MUL(silu_mul_bf16, uint16_t, load_bf16, store_bf16)
#endif

#define DEFINE_ATTEND(NAME, T, ONE)                                                              \
    int NAME(const float *q, const T *k, const T *v, T *out, int queries, int heads,             \
             int kv_heads, int head_dim, long kv_stride, int first_length, float scale,          \
             int threads) {                                                                      \
        int group = heads / kv_heads, failed = 0;                                                \
        _Pragma("omp parallel for num_threads(threads) schedule(static)")                        \
        for (int item = 0; item < queries * heads; item++) {                                     \
            int t = item / heads, h = item % heads, length = first_length + t;                   \
            float *scores = malloc(sizeof(float) * ((length + 15) & ~15)); /* see attend_one */   \
            if (!scores) {                                                                       \
                failed = 1;                                                                      \
                continue;                                                                        \
            }                                                                                    \
            long kv = (long)(h / group) * kv_stride;                                             \
            ONE(q + (long)item * head_dim, k + kv, v + kv, out + (long)item * head_dim, length,  \
                head_dim, scale, scores);                                                        \
            free(scores);                                                                        \
        }                                                                                        \
        return failed;                                                                           \
    }

DEFINE_ATTEND(attend_f32, float, attend_one_f32)
DEFINE_ATTEND(attend_bf16, uint16_t, attend_one_bf16)

/* y = x W^T for a weight held as int8 in groups of 32 inputs with one scale each (w = scale q, the
 * GGUF Q8_0 block format), laid out 16 outputs at a time: q [out / 16][in][16], scales
 * [out / 16][in / 32][16]. A quarter of float32's bytes, half of bf16's; each int8 weight is
 * converted once per call and used for up to ROWS rows. A row's result is the same sequence of
 * vector operations whatever the other rows are. x [rows, in] and y [rows, out] float32; in a
 * multiple of 32, out of 16. */
typedef float v16f __attribute__((vector_size(64)));
#define ROWS 4

#if defined(__AVX512F__)
static inline v16f widen_i8(const int8_t *p) {
    __m512 f = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
    v16f r;
    memcpy(&r, &f, sizeof r);
    return r;
}
#else
static inline v16f widen_i8(const int8_t *p) {
    v16f r;
    for (int l = 0; l < 16; l++) r[l] = (float)p[l];
    return r;
}
#endif

void q8_matmul(const float *x, const int8_t *q, const float *scales, float *y, int rows, int in, int out,
               int threads) {
    int blocks = out / 16, groups = in / 32;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int nb = 0; nb < blocks; nb++) {
        const int8_t *qb = q + (long)nb * in * 16;
        const float *sb = scales + (long)nb * groups * 16;
        for (int r0 = 0; r0 < rows; r0 += ROWS) {
            const float *xr[ROWS];
            for (int r = 0; r < ROWS; r++) xr[r] = x + (long)(r0 + r < rows ? r0 + r : rows - 1) * in;
            v16f acc[ROWS] = {0};
            for (int g = 0; g < groups; g++) {
                v16f part[ROWS][2] = {{0}};
                const int8_t *w = qb + (long)g * 32 * 16;
                for (int i = 0; i < 32; i += 2) {
                    v16f w0 = widen_i8(w + i * 16), w1 = widen_i8(w + (i + 1) * 16);
                    for (int r = 0; r < ROWS; r++) {
                        part[r][0] += xr[r][g * 32 + i] * w0;
                        part[r][1] += xr[r][g * 32 + i + 1] * w1;
                    }
                }
                v16f s;
                memcpy(&s, sb + g * 16, sizeof s);
                for (int r = 0; r < ROWS; r++) acc[r] += s * (part[r][0] + part[r][1]);
            }
            for (int r = 0; r < ROWS && r0 + r < rows; r++)
                memcpy(y + (long)(r0 + r) * out + (long)nb * 16, &acc[r], sizeof acc[r]);
        }
    }
}

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
#if defined(__AVX512BF16__)
int q4_available(void) { return 1; }

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
        /* a group's 256 bytes of weights and 128 of coefficients, fetched 8 groups ahead (measured: ~15%
         * faster at 4 and 8 rows) */
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

int q4_matmul(const uint16_t *x, const uint8_t *q, const float *coef, uint16_t *y, int rows, int in, int out,
              int threads) {
    int blocks = out / 16, groups = in / 32;
    float *sums = malloc(sizeof(float) * rows * groups); /* sum of x over each group of each row */
    if (!sums) return 1;
    for (int r = 0; r < rows; r++)
        for (int g = 0; g < groups; g++) {
            float s = 0;
            for (int i = 0; i < 32; i++) s += load_bf16(x[(long)r * in + g * 32 + i]);
            sums[r * groups + g] = s;
        }
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int nb = 0; nb < blocks; nb++) {
        const uint8_t *qb = q + (long)nb * in * 8;
        const float *cb = coef + (long)nb * groups * 32;
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
    free(sums);
    return 0;
}
#else
int q4_available(void) { return 0; }

int q4_matmul(const uint16_t *x, const uint8_t *q, const float *coef, uint16_t *y, int rows, int in, int out,
              int threads) {
    return 1; /* not built: the caller uses PyTorch's 4-bit product */
}
#endif
