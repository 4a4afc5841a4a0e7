/* int8 GEMM with int32 accumulation and fused requantization to int8.
 *
 *   acc[m, n] = bias[n] + sum_k x[m, k] * w[n, k]                      (int32, exact)
 *   y[m, n]   = clamp(rint(acc[m, n] * multiplier[n]) + zero_point, lo, hi)   (int8)
 *
 * x is (M, K) row-major int8 (activations, zero point already folded into bias), w is (N, K)
 * row-major int8 (one row per output channel, symmetric per-channel weights), bias int32 (N),
 * multiplier float64 (N): s_x * s_w[n] / s_y.  rint is IEEE round-to-nearest-even in the default
 * rounding mode; the product is one correctly rounded float64 multiply, so the result equals numpy's
 * np.rint(acc.astype(float64) * multiplier) bit for bit.  ReLU is fused by the caller passing
 * lo = max(qmin, zero_point).  The formulation is Jacob et al., "Quantization and Training of Neural
 * Networks for Efficient Integer-Arithmetic-Only Inference" (CVPR 2018), section 2, with a float64
 * multiplier in place of their fixed-point one.
 *
 * Instruction path: with AVX2 (and no VNNI) each step sign-extends 16 int8 of x and of w to int16
 * (vpmovsxbw) and multiplies pairs into int32 lanes with vpmaddwd (|x*w + x'*w'| <= 2 * 128 * 128,
 * no saturation, unlike vpmaddubsw); four output channels share each load of x.  Without AVX2 (or
 * with QGEMM_FORCE_SCALAR defined) a plain C loop computes the same integers.
 * Accumulation is exact as long as K * 128 * 128 + |bias| < 2^31; the Python caller checks it.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__AVX2__) && !defined(QGEMM_FORCE_SCALAR)
#include <immintrin.h>
#define QGEMM_AVX2 1
#endif

const char *qgemm_isa(void) {
#ifdef QGEMM_AVX2
    return "avx2: vpmovsxbw + vpmaddwd (int8 -> int16 pairs -> int32), no VNNI";
#else
    return "scalar C";
#endif
}

#ifdef QGEMM_AVX2
static inline int32_t hsum256(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

static inline __m256i load16(const int8_t *p) {
    return _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)p));
}
#endif

/* four dot products of one row of x with rows w0..w3 (length k) */
static void dot4(const int8_t *x, const int8_t *w0, const int8_t *w1, const int8_t *w2, const int8_t *w3,
                 int64_t k, int32_t out[4]) {
    int64_t i = 0;
    int32_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
#ifdef QGEMM_AVX2
    __m256i s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();
    __m256i s2 = _mm256_setzero_si256(), s3 = _mm256_setzero_si256();
    for (; i + 16 <= k; i += 16) {
        __m256i xv = load16(x + i);
        s0 = _mm256_add_epi32(s0, _mm256_madd_epi16(xv, load16(w0 + i)));
        s1 = _mm256_add_epi32(s1, _mm256_madd_epi16(xv, load16(w1 + i)));
        s2 = _mm256_add_epi32(s2, _mm256_madd_epi16(xv, load16(w2 + i)));
        s3 = _mm256_add_epi32(s3, _mm256_madd_epi16(xv, load16(w3 + i)));
    }
    a0 = hsum256(s0);
    a1 = hsum256(s1);
    a2 = hsum256(s2);
    a3 = hsum256(s3);
#endif
    for (; i < k; i++) {
        int32_t xi = x[i];
        a0 += xi * w0[i];
        a1 += xi * w1[i];
        a2 += xi * w2[i];
        a3 += xi * w3[i];
    }
    out[0] = a0;
    out[1] = a1;
    out[2] = a2;
    out[3] = a3;
}

static int32_t dot1(const int8_t *x, const int8_t *w, int64_t k) {
    int64_t i = 0;
    int32_t a = 0;
#ifdef QGEMM_AVX2
    __m256i s = _mm256_setzero_si256();
    for (; i + 16 <= k; i += 16) s = _mm256_add_epi32(s, _mm256_madd_epi16(load16(x + i), load16(w + i)));
    a = hsum256(s);
#endif
    for (; i < k; i++) a += (int32_t)x[i] * w[i];
    return a;
}

static inline int8_t requantize(int32_t acc, double multiplier, double zero_point, double lo, double hi) {
    double v = rint((double)acc * multiplier) + zero_point;
    v = v < lo ? lo : (v > hi ? hi : v);
    return (int8_t)v;
}

/* y (M, N) int8 = requantize(x (M, K) @ w (N, K)^T + bias) */
int qgemm_requant(const int8_t *x, const int8_t *w, const int32_t *bias, const double *multiplier,
                  int64_t m, int64_t n, int64_t k, int32_t zero_point, int32_t lo, int32_t hi,
                  int32_t *acc_out, int8_t *y) {
    const double zp = (double)zero_point, dlo = (double)lo, dhi = (double)hi;
    for (int64_t r = 0; r < m; r++) {
        const int8_t *xr = x + r * k;
        int8_t *yr = y + r * n;
        int64_t c = 0;
        for (; c + 4 <= n; c += 4) {
            int32_t a[4];
            dot4(xr, w + c * k, w + (c + 1) * k, w + (c + 2) * k, w + (c + 3) * k, k, a);
            for (int j = 0; j < 4; j++) {
                int32_t acc = a[j] + bias[c + j];
                if (acc_out) acc_out[r * n + c + j] = acc;
                yr[c + j] = requantize(acc, multiplier[c + j], zp, dlo, dhi);
            }
        }
        for (; c < n; c++) {
            int32_t acc = dot1(xr, w + c * k, k) + bias[c];
            if (acc_out) acc_out[r * n + c] = acc;
            yr[c] = requantize(acc, multiplier[c], zp, dlo, dhi);
        }
    }
    return 0;
}
