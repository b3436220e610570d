/* logkit._shortio: the append path's short system calls, made without releasing the GIL
 * (logkit/log.py and logkit/segment.py fall back to fcntl.flock and os.pwrite when
 * this is not built).
 *
 * Why: CPython releases the GIL around every system call. When another thread of the
 * process is busy in Python (a producer's sender thread appending while the sending
 * thread sends), each release hands the GIL over and each return waits to get it back:
 * two context switches per call, several calls per append. The calls here never block
 * for long — a non-blocking flock, an unlock, a pwrite of at most HELD_WRITE_MAX bytes
 * into the page cache — so they run with the GIL held, as a store through an mmap
 * does. A larger write releases the GIL as os.pwrite does.
 *
 * Invariant: the same results and errors as the Python calls they replace — bytes
 * written (short writes are the caller's to check), OSError with errno (EWOULDBLOCK is
 * BlockingIOError), EINTR retried after running signal handlers (an exception from a
 * handler propagates). flock() refuses a blocking LOCK_EX: a wait must not hold the
 * GIL.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <sys/file.h>
#include <unistd.h>

#define HELD_WRITE_MAX (256 * 1024)

PyDoc_STRVAR(pwrite_doc,
"pwrite(fd, data, offset) -> int\n\n"
"os.pwrite; the GIL is kept for writes of at most 256 KiB.");

static PyObject *
shortio_pwrite(PyObject *self, PyObject *args)
{
    int fd;
    Py_buffer data;
    long long offset;
    if (!PyArg_ParseTuple(args, "iy*L:pwrite", &fd, &data, &offset))
        return NULL;
    if (offset < 0) {
        PyBuffer_Release(&data);
        errno = EINVAL;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    ssize_t written;
    for (;;) {
        if (data.len <= HELD_WRITE_MAX) {
            written = pwrite(fd, data.buf, (size_t)data.len, (off_t)offset);
        } else {
            Py_BEGIN_ALLOW_THREADS
            written = pwrite(fd, data.buf, (size_t)data.len, (off_t)offset);
            Py_END_ALLOW_THREADS
        }
        if (written >= 0 || errno != EINTR)
            break;
        if (PyErr_CheckSignals() < 0) {
            PyBuffer_Release(&data);
            return NULL;
        }
    }
    PyBuffer_Release(&data);
    if (written < 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    return PyLong_FromSsize_t(written);
}

PyDoc_STRVAR(flock_doc,
"flock(fd, operation) -> None\n\n"
"fcntl.flock for LOCK_UN or a non-blocking LOCK_EX/LOCK_SH (with LOCK_NB); the GIL\n"
"is kept. A blocking lock request raises ValueError.");

static PyObject *
shortio_flock(PyObject *self, PyObject *args)
{
    int fd, operation;
    if (!PyArg_ParseTuple(args, "ii:flock", &fd, &operation))
        return NULL;
    if (operation != LOCK_UN && !(operation & LOCK_NB)) {
        PyErr_SetString(PyExc_ValueError, "flock: a lock request must be non-blocking "
                        "(LOCK_NB): a wait must not hold the GIL");
        return NULL;
    }
    for (;;) {
        if (flock(fd, operation) == 0)
            Py_RETURN_NONE;
        if (errno != EINTR)
            return PyErr_SetFromErrno(PyExc_OSError);
        if (PyErr_CheckSignals() < 0)
            return NULL;
    }
}

static PyMethodDef methods[] = {
    {"pwrite", shortio_pwrite, METH_VARARGS, pwrite_doc},
    {"flock", shortio_flock, METH_VARARGS, flock_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "logkit._shortio",
    "The append path's short system calls, made without releasing the GIL.", -1, methods,
};

PyMODINIT_FUNC
PyInit__shortio(void)
{
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddIntConstant(m, "HELD_WRITE_MAX", HELD_WRITE_MAX) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
