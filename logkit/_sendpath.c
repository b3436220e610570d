/* logkit._sendpath: the common case of Producer.send() in C.
 *
 * Owns nothing: a Sender holds references to one producer's topic states and does, in
 * C, exactly what the fast path of logkit/producer.py `Producer.send` does in
 * Python -- bytes key and value, no headers or explicit timestamp, the partition the
 * default partitioner picks or an explicit one the topic state has, a known topic
 * whose open batch has room. Every other case, and any surprise, is handed
 * to the Python method unchanged, so the two paths cannot disagree on anything but
 * speed. The Python module stays complete: without this extension nothing changes.
 *
 * Validation stays in Python on purpose: a call with a timestamp or headers always
 * falls back (only `key`, `value` and `partition` are taken here: exact bytes, and an
 * exact int inside the state's partitions), so the timestamp range, header type and
 * partition range checks of Producer._send_general run
 * for every record whichever path is built. Fork safety costs nothing here either: in a
 * forked child producer.py's at-fork hook sets `slow`, sending every call to the Python
 * method, which raises ForkedProcessError; it also calls forked(), after which
 * callback registration takes the Python path (which raises) too.
 *
 * Callbacks: FutureBase.add_callback/add_errback register (row, ok, err, index) on the
 * batch in C, and run_callbacks is Producer._resolve's loop for a batch stored whole
 * (RecordMetadata made as a plain tuple of its type, offset = base + the row's index);
 * errors, split batches and anything unusual take the Python code.
 *
 * The accumulator's per-record state lives in C fields here (BatchBase, TopicBase,
 * which accumulator.py's Batch and TopicBatches subclass when this module is built), so
 * a record costs a dict lookup, a murmur2 when keyed, two allocations (the row, the
 * future) and a list append; the Python code reads and writes the same fields by their
 * names.
 *
 * Thread-safety: like the Python fast path it takes no lock. With this module built the
 * rows go straight into `Batch.rows` (no inbox): the check that the batch is open and
 * has room and the append are one step under the GIL (nothing between them allocates
 * or runs Python code), and a sealer sets `sealed` holding the GIL, so a row is either
 * in the batch before it is sealed or not added at all (then the Python method takes
 * the call). The accumulator's own adds (under its lock) append to `rows` too, so rows
 * keep their send order.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include "_murmur2.h"

/* The per-record size estimate: must equal records.RECORD_OVERHEAD_BYTES (the one
 * estimate every batch sizer uses), or the two send paths would fill batches
 * differently. */
#define RECORD_OVERHEAD_BYTES 21

/* ---- FutureBase: the fields of FutureRecordMetadata, allocated without a Python
 * __init__ (producer.py subclasses it and adds every method). */

typedef struct {
    PyObject_HEAD
    PyObject *batch;
    PyObject *row;
    PyObject *acks;
    Py_ssize_t index;        /* the row's place in batch.rows; -1: not known */
} FutureBase;

/* Set in a forked child (producer.py's at-fork hook calls forked()): every callback
 * registration then takes the Python path, which raises ForkedProcessError. */
static int in_forked_child = 0;
static PyObject *s_add;      /* "_add": FutureRecordMetadata's Python registration */

static int
future_init(FutureBase *self, PyObject *args, PyObject *kwds)
{
    PyObject *batch, *row, *acks;
    if (!PyArg_ParseTuple(args, "OOO", &batch, &row, &acks))
        return -1;
    Py_XSETREF(self->batch, Py_NewRef(batch));
    Py_XSETREF(self->row, Py_NewRef(row));
    Py_XSETREF(self->acks, Py_NewRef(acks));
    self->index = -1;
    return 0;
}

static int
future_traverse(FutureBase *self, visitproc visit, void *arg)
{
    Py_VISIT(self->batch);
    Py_VISIT(self->row);
    Py_VISIT(self->acks);
    return 0;
}

static int
future_clear(FutureBase *self)
{
    Py_CLEAR(self->batch);
    Py_CLEAR(self->row);
    Py_CLEAR(self->acks);
    return 0;
}

static void
future_dealloc(FutureBase *self)
{
    /* Subclasses are heap types: their subtype_dealloc calls this, then drops the
     * type's reference itself. */
    PyObject_GC_UnTrack(self);
    future_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef future_members[] = {
    {"_batch", T_OBJECT_EX, offsetof(FutureBase, batch), READONLY, NULL},
    {"_row", T_OBJECT_EX, offsetof(FutureBase, row), READONLY, NULL},
    {"_acks", T_OBJECT_EX, offsetof(FutureBase, acks), READONLY, NULL},
    {"_index", T_PYSSIZET, offsetof(FutureBase, index), READONLY, NULL},
    {NULL}
};

static PyObject *future_add(FutureBase *self, PyObject *ok, PyObject *err);

static PyObject *
future_add_callback(FutureBase *self, PyObject *fn)
{
    return future_add(self, fn, Py_None);
}

static PyObject *
future_add_errback(FutureBase *self, PyObject *fn)
{
    return future_add(self, Py_None, fn);
}

static PyMethodDef future_methods[] = {
    {"add_callback", (PyCFunction)future_add_callback, METH_O,
     "Call fn(metadata) once the record is stored (at once if it already is)."},
    {"add_errback", (PyCFunction)future_add_errback, METH_O,
     "Call fn(error) if the record could not be stored."},
    {NULL}
};

static PyTypeObject FutureBaseType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "logkit._sendpath.FutureBase",
    .tp_doc = "FutureBase(batch, row, acks): the fields of FutureRecordMetadata.",
    .tp_basicsize = sizeof(FutureBase),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_BASETYPE,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)future_init,
    .tp_dealloc = (destructor)future_dealloc,
    .tp_traverse = (traverseproc)future_traverse,
    .tp_clear = (inquiry)future_clear,
    .tp_members = future_members,
    .tp_methods = future_methods,
};

/* ---- BatchBase and TopicBase: the fields this path reads, as C fields.
 *
 * accumulator.py's Batch and TopicBatches subclass them when this module is built (the
 * pure-Python twins there have the same names), so a record's check-and-add is a few
 * loads and stores instead of attribute lookups. BatchBase: `rows` (the list the batch
 * encodes), `size` (estimated bytes plus the accumulator's bias), `sealed`. TopicBase:
 * `open` (list: partition -> open batch or None), `sticky` (the null-key partition). */

typedef struct {
    PyObject_HEAD
    PyObject *rows;
    Py_ssize_t size;
    char sealed;
    char finished;           /* set once by Producer._resolve, before it takes callbacks */
    PyObject *callbacks;     /* list of (row, ok, err, index) waiting for the append */
} BatchBase;

static PyTypeObject BatchBaseType;

static int
batch_traverse(BatchBase *self, visitproc visit, void *arg)
{
    Py_VISIT(self->rows);
    Py_VISIT(self->callbacks);
    return 0;
}

static int
batch_clear(BatchBase *self)
{
    Py_CLEAR(self->rows);
    Py_CLEAR(self->callbacks);
    return 0;
}

static void
batch_dealloc(BatchBase *self)
{
    PyObject_GC_UnTrack(self);
    batch_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* offer(row, size) -> bool: add `row` to the open batch unless it is sealed, in one
 * step no other thread can split (no allocation, no Python code between the check and
 * the add: the GIL is held throughout). */
static PyObject *
batch_offer(BatchBase *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "offer(row, size) takes 2 arguments");
        return NULL;
    }
    Py_ssize_t size = PyLong_AsSsize_t(args[1]);
    if (size == -1 && PyErr_Occurred())
        return NULL;
    if (self->sealed || self->rows == NULL || !PyList_CheckExact(self->rows))
        Py_RETURN_FALSE;
    if (PyList_Append(self->rows, args[0]) < 0)
        return NULL;
    self->size += size;
    Py_RETURN_TRUE;
}

static PyMethodDef batch_methods[] = {
    {"offer", (PyCFunction)(void (*)(void))batch_offer, METH_FASTCALL,
     "offer(row, size) -> bool: add row unless the batch is sealed (atomic)."},
    {NULL}
};

static PyMemberDef batch_members[] = {
    {"rows", T_OBJECT_EX, offsetof(BatchBase, rows), 0, NULL},
    {"size", T_PYSSIZET, offsetof(BatchBase, size), 0, NULL},
    {"sealed", T_BOOL, offsetof(BatchBase, sealed), 0, NULL},
    {"finished", T_BOOL, offsetof(BatchBase, finished), 0, NULL},
    {"callbacks", T_OBJECT_EX, offsetof(BatchBase, callbacks), 0, NULL},
    {NULL}
};

static PyTypeObject BatchBaseType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "logkit._sendpath.BatchBase",
    .tp_doc = "The fields of accumulator.Batch that the send path reads.",
    .tp_basicsize = sizeof(BatchBase),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_BASETYPE,
    .tp_new = PyType_GenericNew,
    .tp_dealloc = (destructor)batch_dealloc,
    .tp_traverse = (traverseproc)batch_traverse,
    .tp_clear = (inquiry)batch_clear,
    .tp_members = batch_members,
    .tp_methods = batch_methods,
};

/* FutureRecordMetadata.add_callback / add_errback: register (row, ok, err, index) on
 * a batch that is not finished yet, in one step (the entry is made first: an
 * allocation may run the collector); anything else -- a finished batch (run it now),
 * a forked child, a Python-made batch -- goes to the Python `_add`. Producer._resolve
 * sets `finished` before it takes the list, so an entry is either taken or not added. */
static PyObject *
future_add(FutureBase *self, PyObject *ok, PyObject *err)
{
    PyObject *index = NULL, *entry = NULL;
    if (in_forked_child || self->batch == NULL || self->row == NULL ||
            !PyObject_TypeCheck(self->batch, &BatchBaseType))
        goto python;
    BatchBase *batch = (BatchBase *)self->batch;
    if (batch->finished)
        goto python;
    index = PyLong_FromSsize_t(self->index);
    if (index == NULL) return NULL;
    entry = PyTuple_Pack(4, self->row, ok, err, index);
    Py_DECREF(index);
    if (entry == NULL) return NULL;
    if (batch->finished || batch->callbacks == NULL || !PyList_CheckExact(batch->callbacks))
        goto python;
    if (PyList_Append(batch->callbacks, entry) < 0) {
        Py_DECREF(entry);
        return NULL;
    }
    Py_DECREF(entry);
    return Py_NewRef((PyObject *)self);
python:
    Py_XDECREF(entry);
    PyObject *args[3] = {(PyObject *)self, ok, err};
    return PyObject_VectorcallMethod(s_add, args, 3, NULL);
}

/* run_callbacks(callbacks, metadata_type, topic, partition, base_offset, timestamp_ms,
 *               outcome, on_raise): Producer._resolve's loop for a batch stored whole
 * (no error, not split): ok(RecordMetadata(topic, partition, base_offset + index,
 * the row's timestamp or timestamp_ms)) per entry; an entry without an index asks
 * outcome(row). A callback that raises an Exception is handed to on_raise(exc) and the
 * others still run; a BaseException (KeyboardInterrupt...) propagates at once, as in
 * the Python loop. */
static PyObject *
run_callbacks(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "run_callbacks takes 8 arguments");
        return NULL;
    }
    PyObject *callbacks = args[0], *md_type = args[1], *topic = args[2],
             *partition = args[3], *outcome = args[6], *on_raise = args[7];
    Py_ssize_t base = PyLong_AsSsize_t(args[4]);
    if (base == -1 && PyErr_Occurred()) return NULL;
    PyObject *timestamp = args[5];
    if (!PyList_CheckExact(callbacks) || !PyType_Check(md_type)) {
        PyErr_SetString(PyExc_TypeError, "run_callbacks: a list and a type");
        return NULL;
    }
    PyTypeObject *tp = (PyTypeObject *)md_type;
    /* a tuple subclass adding no fields (a NamedTuple) is made as a tuple of 4 */
    int plain = PyType_IsSubtype(tp, &PyTuple_Type) &&
                tp->tp_basicsize == PyTuple_Type.tp_basicsize &&
                tp->tp_itemsize == PyTuple_Type.tp_itemsize && tp->tp_dictoffset == 0;
    Py_ssize_t n = PyList_GET_SIZE(callbacks);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *entry = PyList_GET_ITEM(callbacks, i);
        if (!PyTuple_CheckExact(entry) || PyTuple_GET_SIZE(entry) != 4) {
            PyErr_SetString(PyExc_TypeError, "run_callbacks: entries are 4-tuples");
            return NULL;
        }
        PyObject *row = PyTuple_GET_ITEM(entry, 0), *ok = PyTuple_GET_ITEM(entry, 1);
        if (ok == Py_None)
            continue;                    /* an errback: the batch has no error */
        Py_ssize_t index = PyLong_AsSsize_t(PyTuple_GET_ITEM(entry, 3));
        if (index == -1 && PyErr_Occurred()) return NULL;
        PyObject *md;
        if (index < 0 || !PyTuple_Check(row) || PyTuple_GET_SIZE(row) < 4) {
            md = PyObject_CallOneArg(outcome, row);
        } else {
            PyObject *ts = PyTuple_GET_ITEM(row, 3);
            if (ts == Py_None) ts = timestamp;
            PyObject *offset = PyLong_FromSsize_t(base + index);
            if (offset == NULL) return NULL;
            if (plain) {
                md = tp->tp_alloc(tp, 4);
                if (md != NULL) {
                    PyTuple_SET_ITEM(md, 0, Py_NewRef(topic));
                    PyTuple_SET_ITEM(md, 1, Py_NewRef(partition));
                    PyTuple_SET_ITEM(md, 2, offset);
                    PyTuple_SET_ITEM(md, 3, Py_NewRef(ts));
                } else {
                    Py_DECREF(offset);
                }
            } else {
                PyObject *fields[4] = {topic, partition, offset, ts};
                md = PyObject_Vectorcall(md_type, fields, 4, NULL);
                Py_DECREF(offset);
            }
        }
        if (md == NULL) return NULL;
        PyObject *result = PyObject_CallOneArg(ok, md);
        Py_DECREF(md);
        if (result != NULL) {
            Py_DECREF(result);
            continue;
        }
        if (!PyErr_ExceptionMatches(PyExc_Exception))
            return NULL;                 /* KeyboardInterrupt, SystemExit: propagate */
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyErr_NormalizeException(&type, &value, &tb);
        if (tb != NULL && value != NULL)
            PyException_SetTraceback(value, tb);
        PyObject *logged = PyObject_CallOneArg(on_raise, value ? value : Py_None);
        Py_XDECREF(type); Py_XDECREF(value); Py_XDECREF(tb);
        if (logged == NULL) return NULL;
        Py_DECREF(logged);
    }
    Py_RETURN_NONE;
}

/* forked(): called in a forked child by producer.py's at-fork hook. */
static PyObject *
mark_forked(PyObject *module, PyObject *unused)
{
    in_forked_child = 1;
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"run_callbacks", (PyCFunction)(void (*)(void))run_callbacks, METH_FASTCALL,
     "Producer._resolve's callback loop for a batch stored whole."},
    {"forked", (PyCFunction)mark_forked, METH_NOARGS,
     "Mark this process a forked child: callback registration takes the Python path."},
    {NULL}
};

typedef struct {
    PyObject_HEAD
    PyObject *open;
    Py_ssize_t sticky;
} TopicBase;

static int
topic_traverse(TopicBase *self, visitproc visit, void *arg)
{
    Py_VISIT(self->open);
    return 0;
}

static int
topic_clear(TopicBase *self)
{
    Py_CLEAR(self->open);
    return 0;
}

static void
topic_dealloc(TopicBase *self)
{
    PyObject_GC_UnTrack(self);
    topic_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef topic_members[] = {
    {"open", T_OBJECT_EX, offsetof(TopicBase, open), 0, NULL},
    {"sticky", T_PYSSIZET, offsetof(TopicBase, sticky), 0, NULL},
    {NULL}
};

static PyTypeObject TopicBaseType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "logkit._sendpath.TopicBase",
    .tp_doc = "The fields of accumulator.TopicBatches that the send path reads.",
    .tp_basicsize = sizeof(TopicBase),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_BASETYPE,
    .tp_new = PyType_GenericNew,
    .tp_dealloc = (destructor)topic_dealloc,
    .tp_traverse = (traverseproc)topic_traverse,
    .tp_clear = (inquiry)topic_clear,
    .tp_members = topic_members,
};

/* ---- Sender ------------------------------------------------------------------------ */

/* send()'s keyword names, interned in PyInit__sendpath. */
static PyObject *s_key, *s_value, *s_partition;

typedef struct {
    PyObject_HEAD
    PyObject *fallback;      /* bound Producer.send (the Python method) */
    PyObject *states;        /* dict: topic name -> _TopicState (the accumulator's) */
    PyObject *future_type;   /* FutureRecordMetadata */
    PyObject *acks;          /* int */
    Py_ssize_t batch_size;
    int future_is_base;      /* future_type subclasses FutureBase (checked once) */
    int slow;                /* set when the producer closes: everything goes to Python */
    PyObject *look;          /* called every `look_every` calls, or NULL */
    int look_every;
    int countdown;           /* calls left until the next look */
    vectorcallfunc vectorcall;
} Sender;

static PyObject *
fallback(Sender *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    return PyObject_Vectorcall(self->fallback, args, nargsf, kwnames);
}

/* The last concrete types seen to subclass BatchBase / TopicBase (accumulator.Batch,
 * producer._TopicState): an identity compare instead of a walk of the MRO per record.
 * Strong references, so a cached pointer never outlives its type. */
static PyObject *batch_type_seen, *topic_type_seen;

static inline int
is_kind(PyObject *obj, PyTypeObject *base, PyObject **seen)
{
    PyTypeObject *tp = Py_TYPE(obj);
    if ((PyObject *)tp == *seen)
        return 1;
    if (!PyType_IsSubtype(tp, base))
        return 0;
    Py_XSETREF(*seen, Py_NewRef((PyObject *)tp));
    return 1;
}

/* partition p's open batch if it is a BatchBase that is not sealed and has room for
 * `size` more bytes; else NULL (borrowed). */
static BatchBase *
open_batch(TopicBase *state, Py_ssize_t p, Py_ssize_t size, Py_ssize_t batch_size)
{
    PyObject *open = state->open;
    if (open == NULL || !PyList_CheckExact(open) || p < 0 || p >= PyList_GET_SIZE(open))
        return NULL;
    PyObject *item = PyList_GET_ITEM(open, p);
    if (!is_kind(item, &BatchBaseType, &batch_type_seen))
        return NULL;
    BatchBase *batch = (BatchBase *)item;
    if (batch->sealed || batch->size + size > batch_size || batch->rows == NULL ||
            !PyList_CheckExact(batch->rows))
        return NULL;
    return batch;
}

static PyObject *
sender_call(Sender *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *topic, *value = Py_None, *key = Py_None, *partition = Py_None;
    if (self->slow || nargs < 1 || nargs > 3)
        return fallback(self, args, nargsf, kwnames);
    if (self->look != NULL && --self->countdown <= 0) {
        /* The producer's look for due batches (Producer._look): a sending thread
         * appends them between its sends, not in a closed or forked
         * producer (`slow`). */
        self->countdown = self->look_every;
        PyObject *done = PyObject_CallNoArgs(self->look);
        if (done == NULL)
            return NULL;
        Py_DECREF(done);
    }
    topic = args[0];
    if (nargs > 1) value = args[1];
    if (nargs > 2) key = args[2];
    if (kwnames != NULL) {
        Py_ssize_t nkw = PyTuple_GET_SIZE(kwnames);
        for (Py_ssize_t i = 0; i < nkw; i++) {
            PyObject *name = PyTuple_GET_ITEM(kwnames, i);
            if (name == s_key || PyUnicode_Compare(name, s_key) == 0) {
                if (nargs > 2) return fallback(self, args, nargsf, kwnames);
                key = args[nargs + i];
            } else if (name == s_value || PyUnicode_Compare(name, s_value) == 0) {
                if (nargs > 1) return fallback(self, args, nargsf, kwnames);
                value = args[nargs + i];
            } else if (name == s_partition || PyUnicode_Compare(name, s_partition) == 0) {
                partition = args[nargs + i];
            } else {
                return fallback(self, args, nargsf, kwnames);   /* headers, timestamp... */
            }
        }
    }
    if (!PyBytes_CheckExact(value) || (key != Py_None && !PyBytes_CheckExact(key)))
        return fallback(self, args, nargsf, kwnames);
    PyObject *state_obj = PyDict_GetItemWithError(self->states, topic);  /* borrowed */
    if (state_obj == NULL) {
        if (PyErr_Occurred()) return NULL;
        return fallback(self, args, nargsf, kwnames);
    }
    if (!is_kind(state_obj, &TopicBaseType, &topic_type_seen))
        return fallback(self, args, nargsf, kwnames);
    TopicBase *state = (TopicBase *)state_obj;
    Py_ssize_t size = PyBytes_GET_SIZE(value) + RECORD_OVERHEAD_BYTES;
    Py_ssize_t p;
    if (partition != Py_None) {
        /* an explicit partition: an exact int below the length of `open` (which grows
         * before the count: a partition being added exists already); anything else is
         * checked and named by the Python path */
        PyObject *open = state->open;
        if (!PyLong_CheckExact(partition) || open == NULL || !PyList_CheckExact(open))
            return fallback(self, args, nargsf, kwnames);
        int overflow = 0;
        long long wanted = PyLong_AsLongLongAndOverflow(partition, &overflow);
        if (overflow || wanted < 0 || wanted >= PyList_GET_SIZE(open))
            return fallback(self, args, nargsf, kwnames);
        if (key != Py_None)
            size += PyBytes_GET_SIZE(key);
        p = (Py_ssize_t)wanted;
    } else if (key == Py_None) {
        p = state->sticky;
    } else {
        /* Kafka's keyed partitioner: murmur2, made positive, mod the partition count
         * (the length of `open`, which grows before the count: a key sent during a
         * grow may map by the new count a moment early, as it will right after).
         * No key cache here: looking a fresh bytes key up hashes it anyway, which
         * costs what murmur2 does (the Python path keeps producer.py's cache, its
         * murmur2 being slower). */
        size += PyBytes_GET_SIZE(key);
        PyObject *open = state->open;
        if (open == NULL || !PyList_CheckExact(open) || PyList_GET_SIZE(open) == 0)
            return fallback(self, args, nargsf, kwnames);
        uint32_t h = logkit_murmur2((const unsigned char *)PyBytes_AS_STRING(key),
                                    PyBytes_GET_SIZE(key));
        p = (Py_ssize_t)((h & 0x7fffffffU) % (uint32_t)PyList_GET_SIZE(open));
    }
    /* A look first, so a full batch costs no allocation; then the row and the future
     * are made, and the batch is looked up again: an allocation may run the garbage
     * collector, whose finalizers may let another thread seal the batch. From the
     * second look to the add nothing allocates or runs Python code, so the check and
     * the add are one step for every other thread (the GIL is not released). */
    if (open_batch(state, p, size, self->batch_size) == NULL)
        return fallback(self, args, nargsf, kwnames);
    PyTypeObject *tp = (PyTypeObject *)self->future_type;
    if (!self->future_is_base)
        return fallback(self, args, nargsf, kwnames);
    Py_INCREF(state);
    PyObject *row = PyTuple_New(4);
    if (row == NULL) { Py_DECREF(state); return NULL; }
    PyTuple_SET_ITEM(row, 0, Py_NewRef(key));
    PyTuple_SET_ITEM(row, 1, Py_NewRef(value));
    PyTuple_SET_ITEM(row, 2, Py_NewRef(Py_None));
    PyTuple_SET_ITEM(row, 3, Py_NewRef(Py_None));
    PyObject_GC_UnTrack(row);            /* bytes and None only: never in a cycle */
    FutureBase *future = (FutureBase *)tp->tp_alloc(tp, 0);
    if (future == NULL) { Py_DECREF(row); Py_DECREF(state); return NULL; }
    BatchBase *batch = open_batch(state, p, size, self->batch_size);
    if (batch == NULL) {                 /* sealed or filled meanwhile */
        Py_DECREF(future); Py_DECREF(row); Py_DECREF(state);
        return fallback(self, args, nargsf, kwnames);
    }
    future->index = PyList_GET_SIZE(batch->rows);
    if (PyList_Append(batch->rows, row) < 0) {
        Py_DECREF(future); Py_DECREF(row); Py_DECREF(state);
        return NULL;
    }
    batch->size += size;
    future->batch = Py_NewRef((PyObject *)batch);
    future->row = row;                   /* the reference PyTuple_New gave */
    future->acks = Py_NewRef(self->acks);
    Py_DECREF(state);
    return (PyObject *)future;
}

static PyObject *
sender_tp_call(PyObject *self, PyObject *args, PyObject *kwargs)
{
    return PyVectorcall_Call(self, args, kwargs);
}

static int
sender_init(Sender *self, PyObject *args, PyObject *kwds)
{
    PyObject *fallback_fn, *states, *future_type, *acks, *look = Py_None;
    Py_ssize_t batch_size;
    int look_every = 0;
    if (!PyArg_ParseTuple(args, "OO!OOn|Oi", &fallback_fn, &PyDict_Type, &states,
                          &future_type, &acks, &batch_size, &look, &look_every))
        return -1;
    if (look != Py_None && (!PyCallable_Check(look) || look_every < 1)) {
        PyErr_SetString(PyExc_TypeError, "look must be a callable and look_every >= 1");
        return -1;
    }
    Py_XSETREF(self->look, look == Py_None ? NULL : Py_NewRef(look));
    self->look_every = self->countdown = look_every;
    Py_XSETREF(self->fallback, Py_NewRef(fallback_fn));
    Py_XSETREF(self->states, Py_NewRef(states));
    Py_XSETREF(self->future_type, Py_NewRef(future_type));
    Py_XSETREF(self->acks, Py_NewRef(acks));
    self->batch_size = batch_size;
    self->future_is_base = PyType_Check(future_type) &&
        PyType_IsSubtype((PyTypeObject *)future_type, &FutureBaseType);
    self->slow = 0;
    self->vectorcall = (vectorcallfunc)sender_call;
    return 0;
}

static int
sender_traverse(Sender *self, visitproc visit, void *arg)
{
    Py_VISIT(self->fallback);
    Py_VISIT(self->states);
    Py_VISIT(self->future_type);
    Py_VISIT(self->acks);
    Py_VISIT(self->look);
    return 0;
}

static int
sender_clear(Sender *self)
{
    Py_CLEAR(self->fallback);
    Py_CLEAR(self->states);
    Py_CLEAR(self->future_type);
    Py_CLEAR(self->acks);
    Py_CLEAR(self->look);
    return 0;
}

static void
sender_dealloc(Sender *self)
{
    PyObject_GC_UnTrack(self);
    sender_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef sender_members[] = {
    {"slow", T_INT, offsetof(Sender, slow), 0, "nonzero: every call goes to Python"},
    {NULL}
};

static PyTypeObject SenderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "logkit._sendpath.Sender",
    .tp_doc = "Sender(send_py, states, future_type, acks, batch_size, look=None, "
              "look_every=0): Producer.send's common case in C; calls look() every "
              "look_every calls.",
    .tp_basicsize = sizeof(Sender),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)sender_init,
    .tp_dealloc = (destructor)sender_dealloc,
    .tp_traverse = (traverseproc)sender_traverse,
    .tp_clear = (inquiry)sender_clear,
    .tp_call = sender_tp_call,
    .tp_vectorcall_offset = offsetof(Sender, vectorcall),
    .tp_members = sender_members,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "logkit._sendpath",
    "Producer.send()'s common case in C (optional; see logkit/producer.py).", -1,
    module_methods,
};

PyMODINIT_FUNC
PyInit__sendpath(void)
{
#define INTERN(var, text) if ((var = PyUnicode_InternFromString(text)) == NULL) return NULL
    INTERN(s_key, "key"); INTERN(s_value, "value"); INTERN(s_add, "_add");
    INTERN(s_partition, "partition");
#undef INTERN
    if (PyType_Ready(&SenderType) < 0 || PyType_Ready(&FutureBaseType) < 0 ||
            PyType_Ready(&BatchBaseType) < 0 || PyType_Ready(&TopicBaseType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&SenderType);
    if (PyModule_AddObject(m, "Sender", (PyObject *)&SenderType) < 0) {
        Py_DECREF(&SenderType);
        Py_DECREF(m);
        return NULL;
    }
    PyTypeObject *bases[3] = {&FutureBaseType, &BatchBaseType, &TopicBaseType};
    const char *names[3] = {"FutureBase", "BatchBase", "TopicBase"};
    for (int i = 0; i < 3; i++) {
        Py_INCREF(bases[i]);
        if (PyModule_AddObject(m, names[i], (PyObject *)bases[i]) < 0) {
            Py_DECREF(bases[i]);
            Py_DECREF(m);
            return NULL;
        }
    }
    return m;
}
