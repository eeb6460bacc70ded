/* decode_layers: a decode forward's layers in one call. */
#include "common.h"

/* A decode forward's layers in one call, each product of the kind `kinds` gives it ([layers][4]:
 * q|k|v, o, gate|up, down; the PRODUCT_ enum of kernels.h) with a float32 residual stream: the same
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
 * segments' rows in turn, updated in place; the model's weights LAYER_POINTERS a layer (kernels.h);
 * cos, sin [rows, head_dim] of the rows' positions (cos_swa, sin_swa for the layers with a sliding
 * window, windows[l] > 0: Gemma 3's, with RoPE of their own base). */
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

static int stacked(const float *x, const int64_t *table, float *y, int rows, int in, int out, int threads);

#define LISTED_NAME(id, name) "," #name /* ",q4f,q4q8,...": each X-macro's names, past the first comma */
const char *product_kinds(void) { return PRODUCT_KINDS(LISTED_NAME) + 1; }
const char *layer_slots(void) { return LAYER_SLOTS(LISTED_NAME) + 1; }
int decode_model_bytes(void) { return (int)sizeof(decode_model_t); }

/* y = x W^T for a product of `kind` (weights q and coef in its layout); nonzero when out of memory
 * or for an unknown kind */
static int product(int kind, const float *x, const void *q, const void *coef, float *y, int rows, int in, int out,
                   int threads) {
    switch (kind) {
    case PRODUCT_STACKED: return stacked(x, q, y, rows, in, out, threads);
    case PRODUCT_Q4F: return q4f_matmul(x, q, coef, y, rows, in, out, threads);
    case PRODUCT_Q4Q8: return q4q8_matmul(x, q, coef, y, rows, in, out, threads);
    case PRODUCT_Q4KQ8: return q4kq8_matmul(x, q, coef, y, rows, in, out, threads);
    case PRODUCT_Q5KQ8: return q5kq8_matmul(x, q, coef, y, rows, in, out, threads);
    case PRODUCT_Q5Q8: return q5q8_matmul(x, q, coef, y, rows, in, out, threads);
    case PRODUCT_Q40Q8: return q40q8_matmul(x, q, coef, y, rows, in, out, threads);
    case PRODUCT_Q8: return q8_matmul(x, q, coef, y, rows, in, out, threads);
    case PRODUCT_Q8Q8: return q8q8_matmul(x, q, coef, y, rows, in, out, threads);
    case PRODUCT_Q6Q8: return q6q8_matmul(x, q, coef, y, rows, in, out, threads);
    case PRODUCT_Q6KQ8: return q6kq8_matmul(x, q, coef, y, rows, in, out, threads);
    case PRODUCT_F32: f32_matmul(x, q, y, rows, in, out, threads); return 0;
    default: return 1;
    }
}

/* PRODUCT_STACKED (kernels.h): each part into a buffer of its own, then into its columns of y */
static int stacked(const float *x, const int64_t *table, float *y, int rows, int in, int out, int threads) {
    int at = 0;
    for (int i = 0; i < table[0]; i++) {
        const int64_t *part = table + 1 + 4 * i;
        const int width = (int)part[3];
        float *py = malloc(sizeof(float) * (long)rows * width);
        if (!py || part[0] == PRODUCT_STACKED || at + width > out ||
            product((int)part[0], x, (const void *)part[1], (const void *)part[2], py, rows, in, width, threads)) {
            free(py);
            return 1;
        }
        for (int r = 0; r < rows; r++) memcpy(y + (long)r * out + at, py + (long)r * width, sizeof(float) * width);
        free(py);
        at += width;
    }
    return at != out;
}

int decode_layers(const decode_model_t *model, float *x, int rows, const int64_t *segments, int count,
                  const float *cos, const float *sin, const float *cos_swa, const float *sin_swa, int threads) {
    const void *const *weights = model->weights;
    const int32_t *kinds = model->kinds, *windows = model->windows;
    const int layers = model->layers, dim = model->dim, heads = model->heads, kv_heads = model->kv_heads,
              head_dim = model->head_dim, hidden = model->hidden, gelu = model->gelu;
    const float eps = model->eps, scale = model->scale;
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
    const int per = attend_heads_per_item(heads / kv_heads, heads, rows, threads);
    for (int s = 0, r = 0; s < count; s++) {
        const int64_t *seg = segments + (long)s * SEGMENT_FIELDS;
        int first = (int)seg[SEG_FIRST];
        attention_t a = {q + (long)r * attn_width, NULL, NULL, attn + (long)r * attn_width,
                         (const int *)(intptr_t)seg[SEG_PARENTS], (int)seg[SEG_ROWS], heads, heads / kv_heads,
                         head_dim, first + 1, 0, seg[SEG_POSITIONS] * head_dim, scale, per, 0};
        att[s] = a;
        r += (int)seg[SEG_ROWS];
        start[s + 1] = start[s] + (int)seg[SEG_ROWS] * (heads / per);
    }
    segment_attention_t batch = {att, start, count};
    int failed = 0;
    for (int l = 0; l < layers && !failed; l++) {
        const void *const *w = weights + (long)l * LAYER_POINTERS;
        const int32_t *kind = kinds + (long)l * 4;
        const int window = windows ? windows[l] : 0;
        const float *c = window ? cos_swa : cos, *sn = window ? sin_swa : sin;
        rms_norm_f32(x, w[ATTN_NORM], h, rows, dim, eps);
        failed |= product(kind[0], h, w[QKV], w[QKV_COEF], qkv, rows, dim, width, threads);
        if (w[QKV_BIAS]) /* Qwen2 */
            for (long r = 0; r < n; r++)
                for (int i = 0; i < width; i++) qkv[r * width + i] += ((const float *)w[QKV_BIAS])[i];
        if (w[Q_NORM]) /* Qwen3, Gemma 3: each head's q and k normed (rows of head_dim), in place */
            for (long r = 0; r < n; r++) {
                float *row = qkv + r * width;
                rms_norm_f32(row, w[Q_NORM], row, heads, head_dim, eps);
                rms_norm_f32(row + heads * head_dim, w[K_NORM], row + heads * head_dim, kv_heads, head_dim, eps);
            }
        for (int s = 0, r = 0; s < count; s++) {
            const int64_t *seg = segments + (long)s * SEGMENT_FIELDS;
            long kv_stride = att[s].kv_stride, layer_stride = kv_stride * kv_heads;
            float *kl = (float *)(intptr_t)seg[SEG_K] + l * layer_stride, *vl = (float *)(intptr_t)seg[SEG_V] + l * layer_stride;
            rope_store_f32(qkv + (long)r * width, c + (long)r * head_dim, sn + (long)r * head_dim, q + (long)r * attn_width,
                           kl, vl, att[s].queries, heads, kv_heads, head_dim, kv_stride, att[s].first_length - 1);
            att[s].k = kl, att[s].v = vl, att[s].window = window;
            r += att[s].queries;
        }
        parallel_for(start[count], threads, attend_segments_item, &batch);
        for (int s = 0; s < count; s++) failed |= att[s].failed;
        failed |= product(kind[1], attn, w[O], w[O_COEF], y, rows, attn_width, dim, threads);
        if (w[POST_ATTN_NORM]) rms_norm_f32(y, w[POST_ATTN_NORM], y, rows, dim, eps); /* Gemma 3: in place */
        for (long i = 0; i < n * dim; i++) x[i] += y[i];
        rms_norm_f32(x, w[MLP_NORM], h, rows, dim, eps);
        failed |= product(kind[2], h, w[GATE_UP], w[GATE_UP_COEF], gate_up, rows, dim, 2 * hidden, threads);
        (gelu ? gelu_mul_f32 : silu_mul_f32)(gate_up, act, rows, hidden);
        failed |= product(kind[3], act, w[DOWN], w[DOWN_COEF], y, rows, hidden, dim, threads);
        if (w[POST_MLP_NORM]) rms_norm_f32(y, w[POST_MLP_NORM], y, rows, dim, eps);
        for (long i = 0; i < n * dim; i++) x[i] += y[i];
    }
    free(h), free(att), free(start);
    return failed;
}
