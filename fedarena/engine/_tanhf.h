/* The engine's float32 tanh, shared by every CPU path that computes one: the per-equation executor
 * (through _native.c's `tanh` kernel and its elementwise VM) and the whole-graph C code of
 * compiler/codegen_c.py (which pastes this file into each generated module), so the two stay
 * equal bit for bit.
 *
 * numpy's float32 tanh is a scalar loop on x86-64 (~3-4 ns an element, about a quarter of the PPO
 * step); this one is written so that a compiler vectorises it (no calls, no branches, no tables)
 * and evaluates in double precision, then rounds once to float32:
 *
 *   tanh(x) = sign(x) * e / (e + 2),  e = expm1(2|x|)  (|x| clamped to 20, where tanh is 1 in float)
 *   expm1(z) = 2^k * expm1(r) + (2^k - 1),  z = k ln2 + r, |r| <= ln2 / 2
 *
 * with Cody and Waite's two-part ln2 for the reduction (W. J. Cody and W. Waite, "Software Manual
 * for the Elementary Functions", 1980, ch. 6) and expm1(r) as its Taylor polynomial to r^12
 * (truncation below 1e-14 relative on |r| <= ln2 / 2).  expm1 rather than exp keeps the relative
 * error of small results (no cancellation in e - 1), so the double result is within ~1e-14 of
 * tanh(x) relative and the float32 result is the correctly rounded one except within ~1e-14 of a
 * rounding midpoint: at most 0.5 ulp plus that (tests/engine/test_tanhf.py checks every float32 in
 * [-10, 10] against numpy's float64 tanh).  NaN gives NaN, +-inf gives +-1, -0 gives -0.
 *
 * Only + - * / and conversions are used, each rounded by IEEE 754, so a scalar and any vector
 * evaluation give the same bits provided the compiler does not contract a * b + c into a fused
 * multiply-add: both builds pass -ffp-contract=off (pyproject.toml, compiler/cbuild.py).
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
