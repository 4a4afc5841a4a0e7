/* Native kernels of the numpy backend for the work numpy cannot do in one call.
 *
 * A single-observation forward pass of an RL policy is a chain of tiny operations (a 1x64 by
 * 64x64 product, a bias add, a tanh, a softmax over 4 actions); each costs numpy ~0.3-1 us of
 * call overhead, far more than its arithmetic.  These kernels compute a dense layer
 * x @ w + b (optionally followed by relu) or a row softmax in one call.  The operator-selection pass (native.py) picks
 * them only for small operands, where they beat a BLAS call plus ufuncs; every kernel returns
 * False without touching anything when an operand is not a C-contiguous float32/float64 buffer
 * of the expected size, and the generated code then runs the numpy kernels instead.
 *
 * Arguments are read through the buffer protocol (PEP 3118), so no numpy headers are needed.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <math.h>
#include <string.h>

#include "_parallel.h"
#include "_tanhf.h"

enum { ACT_NONE = 0, ACT_RELU = 1 };

/* Borrow a C-contiguous buffer of exactly `nbytes` bytes of element type `fmt` ('f' or 'd'). */
static int borrow(PyObject *obj, Py_buffer *view, int writable, Py_ssize_t nbytes, char fmt)
{
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) != 0) {
        PyErr_Clear();
        return 0;
    }
    const char *f = view->format ? view->format : "B";
    size_t n = strlen(f);
    int fmt_ok = n >= 1 && f[n - 1] == fmt && (n == 1 || (n == 2 && (f[0] == '@' || f[0] == '=' || f[0] == '<')));
    if (!fmt_ok || view->len != nbytes) {
        PyBuffer_Release(view);
        return 0;
    }
    return 1;
}

#define NB 16 /* output columns kept in registers while the K loop runs */

#define DEFINE_KERNELS(T, SUFFIX, EXP)                                                         \
    static void dense_##SUFFIX(const T *restrict x, const T *restrict w, const T *restrict b,  \
                               T *restrict o, Py_ssize_t M, Py_ssize_t K, Py_ssize_t N,        \
                               int act)                                                        \
    {                                                                                          \
        for (Py_ssize_t m = 0; m < M; m++) {                                                   \
            T *row = o + m * N;                                                                \
            const T *xr = x + m * K;                                                           \
            Py_ssize_t n0 = 0;                                                                 \
            for (; n0 + NB <= N; n0 += NB) {                                                   \
                T acc[NB];                                                                     \
                for (int j = 0; j < NB; j++) acc[j] = b ? b[n0 + j] : 0;                       \
                for (Py_ssize_t k = 0; k < K; k++) {                                           \
                    const T xv = xr[k];                                                        \
                    const T *wr = w + k * N + n0;                                              \
                    for (int j = 0; j < NB; j++) acc[j] += xv * wr[j];                         \
                }                                                                              \
                for (int j = 0; j < NB; j++) row[n0 + j] = acc[j];                             \
            }                                                                                  \
            if (n0 < N) { /* the last N % NB columns, same order of operations */               \
                const Py_ssize_t nb = N - n0;                                                  \
                T acc[NB];                                                                     \
                for (Py_ssize_t j = 0; j < nb; j++) acc[j] = b ? b[n0 + j] : 0;                \
                for (Py_ssize_t k = 0; k < K; k++) {                                           \
                    const T xv = xr[k];                                                        \
                    const T *wr = w + k * N + n0;                                              \
                    for (Py_ssize_t j = 0; j < nb; j++) acc[j] += xv * wr[j];                  \
                }                                                                              \
                for (Py_ssize_t j = 0; j < nb; j++) row[n0 + j] = acc[j];                      \
            }                                                                                  \
            if (act == ACT_RELU)                                                               \
                for (Py_ssize_t n = 0; n < N; n++)                                             \
                    row[n] = row[n] > 0 ? row[n] : (row[n] == row[n] ? 0 : row[n]);            \
        }                                                                                      \
    }                                                                                          \
                                                                                               \
    static void softmax_##SUFFIX(const T *x, T *o, Py_ssize_t R, Py_ssize_t C)                 \
    {                                                                                          \
        for (Py_ssize_t r = 0; r < R; r++) {                                                   \
            const T *xr = x + r * C;                                                           \
            T *orow = o + r * C;                                                               \
            T mx = xr[0];                                                                      \
            for (Py_ssize_t c = 1; c < C; c++)                                                 \
                if (xr[c] > mx || xr[c] != xr[c]) mx = xr[c];                                  \
            T s = 0;                                                                           \
            for (Py_ssize_t c = 0; c < C; c++) {                                               \
                orow[c] = EXP(xr[c] - mx);                                                     \
                s += orow[c];                                                                  \
            }                                                                                  \
            for (Py_ssize_t c = 0; c < C; c++) orow[c] /= s;                                   \
        }                                                                                      \
    }

DEFINE_KERNELS(float, f32, expf)
DEFINE_KERNELS(double, f64, exp)

static int as_sizes(PyObject *const *args, Py_ssize_t n, Py_ssize_t *out)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        out[i] = PyLong_AsSsize_t(args[i]);
        if (out[i] < 0) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "sizes must be non-negative");
            return 0;
        }
    }
    return 1;
}

/* dense(x, w, b_or_None, out, M, K, N, act, double) -> bool:  out = x @ w + b, then relu if act == 1. */
static PyObject *py_dense(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 9) {
        PyErr_SetString(PyExc_TypeError, "dense(x, w, b, out, M, K, N, act, double) takes 9 arguments");
        return NULL;
    }
    Py_ssize_t s[4];
    if (!as_sizes(args + 4, 4, s))
        return NULL;
    Py_ssize_t M = s[0], K = s[1], N = s[2], act = s[3];
    int dbl = PyObject_IsTrue(args[8]);
    if (dbl < 0)
        return NULL;
    Py_ssize_t it = dbl ? sizeof(double) : sizeof(float);
    char fmt = dbl ? 'd' : 'f';
    Py_buffer vx, vw, vb, vo;
    int has_b = args[2] != Py_None;
    if (!borrow(args[0], &vx, 0, M * K * it, fmt))
        Py_RETURN_FALSE;
    if (!borrow(args[1], &vw, 0, K * N * it, fmt)) {
        PyBuffer_Release(&vx);
        Py_RETURN_FALSE;
    }
    if (has_b && !borrow(args[2], &vb, 0, N * it, fmt)) {
        PyBuffer_Release(&vx);
        PyBuffer_Release(&vw);
        Py_RETURN_FALSE;
    }
    if (!borrow(args[3], &vo, 1, M * N * it, fmt)) {
        PyBuffer_Release(&vx);
        PyBuffer_Release(&vw);
        if (has_b)
            PyBuffer_Release(&vb);
        Py_RETURN_FALSE;
    }
    const char *lo = vo.buf, *hi = (const char *)vo.buf + vo.len;
    int overlap = ((const char *)vx.buf < hi && lo < (const char *)vx.buf + vx.len) ||
                  ((const char *)vw.buf < hi && lo < (const char *)vw.buf + vw.len) ||
                  (has_b && (const char *)vb.buf < hi && lo < (const char *)vb.buf + vb.len);
    if (overlap) { /* the kernel reads its operands while writing: never alias them */
        PyBuffer_Release(&vx);
        PyBuffer_Release(&vw);
        if (has_b)
            PyBuffer_Release(&vb);
        PyBuffer_Release(&vo);
        Py_RETURN_FALSE;
    }
    if (dbl)
        dense_f64(vx.buf, vw.buf, has_b ? vb.buf : NULL, vo.buf, M, K, N, (int)act);
    else
        dense_f32(vx.buf, vw.buf, has_b ? vb.buf : NULL, vo.buf, M, K, N, (int)act);
    PyBuffer_Release(&vx);
    PyBuffer_Release(&vw);
    if (has_b)
        PyBuffer_Release(&vb);
    PyBuffer_Release(&vo);
    Py_RETURN_TRUE;
}

/* softmax(x, out, R, C, double) -> bool:  row-wise softmax of an R x C matrix. */
static PyObject *py_softmax(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "softmax(x, out, R, C, double) takes 5 arguments");
        return NULL;
    }
    Py_ssize_t s[2];
    if (!as_sizes(args + 2, 2, s))
        return NULL;
    Py_ssize_t R = s[0], C = s[1];
    int dbl = PyObject_IsTrue(args[4]);
    if (dbl < 0)
        return NULL;
    Py_ssize_t it = dbl ? sizeof(double) : sizeof(float);
    char fmt = dbl ? 'd' : 'f';
    if (C == 0)
        Py_RETURN_FALSE;
    Py_buffer vx, vo;
    if (!borrow(args[0], &vx, 0, R * C * it, fmt))
        Py_RETURN_FALSE;
    if (!borrow(args[1], &vo, 1, R * C * it, fmt)) {
        PyBuffer_Release(&vx);
        Py_RETURN_FALSE;
    }
    if (dbl)
        softmax_f64(vx.buf, vo.buf, R, C);
    else
        softmax_f32(vx.buf, vo.buf, R, C);
    PyBuffer_Release(&vx);
    PyBuffer_Release(&vo);
    Py_RETURN_TRUE;
}


/* ------------------------------------------------------------------------------------------
 * Elementwise virtual machine: runs a fused elementwise program (fusion.py) in one call.
 *
 * The program is a list of instructions over registers: the inputs, the constants, then
 * temporaries.  The output is computed in blocks of VM_BLOCK elements so every temporary stays
 * in L1 (the interpreter design of numexpr; Cooke & Hochberg, 2009).  An input is read in full
 * (same shape as the output), as a scalar, or broadcast: output element p reads input element
 * (p / S) * Cin + p % Cin, which covers a row repeated over leading axes (S = n), a column
 * repeated along trailing axes (Cin = 1) and a row repeated over middle axes.  Booleans are 0/1.
 * A program may have several results of the same shape (multi-output fusion: the first and second
 * moments and the new weights of an Adam update), each written to its own output buffer in the
 * same pass, so every input is read once and every output written once.
 * ------------------------------------------------------------------------------------------ */
#define VM_BLOCK 256
#define VM_MAX_REGS 64
#define VM_MAX_INPUTS 32
#define VM_MAX_OUTPUTS 8

enum {
    OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_NEG, OP_EXP, OP_LOG, OP_LOG1P, OP_TANH, OP_LOGISTIC,
    OP_SQRT, OP_RSQRT, OP_ABS, OP_SIGN, OP_MAX, OP_MIN, OP_POW, OP_SQUARE, OP_EQ, OP_NE, OP_LT,
    OP_LE, OP_GT, OP_GE, OP_AND, OP_OR, OP_NOT, OP_SELECT, OP_CLIP, OP_RELU, OP_SIN, OP_COS,
    OP_COPY, OP_NONZERO, N_OPS
};
enum { MODE_FULL = 0, MODE_SCALAR = 1, MODE_BCAST = 2 };

/* x86-64: an AVX2 clone of the VM's loops, picked at load time when the CPU has it */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define VM_TARGETS __attribute__((target_clones("avx2", "default")))
#else
#define VM_TARGETS
#endif

#define VM_LOOP(EXPR) for (Py_ssize_t i = 0; i < len; i++) { d[i] = (EXPR); } break;

#define DEFINE_VM(T, SUFFIX, EXP, LOG, LOG1P, TANH, SQRT, FABS, POW, SIN, COS)                     \
    VM_TARGETS static void vm_step_##SUFFIX(int op, T *d, const T *a, const T *b, const T *c,         \
                                 Py_ssize_t len)                                                    \
    {                                                                                               \
        switch (op) {                                                                               \
        case OP_ADD: VM_LOOP(a[i] + b[i])                                                           \
        case OP_SUB: VM_LOOP(a[i] - b[i])                                                           \
        case OP_MUL: VM_LOOP(a[i] * b[i])                                                           \
        case OP_DIV: VM_LOOP(a[i] / b[i])                                                           \
        case OP_NEG: VM_LOOP(-a[i])                                                                 \
        case OP_EXP: VM_LOOP(EXP(a[i]))                                                             \
        case OP_LOG: VM_LOOP(LOG(a[i]))                                                             \
        case OP_LOG1P: VM_LOOP(LOG1P(a[i]))                                                         \
        case OP_TANH: VM_LOOP(TANH(a[i]))                                                           \
        case OP_LOGISTIC: VM_LOOP(a[i] >= 0 ? 1 / (1 + EXP(-a[i])) : EXP(a[i]) / (1 + EXP(a[i])))   \
        case OP_SQRT: VM_LOOP(SQRT(a[i]))                                                           \
        case OP_RSQRT: VM_LOOP(1 / SQRT(a[i]))                                                      \
        case OP_ABS: VM_LOOP(FABS(a[i]))                                                            \
        case OP_SIGN: VM_LOOP(a[i] != a[i] ? a[i] : a[i] > 0 ? (T)1 : a[i] < 0 ? (T)-1 : a[i])      \
        case OP_MAX: VM_LOOP(a[i] != a[i] ? a[i] : b[i] != b[i] ? b[i] : a[i] >= b[i] ? a[i] : b[i]) \
        case OP_MIN: VM_LOOP(a[i] != a[i] ? a[i] : b[i] != b[i] ? b[i] : a[i] <= b[i] ? a[i] : b[i]) \
        case OP_POW: VM_LOOP(POW(a[i], b[i]))                                                       \
        case OP_SQUARE: VM_LOOP(a[i] * a[i])                                                        \
        case OP_EQ: VM_LOOP(a[i] == b[i])                                                           \
        case OP_NE: VM_LOOP(a[i] != b[i])                                                           \
        case OP_LT: VM_LOOP(a[i] < b[i])                                                            \
        case OP_LE: VM_LOOP(a[i] <= b[i])                                                           \
        case OP_GT: VM_LOOP(a[i] > b[i])                                                            \
        case OP_GE: VM_LOOP(a[i] >= b[i])                                                           \
        case OP_AND: VM_LOOP(a[i] != 0 && b[i] != 0)                                                \
        case OP_OR: VM_LOOP(a[i] != 0 || b[i] != 0)                                                 \
        case OP_NOT: VM_LOOP(a[i] == 0)                                                             \
        case OP_SELECT: VM_LOOP(a[i] != 0 ? b[i] : c[i])                                            \
        case OP_CLIP: VM_LOOP(a[i] != a[i] ? a[i] : a[i] < b[i] ? b[i] : a[i] > c[i] ? c[i] : a[i]) \
        case OP_RELU: VM_LOOP(a[i] > 0 ? a[i] : (a[i] == a[i] ? 0 : a[i]))                          \
        case OP_SIN: VM_LOOP(SIN(a[i]))                                                             \
        case OP_COS: VM_LOOP(COS(a[i]))                                                             \
        case OP_COPY: VM_LOOP(a[i])                                                                 \
        case OP_NONZERO: VM_LOOP(a[i] != 0)                                                         \
        default: break;                                                                             \
        }                                                                                           \
    }

DEFINE_VM(float, f32, expf, logf, log1pf, fa_tanhf, sqrtf, fabsf, powf, sinf, cosf)
DEFINE_VM(double, f64, exp, log, log1p, tanh, sqrt, fabs, pow, sin, cos)

/* elementwise(program, consts, modes, bparams, n, double, out, *inputs) -> bool
 *   out:     the output buffer, or a tuple of 1 .. VM_MAX_OUTPUTS output buffers (a multi-output
 *            fused node: every result computed in the same pass over the blocks)
 *   program: int32 [n_regs_temp_start, one result register per output, then (op, dst, a, b, c)
 *            per instruction]
 *   consts:  float64 constants, registers n_inputs .. n_inputs + len(consts) - 1
 *   modes:   one byte per input (MODE_*); bparams: int64 (S, Cin) per input for MODE_BCAST
 * Every result register must be written by an instruction; the last instruction writing it writes
 * that block of its output buffer directly (later instructions read it there).  An output may be
 * the buffer of an input when no instruction reads that input after the output's last write (one
 * output whose result the last instruction computes). */

#define DEFINE_VM_RUN(T, SUFFIX)                                                                   \
    static void vm_run_##SUFFIX(const int *prog, Py_ssize_t nres, Py_ssize_t ninstr,               \
                                const double *consts, Py_ssize_t nc, const unsigned char *modes,   \
                                const long long *bparams, Py_ssize_t ni, Py_buffer *views,         \
                                Py_ssize_t begin, Py_ssize_t n, Py_ssize_t temp0, Py_ssize_t nregs, \
                                int defer)                                                         \
    {                                                                                              \
        /* registers on this call's stack (at most 64 x 256 elements): no shared state */          \
        T regs[nregs][VM_BLOCK];                                                                   \
        const T *ptr[VM_MAX_REGS];                                                                 \
        T *out[VM_MAX_OUTPUTS];                                                                    \
        Py_ssize_t last[VM_MAX_OUTPUTS]; /* the instruction writing result k's block */           \
        const int *result = prog + 1, *code = prog + 1 + nres;                                     \
        Py_buffer *inputs = views + nres;                                                          \
        for (Py_ssize_t k = 0; k < nres; k++) {                                                    \
            out[k] = (T *)views[k].buf;                                                            \
            last[k] = -1;                                                                          \
            for (Py_ssize_t q = 0; q < ninstr; q++)                                                \
                if (code[5 * q + 1] == result[k])                                                  \
                    last[k] = q;                                                                   \
        }                                                                                          \
        for (Py_ssize_t k = 0; k < nc; k++) {                                                      \
            for (int i = 0; i < VM_BLOCK; i++) regs[ni + k][i] = (T)consts[k];                     \
            ptr[ni + k] = regs[ni + k];                                                            \
        }                                                                                          \
        for (Py_ssize_t k = 0; k < ni; k++)                                                        \
            if (modes[k] == MODE_SCALAR) {                                                         \
                const T v = *(const T *)inputs[k].buf;                                             \
                for (int i = 0; i < VM_BLOCK; i++) regs[k][i] = v;                                 \
                ptr[k] = regs[k];                                                                  \
            }                                                                                      \
        for (Py_ssize_t r = temp0; r < nregs; r++) ptr[r] = regs[r];                               \
        for (Py_ssize_t s0 = begin; s0 < n; s0 += VM_BLOCK) {                                      \
            const Py_ssize_t len = n - s0 < VM_BLOCK ? n - s0 : VM_BLOCK;                          \
            for (Py_ssize_t k = 0; k < ni; k++) {                                                  \
                const T *base = (const T *)inputs[k].buf;                                          \
                switch (modes[k]) {                                                                \
                case MODE_FULL: ptr[k] = base + s0; break;                                         \
                case MODE_BCAST: { /* element p of the output reads base[(p / S) * Cin + p % Cin] */ \
                    const Py_ssize_t S = bparams[2 * k], Cin = bparams[2 * k + 1];                 \
                    Py_ssize_t q = s0 / S, r = s0 % S, c = r % Cin, i = 0; /* divisions once */    \
                    T *dst = regs[k];                                                              \
                    while (i < len) {                                                              \
                        Py_ssize_t run = S - r < len - i ? S - r : len - i;                        \
                        if (Cin == 1) { /* one value repeated to the end of the outer block */     \
                            const T v = base[q];                                                   \
                            for (Py_ssize_t j = 0; j < run; j++) dst[i + j] = v;                   \
                        } else { /* a stretch of the inner row, up to its end */                   \
                            if (run > Cin - c) run = Cin - c;                                      \
                            const T *src = base + q * Cin + c;                                     \
                            for (Py_ssize_t j = 0; j < run; j++) dst[i + j] = src[j];              \
                            c += run;                                                              \
                            if (c == Cin) c = 0;                                                   \
                        }                                                                          \
                        i += run;                                                                  \
                        r += run;                                                                  \
                        if (r == S) {                                                              \
                            r = 0;                                                                 \
                            q++;                                                                   \
                        }                                                                          \
                    }                                                                              \
                    ptr[k] = regs[k];                                                              \
                    break;                                                                         \
                }                                                                                  \
                default: break;                                                                    \
                }                                                                                  \
            }                                                                                      \
            for (Py_ssize_t q = 0; q < ninstr; q++) {                                              \
                const int *ins = code + 5 * q;                                                     \
                T *d = regs[ins[1]];                                                               \
                for (Py_ssize_t k = 0; k < nres && !defer; k++)                                    \
                    if (q == last[k]) {                                                            \
                        d = out[k] + s0;                                                           \
                        break;                                                                     \
                    }                                                                              \
                vm_step_##SUFFIX(ins[0], d, ptr[ins[2]], ptr[ins[3]], ptr[ins[4]], len);           \
                ptr[ins[1]] = d;                                                                   \
            }                                                                                      \
            for (Py_ssize_t k = 0; k < nres; k++) { /* the next block's reads start from scratch */ \
                if (defer) /* outputs over inputs: written once every read of the block is done */  \
                    memcpy(out[k] + s0, ptr[result[k]], len * sizeof(T));                          \
                ptr[result[k]] = regs[result[k]];                                                  \
            }                                                                                      \
        }                                                                                          \
    }

DEFINE_VM_RUN(float, f32)
DEFINE_VM_RUN(double, f64)

/* A program over n elements split into chunks of whole blocks claimed by the pool's threads
 * (every element is computed by the same instructions whichever thread runs it, so the result
 * does not depend on the thread count).  Below VM_PAR_MIN elements one thread is faster. */
#define VM_PAR_MIN 65536
#define VM_PAR_CHUNK 32 /* blocks */

typedef struct {
    const int *prog;
    Py_ssize_t nres, ninstr;
    const double *consts;
    Py_ssize_t nc;
    const unsigned char *modes;
    const long long *bparams;
    Py_ssize_t ni;
    Py_buffer *views;
    Py_ssize_t n, temp0, nregs;
    int dbl, defer;
} vm_job;

static int vm_overlap(const Py_buffer *a, const Py_buffer *b)
{
    const char *alo = (const char *)a->buf, *blo = (const char *)b->buf;
    return a->len > 0 && b->len > 0 && alo < blo + b->len && blo < alo + a->len;
}

static void vm_part(void *p, int part, int nparts)
{
    const vm_job *j = (const vm_job *)p;
    const Py_ssize_t blocks = (j->n + VM_BLOCK - 1) / VM_BLOCK;
    const Py_ssize_t begin = blocks * part / nparts * VM_BLOCK;
    Py_ssize_t end = blocks * (part + 1) / nparts * VM_BLOCK;
    if (end > j->n)
        end = j->n;
    if (j->dbl)
        vm_run_f64(j->prog, j->nres, j->ninstr, j->consts, j->nc, j->modes, j->bparams, j->ni, j->views, begin, end,
                   j->temp0, j->nregs, j->defer);
    else
        vm_run_f32(j->prog, j->nres, j->ninstr, j->consts, j->nc, j->modes, j->bparams, j->ni, j->views, begin, end,
                   j->temp0, j->nregs, j->defer);
}

static PyObject *py_elementwise(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 7 || nargs - 7 > VM_MAX_INPUTS) {
        PyErr_SetString(PyExc_TypeError, "elementwise(program, consts, modes, bparams, n, double, out, *inputs)");
        return NULL;
    }
    Py_ssize_t ni = nargs - 7;
    Py_ssize_t n = PyLong_AsSsize_t(args[4]);
    if (n < 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "elementwise: n must be non-negative");
        return NULL;
    }
    int dbl = PyObject_IsTrue(args[5]);
    if (dbl < 0)
        return NULL;
    for (int j = 0; j < 4; j++)
        if (!PyBytes_Check(args[j])) {
            PyErr_SetString(PyExc_TypeError, "elementwise: program, consts, modes and bparams must be bytes");
            return NULL;
        }
    Py_ssize_t nres = 1;
    if (PyTuple_Check(args[6])) {
        nres = PyTuple_GET_SIZE(args[6]);
        if (nres < 1 || nres > VM_MAX_OUTPUTS) {
            PyErr_SetString(PyExc_ValueError, "elementwise: out must be a buffer or a tuple of 1 to 8 buffers");
            return NULL;
        }
    }
    const int *prog = (const int *)PyBytes_AS_STRING(args[0]);
    Py_ssize_t plen = PyBytes_GET_SIZE(args[0]) / (Py_ssize_t)sizeof(int);
    const double *consts = (const double *)PyBytes_AS_STRING(args[1]);
    Py_ssize_t nc = PyBytes_GET_SIZE(args[1]) / (Py_ssize_t)sizeof(double);
    const unsigned char *modes = (const unsigned char *)PyBytes_AS_STRING(args[2]);
    const long long *bparams = (const long long *)PyBytes_AS_STRING(args[3]);
    if (PyBytes_GET_SIZE(args[2]) != ni || PyBytes_GET_SIZE(args[3]) != 2 * ni * (Py_ssize_t)sizeof(long long) ||
        plen < 1 + nres || (plen - 1 - nres) % 5 != 0 || PyBytes_GET_SIZE(args[0]) % (Py_ssize_t)sizeof(int) != 0) {
        PyErr_SetString(PyExc_ValueError, "elementwise: malformed program");
        return NULL;
    }
    for (Py_ssize_t k = 0; k < ni; k++) {
        long long S = bparams[2 * k], Cin = bparams[2 * k + 1];
        if (modes[k] > MODE_BCAST || (modes[k] == MODE_BCAST && (S <= 0 || Cin <= 0 || S % Cin != 0 || n % S != 0))) {
            PyErr_SetString(PyExc_ValueError, "elementwise: malformed input mode");
            return NULL;
        }
    }
    Py_ssize_t temp0 = prog[0], ninstr = (plen - 1 - nres) / 5;
    Py_ssize_t nregs = 0; /* registers in use: every index read or written, plus one */
    int bad = temp0 != ni + nc;
    for (Py_ssize_t k = 0; k < nres && !bad; k++) {
        const int r = prog[1 + k];
        bad = r < temp0 || r >= VM_MAX_REGS;
        for (Py_ssize_t j = 0; j < k && !bad; j++)
            bad = prog[1 + j] == r; /* two outputs of one register */
        if (r + 1 > nregs)
            nregs = r + 1;
    }
    if (bad) {
        PyErr_SetString(PyExc_ValueError, "elementwise: malformed register layout");
        return NULL;
    }
    int written = 0; /* bit k: an instruction writes result k */
    for (Py_ssize_t k = 0; k < ninstr; k++) {
        const int *ins = prog + 1 + nres + 5 * k;
        if (ins[0] < 0 || ins[0] >= N_OPS || ins[1] < temp0 || ins[1] >= VM_MAX_REGS)
            goto malformed;
        for (int j = 1; j < 5; j++) {
            if (ins[j] < 0 || ins[j] >= VM_MAX_REGS)
                goto malformed;
            if (ins[j] + 1 > nregs)
                nregs = ins[j] + 1;
        }
        for (Py_ssize_t r = 0; r < nres; r++)
            if (ins[1] == prog[1 + r])
                written |= 1 << r;
    }
    if (written != (1 << nres) - 1) {
        PyErr_SetString(PyExc_ValueError, "elementwise: a result register no instruction writes");
        return NULL;
    }
    Py_ssize_t it = dbl ? sizeof(double) : sizeof(float);
    char fmt = dbl ? 'd' : 'f';
    Py_buffer views[VM_MAX_OUTPUTS + VM_MAX_INPUTS]; /* the outputs, then the inputs */
    Py_ssize_t got = 0;
    for (Py_ssize_t k = 0; k < nres + ni; k++) {
        PyObject *obj = k < nres ? (PyTuple_Check(args[6]) ? PyTuple_GET_ITEM(args[6], k) : args[6]) : args[7 + k - nres];
        const Py_ssize_t j = k - nres;
        Py_ssize_t want = k < nres || modes[j] == MODE_FULL ? n : modes[j] == MODE_SCALAR ? 1 : (n / bparams[2 * j]) * bparams[2 * j + 1];
        if (!borrow(obj, &views[k], k < nres, want * it, fmt)) {
            for (Py_ssize_t q = 0; q < got; q++)
                PyBuffer_Release(&views[q]);
            Py_RETURN_FALSE;
        }
        got++;
    }
    /* Several outputs, one of them over an input (a donated argument, jit's donate_argnums): each
     * block's results are written after every instruction has read the block.  An output over an
     * input read in any other way (broadcast, scalar, shifted), or over another output, cannot be
     * computed in place: the caller's numpy path takes it. */
    int defer = 0;
    for (Py_ssize_t k = 0; k < nres; k++)
        for (Py_ssize_t q = 0; q < nres + ni; q++) {
            if (q == k || !vm_overlap(&views[k], &views[q]))
                continue;
            if (q < nres || modes[q - nres] != MODE_FULL || views[q].buf != views[k].buf) {
                for (Py_ssize_t r = 0; r < got; r++)
                    PyBuffer_Release(&views[r]);
                Py_RETURN_FALSE;
            }
            defer |= nres > 1;
        }
    vm_job job = {prog, nres, ninstr, consts, nc, modes, bparams, ni, views, n, temp0, nregs, dbl, defer};
    /* chunks of at least VM_PAR_CHUNK blocks, a few per thread so a late thread costs little */
    const int threads = n >= VM_PAR_MIN ? par_threads() : 1;
    Py_ssize_t nparts = (n + VM_BLOCK * VM_PAR_CHUNK - 1) / (VM_BLOCK * VM_PAR_CHUNK);
    if (nparts > 4 * threads)
        nparts = 4 * threads;
    if (threads > 1 && nparts > 1) {
        Py_BEGIN_ALLOW_THREADS
        par_run(vm_part, &job, (int)nparts);
        Py_END_ALLOW_THREADS
    } else {
        vm_part(&job, 0, 1);
    }
    for (Py_ssize_t q = 0; q < got; q++)
        PyBuffer_Release(&views[q]);
    Py_RETURN_TRUE;
malformed:
    PyErr_SetString(PyExc_ValueError, "elementwise: malformed instruction");
    return NULL;
}


/* rowreduce(x, out, R, C, op, double) -> bool: out[r] = max (op 0) or min (op 1) of row r of an
 * R x C matrix, NaN-propagating like np.maximum.reduce.  numpy's reduction over a short last
 * axis (the 4 logits of a batch of observations) costs ~70 ns per row; this is one pass. */
#define DEFINE_ROWREDUCE(T, SUFFIX)                                                                \
    static void rowreduce_##SUFFIX(const T *x, T *o, Py_ssize_t R, Py_ssize_t C, int op)           \
    {                                                                                              \
        for (Py_ssize_t r = 0; r < R; r++) {                                                       \
            const T *xr = x + r * C;                                                               \
            T m = xr[0];                                                                           \
            for (Py_ssize_t c = 1; c < C && m == m; c++) {                                         \
                const T v = xr[c];                                                                 \
                if (v != v || (op == 0 ? v > m : v < m)) m = v;                                    \
            }                                                                                      \
            o[r] = m;                                                                              \
        }                                                                                          \
    }
DEFINE_ROWREDUCE(float, f32)
DEFINE_ROWREDUCE(double, f64)

static PyObject *py_rowreduce(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "rowreduce(x, out, R, C, op, double) takes 6 arguments");
        return NULL;
    }
    Py_ssize_t s[3];
    if (!as_sizes(args + 2, 3, s))
        return NULL;
    Py_ssize_t R = s[0], C = s[1], op = s[2];
    int dbl = PyObject_IsTrue(args[5]);
    if (dbl < 0)
        return NULL;
    if (C == 0 || op > 1)
        Py_RETURN_FALSE;
    Py_ssize_t it = dbl ? sizeof(double) : sizeof(float);
    char fmt = dbl ? 'd' : 'f';
    Py_buffer vx, vo;
    if (!borrow(args[0], &vx, 0, R * C * it, fmt))
        Py_RETURN_FALSE;
    if (!borrow(args[1], &vo, 1, R * it, fmt)) {
        PyBuffer_Release(&vx);
        Py_RETURN_FALSE;
    }
    if (dbl)
        rowreduce_f64(vx.buf, vo.buf, R, C, (int)op);
    else
        rowreduce_f32(vx.buf, vo.buf, R, C, (int)op);
    PyBuffer_Release(&vx);
    PyBuffer_Release(&vo);
    Py_RETURN_TRUE;
}

/* ------------------------------------------------------------------------------------------
 * Convolution windows and max pooling on NCHW images (the convolution family's kernels).
 *
 * Geometry g[] = {N, C, H, W, KH, KW, SH, SW, PH, PW, DH, DW, OH, OW}.  im2col writes the
 * windows as columns (N, ROWS, OH*OW), rows in (kh, kw, c) order (ROWS = KH*KW*C, or one more:
 * a constant bias row), out-of-image positions = pad; col2im is its transpose (scatter-add,
 * the bias row ignored).  numpy's strided copies over the short rows of small images cost far
 * more than these loops.  max_pool2d takes the window maximum over in-image positions (NaN
 * propagates, as numpy's maximum); its gradient gives each window's output gradient to the
 * in-image positions equal to the maximum, split evenly between ties.
 * ------------------------------------------------------------------------------------------ */
enum { G_N, G_C, G_H, G_W, G_KH, G_KW, G_SH, G_SW, G_PH, G_PW, G_DH, G_DW, G_OH, G_OW, G_COUNT };

#define DEFINE_WINDOWS(T, SUFFIX)                                                                  \
    static void im2col_##SUFFIX(const T *x, T *o, const Py_ssize_t *g, Py_ssize_t rows, T pad,      \
                                int bias, T bias_value)                                            \
    {                                                                                              \
        const Py_ssize_t N = g[G_N], C = g[G_C], H = g[G_H], W = g[G_W], OH = g[G_OH], OW = g[G_OW]; \
        const Py_ssize_t L = OH * OW;                                                              \
        for (Py_ssize_t n = 0; n < N; n++) {                                                       \
            T *on = o + n * rows * L;                                                              \
            for (Py_ssize_t i = 0; i < g[G_KH]; i++)                                               \
                for (Py_ssize_t j = 0; j < g[G_KW]; j++) {                                         \
                    /* output columns ow in [lo, hi) read image column ow*sw + w0, inside [0, W) */ \
                    const Py_ssize_t sw = g[G_SW], w0 = j * g[G_DW] - g[G_PW];                     \
                    Py_ssize_t lo = w0 >= 0 ? 0 : (-w0 + sw - 1) / sw;                             \
                    Py_ssize_t hi = W - w0 <= 0 ? 0 : (W - w0 + sw - 1) / sw;                      \
                    if (hi > OW) hi = OW;                                                          \
                    if (lo > hi) lo = hi;                                                          \
                    for (Py_ssize_t c = 0; c < C; c++) {                                           \
                        const T *xc = x + (n * C + c) * H * W;                                     \
                        T *dst = on + ((i * g[G_KW] + j) * C + c) * L;                             \
                        for (Py_ssize_t oh = 0; oh < OH; oh++) {                                   \
                            const Py_ssize_t h = oh * g[G_SH] - g[G_PH] + i * g[G_DH];             \
                            T *d = dst + oh * OW;                                                  \
                            if (h < 0 || h >= H) {                                                 \
                                for (Py_ssize_t ow = 0; ow < OW; ow++) d[ow] = pad;                \
                                continue;                                                          \
                            }                                                                      \
                            const T *xr = xc + h * W;                                              \
                            Py_ssize_t ow = 0;                                                     \
                            for (; ow < lo; ow++) d[ow] = pad;                                     \
                            if (sw == 1)                                                           \
                                for (; ow < hi; ow++) d[ow] = xr[ow + w0];                         \
                            else                                                                   \
                                for (; ow < hi; ow++) d[ow] = xr[ow * sw + w0];                    \
                            for (; ow < OW; ow++) d[ow] = pad;                                     \
                        }                                                                          \
                    }                                                                              \
                }                                                                                  \
            if (bias)                                                                              \
                for (Py_ssize_t l = 0; l < L; l++) on[(rows - 1) * L + l] = bias_value;            \
        }                                                                                          \
    }                                                                                              \
                                                                                                   \
    static void col2im_##SUFFIX(const T *cols, T *x, const Py_ssize_t *g, Py_ssize_t rows)         \
    {                                                                                              \
        const Py_ssize_t N = g[G_N], C = g[G_C], H = g[G_H], W = g[G_W], OH = g[G_OH], OW = g[G_OW]; \
        const Py_ssize_t L = OH * OW;                                                              \
        memset(x, 0, (size_t)(N * C * H * W) * sizeof(T));                                         \
        for (Py_ssize_t n = 0; n < N; n++) {                                                       \
            const T *cn = cols + n * rows * L;                                                     \
            for (Py_ssize_t i = 0; i < g[G_KH]; i++)                                               \
                for (Py_ssize_t j = 0; j < g[G_KW]; j++) {                                         \
                    /* output columns ow in [lo, hi) read image column ow*sw + w0, inside [0, W) */ \
                    const Py_ssize_t sw = g[G_SW], w0 = j * g[G_DW] - g[G_PW];                     \
                    Py_ssize_t lo = w0 >= 0 ? 0 : (-w0 + sw - 1) / sw;                             \
                    Py_ssize_t hi = W - w0 <= 0 ? 0 : (W - w0 + sw - 1) / sw;                      \
                    if (hi > OW) hi = OW;                                                          \
                    if (lo > hi) lo = hi;                                                          \
                    for (Py_ssize_t c = 0; c < C; c++) {                                           \
                        T *xc = x + (n * C + c) * H * W;                                           \
                        const T *src = cn + ((i * g[G_KW] + j) * C + c) * L;                       \
                        for (Py_ssize_t oh = 0; oh < OH; oh++) {                                   \
                            const Py_ssize_t h = oh * g[G_SH] - g[G_PH] + i * g[G_DH];             \
                            if (h < 0 || h >= H)                                                   \
                                continue;                                                          \
                            T *xr = xc + h * W;                                                    \
                            const T *s = src + oh * OW;                                            \
                            if (sw == 1)                                                           \
                                for (Py_ssize_t ow = lo; ow < hi; ow++) xr[ow + w0] += s[ow];      \
                            else                                                                   \
                                for (Py_ssize_t ow = lo; ow < hi; ow++) xr[ow * sw + w0] += s[ow]; \
                        }                                                                          \
                    }                                                                              \
                }                                                                                  \
        }                                                                                          \
    }                                                                                              \
                                                                                                   \
    static void maxpool_##SUFFIX(const T *x, T *o, const Py_ssize_t *g)                            \
    {                                                                                              \
        const Py_ssize_t H = g[G_H], W = g[G_W], OH = g[G_OH], OW = g[G_OW], KH = g[G_KH], KW = g[G_KW]; \
        const int two = KH == 2 && KW == 2 && g[G_SH] == 2 && g[G_SW] == 2 && g[G_PH] == 0 && g[G_PW] == 0; \
        for (Py_ssize_t p = 0; p < g[G_N] * g[G_C]; p++) {                                         \
            const T *xp = x + p * H * W;                                                           \
            T *op = o + p * OH * OW;                                                               \
            for (Py_ssize_t oh = 0; oh < OH; oh++) {                                               \
                if (two) { /* the common 2x2 / stride-2 pool: a max of four, NaN kept */           \
                    const T *r0 = xp + 2 * oh * W, *r1 = r0 + W;                                   \
                    for (Py_ssize_t ow = 0; ow < OW; ow++) {                                       \
                        T m = r0[2 * ow], v = r0[2 * ow + 1];                                      \
                        if (v > m || v != v) m = v;                                                \
                        v = r1[2 * ow];                                                            \
                        if (v > m || v != v) m = v;                                                \
                        v = r1[2 * ow + 1];                                                        \
                        if (v > m || v != v) m = v;                                                \
                        op[oh * OW + ow] = m;                                                      \
                    }                                                                              \
                    continue;                                                                      \
                }                                                                                  \
                const Py_ssize_t h0 = oh * g[G_SH] - g[G_PH];                                      \
                const Py_ssize_t hs = h0 < 0 ? 0 : h0, he = h0 + KH < H ? h0 + KH : H;             \
                for (Py_ssize_t ow = 0; ow < OW; ow++) {                                           \
                    const Py_ssize_t w0 = ow * g[G_SW] - g[G_PW];                                  \
                    const Py_ssize_t ws = w0 < 0 ? 0 : w0, we = w0 + KW < W ? w0 + KW : W;         \
                    T m = -INFINITY; /* a window wholly in the padding: -inf, as numpy's padded max */ \
                    for (Py_ssize_t h = hs; h < he; h++)                                           \
                        for (Py_ssize_t w = ws; w < we; w++) {                                     \
                            const T v = xp[h * W + w];                                             \
                            if (v > m || v != v) m = v; /* once NaN, m stays NaN */                \
                        }                                                                          \
                    op[oh * OW + ow] = m;                                                          \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
    }                                                                                              \
                                                                                                   \
    static void maxpool_grad_##SUFFIX(const T *x, const T *out, const T *ct, T *gx, const Py_ssize_t *g) \
    {                                                                                              \
        const Py_ssize_t H = g[G_H], W = g[G_W], OH = g[G_OH], OW = g[G_OW], KH = g[G_KH], KW = g[G_KW]; \
        memset(gx, 0, (size_t)(g[G_N] * g[G_C] * H * W) * sizeof(T));                              \
        for (Py_ssize_t p = 0; p < g[G_N] * g[G_C]; p++) {                                         \
            const T *xp = x + p * H * W;                                                           \
            T *gp = gx + p * H * W;                                                                \
            const T *mp = out + p * OH * OW, *cp = ct + p * OH * OW;                               \
            for (Py_ssize_t oh = 0; oh < OH; oh++) {                                               \
                const Py_ssize_t h0 = oh * g[G_SH] - g[G_PH];                                      \
                const Py_ssize_t hs = h0 < 0 ? 0 : h0, he = h0 + KH < H ? h0 + KH : H;             \
                for (Py_ssize_t ow = 0; ow < OW; ow++) {                                           \
                    const T m = mp[oh * OW + ow];                                                  \
                    const Py_ssize_t w0 = ow * g[G_SW] - g[G_PW];                                  \
                    const Py_ssize_t ws = w0 < 0 ? 0 : w0, we = w0 + KW < W ? w0 + KW : W;         \
                    Py_ssize_t count = 0, at = 0;                                                  \
                    for (Py_ssize_t h = hs; h < he; h++)                                           \
                        for (Py_ssize_t w = ws; w < we; w++) { /* branch-free: the max is anywhere */ \
                            const int hit = xp[h * W + w] == m;                                    \
                            count += hit;                                                          \
                            at = hit ? h * W + w : at;                                             \
                        }                                                                          \
                    if (count == 1) {                                                              \
                        gp[at] += cp[oh * OW + ow];                                                \
                    } else if (count > 1) {                                                        \
                        const T share = cp[oh * OW + ow] / (T)count;                               \
                        for (Py_ssize_t h = hs; h < he; h++)                                       \
                            for (Py_ssize_t w = ws; w < we; w++)                                   \
                                if (xp[h * W + w] == m) gp[h * W + w] += share;                    \
                    }                                                                              \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
    }
DEFINE_WINDOWS(float, f32)
DEFINE_WINDOWS(double, f64)

/* Read the geometry tuple; 0 (no exception) when it is not 14 non-negative sizes with positive
 * kernel, stride and dilation. */
static int read_geometry(PyObject *tuple, Py_ssize_t *g)
{
    if (!PyTuple_Check(tuple) || PyTuple_GET_SIZE(tuple) != G_COUNT)
        return 0;
    for (Py_ssize_t i = 0; i < G_COUNT; i++) {
        g[i] = PyLong_AsSsize_t(PyTuple_GET_ITEM(tuple, i));
        if (g[i] < 0) {
            PyErr_Clear();
            return 0;
        }
    }
    return g[G_KH] > 0 && g[G_KW] > 0 && g[G_SH] > 0 && g[G_SW] > 0 && g[G_DH] > 0 && g[G_DW] > 0;
}

static int disjoint(const Py_buffer *a, const Py_buffer *b)
{
    const char *x = a->buf, *y = b->buf;
    return x + a->len <= y || y + b->len <= x;
}

/* windows(op, geometry, double, rows, pad, bias, bias_value, out, *inputs) -> bool
 *   op 0: im2col(x) -> out (N, rows, OH*OW);   op 1: col2im(cols (N, rows, OH*OW)) -> out (N, C, H, W)
 *   op 2: max_pool2d(x) -> out (N, C, OH, OW); op 3: max_pool2d_grad(x, pooled, ct) -> out (N, C, H, W)
 * False (nothing written) when a buffer is not C-contiguous of the expected size and type, or the
 * output overlaps an input. */
static PyObject *py_windows(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 9) {
        PyErr_SetString(PyExc_TypeError, "windows(op, geometry, double, rows, pad, bias, bias_value, out, *inputs)");
        return NULL;
    }
    Py_ssize_t op = PyLong_AsSsize_t(args[0]), rows = PyLong_AsSsize_t(args[3]);
    if ((op == -1 || rows == -1) && PyErr_Occurred())
        return NULL;
    Py_ssize_t g[G_COUNT];
    if (!read_geometry(args[1], g) || op < 0 || op > 3)
        Py_RETURN_FALSE;
    int dbl = PyObject_IsTrue(args[2]), bias = PyObject_IsTrue(args[5]);
    double pad = PyFloat_AsDouble(args[4]), bias_value = PyFloat_AsDouble(args[6]);
    if (dbl < 0 || bias < 0 || PyErr_Occurred())
        return NULL;
    const Py_ssize_t it = dbl ? sizeof(double) : sizeof(float);
    const char fmt = dbl ? 'd' : 'f';
    const Py_ssize_t image = g[G_N] * g[G_C] * g[G_H] * g[G_W] * it;
    const Py_ssize_t cols = g[G_N] * rows * g[G_OH] * g[G_OW] * it;
    const Py_ssize_t pooled = g[G_N] * g[G_C] * g[G_OH] * g[G_OW] * it;
    const Py_ssize_t kk = g[G_KH] * g[G_KW] * g[G_C];
    if ((op <= 1 && rows != kk && rows != kk + 1) || (op == 0 && bias && rows != kk + 1))
        Py_RETURN_FALSE;
    Py_ssize_t out_bytes = op == 0 ? cols : op == 2 ? pooled : image;
    Py_ssize_t in_bytes[3] = {op == 1 ? cols : image, pooled, pooled};
    Py_ssize_t n_in = op == 3 ? 3 : 1;
    if (nargs != 8 + n_in)
        Py_RETURN_FALSE;
    Py_buffer vo, vi[3];
    if (!borrow(args[7], &vo, 1, out_bytes, fmt))
        Py_RETURN_FALSE;
    Py_ssize_t got = 0;
    int ok = 1;
    for (; got < n_in; got++) {
        if (!borrow(args[8 + got], &vi[got], 0, in_bytes[got], fmt)) {
            ok = 0;
            break;
        }
        if (!disjoint(&vo, &vi[got])) {
            got++;
            ok = 0;
            break;
        }
    }
    if (ok) {
        if (dbl) {
            if (op == 0) im2col_f64(vi[0].buf, vo.buf, g, rows, pad, bias, bias_value);
            else if (op == 1) col2im_f64(vi[0].buf, vo.buf, g, rows);
            else if (op == 2) maxpool_f64(vi[0].buf, vo.buf, g);
            else maxpool_grad_f64(vi[0].buf, vi[1].buf, vi[2].buf, vo.buf, g);
        } else {
            if (op == 0) im2col_f32(vi[0].buf, vo.buf, g, rows, (float)pad, bias, (float)bias_value);
            else if (op == 1) col2im_f32(vi[0].buf, vo.buf, g, rows);
            else if (op == 2) maxpool_f32(vi[0].buf, vo.buf, g);
            else maxpool_grad_f32(vi[0].buf, vi[1].buf, vi[2].buf, vo.buf, g);
        }
    }
    for (Py_ssize_t k = 0; k < got; k++)
        PyBuffer_Release(&vi[k]);
    PyBuffer_Release(&vo);
    if (ok)
        Py_RETURN_TRUE;
    Py_RETURN_FALSE;
}

/* ------------------------------------------------------------------------------------ random
 * Philox-4x64-10 (Salmon et al., SC 2011; numpy's np.random.Philox) over many keys at once, and
 * the engine's transforms of its words (primitives/random.py documents the stream layout and the
 * transforms; its numpy fallback computes the same words).  Block b of a key is Philox of the
 * counter (b + 1, 0, 0, top); word i of the stream is word i % 4 of block i / 4. */

typedef unsigned long long u64;

static inline u64 mulhilo64(u64 a, u64 b, u64 *hi)
{
    unsigned __int128 p = (unsigned __int128)a * b;
    *hi = (u64)(p >> 64);
    return (u64)p;
}

static inline void philox4x64_10(u64 c[4], u64 k0, u64 k1)
{
    for (int r = 0; r < 10; r++) {
        if (r) {
            k0 += 0x9E3779B97F4A7C15ULL;
            k1 += 0xBB67AE8584CAA73BULL;
        }
        u64 hi0, hi1;
        u64 lo0 = mulhilo64(0xD2E7470EE14C6C93ULL, c[0], &hi0);
        u64 lo1 = mulhilo64(0xCA5A826395121157ULL, c[2], &hi1);
        u64 n0 = hi1 ^ c[1] ^ k0, n2 = hi0 ^ c[3] ^ k1;
        c[0] = n0;
        c[1] = lo1;
        c[2] = n2;
        c[3] = lo0;
    }
}

/* words 0 .. nwords-1 of one key's stream */
static void philox_stream(const u64 *key, u64 top, u64 *out, Py_ssize_t nwords)
{
    for (Py_ssize_t b = 0; 4 * b < nwords; b++) {
        u64 c[4] = {(u64)b + 1, 0, 0, top};
        philox4x64_10(c, key[0], key[1]);
        for (Py_ssize_t j = 0; j < 4 && 4 * b + j < nwords; j++)
            out[4 * b + j] = c[j];
    }
}

/* Box-Muller of two words into two normals (float64) */
static inline void box_muller(u64 w0, u64 w1, double *z0, double *z1)
{
    double u1 = 1.0 - (double)(w0 >> 11) * 0x1p-53, u2 = (double)(w1 >> 11) * 0x1p-53;
    double r = sqrt(-2.0 * log(u1)), t = 6.283185307179586 * u2;
    *z0 = r * cos(t);
    *z1 = r * sin(t);
}

/* one key's draw of n samples: kind 0 uniform, 1 normal; dbl: float64 (else float32) */
static void random_draw(const u64 *key, void *out, Py_ssize_t n, int kind, int dbl)
{
    double *od = out;
    float *of = out;
    for (Py_ssize_t b = 0;; b++) {
        Py_ssize_t per = (kind == 0 && !dbl) ? 8 : 4; /* samples one block gives */
        Py_ssize_t s0 = b * per;
        if (s0 >= n)
            break;
        u64 c[4] = {(u64)b + 1, 0, 0, 0};
        philox4x64_10(c, key[0], key[1]);
        if (kind == 0 && dbl) {
            for (int j = 0; j < 4 && s0 + j < n; j++)
                od[s0 + j] = (double)(c[j] >> 11) * 0x1p-53;
        } else if (kind == 0) {
            for (int j = 0; j < 8 && s0 + j < n; j++) {
                uint32_t h = (uint32_t)(j & 1 ? c[j >> 1] >> 32 : c[j >> 1]);
                of[s0 + j] = (float)(h >> 8) * 0x1p-24f;
            }
        } else {
            double z[4];
            box_muller(c[0], c[1], &z[0], &z[1]);
            box_muller(c[2], c[3], &z[2], &z[3]);
            for (int j = 0; j < 4 && s0 + j < n; j++) {
                if (dbl)
                    od[s0 + j] = z[j];
                else
                    of[s0 + j] = (float)z[j];
            }
        }
    }
}

/* Borrow a C-contiguous buffer of 8-byte integers of exactly `nbytes` bytes. */
static int borrow_u64(PyObject *obj, Py_buffer *view, int writable, Py_ssize_t nbytes)
{
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) != 0) {
        PyErr_Clear();
        return 0;
    }
    const char *f = view->format ? view->format : "B";
    size_t n = strlen(f);
    char c = n ? f[n - 1] : 'B';
    int fmt_ok = (c == 'q' || c == 'Q' || c == 'l' || c == 'L') && view->itemsize == 8 &&
                 (n == 1 || (n == 2 && (f[0] == '@' || f[0] == '=' || f[0] == '<')));
    if (!fmt_ok || view->len != nbytes) {
        PyBuffer_Release(view);
        return 0;
    }
    return 1;
}

/* philox(keys, out, nkeys, nwords, top) -> bool: out[k, i] = word i of key k's stream (keys
 * (nkeys, 2) and out (nkeys, nwords) 64-bit integers); False (nothing written) on a bad buffer. */
static PyObject *py_philox(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "philox(keys, out, nkeys, nwords, top) takes 5 arguments");
        return NULL;
    }
    Py_ssize_t s[2];
    if (!as_sizes(args + 2, 2, s))
        return NULL;
    u64 top = PyLong_AsUnsignedLongLong(args[4]);
    if (PyErr_Occurred())
        return NULL;
    Py_ssize_t nkeys = s[0], nwords = s[1];
    if (nkeys > PY_SSIZE_T_MAX / 16 || (nkeys && nwords > PY_SSIZE_T_MAX / 8 / nkeys))
        Py_RETURN_FALSE;
    Py_buffer vk, vo;
    if (!borrow_u64(args[0], &vk, 0, nkeys * 16))
        Py_RETURN_FALSE;
    if (!borrow_u64(args[1], &vo, 1, nkeys * nwords * 8)) {
        PyBuffer_Release(&vk);
        Py_RETURN_FALSE;
    }
    const u64 *keys = vk.buf;
    u64 *out = vo.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t k = 0; k < nkeys; k++)
        philox_stream(keys + 2 * k, top, out + k * nwords, nwords);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&vo);
    PyBuffer_Release(&vk);
    Py_RETURN_TRUE;
}

/* random(keys, out, nkeys, n, kind, double) -> bool: out[k] = n samples of key k (kind 0
 * uniform, 1 normal; float64 if double else float32); False (nothing written) on a bad buffer. */
static PyObject *py_random(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "random(keys, out, nkeys, n, kind, double) takes 6 arguments");
        return NULL;
    }
    Py_ssize_t s[3];
    if (!as_sizes(args + 2, 3, s))
        return NULL;
    int dbl = PyObject_IsTrue(args[5]);
    if (dbl < 0)
        return NULL;
    Py_ssize_t nkeys = s[0], n = s[1], kind = s[2];
    const Py_ssize_t it = dbl ? 8 : 4;
    if (kind > 1 || nkeys > PY_SSIZE_T_MAX / 16 || (nkeys && n > PY_SSIZE_T_MAX / it / nkeys))
        Py_RETURN_FALSE;
    Py_buffer vk, vo;
    if (!borrow_u64(args[0], &vk, 0, nkeys * 16))
        Py_RETURN_FALSE;
    if (!borrow(args[1], &vo, 1, nkeys * n * it, dbl ? 'd' : 'f')) {
        PyBuffer_Release(&vk);
        Py_RETURN_FALSE;
    }
    const u64 *keys = vk.buf;
    char *out = vo.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t k = 0; k < nkeys; k++)
        random_draw(keys + 2 * k, out + k * n * it, n, (int)kind, dbl);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&vo);
    PyBuffer_Release(&vk);
    Py_RETURN_TRUE;
}

/* tanh(x, out) -> bool: out = fa_tanhf(x) (_tanhf.h), the engine's float32 tanh, for C-contiguous
 * float32 buffers of one size (out may be x); False without touching anything otherwise. */
static PyObject *py_tanh(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "tanh(x, out) takes 2 arguments");
        return NULL;
    }
    Py_buffer vx, vo;
    if (PyObject_GetBuffer(args[0], &vx, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) != 0) {
        PyErr_Clear();
        Py_RETURN_FALSE;
    }
    Py_ssize_t nbytes = vx.len;
    PyBuffer_Release(&vx);
    if (!borrow(args[0], &vx, 0, nbytes, 'f'))
        Py_RETURN_FALSE;
    if (!borrow(args[1], &vo, 1, nbytes, 'f')) {
        PyBuffer_Release(&vx);
        Py_RETURN_FALSE;
    }
    fa_tanhf_loop((const float *)vx.buf, (float *)vo.buf, (long long)(nbytes / (Py_ssize_t)sizeof(float)));
    PyBuffer_Release(&vx);
    PyBuffer_Release(&vo);
    Py_RETURN_TRUE;
}

static PyObject *SMALL[5]; /* the ints 0..4: a spec's tag is one of these objects (CPython keeps one of each) */

static long spec_tag(PyObject *spec)
{
    PyObject *t = PyTuple_GET_ITEM(spec, 0);
    for (long i = 0; i < 5; i++)
        if (t == SMALL[i])
            return i;
    return PyLong_AsLong(t);
}

/* 1 where `spec` is a well-formed tree spec (see walk_tree), else 0 with ValueError: walk_tree and
 * build_tree read specs without checking them, so every spec that comes from Python is checked first */
static int check_spec(PyObject *spec, int depth)
{
    if (spec == Py_None)
        return 1;
    if (depth > 100 || !PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) < 1 || !PyLong_Check(PyTuple_GET_ITEM(spec, 0)))
        goto bad;
    long tag = PyLong_AsLong(PyTuple_GET_ITEM(spec, 0));
    Py_ssize_t size = tag == 3 ? 1 : tag == 1 || tag == 2 ? 2 : tag == 0 || tag == 4 ? 3 : -1;
    if (size < 0 || PyTuple_GET_SIZE(spec) != size)
        goto bad;
    if (tag == 3)
        return 1;
    PyObject *children = PyTuple_GET_ITEM(spec, size - 1);
    if (!PyTuple_Check(children))
        goto bad;
    if (tag == 0 && (!PyTuple_Check(PyTuple_GET_ITEM(spec, 1)) || PyTuple_GET_SIZE(PyTuple_GET_ITEM(spec, 1)) != PyTuple_GET_SIZE(children)))
        goto bad;
    if (tag == 4 && !(PyType_Check(PyTuple_GET_ITEM(spec, 1)) &&
                      PyType_IsSubtype((PyTypeObject *)PyTuple_GET_ITEM(spec, 1), &PyTuple_Type)))
        goto bad; /* a namedtuple class */
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(children); i++)
        if (!check_spec(PyTuple_GET_ITEM(children, i), depth + 1))
            return 0;
    return 1;
bad:
    if (!PyErr_Occurred())
        PyErr_SetString(PyExc_ValueError, "malformed tree spec");
    return 0;
}

#define DICT_SCAN 16 /* dicts up to this size are matched by key identity first */

/* The argument check of jit's fast path, for a signature whose leaves are all arrays that the called
 * program checks itself (whole-graph native code): walk `obj` along `spec`, collecting its leaves in
 * flattening order (borrowed), or answer 0 where the structure differs.  A spec is None (a leaf, taken
 * as it is), (0, keys, children) an exactly-dict of exactly those keys, (1, children) an exactly-list,
 * (2, children) an exactly-tuple, (3,) None, (4, cls, children) an instance of exactly the namedtuple
 * class cls: the structure checks of the Python guard it replaces (jit._guard_source).  -1: an error. */
static int walk_tree(PyObject *obj, PyObject *spec, PyObject **leaves, Py_ssize_t *k, Py_ssize_t cap)
{
    if (spec == Py_None) {
        if (*k >= cap)
            return 0;
        leaves[(*k)++] = obj;
        return 1;
    }
    long tag = spec_tag(spec);
    PyObject *children;
    switch (tag) {
    case 0: {
        PyObject *keys = PyTuple_GET_ITEM(spec, 1);
        children = PyTuple_GET_ITEM(spec, 2);
        Py_ssize_t n = PyTuple_GET_SIZE(keys);
        if (!PyDict_CheckExact(obj) || PyDict_GET_SIZE(obj) != n)
            return 0;
        /* the dict's entries in insertion order: a spec key (sorted) that is the same object as an entry's
         * key (interned strings, the usual case) takes that entry's value without hashing; others are looked up */
        PyObject *ek[DICT_SCAN], *ev[DICT_SCAN];
        Py_ssize_t ne = 0, pos = 0;
        if (n <= DICT_SCAN)
            while (ne < n && PyDict_Next(obj, &pos, &ek[ne], &ev[ne]))
                ne++;
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *key = PyTuple_GET_ITEM(keys, i), *v = NULL;
            for (Py_ssize_t j = 0; j < ne; j++)
                if (ek[(i + j) % ne] == key) {
                    v = ev[(i + j) % ne];
                    break;
                }
            if (v == NULL && (v = PyDict_GetItemWithError(obj, key)) == NULL)
                return PyErr_Occurred() ? -1 : 0;
            int r = walk_tree(v, PyTuple_GET_ITEM(children, i), leaves, k, cap);
            if (r <= 0)
                return r;
        }
        return 1;
    }
    case 1:
    case 2: {
        children = PyTuple_GET_ITEM(spec, 1);
        Py_ssize_t n = PyTuple_GET_SIZE(children);
        if (tag == 1 ? (!PyList_CheckExact(obj) || PyList_GET_SIZE(obj) != n)
                     : (!PyTuple_CheckExact(obj) || PyTuple_GET_SIZE(obj) != n))
            return 0;
        for (Py_ssize_t i = 0; i < n; i++) {
            int r = walk_tree(tag == 1 ? PyList_GET_ITEM(obj, i) : PyTuple_GET_ITEM(obj, i),
                              PyTuple_GET_ITEM(children, i), leaves, k, cap);
            if (r <= 0)
                return r;
        }
        return 1;
    }
    case 3:
        return obj == Py_None;
    case 4: {
        children = PyTuple_GET_ITEM(spec, 2);
        Py_ssize_t n = PyTuple_GET_SIZE(children);
        if ((PyObject *)Py_TYPE(obj) != PyTuple_GET_ITEM(spec, 1) || PyTuple_GET_SIZE(obj) != n)
            return 0;
        for (Py_ssize_t i = 0; i < n; i++) {
            int r = walk_tree(PyTuple_GET_ITEM(obj, i), PyTuple_GET_ITEM(children, i), leaves, k, cap);
            if (r <= 0)
                return r;
        }
        return 1;
    }
    default:
        PyErr_SetString(PyExc_ValueError, "leaves: malformed tree spec");
        return -1;
    }
}

#define MAX_TREE_LEAVES 256

/* leaves(obj, spec) -> list of obj's leaves, or None where its structure differs from spec */
static PyObject *py_leaves(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *stack[MAX_TREE_LEAVES];
    Py_ssize_t k = 0;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "leaves(obj, spec)");
        return NULL;
    }
    if (!check_spec(args[1], 0))
        return NULL;
    int r = walk_tree(args[0], args[1], stack, &k, MAX_TREE_LEAVES);
    if (r <= 0) {
        if (r < 0)
            return NULL;
        Py_RETURN_NONE;
    }
    PyObject *out = PyList_New(k);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < k; i++) {
        Py_INCREF(stack[i]);
        PyList_SET_ITEM(out, i, stack[i]);
    }
    return out;
}

/* ---------------------------------------------------------------------------------------------
 * engine.jit's call path for whole-graph native programs, all in C (one Python-level call: the
 * jitted function's own).  jit.py builds, per compiled signature,
 *
 *     FastCall(pool, build, slow, spec, out_spec)
 *
 * and stores the newest in its Jitted's `_fast0` slot.  FastCall(args, kwargs) does what the Python
 * fast path does: no keywords; the arguments walked along `spec` (walk_tree: the structure checks of
 * the Python guard); a program taken from `pool` (a list of callables, each with an arena of its own;
 * `build()` makes another when a reentrant call finds it empty) and called with the leaves; the
 * program's own checks answer NotImplemented (another dtype or shape: a miss) or raise TypeError (a
 * layout it does not take: `slow(*leaves)`, the per-equation executor); its list of outputs is put
 * back into the tree `out_spec` (the same spec format; a leaf takes the next output).  A miss returns
 * MISS and jit looks the signature up.
 *
 * JitBase is Jitted's base class: calling a Jitted runs `_fast0(args, kwargs)` (a FastCall directly, any
 * other callable as a Python call) and, when that answers MISS, `self._call_slow(*args, **kwargs)`. */

static PyObject *MISS; /* _native.MISS: "not this signature" */

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *pool, *build, *slow, *spec, *out_spec;
} FastCall;

static PyTypeObject FastCallType;

/* the output tree: `spec` over items[*i:] (a new reference, NULL on an error) */
static PyObject *build_tree(PyObject *spec, PyObject *const *items, Py_ssize_t n, Py_ssize_t *i)
{
    if (spec == Py_None) {
        if (*i >= n) {
            PyErr_SetString(PyExc_ValueError, "FastCall: the program returned fewer outputs than its tree has leaves");
            return NULL;
        }
        PyObject *x = items[(*i)++];
        Py_INCREF(x);
        return x;
    }
    long tag = spec_tag(spec);
    PyObject *children = tag == 1 || tag == 2 ? PyTuple_GET_ITEM(spec, 1) : tag == 3 ? NULL : PyTuple_GET_ITEM(spec, 2);
    Py_ssize_t m = children ? PyTuple_GET_SIZE(children) : 0;
    if (tag == 3)
        Py_RETURN_NONE;
    if (tag == 0) {
        PyObject *keys = PyTuple_GET_ITEM(spec, 1), *d = PyDict_New();
        if (d == NULL)
            return NULL;
        for (Py_ssize_t c = 0; c < m; c++) {
            PyObject *v = build_tree(PyTuple_GET_ITEM(children, c), items, n, i);
            if (v == NULL || PyDict_SetItem(d, PyTuple_GET_ITEM(keys, c), v) < 0) {
                Py_XDECREF(v);
                Py_DECREF(d);
                return NULL;
            }
            Py_DECREF(v);
        }
        return d;
    }
    if (tag == 1 || tag == 2 || tag == 4) {
        PyObject *seq = tag == 1 ? PyList_New(m) : PyTuple_New(m);
        if (seq == NULL)
            return NULL;
        for (Py_ssize_t c = 0; c < m; c++) {
            PyObject *v = build_tree(PyTuple_GET_ITEM(children, c), items, n, i);
            if (v == NULL) {
                Py_DECREF(seq);
                return NULL;
            }
            if (tag == 1)
                PyList_SET_ITEM(seq, c, v);
            else
                PyTuple_SET_ITEM(seq, c, v);
        }
        if (tag != 4)
            return seq;
        PyObject *out = PyObject_Call(PyTuple_GET_ITEM(spec, 1), seq, NULL); /* the namedtuple class */
        Py_DECREF(seq);
        return out;
    }
    PyErr_SetString(PyExc_ValueError, "FastCall: malformed tree spec");
    return NULL;
}

static PyObject *fastcall_apply(FastCall *f, PyObject *args, PyObject *kwargs)
{
    if (kwargs != NULL && PyDict_GET_SIZE(kwargs) != 0)
        return Py_NewRef(MISS);
    PyObject *run, *pool = f->pool;
    Py_ssize_t np_ = PyList_GET_SIZE(pool);
    if (np_ > 0) { /* the newest free program; another call that comes in while it runs builds its own */
        run = Py_NewRef(PyList_GET_ITEM(pool, np_ - 1));
        if (PyList_SetSlice(pool, np_ - 1, np_, NULL) < 0) {
            Py_DECREF(run);
            return NULL;
        }
    } else if ((run = PyObject_CallNoArgs(f->build)) == NULL) {
        return NULL;
    }
    PyObject *stack[MAX_TREE_LEAVES], *o = NULL;
    Py_ssize_t k = 0;
    int r = walk_tree(args, f->spec, stack, &k, MAX_TREE_LEAVES);
    if (r > 0) { /* the leaves are borrowed from args, and nothing runs between the walk and the call */
        o = PyObject_Vectorcall(run, stack, (size_t)k, NULL);
        if (o == NULL && PyErr_ExceptionMatches(PyExc_TypeError)) { /* a layout the program does not take */
            PyErr_Clear();
            k = 0;
            r = walk_tree(args, f->spec, stack, &k, MAX_TREE_LEAVES);
            o = r > 0 ? PyObject_Vectorcall(f->slow, stack, (size_t)k, NULL) : NULL;
        }
    }
    int appended = PyList_Append(pool, run);
    Py_DECREF(run);
    if (appended < 0 || r < 0) {
        Py_XDECREF(o);
        return NULL;
    }
    if (r == 0 || o == Py_NotImplemented) { /* another structure, or another dtype or shape */
        Py_XDECREF(o);
        return Py_NewRef(MISS);
    }
    if (o == NULL)
        return NULL;
    PyObject *seq = PySequence_Fast(o, "FastCall: the program's outputs are not a sequence");
    Py_DECREF(o);
    if (seq == NULL)
        return NULL;
    Py_ssize_t i = 0, n = PySequence_Fast_GET_SIZE(seq);
    PyObject *out = build_tree(f->out_spec, PySequence_Fast_ITEMS(seq), n, &i);
    if (out != NULL && i != n) {
        Py_CLEAR(out);
        PyErr_SetString(PyExc_ValueError, "FastCall: the program returned more outputs than its tree has leaves");
    }
    Py_DECREF(seq);
    return out;
}

/* FastCall(args, kwargs): the Python fast path's protocol (jit tries older signatures this way) */
static PyObject *fastcall_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (kwnames != NULL || nargs != 2 || !PyTuple_Check(args[0]) || !PyDict_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "FastCall(args: tuple, kwargs: dict)");
        return NULL;
    }
    return fastcall_apply((FastCall *)self, args[0], args[1]);
}

static PyObject *fastcall_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    PyObject *pool, *build, *slow, *spec, *out_spec;
    static char *names[] = {"pool", "build", "slow", "spec", "out_spec", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!OOOO:FastCall", names, &PyList_Type, &pool, &build, &slow, &spec, &out_spec))
        return NULL;
    if (!check_spec(spec, 0) || !check_spec(out_spec, 0))
        return NULL;
    FastCall *f = (FastCall *)type->tp_alloc(type, 0);
    if (f == NULL)
        return NULL;
    f->vectorcall = fastcall_vectorcall;
    f->pool = Py_NewRef(pool);
    f->build = Py_NewRef(build);
    f->slow = Py_NewRef(slow);
    f->spec = Py_NewRef(spec);
    f->out_spec = Py_NewRef(out_spec);
    return (PyObject *)f;
}

static int fastcall_traverse(FastCall *f, visitproc visit, void *arg)
{
    Py_VISIT(f->pool);
    Py_VISIT(f->build);
    Py_VISIT(f->slow);
    Py_VISIT(f->spec);
    Py_VISIT(f->out_spec);
    return 0;
}

static int fastcall_clear(FastCall *f)
{
    Py_CLEAR(f->pool);
    Py_CLEAR(f->build);
    Py_CLEAR(f->slow);
    Py_CLEAR(f->spec);
    Py_CLEAR(f->out_spec);
    return 0;
}

static void fastcall_dealloc(FastCall *f)
{
    PyObject_GC_UnTrack(f);
    fastcall_clear(f);
    Py_TYPE(f)->tp_free((PyObject *)f);
}

static PyMemberDef fastcall_members[] = {
    {"pool", T_OBJECT, offsetof(FastCall, pool), READONLY, "the free programs (callables with an arena each)"},
    {"spec", T_OBJECT, offsetof(FastCall, spec), READONLY, "the argument tuple's tree spec"},
    {"out_spec", T_OBJECT, offsetof(FastCall, out_spec), READONLY, "the output tree's spec"},
    {NULL},
};

static PyTypeObject FastCallType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "fedarena.engine._native.FastCall",
    .tp_basicsize = sizeof(FastCall),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "FastCall(pool, build, slow, spec, out_spec): jit's call path of one native signature "
              "(f(args, kwargs) -> outputs, or MISS)",
    .tp_new = fastcall_new,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(FastCall, vectorcall),
    .tp_traverse = (traverseproc)fastcall_traverse,
    .tp_clear = (inquiry)fastcall_clear,
    .tp_dealloc = (destructor)fastcall_dealloc,
    .tp_members = fastcall_members,
};

typedef struct {
    PyObject_HEAD
    PyObject *fast0;
} JitBase;

static PyObject *CALL_SLOW; /* "_call_slow" */

static PyObject *jitbase_call(PyObject *self, PyObject *args, PyObject *kwargs)
{
    /* held for the call: the program (or another thread while it runs) may replace _fast0 */
    PyObject *fast = Py_XNewRef(((JitBase *)self)->fast0), *out;
    if (fast != NULL && Py_IS_TYPE(fast, &FastCallType)) {
        out = fastcall_apply((FastCall *)fast, args, kwargs);
    } else if (fast != NULL) {
        PyObject *kw = kwargs != NULL ? Py_NewRef(kwargs) : PyDict_New();
        PyObject *pair[2] = {args, kw};
        out = kw != NULL ? PyObject_Vectorcall(fast, pair, 2, NULL) : NULL;
        Py_XDECREF(kw);
    } else {
        out = Py_NewRef(MISS);
    }
    Py_XDECREF(fast);
    if (out == NULL)
        return NULL;
    if (out != MISS)
        return out;
    Py_DECREF(out);
    PyObject *slow = PyObject_GetAttr(self, CALL_SLOW);
    if (slow == NULL)
        return NULL;
    out = PyObject_Call(slow, args, kwargs);
    Py_DECREF(slow);
    return out;
}

static int jitbase_traverse(JitBase *j, visitproc visit, void *arg)
{
    Py_VISIT(j->fast0);
    return 0;
}

static int jitbase_clear(JitBase *j)
{
    Py_CLEAR(j->fast0);
    return 0;
}

static void jitbase_dealloc(JitBase *j)
{
    PyObject_GC_UnTrack(j);
    jitbase_clear(j);
    Py_TYPE(j)->tp_free((PyObject *)j);
}

static PyMemberDef jitbase_members[] = {
    {"_fast0", T_OBJECT, offsetof(JitBase, fast0), 0,
     "the newest signature's fast call: f(args, kwargs) -> outputs, or MISS"},
    {NULL},
};

static PyTypeObject JitBaseType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "fedarena.engine._native.JitBase",
    .tp_basicsize = sizeof(JitBase),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "engine.jit's Jitted base: calling it runs self._fast0(args, kwargs), and "
              "self._call_slow(*args, **kwargs) when that answers MISS",
    .tp_new = PyType_GenericNew,
    .tp_call = jitbase_call,
    .tp_traverse = (traverseproc)jitbase_traverse,
    .tp_clear = (inquiry)jitbase_clear,
    .tp_dealloc = (destructor)jitbase_dealloc,
    .tp_members = jitbase_members,
};

static PyMethodDef methods[] = {
    {"leaves", (PyCFunction)(void (*)(void))py_leaves, METH_FASTCALL,
     "leaves(obj, spec) -> list | None: obj's leaves along a tree spec (jit's fast-path argument check)"},
    {"dense", (PyCFunction)(void (*)(void))py_dense, METH_FASTCALL,
     "dense(x, w, b, out, M, K, N, act, double) -> bool: out = x @ w + b (relu if act == 1)"},
    {"tanh", (PyCFunction)(void (*)(void))py_tanh, METH_FASTCALL,
     "tanh(x, out) -> bool: out = tanh(x) for float32 buffers, the engine's float32 tanh (_tanhf.h)"},
    {"softmax", (PyCFunction)(void (*)(void))py_softmax, METH_FASTCALL,
     "softmax(x, out, R, C, double) -> bool: row-wise softmax"},
    {"rowreduce", (PyCFunction)(void (*)(void))py_rowreduce, METH_FASTCALL,
     "rowreduce(x, out, R, C, op, double) -> bool: max (op 0) / min (op 1) of each row"},
    {"elementwise", (PyCFunction)(void (*)(void))py_elementwise, METH_FASTCALL,
     "elementwise(program, consts, modes, bparams, n, double, out, *inputs) -> bool: run a fused program"},
    {"windows", (PyCFunction)(void (*)(void))py_windows, METH_FASTCALL,
     "windows(op, geometry, double, rows, pad, bias, bias_value, out, *inputs) -> bool: im2col / col2im / max pooling"},
    {"philox", (PyCFunction)(void (*)(void))py_philox, METH_FASTCALL,
     "philox(keys, out, nkeys, nwords, top) -> bool: Philox-4x64-10 stream words of many keys"},
    {"random", (PyCFunction)(void (*)(void))py_random, METH_FASTCALL,
     "random(keys, out, nkeys, n, kind, double) -> bool: uniform (kind 0) / normal (kind 1) samples of many keys"},
    {"set_threads", (PyCFunction)py_set_threads, METH_O, "set_threads(n): run large kernels on n threads (_parallel.c)"},
    {"get_threads", (PyCFunction)py_get_threads, METH_NOARGS, "get_threads() -> int: threads of the kernel pool"},
    {"set_blas", (PyCFunction)(void (*)(void))py_set_blas, METH_FASTCALL,
     "set_blas(sgemm, dgemm, set_num_threads_local, ilp64): OpenBLAS functions for gemm"},
    {"gemm", (PyCFunction)(void (*)(void))py_gemm, METH_FASTCALL,
     "gemm(a, b, out) -> bool: out = a @ b split over the kernel pool"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_native", "Native kernels of the numpy backend.", -1, methods};

PyMODINIT_FUNC PyInit__native(void)
{
    if (PyType_Ready(&FastCallType) < 0 || PyType_Ready(&JitBaseType) < 0)
        return NULL;
    for (long i = 0; i < 5; i++)
        if (SMALL[i] == NULL && (SMALL[i] = PyLong_FromLong(i)) == NULL)
            return NULL;
    if (CALL_SLOW == NULL && (CALL_SLOW = PyUnicode_InternFromString("_call_slow")) == NULL)
        return NULL;
    if (MISS == NULL && (MISS = PyObject_CallNoArgs((PyObject *)&PyBaseObject_Type)) == NULL)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "FastCall", (PyObject *)&FastCallType) < 0 ||
        PyModule_AddObjectRef(m, "JitBase", (PyObject *)&JitBaseType) < 0 || PyModule_AddObjectRef(m, "MISS", MISS) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
