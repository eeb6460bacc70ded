/* Runs the C kernels' operations (src/specdecode/models/native/csrc/*.c, compiled with this file and
 * -I that folder) on fixed pseudo-random data and prints every result, so that two builds of them (a
 * vector path and the portable one, or a cross-compiled one under emulation) can be compared bit for
 * bit by tests/test_neon.py. Each operation also runs its rows one at a time and in odd-sized
 * groups; "rows-alone ok NAME" (or "rows-alone FAIL NAME") says whether every row came out the
 * same: the row invariance every path promises. Output lines: "NAME ok|FAIL" and
 * "NAME <hex of the result bytes>". */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

enum { ROWS = 7, IN = 576, OUT = 96, HEADS = 9, KV_HEADS = 3, HEAD_DIM = 64, POSITIONS = 64, FIRST = 20 };

static uint32_t state = 12345;
static uint32_t next(void) { return state = state * 1664525u + 1013904223u; }
static float uniform(void) { return (float)(next() >> 8) / 8388608.0f - 1.0f; } /* [-1, 1) */
static float *floats(long n, float scale) {
    float *p = malloc(sizeof(float) * n);
    for (long i = 0; i < n; i++) p[i] = uniform() * scale;
    return p;
}
static uint8_t *bytes(long n) {
    uint8_t *p = malloc(n);
    for (long i = 0; i < n; i++) p[i] = (uint8_t)(next() >> 24);
    return p;
}
static uint16_t *halves(long n) { /* float16 in [2^-10, 2^-6): positive normal numbers */
    uint16_t *p = malloc(sizeof(uint16_t) * n);
    for (long i = 0; i < n; i++) p[i] = (uint16_t)(((5 + next() % 4) << 10) | (next() >> 22));
    return p;
}

static int failures = 0;
static void report(const char *name, const void *data, size_t size, int alone_ok) {
    printf("rows-alone %s %s\n", alone_ok ? "ok" : "FAIL", name);
    failures += !alone_ok;
    printf("%s ", name);
    for (size_t i = 0; i < size; i++) printf("%02x", ((const uint8_t *)data)[i]);
    printf("\n");
}

/* y = product over ROWS rows, then each row again alone and the rows in groups of 3 and 2 */
typedef void (*product_fn)(const float *x, float *y, int rows);
static void check_product(const char *name, product_fn fn, const float *x, int in, int out) {
    float *y = malloc(sizeof(float) * ROWS * out), *part = malloc(sizeof(float) * ROWS * out);
    fn(x, y, ROWS);
    int ok = 1;
    for (int size = 1; size <= 3; size++)
        for (int r = 0; r < ROWS; r += size) {
            int n = r + size <= ROWS ? size : ROWS - r;
            fn(x + (long)r * in, part, n);
            ok &= memcmp(part, y + (long)r * out, sizeof(float) * n * out) == 0;
        }
    report(name, y, sizeof(float) * ROWS * out, ok);
    free(y), free(part);
}

static const uint8_t *q4, *q8;
static const uint16_t *coef;
static const float *scales, *weight;
static int threads = 2;
static void run_q4q8(const float *x, float *y, int rows) { q4q8_matmul(x, q4, coef, y, rows, IN, OUT, threads); }
static void run_q8q8(const float *x, float *y, int rows) { q8q8_matmul(x, q8, scales, y, rows, IN, OUT, threads); }
static void run_q40q8(const float *x, float *y, int rows) { q40q8_matmul(x, q4, coef, y, rows, IN, OUT, threads); }
/* the K-quants' products take inputs in super-blocks of 256: IN_K of them, their coefficients' bytes
 * float16 d and -dmin, then 6-bit scales and mins (kernels.h) */
enum { IN_K = 512 };
static const uint8_t *k_coef, *q5;
static const uint8_t *q6_coef;
static void run_q6q8(const float *x, float *y, int rows) { q6q8_matmul(x, q8, q6_coef, y, rows, IN_K, OUT, threads); }
static void run_q5q8(const float *x, float *y, int rows) { q5q8_matmul(x, q5, coef, y, rows, IN_K, OUT, threads); }
static void run_q4kq8(const float *x, float *y, int rows) { q4kq8_matmul(x, q4, k_coef, y, rows, IN_K, OUT, threads); }
static void run_q5kq8(const float *x, float *y, int rows) { q5kq8_matmul(x, q5, k_coef, y, rows, IN_K, OUT, threads); }
static void run_q4f(const float *x, float *y, int rows) { q4f_matmul(x, q4, coef, y, rows, IN, OUT, threads); }
static void run_q8(const float *x, float *y, int rows) {
    q8_matmul(x, (const int8_t *)q8, scales, y, rows, IN, OUT, threads);
}
static void run_f32(const float *x, float *y, int rows) { f32_matmul(x, weight, y, rows, IN, OUT, threads); }
static const float *norm_weight;
static void run_rms(const float *x, float *y, int rows) { rms_norm_f32(x, norm_weight, y, rows, IN, 1e-5f); }
static void run_silu(const float *x, float *y, int rows) { silu_mul_f32(x, y, rows, IN / 2); }
static void run_gelu(const float *x, float *y, int rows) { gelu_mul_f32(x, y, rows, IN / 2); }

int main(int argc, char **argv) {
    if (argc > 1) threads = atoi(argv[1]);
    printf("isa %s\n", kernels_isa());
    float *x = floats((long)ROWS * IN, 3.0f);
    memset(x, 0, sizeof(float) * 32); /* an all-zero group */
    q4 = bytes((long)OUT * IN / 2);
    q8 = bytes((long)OUT * IN);
    coef = halves((long)OUT / 16 * IN / 32 * 32);
    scales = floats((long)OUT / 16 * IN / 32 * 16, 0.01f);
    uint8_t *q6 = bytes((long)OUT / 16 * IN_K / 256 * 288); /* per block d: float16 halves, then int8 sc */
    for (long b = 0; b < (long)OUT / 16 * IN_K / 256; b++) {
        uint16_t *h = halves(16);
        memcpy(q6 + b * 288, h, 32);
        free(h);
    }
    q6_coef = q6;
    q5 = bytes((long)OUT * IN_K / 8 * 5); /* 320 bytes a group of 32 inputs x 16 outputs */
    uint8_t *kq = bytes((long)OUT / 16 * IN_K / 256 * 320);
    for (long b = 0; b < (long)OUT / 16 * IN_K / 256; b++) { /* d, -dmin: float16 halves; sc, m: 6 bits */
        uint16_t *h = halves(32);
        memcpy(kq + b * 320, h, 64);
        free(h);
        for (int i = 64; i < 320; i++) kq[b * 320 + i] &= 63;
    }
    k_coef = kq;
    weight = floats((long)OUT * IN, 0.05f);
    norm_weight = floats(IN, 1.0f);
    check_product("q4q8_matmul", run_q4q8, x, IN, OUT);
    check_product("q8q8_matmul", run_q8q8, x, IN, OUT);
    check_product("q4kq8_matmul", run_q4kq8, x, IN_K, OUT);
    check_product("q5kq8_matmul", run_q5kq8, x, IN_K, OUT);
    check_product("q5q8_matmul", run_q5q8, x, IN_K, OUT); /* coef: float16 d, m a group, as q4q8's */
    check_product("q6q8_matmul", run_q6q8, x, IN_K, OUT); /* Q6_K's d and sc, as the file factors them */
    check_product("q40q8_matmul", run_q40q8, x, IN, OUT); /* coef: float16 d a group (its first half used) */
    check_product("q4f_matmul", run_q4f, x, IN, OUT);
    check_product("q8_matmul", run_q8, x, IN, OUT);
    check_product("f32_matmul", run_f32, x, IN, OUT);
    check_product("rms_norm_f32", run_rms, x, IN, IN);
    check_product("silu_mul_f32", run_silu, x, IN, IN / 2);
    check_product("gelu_mul_f32", run_gelu, x, IN, IN / 2);

    /* RoPE with the cache writes, then attention over the cache: all rows at once and one at a time */
    const int width = (HEADS + 2 * KV_HEADS) * HEAD_DIM, qwidth = HEADS * HEAD_DIM;
    const long kv_stride = (long)POSITIONS * HEAD_DIM, cache = KV_HEADS * kv_stride;
    float *qkv = floats((long)ROWS * width, 1.0f), *cs = floats((long)ROWS * HEAD_DIM, 1.0f),
          *sn = floats((long)ROWS * HEAD_DIM, 1.0f);
    float *k[2], *v[2], *q[2], *out[2];
    k[0] = floats(cache, 1.0f), v[0] = floats(cache, 1.0f); /* positions before FIRST: an earlier context */
    k[1] = malloc(sizeof(float) * cache), v[1] = malloc(sizeof(float) * cache);
    memcpy(k[1], k[0], sizeof(float) * cache), memcpy(v[1], v[0], sizeof(float) * cache);
    for (int i = 0; i < 2; i++) q[i] = malloc(sizeof(float) * ROWS * qwidth), out[i] = malloc(sizeof(float) * ROWS * qwidth);
    rope_store_f32(qkv, cs, sn, q[0], k[0], v[0], ROWS, HEADS, KV_HEADS, HEAD_DIM, kv_stride, FIRST);
    attend_f32(q[0], k[0], v[0], out[0], ROWS, HEADS, KV_HEADS, HEAD_DIM, kv_stride, FIRST + 1, NULL, 0, 0.125f, threads);
    for (int t = 0; t < ROWS; t++) {
        rope_store_f32(qkv + (long)t * width, cs + (long)t * HEAD_DIM, sn + (long)t * HEAD_DIM, q[1] + (long)t * qwidth,
                       k[1], v[1], 1, HEADS, KV_HEADS, HEAD_DIM, kv_stride, FIRST + t);
        attend_f32(q[1] + (long)t * qwidth, k[1], v[1], out[1] + (long)t * qwidth, 1, HEADS, KV_HEADS, HEAD_DIM,
                   kv_stride, FIRST + t + 1, NULL, 0, 0.125f, threads);
    }
    report("rope_store_f32", q[0], sizeof(float) * ROWS * qwidth,
           !memcmp(q[0], q[1], sizeof(float) * ROWS * qwidth) && !memcmp(k[0], k[1], sizeof(float) * cache) &&
               !memcmp(v[0], v[1], sizeof(float) * cache));
    report("attend_f32", out[0], sizeof(float) * ROWS * qwidth, !memcmp(out[0], out[1], sizeof(float) * ROWS * qwidth));
    /* the same with a sliding window of 5 keys */
    attend_f32(q[0], k[0], v[0], out[0], ROWS, HEADS, KV_HEADS, HEAD_DIM, kv_stride, FIRST + 1, NULL, 5, 0.125f, threads);
    for (int t = 0; t < ROWS; t++)
        attend_f32(q[1] + (long)t * qwidth, k[1], v[1], out[1] + (long)t * qwidth, 1, HEADS, KV_HEADS, HEAD_DIM,
                   kv_stride, FIRST + t + 1, NULL, 5, 0.125f, threads);
    report("attend_window_f32", out[0], sizeof(float) * ROWS * qwidth,
           !memcmp(out[0], out[1], sizeof(float) * ROWS * qwidth));
    return failures != 0;
}
