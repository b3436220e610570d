/* logkit._speedups: optional compiled versions of the three hottest loops.
 *
 * Owns: encoding the records section of a magic-2 batch (`encode_records`), decoding it
 * into `Record` tuples (`decode_records`) or into Arrow-ready column buffers
 * (`decode_columns`, the Spark reader's path), checking it without building anything
 * (`check_records`: an append's validation and `check()`), a read's walk over clean
 * batches (`walk_batches`: it hands back NotImplemented, having changed nothing, at
 * any batch the Python walk must handle or report), Kafka's murmur2 (`murmur2`), and the
 * log cleaner's key map and filter (`murmur3_128`, `map_put`, `map_get`,
 * `clean_records`: cleaner.OffsetMap's table in a caller's buffer; their twins are in
 * cleaner.py).
 * Each mirrors a pure-Python function in records.py / murmur2.py exactly: same bytes
 * out, same records out, and an exception (ValueError or UnicodeDecodeError) wherever
 * the Python version raises on malformed input. records.py turns those into
 * CorruptRecordError.
 *
 * Invariant: no read goes past `end`, which the caller has already bounded by the
 * batch's length field and the buffer's length. The module holds no state; the GIL is
 * held throughout (the loops allocate Python objects).
 *
 * Built by setup.py as an optional extension: when it does not compile, logkit runs on
 * the pure-Python code and tests/storage/test_speedups.py is skipped.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "_batch.h"
#include "_murmur2.h"

/* ---- varints --------------------------------------------------------------------- */

/* Read a zig-zag varint at *pos (< end). Returns 0 on success, -1 with ValueError set. */
static int
read_varint(const unsigned char *buf, Py_ssize_t *pos, Py_ssize_t end, int64_t *out)
{
    uint64_t raw = 0;
    int shift = 0;
    Py_ssize_t p = *pos;
    for (;;) {
        if (p >= end) {
            PyErr_SetString(PyExc_ValueError, "varint runs past the end of the batch");
            return -1;
        }
        unsigned char byte = buf[p++];
        if (shift == 63 && byte > 1) {
            PyErr_SetString(PyExc_ValueError, "varint does not fit 64 bits");
            return -1;
        }
        raw |= (uint64_t)(byte & 0x7F) << shift;
        if (byte < 0x80) {
            *out = (int64_t)(raw >> 1) ^ -(int64_t)(raw & 1);
            *pos = p;
            return 0;
        }
        shift += 7;
        if (shift > 63) {
            PyErr_SetString(PyExc_ValueError, "varint longer than 10 bytes");
            return -1;
        }
    }
}

#define READ_VARINT(var)                                                      \
    do {                                                                      \
        if (pos < end && buf[pos] < 0x80) {                                   \
            unsigned char b_ = buf[pos++];                                    \
            (var) = (int64_t)(b_ >> 1) ^ -(int64_t)(b_ & 1);                  \
        } else if (read_varint(buf, &pos, end, &(var)) < 0) {                 \
            goto error;                                                       \
        }                                                                     \
    } while (0)

/* a + b as a Python int, exact even past int64 (the pure-Python code never overflows). */
static PyObject *
add_as_long(int64_t a, int64_t b)
{
    int64_t sum;
    if (!__builtin_add_overflow(a, b, &sum))
        return PyLong_FromLongLong(sum);
    PyObject *x = PyLong_FromLongLong(a), *y = PyLong_FromLongLong(b), *r = NULL;
    if (x && y)
        r = PyNumber_Add(x, y);
    Py_XDECREF(x);
    Py_XDECREF(y);
    return r;
}

/* ---- decode ---------------------------------------------------------------------- */

/* The fixed fields of one record; key/value positions are valid when klen/vlen >= 0. */
typedef struct {
    int64_t length, ts_delta, offset_delta, klen, vlen, hcount;
    Py_ssize_t key_at, value_at, record_end;
} RecordFields;

/* Parse one record's fields up to its header count at *ppos (< end), leaving *ppos at
 * its first header. Returns 0, or -1 with ValueError set. Shared by both decoders. */
static int
parse_record(const unsigned char *buf, Py_ssize_t *ppos, Py_ssize_t end, RecordFields *f)
{
    Py_ssize_t pos = *ppos;
    READ_VARINT(f->length);
    if (f->length < 1 || f->length > end - pos) {
        PyErr_Format(PyExc_ValueError, "record length field says %lld, %zd bytes left",
                     (long long)f->length, end - pos);
        goto error;
    }
    f->record_end = pos + (Py_ssize_t)f->length;
    pos += 1;                                       /* record attributes: unused */
    READ_VARINT(f->ts_delta);
    READ_VARINT(f->offset_delta);
    READ_VARINT(f->klen);
    if (f->klen >= 0) {
        if (f->klen > f->record_end - pos) {
            PyErr_SetString(PyExc_ValueError, "key runs past the end of its record");
            goto error;
        }
        f->key_at = pos;
        pos += (Py_ssize_t)f->klen;
    }
    READ_VARINT(f->vlen);
    if (f->vlen >= 0) {
        if (f->vlen > f->record_end - pos) {
            PyErr_SetString(PyExc_ValueError, "value runs past the end of its record");
            goto error;
        }
        f->value_at = pos;
        pos += (Py_ssize_t)f->vlen;
    }
    READ_VARINT(f->hcount);
    *ppos = pos;
    return 0;
error:
    return -1;
}

/* The `count` headers at *ppos as a list of (str, bytes | None) pairs; with `keep` 0,
 * the same checks (framing, UTF-8 keys) and Py_None instead of the list. */
static PyObject *
decode_headers(const unsigned char *buf, Py_ssize_t *ppos, Py_ssize_t end, int64_t count,
               int keep)
{
    Py_ssize_t pos = *ppos;
    PyObject *list = NULL, *key = NULL, *value = NULL, *pair;
    int64_t klen, vlen, i;
    if (count < 0 || count > 1000000) {
        PyErr_Format(PyExc_ValueError, "impossible header count %lld", (long long)count);
        return NULL;
    }
    list = keep ? PyList_New(0) : Py_NewRef(Py_None);
    if (list == NULL)
        return NULL;
    for (i = 0; i < count; i++) {
        READ_VARINT(klen);
        if (klen < 0) {
            PyErr_SetString(PyExc_ValueError, "null header key");
            goto error;
        }
        if (klen > end - pos) {
            PyErr_SetString(PyExc_ValueError, "header key runs past the end of the batch");
            goto error;
        }
        key = PyUnicode_DecodeUTF8((const char *)buf + pos, (Py_ssize_t)klen, "strict");
        if (key == NULL)
            goto error;
        pos += (Py_ssize_t)klen;
        READ_VARINT(vlen);
        if (vlen < 0) {
            value = Py_NewRef(Py_None);
        } else {
            if (vlen > end - pos) {
                PyErr_SetString(PyExc_ValueError,
                                "header value runs past the end of the batch");
                goto error;
            }
            value = keep ? PyBytes_FromStringAndSize((const char *)buf + pos,
                                                     (Py_ssize_t)vlen)
                         : Py_NewRef(Py_None);
            if (value == NULL)
                goto error;
            pos += (Py_ssize_t)vlen;
        }
        if (!keep) {
            Py_CLEAR(key);
            Py_CLEAR(value);
            continue;
        }
        pair = PyTuple_Pack(2, key, value);
        Py_CLEAR(key);
        Py_CLEAR(value);
        if (pair == NULL || PyList_Append(list, pair) < 0) {
            Py_XDECREF(pair);
            goto error;
        }
        Py_DECREF(pair);
    }
    *ppos = pos;
    return list;
error:
    Py_XDECREF(key);
    Py_XDECREF(value);
    Py_DECREF(list);
    return NULL;
}

PyDoc_STRVAR(decode_records_doc,
"decode_records(buf, pos, end, count, base_offset, base_timestamp, append_time,\n"
"               topic, partition, min_offset, record_type) -> list\n\n"
"The records section [pos, end) of an uncompressed batch as record_type tuples\n"
"(topic, partition, offset, timestamp, key, value, headers), keeping offsets >=\n"
"min_offset. append_time is None or the LogAppendTime timestamp. Raises ValueError\n"
"on malformed bytes.");

/* Append the records of the section [pos, end) (count of them) with offsets in
 * [min_offset, stop_offset) to `out` as `type` tuples. Returns 0, or -1 with an error
 * set (ValueError on malformed bytes). Shared by decode_records and walk_batches. */
static int
decode_section(PyObject *out, const unsigned char *buf, Py_ssize_t pos, Py_ssize_t end,
               long long count_ll, int64_t base_offset, int64_t base_ts,
               PyObject *append_time, PyObject *topic, PyObject *partition,
               int64_t min_offset, int64_t stop_offset, PyTypeObject *type)
{
    PyObject *key = NULL, *value = NULL, *headers = NULL;
    int64_t length, ts_delta, offset_delta, offset;
    Py_ssize_t record_end;
    long long n;

    /* A record takes at least 7 bytes, which bounds the count. */
    if (count_ll < 0 || count_ll > (end - pos) / 7 + 1) {
        PyErr_Format(PyExc_ValueError, "records count %lld does not fit in %zd bytes",
                     count_ll, end - pos);
        return -1;
    }
    for (n = 0; n < count_ll; n++) {
        RecordFields f;
        if (parse_record(buf, &pos, end, &f) < 0)
            goto error;
        length = f.length;
        ts_delta = f.ts_delta;
        offset_delta = f.offset_delta;
        record_end = f.record_end;
        key = f.klen < 0 ? Py_NewRef(Py_None)
                         : PyBytes_FromStringAndSize((const char *)buf + f.key_at,
                                                     (Py_ssize_t)f.klen);
        if (key == NULL)
            goto error;
        value = f.vlen < 0 ? Py_NewRef(Py_None)
                           : PyBytes_FromStringAndSize((const char *)buf + f.value_at,
                                                       (Py_ssize_t)f.vlen);
        if (value == NULL)
            goto error;
        headers = f.hcount == 0 ? PyTuple_New(0) : decode_headers(buf, &pos, end, f.hcount, 1);
        if (headers == NULL)
            goto error;
        if (pos != record_end) {
            PyErr_Format(PyExc_ValueError, "record length field says %lld, fields use %lld",
                         (long long)length, (long long)(length + pos - record_end));
            goto error;
        }
        if (__builtin_add_overflow(base_offset, offset_delta, &offset)) {
            PyErr_SetString(PyExc_ValueError, "offset delta overflows 64 bits");
            goto error;
        }
        if (offset >= min_offset && offset < stop_offset) {
            PyObject *rec, *off_obj, *ts_obj;
            off_obj = PyLong_FromLongLong(offset);
            ts_obj = append_time == Py_None ? add_as_long(base_ts, ts_delta)
                                            : Py_NewRef(append_time);
            rec = (off_obj && ts_obj) ? type->tp_alloc(type, 7) : NULL;
            if (rec == NULL) {
                Py_XDECREF(off_obj);
                Py_XDECREF(ts_obj);
                goto error;
            }
            PyTuple_SET_ITEM(rec, 0, Py_NewRef(topic));
            PyTuple_SET_ITEM(rec, 1, Py_NewRef(partition));
            PyTuple_SET_ITEM(rec, 2, off_obj);
            PyTuple_SET_ITEM(rec, 3, ts_obj);
            PyTuple_SET_ITEM(rec, 4, key);
            PyTuple_SET_ITEM(rec, 5, value);
            PyTuple_SET_ITEM(rec, 6, headers);
            key = value = headers = NULL;
            if (PyList_Append(out, rec) < 0) {
                Py_DECREF(rec);
                goto error;
            }
            Py_DECREF(rec);
        } else {
            Py_CLEAR(key);
            Py_CLEAR(value);
            Py_CLEAR(headers);
        }
    }
    if (pos != end) {
        PyErr_Format(PyExc_ValueError, "%zd stray bytes after the last record", end - pos);
        goto error;
    }
    return 0;
error:
    Py_XDECREF(key);
    Py_XDECREF(value);
    Py_XDECREF(headers);
    return -1;
}

static int
check_record_type(PyObject *record_type)
{
    if (!PyType_Check(record_type) ||
        !PyType_IsSubtype((PyTypeObject *)record_type, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "record_type must be a tuple subclass");
        return -1;
    }
    return 0;
}

static PyObject *
decode_records(PyObject *self, PyObject *args)
{
    Py_buffer view;
    Py_ssize_t pos, end;
    long long count_ll, base_offset, base_ts, min_offset;
    PyObject *append_time, *topic, *partition, *record_type, *out;

    if (!PyArg_ParseTuple(args, "y*nnLLLOOOLO:decode_records", &view, &pos, &end, &count_ll,
                          &base_offset, &base_ts, &append_time, &topic, &partition,
                          &min_offset, &record_type))
        return NULL;
    if (check_record_type(record_type) < 0) {
        PyBuffer_Release(&view);
        return NULL;
    }
    if (pos < 0 || end > view.len || pos > end) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "records section lies outside the buffer");
        return NULL;
    }
    out = PyList_New(0);
    if (out != NULL && decode_section(out, (const unsigned char *)view.buf, pos, end,
                                      count_ll, base_offset, base_ts, append_time, topic,
                                      partition, min_offset, INT64_MAX,
                                      (PyTypeObject *)record_type) < 0)
        Py_CLEAR(out);
    PyBuffer_Release(&view);
    return out;
}

/* ---- check without decoding --------------------------------------------------------- */

PyDoc_STRVAR(check_records_doc,
"check_records(buf, pos, end, count, base_timestamp) -> (min_timestamp, max_timestamp)\n\n"
"Walk the uncompressed records section [pos, end) as decode_records reads it, building\n"
"nothing: count records framed by the same parser (lengths, varints, header keys\n"
"UTF-8, no stray bytes), their offset deltas 0..count-1 in order and their timestamps\n"
"within 64 bits. Returns the smallest and largest record timestamp. Raises ValueError\n"
"(or UnicodeDecodeError) wherever decode_records raises, and on those two checks.");

static PyObject *
check_records(PyObject *self, PyObject *args)
{
    Py_buffer view;
    Py_ssize_t pos, end;
    long long count_ll, base_ts;
    int64_t min_ts = INT64_MAX, max_ts = INT64_MIN, ts;
    PyObject *result = NULL;

    if (!PyArg_ParseTuple(args, "y*nnLL:check_records", &view, &pos, &end, &count_ll,
                          &base_ts))
        return NULL;
    const unsigned char *buf = (const unsigned char *)view.buf;
    if (pos < 0 || end > view.len || pos > end) {
        PyErr_SetString(PyExc_ValueError, "records section lies outside the buffer");
        goto done;
    }
    /* A record takes at least 7 bytes, which bounds the count (as decode_section). */
    if (count_ll < 0 || count_ll > (end - pos) / 7 + 1) {
        PyErr_Format(PyExc_ValueError, "records count %lld does not fit in %zd bytes",
                     count_ll, end - pos);
        goto done;
    }
    for (long long n = 0; n < count_ll; n++) {
        RecordFields f;
        if (parse_record(buf, &pos, end, &f) < 0)
            goto done;
        if (f.hcount != 0) {
            PyObject *none = decode_headers(buf, &pos, end, f.hcount, 0);
            if (none == NULL)
                goto done;
            Py_DECREF(none);
        }
        if (pos != f.record_end) {
            PyErr_Format(PyExc_ValueError, "record length field says %lld, fields use %lld",
                         (long long)f.length, (long long)(f.length + pos - f.record_end));
            goto done;
        }
        if (f.offset_delta != n) {
            PyErr_Format(PyExc_ValueError, "record %lld has offset delta %lld", n,
                         (long long)f.offset_delta);
            goto done;
        }
        if (__builtin_add_overflow((int64_t)base_ts, f.ts_delta, &ts)) {
            PyErr_SetString(PyExc_ValueError, "record timestamp overflows 64 bits");
            goto done;
        }
        if (ts < min_ts)
            min_ts = ts;
        if (ts > max_ts)
            max_ts = ts;
    }
    if (pos != end) {
        PyErr_Format(PyExc_ValueError, "%zd stray bytes after the last record", end - pos);
        goto done;
    }
    result = Py_BuildValue("(LL)", (long long)min_ts, (long long)max_ts);
done:
    PyBuffer_Release(&view);
    return result;
}

/* ---- the read walk ---------------------------------------------------------------- */

PyDoc_STRVAR(walk_batches_doc,
"walk_batches(buf, base, pos, offset, size, topic, partition, max_records, max_bytes,\n"
"             stop_offset, exact, record_type, crc32c) -> tuple | NotImplemented\n\n"
"segment.LogSegment._read's walk for the clean case: whole, valid, uncompressed\n"
"magic-2 batches from file position `pos` (buf[0] is file position `base`), CRC-32C\n"
"checked by the given function, offsets in sequence, the first batch checked as `exact`\n"
"says (1: it starts at offset, 0: it holds it, -1: checked already). Returns\n"
"(records, pos, last_pos, expected, last_offset, budget) -- where the walk stopped,\n"
"the last batch's position, the offset after the last batch looked at and its last\n"
"offset (-1: none), and\n"
"max_bytes less the bytes walked -- or NotImplemented, having changed nothing, at\n"
"anything else (a torn, impossible, compressed, out-of-sequence or mismatching\n"
"batch, a malformed record): the Python walk then reports it precisely.");

static PyObject *
walk_batches(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 13) {
        PyErr_SetString(PyExc_TypeError, "walk_batches takes 13 arguments");
        return NULL;
    }
    Py_ssize_t base = PyLong_AsSsize_t(args[1]), pos = PyLong_AsSsize_t(args[2]);
    long long offset = PyLong_AsLongLong(args[3]);
    Py_ssize_t size = PyLong_AsSsize_t(args[4]);
    PyObject *topic = args[5], *partition = args[6];
    Py_ssize_t max_records = PyLong_AsSsize_t(args[7]);
    long long budget = PyLong_AsLongLong(args[8]), stop_offset = PyLong_AsLongLong(args[9]);
    long exact = PyLong_AsLong(args[10]);
    PyObject *record_type = args[11], *crc_fn = args[12];
    if (PyErr_Occurred() || check_record_type(record_type) < 0)
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    const unsigned char *buf = (const unsigned char *)view.buf;
    PyObject *out = PyList_New(0), *result = NULL;
    if (out == NULL)
        goto done;
    if (pos < base || size - base > view.len || pos > size) {
        result = Py_NewRef(Py_NotImplemented);
        goto done;
    }
    Py_ssize_t last_pos = pos;
    int64_t expected = -1, last_offset = -1;
    while (pos < size && PyList_GET_SIZE(out) < max_records) {
        const unsigned char *h = buf + (pos - base);
        if (size - pos < B_HEADER)
            goto fall_back;
        int64_t batch_base = (int64_t)be64(h + B_BASE_OFFSET), batch_last;
        int32_t length = (int32_t)be32(h + B_LENGTH);
        uint32_t crc = be32(h + B_CRC);
        int attributes = (h[B_ATTRIBUTES] << 8) | h[B_ATTRIBUTES + 1];
        int32_t delta = (int32_t)be32(h + B_LAST_OFFSET_DELTA);
        int64_t base_ts = (int64_t)be64(h + B_BASE_TIMESTAMP);
        int64_t max_ts = (int64_t)be64(h + B_MAX_TIMESTAMP);
        int32_t count = (int32_t)be32(h + B_RECORDS_COUNT);
        if (h[B_MAGIC] != B_MAGIC_V2 || length < B_HEADER - LOG_OVERHEAD || count < 0 ||
                delta < 0 || (long long)length > (long long)(size - pos - LOG_OVERHEAD) ||
                (attributes & ATTR_CODEC_MASK) ||
                __builtin_add_overflow(batch_base, (int64_t)delta, &batch_last) ||
                batch_last == INT64_MAX)     /* the offset after it must fit too */
            goto fall_back;
        if (exact >= 0) {
            if (exact ? batch_base != offset : !(batch_base <= offset && offset <= batch_last))
                goto fall_back;
            exact = -1;
        } else if (expected >= 0 && batch_base != expected) {
            goto fall_back;
        }
        expected = batch_last + 1;
        last_offset = batch_last;        /* the last header looked at, as the Python walk */
        if (batch_base >= stop_offset)
            break;
        Py_ssize_t end = pos + LOG_OVERHEAD + length;
        PyObject *memory = PyMemoryView_FromMemory((char *)h + B_ATTRIBUTES,
                                                   end - pos - B_ATTRIBUTES, PyBUF_READ);
        if (memory == NULL)
            goto done;
        PyObject *actual = PyObject_CallOneArg(crc_fn, memory);
        Py_DECREF(memory);
        if (actual == NULL)
            goto done;
        unsigned long got = PyLong_AsUnsignedLong(actual);
        Py_DECREF(actual);
        if (got == (unsigned long)-1 && PyErr_Occurred())
            goto done;
        if (got != crc)
            goto fall_back;
        if (!(attributes & ATTR_CONTROL)) {
            PyObject *append_time = Py_None;
            if (attributes & ATTR_APPEND_TIME) {
                append_time = PyLong_FromLongLong(max_ts);
                if (append_time == NULL)
                    goto done;
            }
            int failed = decode_section(out, h, B_HEADER, end - pos, count,
                                        batch_base, base_ts, append_time, topic, partition,
                                        offset, stop_offset, (PyTypeObject *)record_type);
            if (append_time != Py_None)
                Py_DECREF(append_time);
            if (failed) {
                if (!PyErr_ExceptionMatches(PyExc_ValueError) &&
                        !PyErr_ExceptionMatches(PyExc_UnicodeDecodeError))
                    goto done;
                PyErr_Clear();
                goto fall_back;
            }
        }
        last_pos = pos;
        budget -= end - pos;
        pos = end;
        if (budget <= 0)
            break;
    }
    result = Py_BuildValue("(OnnLLL)", out, pos, last_pos, (long long)expected,
                           (long long)last_offset, budget);
    goto done;
fall_back:
    result = Py_NewRef(Py_NotImplemented);
done:
    Py_XDECREF(out);
    PyBuffer_Release(&view);
    return result;
}

/* ---- decode into columns ------------------------------------------------------------ */

static int
ba_append(PyObject *ba, const void *data, Py_ssize_t len)
{
    Py_ssize_t old = PyByteArray_GET_SIZE(ba);
    if (PyByteArray_Resize(ba, old + len) < 0)
        return -1;
    memcpy(PyByteArray_AS_STRING(ba) + old, data, len);
    return 0;
}

PyDoc_STRVAR(decode_columns_doc,
"decode_columns(buf, pos, end, count, base_offset, base_timestamp, append_time,\n"
"               min_offset, stop_offset, columns) -> int\n\n"
"Append the records of [pos, end) with min_offset <= offset < stop_offset to the seven\n"
"bytearrays in `columns` (see logkit/columns.py): offsets int64, timestamps int64,\n"
"key offsets int32, key bytes, value offsets int32, value bytes, null flags uint8.\n"
"append_time < 0 means CreateTime. Returns how many records were appended; raises\n"
"ValueError on malformed bytes (nothing is appended then past the bad record).");

static PyObject *
decode_columns(PyObject *self, PyObject *args)
{
    Py_buffer view;
    Py_ssize_t pos, end, record_end;
    long long count_ll, base_offset, base_ts, append_time, min_offset, stop_offset;
    PyObject *cols, *c[7];
    const unsigned char *buf;
    int64_t ts_delta, offset_delta, klen, vlen, hcount, offset, ts;
    long long n, appended = 0;
    int i;

    if (!PyArg_ParseTuple(args, "y*nnLLLLLLO!:decode_columns", &view, &pos, &end, &count_ll,
                          &base_offset, &base_ts, &append_time, &min_offset, &stop_offset,
                          &PyList_Type, &cols))
        return NULL;
    if (PyList_GET_SIZE(cols) != 7) {
        PyErr_SetString(PyExc_TypeError, "columns must be a list of 7 bytearrays");
        goto error;
    }
    for (i = 0; i < 7; i++) {
        c[i] = PyList_GET_ITEM(cols, i);
        if (!PyByteArray_Check(c[i])) {
            PyErr_SetString(PyExc_TypeError, "columns must be a list of 7 bytearrays");
            goto error;
        }
    }
    if (pos < 0 || end > view.len || pos > end) {
        PyErr_SetString(PyExc_ValueError, "record section outside the buffer");
        goto error;
    }
    buf = (const unsigned char *)view.buf;
    for (n = 0; n < count_ll; n++) {
        int32_t key_end, value_end;
        unsigned char nulls = 0;
        RecordFields f;
        if (parse_record(buf, &pos, end, &f) < 0)
            goto error;
        record_end = f.record_end;
        ts_delta = f.ts_delta;
        offset_delta = f.offset_delta;
        klen = f.klen;
        vlen = f.vlen;
        hcount = f.hcount;
        if (hcount < 0) {
            PyErr_SetString(PyExc_ValueError, "negative header count");
            goto error;
        }
        for (int64_t h = 0; h < hcount; h++) {          /* skipped: not a column here */
            int64_t hk, hv;
            READ_VARINT(hk);
            if (hk < 0 || hk > record_end - pos) {
                PyErr_SetString(PyExc_ValueError, "header key runs past its record");
                goto error;
            }
            pos += (Py_ssize_t)hk;
            READ_VARINT(hv);
            if (hv > record_end - pos) {
                PyErr_SetString(PyExc_ValueError, "header value runs past its record");
                goto error;
            }
            if (hv > 0)
                pos += (Py_ssize_t)hv;
        }
        if (pos != record_end) {
            PyErr_SetString(PyExc_ValueError, "record length field disagrees with its fields");
            goto error;
        }
        offset = (int64_t)base_offset + offset_delta;
        if (offset < min_offset || offset >= stop_offset)
            continue;
        ts = append_time >= 0 ? (int64_t)append_time : (int64_t)base_ts + ts_delta;
        if (klen < 0)
            nulls |= 1;
        if (vlen < 0)
            nulls |= 2;
        if (ba_append(c[0], &offset, 8) < 0 || ba_append(c[1], &ts, 8) < 0)
            goto error;
        if (klen > 0 && ba_append(c[3], buf + f.key_at, (Py_ssize_t)klen) < 0)
            goto error;
        if (vlen > 0 && ba_append(c[5], buf + f.value_at, (Py_ssize_t)vlen) < 0)
            goto error;
        if (PyByteArray_GET_SIZE(c[3]) > INT32_MAX || PyByteArray_GET_SIZE(c[5]) > INT32_MAX) {
            PyErr_SetString(PyExc_OverflowError, "column chunk past 2 GiB");
            goto error;
        }
        key_end = (int32_t)PyByteArray_GET_SIZE(c[3]);
        value_end = (int32_t)PyByteArray_GET_SIZE(c[5]);
        if (ba_append(c[2], &key_end, 4) < 0 || ba_append(c[4], &value_end, 4) < 0 ||
                ba_append(c[6], &nulls, 1) < 0)
            goto error;
        appended++;
    }
    if (pos != end) {
        PyErr_Format(PyExc_ValueError, "%zd stray bytes after the last record", end - pos);
        goto error;
    }
    PyBuffer_Release(&view);
    return PyLong_FromLongLong(appended);
error:
    PyBuffer_Release(&view);
    return NULL;
}

/* ---- encode ---------------------------------------------------------------------- */

typedef struct {
    unsigned char *data;
    Py_ssize_t len, cap;
} Out;

static int
out_reserve(Out *o, Py_ssize_t extra)
{
    if (o->len + extra <= o->cap)
        return 0;
    Py_ssize_t cap = o->cap ? o->cap : 1024;
    while (cap < o->len + extra)
        cap *= 2;
    unsigned char *data = PyMem_Realloc(o->data, cap);
    if (data == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    o->data = data;
    o->cap = cap;
    return 0;
}

/* Zig-zag varint of v into p; returns bytes written (<= 10). */
static inline int
put_varint(unsigned char *p, int64_t v)
{
    uint64_t raw = ((uint64_t)v << 1) ^ (uint64_t)(v >> 63);
    int n = 0;
    while (raw > 0x7F) {
        p[n++] = (unsigned char)((raw & 0x7F) | 0x80);
        raw >>= 7;
    }
    p[n++] = (unsigned char)raw;
    return n;
}

static inline int
varint_size(int64_t v)
{
    uint64_t raw = ((uint64_t)v << 1) ^ (uint64_t)(v >> 63);
    int n = 1;
    while (raw > 0x7F) {
        raw >>= 7;
        n++;
    }
    return n;
}

/* Append the encoded headers of one record (the sequence `headers`) to o. */
static int
encode_headers(Out *o, PyObject *headers)
{
    PyObject *seq = PySequence_Fast(headers, "headers must be a sequence of pairs");
    Py_ssize_t i, count;
    if (seq == NULL)
        return -1;
    count = PySequence_Fast_GET_SIZE(seq);
    if (out_reserve(o, 10) < 0)
        goto error;
    o->len += put_varint(o->data + o->len, count);
    for (i = 0; i < count; i++) {
        PyObject *pair = PySequence_Fast_GET_ITEM(seq, i), *hkey, *hvalue;
        Py_ssize_t klen;
        const char *kbuf;
        if (!PyTuple_Check(pair) && !PyList_Check(pair)) {
            PyErr_SetString(PyExc_TypeError, "a header must be a (str, bytes) pair");
            goto error;
        }
        if (PySequence_Fast_GET_SIZE(pair) != 2) {
            PyErr_SetString(PyExc_ValueError, "a header must be a (str, bytes) pair");
            goto error;
        }
        hkey = PySequence_Fast_GET_ITEM(pair, 0);
        hvalue = PySequence_Fast_GET_ITEM(pair, 1);
        kbuf = PyUnicode_AsUTF8AndSize(hkey, &klen);
        if (kbuf == NULL)
            goto error;
        if (out_reserve(o, 10 + klen) < 0)
            goto error;
        o->len += put_varint(o->data + o->len, klen);
        memcpy(o->data + o->len, kbuf, klen);
        o->len += klen;
        if (hvalue == Py_None) {
            if (out_reserve(o, 1) < 0)
                goto error;
            o->len += put_varint(o->data + o->len, -1);
        } else {
            Py_buffer v;
            if (PyObject_GetBuffer(hvalue, &v, PyBUF_SIMPLE) < 0)
                goto error;
            if (out_reserve(o, 10 + v.len) < 0) {
                PyBuffer_Release(&v);
                goto error;
            }
            o->len += put_varint(o->data + o->len, v.len);
            memcpy(o->data + o->len, v.buf, v.len);
            o->len += v.len;
            PyBuffer_Release(&v);
        }
    }
    Py_DECREF(seq);
    return 0;
error:
    Py_DECREF(seq);
    return -1;
}

/* The records section written straight into a new bytearray after `room` zero bytes,
 * each key and value copied once, for the common rows: exact 4-tuples of exact bytes
 * or None key and value, no headers, an int or None timestamp. Returns the result
 * tuple, NULL with an error set, or Py_NotImplemented (borrowed, nothing set) for any
 * other row: the general loop below takes the whole batch then. */
/* The encoded size of one header-less record's body (after its length varint);
 * klen/vlen -1 for a null key/value. */
static inline Py_ssize_t
plain_body_size(int64_t ts_delta, Py_ssize_t i, Py_ssize_t klen, Py_ssize_t vlen)
{
    return 1 + varint_size(ts_delta) + varint_size(i) + 1 +
        (klen < 0 ? 1 : varint_size(klen) + klen) + (vlen < 0 ? 1 : varint_size(vlen) + vlen);
}

static PyObject *
encode_plain(PyObject *seq, Py_ssize_t count, int64_t now_ms, Py_ssize_t room)
{
    int64_t base_ts = 0, max_ts = 0;
    Py_ssize_t total = room;
    /* pass 1: check every row, take the timestamps, size the section */
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *rec = PySequence_Fast_GET_ITEM(seq, i);
        if (!PyTuple_CheckExact(rec) || PyTuple_GET_SIZE(rec) != 4)
            return Py_NotImplemented;
        PyObject *key = PyTuple_GET_ITEM(rec, 0), *value = PyTuple_GET_ITEM(rec, 1),
                 *ts_obj = PyTuple_GET_ITEM(rec, 3);
        if ((key != Py_None && !PyBytes_CheckExact(key)) ||
                (value != Py_None && !PyBytes_CheckExact(value)) ||
                PyTuple_GET_ITEM(rec, 2) != Py_None ||
                (ts_obj != Py_None && !PyLong_CheckExact(ts_obj)))
            return Py_NotImplemented;
        int64_t ts = now_ms;
        if (ts_obj != Py_None) {
            int overflow = 0;
            ts = PyLong_AsLongLongAndOverflow(ts_obj, &overflow);
            if (overflow || (ts == -1 && PyErr_Occurred())) {
                PyErr_Clear();
                return Py_NotImplemented;    /* the general loop raises its error */
            }
        }
        if (i == 0)
            base_ts = max_ts = ts;
        else if (ts > max_ts)
            max_ts = ts;
        Py_ssize_t body = plain_body_size(
            ts - base_ts, i, key == Py_None ? -1 : PyBytes_GET_SIZE(key),
            value == Py_None ? -1 : PyBytes_GET_SIZE(value));
        total += varint_size(body) + body;
    }
    PyObject *batch = PyByteArray_FromStringAndSize(NULL, total);
    if (batch == NULL)
        return NULL;
    unsigned char *p = (unsigned char *)PyByteArray_AS_STRING(batch);
    memset(p, 0, room);
    p += room;
    /* pass 2: write; the timestamps are read again (exact ints, checked above) */
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *rec = PySequence_Fast_GET_ITEM(seq, i);
        PyObject *key = PyTuple_GET_ITEM(rec, 0), *value = PyTuple_GET_ITEM(rec, 1),
                 *ts_obj = PyTuple_GET_ITEM(rec, 3);
        int64_t ts = ts_obj == Py_None ? now_ms : PyLong_AsLongLong(ts_obj);
        Py_ssize_t klen = key == Py_None ? -1 : PyBytes_GET_SIZE(key);
        Py_ssize_t vlen = value == Py_None ? -1 : PyBytes_GET_SIZE(value);
        p += put_varint(p, plain_body_size(ts - base_ts, i, klen, vlen));
        *p++ = 0;                                  /* attributes */
        p += put_varint(p, ts - base_ts);
        p += put_varint(p, i);
        p += put_varint(p, klen);
        if (klen > 0) {
            memcpy(p, PyBytes_AS_STRING(key), klen);
            p += klen;
        }
        p += put_varint(p, vlen);
        if (vlen > 0) {
            memcpy(p, PyBytes_AS_STRING(value), vlen);
            p += vlen;
        }
        *p++ = 0;                                  /* no headers */
    }
    assert(p == (unsigned char *)PyByteArray_AS_STRING(batch) + total);
    return Py_BuildValue("(NLL)", batch, (long long)base_ts, (long long)max_ts);
}

PyDoc_STRVAR(encode_records_doc,
"encode_records(records, now_ms, room=-1) -> (payload, base_timestamp, max_timestamp)\n\n"
"The uncompressed records section for (key, value, headers, timestamp_ms) tuples;\n"
"a timestamp of None means now_ms. Keys and values are bytes-like or None.\n"
"With room >= 0 the payload is a bytearray whose first `room` bytes are zero (left\n"
"for the batch header) followed by the section; else bytes.");

static PyObject *
encode_records(PyObject *self, PyObject *args)
{
    PyObject *records, *seq = NULL, *result = NULL, *record_fields = NULL;
    long long now_ms;
    Out body = {NULL, 0, 0}, out = {NULL, 0, 0};
    Py_ssize_t i, count;
    int64_t base_ts = 0, max_ts = 0;
    Py_ssize_t room = -1;

    if (!PyArg_ParseTuple(args, "OL|n:encode_records", &records, &now_ms, &room))
        return NULL;
    seq = PySequence_Fast(records, "records must be a sequence");
    if (seq == NULL)
        return NULL;
    count = PySequence_Fast_GET_SIZE(seq);
    if (count == 0) {
        PyErr_SetString(PyExc_ValueError, "a batch holds at least one record");
        goto error;
    }
    if (room >= 0) {
        result = encode_plain(seq, count, now_ms, room);
        if (result != Py_NotImplemented)
            goto error;                  /* done (or failed): clean up and return */
        result = NULL;
    }
    for (i = 0; i < count; i++) {
        PyObject *rec = PySequence_Fast_GET_ITEM(seq, i), *key, *value, *headers, *ts_obj;
        int64_t ts;
        Py_buffer kb, vb;
        int has_key, has_value;
        if (PyTuple_CheckExact(rec) && PyTuple_GET_SIZE(rec) == 4) {
            key = PyTuple_GET_ITEM(rec, 0);
            value = PyTuple_GET_ITEM(rec, 1);
            headers = PyTuple_GET_ITEM(rec, 2);
            ts_obj = PyTuple_GET_ITEM(rec, 3);
        } else {   /* any other 4-item sequence, as the Python encoder accepts */
            PyObject *fields = PySequence_Tuple(rec);
            if (fields == NULL)
                goto error;
            if (PyTuple_GET_SIZE(fields) != 4) {
                Py_DECREF(fields);
                PyErr_SetString(PyExc_ValueError,
                                "a record is a (key, value, headers, timestamp_ms) tuple");
                goto error;
            }
            Py_CLEAR(record_fields);
            record_fields = fields;      /* keeps the four items alive for this record */
            key = PyTuple_GET_ITEM(fields, 0);
            value = PyTuple_GET_ITEM(fields, 1);
            headers = PyTuple_GET_ITEM(fields, 2);
            ts_obj = PyTuple_GET_ITEM(fields, 3);
        }
        if (ts_obj == Py_None) {
            ts = now_ms;
        } else {
            ts = PyLong_AsLongLong(ts_obj);
            if (ts == -1 && PyErr_Occurred())
                goto error;
        }
        if (i == 0)
            base_ts = max_ts = ts;
        else if (ts > max_ts)
            max_ts = ts;
        /* body: attributes, timestampDelta, offsetDelta, key, value, headers */
        body.len = 0;
        has_key = key != Py_None;
        has_value = value != Py_None;
        if (has_key && PyObject_GetBuffer(key, &kb, PyBUF_SIMPLE) < 0)
            goto error;
        if (has_value && PyObject_GetBuffer(value, &vb, PyBUF_SIMPLE) < 0) {
            if (has_key)
                PyBuffer_Release(&kb);
            goto error;
        }
        if (out_reserve(&body, 41 + (has_key ? kb.len : 0) + (has_value ? vb.len : 0)) < 0) {
            if (has_key)
                PyBuffer_Release(&kb);
            if (has_value)
                PyBuffer_Release(&vb);
            goto error;
        }
        body.data[body.len++] = 0;
        body.len += put_varint(body.data + body.len, ts - base_ts);
        body.len += put_varint(body.data + body.len, i);
        if (has_key) {
            body.len += put_varint(body.data + body.len, kb.len);
            memcpy(body.data + body.len, kb.buf, kb.len);
            body.len += kb.len;
            PyBuffer_Release(&kb);
        } else {
            body.len += put_varint(body.data + body.len, -1);
        }
        if (has_value) {
            body.len += put_varint(body.data + body.len, vb.len);
            memcpy(body.data + body.len, vb.buf, vb.len);
            body.len += vb.len;
            PyBuffer_Release(&vb);
        } else {
            body.len += put_varint(body.data + body.len, -1);
        }
        if (headers == Py_None) {
            body.data[body.len++] = 0;
        } else {
            int truth = PyObject_IsTrue(headers);
            if (truth < 0)
                goto error;
            if (truth) {
                if (encode_headers(&body, headers) < 0)
                    goto error;
            } else {
                body.data[body.len++] = 0;
            }
        }
        if (out_reserve(&out, 10 + body.len) < 0)
            goto error;
        out.len += put_varint(out.data + out.len, body.len);
        memcpy(out.data + out.len, body.data, body.len);
        out.len += body.len;
    }
    {
        PyObject *payload;
        if (room >= 0) {
            payload = PyByteArray_FromStringAndSize(NULL, room + out.len);
            if (payload != NULL) {
                memset(PyByteArray_AS_STRING(payload), 0, room);
                if (out.len)
                    memcpy(PyByteArray_AS_STRING(payload) + room, out.data, out.len);
            }
        } else {
            payload = PyBytes_FromStringAndSize((const char *)out.data, out.len);
        }
        if (payload == NULL)
            goto error;
        result = Py_BuildValue("(NLL)", payload, (long long)base_ts, (long long)max_ts);
    }
error:
    PyMem_Free(body.data);
    PyMem_Free(out.data);
    Py_XDECREF(record_fields);
    Py_XDECREF(seq);
    return result;
}

/* ---- murmur2 --------------------------------------------------------------------- */

PyDoc_STRVAR(murmur2_doc,
"murmur2(data) -> int\n\nKafka's murmur2 (seed 0x9747b28c) as a signed 32-bit int.");

static PyObject *
murmur2(PyObject *self, PyObject *arg)
{
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    uint32_t h = logkit_murmur2((const unsigned char *)view.buf, view.len);
    PyBuffer_Release(&view);
    return PyLong_FromLong((long)(int32_t)h);
}

/* ---- the cleaner's key map (cleaner.OffsetMap) and one batch's filter ------------- */
/* The table is a caller's writable buffer of `slots` 24-byte slots (Kafka's
 * SkimpyOffsetMap, with open addressing and linear probing): 16 bytes naming the key
 * (a key of at most 16 bytes itself, zero-padded; a longer one its MurmurHash3 x64 128
 * digest), then a little-endian word, tag << 56 | offset (tag 0: an empty slot; 1..17:
 * a short key's length + 1; 0x80: a digest). cleaner.py holds the pure-Python twins. */

#define MAP_SLOT 24
#define MAP_SHORT_KEY 16
#define MAP_TAG_DIGEST 0x80ULL
#define MAP_OFFSET_MASK ((1ULL << 56) - 1)

static inline uint64_t
rotl64(uint64_t x, int r)
{
    return (x << r) | (x >> (64 - r));
}

static inline uint64_t
fmix64(uint64_t k)
{
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ULL;
    k ^= k >> 33;
    return k;
}

static inline uint64_t
le64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static inline void
put_le64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) {
        p[i] = (unsigned char)v;
        v >>= 8;
    }
}

/* MurmurHash3 x64 128 (seed 0), written from the algorithm's published description:
 * the 16-byte digest is h1 then h2, each little-endian. */
static void
murmur3_128(const unsigned char *data, Py_ssize_t len, unsigned char out[16])
{
    const uint64_t c1 = 0x87c37b91114253d5ULL, c2 = 0x4cf5ad432745937fULL;
    uint64_t h1 = 0, h2 = 0, k1, k2;
    Py_ssize_t blocks = len / 16, i;
    for (i = 0; i < blocks; i++) {
        k1 = le64(data + i * 16);
        k2 = le64(data + i * 16 + 8);
        k1 *= c1; k1 = rotl64(k1, 31); k1 *= c2; h1 ^= k1;
        h1 = rotl64(h1, 27); h1 += h2; h1 = h1 * 5 + 0x52dce729;
        k2 *= c2; k2 = rotl64(k2, 33); k2 *= c1; h2 ^= k2;
        h2 = rotl64(h2, 31); h2 += h1; h2 = h2 * 5 + 0x38495ab5;
    }
    const unsigned char *tail = data + blocks * 16;
    Py_ssize_t rest = len & 15;
    k1 = k2 = 0;
    for (i = rest - 1; i >= 8; i--)
        k2 = k2 << 8 | tail[i];
    for (i = (rest < 8 ? rest : 8) - 1; i >= 0; i--)
        k1 = k1 << 8 | tail[i];
    if (rest > 8) {
        k2 *= c2; k2 = rotl64(k2, 33); k2 *= c1; h2 ^= k2;
    }
    if (rest > 0) {
        k1 *= c1; k1 = rotl64(k1, 31); k1 *= c2; h1 ^= k1;
    }
    h1 ^= (uint64_t)len;
    h2 ^= (uint64_t)len;
    h1 += h2;
    h2 += h1;
    h1 = fmix64(h1);
    h2 = fmix64(h2);
    h1 += h2;
    h2 += h1;
    put_le64(out, h1);
    put_le64(out + 8, h2);
}

/* The 16 bytes naming a key and its tag. */
static inline uint64_t
map_ident(const unsigned char *key, Py_ssize_t klen, unsigned char ident[16])
{
    if (klen <= MAP_SHORT_KEY) {
        memset(ident, 0, 16);
        memcpy(ident, key, (size_t)klen);
        return (uint64_t)klen + 1;
    }
    murmur3_128(key, klen, ident);
    return MAP_TAG_DIGEST;
}

/* The slot of a key: its own, or the empty one where it would go. */
static inline unsigned char *
map_find(unsigned char *table, Py_ssize_t slots, const unsigned char ident[16],
         uint64_t tag)
{
    uint64_t h = fmix64(le64(ident) ^ rotl64(le64(ident + 8), 31) ^ tag);
    Py_ssize_t i = (Py_ssize_t)(h % (uint64_t)slots);
    for (;;) {
        unsigned char *slot = table + i * MAP_SLOT;
        uint64_t word = le64(slot + 16);
        if (word == 0 || ((word >> 56) == tag && memcmp(slot, ident, 16) == 0))
            return slot;
        if (++i == slots)
            i = 0;
    }
}

PyDoc_STRVAR(murmur3_128_doc,
"murmur3_128(data) -> bytes\n\nMurmurHash3 x64 128 (seed 0) of data: h1 then h2, little-endian.");

static PyObject *
murmur3_128_py(PyObject *self, PyObject *arg)
{
    Py_buffer view;
    unsigned char out[16];
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    murmur3_128((const unsigned char *)view.buf, view.len, out);
    PyBuffer_Release(&view);
    return PyBytes_FromStringAndSize((const char *)out, 16);
}

PyDoc_STRVAR(map_get_doc,
"map_get(table, slots, key) -> int\n\nThe offset the table maps key to, or -1.");

static PyObject *
map_get(PyObject *self, PyObject *args)
{
    Py_buffer table, key;
    Py_ssize_t slots;
    unsigned char ident[16];
    long long got = -1;
    if (!PyArg_ParseTuple(args, "y*ny*", &table, &slots, &key))
        return NULL;
    if (slots < 1 || table.len < slots * MAP_SLOT) {
        PyErr_SetString(PyExc_ValueError, "the table is smaller than its slots");
    } else {
        uint64_t tag = map_ident(key.buf, key.len, ident);
        unsigned char *slot = map_find(table.buf, slots, ident, tag);
        uint64_t word = le64(slot + 16);
        if (word != 0)
            got = (long long)(word & MAP_OFFSET_MASK);
    }
    PyBuffer_Release(&table);
    PyBuffer_Release(&key);
    if (PyErr_Occurred())
        return NULL;
    return PyLong_FromLongLong(got);
}

/* Walk one record of a section: its key and where its fields sit. */
typedef struct {
    Py_ssize_t start, body, ts_at, ts_end, record_end;
    int64_t ts_delta, offset_delta, klen, vlen;
    Py_ssize_t key_at;
} CleanFields;

static int
clean_parse(const unsigned char *buf, Py_ssize_t *ppos, Py_ssize_t end, CleanFields *f)
{
    Py_ssize_t pos = *ppos;
    int64_t length;
    f->start = pos;
    READ_VARINT(length);
    if (length < 1 || length > end - pos) {
        PyErr_Format(PyExc_ValueError, "record length field says %lld, %zd bytes left",
                     (long long)length, end - pos);
        goto error;
    }
    f->body = pos;
    f->record_end = pos + (Py_ssize_t)length;
    pos += 1;
    f->ts_at = pos;
    READ_VARINT(f->ts_delta);
    f->ts_end = pos;
    READ_VARINT(f->offset_delta);
    READ_VARINT(f->klen);
    f->key_at = pos;
    if (f->klen >= 0) {
        if (f->klen > f->record_end - pos) {
            PyErr_SetString(PyExc_ValueError, "key runs past the end of its record");
            goto error;
        }
        pos += (Py_ssize_t)f->klen;
    }
    READ_VARINT(f->vlen);
    if (f->vlen > f->record_end - pos) {
        PyErr_SetString(PyExc_ValueError, "value runs past the end of its record");
        goto error;
    }
    *ppos = f->record_end;
    return 0;
error:
    return -1;
}

static inline Py_ssize_t
put_zigzag(unsigned char *p, int64_t value)
{
    uint64_t raw = ((uint64_t)value << 1) ^ (uint64_t)(value >> 63);
    Py_ssize_t n = 0;
    while (raw > 0x7F) {
        p[n++] = (unsigned char)((raw & 0x7F) | 0x80);
        raw >>= 7;
    }
    p[n++] = (unsigned char)raw;
    return n;
}

PyDoc_STRVAR(map_put_doc,
"map_put(buf, pos, end, count, base_offset, min_offset, table, slots, size) -> int\n\n"
"Map each keyed record of the uncompressed section buf[pos:end] with an offset at\n"
"least min_offset to its offset, in order; returns the keys the table then holds.");

static PyObject *
map_put(PyObject *self, PyObject *args)
{
    Py_buffer view, table;
    Py_ssize_t pos, end, slots, size;
    long long count, base_offset, min_offset;
    if (!PyArg_ParseTuple(args, "y*nnLLLw*nn", &view, &pos, &end, &count, &base_offset,
                          &min_offset, &table, &slots, &size))
        return NULL;
    const unsigned char *buf = view.buf;
    unsigned char ident[16];
    CleanFields f;
    if (pos < 0 || end > view.len || pos > end || slots < 1 || table.len < slots * MAP_SLOT) {
        PyErr_SetString(PyExc_ValueError, "section or table out of bounds");
        goto error;
    }
    for (long long i = 0; i < count; i++) {
        if (clean_parse(buf, &pos, end, &f) < 0)
            goto error;
        int64_t offset = base_offset + f.offset_delta;
        if (f.klen < 0 || offset < min_offset)
            continue;
        if (offset < 0 || (uint64_t)offset > MAP_OFFSET_MASK) {
            PyErr_SetString(PyExc_ValueError, "offset does not fit the key map's 56 bits");
            goto error;
        }
        uint64_t tag = map_ident(buf + f.key_at, (Py_ssize_t)f.klen, ident);
        unsigned char *slot = map_find(table.buf, slots, ident, tag);
        if (le64(slot + 16) == 0) {
            if (size + 1 >= slots) {
                PyErr_SetString(PyExc_ValueError, "the key map is full");
                goto error;
            }
            size++;
            memcpy(slot, ident, 16);
        }
        put_le64(slot + 16, tag << 56 | (uint64_t)offset);
    }
    PyBuffer_Release(&view);
    PyBuffer_Release(&table);
    return PyLong_FromSsize_t(size);
error:
    PyBuffer_Release(&view);
    PyBuffer_Release(&table);
    return NULL;
}

PyDoc_STRVAR(clean_records_doc,
"clean_records(buf, pos, end, count, base_offset, table, slots, map_end, drop_tombstones,\n"
"              stamp_shift) -> (section, kept, tombstone_kept, max_ts_delta)\n\n"
"The records of the uncompressed section buf[pos:end] a cleaning pass keeps\n"
"(cleaner.keep_records' rules), their bytes copied as they are; when a tombstone is\n"
"kept and stamp_shift is not None, stamp_shift is added to each kept record's\n"
"timestamp delta (the batch is restamped with a delete horizon). max_ts_delta is the\n"
"largest kept record's original timestamp delta, None when none is kept.");

static PyObject *
clean_records(PyObject *self, PyObject *args)
{
    Py_buffer view, table;
    Py_ssize_t pos, end, slots;
    long long count, base_offset, map_end, ts_shift = 0;
    int drop_tombstones;
    PyObject *stamp_shift;
    unsigned char *out = NULL, *shifted = NULL;
    if (!PyArg_ParseTuple(args, "y*nnLLy*nLpO", &view, &pos, &end, &count, &base_offset,
                          &table, &slots, &map_end, &drop_tombstones, &stamp_shift))
        return NULL;
    if (stamp_shift != Py_None) {
        ts_shift = PyLong_AsLongLong(stamp_shift);
        if (ts_shift == -1 && PyErr_Occurred()) {
            PyBuffer_Release(&view);
            PyBuffer_Release(&table);
            return NULL;
        }
    }
    const unsigned char *buf = view.buf;
    unsigned char ident[16];
    CleanFields f;
    Py_ssize_t n = 0;
    long long kept = 0;
    int tombstone = 0, any = 0;
    int64_t max_delta = 0;
    if (pos < 0 || end > view.len || pos > end || slots < 1 || table.len < slots * MAP_SLOT
            || count < 0 || count > end - pos) {
        PyErr_SetString(PyExc_ValueError, "section or table out of bounds");
        goto error;
    }
    out = PyMem_Malloc((size_t)(end - pos) + (size_t)count * 12 + 1);
    if (out == NULL) {
        PyErr_NoMemory();
        goto error;
    }
    for (long long i = 0; i < count; i++) {
        if (clean_parse(buf, &pos, end, &f) < 0)
            goto error;
        if (f.klen < 0)
            continue;                                  /* keyless: never kept */
        int64_t offset = base_offset + f.offset_delta;
        if (offset < map_end) {
            uint64_t tag = map_ident(buf + f.key_at, (Py_ssize_t)f.klen, ident);
            unsigned char *slot = map_find(table.buf, slots, ident, tag);
            uint64_t word = le64(slot + 16);
            if (word != 0 && (int64_t)(word & MAP_OFFSET_MASK) > offset)
                continue;                              /* a later record of its key */
        }
        if (f.vlen < 0) {
            if (drop_tombstones)
                continue;                              /* past its delete horizon */
            tombstone = 1;
        }
        if (!any || f.ts_delta > max_delta)
            max_delta = f.ts_delta;
        any = 1;
        kept++;
        memcpy(out + n, buf + f.start, (size_t)(f.record_end - f.start));
        n += f.record_end - f.start;
    }
    if (pos != end) {
        PyErr_Format(PyExc_ValueError, "%zd stray bytes after the last record", end - pos);
        goto error;
    }
    if (tombstone && ts_shift != 0) {                  /* restamped: new deltas */
        Py_ssize_t at = 0, m = 0;
        shifted = PyMem_Malloc((size_t)n + (size_t)kept * 12 + 1);
        if (shifted == NULL) {
            PyErr_NoMemory();
            goto error;
        }
        for (long long i = 0; i < kept; i++) {
            unsigned char ts[10];
            if (clean_parse(out, &at, n, &f) < 0)
                goto error;
            Py_ssize_t ts_len = put_zigzag(ts, f.ts_delta + ts_shift);
            Py_ssize_t rest = f.record_end - f.ts_end;
            m += put_zigzag(shifted + m, (int64_t)(1 + ts_len + rest));
            shifted[m++] = out[f.body];                /* record attributes */
            memcpy(shifted + m, ts, (size_t)ts_len);
            m += ts_len;
            memcpy(shifted + m, out + f.ts_end, (size_t)rest);
            m += rest;
        }
        PyMem_Free(out);
        out = shifted;
        shifted = NULL;
        n = m;
    }
    PyBuffer_Release(&view);
    PyBuffer_Release(&table);
    PyObject *section = PyBytes_FromStringAndSize((const char *)out, n);
    PyMem_Free(out);
    if (section == NULL)
        return NULL;
    if (!any)
        return Py_BuildValue("(NLOO)", section, kept, Py_False, Py_None);
    return Py_BuildValue("(NLOL)", section, kept, tombstone ? Py_True : Py_False,
                         (long long)max_delta);
error:
    PyMem_Free(out);
    PyMem_Free(shifted);
    PyBuffer_Release(&view);
    PyBuffer_Release(&table);
    return NULL;
}

static PyMethodDef methods[] = {
    {"decode_records", decode_records, METH_VARARGS, decode_records_doc},
    {"check_records", check_records, METH_VARARGS, check_records_doc},
    {"decode_columns", decode_columns, METH_VARARGS, decode_columns_doc},
    {"encode_records", encode_records, METH_VARARGS, encode_records_doc},
    {"murmur2", murmur2, METH_O, murmur2_doc},
    {"walk_batches", (PyCFunction)(void (*)(void))walk_batches, METH_FASTCALL,
     walk_batches_doc},
    {"murmur3_128", murmur3_128_py, METH_O, murmur3_128_doc},
    {"map_get", map_get, METH_VARARGS, map_get_doc},
    {"map_put", map_put, METH_VARARGS, map_put_doc},
    {"clean_records", clean_records, METH_VARARGS, clean_records_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "logkit._speedups",
    "Optional compiled record codec and murmur2 (see the C source header).", -1, methods,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    return PyModule_Create(&module);
}
