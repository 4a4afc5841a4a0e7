/* The numpy backend's thread pool, and matrix products split over it.
 *
 * With `engine.set_num_threads(n)`, n > 1, the engine runs its large kernels on n threads of its
 * own: the calling thread and n - 1 workers started here.  One pool for every kernel is what
 * PyTorch does with OpenMP; it matters on a machine with few cores.  numpy's OpenBLAS keeps a
 * pool of its own whose idle threads spin for a while after every product, so a second pool
 * running an elementwise kernel between two products would fight them for the same cores.
 * Instead the engine makes its large products itself: each thread multiplies one block of rows
 * (or columns) of the result with OpenBLAS limited to one thread for that call
 * (`openblas_set_num_threads_local`), and OpenBLAS's own pool stays asleep.  On the two cores of
 * the development machine the blocks are also faster than OpenBLAS's two-thread partitioning for
 * the thin products of a training step (`python benchmarks/engine_threads.py`, two runs: 1.05x-1.47x
 * over the five products of an MLP 784-512-512-10 step at batch 128; a (512,128) @ (128,512)
 * product takes 314-329 us on OpenBLAS's two threads and 214-232 us as two blocks of rows).
 *
 * Workers spin for PAR_SPIN_S after a task (the next kernel of a training step comes within
 * microseconds) and then sleep on a condition variable.  A fork leaves the child without
 * workers; the pool then runs everything on the calling thread until set_threads is called.
 */
#include "_parallel.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#define PAR_MAX 64
#define PAR_SPIN_S 2e-4

#if defined(__x86_64__) || defined(__i386__)
#define CPU_RELAX() __builtin_ia32_pause()
#else
#define CPU_RELAX() ((void)0)
#endif

static struct {
    pthread_mutex_t run; /* held by the thread using the pool */
    pthread_mutex_t mu;  /* guards sleeping workers' wait */
    pthread_cond_t wake;
    int nworkers;
    pthread_t tid[PAR_MAX];
    /* the current task: generation << 32 | chunks << 16 | next unclaimed chunk.  A thread owns a
     * chunk by advancing `next` with a compare-and-swap, so a worker that wakes late (or not at
     * all, on a loaded machine) never holds up the caller, which claims what is left itself. */
    atomic_ullong ticket;
    atomic_int done; /* chunks of the current task finished */
    atomic_int sleepers;
    atomic_int stop;
    par_task fn;
    void *arg;
} P = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER};

#define T_GEN(t) ((t) >> 32)
#define T_CHUNKS(t) ((int)(((t) >> 16) & 0xffff))
#define T_NEXT(t) ((int)((t) & 0xffff))
#define HAS_WORK(t) (T_NEXT(t) < T_CHUNKS(t))

static _Thread_local int on_worker;
static int atfork_registered;

/* OpenBLAS (numpy's), set by set_blas: cblas_{s,d}gemm with 64- or 32-bit integers, and the
 * per-thread thread count */
static void *blas_sgemm, *blas_dgemm;
static int blas_ilp64;
static int (*blas_local_threads)(int);

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

/* Claim and run chunks of the current task until none is left unclaimed.  The task's fn and arg
 * stay valid while a chunk of it is claimed and not done: its caller waits for every chunk. */
static void run_chunks(void)
{
    unsigned long long t = atomic_load_explicit(&P.ticket, memory_order_acquire);
    while (HAS_WORK(t)) {
        if (atomic_compare_exchange_weak_explicit(&P.ticket, &t, t + 1, memory_order_acq_rel, memory_order_acquire)) {
            P.fn(P.arg, T_NEXT(t), T_CHUNKS(t));
            atomic_fetch_add_explicit(&P.done, 1, memory_order_release);
            t = atomic_load_explicit(&P.ticket, memory_order_acquire);
        }
    }
}

static void *worker_main(void *unused)
{
    on_worker = 1;
    for (;;) {
        double t0 = 0;
        int spins = 0;
        while (!HAS_WORK(atomic_load_explicit(&P.ticket, memory_order_acquire)) && !atomic_load(&P.stop)) {
            CPU_RELAX();
            if (++spins < 256)
                continue;
            spins = 0;
            sched_yield(); /* a loaded machine: let another runnable thread have this core */
            double t = now_s();
            if (t0 == 0) {
                t0 = t;
            } else if (t - t0 > PAR_SPIN_S) {
                pthread_mutex_lock(&P.mu);
                atomic_fetch_add(&P.sleepers, 1);
                while (!HAS_WORK(atomic_load(&P.ticket)) && !atomic_load(&P.stop))
                    pthread_cond_wait(&P.wake, &P.mu);
                atomic_fetch_sub(&P.sleepers, 1);
                pthread_mutex_unlock(&P.mu);
                t0 = 0;
            }
        }
        if (atomic_load(&P.stop))
            return NULL;
        run_chunks();
    }
}

static void wake_sleepers(void)
{
    if (atomic_load(&P.sleepers) > 0) { /* ordered after the ticket store (both sequentially consistent) */
        pthread_mutex_lock(&P.mu);
        pthread_cond_broadcast(&P.wake);
        pthread_mutex_unlock(&P.mu);
    }
}

static void stop_workers(void)
{
    if (P.nworkers == 0)
        return;
    atomic_store(&P.stop, 1);
    pthread_mutex_lock(&P.mu);
    pthread_cond_broadcast(&P.wake);
    pthread_mutex_unlock(&P.mu);
    for (int k = 0; k < P.nworkers; k++)
        pthread_join(P.tid[k], NULL);
    P.nworkers = 0;
    atomic_store(&P.stop, 0);
}

static void before_fork(void) { pthread_mutex_lock(&P.run); }
static void after_fork_parent(void) { pthread_mutex_unlock(&P.run); }
static void after_fork_child(void)
{
    /* the workers did not survive the fork; start over with none */
    pthread_mutex_init(&P.run, NULL);
    pthread_mutex_init(&P.mu, NULL);
    pthread_cond_init(&P.wake, NULL);
    P.nworkers = 0;
    atomic_store(&P.sleepers, 0);
    atomic_store(&P.stop, 0);
}

int par_threads(void) { return 1 + P.nworkers; }

void par_run(par_task fn, void *arg, int nchunks)
{
    if (nchunks > 0xffff)
        nchunks = 0xffff;
    if (nchunks <= 1 || P.nworkers == 0 || pthread_mutex_trylock(&P.run) != 0) {
        for (int k = 0; k < nchunks; k++)
            fn(arg, k, nchunks);
        return;
    }
    P.fn = fn;
    P.arg = arg;
    atomic_store(&P.done, 0);
    unsigned long long gen = T_GEN(atomic_load(&P.ticket)) + 1;
    atomic_store(&P.ticket, (gen << 32) | ((unsigned long long)nchunks << 16));
    wake_sleepers();
    run_chunks();
    for (int spins = 0; atomic_load_explicit(&P.done, memory_order_acquire) < nchunks; spins++) {
        CPU_RELAX();
        if (spins > 4096)
            sched_yield(); /* a worker holding a chunk was descheduled */
    }
    pthread_mutex_unlock(&P.run);
}

/* set_threads(n): the pool runs kernels on n threads (the caller and n - 1 workers) */
PyObject *py_set_threads(PyObject *self, PyObject *arg)
{
    long n = PyLong_AsLong(arg);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    if (n < 1 || n > PAR_MAX) {
        PyErr_Format(PyExc_ValueError, "set_threads: number of threads must be in 1..%d, got %ld", PAR_MAX, n);
        return NULL;
    }
    if (!atfork_registered) {
        if (pthread_atfork(before_fork, after_fork_parent, after_fork_child) != 0) {
            PyErr_SetString(PyExc_RuntimeError, "set_threads: pthread_atfork failed");
            return NULL;
        }
        atfork_registered = 1;
    }
    if (n - 1 == P.nworkers)
        Py_RETURN_NONE;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&P.run);
    stop_workers();
    Py_END_ALLOW_THREADS
    int started = 0;
    for (long k = 1; k < n; k++) {
        if (pthread_create(&P.tid[started], NULL, worker_main, NULL) != 0)
            break;
        started++;
    }
    P.nworkers = started;
    pthread_mutex_unlock(&P.run);
    if (started != n - 1) {
        PyErr_Format(PyExc_RuntimeError, "set_threads: started %d of %ld worker threads", started, n - 1);
        return NULL;
    }
    Py_RETURN_NONE;
}

PyObject *py_get_threads(PyObject *self, PyObject *unused) { return PyLong_FromLong(par_threads()); }

/* set_blas(sgemm, dgemm, set_num_threads_local, ilp64): addresses of OpenBLAS's functions (0: none) */
PyObject *py_set_blas(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "set_blas(sgemm, dgemm, set_num_threads_local, ilp64)");
        return NULL;
    }
    void *ptr[3];
    for (int k = 0; k < 3; k++) {
        ptr[k] = PyLong_AsVoidPtr(args[k]);
        if (ptr[k] == NULL && PyErr_Occurred())
            return NULL;
    }
    int ilp64 = PyObject_IsTrue(args[3]);
    if (ilp64 < 0)
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&P.run); /* not while a product runs */
    Py_END_ALLOW_THREADS
    blas_sgemm = ptr[0];
    blas_dgemm = ptr[1];
    blas_local_threads = (int (*)(int))ptr[2];
    blas_ilp64 = ilp64;
    pthread_mutex_unlock(&P.run);
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------------------------------
 * gemm(a, b, out) -> bool: out = a @ b for 2-D float32/float64 operands, each C-ordered or the
 * transpose of a C-ordered matrix (row stride >= width), split over the pool into blocks of the
 * longer side of the result.  False (nothing written) when the pool has one thread, OpenBLAS's
 * functions are not known, or the operands are not such matrices; the caller then uses np.dot.
 * ------------------------------------------------------------------------------------------ */
enum { ROW_MAJOR = 101, NO_TRANS = 111, TRANS = 112 };

typedef void (*sgemm64_t)(int, int, int, long long, long long, long long, float, const float *, long long,
                          const float *, long long, float, float *, long long);
typedef void (*dgemm64_t)(int, int, int, long long, long long, long long, double, const double *, long long,
                          const double *, long long, double, double *, long long);
typedef void (*sgemm32_t)(int, int, int, int, int, int, float, const float *, int, const float *, int, float,
                          float *, int);
typedef void (*dgemm32_t)(int, int, int, int, int, int, double, const double *, int, const double *, int, double,
                          double *, int);

typedef struct {
    int dbl, ta, tb, split_n;
    Py_ssize_t M, N, K, lda, ldb, ldc, item;
    const char *A, *B;
    char *C;
} gemm_job;

#define GEMM_ALIGN 16 /* block boundaries on multiples of 16 columns / rows */

static void gemm_part(void *p, int part, int nparts)
{
    const gemm_job *j = (const gemm_job *)p;
    const Py_ssize_t D = j->split_n ? j->N : j->M;
    Py_ssize_t lo = (D * part / nparts) / GEMM_ALIGN * GEMM_ALIGN;
    Py_ssize_t hi = part == nparts - 1 ? D : (D * (part + 1) / nparts) / GEMM_ALIGN * GEMM_ALIGN;
    if (hi <= lo)
        return;
    const char *A = j->A, *B = j->B;
    char *C = j->C;
    Py_ssize_t M = j->M, N = j->N;
    if (j->split_n) {
        B += (j->tb == NO_TRANS ? lo : lo * j->ldb) * j->item;
        C += lo * j->item;
        N = hi - lo;
    } else {
        A += (j->ta == NO_TRANS ? lo * j->lda : lo) * j->item;
        C += lo * j->ldc * j->item;
        M = hi - lo;
    }
    if (blas_local_threads)
        blas_local_threads(1);
    if (blas_ilp64) {
        if (j->dbl)
            ((dgemm64_t)blas_dgemm)(ROW_MAJOR, j->ta, j->tb, M, N, j->K, 1.0, (const double *)A, j->lda,
                                    (const double *)B, j->ldb, 0.0, (double *)C, j->ldc);
        else
            ((sgemm64_t)blas_sgemm)(ROW_MAJOR, j->ta, j->tb, M, N, j->K, 1.0f, (const float *)A, j->lda,
                                    (const float *)B, j->ldb, 0.0f, (float *)C, j->ldc);
    } else {
        if (j->dbl)
            ((dgemm32_t)blas_dgemm)(ROW_MAJOR, j->ta, j->tb, (int)M, (int)N, (int)j->K, 1.0, (const double *)A,
                                    (int)j->lda, (const double *)B, (int)j->ldb, 0.0, (double *)C, (int)j->ldc);
        else
            ((sgemm32_t)blas_sgemm)(ROW_MAJOR, j->ta, j->tb, (int)M, (int)N, (int)j->K, 1.0f, (const float *)A,
                                    (int)j->lda, (const float *)B, (int)j->ldb, 0.0f, (float *)C, (int)j->ldc);
    }
    if (blas_local_threads && !on_worker)
        blas_local_threads(0); /* the caller's later numpy calls use OpenBLAS's global count again */
}

/* A (rows, cols) view as a BLAS operand: C-ordered (trans NO_TRANS) or the transpose of a
 * C-ordered matrix (TRANS); its leading dimension in elements.  0 if it is neither. */
static int blas_layout(const Py_buffer *v, Py_ssize_t item, int *trans, Py_ssize_t *ld)
{
    const Py_ssize_t rows = v->shape[0], cols = v->shape[1], s0 = v->strides[0], s1 = v->strides[1];
    if (s1 == item && s0 > 0 && s0 % item == 0 && s0 / item >= cols) {
        *trans = NO_TRANS;
        *ld = s0 / item;
        return 1;
    }
    if (s0 == item && s1 > 0 && s1 % item == 0 && s1 / item >= rows) {
        *trans = TRANS;
        *ld = s1 / item;
        return 1;
    }
    return 0;
}

static void extent(const Py_buffer *v, const char **lo, const char **hi)
{
    *lo = (const char *)v->buf;
    *hi = *lo + (v->shape[0] - 1) * v->strides[0] + (v->shape[1] - 1) * v->strides[1] + v->itemsize;
}

static int overlaps(const Py_buffer *a, const Py_buffer *b)
{
    const char *alo, *ahi, *blo, *bhi;
    extent(a, &alo, &ahi);
    extent(b, &blo, &bhi);
    return alo < bhi && blo < ahi;
}

PyObject *py_gemm(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "gemm(a, b, out)");
        return NULL;
    }
    if (P.nworkers == 0 || blas_sgemm == NULL || blas_dgemm == NULL)
        Py_RETURN_FALSE;
    Py_buffer v[3];
    int got = 0, ok = 0;
    for (; got < 3; got++) {
        int flags = PyBUF_STRIDES | PyBUF_FORMAT | (got == 2 ? PyBUF_WRITABLE : 0);
        if (PyObject_GetBuffer(args[got], &v[got], flags) != 0) {
            PyErr_Clear();
            break;
        }
    }
    gemm_job j;
    if (got == 3 && v[0].ndim == 2 && v[1].ndim == 2 && v[2].ndim == 2 && v[0].format && v[1].format && v[2].format) {
        const char f = v[0].format[0];
        j.dbl = f == 'd';
        j.item = j.dbl ? sizeof(double) : sizeof(float);
        j.M = v[0].shape[0];
        j.K = v[0].shape[1];
        j.N = v[1].shape[1];
        int tc;
        ok = (f == 'f' || f == 'd') && v[0].format[1] == 0 && strcmp(v[1].format, v[0].format) == 0 &&
             strcmp(v[2].format, v[0].format) == 0 && v[0].itemsize == j.item && v[1].itemsize == j.item &&
             v[2].itemsize == j.item && v[1].shape[0] == j.K && v[2].shape[0] == j.M && v[2].shape[1] == j.N &&
             j.M >= 2 && j.N >= 2 && j.K >= 2 && blas_layout(&v[0], j.item, &j.ta, &j.lda) &&
             blas_layout(&v[1], j.item, &j.tb, &j.ldb) && blas_layout(&v[2], j.item, &tc, &j.ldc) &&
             tc == NO_TRANS && !overlaps(&v[2], &v[0]) && !overlaps(&v[2], &v[1]);
    }
    if (ok) {
        j.A = (const char *)v[0].buf;
        j.B = (const char *)v[1].buf;
        j.C = (char *)v[2].buf;
        /* blocks of rows, so the threads share the packed right-hand side (on the development
         * machine, 245 us against 289 us for blocks of columns for (512,128) @ (128,512) on two
         * threads); blocks of columns when there are too few rows */
        int nparts = par_threads();
        j.split_n = j.M < 32 * nparts && j.N > j.M;
        Py_ssize_t D = j.split_n ? j.N : j.M;
        while (nparts > 1 && D / nparts < GEMM_ALIGN)
            nparts--;
        Py_BEGIN_ALLOW_THREADS
        par_run(gemm_part, &j, nparts);
        Py_END_ALLOW_THREADS
    }
    for (int k = 0; k < got; k++)
        PyBuffer_Release(&v[k]);
    if (ok)
        Py_RETURN_TRUE;
    Py_RETURN_FALSE;
}
