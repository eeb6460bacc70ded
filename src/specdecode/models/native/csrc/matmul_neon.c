/* The product kernels on aarch64's dot-product extension (sdot): q4q8 and q8q8. The float products
 * of an aarch64 build are matmul_generic.c's vector C. */
#include "common.h"

#if KERNELS_NEON_DOTPROD

static inline float32x4_t load_half4(const uint16_t *p) { return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p))); }

/* 4 bytes as float32 */
static inline float32x4_t bytes4(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return vcvtq_f32_u32(vmovl_u16(vget_low_u16(vmovl_u8(vreinterpret_u8_u32(vdup_n_u32(v))))));
}

/* 16 bits (2 bytes, little-endian) as 16 bytes, 16 where the bit is set (5-bit values' high bits) */
static inline uint8x16_t high_bits(const uint8_t *p) {
    const uint8x16_t bit = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    uint8x16_t v = vcombine_u8(vdup_n_u8(p[0]), vdup_n_u8(p[1]));
    return vandq_u8(vtstq_u8(v, bit), vdupq_n_u8(16));
}

/* R rows (1-4) of one 16-output block with NEON sdot: a chunk's 32 bytes unpack to four vectors of
 * 4 outputs x 4 inputs (weights 0..15 read as signed), and vdotq_s32 adds each output's 4 products
 * to its int32 lane. */
static inline __attribute__((always_inline)) void q4q8_rows(const q8_rows_t *a, const uint8_t *qb, const void *cb,
                                                            float *y, int in, int out, int nb, int r0, const int R,
                                                            const int format) {
    const int groups = in / 32, group_bytes = Q4Q8_GROUP_BYTES(format);
    const uint8x16_t nibble = vdupq_n_u8(15);
    float32x4_t acc[4][4];
    for (int r = 0; r < R; r++)
        for (int k = 0; k < 4; k++) acc[r][k] = vdupq_n_f32(0);
    for (int g = 0; g < groups; g++) {
        const uint8_t *grp = qb + (long)g * group_bytes;
        for (int line = 0; line < group_bytes; line += 64) __builtin_prefetch(grp + 8 * group_bytes + line);
        int32x4_t S[4][4];
        for (int r = 0; r < R; r++)
            for (int k = 0; k < 4; k++) S[r][k] = vdupq_n_s32(0);
        for (int c = 0; c < 8; c++) {
            uint8x16_t v0 = vld1q_u8(grp + c * 32), v1 = vld1q_u8(grp + c * 32 + 16);
            uint8x16_t u[4] = {vandq_u8(v0, nibble), vandq_u8(v1, nibble), vshrq_n_u8(v0, 4), vshrq_n_u8(v1, 4)};
            if (FIVE_BITS(format)) /* bytes 2k, 2k + 1 of the chunk's high bits are u[k]'s 16 lanes' */
                for (int k = 0; k < 4; k++) u[k] = vorrq_u8(u[k], high_bits(grp + 256 + c * 8 + 2 * k));
            int8x16_t w[4];
            for (int k = 0; k < 4; k++) w[k] = vreinterpretq_s8_u8(u[k]);
            for (int r = 0; r < R; r++) {
                int32_t chunk;
                memcpy(&chunk, a->q + (long)(r0 + r) * in + g * 32 + c * 4, 4);
                int8x16_t xb = vreinterpretq_s8_s32(vdupq_n_s32(chunk));
                for (int k = 0; k < 4; k++) S[r][k] = vdotq_s32(S[r][k], w[k], xb);
            }
        }
        for (int k = 0; k < 4; k++) { /* outputs 4k..4k+3 */
            float32x4_t d, m;
            if (format == FORMAT_Q40) { /* m = -8 d */
                d = load_half4((const uint16_t *)cb + g * 16 + 4 * k);
                m = vmulq_n_f32(d, -8.0f);
            } else if (!K_QUANT(format)) {
                d = load_half4((const uint16_t *)cb + g * 32 + 4 * k);
                m = load_half4((const uint16_t *)cb + g * 32 + 16 + 4 * k);
            } else { /* K-quants: the super-block's d and -dmin times the group's 6-bit sc and m */
                const uint8_t *kq = (const uint8_t *)cb + (long)(g / 8) * KQ_BYTES;
                d = vmulq_f32(load_half4((const uint16_t *)kq + 4 * k), bytes4(kq + KQ_SC + (g % 8) * 16 + 4 * k));
                m = vmulq_f32(load_half4((const uint16_t *)(kq + 32) + 4 * k), bytes4(kq + KQ_M + (g % 8) * 16 + 4 * k));
            }
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

DEFINE_Q4Q8_BLOCKS(4)

/* NEON sdot: the weights' bytes (q + 128) made signed again by flipping their top bit. */
static inline __attribute__((always_inline)) void q8q8_rows(const q8_rows_t *a, const uint8_t *qb, const void *sb,
                                                            float *y, int in, int out, int nb, int r0, const int R,
                                                            const int parts) {
    const int groups = in / 32;
    const uint8x16_t flip = vdupq_n_u8(0x80);
    float32x4_t acc[4][4];
    for (int r = 0; r < R; r++)
        for (int k = 0; k < 4; k++) acc[r][k] = vdupq_n_f32(0);
    for (int g = 0; g < groups; g++) {
        const uint8_t *grp = qb + (long)g * 512;
        __builtin_prefetch(grp + 4 * 512);
        __builtin_prefetch(grp + 4 * 512 + 256);
        for (int part = 0; part < parts; part++) { /* the chunks one scale covers */
            int32x4_t S[4][4];
            for (int r = 0; r < R; r++)
                for (int k = 0; k < 4; k++) S[r][k] = vdupq_n_s32(0);
            for (int c = part * 8 / parts; c < (part + 1) * 8 / parts; c++) {
                int8x16_t w[4];
                for (int k = 0; k < 4; k++) w[k] = vreinterpretq_s8_u8(veorq_u8(vld1q_u8(grp + c * 64 + 16 * k), flip));
                for (int r = 0; r < R; r++) {
                    int32_t chunk;
                    memcpy(&chunk, a->q + (long)(r0 + r) * in + g * 32 + c * 4, 4);
                    int8x16_t xb = vreinterpretq_s8_s32(vdupq_n_s32(chunk));
                    for (int k = 0; k < 4; k++) S[r][k] = vdotq_s32(S[r][k], w[k], xb);
                }
            }
            const int j = g * parts + part; /* q8q8: float32 scales; q6q8: Q6_K's d and sc (common.h) */
            for (int k = 0; k < 4; k++) {
                float32x4_t scale;
                if (parts == 1) {
                    scale = vld1q_f32((const float *)sb + j * 16 + 4 * k);
                } else {
                    int16x8_t sc = vmovl_s8(vld1_s8(q6k_sc(sb, j) + 8 * (k / 2)));
                    scale = vmulq_f32(load_half4((const uint16_t *)q6k_block(sb, j) + 4 * k),
                                      vcvtq_f32_s32(vmovl_s16(k % 2 ? vget_high_s16(sc) : vget_low_s16(sc))));
                }
                for (int r = 0; r < R; r++) {
                    const int at = (r0 + r) * groups + g;
                    acc[r][k] = vfmaq_f32(acc[r][k], vmulq_f32(scale, vdupq_n_f32(a->d[at])), vcvtq_f32_s32(S[r][k]));
                }
            }
        }
    }
    for (int r = 0; r < R; r++)
        for (int k = 0; k < 4; k++) vst1q_f32(y + (long)(r0 + r) * out + (long)nb * 16 + 4 * k, acc[r][k]);
}
DEFINE_Q8Q8_BLOCKS(4)

#endif
