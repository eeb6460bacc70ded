/* The native backend's small per-token operations, each row computed alone in a fixed order.
 *
 * Why C: PyTorch dispatches each small op in ~2 us; a layer's RMSNorm is eight of them (2.3 ms of a
 * 14 ms step), its RoPE and cache writes ~16, and its fused attention is not row-invariant, so it
 * took one call per position (~70 us each). Here a row's arithmetic is the same instructions in the
 * same order whatever else shares the call, so a position computes bit-identically alone or inside
 * a verification of k tokens.
 *
 * rms_norm: x, out [rows, dim], weight [dim], in bf16 or float32; dim a multiple of LANES.
 * rope_store: RoPE of the new q and k; k and v written into the cache (one call instead of ~16 ops).
 * attend: causal attention of new positions over a KV cache, one (position, head) at a time; query
 *   t sees the first first_length + t keys. q, out: [queries, heads, head_dim] float32; k, v: one
 *   layer of the cache, [kv_heads, positions, head_dim] in bf16 or float32, kv_stride elements
 *   between kv heads; head_dim a multiple of LANES, at most MAX_HEAD_DIM.
 * The caller (kernels.py) checks the shapes.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

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

/* One (position, head): scores[j] = scale q.k_j, softmax over j < length, out = sum_j w_j v_j. */
#define DEFINE_ATTEND_ONE(NAME, T, LOAD)                                                         \
    static void NAME(const float *q, const T *k, const T *v, float *out, int length,            \
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
        for (int d = 0; d < head_dim; d++) out[d] = o[d] / total;                                \
    }

DEFINE_ATTEND_ONE(attend_one_f32, float, load_f32)
DEFINE_ATTEND_ONE(attend_one_bf16, uint16_t, load_bf16)

#define DEFINE_ATTEND(NAME, T, ONE)                                                              \
    int NAME(const float *q, const T *k, const T *v, float *out, int queries, int heads,         \
             int kv_heads, int head_dim, long kv_stride, int first_length, float scale,          \
             int threads) {                                                                      \
        int group = heads / kv_heads, failed = 0;                                                \
        _Pragma("omp parallel for num_threads(threads) schedule(static)")                        \
        for (int item = 0; item < queries * heads; item++) {                                     \
            int t = item / heads, h = item % heads, length = first_length + t;                   \
            float *scores = malloc(sizeof(float) * length);                                      \
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
#include <immintrin.h>
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
