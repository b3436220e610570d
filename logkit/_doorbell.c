/* logkit._doorbell: the doorbell's futex calls in C (logkit/notify.py keeps a ctypes
 * path as the fallback when this is not built).
 *
 * Owns: ringing (an atomic increment of a 32-bit word in a shared mapping, then
 * FUTEX_WAKE of every waiter) and waiting (a bounded spin on the word, then FUTEX_WAIT
 * with a timeout), each without the GIL and without ctypes' per-call argument
 * conversion. The word is named by a writable buffer (the doorbell's mmap) and a byte
 * offset; the buffer is held for the whole call, which pins the mapping: mmap.close()
 * refuses while a buffer is exported, so a close racing a wait cannot unmap the page
 * under it.
 *
 * Invariant: wait() never blocks longer than its timeout and never spins longer than
 * its spin bound; both are checked against CLOCK_MONOTONIC. The futex is the shared
 * (not FUTEX_PRIVATE) kind: waiters and ringers are different processes.
 */

#define PY_SSIZE_T_CLEAN
#define _GNU_SOURCE
#include <Python.h>

#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>

#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#define HAVE_FUTEX 1
#else
#define HAVE_FUTEX 0
#endif

#if defined(__x86_64__) || defined(__i386__)
#define CPU_RELAX() __builtin_ia32_pause()
#elif defined(__aarch64__)
#define CPU_RELAX() __asm__ __volatile__("yield" ::: "memory")
#else
#define CPU_RELAX() do { } while (0)
#endif

/* Spin iterations between two clock reads (a clock read costs ~20 ns through the vDSO). */
#define SPIN_CHECK_EVERY 64

static uint32_t *
word_at(Py_buffer *view, Py_ssize_t offset)
{
    if (offset < 0 || offset % 4 != 0 || offset + 4 > view->len) {
        PyErr_Format(PyExc_ValueError,
                     "doorbell word offset %zd is outside the %zd-byte buffer or not "
                     "4-byte aligned", offset, view->len);
        return NULL;
    }
    return (uint32_t *)((char *)view->buf + offset);
}

static double
monotonic_s(void)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)now.tv_sec + (double)now.tv_nsec * 1e-9;
}

PyDoc_STRVAR(ring_doc,
"ring(buffer, offset) -> None\n\n"
"Atomically add one to the 32-bit word at `offset` of the writable `buffer` and wake\n"
"every process waiting on it.");

static PyObject *
doorbell_ring(PyObject *module, PyObject *args)
{
    Py_buffer view;
    Py_ssize_t offset;
    if (!PyArg_ParseTuple(args, "w*n:ring", &view, &offset))
        return NULL;
    uint32_t *word = word_at(&view, offset);
    if (word == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    __atomic_add_fetch(word, 1, __ATOMIC_SEQ_CST);
#if HAVE_FUTEX
    syscall(SYS_futex, word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
#endif
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(wait_doc,
"wait(buffer, offset, seen, timeout_s, spin_s) -> int\n\n"
"Return the word at `offset` once it differs from `seen`: first spinning on it for at\n"
"most spin_s seconds, then sleeping on the futex for what is left of timeout_s (a\n"
"wake-up may come early: callers check the word and loop). Returns the word's value.\n"
"The GIL is released for the spin and the sleep.");

static PyObject *
doorbell_wait(PyObject *module, PyObject *args)
{
    Py_buffer view;
    Py_ssize_t offset;
    unsigned int seen;
    double timeout_s, spin_s;
    if (!PyArg_ParseTuple(args, "w*nIdd:wait", &view, &offset, &seen, &timeout_s,
                          &spin_s))
        return NULL;
    uint32_t *word = word_at(&view, offset);
    if (word == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    uint32_t value;
    int interrupted = 0;
    Py_BEGIN_ALLOW_THREADS
    double start = monotonic_s();
    if (spin_s > timeout_s)
        spin_s = timeout_s;
    value = __atomic_load_n(word, __ATOMIC_ACQUIRE);
    if (value == seen && spin_s > 0) {
        double spin_end = start + spin_s;
        for (unsigned long i = 1;; i++) {
            CPU_RELAX();
            value = __atomic_load_n(word, __ATOMIC_ACQUIRE);
            if (value != seen)
                break;
            if (i % SPIN_CHECK_EVERY == 0 && monotonic_s() >= spin_end)
                break;
        }
    }
    if (value == seen && timeout_s > 0) {
        double left = start + timeout_s - monotonic_s();
        if (left > 0) {
#if HAVE_FUTEX
            struct timespec spec;
            spec.tv_sec = (time_t)left;
            spec.tv_nsec = (long)((left - (double)spec.tv_sec) * 1e9);
            if (syscall(SYS_futex, word, FUTEX_WAIT, seen, &spec, NULL, 0) != 0
                    && errno == EINTR)
                interrupted = 1;
#else
            struct timespec spec = {0, 200000};     /* no futex: a short sleep */
            if (left < 0.0002)
                spec.tv_nsec = (long)(left * 1e9);
            nanosleep(&spec, NULL);
#endif
        }
        value = __atomic_load_n(word, __ATOMIC_ACQUIRE);
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    if (interrupted && PyErr_CheckSignals() < 0)
        return NULL;                       /* a signal handler raised (Ctrl-C) */
    return PyLong_FromUnsignedLong(value);
}

static PyMethodDef methods[] = {
    {"ring", doorbell_ring, METH_VARARGS, ring_doc},
    {"wait", doorbell_wait, METH_VARARGS, wait_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "logkit._doorbell",
    "The doorbell's futex wait (with a bounded spin) and wake, in C.", -1, methods,
};

PyMODINIT_FUNC
PyInit__doorbell(void)
{
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddIntConstant(m, "HAVE_FUTEX", HAVE_FUTEX) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
