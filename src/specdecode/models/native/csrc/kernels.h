/* The native backend's C kernels: their interface, and the source of truth for it (plan.py's _bind
 * restates these prototypes for ctypes, kernels.py the constants).
 *
 * Every operation computes each row alone, in a fixed order: a position's result is bit-identical
 * alone or inside a verification of k tokens, whatever the thread count. Arrays are row-major; bf16
 * and float16 values travel as uint16_t. The caller (kernels.py) checks the shapes.
 *
 * Contents (csrc/):
 *   kernels.h          this interface
 *   common.h           what the .c files share: includes, bf16 loads and stores, parallel_for,
 *                      the vector loads and exp, product_t and the product kernels' shared macros
 *   arch-fallback.h    the instruction sets of a build, and which file defines each product kernel
 *   threads.c          the thread pool behind parallel_for; kernels_pool_workers
 *   isa.c              kernels_isa, q4_available, q4q8_vector: what a build runs
 *   norm_rope.c        rms_norm, rope_store, silu_mul, gelu_mul
 *   attend.c           attention over the KV cache (AVX-512, AVX2 and portable variants)
 *   matmul.c           the products' entry points: group sums, 8-bit activations, the block loop
 *   matmul_generic.c   the portable product kernels: the reference every path is tested against
 *   matmul_avx2.c      AVX2 + FMA product kernels (AVX-512 builds run those it has no better one of)
 *   matmul_avx512.c    AVX512-VNNI integer products; q4_matmul on AVX512-BF16
 *   matmul_neon.c      aarch64 integer products on sdot
 *   layers.c           decode_layers: a decode forward's layers in one call
 */
#ifndef SPECDECODE_KERNELS_H
#define SPECDECODE_KERNELS_H

#include <stdint.h>

/* ---- constants -------------------------------------------------------------------------------- */

#define LANES 16         /* float32 partial sums per row of rms_norm (and portable attention): dim % LANES == 0 */
#define MAX_HEAD_DIM 256 /* attention's largest head_dim */

/* ---- the build (isa.c, threads.c) ------------------------------------------------------------- */

/* what it was built for: avx512-bf16, avx512, avx2-fma, neon-dotprod, aarch64 or portable */
const char *kernels_isa(void);
/* 1 where q4_matmul is built (AVX512-BF16), else 0 */
int q4_available(void);
/* q4q8/q8q8_matmul's integer dot product: 2 vpdpbusd (AVX512-VNNI), 1 vpmaddubsw (AVX2), 3 sdot, 0 plain C */
int q4q8_vector(void);
/* the thread pool's workers started so far */
int kernels_pool_workers(void);

/* ---- per-token operations (norm_rope.c, attend.c): _f32 float, _bf16 bf16 ------------------- */

/* Llama's RMSNorm: x, out [rows, dim], weight [dim]; dim a multiple of LANES */
void rms_norm_f32(const float *x, const float *weight, float *out, int rows, int dim, float eps);
void rms_norm_bf16(const uint16_t *x, const uint16_t *weight, uint16_t *out, int rows, int dim, float eps);

/* RoPE of new q and k: qkv [rows, (heads + 2 kv_heads) head_dim], cos, sin [rows, head_dim] -> q_out
 * [rows, heads, head_dim] float32; k, v written into the cache layer at positions first.. */
void rope_store_f32(const float *qkv, const float *cos, const float *sin, float *q_out, float *k, float *v, int rows,
                    int heads, int kv_heads, int head_dim, long kv_stride, int first);
void rope_store_bf16(const uint16_t *qkv, const uint16_t *cos, const uint16_t *sin, float *q_out, uint16_t *k,
                     uint16_t *v, int rows, int heads, int kv_heads, int head_dim, long kv_stride, int first);

/* The MLP's activation: gate_up [rows, 2 width] (gate | up) -> out [rows, width] = silu(gate) * up,
 * or gelu(gate) * up (gelu's tanh approximation, Gemma's) */
void silu_mul_f32(const float *gate_up, float *out, int rows, int width);
void silu_mul_bf16(const uint16_t *gate_up, uint16_t *out, int rows, int width);
void gelu_mul_f32(const float *gate_up, float *out, int rows, int width);
void gelu_mul_bf16(const uint16_t *gate_up, uint16_t *out, int rows, int width);

/* Causal attention over a cache layer: q [queries, heads, head_dim] float32 -> out (the same shape);
 * k, v [kv_heads][positions][head_dim], kv_stride elements between kv heads; query t sees the first
 * first_length + t keys, or its draft tree's path (parents, NULL for a chain), of those only the last
 * `window` where window > 0 (a sliding window); head_dim a multiple of 2 LANES, at most
 * MAX_HEAD_DIM. Returns nonzero when out of memory. */
int attend_f32(const float *q, const float *k, const float *v, float *out, int queries, int heads, int kv_heads,
               int head_dim, long kv_stride, int first_length, const int *parents, int window, float scale,
               int threads);
int attend_bf16(const float *q, const uint16_t *k, const uint16_t *v, uint16_t *out, int queries, int heads,
                int kv_heads, int head_dim, long kv_stride, int first_length, const int *parents, int window,
                float scale, int threads);

/* ---- products y = x W^T (matmul.c and its kernels) --------------------------------------------
 * W laid out 16 outputs at a time; x [rows, in], y [rows, out]; in a multiple of 32, out of 16; each
 * call on `threads` threads. An int result is nonzero when out of memory (q4_matmul: or not built). */

/* float32 W: w [out / 16][in][16]; float32 x, y */
void f32_matmul(const float *x, const float *w, float *y, int rows, int in, int out, int threads);
/* Q8_0 W: q [out / 16][in][16] int8, scales [out / 16][in / 32][16] float32; float32 x, y */
int q8_matmul(const float *x, const int8_t *q, const float *scales, float *y, int rows, int in, int out, int threads);
/* Q4_1 W: q [out / 16][in / 32][16][16] bytes, coef [out / 16][in / 32][2][16] float16 (d, m); float32 x, y */
int q4f_matmul(const float *x, const uint8_t *q, const uint16_t *coef, float *y, int rows, int in, int out,
               int threads);
/* Q4_1 W with x quantised to 8 bits per 32 inputs: q [out / 16][in / 32][8][32] bytes, coef as q4f's */
int q4q8_matmul(const float *x, const uint8_t *q, const uint16_t *coef, float *y, int rows, int in, int out,
                int threads);
/* q4q8 for Q5_1's 5-bit values: q [out / 16][in / 32][320] bytes (q4q8's 256 of low nibbles, then the
 * high bits: common.h), coef as q4q8's */
int q5q8_matmul(const float *x, const uint8_t *q, const uint16_t *coef, float *y, int rows, int in, int out,
                int threads);
/* q4q8 for Q4_K: q as q4q8's, coef [out / 16][in / 256][KQ_BYTES] (common.h: the file's d, dmin, 6-bit
 * scales and mins); in a multiple of 256 */
int q4kq8_matmul(const float *x, const uint8_t *q, const uint8_t *coef, float *y, int rows, int in, int out,
                 int threads);
/* The same for Q5_K: q [out / 16][in / 32][320] bytes (q4q8's 256 of low nibbles, then the high bits) */
int q5kq8_matmul(const float *x, const uint8_t *q, const uint8_t *coef, float *y, int rows, int in, int out,
                 int threads);
/* Q8_0 W with x quantised to 8 bits: q [out / 16][in / 32][8][16][4] uint8 (q + 128), scales as q8's */
int q8q8_matmul(const float *x, const uint8_t *q, const float *scales, float *y, int rows, int in, int out,
                int threads);
/* Q4_1 W, bf16 x, y (AVX512-BF16): q [out / 16][in / 4][32] bytes, coef [out / 16][in / 32][2][16] float32 */
int q4_matmul(const uint16_t *x, const uint8_t *q, const float *coef, uint16_t *y, int rows, int in, int out,
              int threads);

/* Q6_K W (int8 q - 32 as q8q8's layout, a float32 scale d sc a 16 inputs) with x quantised to 8 bits:
 * scales [out / 16][in / 16][16] float32 */
int q6q8_matmul(const float *x, const uint8_t *q, const float *scales, float *y, int rows, int in, int out,
                int threads);

/* ---- a decode forward (layers.c) --------------------------------------------------------------- */

/* The products decode_layers runs, by kind: the entry points above */
/* PRODUCT_STACKED: products of other kinds side by side over the same input (a Q4_K q|k beside a Q6_K
 * v), its q an int64 table [1 + 4 parts]: the count, then each part's kind, q, coef and outputs, whose
 * columns of y are its own in turn (coef unused) */
enum { PRODUCT_Q4F, PRODUCT_Q4Q8, PRODUCT_Q4KQ8, PRODUCT_Q8, PRODUCT_Q8Q8, PRODUCT_F32, PRODUCT_Q6Q8, PRODUCT_STACKED,
       PRODUCT_Q5KQ8, PRODUCT_Q5Q8 };

/* Every layer of a decode forward: x [rows, dim] float32 updated in place; weights [layers][15]
 * pointers (norms, the q|k|v bias, the q and k norms and the post-attention and post-MLP norms or
 * NULL, then each product's q and coef: the enums in layers.c), kinds [layers][4] the PRODUCT_ of
 * q|k|v, o, gate|up and down; windows [layers] each layer's sliding window (0: none; NULL: no layer
 * has one); segments [count][6] int64 (layers.c); cos, sin [rows, head_dim] of the rows' positions
 * for the layers without a window, cos_swa, sin_swa for those with one; gelu: the MLP's activation
 * is gelu_mul's (else silu_mul's). Returns nonzero when out of memory (or given an unknown kind). */
int decode_layers(float *x, int rows, const void *const *weights, const int32_t *kinds, const int32_t *windows,
                  int layers, const int64_t *segments, int count, const float *cos, const float *sin,
                  const float *cos_swa, const float *sin_swa, int dim, int heads, int kv_heads, int head_dim,
                  int hidden, int gelu, float eps, float scale, int threads);

#endif
