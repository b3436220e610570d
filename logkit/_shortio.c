/* logkit._shortio: the append path in C — its short system calls made without releasing
 * the GIL, and the common append under the partition lock in one call (logkit/log.py
 * and logkit/segment.py fall back to fcntl.flock, os.pwrite and their Python append
 * when this is not built).
 *
 * Why: CPython releases the GIL around every system call. When another thread of the
 * process is busy in Python (a producer's sender thread appending while the sending
 * thread sends), each release hands the GIL over and each return waits to get it back:
 * two context switches per call, several calls per append. The calls here never block
 * for long — a non-blocking flock, an unlock, a pwrite of at most HELD_WRITE_MAX bytes
 * into the page cache — so they run with the GIL held, as a store through an mmap
 * does. A larger write releases the GIL as os.pwrite does.
 *
 * append_common() is the partition log's append after the lock is taken, for the case
 * that needs no decision (no roll, no sync, no index reservation, no repair): read the
 * tail, stamp the batch, write it, add its index entries, publish the new tail. It is
 * the twin of PartitionLog._append_locked (logkit/log.py) for that case and returns -1,
 * having changed nothing, for every other case, which the Python code then handles.
 * Its layouts are tail.py's (the tail file), index.py's (the two indexes) and
 * records.py's (the batch header); tests/test_append_common.py holds the two paths to
 * the same bytes.
 *
 * Invariant: the same results and errors as the Python calls they replace — bytes
 * written (short writes are the caller's to check), OSError with errno (EWOULDBLOCK is
 * BlockingIOError), EINTR retried after running signal handlers (an exception from a
 * handler propagates). flock() refuses a blocking LOCK_EX: a wait must not hold the
 * GIL. append_common() publishes nothing unless the batch was written whole: on a
 * failed or short write it raises OSError with the tail and indexes untouched (the
 * caller cuts the file back, as after the Python write).
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <sys/file.h>
#include <time.h>
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

/* ---- append_common ------------------------------------------------------------------ */

/* The tail file (tail.py): magic "LKT1" and version 1, the sequence number at 8, then
 * the body: the boot id (16 bytes) and seventeen little-endian 64-bit fields. */
#define TAIL_SEQ 8
#define TAIL_BOOT 16
#define TAIL_FIELD(n) (32 + 8 * (n))
enum {
    T_LOG_START, T_LOG_END, T_ACTIVE_BASE, T_ACTIVE_SIZE, T_INDEX_ENTRIES,
    T_TIMEINDEX_ENTRIES, T_SEGMENTS_VERSION, T_HIGH_WATERMARK, T_MAX_TS, T_MAX_TS_OFFSET,
    T_RECOVERY_POINT, T_ROLL_TIME, T_CLEAN, T_UNFLUSHED, T_FIRST_UNFLUSHED, T_LEADER_EPOCH,
    T_DELETED, T_FIELDS
};
#define TAIL_END TAIL_FIELD(T_FIELDS)

/* The record batch v2 header (records.py): big-endian. */
#define B_BASE_OFFSET 0
#define B_LENGTH 8
#define B_LEADER_EPOCH 12
#define B_LAST_OFFSET_DELTA 23
#define B_MAX_TIMESTAMP 35
#define B_HEADER 61
#define LOG_OVERHEAD 12

#define OFFSET_ENTRY 8          /* index.py: relative offset int32, position int32 */
#define TIME_ENTRY 12           /* timestamp int64, relative offset int32 */
#define FALLBACK (-1)

static uint32_t
be32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static uint64_t
be64(const unsigned char *p)
{
    return (uint64_t)be32(p) << 32 | be32(p + 4);
}

static void
put_be32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

static void
put_be64(unsigned char *p, uint64_t v)
{
    put_be32(p, (uint32_t)(v >> 32));
    put_be32(p + 4, (uint32_t)v);
}

static int64_t
now_ms(void)
{
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    return (int64_t)now.tv_sec * 1000 + now.tv_nsec / 1000000;
}

/* Decide, write and publish one append (see the module comment). Returns the base
 * offset, FALLBACK when the Python append must decide, or -2 with OSError set. */
static long long
append_locked(unsigned char *tail, Py_ssize_t tail_len, unsigned char *batch,
              Py_ssize_t batch_len, int fd, unsigned char *oidx, Py_ssize_t oidx_len,
              Py_ssize_t oreserved, unsigned char *tidx, Py_ssize_t tidx_len,
              Py_ssize_t treserved, long long active_base, unsigned long long version,
              const char *boot_id, long long segment_bytes, long long segment_ms,
              long long interval_bytes, long long flush_messages)
{
    int64_t t[T_FIELDS];
    uint64_t seq;
#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
    return FALLBACK;                                /* the tail's fields are read in place */
#endif
    if (tail_len < TAIL_END || batch_len < B_HEADER || batch_len > HELD_WRITE_MAX)
        return FALLBACK;
    if (memcmp(tail, "LKT1\x01\0\0\0", 8) != 0)
        return FALLBACK;                            /* invalid: recovery decides */
    memcpy(&seq, tail + TAIL_SEQ, 8);
    if (seq & 1)
        return FALLBACK;                            /* torn by a dead writer */
    memcpy(t, tail + TAIL_FIELD(0), sizeof t);
    if (t[T_DELETED] || (uint64_t)t[T_SEGMENTS_VERSION] != version
            || t[T_ACTIVE_BASE] != active_base)
        return FALLBACK;                            /* another segment list */

    int64_t size = (int64_t)(int32_t)be32(batch + B_LENGTH) + LOG_OVERHEAD;
    if (size != batch_len)
        return FALLBACK;
    int64_t count = (int64_t)(int32_t)be32(batch + B_LAST_OFFSET_DELTA) + 1;
    int64_t batch_max_ts = (int64_t)be64(batch + B_MAX_TIMESTAMP);
    int64_t ocap = oidx_len / OFFSET_ENTRY, tcap = tidx_len / TIME_ENTRY;
    int64_t entries = t[T_INDEX_ENTRIES], time_entries = t[T_TIMEINDEX_ENTRIES];
    int64_t position = t[T_ACTIVE_SIZE], base = t[T_LOG_END];
    if (count < 1 || entries < 0 || entries > ocap || time_entries < 0
            || time_entries > tcap || position < 0)
        return FALLBACK;
    int64_t now = now_ms();
    if (position > 0 && (position + size > segment_bytes || entries >= ocap
                         || time_entries >= tcap || now - t[T_ROLL_TIME] > segment_ms
                         || base + count - active_base >= ((int64_t)1 << 31)))
        return FALLBACK;                            /* a roll */
    if (t[T_UNFLUSHED] + count >= flush_messages)
        return FALLBACK;                            /* a sync */

    int64_t last = base + count - 1;
    int64_t max_ts = t[T_MAX_TS], max_ts_offset = t[T_MAX_TS_OFFSET];
    if (batch_max_ts > max_ts) {
        max_ts = batch_max_ts;
        max_ts_offset = last;
    }
    /* Index entries, Kafka's way (segment.py index_batch): every interval_bytes, an
     * offset entry for this batch and a time entry for the max timestamp if it grew. */
    int add_offset = 0, add_time = 0;
    int64_t last_position = entries ? (int64_t)be32(oidx + (entries - 1) * OFFSET_ENTRY + 4)
                                    : 0;
    int64_t relative = last - active_base, time_relative = max_ts_offset - active_base;
    if (entries < ocap && position - last_position > interval_bytes) {
        if (relative < 0 || relative >= ((int64_t)1 << 31) || position >= ((int64_t)1 << 31))
            return FALLBACK;
        if (entries && relative <= (int64_t)(int32_t)be32(oidx + (entries - 1) * OFFSET_ENTRY))
            return FALLBACK;                        /* the Python path names the fault */
        if ((entries + 1) * OFFSET_ENTRY > oreserved)
            return FALLBACK;                        /* blocks to reserve first */
        add_offset = 1;
        add_time = time_entries < tcap;
        if (time_entries) {
            const unsigned char *e = tidx + (time_entries - 1) * TIME_ENTRY;
            if (max_ts <= (int64_t)be64(e) || time_relative <= (int64_t)(int32_t)be32(e + 8))
                add_time = 0;                       /* not newer: nothing to index */
        }
        if (add_time && (time_entries + 1) * TIME_ENTRY > treserved)
            return FALLBACK;
    }

    /* Stamp (outside the CRC), then write the whole batch at the committed end. */
    put_be64(batch + B_BASE_OFFSET, (uint64_t)base);
    put_be32(batch + B_LEADER_EPOCH, (uint32_t)(int32_t)t[T_LEADER_EPOCH]);
    ssize_t written;
    for (;;) {
        written = pwrite(fd, batch, (size_t)size, (off_t)position);
        if (written >= 0 || errno != EINTR)
            break;
        if (PyErr_CheckSignals() < 0)
            return -2;
    }
    if (written < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -2;
    }
    if (written != size) {              /* a short write to a regular file: disk full */
        PyObject *message = PyUnicode_FromFormat("short write (%zd of %zd bytes)",
                                                 written, (Py_ssize_t)size);
        if (message == NULL)
            return -2;
        PyObject *exc = PyObject_CallFunction(PyExc_OSError, "iO", ENOSPC, message);
        Py_DECREF(message);
        if (exc != NULL) {
            PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
            Py_DECREF(exc);
        }
        return -2;
    }

    if (add_offset) {
        put_be32(oidx + entries * OFFSET_ENTRY, (uint32_t)relative);
        put_be32(oidx + entries * OFFSET_ENTRY + 4, (uint32_t)position);
        entries++;
        if (add_time) {
            put_be64(tidx + time_entries * TIME_ENTRY, (uint64_t)max_ts);
            put_be32(tidx + time_entries * TIME_ENTRY + 8, (uint32_t)time_relative);
            time_entries++;
        }
    }

    /* The new tail, field for field as _append_locked builds it (no sync: the high
     * watermark follows, the recovery point stays). */
    t[T_LOG_END] = last + 1;
    t[T_ACTIVE_SIZE] = position + size;
    t[T_INDEX_ENTRIES] = entries;
    t[T_TIMEINDEX_ENTRIES] = time_entries;
    t[T_HIGH_WATERMARK] = last + 1;
    t[T_MAX_TS] = max_ts;
    t[T_MAX_TS_OFFSET] = max_ts_offset;
    if (t[T_ROLL_TIME] < 0)
        t[T_ROLL_TIME] = now;
    t[T_CLEAN] = 0;
    t[T_UNFLUSHED] += count;
    if (t[T_FIRST_UNFLUSHED] < 0)
        t[T_FIRST_UNFLUSHED] = now;
    /* Publish under the seqlock: odd, the body, even; readers retry while odd. */
    __atomic_store_n((uint64_t *)(tail + TAIL_SEQ), seq + 1, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    memcpy(tail + TAIL_BOOT, boot_id, 16);
    memcpy(tail + TAIL_FIELD(0), t, sizeof t);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    __atomic_store_n((uint64_t *)(tail + TAIL_SEQ), seq + 2, __ATOMIC_RELAXED);
    return base;
}

PyDoc_STRVAR(append_common_doc,
"append_common(tail, batch, fd, index, index_reserved, timeindex, timeindex_reserved,\n"
"              active_base, segments_version, boot_id, segment_bytes, segment_ms,\n"
"              index_interval_bytes, flush_messages) -> int\n\n"
"The partition log's common append, under its lock: the base offset the batch was\n"
"appended at, or -1 (nothing changed) when the Python append must decide. `tail` is\n"
"the tail file's map, `batch` one whole encoded batch (stamped in place), `fd` the\n"
"active segment's .log, `index`/`timeindex` its index maps with the bytes reserved in\n"
"each; `active_base` and `segments_version` are the segment list the caller holds.\n"
"OSError when the write fails or is short, with nothing published.");

static PyObject *
shortio_append_common(PyObject *self, PyObject *args)
{
    Py_buffer tail, batch, oidx, tidx;
    int fd;
    Py_ssize_t oreserved, treserved, boot_len;
    long long active_base, segment_bytes, segment_ms, interval_bytes, flush_messages;
    unsigned long long version;
    const char *boot_id;
    if (!PyArg_ParseTuple(args, "w*w*iw*nw*nLKy#LLLL:append_common", &tail, &batch, &fd,
                          &oidx, &oreserved, &tidx, &treserved, &active_base, &version,
                          &boot_id, &boot_len, &segment_bytes, &segment_ms,
                          &interval_bytes, &flush_messages))
        return NULL;
    long long result = FALLBACK;
    if (boot_len == 16)
        result = append_locked(tail.buf, tail.len, batch.buf, batch.len, fd, oidx.buf,
                               oidx.len, oreserved, tidx.buf, tidx.len, treserved,
                               active_base, version, boot_id, segment_bytes, segment_ms,
                               interval_bytes, flush_messages);
    PyBuffer_Release(&tail);
    PyBuffer_Release(&batch);
    PyBuffer_Release(&oidx);
    PyBuffer_Release(&tidx);
    if (result == -2)
        return NULL;
    return PyLong_FromLongLong(result);
}

static PyMethodDef methods[] = {
    {"pwrite", shortio_pwrite, METH_VARARGS, pwrite_doc},
    {"flock", shortio_flock, METH_VARARGS, flock_doc},
    {"append_common", shortio_append_common, METH_VARARGS, append_common_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "logkit._shortio",
    "The append path in C: its short system calls with the GIL kept, and the common "
    "append under the partition lock.", -1, methods,
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
