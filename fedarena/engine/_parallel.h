/* The numpy backend's thread pool and the kernels split over it (_parallel.c). */
#ifndef FEDARENA_PARALLEL_H
#define FEDARENA_PARALLEL_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* One chunk of a parallel kernel: chunk `part` of `nparts`, on any thread of the pool. */
typedef void (*par_task)(void *arg, int part, int nparts);

/* Threads a parallel call may use now: 1 + the pool's workers (1 when no pool is running). */
int par_threads(void);

/* Run chunks 0 .. nchunks-1 of `fn` (at most 65535) on the calling thread and whichever workers
 * claim them, and return when all are done.  Call it without the GIL.  If another thread is using
 * the pool, every chunk runs on the caller. */
void par_run(par_task fn, void *arg, int nchunks);

PyObject *py_set_threads(PyObject *self, PyObject *arg);
PyObject *py_get_threads(PyObject *self, PyObject *unused);
PyObject *py_set_blas(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *py_gemm(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

#endif
