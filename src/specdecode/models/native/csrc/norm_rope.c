/* The per-token operations around attention: RMSNorm, RoPE with the cache writes, the MLP's activation.
 *
 * Why C: PyTorch dispatches each small op on its own, and a layer's RMSNorm is eight of them, its
 * RoPE and cache writes ~16; here each is one call. A row's arithmetic is the same instructions in
 * the same order whatever else shares the call, so a position computes bit-identically alone or
 * inside a verification of k tokens.
 *
 * rms_norm: x, out [rows, dim], weight [dim], in bf16 or float32; dim a multiple of LANES.
 * rope_store: RoPE of the new q and k; k and v written into the cache (one call instead of ~16 ops).
 * silu_mul, gelu_mul: the MLP's silu(gate) * up, or gelu(gate) * up (tanh approximation).
 */
#include "common.h"

/* ---- RMSNorm ---------------------------------------------------------------------------------- */

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

/* ---- RoPE and the cache writes ---------------------------------------------------------------- */

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

/* ---- silu_mul and gelu_mul: AVX-512, AVX2, portable ----------------------------------------- */

/* The MLP's activation: gate_up [rows, 2 width] (gate | up) -> out [rows, width] = act(gate) * up
 * in float32, rounded once to the activation dtype (one call instead of PyTorch's chunk, act and
 * mul). Both activations are x sigmoid(z): silu's z = x; the tanh-approximated gelu's
 * 0.5 x (1 + tanh(u)) with u = sqrt(2 / pi) (x + 0.044715 x^3) is x sigmoid(2 u), so its
 * z = GELU_Z x (1 + 0.044715 x^2), GELU_Z = 2 sqrt(2 / pi). With AVX-512, 16 at a time through
 * exp16; with AVX2, 8 through exp8. */
#define GELU_Z 1.5957691216057308f

static inline float silu_z(float x) { return x; }
static inline float gelu_z(float x) { return GELU_Z * x * (1.0f + 0.044715f * x * x); }

#if KERNELS_AVX512
static inline __m512 silu_z16(__m512 x) { return x; }
static inline __m512 gelu_z16(__m512 x) {
    __m512 cubic = _mm512_fmadd_ps(_mm512_mul_ps(x, x), _mm512_set1_ps(0.044715f), _mm512_set1_ps(1.0f));
    return _mm512_mul_ps(_mm512_mul_ps(x, _mm512_set1_ps(GELU_Z)), cubic);
}
#define DEFINE_ACT_MUL(NAME, T, LOAD, LOAD16, STORE, Z, Z16)                                     \
    void NAME(const T *gate_up, T *out, int rows, int width) {                                   \
        for (int r = 0; r < rows; r++) {                                                         \
            const T *g = gate_up + (long)r * 2 * width, *u = g + width;                          \
            T *o = out + (long)r * width;                                                        \
            int d = 0;                                                                           \
            for (; d + 16 <= width; d += 16) {                                                   \
                __m512 x = LOAD16(g + d), e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), Z16(x))); \
                float y[16];                                                                     \
                _mm512_storeu_ps(y, _mm512_mul_ps(_mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), e)), \
                                                  LOAD16(u + d)));                               \
                for (int l = 0; l < 16; l++) o[d + l] = STORE(y[l]);                             \
            }                                                                                    \
            for (; d < width; d++) o[d] = STORE(LOAD(g[d]) / (1.0f + expf(-Z(LOAD(g[d])))) * LOAD(u[d])); \
        }                                                                                        \
    }
DEFINE_ACT_MUL(silu_mul_f32, float, load_f32, load16_f32, store_f32, silu_z, silu_z16)
DEFINE_ACT_MUL(silu_mul_bf16, uint16_t, load_bf16, load16_bf16, store_bf16, silu_z, silu_z16)
DEFINE_ACT_MUL(gelu_mul_f32, float, load_f32, load16_f32, store_f32, gelu_z, gelu_z16)
DEFINE_ACT_MUL(gelu_mul_bf16, uint16_t, load_bf16, load16_bf16, store_bf16, gelu_z, gelu_z16)
#elif KERNELS_AVX2
static inline __m256 silu_z8(__m256 x) { return x; }
static inline __m256 gelu_z8(__m256 x) {
    __m256 cubic = _mm256_fmadd_ps(_mm256_mul_ps(x, x), _mm256_set1_ps(0.044715f), _mm256_set1_ps(1.0f));
    return _mm256_mul_ps(_mm256_mul_ps(x, _mm256_set1_ps(GELU_Z)), cubic);
}
#define DEFINE_ACT_MUL(NAME, T, LOAD, LOAD8, STORE, Z, Z8)                                       \
    void NAME(const T *gate_up, T *out, int rows, int width) {                                   \
        for (int r = 0; r < rows; r++) {                                                         \
            const T *g = gate_up + (long)r * 2 * width, *u = g + width;                          \
            T *o = out + (long)r * width;                                                        \
            int d = 0;                                                                           \
            for (; d + 8 <= width; d += 8) {                                                     \
                __m256 x = LOAD8(g + d), e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), Z8(x)));    \
                float y[8];                                                                      \
                _mm256_storeu_ps(y, _mm256_mul_ps(_mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), \
                                                  LOAD8(u + d)));                                \
                for (int l = 0; l < 8; l++) o[d + l] = STORE(y[l]);                              \
            }                                                                                    \
            for (; d < width; d++) o[d] = STORE(LOAD(g[d]) / (1.0f + expf(-Z(LOAD(g[d])))) * LOAD(u[d])); \
        }                                                                                        \
    }
DEFINE_ACT_MUL(silu_mul_f32, float, load_f32, load8_f32, store_f32, silu_z, silu_z8)
DEFINE_ACT_MUL(silu_mul_bf16, uint16_t, load_bf16, load8_bf16, store_bf16, silu_z, silu_z8)
DEFINE_ACT_MUL(gelu_mul_f32, float, load_f32, load8_f32, store_f32, gelu_z, gelu_z8)
DEFINE_ACT_MUL(gelu_mul_bf16, uint16_t, load_bf16, load8_bf16, store_bf16, gelu_z, gelu_z8)
#else
#define DEFINE_ACT_MUL(NAME, T, LOAD, STORE, Z)                                                  \
    void NAME(const T *gate_up, T *out, int rows, int width) {                                   \
        for (int r = 0; r < rows; r++)                                                           \
            for (int d = 0; d < width; d++) {                                                    \
                float g = LOAD(gate_up[(long)r * 2 * width + d]);                                \
                out[(long)r * width + d] = STORE(g / (1.0f + expf(-Z(g))) * LOAD(gate_up[(long)r * 2 * width + width + d])); \
            }                                                                                    \
    }
DEFINE_ACT_MUL(silu_mul_f32, float, load_f32, store_f32, silu_z)
DEFINE_ACT_MUL(silu_mul_bf16, uint16_t, load_bf16, store_bf16, silu_z)
DEFINE_ACT_MUL(gelu_mul_f32, float, load_f32, store_f32, gelu_z)
DEFINE_ACT_MUL(gelu_mul_bf16, uint16_t, load_bf16, store_bf16, gelu_z)
#endif
