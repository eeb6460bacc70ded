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
 *   t sees the first first_length + t keys; or, with `parents` (a draft tree: node t's parent among
 *   the new positions, -1 for the cache's last token), the cache's first first_length - 1 keys and
 *   then its ancestors' and its own, root first: the keys it would see in a chain of them. q: [queries, heads, head_dim] float32; out (the same
 *   shape), k and v (one layer of the cache, [kv_heads, positions, head_dim], kv_stride elements
 *   between kv heads) in bf16 or float32; head_dim a multiple of 2 LANES (the bf16 dot product
 *   takes 32), at most MAX_HEAD_DIM.
 * layers_q4f: a decode forward's layers in one call (4-bit products, float32 residual stream), over
 *   the ragged rows of one or more requests, each with its own cache.
 * The caller (kernels.py) checks the shapes.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif
#if defined(__aarch64__) && defined(__ARM_FEATURE_DOTPROD)
#include <arm_neon.h>
#endif

#define LANES 16

/* The instruction set this file was built for, as kernels.py's kernel plan reports it. */
const char *kernels_isa(void) {
#if defined(__AVX512BF16__)
    return "avx512-bf16";
#elif defined(__AVX512F__)
    return "avx512";
#elif defined(__AVX2__) && defined(__FMA__)
    return "avx2-fma";
#elif defined(__aarch64__) && defined(__ARM_FEATURE_DOTPROD)
    return "neon-dotprod";
#elif defined(__aarch64__)
    return "aarch64";
#else
    return "portable";
#endif
}
#define MAX_HEAD_DIM 256

/* parallel_for(n, threads, fn, ctx): fn(ctx, i) for i in 0..n-1 on `threads` threads, split into
 * contiguous shares (OpenMP's schedule(static)), on one pool of threads - 1 workers per process,
 * started on first use and kept, whichever thread calls. Not OpenMP: libgomp keeps a team per
 * calling thread, and with a second caller (a server's decode thread beside the main thread) it
 * counts more threads than cores and stops spinning, so every call on a worker thread waited on a
 * futex (benchmarks/results/thread_placement.md); Apple's clang has no OpenMP at all. Each index's work is the same whichever thread runs it, so results do not depend on the
 * thread count. */
typedef void (*index_fn)(void *ctx, int i);

static void run_share(int part, int parts, int n, index_fn fn, void *ctx) {
    int base = n / parts, extra = n % parts, begin = part * base + (part < extra ? part : extra);
    for (int i = begin, end = begin + base + (part < extra); i < end; i++) fn(ctx, i);
}

#include <pthread.h>
#include <stdatomic.h>

/* Workers wait for a call spinning for a while (a decode step makes ~150 calls microseconds apart;
 * waking a sleeping thread costs ~20 us each), then sleep on a condition variable. */
enum { SPINS = 20000 };

static inline void relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ volatile("yield");
#endif
}

static struct {
    pthread_mutex_t call, lock; /* call: one parallel_for at a time; lock: sleeping and waking */
    pthread_cond_t wake;
    int workers, sleepers;      /* under lock */
    int parts, n;               /* this call's, written before `round` moves */
    index_fn fn;
    void *ctx;
    atomic_ulong round;         /* one per call: each worker runs each round once */
    atomic_int remaining;       /* workers still on this round */
} pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER};

typedef struct {
    int part;
    unsigned long seen;
} worker_t;

static void *pool_worker(void *arg) {
    worker_t self = *(worker_t *)arg;
    free(arg);
    for (;;) {
        unsigned long round;
        int spins = 0;
        while ((round = atomic_load(&pool.round)) == self.seen && spins < SPINS) relax(), spins++;
        if (round == self.seen) {
            pthread_mutex_lock(&pool.lock);
            pool.sleepers++;
            while ((round = atomic_load(&pool.round)) == self.seen) pthread_cond_wait(&pool.wake, &pool.lock);
            pool.sleepers--;
            pthread_mutex_unlock(&pool.lock);
        }
        self.seen = round;
        if (self.part < pool.parts) run_share(self.part, pool.parts, pool.n, pool.fn, pool.ctx);
        atomic_fetch_sub(&pool.remaining, 1);
    }
    return NULL;
}

/* the pool's worker threads started so far */
int kernels_pool_workers(void) {
    pthread_mutex_lock(&pool.lock);
    int workers = pool.workers;
    pthread_mutex_unlock(&pool.lock);
    return workers;
}

/* A forked child has none of the parent's threads: it starts its own pool. */
static void pool_after_fork(void) {
    pool.workers = pool.sleepers = 0;
    pthread_mutex_init(&pool.call, NULL);
    pthread_mutex_init(&pool.lock, NULL);
    pthread_cond_init(&pool.wake, NULL);
}
static void pool_register(void) { pthread_atfork(NULL, NULL, pool_after_fork); }

static void parallel_for(int n, int threads, index_fn fn, void *ctx) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    if (threads < 2 || n < 2) {
        run_share(0, 1, n, fn, ctx);
        return;
    }
    pthread_once(&once, pool_register);
    pthread_mutex_lock(&pool.call);
    pthread_mutex_lock(&pool.lock);
    while (pool.workers < threads - 1) { /* a worker that cannot start leaves its share to the others */
        worker_t *w = malloc(sizeof *w);
        pthread_t thread;
        if (!w) break;
        *w = (worker_t){pool.workers + 1, atomic_load(&pool.round)};
        if (pthread_create(&thread, NULL, pool_worker, w)) {
            free(w);
            break;
        }
        pthread_detach(thread);
        pool.workers++;
    }
    const int parts = pool.workers + 1 < threads ? pool.workers + 1 : threads;
    pthread_mutex_unlock(&pool.lock);
    pool.parts = parts, pool.n = n, pool.fn = fn, pool.ctx = ctx;
    atomic_store(&pool.remaining, pool.workers);
    atomic_fetch_add(&pool.round, 1); /* publishes the fields above (sequentially consistent) */
    pthread_mutex_lock(&pool.lock);   /* a worker that checked `round` before it moved is asleep or about to be */
    if (pool.sleepers) pthread_cond_broadcast(&pool.wake);
    pthread_mutex_unlock(&pool.lock);
    run_share(0, parts, n, fn, ctx);
    while (atomic_load(&pool.remaining) > 0) relax();
    pthread_mutex_unlock(&pool.call);
}

/* A product's arguments, for its per-block function (16 outputs at a time) run by parallel_for. */
typedef struct {
    const void *x, *q, *coef, *extra; /* extra: the rows' group sums, or their quantised activations */
    void *y;
    int rows, in, out, failed;
} product_t;

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

/* Key j's cache slot: j itself, or past `split` (a draft tree's node) the slot `tail` lists. */
#define SLOT(j) ((j) < split ? (j) : tail[(j) - split])

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
#elif defined(__AVX2__) && defined(__FMA__)
/* AVX2: the same design 8 keys at a time (a fixed tree of horizontal adds leaves their 8 scores in one
 * vector), and the same exp polynomial with 2^n built in the exponent bits. */
static inline __m256 load8_f32(const float *p) { return _mm256_loadu_ps(p); }
static inline __m256 load8_bf16(const uint16_t *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}

/* out[s] = the sum of a[s]'s 8 lanes */
static inline __m256 sum_lanes8(const __m256 *a) {
    __m256 t0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3])); /* a0-a3: lanes 0-3 | 4-7 */
    __m256 t1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
    return _mm256_add_ps(_mm256_permute2f128_ps(t0, t1, 0x20), _mm256_permute2f128_ps(t0, t1, 0x31));
}

static inline __m256 exp8(__m256 x) { /* x clamped to [-87, 88] */
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23); /* 2^n */
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
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
#else
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

/* The MLP's activation: gate_up [rows, 2 width] (gate | up) -> out [rows, width] = silu(gate) * up
 * in float32, rounded once to the activation dtype (one call instead of PyTorch's chunk, silu and
 * mul: ~0.5 ms of a step). With AVX-512, 16 at a time through exp16; with AVX2, 8 through exp8. */
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
#elif defined(__AVX2__) && defined(__FMA__)
#define DEFINE_SILU_MUL(NAME, T, LOAD, LOAD8, STORE)                                             \
    void NAME(const T *gate_up, T *out, int rows, int width) {                                   \
        for (int r = 0; r < rows; r++) {                                                         \
            const T *g = gate_up + (long)r * 2 * width, *u = g + width;                          \
            T *o = out + (long)r * width;                                                        \
            int d = 0;                                                                           \
            for (; d + 8 <= width; d += 8) {                                                     \
                __m256 x = LOAD8(g + d), e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), x));        \
                float y[8];                                                                      \
                _mm256_storeu_ps(y, _mm256_mul_ps(_mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), \
                                                  LOAD8(u + d)));                                \
                for (int l = 0; l < 8; l++) o[d + l] = STORE(y[l]);                              \
            }                                                                                    \
            for (; d < width; d++) o[d] = STORE(LOAD(g[d]) / (1.0f + expf(-LOAD(g[d]))) * LOAD(u[d])); \
        }                                                                                        \
    }
DEFINE_SILU_MUL(silu_mul_f32, float, load_f32, load8_f32, store_f32)
DEFINE_SILU_MUL(silu_mul_bf16, uint16_t, load_bf16, load8_bf16, store_bf16)
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

typedef struct {
    const float *q;
    const void *k, *v;
    void *out;
    const int *parents; /* NULL: the new positions are a chain; else a tree (see attend) */
    int queries, heads, group, head_dim, first_length, failed;
    long kv_stride;
    float scale;
} attention_t;

#define DEFINE_ATTEND(NAME, T, ONE)                                                              \
    static void NAME##_item(void *ctx, int item) { /* one (head, position): a head's positions   \
                                                       in turn, its keys and values still cached */ \
        attention_t *a = ctx;                                                                    \
        int h = item / a->queries, t = item % a->queries, length = a->first_length + t;          \
        float *scores = malloc(sizeof(float) * ((length + 15) & ~15) + sizeof(int) * (t + 1));  \
        if (!scores) {                                                                           \
            a->failed = 1;                                                                       \
            return;                                                                              \
        }                                                                                        \
        int split = length, *tail = (int *)(scores + ((length + 15) & ~15)), depth = 0;          \
        if (a->parents) { /* the cache, then the node's ancestors and itself, root first */      \
            for (int node = t; node >= 0; node = a->parents[node]) depth++;                      \
            split = a->first_length - 1, length = split + depth;                                 \
            for (int node = t, d = depth - 1; node >= 0; node = a->parents[node], d--)           \
                tail[d] = split + node;                                                          \
        }                                                                                        \
        long kv = (long)(h / a->group) * a->kv_stride;                                           \
        long at = ((long)t * a->heads + h) * a->head_dim;                                        \
        ONE(a->q + at, (const T *)a->k + kv, (const T *)a->v + kv, (T *)a->out + at, length,     \
            a->head_dim, a->scale, scores, split, tail);                                         \
        free(scores);                                                                            \
    }                                                                                            \
    int NAME(const float *q, const T *k, const T *v, T *out, int queries, int heads,             \
             int kv_heads, int head_dim, long kv_stride, int first_length, const int *parents,   \
             float scale, int threads) {                                                         \
        attention_t a = {q, k, v, out, parents, queries, heads, heads / kv_heads, head_dim,      \
                         first_length, 0, kv_stride, scale};                                     \
        parallel_for(queries * heads, threads, NAME##_item, &a);                                 \
        return a.failed;                                                                         \
    }

DEFINE_ATTEND(attend_f32, float, attend_one_f32)
DEFINE_ATTEND(attend_bf16, uint16_t, attend_one_bf16)

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

/* y = x W^T for a weight held as int8 in groups of 32 inputs with one scale each (w = scale q, the
 * GGUF Q8_0 block format): q [out / 16][in][16], scales [out / 16][in / 32][16]. A quarter of
 * float32's bytes, half of bf16's. x [rows, in] and y [rows, out] float32; in a multiple of 32. */
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

#if !(defined(__AVX2__) && defined(__FMA__))
static void q8_block(void *ctx, int nb) {
    const product_t *p = ctx;
    const int in = p->in, out = p->out, rows = p->rows;
    const int8_t *qb = (const int8_t *)p->q + (long)nb * in * 16;
    const float *x = p->x, *sb = (const float *)p->coef + (long)nb * (in / 32) * 16;
    float *y = p->y;
#define Q8_CALL(R) q8_rows(x, qb, sb, y, in, out, nb, r0, rows, R)
    FOR_ROW_CHUNKS(rows, Q8_CALL)
#undef Q8_CALL
}

int q8_matmul(const float *x, const int8_t *q, const float *scales, float *y, int rows, int in, int out,
              int threads) {
    product_t p = {x, q, scales, NULL, y, rows, in, out, 0};
    parallel_for(out / 16, threads, q8_block, &p);
    return 0;
}
#endif

/* y = x W^T for a float32 weight laid out w [out / 16][in][16] (x, y float32; in a multiple of 32): the products
 * of a float32 model, whose row results must not depend on the row count (a BLAS call's do). */
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

#if !(defined(__AVX2__) && defined(__FMA__))
static void f32_block(void *ctx, int nb) {
    const product_t *p = ctx;
    const int in = p->in, out = p->out, rows = p->rows;
    const float *x = p->x, *wb = (const float *)p->q + (long)nb * in * 16;
    float *y = p->y;
#define F32_CALL(R) f32_rows(x, wb, y, in, out, nb, r0, rows, R)
    FOR_ROW_CHUNKS(rows, F32_CALL)
#undef F32_CALL
}

void f32_matmul(const float *x, const float *w, float *y, int rows, int in, int out, int threads) {
    product_t p = {x, w, NULL, NULL, y, rows, in, out, 0};
    parallel_for(out / 16, threads, f32_block, &p);
}
#endif

/* y = x W^T for a weight held as 4-bit integers in groups of 32 inputs, w = d q + m, q in 0..15 (the
 * GGUF Q4_1 block format), with float32 activations: the 4-bit product of CPUs without AVX512-BF16
 * (AVX2, portable builds). Layout, 16 outputs at a time: q [out / 16][in / 32][16][16] bytes, byte
 * [i][o] of a group holding output o's input i in its low nibble and input i + 16 in its high one;
 * coef [out / 16][in / 32][2][16] float16, d and m as the GGUF file holds them (half the bytes of
 * float32 coefficients: 13 of SmolLM2's 65 MB a step). A group contributes d S + m sum_i x_i with
 * S = sum_i x_i q_i (nibbles converted to float32: measured 1.2x faster than placing them in the
 * mantissa of 1.0, whose shifts compete with the multiply-adds), the sums of x computed once a call. */
static inline float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff, bits;
    if (exponent == 0) { /* zero or subnormal: mantissa 2^-24 */
        float f = (float)mantissa * (1.0f / 16777216.0f);
        memcpy(&bits, &f, sizeof bits);
        bits |= sign;
    } else if (exponent == 31) {
        bits = sign | 0x7f800000u | mantissa << 13;
    } else {
        bits = sign | (exponent + 112) << 23 | mantissa << 13;
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static inline v16f load_half16(const uint16_t *p) {
    v16f v;
    for (int l = 0; l < 16; l++) v[l] = half_to_float(p[l]);
    return v;
}

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

/* The rows' sums of x over each group of 32 inputs, in a fixed order (float32 or bf16 x). */
#define DEFINE_GROUP_SUMS(NAME, T, LOAD)                                                         \
    static float *NAME(const T *x, int rows, int in) {                                           \
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

#if defined(__AVX2__) && defined(__FMA__)
/* AVX2 versions of the 4-bit (float32 activations), 8-bit and float32 products: the generic vectors above
 * compile to spills at this width, so these are written with intrinsics. All take a group of 32
 * inputs x 16 outputs at a time, and a row's group sum runs in four chains (outputs 0-7 and 8-15 of
 * inputs 0-15, the same of inputs 16-31), each in input order. Rows go two at a time, the weights
 * unpacked in registers once for both (measured side by side against unpacking each group once into
 * a float32 tile read by every row: as fast for 1-2 rows, 1.4x faster for 3-4, 1.2x for 8). A row's
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

static void f32_block(void *ctx, int nb) {
    const product_t *p = ctx;
    product_block(p->x, (const uint8_t *)((const float *)p->q + (long)nb * p->in * 16), NULL, NULL, p->y, p->rows,
                  p->in, p->out, nb, F32);
}

void f32_matmul(const float *x, const float *w, float *y, int rows, int in, int out, int threads) {
    product_t p = {x, w, NULL, NULL, y, rows, in, out, 0};
    parallel_for(out / 16, threads, f32_block, &p);
}

static void q8_block(void *ctx, int nb) {
    product_t *p = ctx;
    if (product_block(p->x, (const uint8_t *)p->q + (long)nb * p->in * 16,
                      (const float *)p->coef + (long)nb * (p->in / 32) * 16, NULL, p->y, p->rows, p->in, p->out, nb,
                      Q8))
        p->failed = 1;
}

int q8_matmul(const float *x, const int8_t *q, const float *scales, float *y, int rows, int in, int out,
              int threads) {
    product_t p = {x, q, scales, NULL, y, rows, in, out, 0};
    parallel_for(out / 16, threads, q8_block, &p);
    return p.failed;
}
#else
static int q4f_block(const float *x, const uint8_t *qb, const uint16_t *cb, const float *sums, float *y, int rows,
                     int in, int out, int nb) {
#define Q4F_CALL(R) q4f_rows(x, qb, cb, sums, y, in, out, nb, r0, rows, R)
    FOR_ROW_CHUNKS(rows, Q4F_CALL)
#undef Q4F_CALL
    return 0;
}
#endif

static void q4f_blocks(void *ctx, int nb) {
    product_t *p = ctx;
    if (q4f_block(p->x, (const uint8_t *)p->q + (long)nb * p->in * 8, (const uint16_t *)p->coef + (long)nb * (p->in / 32) * 32,
                  p->extra, p->y, p->rows, p->in, p->out, nb))
        p->failed = 1;
}

int q4f_matmul(const float *x, const uint8_t *q, const uint16_t *coef, float *y, int rows, int in, int out,
               int threads) {
    float *sums = group_sums_f32(x, rows, in);
    if (!sums) return 1;
    product_t p = {x, q, coef, sums, y, rows, in, out, 0};
    parallel_for(out / 16, threads, q4f_blocks, &p);
    free(sums);
    return p.failed;
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
typedef struct {
    int8_t *q;       /* [rows][in] */
    float *d, *s;    /* [rows][in / 32]: dx and sx */
    int32_t *sum;    /* [rows][in / 32]: sum of xq */
} q8_rows_t;

/* Plain scalar C in every build: the quantised activations are the same on every path. */
static int quantize_q8(const float *x, int rows, int in, q8_rows_t *a) {
    const int groups = in / 32;
    a->q = malloc((size_t)rows * in);
    a->d = malloc(sizeof(float) * 3 * rows * groups);
    if (!a->q || !a->d) {
        free(a->q), free(a->d);
        return 1;
    }
    a->s = a->d + rows * groups;
    a->sum = (int32_t *)(a->s + rows * groups);
    for (int r = 0; r < rows; r++)
        for (int g = 0; g < groups; g++) {
            const float *xg = x + (long)r * in + g * 32;
            int8_t *qg = a->q + (long)r * in + g * 32;
            float amax = 0;
            for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(xg[i]));
            const float inverse = amax > 0 ? 127.0f / amax : 0.0f;
            int sum = 0;
            for (int i = 0; i < 32; i++) {
                qg[i] = (int8_t)nearbyintf(xg[i] * inverse);
                sum += qg[i];
            }
            a->d[r * groups + g] = amax / 127.0f;
            a->s[r * groups + g] = amax / 127.0f * (float)sum;
            a->sum[r * groups + g] = sum;
        }
    return 0;
}

/* CALL(r0, R) over rows 0.. in groups of at most MAX (1, 4 or 8), R a constant in each call, so that
 * each ROWS_FN is compiled for every group size it takes. */
#define FOR_ROW_GROUPS(MAX, rows, CALL) FOR_ROW_GROUPS_(MAX, rows, CALL)
#define FOR_ROW_GROUPS_(MAX, rows, CALL)                                                         \
    for (int r0 = 0; r0 < (rows); r0 += MAX) switch ((rows) - r0 >= MAX ? MAX : (rows) - r0) {  \
        ROW_GROUP_CASES_##MAX(CALL)                                                              \
        default: CALL(r0, 1);                                                                    \
        }
#define ROW_GROUP_CASES_1(CALL)
#define ROW_GROUP_CASES_4(CALL) case 4: CALL(r0, 4); break; case 3: CALL(r0, 3); break; case 2: CALL(r0, 2); break;
#define ROW_GROUP_CASES_8(CALL)                                                                  \
    case 8: CALL(r0, 8); break; case 7: CALL(r0, 7); break; case 6: CALL(r0, 6); break;          \
    case 5: CALL(r0, 5); break; ROW_GROUP_CASES_4(CALL)

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
/* R rows (1-8) of one 16-output block with AVX512-VNNI: per chunk of 4 inputs the 32 packed bytes
 * are loaded into both halves of a vector, the high half shifted by 4, and one mask gives the 64
 * weights (16 outputs x 4 inputs); vpdpbusd adds each output's 4 products to its int32 lane, for
 * all R rows from one unpacking. */
static inline __attribute__((always_inline)) void q4q8_rows(const q8_rows_t *a, const uint8_t *qb, const uint16_t *cb,
                                                            float *y, int in, int out, int nb, int r0, const int R) {
    const int groups = in / 32;
    const __m512i nibble = _mm512_set1_epi8(15);
    const __m512i shift = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1);
    __m512 acc[8];
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    for (int g = 0; g < groups; g++) {
        const uint8_t *grp = qb + (long)g * 256;
        for (int line = 0; line < 256; line += 64) _mm_prefetch((const char *)(grp + 8 * 256 + line), _MM_HINT_T0);
        __m512i S[8];
        for (int r = 0; r < R; r++) S[r] = _mm512_setzero_si512();
        for (int c = 0; c < 8; c++) {
            __m512i v = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(grp + c * 32)));
            __m512i w = _mm512_and_si512(_mm512_srlv_epi16(v, shift), nibble);
            for (int r = 0; r < R; r++) {
                int32_t chunk;
                memcpy(&chunk, a->q + (long)(r0 + r) * in + g * 32 + c * 4, 4);
                S[r] = _mm512_dpbusd_epi32(S[r], w, _mm512_set1_epi32(chunk));
            }
        }
        __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(cb + g * 32)));
        __m512 m = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(cb + g * 32 + 16)));
        for (int r = 0; r < R; r++) {
            const int at = (r0 + r) * groups + g;
            acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_set1_ps(a->d[at])), _mm512_cvtepi32_ps(S[r]),
                                     _mm512_fmadd_ps(m, _mm512_set1_ps(a->s[at]), acc[r]));
        }
    }
    for (int r = 0; r < R; r++) _mm512_storeu_ps(y + (long)(r0 + r) * out + (long)nb * 16, acc[r]);
}

#define Q4Q8_ROWS 8
#elif defined(__AVX2__) && defined(__FMA__)
/* R rows (1-4) of one 16-output block: per chunk of 4 inputs one load and two masks unpack 32
 * weights for all R rows; vpmaddubsw (u8 weight x s8 activation, pairs summed into int16) runs
 * the 8 chunks of a group in int16 (at most 16 products of 15 x 127: 30480, no overflow), and
 * vpmaddwd sums the pairs into one int32 per output. */
static inline __attribute__((always_inline)) void q4q8_rows(const q8_rows_t *a, const uint8_t *qb, const uint16_t *cb,
                                                            float *y, int in, int out, int nb, int r0, const int R) {
    const int groups = in / 32;
    const __m256i nibble = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);
    __m256 acc[4][2];
    for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (int g = 0; g < groups; g++) {
        const uint8_t *grp = qb + (long)g * 256;
        for (int line = 0; line < 256; line += 64) _mm_prefetch((const char *)(grp + 8 * 256 + line), _MM_HINT_T0);
        __m256i s[4][2];
        for (int r = 0; r < R; r++) s[r][0] = s[r][1] = _mm256_setzero_si256();
        for (int c = 0; c < 8; c++) {
            __m256i v = _mm256_loadu_si256((const __m256i *)(grp + c * 32));
            __m256i lo = _mm256_and_si256(v, nibble), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), nibble);
            for (int r = 0; r < R; r++) {
                int32_t chunk;
                memcpy(&chunk, a->q + (long)(r0 + r) * in + g * 32 + c * 4, 4);
                __m256i xb = _mm256_set1_epi32(chunk);
                s[r][0] = _mm256_add_epi16(s[r][0], _mm256_maddubs_epi16(lo, xb));
                s[r][1] = _mm256_add_epi16(s[r][1], _mm256_maddubs_epi16(hi, xb));
            }
        }
        for (int h = 0; h < 2; h++) {
            __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(cb + g * 32 + 8 * h)));
            __m256 m = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(cb + g * 32 + 16 + 8 * h)));
            for (int r = 0; r < R; r++) {
                const int at = (r0 + r) * groups + g;
                __m256 S = _mm256_cvtepi32_ps(_mm256_madd_epi16(s[r][h], ones));
                acc[r][h] = _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_set1_ps(a->d[at])), S,
                                            _mm256_fmadd_ps(m, _mm256_set1_ps(a->s[at]), acc[r][h]));
            }
        }
    }
    for (int r = 0; r < R; r++) {
        _mm256_storeu_ps(y + (long)(r0 + r) * out + (long)nb * 16, acc[r][0]);
        _mm256_storeu_ps(y + (long)(r0 + r) * out + (long)nb * 16 + 8, acc[r][1]);
    }
}

#define Q4Q8_ROWS 4
#elif defined(__aarch64__) && defined(__ARM_FEATURE_DOTPROD)
static inline float32x4_t load_half4(const uint16_t *p) { return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p))); }

/* R rows (1-4) of one 16-output block with NEON sdot: a chunk's 32 bytes unpack to four vectors of
 * 4 outputs x 4 inputs (weights 0..15 read as signed), and vdotq_s32 adds each output's 4 products
 * to its int32 lane. */
static inline __attribute__((always_inline)) void q4q8_rows(const q8_rows_t *a, const uint8_t *qb, const uint16_t *cb,
                                                            float *y, int in, int out, int nb, int r0, const int R) {
    const int groups = in / 32;
    const uint8x16_t nibble = vdupq_n_u8(15);
    float32x4_t acc[4][4];
    for (int r = 0; r < R; r++)
        for (int k = 0; k < 4; k++) acc[r][k] = vdupq_n_f32(0);
    for (int g = 0; g < groups; g++) {
        const uint8_t *grp = qb + (long)g * 256;
        __builtin_prefetch(grp + 8 * 256);
        __builtin_prefetch(grp + 8 * 256 + 128);
        int32x4_t S[4][4];
        for (int r = 0; r < R; r++)
            for (int k = 0; k < 4; k++) S[r][k] = vdupq_n_s32(0);
        for (int c = 0; c < 8; c++) {
            uint8x16_t v0 = vld1q_u8(grp + c * 32), v1 = vld1q_u8(grp + c * 32 + 16);
            int8x16_t w[4] = {vreinterpretq_s8_u8(vandq_u8(v0, nibble)), vreinterpretq_s8_u8(vandq_u8(v1, nibble)),
                              vreinterpretq_s8_u8(vshrq_n_u8(v0, 4)), vreinterpretq_s8_u8(vshrq_n_u8(v1, 4))};
            for (int r = 0; r < R; r++) {
                int32_t chunk;
                memcpy(&chunk, a->q + (long)(r0 + r) * in + g * 32 + c * 4, 4);
                int8x16_t xb = vreinterpretq_s8_s32(vdupq_n_s32(chunk));
                for (int k = 0; k < 4; k++) S[r][k] = vdotq_s32(S[r][k], w[k], xb);
            }
        }
        for (int k = 0; k < 4; k++) { /* outputs 4k..4k+3 */
            float32x4_t d = load_half4(cb + g * 32 + 4 * k), m = load_half4(cb + g * 32 + 16 + 4 * k);
            for (int r = 0; r < R; r++) {
                const int at = (r0 + r) * groups + g;
                float32x4_t inner = vfmaq_f32(acc[r][k], m, vdupq_n_f32(a->s[at]));
                acc[r][k] = vfmaq_f32(inner, vmulq_f32(d, vdupq_n_f32(a->d[at])), vcvtq_f32_s32(S[r][k]));
            }
        }
    }
    for (int r = 0; r < R; r++)
        for (int k = 0; k < 4; k++) vst1q_f32(y + (long)(r0 + r) * out + (long)nb * 16 + 4 * k, acc[r][k]);
}

#define Q4Q8_ROWS 4
#else
static void q4q8_rows(const q8_rows_t *a, const uint8_t *qb, const uint16_t *cb, float *y, int in, int out, int nb,
                      int r0, const int R) {
    const int groups = in / 32;
    for (int r = r0; r < r0 + R; r++) {
        float acc[16] = {0};
        for (int g = 0; g < groups; g++) {
            const uint8_t *grp = qb + (long)g * 256;
            const int8_t *xg = a->q + (long)r * in + g * 32;
            int32_t S[16] = {0};
            for (int c = 0; c < 8; c++)
                for (int o = 0; o < 8; o++)
                    for (int j = 0; j < 4; j++) {
                        const int byte = grp[c * 32 + 4 * o + j], xi = xg[4 * c + j];
                        S[o] += (byte & 15) * xi;
                        S[o + 8] += (byte >> 4) * xi;
                    }
            const float dx = a->d[r * groups + g], sx = a->s[r * groups + g];
            for (int o = 0; o < 16; o++)
                acc[o] = fmaf(half_to_float(cb[g * 32 + o]) * dx, (float)S[o],
                              fmaf(half_to_float(cb[g * 32 + 16 + o]), sx, acc[o]));
        }
        memcpy(y + (long)r * out + (long)nb * 16, acc, sizeof acc);
    }
}
#define Q4Q8_ROWS 1
#endif

/* Which vector integer dot product this build's q4q8_matmul runs on: 2 vpdpbusd (AVX512-VNNI), 1
 * vpmaddubsw (AVX2), 3 sdot (NEON), 0 none (plain C: exact, slow). */
int q4q8_vector(void) {
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
    return 2;
#elif defined(__AVX2__) && defined(__FMA__)
    return 1;
#elif defined(__aarch64__) && defined(__ARM_FEATURE_DOTPROD)
    return 3;
#else
    return 0;
#endif
}

static void q4q8_blocks(void *ctx, int nb) {
    const product_t *p = ctx;
    const int in = p->in, out = p->out;
    const uint8_t *qb = (const uint8_t *)p->q + (long)nb * in * 8;
    const uint16_t *cb = (const uint16_t *)p->coef + (long)nb * (in / 32) * 32;
#define Q4Q8_CALL(r0, R) q4q8_rows(p->extra, qb, cb, p->y, in, out, nb, r0, R)
    FOR_ROW_GROUPS(Q4Q8_ROWS, p->rows, Q4Q8_CALL)
#undef Q4Q8_CALL
}

int q4q8_matmul(const float *x, const uint8_t *q, const uint16_t *coef, float *y, int rows, int in, int out,
                int threads) {
    q8_rows_t a;
    if (quantize_q8(x, rows, in, &a)) return 1;
    product_t p = {x, q, coef, &a, y, rows, in, out, 0};
    parallel_for(out / 16, threads, q4q8_blocks, &p);
    free(a.q), free(a.d);
    return 0;
}

/* y = x W^T for an 8-bit weight in groups of 32 inputs, w = scale q (Q8_0, the embedded model's LM
 * head), with the activations quantised as for q4q8_matmul: a group contributes fma(scale dx, S, acc)
 * with S = sum_i q_i xq_i in exact integer arithmetic, the same bits on every path.
 * Layout, 16 outputs at a time: q [out / 16][in / 32][8][16][4] bytes, q + 128 as uint8 (byte 4o + j
 * of chunk c: output o's input 4c + j), so vpdpbusd takes the weights as its unsigned operand:
 * sum (q + 128) xq = S + 128 sum(xq), whose second term is the row's; scales [out / 16][in / 32][16]
 * float32. */
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
static inline __attribute__((always_inline)) void q8q8_rows(const q8_rows_t *a, const uint8_t *qb, const float *sb,
                                                            float *y, int in, int out, int nb, int r0, const int R) {
    const int groups = in / 32;
    __m512 acc[8];
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    for (int g = 0; g < groups; g++) {
        const uint8_t *grp = qb + (long)g * 512;
        for (int line = 0; line < 512; line += 64) _mm_prefetch((const char *)(grp + 4 * 512 + line), _MM_HINT_T0);
        __m512i S[8];
        for (int r = 0; r < R; r++) S[r] = _mm512_setzero_si512();
        for (int c = 0; c < 8; c++) {
            __m512i w = _mm512_loadu_si512((const void *)(grp + c * 64));
            for (int r = 0; r < R; r++) {
                int32_t chunk;
                memcpy(&chunk, a->q + (long)(r0 + r) * in + g * 32 + c * 4, 4);
                S[r] = _mm512_dpbusd_epi32(S[r], w, _mm512_set1_epi32(chunk));
            }
        }
        __m512 scale = _mm512_loadu_ps(sb + g * 16);
        for (int r = 0; r < R; r++) {
            const int at = (r0 + r) * groups + g;
            __m512i exact = _mm512_sub_epi32(S[r], _mm512_set1_epi32(128 * a->sum[at]));
            acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(scale, _mm512_set1_ps(a->d[at])), _mm512_cvtepi32_ps(exact), acc[r]);
        }
    }
    for (int r = 0; r < R; r++) _mm512_storeu_ps(y + (long)(r0 + r) * out + (long)nb * 16, acc[r]);
}
#define Q8Q8_ROWS 8
#elif defined(__AVX2__) && defined(__FMA__)
/* AVX2 has no unsigned x signed product that cannot saturate here, so the weights are made signed
 * again and their signs moved onto the activations: vpmaddubsw(|w|, sign(xq, w)) pairs stay within
 * 2 x 127 x 127 and vpmaddwd sums them into int32. */
static inline __attribute__((always_inline)) void q8q8_rows(const q8_rows_t *a, const uint8_t *qb, const float *sb,
                                                            float *y, int in, int out, int nb, int r0, const int R) {
    const int groups = in / 32;
    const __m256i flip = _mm256_set1_epi8((char)0x80), ones = _mm256_set1_epi16(1);
    __m256 acc[4][2];
    for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (int g = 0; g < groups; g++) {
        const uint8_t *grp = qb + (long)g * 512;
        for (int line = 0; line < 512; line += 64) _mm_prefetch((const char *)(grp + 4 * 512 + line), _MM_HINT_T0);
        __m256i S[4][2];
        for (int r = 0; r < R; r++) S[r][0] = S[r][1] = _mm256_setzero_si256();
        for (int c = 0; c < 8; c++)
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
            __m256 scale = _mm256_loadu_ps(sb + g * 16 + 8 * h);
            for (int r = 0; r < R; r++) {
                const int at = (r0 + r) * groups + g;
                acc[r][h] = _mm256_fmadd_ps(_mm256_mul_ps(scale, _mm256_set1_ps(a->d[at])),
                                            _mm256_cvtepi32_ps(S[r][h]), acc[r][h]);
            }
        }
    }
    for (int r = 0; r < R; r++) {
        _mm256_storeu_ps(y + (long)(r0 + r) * out + (long)nb * 16, acc[r][0]);
        _mm256_storeu_ps(y + (long)(r0 + r) * out + (long)nb * 16 + 8, acc[r][1]);
    }
}
#define Q8Q8_ROWS 4
#elif defined(__aarch64__) && defined(__ARM_FEATURE_DOTPROD)
/* NEON sdot: the weights' bytes (q + 128) made signed again by flipping their top bit. */
static inline __attribute__((always_inline)) void q8q8_rows(const q8_rows_t *a, const uint8_t *qb, const float *sb,
                                                            float *y, int in, int out, int nb, int r0, const int R) {
    const int groups = in / 32;
    const uint8x16_t flip = vdupq_n_u8(0x80);
    float32x4_t acc[4][4];
    for (int r = 0; r < R; r++)
        for (int k = 0; k < 4; k++) acc[r][k] = vdupq_n_f32(0);
    for (int g = 0; g < groups; g++) {
        const uint8_t *grp = qb + (long)g * 512;
        __builtin_prefetch(grp + 4 * 512);
        __builtin_prefetch(grp + 4 * 512 + 256);
        int32x4_t S[4][4];
        for (int r = 0; r < R; r++)
            for (int k = 0; k < 4; k++) S[r][k] = vdupq_n_s32(0);
        for (int c = 0; c < 8; c++) {
            int8x16_t w[4];
            for (int k = 0; k < 4; k++) w[k] = vreinterpretq_s8_u8(veorq_u8(vld1q_u8(grp + c * 64 + 16 * k), flip));
            for (int r = 0; r < R; r++) {
                int32_t chunk;
                memcpy(&chunk, a->q + (long)(r0 + r) * in + g * 32 + c * 4, 4);
                int8x16_t xb = vreinterpretq_s8_s32(vdupq_n_s32(chunk));
                for (int k = 0; k < 4; k++) S[r][k] = vdotq_s32(S[r][k], w[k], xb);
            }
        }
        for (int k = 0; k < 4; k++) {
            float32x4_t scale = vld1q_f32(sb + g * 16 + 4 * k);
            for (int r = 0; r < R; r++) {
                const int at = (r0 + r) * groups + g;
                acc[r][k] = vfmaq_f32(acc[r][k], vmulq_f32(scale, vdupq_n_f32(a->d[at])), vcvtq_f32_s32(S[r][k]));
            }
        }
    }
    for (int r = 0; r < R; r++)
        for (int k = 0; k < 4; k++) vst1q_f32(y + (long)(r0 + r) * out + (long)nb * 16 + 4 * k, acc[r][k]);
}
#define Q8Q8_ROWS 4
#else
static void q8q8_rows(const q8_rows_t *a, const uint8_t *qb, const float *sb, float *y, int in, int out, int nb,
                      int r0, const int R) {
    const int groups = in / 32;
    for (int r = r0; r < r0 + R; r++) {
        float acc[16] = {0};
        for (int g = 0; g < groups; g++) {
            const uint8_t *grp = qb + (long)g * 512;
            const int8_t *xg = a->q + (long)r * in + g * 32;
            int32_t S[16] = {0};
            for (int c = 0; c < 8; c++)
                for (int o = 0; o < 16; o++)
                    for (int j = 0; j < 4; j++) S[o] += (grp[c * 64 + 4 * o + j] - 128) * xg[4 * c + j];
            const float dx = a->d[r * groups + g];
            for (int o = 0; o < 16; o++) acc[o] = fmaf(sb[g * 16 + o] * dx, (float)S[o], acc[o]);
        }
        memcpy(y + (long)r * out + (long)nb * 16, acc, sizeof acc);
    }
}
#define Q8Q8_ROWS 1
#endif

static void q8q8_blocks(void *ctx, int nb) {
    const product_t *p = ctx;
    const q8_rows_t *a = p->extra;
    const int in = p->in, out = p->out, rows = p->rows;
    const uint8_t *qb = (const uint8_t *)p->q + (long)nb * in * 16;
    const float *sb = (const float *)p->coef + (long)nb * (in / 32) * 16;
    float *y = p->y;
#define Q8Q8_CALL(r0, R) q8q8_rows(a, qb, sb, y, in, out, nb, r0, R)
    FOR_ROW_GROUPS(Q8Q8_ROWS, rows, Q8Q8_CALL)
#undef Q8Q8_CALL
}

int q8q8_matmul(const float *x, const uint8_t *q, const float *scales, float *y, int rows, int in, int out,
                int threads) {
    q8_rows_t a;
    if (quantize_q8(x, rows, in, &a)) return 1;
    product_t p = {x, q, scales, &a, y, rows, in, out, 0};
    parallel_for(out / 16, threads, q8q8_blocks, &p);
    free(a.q), free(a.d);
    return 0;
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
#else
int q4_available(void) { return 0; }

int q4_matmul(const uint16_t *x, const uint8_t *q, const float *coef, uint16_t *y, int rows, int in, int out,
              int threads) {
    return 1; /* not built: the caller uses PyTorch's 4-bit product */
}
#endif

/* A decode forward's layers in one call, for the 4-bit products (q4f_matmul, or q4q8_matmul where
 * int8_activations) with a float32 residual stream: the same
 * kernels in the same order as model.py's per-operation loop, so each position's result is
 * bit-identical to it; what it saves is the ~9 calls and output tensors a layer costs from Python.
 * The rows are ragged: `count` segments, each one request's rows with its own cache (a table of
 * SEGMENT_FIELDS int64 per segment, the enum below): its row count, its cache's k and v
 * ([layers][kv_heads][positions][head_dim] float32, `positions` its own capacity), the first cache
 * slot its rows are written at, and its draft tree's parents (int32, see attend; 0 for a chain).
 * The products and norms run once over every row (each row computed alone: the weights are read
 * once for all the requests); RoPE with the cache writes per segment, and the attention of each
 * segment's rows over its own cache (one parallel loop over every segment's (head, row) items, each
 * computed exactly as attend_f32 computes it). x [rows, dim] float32, the residual stream, the
 * segments' rows in turn, updated in place; weights: LAYER_POINTERS per layer (the enum below);
 * cos, sin [rows, head_dim] of the rows' positions. */
enum { ATTN_NORM, MLP_NORM, QKV, QKV_COEF, O, O_COEF, GATE_UP, GATE_UP_COEF, DOWN, DOWN_COEF, LAYER_POINTERS };
enum { SEG_ROWS, SEG_K, SEG_V, SEG_POSITIONS, SEG_FIRST, SEG_PARENTS, SEGMENT_FIELDS };

typedef struct {
    attention_t *a;   /* one per segment */
    const int *start; /* segment s's items are start[s] .. start[s + 1] - 1 */
    int count;
} segment_attention_t;

static void attend_segments_item(void *ctx, int item) {
    const segment_attention_t *b = ctx;
    int lo = 0, hi = b->count - 1; /* the segment holding `item`: the last s with start[s] <= item */
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (b->start[mid] <= item) lo = mid;
        else hi = mid - 1;
    }
    attend_f32_item(&b->a[lo], item - b->start[lo]);
}

int layers_q4f(float *x, int rows, const void *const *weights, int layers, const int64_t *segments, int count,
               const float *cos, const float *sin, int dim, int heads, int kv_heads, int head_dim, int hidden,
               float eps, float scale, int int8_activations, int threads) {
    int (*product)(const float *, const uint8_t *, const uint16_t *, float *, int, int, int, int) =
        int8_activations ? q4q8_matmul : q4f_matmul;
    const int width = (heads + 2 * kv_heads) * head_dim, attn_width = heads * head_dim;
    const long n = rows;
    float *h = malloc(sizeof(float) * n * (dim + width + 2 * attn_width + 3 * hidden + dim));
    attention_t *att = malloc(sizeof(attention_t) * (count > 0 ? count : 1));
    int *start = malloc(sizeof(int) * (count + 1));
    if (!h || !att || !start) {
        free(h), free(att), free(start);
        return 1;
    }
    float *qkv = h + n * dim, *q = qkv + n * width, *attn = q + n * attn_width, *gate_up = attn + n * attn_width,
          *act = gate_up + n * 2 * hidden, *y = act + n * hidden;
    start[0] = 0;
    for (int s = 0, r = 0; s < count; s++) {
        const int64_t *seg = segments + (long)s * SEGMENT_FIELDS;
        int first = (int)seg[SEG_FIRST];
        attention_t a = {q + (long)r * attn_width, NULL, NULL, attn + (long)r * attn_width,
                         (const int *)(intptr_t)seg[SEG_PARENTS], (int)seg[SEG_ROWS], heads, heads / kv_heads,
                         head_dim, first + 1, 0, seg[SEG_POSITIONS] * head_dim, scale};
        att[s] = a;
        r += (int)seg[SEG_ROWS];
        start[s + 1] = start[s] + (int)seg[SEG_ROWS] * heads;
    }
    segment_attention_t batch = {att, start, count};
    int failed = 0;
    for (int l = 0; l < layers && !failed; l++) {
        const void *const *w = weights + (long)l * LAYER_POINTERS;
        rms_norm_f32(x, w[ATTN_NORM], h, rows, dim, eps);
        failed |= product(h, w[QKV], w[QKV_COEF], qkv, rows, dim, width, threads);
        for (int s = 0, r = 0; s < count; s++) {
            const int64_t *seg = segments + (long)s * SEGMENT_FIELDS;
            long kv_stride = att[s].kv_stride, layer_stride = kv_stride * kv_heads;
            float *kl = (float *)(intptr_t)seg[SEG_K] + l * layer_stride, *vl = (float *)(intptr_t)seg[SEG_V] + l * layer_stride;
            rope_store_f32(qkv + (long)r * width, cos + (long)r * head_dim, sin + (long)r * head_dim, q + (long)r * attn_width,
                           kl, vl, att[s].queries, heads, kv_heads, head_dim, kv_stride, att[s].first_length - 1);
            att[s].k = kl, att[s].v = vl;
            r += att[s].queries;
        }
        parallel_for(start[count], threads, attend_segments_item, &batch);
        for (int s = 0; s < count; s++) failed |= att[s].failed;
        failed |= product(attn, w[O], w[O_COEF], y, rows, attn_width, dim, threads);
        for (long i = 0; i < n * dim; i++) x[i] += y[i];
        rms_norm_f32(x, w[MLP_NORM], h, rows, dim, eps);
        failed |= product(h, w[GATE_UP], w[GATE_UP_COEF], gate_up, rows, dim, 2 * hidden, threads);
        silu_mul_f32(gate_up, act, rows, hidden);
        failed |= product(act, w[DOWN], w[DOWN_COEF], y, rows, hidden, dim, threads);
        for (long i = 0; i < n * dim; i++) x[i] += y[i];
    }
    free(h), free(att), free(start);
    return failed;
}
