/* The engine's float32 tanh, shared by every CPU path that computes one: the per-equation executor
 * (through _native.c's `tanh` kernel and its elementwise VM) and the whole-graph C code of
 * compiler/codegen_c.py (which pastes this file into each generated module), so the two stay
 * equal bit for bit.
 *
 * numpy 2.4's float32 tanh took about a quarter of the PPO step (~3 ns an element on the AMD EPYC
 * development machine with AVX2).  This one is written so that a compiler vectorises it (no calls,
 * no branches, no tables: integer selects on the bits), all in float32:
 *
 *   |x| < 0.625:  tanh(x) = x + x^3 Q(x^2),  Q of degree 5
 *   otherwise:    tanh(|x|) = 1 - 2 / (e^(2|x|) + 1),  |x| clamped to 9.5 (tanh is 1 in float32 there)
 *   e^z = 2^k e^r,  z = k ln2 + r,  |r| <= ln2 / 2,  e^r = 1 + r + r^2 R(r),  R of degree 4
 *
 * then the sign of x (tanh(-0) = -0; NaN stays NaN, +-inf gives +-1).  Q and R are near-minimax
 * (Chebyshev interpolation, coefficients rounded to float32: 0.07 ulp and 0.35 ulp from tanh and exp
 * before rounding errors); ln2 is split in two parts for the reduction, k * hi exact (W. J. Cody and
 * W. Waite, "Software Manual for the Elementary Functions", 1980, ch. 6).  Measured over every
 * float32 in [-10, 10] (2.2e9 values) against numpy's float64 tanh: at most 1.32 ulp (numpy's
 * float32 tanh: 1.37 ulp); tests/engine/test_tanhf.py checks a sample against a 1.5 ulp bound.
 * Speed (4096 elements, the shared machine under load, CPU time): 1.3 ns an element in the AVX2
 * clone against numpy's 2.8 ns; the SSE2 build is as fast as numpy's.
 *
 * Only + - * / and conversions are used, each rounded by IEEE 754, so the scalar code and any
 * vector code give the same bits provided the compiler does not contract a * b + c into a fused
 * multiply-add: both builds pass -ffp-contract=off (pyproject.toml, compiler/cbuild.py); checked
 * bit for bit over the same 2.2e9 values between -O0, -O3 (SSE2) and -O3 -mavx2 -mfma builds.
 */
#ifndef FEDARENA_TANHF_H
#define FEDARENA_TANHF_H

#include <stdint.h>
#include <string.h>

static inline float fa_tanhf(float x)
{
    /* |x| clamped to 9.5, where tanh is 1 in float32 (NaN kept): integer selects on the bits,
     * so the loop has no branch */
    uint32_t xb, ab;
    memcpy(&xb, &x, sizeof xb);
    ab = xb & UINT32_C(0x7fffffff);
    uint32_t big = (uint32_t)0 - (uint32_t)((ab > UINT32_C(0x41180000)) & (ab <= UINT32_C(0x7f800000)));
    ab = (ab & ~big) | (UINT32_C(0x41180000) & big);
    float a;
    memcpy(&a, &ab, sizeof a);

    /* |x| < 0.625: a + a^3 Q(a^2) */
    float s = a * a;
    float q = 2.339292084798217e-03f;
    q = q * s + -8.386081084609032e-03f;
    q = q * s + 2.1782144904136658e-02f;
    q = q * s + -5.396093428134918e-02f;
    q = q * s + 1.3333310186862946e-01f;
    q = q * s + -3.333333432674408e-01f;
    float t_small = a + (a * s) * q;

    /* otherwise 1 - 2 / (e^(2a) + 1), e^z = 2^k e^r with z = k ln2 + r, |r| <= ln2 / 2 */
    float z = a + a;
    float kf = z * 1.44269502f + 12582912.0f; /* 0x1.8p23: adding it rounds to an integer */
    uint32_t ki;
    memcpy(&ki, &kf, sizeof ki);
    kf = kf - 12582912.0f;
    float r = (z - kf * 6.93145752e-01f) - kf * 1.42860677e-06f; /* ln2 in two parts: k * hi exact */
    float p = 1.392954378388822e-03f;
    p = p * r + 8.359857834875584e-03f;
    p = p * r + 4.166650399565697e-02f;
    p = p * r + 1.6666598618030548e-01f;
    p = p * r + 0.5f;
    p = 1.0f + (r + (r * r) * p); /* e^r */
    uint32_t sb = (ki << 23) + UINT32_C(0x3f800000); /* 2^k, 0 <= k <= 28 */
    float sc;
    memcpy(&sc, &sb, sizeof sc);
    float e = p * sc;
    float t_big = 1.0f - 2.0f / (e + 1.0f);

    uint32_t small = (uint32_t)0 - (uint32_t)(ab < UINT32_C(0x3f200000)); /* |x| < 0.625 */
    uint32_t sbits, bbits, tb;
    memcpy(&sbits, &t_small, sizeof sbits);
    memcpy(&bbits, &t_big, sizeof bbits);
    tb = (sbits & small) | (bbits & ~small);
    tb = (tb & UINT32_C(0x7fffffff)) | (xb & UINT32_C(0x80000000)); /* the sign of x: tanh(-0) = -0 */
    float t;
    memcpy(&t, &tb, sizeof t);
    return t;
}

/* out[i] = fa_tanhf(x[i]) for i < n (out may be x).  x86-64 with GCC: an AVX2 clone as well, picked
 * at load time when the CPU has it (8 lanes instead of SSE2's 4; same bits, see above). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx2", "default")))
#endif
static void fa_tanhf_loop(const float *x, float *out, long long n)
{
    for (long long i = 0; i < n; i++) out[i] = fa_tanhf(x[i]);
}

#endif
