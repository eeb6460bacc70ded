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
/* q4q8 for Q4_0's groups: q as q4q8's, coef [out / 16][in / 32][16] float16 (d alone: m = -8 d) */
int q40q8_matmul(const float *x, const uint8_t *q, const uint16_t *coef, float *y, int rows, int in, int out,
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

/* Q6_K W (int8 q - 32 as q8q8's layout, a scale d sc a 16 inputs) with x quantised to 8 bits: coef
 * [out / 16][in / 256][288] bytes as the file factors the scales, d [16] float16 then sc [16 groups][16
 * outputs] int8 (common.h's Q6K_BYTES); in a multiple of 256 */
int q6q8_matmul(const float *x, const uint8_t *q, const uint8_t *coef, float *y, int rows, int in, int out,
                int threads);
/* The same with Q6_K's q (0..63) packed in 6 bits: q [out / 16][in / 32][384] bytes (common.h's Q6K_GROUP_BYTES) */
int q6kq8_matmul(const float *x, const uint8_t *q, const uint8_t *coef, float *y, int rows, int in, int out,
                 int threads);
/* Whether q6kq8_matmul has vector code in this build (AVX2): else q6q8's layout is the faster */
int q6kq8_vector(void);

/* ---- a decode forward (layers.c) --------------------------------------------------------------- */

/* The products decode_layers runs, by kind: the entry points above, one X(ID, name) each. The ids are
 * the order here; product_kinds() lists the names in that order, and the ctypes side (kernels.py)
 * takes every id from it, by name. PRODUCT_STACKED: products of other kinds side by side over the
 * same input (a Q4_K q|k beside a Q6_K v), its q an int64 table [1 + 4 parts]: the count, then each
 * part's kind, q, coef and outputs, whose columns of y are its own in turn (coef unused). */
#define PRODUCT_KINDS(X) \
    X(Q4F, q4f) X(Q4Q8, q4q8) X(Q4KQ8, q4kq8) X(Q8, q8) X(Q8Q8, q8q8) X(F32, f32) X(Q6Q8, q6q8) X(STACKED, stacked) \
    X(Q5KQ8, q5kq8) X(Q5Q8, q5q8) X(Q40Q8, q40q8) X(Q6KQ8, q6kq8)
#define PRODUCT_ID(id, name) PRODUCT_##id,
enum { PRODUCT_KINDS(PRODUCT_ID) PRODUCT_KIND_COUNT };

/* A layer's weights: LAYER_SLOTS pointers in this order, NULL where the architecture has none (Qwen2's
 * q|k|v bias, Qwen3's and Gemma 3's q and k norms, Gemma 3's norms of the attention's and the MLP's
 * outputs before each residual add), then each product's q and coef (coef NULL for f32 and stacked);
 * layer_slots() lists the names in this order for the ctypes side. */
#define LAYER_SLOTS(X) \
    X(ATTN_NORM, attn_norm) X(MLP_NORM, mlp_norm) X(QKV_BIAS, qkv_bias) X(Q_NORM, q_norm) X(K_NORM, k_norm) \
    X(POST_ATTN_NORM, post_attn_norm) X(POST_MLP_NORM, post_mlp_norm) X(QKV, qkv) X(QKV_COEF, qkv_coef) X(O, o) \
    X(O_COEF, o_coef) X(GATE_UP, gate_up) X(GATE_UP_COEF, gate_up_coef) X(DOWN, down) X(DOWN_COEF, down_coef)
#define LAYER_SLOT(id, name) id,
enum { LAYER_SLOTS(LAYER_SLOT) LAYER_POINTERS };

/* "q4f,q4q8,...": PRODUCT_KINDS' names in id order; "attn_norm,...": LAYER_SLOTS' in slot order */
const char *product_kinds(void);
const char *layer_slots(void);

/* What decode_layers computes with: a model's layers (or a run of them) and its shapes. weights
 * [layers][LAYER_POINTERS]; kinds [layers][4] the PRODUCT_ of q|k|v, o, gate|up and down; windows
 * [layers] each layer's sliding window (0: none; NULL: no layer has one); gelu: the MLP's activation
 * is gelu_mul's (else silu_mul's); scale: the attention's query-key scale. The ctypes side mirrors
 * this struct (kernels.DecodeModel) and checks its size against decode_model_bytes() at load. */
typedef struct {
    const void *const *weights;
    const int32_t *kinds;
    const int32_t *windows;
    int32_t layers, dim, heads, kv_heads, head_dim, hidden, gelu;
    float eps, scale;
} decode_model_t;
int decode_model_bytes(void);

/* Every layer of a decode forward: x [rows, dim] float32 updated in place; segments [count][6] int64
 * (layers.c); cos, sin [rows, head_dim] of the rows' positions for the layers without a window,
 * cos_swa, sin_swa for those with one. Returns nonzero when out of memory (or given an unknown kind). */
int decode_layers(const decode_model_t *model, float *x, int rows, const int64_t *segments, int count,
                  const float *cos, const float *sin, const float *cos_swa, const float *sin_swa, int threads);

#endif
