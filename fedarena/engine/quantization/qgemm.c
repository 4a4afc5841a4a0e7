/* int8 GEMM with int32 accumulation and fused requantization to int8, and the int8 data movement
 * around it (quantize / dequantize, im2col, max pooling) for the int8 forward pass.
 *
 *   acc[m, n] = bias[n] + sum_k x[m, k] * w[n, k]                      (int32, exact)
 *   y[m, n]   = clamp(rint(acc[m, n] * multiplier[n]) + zero_point, lo, hi)   (int8)
 *
 * x is (M, K) row-major int8 (activations, zero point already folded into bias), w is (N, K) int8
 * (one row per output channel, symmetric per-channel weights), bias int32 (N), multiplier float64
 * (N): s_x * s_w[n] / s_y.  rint is IEEE round-to-nearest-even in the default rounding mode; the
 * product is one correctly rounded float64 multiply, so the result equals numpy's
 * np.rint(acc.astype(float64) * multiplier) bit for bit.  ReLU is fused by the caller passing
 * lo = max(qmin, zero_point).  The formulation is Jacob et al., "Quantization and Training of Neural
 * Networks for Efficient Integer-Arithmetic-Only Inference" (CVPR 2018), section 2, with a float64
 * multiplier in place of their fixed-point one.
 *
 * w is packed once per layer (qgemm_pack) into blocks of 8 output channels, each holding for every
 * pair of k the 8 channels' (w[n, k], w[n, k + 1]) as int16 pairs (K padded to even, N to a multiple
 * of 8 with zeros).  Instruction path with AVX2 (this kernel has no AVX-512 or VNNI path): a 4 x 16
 * register tile (4 x 8 at the edges); per pair of k, a 256-bit load of each block's 16 int16 weights
 * is multiplied with the broadcast (x[m, k], x[m, k + 1]) int16 pair of each of 4 rows by vpmaddwd into
 * 8 int32 lanes (|x w + x' w'| <= 2 * 128 * 128: no saturation, unlike vpmaddubsw), so no horizontal
 * sums are needed; requantization runs 4 float64 lanes at a time (vroundpd with an explicit
 * round-to-nearest-even, the same result as rint in the default mode).  Without AVX2 (or with
 * QGEMM_FORCE_SCALAR defined) a plain C loop over the same packed weights computes the same integers.
 * Accumulation is exact while K * 128 * 128 + |bias| < 2^31; the Python caller checks it.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__AVX2__) && !defined(QGEMM_FORCE_SCALAR)
#include <immintrin.h>
#define QGEMM_AVX2 1
#endif

const char *qgemm_isa(void) {
#ifdef QGEMM_AVX2
    return "avx2: vpmaddwd on int16 pairs (int8 sign-extended), 4x16 int32 register tile; no AVX-512/VNNI path";
#else
    return "scalar C";
#endif
}

/* the packed size in int16 elements of an (n, k) weight matrix */
int64_t qgemm_packed_size(int64_t n, int64_t k) {
    return ((n + 7) / 8) * 8 * ((k + 1) / 2) * 2;
}

/* out[((blk * kp + j) * 8 + c) * 2 + t] = w[blk * 8 + c, 2 j + t] (zero outside), kp = ceil(k / 2) */
void qgemm_pack(const int8_t *w, int64_t n, int64_t k, int16_t *out) {
    const int64_t kp = (k + 1) / 2, nb = (n + 7) / 8;
    for (int64_t b = 0; b < nb; b++)
        for (int64_t j = 0; j < kp; j++)
            for (int c = 0; c < 8; c++)
                for (int t = 0; t < 2; t++) {
                    int64_t row = b * 8 + c, col = 2 * j + t;
                    out[((b * kp + j) * 8 + c) * 2 + t] = (row < n && col < k) ? w[row * k + col] : 0;
                }
}

static inline int8_t requantize(int32_t acc, double multiplier, double zero_point, double lo, double hi) {
    double v = rint((double)acc * multiplier) + zero_point;
    v = v < lo ? lo : (v > hi ? hi : v);
    return (int8_t)v;
}

/* one row of x as int32 words holding the int16 pairs (x[2 j], x[2 j + 1]) */
static void pair_row(const int8_t *x, int64_t k, int32_t *out) {
    const int64_t kp = (k + 1) / 2;
    for (int64_t j = 0; j < kp; j++) {
        uint16_t lo = (uint16_t)(int16_t)x[2 * j];
        uint16_t hi = (2 * j + 1 < k) ? (uint16_t)(int16_t)x[2 * j + 1] : 0;
        out[j] = (int32_t)((uint32_t)lo | ((uint32_t)hi << 16));
    }
}

/* acc[i * 8 + c] = sum_j pairs_i[j] . wblock[j, c] for rows i < rows (<= 4) of one 8-channel block */
static void tile(const int32_t *pairs, int64_t kp, int rows, const int16_t *wb, int32_t *acc) {
#ifdef QGEMM_AVX2
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    const int32_t *p0 = pairs, *p1 = pairs + kp, *p2 = pairs + 2 * kp, *p3 = pairs + 3 * kp;
    if (rows == 4) {
        for (int64_t j = 0; j < kp; j++) {
            __m256i wv = _mm256_loadu_si256((const __m256i *)(wb + j * 16));
            a0 = _mm256_add_epi32(a0, _mm256_madd_epi16(_mm256_set1_epi32(p0[j]), wv));
            a1 = _mm256_add_epi32(a1, _mm256_madd_epi16(_mm256_set1_epi32(p1[j]), wv));
            a2 = _mm256_add_epi32(a2, _mm256_madd_epi16(_mm256_set1_epi32(p2[j]), wv));
            a3 = _mm256_add_epi32(a3, _mm256_madd_epi16(_mm256_set1_epi32(p3[j]), wv));
        }
        _mm256_storeu_si256((__m256i *)(acc + 0), a0);
        _mm256_storeu_si256((__m256i *)(acc + 8), a1);
        _mm256_storeu_si256((__m256i *)(acc + 16), a2);
        _mm256_storeu_si256((__m256i *)(acc + 24), a3);
        return;
    }
    for (int i = 0; i < rows; i++) {
        const int32_t *pi = pairs + i * kp;
        __m256i a = _mm256_setzero_si256();
        for (int64_t j = 0; j < kp; j++)
            a = _mm256_add_epi32(a, _mm256_madd_epi16(_mm256_set1_epi32(pi[j]), _mm256_loadu_si256((const __m256i *)(wb + j * 16))));
        _mm256_storeu_si256((__m256i *)(acc + i * 8), a);
    }
#else
    for (int i = 0; i < rows; i++) {
        const int32_t *pi = pairs + i * kp;
        for (int c = 0; c < 8; c++) {
            int32_t a = 0;
            for (int64_t j = 0; j < kp; j++) {
                int32_t xl = (int16_t)(pi[j] & 0xFFFF), xh = (int16_t)((uint32_t)pi[j] >> 16);
                a += xl * wb[(j * 8 + c) * 2] + xh * wb[(j * 8 + c) * 2 + 1];
            }
            acc[i * 8 + c] = a;
        }
    }
#endif
}

#ifdef QGEMM_AVX2
/* the 4 x 16 tile: two adjacent 8-channel blocks (each block is kp * 16 int16 long) share every broadcast */
static void tile16(const int32_t *pairs, int64_t kp, const int16_t *wb, int32_t *acc, int32_t *acc2) {
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0, c0 = a0, c1 = a0, c2 = a0, c3 = a0;
    const int32_t *p0 = pairs, *p1 = pairs + kp, *p2 = pairs + 2 * kp, *p3 = pairs + 3 * kp;
    const int16_t *wc = wb + kp * 16;
    for (int64_t j = 0; j < kp; j++) {
        const __m256i wv = _mm256_loadu_si256((const __m256i *)(wb + j * 16));
        const __m256i wu = _mm256_loadu_si256((const __m256i *)(wc + j * 16));
        __m256i x;
        x = _mm256_set1_epi32(p0[j]);
        a0 = _mm256_add_epi32(a0, _mm256_madd_epi16(x, wv));
        c0 = _mm256_add_epi32(c0, _mm256_madd_epi16(x, wu));
        x = _mm256_set1_epi32(p1[j]);
        a1 = _mm256_add_epi32(a1, _mm256_madd_epi16(x, wv));
        c1 = _mm256_add_epi32(c1, _mm256_madd_epi16(x, wu));
        x = _mm256_set1_epi32(p2[j]);
        a2 = _mm256_add_epi32(a2, _mm256_madd_epi16(x, wv));
        c2 = _mm256_add_epi32(c2, _mm256_madd_epi16(x, wu));
        x = _mm256_set1_epi32(p3[j]);
        a3 = _mm256_add_epi32(a3, _mm256_madd_epi16(x, wv));
        c3 = _mm256_add_epi32(c3, _mm256_madd_epi16(x, wu));
    }
    _mm256_storeu_si256((__m256i *)(acc + 0), a0);
    _mm256_storeu_si256((__m256i *)(acc + 8), a1);
    _mm256_storeu_si256((__m256i *)(acc + 16), a2);
    _mm256_storeu_si256((__m256i *)(acc + 24), a3);
    _mm256_storeu_si256((__m256i *)(acc2 + 0), c0);
    _mm256_storeu_si256((__m256i *)(acc2 + 8), c1);
    _mm256_storeu_si256((__m256i *)(acc2 + 16), c2);
    _mm256_storeu_si256((__m256i *)(acc2 + 24), c3);
}
#endif

/* requantize the accumulators of rows x (8 channels of block b) and write them to y (and acc_out) */
static void store_block(const int32_t *acc, int rows, int64_t b, int64_t n, int64_t group, const int64_t *base,
                        const int32_t *bias, const double *multiplier, double zp, double dlo, double dhi,
                        int32_t *acc_out, int8_t *y) {
    const int cmax = (int)(n - b * 8 < 8 ? n - b * 8 : 8);
#ifdef QGEMM_AVX2
    if (cmax == 8) {  /* the same arithmetic as requantize(), 4 float64 lanes at a time */
        const __m256i bv = _mm256_loadu_si256((const __m256i *)(bias + b * 8));
        const __m256d m0 = _mm256_loadu_pd(multiplier + b * 8), m1 = _mm256_loadu_pd(multiplier + b * 8 + 4);
        const __m256d zv = _mm256_set1_pd(zp), lov = _mm256_set1_pd(dlo), hiv = _mm256_set1_pd(dhi);
        for (int i = 0; i < rows; i++) {
            const __m256i a = _mm256_add_epi32(_mm256_loadu_si256((const __m256i *)(acc + i * 8)), bv);
            __m256d v0 = _mm256_mul_pd(_mm256_cvtepi32_pd(_mm256_castsi256_si128(a)), m0);
            __m256d v1 = _mm256_mul_pd(_mm256_cvtepi32_pd(_mm256_extracti128_si256(a, 1)), m1);
            v0 = _mm256_add_pd(_mm256_round_pd(v0, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), zv);
            v1 = _mm256_add_pd(_mm256_round_pd(v1, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), zv);
            v0 = _mm256_min_pd(_mm256_max_pd(v0, lov), hiv);
            v1 = _mm256_min_pd(_mm256_max_pd(v1, lov), hiv);
            const __m128i q0 = _mm256_cvtpd_epi32(v0), q1 = _mm256_cvtpd_epi32(v1);
            const __m128i q16 = _mm_packs_epi32(q0, q1);
            const __m128i q8 = _mm_packs_epi16(q16, q16);
            int32_t av[8];
            int8_t qv[16];
            _mm_storeu_si128((__m128i *)qv, q8);
            if (acc_out) _mm256_storeu_si256((__m256i *)av, a);
            const int64_t at0 = base[i] + b * 8 * group;
            if (group == 1) {
                memcpy(y + at0, qv, 8);
                if (acc_out) memcpy(acc_out + at0, av, sizeof av);
            } else {
                for (int c = 0; c < 8; c++) {
                    y[at0 + c * group] = qv[c];
                    if (acc_out) acc_out[at0 + c * group] = av[c];
                }
            }
        }
        return;
    }
#endif
    for (int i = 0; i < rows; i++) {
        for (int c = 0; c < cmax; c++) {
            const int64_t ch = b * 8 + c, at = base[i] + ch * group;
            const int32_t a = acc[i * 8 + c] + bias[ch];
            if (acc_out) acc_out[at] = a;
            y[at] = requantize(a, multiplier[ch], zp, dlo, dhi);
        }
    }
}

/* y int8 = requantize(x (M, K) @ w (N, K)^T + bias), w packed by qgemm_pack.  Row r of the product
 * is written in groups of `group` rows with the channel axis in the middle:
 * y[(r / group) * N * group + n * group + r % group] (group = 1: the (M, N) matrix; group = OH * OW:
 * a convolution's NCHW output from im2col rows).  acc_out (optional) gets the int32 accumulators in
 * the same layout.  Returns 0, or -1 for a bad argument or a failed allocation. */
int qgemm_requant(const int8_t *x, const int16_t *wpacked, const int32_t *bias, const double *multiplier,
                  int64_t m, int64_t n, int64_t k, int64_t group, int32_t zero_point, int32_t lo, int32_t hi,
                  int32_t *acc_out, int8_t *y) {
    const double zp = (double)zero_point, dlo = (double)lo, dhi = (double)hi;
    const int64_t kp = (k + 1) / 2, nb = (n + 7) / 8;
    if (group < 1 || m < 0 || n < 0 || k < 0) return -1;
    int32_t *pairs = (int32_t *)malloc(sizeof(int32_t) * (size_t)(4 * kp + 1));
    if (!pairs) return -1;
    int32_t acc[32];
#ifdef QGEMM_AVX2
    int32_t acc2[32];
#endif
    int64_t base[4];
    for (int64_t r0 = 0; r0 < m; r0 += 4) {
        const int rows = (int)(m - r0 < 4 ? m - r0 : 4);
        for (int i = 0; i < rows; i++) {
            const int64_t r = r0 + i;
            pair_row(x + r * k, k, pairs + i * kp);
            base[i] = (r / group) * n * group + r % group;
        }
        int64_t b = 0;
#ifdef QGEMM_AVX2
        if (rows == 4)
            for (; b + 1 < nb; b += 2) {
                tile16(pairs, kp, wpacked + b * kp * 16, acc, acc2);
                store_block(acc, rows, b, n, group, base, bias, multiplier, zp, dlo, dhi, acc_out, y);
                store_block(acc2, rows, b + 1, n, group, base, bias, multiplier, zp, dlo, dhi, acc_out, y);
            }
#endif
        for (; b < nb; b++) {
            tile(pairs, kp, rows, wpacked + b * kp * 16, acc);
            store_block(acc, rows, b, n, group, base, bias, multiplier, zp, dlo, dhi, acc_out, y);
        }
    }
    free(pairs);
    return 0;
}

/* out = clamp(rint((double)x / scale) + zero_point, qmin, qmax): the float -> int8 quantizer */
void quantize_f32(const float *x, int64_t n, double scale, int32_t zero_point, int32_t qmin, int32_t qmax, int8_t *out) {
    const double zp = (double)zero_point, lo = (double)qmin, hi = (double)qmax;
    for (int64_t i = 0; i < n; i++) {
        double v = rint((double)x[i] / scale) + zp;
        v = v < lo ? lo : (v > hi ? hi : v);
        out[i] = (int8_t)v;
    }
}

/* out = (float)(((double)q - zero_point) * scale) */
void dequantize_i8(const int8_t *q, int64_t n, double scale, int32_t zero_point, float *out) {
    const double zp = (double)zero_point;
    for (int64_t i = 0; i < n; i++) out[i] = (float)(((double)q[i] - zp) * scale);
}

/* NCHW x (b, c, h, w) -> (b * oh * ow, c * kh * kw) patches in (c, kh, kw) order, outside = pad */
void im2col_i8(const int8_t *x, int64_t b, int64_t c, int64_t h, int64_t w, int64_t kh, int64_t kw, int64_t sh,
               int64_t sw, int64_t ph, int64_t pw, int64_t dh, int64_t dw, int8_t pad, int64_t oh, int64_t ow,
               int8_t *out) {
    const int64_t row = c * kh * kw;
    for (int64_t n = 0; n < b; n++)
        for (int64_t oy = 0; oy < oh; oy++)
            for (int64_t ox = 0; ox < ow; ox++) {
                int8_t *o = out + ((n * oh + oy) * ow + ox) * row;
                const int64_t ix0 = ox * sw - pw;
                const int inside_x = ix0 >= 0 && ix0 + (kw - 1) * dw < w;
                for (int64_t ch = 0; ch < c; ch++) {
                    const int8_t *xc = x + (n * c + ch) * h * w;
                    for (int64_t ky = 0; ky < kh; ky++, o += kw) {
                        const int64_t iy = oy * sh - ph + ky * dh;
                        if (iy < 0 || iy >= h) {
                            memset(o, pad, (size_t)kw);
                        } else if (inside_x && dw == 1) {
                            const int8_t *src = xc + iy * w + ix0;
                            for (int64_t kx = 0; kx < kw; kx++) o[kx] = src[kx];
                        } else {
                            for (int64_t kx = 0; kx < kw; kx++) {
                                const int64_t ix = ix0 + kx * dw;
                                o[kx] = (ix >= 0 && ix < w) ? xc[iy * w + ix] : pad;
                            }
                        }
                    }
                }
            }
}

/* NCHW max pooling of int8, outside = pad */
void maxpool_i8(const int8_t *x, int64_t b, int64_t c, int64_t h, int64_t w, int64_t kh, int64_t kw, int64_t sh,
                int64_t sw, int64_t ph, int64_t pw, int8_t pad, int64_t oh, int64_t ow, int8_t *out) {
    for (int64_t p = 0; p < b * c; p++) {
        const int8_t *xc = x + p * h * w;
        for (int64_t oy = 0; oy < oh; oy++) {
            const int64_t iy0 = oy * sh - ph;
            const int rows_inside = iy0 >= 0 && iy0 + kh <= h;
            for (int64_t ox = 0; ox < ow; ox++) {
                const int64_t ix0 = ox * sw - pw;
                int8_t m = -128;
                if (rows_inside && ix0 >= 0 && ix0 + kw <= w) {
                    const int8_t *r = xc + iy0 * w + ix0;
                    for (int64_t ky = 0; ky < kh; ky++, r += w)
                        for (int64_t kx = 0; kx < kw; kx++) m = r[kx] > m ? r[kx] : m;
                } else {
                    for (int64_t ky = 0; ky < kh; ky++)
                        for (int64_t kx = 0; kx < kw; kx++) {
                            const int64_t iy = iy0 + ky, ix = ix0 + kx;
                            const int8_t v = (iy >= 0 && iy < h && ix >= 0 && ix < w) ? xc[iy * w + ix] : pad;
                            m = v > m ? v : m;
                        }
                }
                out[(p * oh + oy) * ow + ox] = m;
            }
        }
    }
}
