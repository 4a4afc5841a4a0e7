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
#include <math.h>
#include <string.h>

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

static PyMethodDef methods[] = {
    {"dense", (PyCFunction)(void (*)(void))py_dense, METH_FASTCALL,
     "dense(x, w, b, out, M, K, N, act, double) -> bool: out = x @ w + b (relu if act == 1)"},
    {"softmax", (PyCFunction)(void (*)(void))py_softmax, METH_FASTCALL,
     "softmax(x, out, R, C, double) -> bool: row-wise softmax"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_native", "Native kernels of the numpy backend.", -1, methods};

PyMODINIT_FUNC PyInit__native(void) { return PyModule_Create(&module); }
