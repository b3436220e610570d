/* logkit._sendpath: the common case of Producer.send() in C.
 *
 * Owns nothing: a Sender holds references to one producer's topic states and does, in
 * C, exactly what the fast path of logkit/producer.py `Producer.send` does in
 * Python -- bytes key and value, no headers, no explicit partition or timestamp, a
 * known topic whose open batch has room. Every other case, and any surprise, is handed
 * to the Python method unchanged, so the two paths cannot disagree on anything but
 * speed. The Python module stays complete: without this extension nothing changes.
 *
 * Validation stays in Python on purpose: a call with a timestamp, headers or a partition
 * always falls back (only `key` and `value` are taken here, and both must be exact
 * bytes), so the timestamp range and header type checks of Producer._send_general run
 * for every record whichever path is built. Fork safety costs nothing here either: in a
 * forked child producer.py's at-fork hook sets `slow`, sending every call to the Python
 * method, which raises ForkedProcessError.
 *
 * Thread-safety: like the Python fast path it takes no lock. It appends the row to the
 * open batch's deque (atomic under the GIL) and re-checks `batch.sealed` afterwards;
 * a row that raced a sealer goes to Producer._rescue (see producer.py).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

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
} FutureBase;

static int
future_init(FutureBase *self, PyObject *args, PyObject *kwds)
{
    PyObject *batch, *row, *acks;
    if (!PyArg_ParseTuple(args, "OOO", &batch, &row, &acks))
        return -1;
    Py_XSETREF(self->batch, Py_NewRef(batch));
    Py_XSETREF(self->row, Py_NewRef(row));
    Py_XSETREF(self->acks, Py_NewRef(acks));
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
};

static PyObject *
new_future(PyObject *type, PyObject *batch, PyObject *row, PyObject *acks)
{
    PyTypeObject *tp = (PyTypeObject *)type;
    if (!PyType_Check(type) || !PyType_IsSubtype(tp, &FutureBaseType)) {
        PyObject *args[3] = {batch, row, acks};
        return PyObject_Vectorcall(type, args, 3, NULL);
    }
    FutureBase *future = (FutureBase *)tp->tp_alloc(tp, 0);
    if (future == NULL)
        return NULL;
    future->batch = Py_NewRef(batch);
    future->row = Py_NewRef(row);
    future->acks = Py_NewRef(acks);
    return (PyObject *)future;
}

/* ---- Sender ------------------------------------------------------------------------ */

/* Python attributes read by name (interned in PyInit__sendpath), each marked with a
 * comment naming this file where it is defined: on a topic state (producer.py's
 * _TopicState), `sticky` and `cache` (logkit/producer.py) and `open` (its base class,
 * logkit/accumulator.py's TopicBatches); on an open batch (accumulator.py's Batch),
 * `size`, `inbox` (a deque, whose `append` is called) and `sealed`; `key` and `value`
 * are send()'s keyword names. Renaming one on the Python side without changing it here
 * breaks this path. */
static PyObject *s_sticky, *s_cache, *s_open, *s_size, *s_inbox, *s_sealed, *s_append,
                *s_key, *s_value;

typedef struct {
    PyObject_HEAD
    PyObject *fallback;      /* bound Producer.send (the Python method) */
    PyObject *rescue;        /* bound Producer._rescue */
    PyObject *states;        /* dict: topic name -> _TopicState (the accumulator's) */
    PyObject *future_type;   /* FutureRecordMetadata */
    PyObject *acks;          /* int */
    Py_ssize_t batch_size;
    int slow;                /* set when the producer closes: everything goes to Python */
    vectorcallfunc vectorcall;
} Sender;

static PyObject *
fallback(Sender *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    return PyObject_Vectorcall(self->fallback, args, nargsf, kwnames);
}

static PyObject *
sender_call(Sender *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *topic, *value = Py_None, *key = Py_None;
    if (self->slow || nargs < 1 || nargs > 3)
        return fallback(self, args, nargsf, kwnames);
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
            } else {
                return fallback(self, args, nargsf, kwnames);   /* headers, partition... */
            }
        }
    }
    if (!PyBytes_CheckExact(value) || (key != Py_None && !PyBytes_CheckExact(key)))
        return fallback(self, args, nargsf, kwnames);
    PyObject *state = PyDict_GetItemWithError(self->states, topic);     /* borrowed */
    if (state == NULL) {
        if (PyErr_Occurred()) return NULL;
        return fallback(self, args, nargsf, kwnames);
    }
    Py_ssize_t size = PyBytes_GET_SIZE(value) + RECORD_OVERHEAD_BYTES;
    PyObject *partition;                                                 /* new ref */
    if (key == Py_None) {
        partition = PyObject_GetAttr(state, s_sticky);
        if (partition == NULL) return NULL;
    } else {
        size += PyBytes_GET_SIZE(key);
        PyObject *cache = PyObject_GetAttr(state, s_cache);
        if (cache == NULL) return NULL;
        partition = PyDict_GetItemWithError(cache, key);
        Py_XINCREF(partition);
        Py_DECREF(cache);
        if (partition == NULL) {
            if (PyErr_Occurred()) return NULL;
            return fallback(self, args, nargsf, kwnames);   /* computes and caches it */
        }
    }
    Py_ssize_t p = PyLong_AsSsize_t(partition);
    if (p == -1 && PyErr_Occurred()) { Py_DECREF(partition); return NULL; }
    PyObject *open = PyObject_GetAttr(state, s_open);
    if (open == NULL) { Py_DECREF(partition); return NULL; }
    if (!PyList_CheckExact(open) || p < 0 || p >= PyList_GET_SIZE(open)) {
        Py_DECREF(open); Py_DECREF(partition);
        return fallback(self, args, nargsf, kwnames);
    }
    PyObject *batch = PyList_GET_ITEM(open, p);
    Py_INCREF(batch);
    Py_DECREF(open);
    PyObject *result = NULL, *row = NULL, *inbox = NULL, *batch_size_obj = NULL;
    if (batch == Py_None) goto slow;
    batch_size_obj = PyObject_GetAttr(batch, s_size);
    if (batch_size_obj == NULL) goto done;
    Py_ssize_t filled = PyLong_AsSsize_t(batch_size_obj);
    if (filled == -1 && PyErr_Occurred()) goto done;
    if (filled + size > self->batch_size) goto slow;
    row = PyTuple_Pack(4, key, value, Py_None, Py_None);
    if (row == NULL) goto done;
    inbox = PyObject_GetAttr(batch, s_inbox);
    if (inbox == NULL) goto done;
    PyObject *ok = PyObject_CallMethodOneArg(inbox, s_append, row);
    if (ok == NULL) goto done;
    Py_DECREF(ok);
    PyObject *sealed = PyObject_GetAttr(batch, s_sealed);
    if (sealed == NULL) goto done;
    int is_sealed = PyObject_IsTrue(sealed);
    Py_DECREF(sealed);
    if (is_sealed < 0) goto done;
    if (is_sealed) {
        PyObject *size_obj = PyLong_FromSsize_t(size);
        if (size_obj == NULL) goto done;
        PyObject *rescue_args[5] = {state, partition, batch, row, size_obj};
        result = PyObject_Vectorcall(self->rescue, rescue_args, 5, NULL);
        Py_DECREF(size_obj);
        goto done;
    }
    PyObject *new_size = PyLong_FromSsize_t(filled + size);
    if (new_size == NULL) goto done;
    int rc = PyObject_SetAttr(batch, s_size, new_size);
    Py_DECREF(new_size);
    if (rc < 0) goto done;
    result = new_future(self->future_type, batch, row, self->acks);
    goto done;
slow:
    result = fallback(self, args, nargsf, kwnames);
done:
    Py_XDECREF(batch_size_obj);
    Py_XDECREF(inbox);
    Py_XDECREF(row);
    Py_DECREF(batch);
    Py_DECREF(partition);
    return result;
}

static PyObject *
sender_tp_call(PyObject *self, PyObject *args, PyObject *kwargs)
{
    return PyVectorcall_Call(self, args, kwargs);
}

static int
sender_init(Sender *self, PyObject *args, PyObject *kwds)
{
    PyObject *fallback_fn, *rescue, *states, *future_type, *acks;
    Py_ssize_t batch_size;
    if (!PyArg_ParseTuple(args, "OOO!OOn", &fallback_fn, &rescue, &PyDict_Type, &states,
                          &future_type, &acks, &batch_size))
        return -1;
    Py_XSETREF(self->fallback, Py_NewRef(fallback_fn));
    Py_XSETREF(self->rescue, Py_NewRef(rescue));
    Py_XSETREF(self->states, Py_NewRef(states));
    Py_XSETREF(self->future_type, Py_NewRef(future_type));
    Py_XSETREF(self->acks, Py_NewRef(acks));
    self->batch_size = batch_size;
    self->slow = 0;
    self->vectorcall = (vectorcallfunc)sender_call;
    return 0;
}

static int
sender_traverse(Sender *self, visitproc visit, void *arg)
{
    Py_VISIT(self->fallback);
    Py_VISIT(self->rescue);
    Py_VISIT(self->states);
    Py_VISIT(self->future_type);
    Py_VISIT(self->acks);
    return 0;
}

static int
sender_clear(Sender *self)
{
    Py_CLEAR(self->fallback);
    Py_CLEAR(self->rescue);
    Py_CLEAR(self->states);
    Py_CLEAR(self->future_type);
    Py_CLEAR(self->acks);
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
    .tp_doc = "Sender(send_py, rescue, states, future_type, acks, batch_size): "
              "Producer.send's common case in C.",
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
    "Producer.send()'s common case in C (optional; see logkit/producer.py).", -1, NULL,
};

PyMODINIT_FUNC
PyInit__sendpath(void)
{
#define INTERN(var, text) if ((var = PyUnicode_InternFromString(text)) == NULL) return NULL
    INTERN(s_sticky, "sticky"); INTERN(s_cache, "cache"); INTERN(s_open, "open");
    INTERN(s_size, "size"); INTERN(s_inbox, "inbox"); INTERN(s_sealed, "sealed");
    INTERN(s_append, "append"); INTERN(s_key, "key"); INTERN(s_value, "value");
#undef INTERN
    if (PyType_Ready(&SenderType) < 0 || PyType_Ready(&FutureBaseType) < 0)
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
    Py_INCREF(&FutureBaseType);
    if (PyModule_AddObject(m, "FutureBase", (PyObject *)&FutureBaseType) < 0) {
        Py_DECREF(&FutureBaseType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
