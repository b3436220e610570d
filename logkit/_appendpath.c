/* logkit._appendpath: the append path in C — its short system calls made without releasing
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
 * the twin of PartitionLog._append_locked (logkit/log_append.py) for that case and returns -1,
 * having changed nothing, for every other case, which the Python code then handles.
 * Its layouts are tail.py's (the tail file), index.py's (the two indexes) and
 * records.py's (the batch header); tests/storage/test_append_common.py holds the two paths to
 * the same bytes.
 *
 * Appender.append() is that append with the locks around it, for the case where no
 * lock is held by anyone: the process's append lock, the flock and the thread lock
 * taken without waiting (PartitionLog._acquire's order, logkit/partition_lock.py), append_common's append, the
 * locks released, the doorbell rung — one call instead of some forty Python steps. Any
 * lock not free at once, any batch the Python append would refuse, rewrite or name as
 * corrupt, a forked child: -1 with nothing taken or changed, and the Python append
 * (which waits for locks and names every error) decides.
 *
 * Invariant: the same results and errors as the Python calls they replace — bytes
 * written (short writes are the caller's to check), OSError with errno (EWOULDBLOCK is
 * BlockingIOError), EINTR retried after running signal handlers (an exception from a
 * handler propagates). flock() refuses a blocking LOCK_EX: a wait must not hold the
 * GIL. append_common() publishes nothing unless the batch was written whole: on a
 * failed or short write it raises OSError with the tail and indexes untouched (the
 * caller cuts the file back, as after the Python write; Appender.append() calls its
 * `cut_back` under the lock, then lets the locks go). Appender.append() never waits,
 * and holds the GIL throughout except inside those error-path callbacks (Python code),
 * so no other thread of the process sees the log mid-append.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/file.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>
#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#endif

#include "_batch.h"     /* every platform: the append stamps and checks batch headers */

#define HELD_WRITE_MAX (256 * 1024)

PyDoc_STRVAR(pwrite_doc,
"pwrite(fd, data, offset) -> int\n\n"
"os.pwrite; the GIL is kept for writes of at most 256 KiB.");

static PyObject *
appendpath_pwrite(PyObject *self, PyObject *args)
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
appendpath_flock(PyObject *self, PyObject *args)
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
 * the body: the boot id (16 bytes) and nineteen little-endian 64-bit fields. */
#define TAIL_SEQ 8
#define TAIL_BOOT 16
#define TAIL_FIELD(n) (32 + 8 * (n))
enum {
    T_LOG_START, T_LOG_END, T_ACTIVE_BASE, T_ACTIVE_SIZE, T_INDEX_ENTRIES,
    T_TIMEINDEX_ENTRIES, T_SEGMENTS_VERSION, T_HIGH_WATERMARK, T_MAX_TS, T_MAX_TS_OFFSET,
    T_RECOVERY_POINT, T_ROLL_TIME, T_CLEAN, T_UNFLUSHED, T_FIRST_UNFLUSHED, T_LEADER_EPOCH,
    T_DELETED, T_CLEANED_OFFSET, T_CLEAN_COUNT, T_FIELDS
};
#define TAIL_END TAIL_FIELD(T_FIELDS)

#define OFFSET_ENTRY 8          /* index.py: relative offset int32, position int32 */
#define TIME_ENTRY 12           /* timestamp int64, relative offset int32 */
#define FALLBACK (-1)

static int64_t
now_ms(void)
{
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    return (int64_t)now.tv_sec * 1000 + now.tv_nsec / 1000000;
}

/* Decide, write and publish one append (see the module comment). `batch` is the first
 * of `npieces` buffers that together hold the batch (`batch_len` bytes; the whole header
 * is in the first, where the stamps go). Returns the base offset, FALLBACK when the
 * Python append must decide, or -2 with OSError set and the position the write began
 * at in *written_at (what the caller cuts the file back to). `expect_end` >= 0: only
 * when the log ends there (the producer state the caller checked the batch against
 * covers the log up to it: logkit/log_txn.py), else FALLBACK. */
static long long
append_locked(unsigned char *tail, Py_ssize_t tail_len, unsigned char *batch,
              const struct iovec *pieces, int npieces, Py_ssize_t batch_len, int fd,
              unsigned char *oidx, Py_ssize_t oidx_len, Py_ssize_t oreserved,
              unsigned char *tidx, Py_ssize_t tidx_len, Py_ssize_t treserved,
              long long active_base, unsigned long long version, const char *boot_id,
              long long segment_bytes, long long segment_ms, long long interval_bytes,
              long long flush_messages, long long expect_end, long long *written_at)
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
    if (expect_end >= 0 && t[T_LOG_END] != expect_end)
        return FALLBACK;                            /* appended since the caller looked */

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
    *written_at = position;
    for (;;) {
        if (npieces == 1)
            written = pwrite(fd, batch, (size_t)size, (off_t)position);
        else
            written = pwritev(fd, pieces, npieces, (off_t)position);
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
appendpath_append_common(PyObject *self, PyObject *args)
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
    long long result = FALLBACK, written_at;
    struct iovec whole = {batch.buf, (size_t)batch.len};
    if (boot_len == 16)
        result = append_locked(tail.buf, tail.len, batch.buf, &whole, 1, batch.len, fd,
                               oidx.buf, oidx.len, oreserved, tidx.buf, tidx.len, treserved,
                               active_base, version, boot_id, segment_bytes, segment_ms,
                               interval_bytes, flush_messages, -1, &written_at);
    PyBuffer_Release(&tail);
    PyBuffer_Release(&batch);
    PyBuffer_Release(&oidx);
    PyBuffer_Release(&tidx);
    if (result == -2)
        return NULL;
    return PyLong_FromLongLong(result);
}

/* ---- Appender: the uncontended append, locks and doorbell included ---------------- */

/* This process's id, kept by a fork handler (a forked child must not append through
 * its parent's handles: it falls back, and the Python append names the error). */
static long current_pid;

static void
after_fork_in_child(void)
{
    current_pid = (long)getpid();
}

#define MAX_PIECES 8

typedef struct {
    PyObject_HEAD
    long pid;
    PyObject *append_lock, *thread_lock;    /* acquire(False) and release() */
    int tail_fd, fd;
    PyObject *tail, *index, *timeindex;     /* the tail's map, the two index maps */
    Py_ssize_t index_reserved, timeindex_reserved;
    long long active_base;
    unsigned long long version;
    char boot_id[16];
    long long segment_bytes, segment_ms, interval_bytes, flush_messages, max_bytes;
    int codec;
    PyObject *doorbell;                     /* its `_mm`, read at each ring; or None */
    Py_ssize_t change_offset;
    PyObject *cut_back, *unlock;
    unsigned long long appended, handed_back;
} Appender;

static PyObject *str_acquire, *str_release, *str_mm;

static int
appender_traverse(Appender *self, visitproc visit, void *arg)
{
    Py_VISIT(self->append_lock);
    Py_VISIT(self->thread_lock);
    Py_VISIT(self->tail);
    Py_VISIT(self->index);
    Py_VISIT(self->timeindex);
    Py_VISIT(self->doorbell);
    Py_VISIT(self->cut_back);
    Py_VISIT(self->unlock);
    return 0;
}

static int
appender_clear(Appender *self)
{
    Py_CLEAR(self->append_lock);
    Py_CLEAR(self->thread_lock);
    Py_CLEAR(self->tail);
    Py_CLEAR(self->index);
    Py_CLEAR(self->timeindex);
    Py_CLEAR(self->doorbell);
    Py_CLEAR(self->cut_back);
    Py_CLEAR(self->unlock);
    return 0;
}

static void
appender_dealloc(Appender *self)
{
    PyObject_GC_UnTrack(self);
    appender_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int
appender_init(Appender *self, PyObject *args, PyObject *kwargs)
{
    static char *names[] = {
        "pid", "append_lock", "thread_lock", "tail_fd", "tail", "fd", "index",
        "index_reserved", "timeindex", "timeindex_reserved", "active_base",
        "segments_version", "boot_id", "segment_bytes", "segment_ms",
        "index_interval_bytes", "flush_messages", "max_message_bytes", "codec",
        "doorbell", "change_offset", "cut_back", "unlock", NULL};
    PyObject *append_lock, *thread_lock, *tail, *index, *timeindex, *doorbell, *cut_back,
             *unlock;
    const char *boot_id;
    Py_ssize_t boot_len;
    if (!PyArg_ParseTupleAndKeywords(
            args, kwargs, "lOOiOiOnOnLKy#LLLLLiOnOO:Appender", names, &self->pid,
            &append_lock, &thread_lock, &self->tail_fd, &tail, &self->fd, &index,
            &self->index_reserved, &timeindex, &self->timeindex_reserved,
            &self->active_base, &self->version, &boot_id, &boot_len, &self->segment_bytes,
            &self->segment_ms, &self->interval_bytes, &self->flush_messages,
            &self->max_bytes, &self->codec, &doorbell, &self->change_offset, &cut_back,
            &unlock))
        return -1;
    if (boot_len != 16) {
        PyErr_SetString(PyExc_ValueError, "Appender: boot_id must be 16 bytes");
        return -1;
    }
    memcpy(self->boot_id, boot_id, 16);
    Py_XSETREF(self->append_lock, Py_NewRef(append_lock));
    Py_XSETREF(self->thread_lock, Py_NewRef(thread_lock));
    Py_XSETREF(self->tail, Py_NewRef(tail));
    Py_XSETREF(self->index, Py_NewRef(index));
    Py_XSETREF(self->timeindex, Py_NewRef(timeindex));
    Py_XSETREF(self->doorbell, Py_NewRef(doorbell));
    Py_XSETREF(self->cut_back, Py_NewRef(cut_back));
    Py_XSETREF(self->unlock, Py_NewRef(unlock));
    return 0;
}

/* lock.acquire(False): 1 taken, 0 not free, -1 error. Never waits (the GIL stays). */
static int
try_acquire(PyObject *lock)
{
    PyObject *args[2] = {lock, Py_False};
    PyObject *got = PyObject_VectorcallMethod(str_acquire, args,
                                              2, NULL);
    if (got == NULL)
        return -1;
    int taken = PyObject_IsTrue(got);
    Py_DECREF(got);
    return taken;
}

static int
release(PyObject *lock)
{
    PyObject *args[1] = {lock};
    PyObject *done = PyObject_VectorcallMethod(str_release, args,
                                               1, NULL);
    Py_XDECREF(done);
    return done == NULL ? -1 : 0;
}

/* Undo what the append took, innermost first (PartitionLog._release); an unlock that
 * fails is handed to `unlock()` (PartitionLog._funlock, which reopens the tail file).
 * Keeps an error already set; returns -1 when one is set. */
static int
let_go(Appender *self)
{
    PyObject *type, *value, *trace;
    PyErr_Fetch(&type, &value, &trace);
    /* Each step runs whatever the one before did; the first error is kept. */
    int failed = release(self->thread_lock) < 0;
    if (failed) {
        if (type == NULL)
            PyErr_Fetch(&type, &value, &trace);
        else
            PyErr_Clear();
    }
    int rc;
    do {
        rc = flock(self->tail_fd, LOCK_UN);
    } while (rc != 0 && errno == EINTR);
    if (rc != 0) {
        PyObject *done = PyObject_CallNoArgs(self->unlock);
        if (done == NULL) {
            failed = 1;
            if (type == NULL)
                PyErr_Fetch(&type, &value, &trace);
            else
                PyErr_Clear();
        }
        Py_XDECREF(done);
    }
    if (release(self->append_lock) < 0) {
        failed = 1;
        if (type == NULL)
            PyErr_Fetch(&type, &value, &trace);
        else
            PyErr_Clear();
    }
    if (type != NULL) {
        PyErr_Restore(type, value, trace);
        return -1;
    }
    return failed ? -1 : 0;
}

/* Tell every waiting process (notify.Doorbell.ring): the partition's change slot and
 * word 0 go up by one, and the futex on word 0 wakes its waiters. */
static void
ring(Appender *self)
{
    if (self->doorbell == Py_None)
        return;
    PyObject *mm = PyObject_GetAttr(self->doorbell, str_mm);
    if (mm == NULL) {
        PyErr_Clear();
        return;
    }
    Py_buffer view;
    if (mm == Py_None || PyObject_GetBuffer(mm, &view, PyBUF_WRITABLE) < 0) {
        PyErr_Clear();                      /* closed: nothing to ring */
        Py_DECREF(mm);
        return;
    }
    if (view.len >= 4 && self->change_offset >= 0 && self->change_offset % 4 == 0
            && self->change_offset + 4 <= view.len) {
        __atomic_add_fetch((uint32_t *)((char *)view.buf + self->change_offset), 1,
                           __ATOMIC_SEQ_CST);
        __atomic_add_fetch((uint32_t *)view.buf, 1, __ATOMIC_SEQ_CST);
#if defined(__linux__)
        syscall(SYS_futex, view.buf, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
#endif
    }
    PyBuffer_Release(&view);
    Py_DECREF(mm);
}

PyDoc_STRVAR(appender_append_doc,
"append(batch, expect_end=-1) -> int\n\n"
"Append one whole encoded batch (a bytearray, or a list of buffers whose first is a\n"
"bytearray holding the whole header) when nothing stands in the way: the base offset,\n"
"the locks taken and released and the doorbell rung in this one call; or -1, with\n"
"nothing taken or changed, when the Python append must decide (a lock not free at\n"
"once, a roll, a sync, an index reservation, a batch it would refuse or rewrite, a\n"
"forked child, another segment list). A batch that names a producer id is appended\n"
"only when the log ends at `expect_end` (the end of the producer state the caller\n"
"checked it against, logkit/log_txn.py), else -1. A failed write raises OSError\n"
"after `cut_back(position)` ran under the lock.");

static PyObject *
appender_append(Appender *self, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *batch;
    long long expect_end = -1;
    Py_buffer views[MAX_PIECES];
    struct iovec pieces[MAX_PIECES];
    Py_buffer tail, oidx, tidx;
    int npieces = 0, have_maps = 0;
    long long result = FALLBACK, written_at = 0;
    Py_ssize_t total = 0;
    unsigned char *head;
    int taken = 0, rc;

    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "append(batch, expect_end=-1)");
        return NULL;
    }
    batch = args[0];
    if (nargs == 2) {
        expect_end = PyLong_AsLongLong(args[1]);
        if (expect_end == -1 && PyErr_Occurred())
            return NULL;
    }
    if (current_pid != self->pid)
        goto handed_back;
    if (PyByteArray_CheckExact(batch)) {
        if (PyObject_GetBuffer(batch, &views[0], PyBUF_WRITABLE) < 0)
            return NULL;
        npieces = 1;
    } else if (PyList_CheckExact(batch) && PyList_GET_SIZE(batch) >= 1
               && PyList_GET_SIZE(batch) <= MAX_PIECES
               && PyByteArray_CheckExact(PyList_GET_ITEM(batch, 0))) {
        Py_ssize_t n = PyList_GET_SIZE(batch);
        for (Py_ssize_t i = 0; i < n; i++) {
            if (PyObject_GetBuffer(PyList_GET_ITEM(batch, i), &views[i],
                                   i == 0 ? PyBUF_WRITABLE : PyBUF_SIMPLE) < 0) {
                PyErr_Clear();              /* the Python append names the fault */
                goto release_pieces;
            }
            npieces++;
        }
    } else {
        goto handed_back;
    }
    for (int i = 0; i < npieces; i++) {
        pieces[i].iov_base = views[i].buf;
        pieces[i].iov_len = (size_t)views[i].len;
        total += views[i].len;
    }
    head = views[0].buf;
    if (views[0].len < B_HEADER || total > self->max_bytes || total > HELD_WRITE_MAX
            || (int64_t)(int32_t)be32(head + B_LENGTH) + LOG_OVERHEAD != total
            || (int64_t)(int32_t)be32(head + B_LAST_OFFSET_DELTA) + 1 >= self->flush_messages
            || (self->codec >= 0 && (head[B_ATTRIBUTES + 1] & ATTR_CODEC_MASK) != self->codec)
            || ((int64_t)be64(head + B_PRODUCER_ID) >= 0 && expect_end < 0))
        goto release_pieces;    /* refused, rewritten, corrupt, a long write, a sync
                                   due whatever the tail says, or a producer's batch
                                   nobody checked: Python */
    if (PyObject_GetBuffer(self->tail, &tail, PyBUF_WRITABLE) < 0) {
        PyErr_Clear();
        goto release_pieces;
    }
    if (PyObject_GetBuffer(self->index, &oidx, PyBUF_WRITABLE) < 0) {
        PyErr_Clear();
        PyBuffer_Release(&tail);
        goto release_pieces;
    }
    if (PyObject_GetBuffer(self->timeindex, &tidx, PyBUF_WRITABLE) < 0) {
        PyErr_Clear();
        PyBuffer_Release(&oidx);
        PyBuffer_Release(&tail);
        goto release_pieces;
    }
    have_maps = 1;

    /* PartitionLog._acquire's order, none of it waiting: the process's append lock,
     * the flock, the thread lock. */
    taken = try_acquire(self->append_lock);
    if (taken <= 0)
        goto failed_or_handed_back;
    do {
        rc = flock(self->tail_fd, LOCK_EX | LOCK_NB);
    } while (rc != 0 && errno == EINTR);
    if (rc != 0) {
        if (release(self->append_lock) < 0)
            taken = -1;
        goto failed_or_handed_back;         /* held elsewhere, or Python names it */
    }
    taken = try_acquire(self->thread_lock);
    if (taken <= 0) {
        PyObject *type, *value, *trace;
        PyErr_Fetch(&type, &value, &trace);
        flock(self->tail_fd, LOCK_UN);
        release(self->append_lock);
        PyErr_Restore(type, value, trace);
        goto failed_or_handed_back;
    }
    result = append_locked(tail.buf, tail.len, head, pieces, npieces, total, self->fd,
                           oidx.buf, oidx.len, self->index_reserved, tidx.buf, tidx.len,
                           self->timeindex_reserved, self->active_base, self->version,
                           self->boot_id, self->segment_bytes, self->segment_ms,
                           self->interval_bytes, self->flush_messages, expect_end,
                           &written_at);
    if (result == -2) {                     /* the write failed: cut back, then let go */
        PyObject *type, *value, *trace;
        PyErr_Fetch(&type, &value, &trace);
        PyObject *done = PyObject_CallFunction(self->cut_back, "L", written_at);
        if (done == NULL)
            PyErr_Clear();                  /* the write's error is the one to report */
        Py_XDECREF(done);
        PyErr_Restore(type, value, trace);
        let_go(self);
        goto release_all;
    }
    if (let_go(self) < 0) {
        if (result >= 0) {
            /* Stored and published: the unlock's failure must not fail the append
             * (PartitionLog._funlock's rule); it was handed to `unlock()`. */
            PyErr_Clear();
        } else {
            result = -2;
            goto release_all;
        }
    }
    goto release_all;

failed_or_handed_back:
    if (taken < 0)
        result = -2;
release_all:
    if (have_maps) {
        PyBuffer_Release(&tidx);
        PyBuffer_Release(&oidx);
        PyBuffer_Release(&tail);
    }
release_pieces:
    for (int i = 0; i < npieces; i++)
        PyBuffer_Release(&views[i]);
    if (result == -2)
        return NULL;
    if (result >= 0) {
        self->appended++;
        ring(self);
        return PyLong_FromLongLong(result);
    }
handed_back:
    self->handed_back++;
    return PyLong_FromLong(FALLBACK);
}

static PyMethodDef appender_methods[] = {
    {"append", (PyCFunction)(void (*)(void))appender_append, METH_FASTCALL,
     appender_append_doc},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef appender_members[] = {
    {"appended", T_ULONGLONG, offsetof(Appender, appended), READONLY,
     "appends made in one call"},
    {"handed_back", T_ULONGLONG, offsetof(Appender, handed_back), READONLY,
     "calls that returned -1 for the Python append"},
    {NULL, 0, 0, 0, NULL},
};

PyDoc_STRVAR(appender_doc,
"Appender(pid, append_lock, thread_lock, tail_fd, tail, fd, index, index_reserved,\n"
"         timeindex, timeindex_reserved, active_base, segments_version, boot_id,\n"
"         segment_bytes, segment_ms, index_interval_bytes, flush_messages,\n"
"         max_message_bytes, codec, doorbell, change_offset, cut_back, unlock)\n\n"
"A partition log's whole append for one active segment in one call, when it is\n"
"uncontended and needs no decision (PartitionLog._appender; see append()). Made by\n"
"the log after a general append and dropped whenever that segment, its index maps or\n"
"the tail file's handle change: every buffer it names stays mapped while it lives.");

static PyTypeObject AppenderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "logkit._appendpath.Appender",
    .tp_basicsize = sizeof(Appender),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = appender_doc,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)appender_init,
    .tp_dealloc = (destructor)appender_dealloc,
    .tp_traverse = (traverseproc)appender_traverse,
    .tp_clear = (inquiry)appender_clear,
    .tp_methods = appender_methods,
    .tp_members = appender_members,
};

static PyMethodDef methods[] = {
    {"pwrite", appendpath_pwrite, METH_VARARGS, pwrite_doc},
    {"flock", appendpath_flock, METH_VARARGS, flock_doc},
    {"append_common", appendpath_append_common, METH_VARARGS, append_common_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "logkit._appendpath",
    "The append path in C: its short system calls with the GIL kept, the common "
    "append under the partition lock, and the whole uncontended append.", -1, methods,
};

PyMODINIT_FUNC
PyInit__appendpath(void)
{
    str_acquire = PyUnicode_InternFromString("acquire");
    str_release = PyUnicode_InternFromString("release");
    str_mm = PyUnicode_InternFromString("_mm");
    if (str_acquire == NULL || str_release == NULL || str_mm == NULL)
        return NULL;
    if (PyType_Ready(&AppenderType) < 0)
        return NULL;
    current_pid = (long)getpid();
    if (pthread_atfork(NULL, NULL, after_fork_in_child) != 0) {
        PyErr_SetString(PyExc_RuntimeError, "pthread_atfork failed");
        return NULL;
    }
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&AppenderType);
    if (PyModule_AddIntConstant(m, "HELD_WRITE_MAX", HELD_WRITE_MAX) < 0
            || PyModule_AddObject(m, "Appender", (PyObject *)&AppenderType) < 0) {
        Py_DECREF(&AppenderType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
