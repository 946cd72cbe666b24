/*
 * A tier's placement memory in memory allocated whole: the compiled form of
 * gtm.routing.placement.DictPlacementMemory (same methods, same results: the hypothesis
 * test in tests/unit/gtm/routing/test_placement.py runs both on the same calls).
 *
 * Why: the dict form costs an OrderedDict entry, a key int and a value tuple per
 * remembered block, allocated as the memory fills. It is bounded (capacity, time to
 * live), but its size follows the recent request rate, so a tier's memory rose with
 * every busier hour and never went back (the soak's global and regional growth,
 * issue 25). Here ``capacity`` entries are allocated and written when the memory is
 * made, and nothing grows with traffic:
 *
 *   nodes   one per remembered block: key, target id, time, tokens, and the links of
 *           one LRU list (oldest first; entries are stamped with non-decreasing times,
 *           so it is also the time order) and of the free list.
 *   table   block -> node: open addressing over a power-of-two array at most half
 *           full, linear probing, deletion by backward shift (Knuth, TAOCP vol. 3, 6.4,
 *           algorithm R), as gpusim's BlockPool and the zone's prefix index.
 *   targets the target ids' strings, in a list (a fleet's GPUs, zones or regions).
 *
 * Blocks are 64-bit (gtm.fingerprint); any other int is taken modulo 2**64.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "gtm/routing/_open_addressing.h"

#define NONE OA_NONE

typedef struct {
    uint64_t key;
    double at;
    int64_t tokens;
    int32_t target;
    int32_t older; /* LRU neighbours; on the free list, ``newer`` is the next free */
    int32_t newer;
} Node;

typedef struct {
    PyObject_HEAD
    Node *nodes;
    int32_t *table;
    uint64_t table_mask;
    int64_t capacity;
    int64_t count;
    int64_t used; /* nodes handed out at least once */
    int32_t oldest, newest, free;
    double ttl;
    PyObject *targets; /* list of str */
    PyObject *ids;     /* str -> int */
} Memory;

/* The position holding ``key``, or -1 - (the empty position to use). */
static inline int64_t
find(const Memory *m, uint64_t key)
{
    return oa_find(m->table, m->table_mask, m->nodes, sizeof(Node), key);
}

static void
unlink_node(Memory *m, int32_t n)
{
    Node *nodes = m->nodes;
    int32_t older = nodes[n].older, newer = nodes[n].newer;
    if (older == NONE) {
        m->oldest = newer;
    } else {
        nodes[older].newer = newer;
    }
    if (newer == NONE) {
        m->newest = older;
    } else {
        nodes[newer].older = older;
    }
}

static void
append_node(Memory *m, int32_t n)
{
    Node *nodes = m->nodes;
    nodes[n].older = m->newest;
    nodes[n].newer = NONE;
    if (m->newest == NONE) {
        m->oldest = n;
    } else {
        nodes[m->newest].newer = n;
    }
    m->newest = n;
}

static void
drop(Memory *m, int32_t n)
{
    unlink_node(m, n);
    int64_t at = find(m, m->nodes[n].key);
    if (at >= 0) {
        oa_delete(m->table, m->table_mask, m->nodes, sizeof(Node), (uint64_t)at);
    }
    m->nodes[n].newer = m->free;
    m->free = n;
    m->count -= 1;
}

static void
trim(Memory *m, double now)
{
    double horizon = now - m->ttl;
    while (m->oldest != NONE && m->nodes[m->oldest].at <= horizon) {
        drop(m, m->oldest);
    }
}

static int
Memory_init(Memory *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"capacity", "ttl_s", NULL};
    long long capacity;
    double ttl;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "Ld", kwlist, &capacity, &ttl)) {
        return -1;
    }
    if (self->nodes != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "a placement memory is made once");
        return -1;
    }
    if (capacity < 1 || capacity > INT32_MAX / 2) {
        PyErr_Format(PyExc_ValueError, "capacity must be >= 1 (and < 2**30), got %lld", capacity);
        return -1;
    }
    if (!(ttl > 0.0 && isfinite(ttl))) {
        PyObject *given = PyFloat_FromDouble(ttl);
        if (given != NULL) {
            PyErr_Format(PyExc_ValueError, "ttl_s must be a finite number > 0, got %R", given);
            Py_DECREF(given);
        }
        return -1;
    }
    uint64_t size = 8;
    while (size < 2 * (uint64_t)capacity) {
        size <<= 1;
    }
    self->nodes = PyMem_Malloc((size_t)capacity * sizeof(Node));
    self->table = PyMem_Malloc(size * sizeof(int32_t));
    self->targets = PyList_New(0);
    self->ids = PyDict_New();
    if (self->nodes == NULL || self->table == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    if (self->targets == NULL || self->ids == NULL) {
        return -1;
    }
    /* Written whole, so every page is resident from now on, not as the memory fills. */
    memset(self->nodes, 0, (size_t)capacity * sizeof(Node));
    memset(self->table, 0xff, size * sizeof(int32_t));
    self->table_mask = size - 1;
    self->capacity = capacity;
    self->count = self->used = 0;
    self->oldest = self->newest = self->free = NONE;
    self->ttl = ttl;
    return 0;
}

static int
Memory_traverse(Memory *self, visitproc visit, void *arg)
{
    Py_VISIT(self->targets);
    Py_VISIT(self->ids);
    return 0;
}

static int
Memory_clear(Memory *self)
{
    Py_CLEAR(self->targets);
    Py_CLEAR(self->ids);
    return 0;
}

static void
Memory_dealloc(Memory *self)
{
    PyObject_GC_UnTrack(self);
    Memory_clear(self);
    PyMem_Free(self->nodes);
    PyMem_Free(self->table);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int
ready(Memory *m)
{
    if (m->nodes == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "placement memory not initialised");
        return 0;
    }
    return 1;
}

static Py_ssize_t
Memory_len(Memory *self)
{
    return (Py_ssize_t)self->count;
}

static PyObject *
Memory_remember(Memory *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"hashes", "target", "now", "tokens", NULL};
    PyObject *hashes, *target;
    double now;
    long long tokens = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OUd|L", kwlist, &hashes, &target, &now,
                                     &tokens)) {
        return NULL;
    }
    if (!ready(self)) {
        return NULL;
    }
    PyObject *seq = PySequence_Fast(hashes, "hashes must be a sequence of ints");
    if (seq == NULL) {
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n == 0) {
        Py_DECREF(seq);
        Py_RETURN_NONE;
    }
    PyObject **items = PySequence_Fast_ITEMS(seq);
    uint64_t stack[64];
    uint64_t *keys = n <= 64 ? stack : PyMem_Malloc((size_t)n * sizeof(uint64_t));
    if (keys == NULL) {
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    int32_t tid;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (oa_as_key(items[i], &keys[i]) < 0) {
            goto fail;
        }
    }
    PyObject *known = PyDict_GetItemWithError(self->ids, target);
    if (known != NULL) {
        tid = (int32_t)PyLong_AsLong(known);
    } else {
        if (PyErr_Occurred()) {
            goto fail;
        }
        Py_ssize_t next = PyList_GET_SIZE(self->targets);
        if (next >= INT32_MAX) {
            PyErr_SetString(PyExc_OverflowError, "placement memory: too many targets");
            goto fail;
        }
        PyObject *number = PyLong_FromSsize_t(next);
        if (number == NULL || PyDict_SetItem(self->ids, target, number) < 0) {
            Py_XDECREF(number);
            goto fail;
        }
        Py_DECREF(number);
        if (PyList_Append(self->targets, target) < 0) {
            PyDict_DelItem(self->ids, target);
            goto fail;
        }
        tid = (int32_t)next;
    }
    Node *nodes = self->nodes;
    /* Deepest first: the shallow blocks end up the most recent (gtm.routing.placement). */
    for (Py_ssize_t i = n - 1; i >= 0; i--) {
        uint64_t key = keys[i];
        int64_t at = find(self, key);
        int32_t node;
        if (at >= 0) {
            node = self->table[at];
            unlink_node(self, node);
        } else {
            if (self->count >= self->capacity) {
                drop(self, self->oldest);
                at = find(self, key); /* the drop may have moved the probe run */
            }
            if (self->free != NONE) {
                node = self->free;
                self->free = nodes[node].newer;
            } else {
                node = (int32_t)self->used;
                self->used += 1;
            }
            nodes[node].key = key;
            self->table[-1 - at] = node;
            self->count += 1;
        }
        nodes[node].target = tid;
        nodes[node].at = now;
        nodes[node].tokens = (int64_t)tokens;
        append_node(self, node);
    }
    trim(self, now);
    if (keys != stack) {
        PyMem_Free(keys);
    }
    Py_DECREF(seq);
    Py_RETURN_NONE;
fail:
    if (keys != stack) {
        PyMem_Free(keys);
    }
    Py_DECREF(seq);
    return NULL;
}

static PyObject *
Memory_recall_raw(Memory *self, PyObject *args)
{
    PyObject *hashes;
    double now;
    if (!PyArg_ParseTuple(args, "Od", &hashes, &now) || !ready(self)) {
        return NULL;
    }
    PyObject *seq = PySequence_Fast(hashes, "hashes must be a sequence of ints");
    if (seq == NULL) {
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    double horizon = now - self->ttl;
    int32_t found = NONE;
    Py_ssize_t depth = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t key;
        if (oa_as_key(items[i], &key) < 0) {
            Py_DECREF(seq);
            return NULL;
        }
        int64_t at = find(self, key);
        if (at < 0 || self->nodes[self->table[at]].at <= horizon) {
            break;
        }
        found = self->table[at];
        depth++;
    }
    Py_DECREF(seq);
    if (found == NONE) {
        Py_RETURN_NONE;
    }
    const Node *node = &self->nodes[found];
    PyObject *target = PyList_GET_ITEM(self->targets, node->target);
    return Py_BuildValue("(OndL)", target, depth, node->at, (long long)node->tokens);
}

static PyObject *
Memory_forget(Memory *self, PyObject *target)
{
    if (!ready(self)) {
        return NULL;
    }
    PyObject *known = PyDict_GetItemWithError(self->ids, target);
    if (known == NULL) {
        if (PyErr_Occurred()) {
            return NULL;
        }
        Py_RETURN_NONE;
    }
    int32_t tid = (int32_t)PyLong_AsLong(known);
    int32_t n = self->oldest;
    while (n != NONE) {
        int32_t next = self->nodes[n].newer;
        if (self->nodes[n].target == tid) {
            drop(self, n);
        }
        n = next;
    }
    Py_RETURN_NONE;
}

static PyObject *
Memory_expire(Memory *self, PyObject *now_obj)
{
    double now = PyFloat_AsDouble(now_obj);
    if ((now == -1.0 && PyErr_Occurred()) || !ready(self)) {
        return NULL;
    }
    trim(self, now);
    Py_RETURN_NONE;
}

static PyObject *
Memory_get_capacity(Memory *self, void *closure)
{
    (void)closure;
    return PyLong_FromLongLong(self->capacity);
}

static PyObject *
Memory_get_ttl(Memory *self, void *closure)
{
    (void)closure;
    return PyFloat_FromDouble(self->ttl);
}

static PyObject *
Memory_get_nbytes(Memory *self, void *closure)
{
    (void)closure;
    size_t bytes = (size_t)self->capacity * sizeof(Node)
        + (size_t)(self->nodes == NULL ? 0 : self->table_mask + 1) * sizeof(int32_t);
    return PyLong_FromSize_t(bytes);
}

static PyMethodDef Memory_methods[] = {
    {"remember", (PyCFunction)(void (*)(void))Memory_remember, METH_VARARGS | METH_KEYWORDS,
     "remember(hashes, target, now, tokens=0): these blocks were sent to target."},
    {"recall_raw", (PyCFunction)Memory_recall_raw, METH_VARARGS,
     "recall_raw(hashes, now): (target, blocks, at, tokens) of the deepest fresh leading "
     "block remembered, or None."},
    {"forget", (PyCFunction)Memory_forget, METH_O, "forget(target): drop its entries."},
    {"expire", (PyCFunction)Memory_expire, METH_O, "expire(now): drop the entries past their time."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Memory_getset[] = {
    {"capacity", (getter)Memory_get_capacity, NULL, "Blocks held at most.", NULL},
    {"ttl_s", (getter)Memory_get_ttl, NULL, "Seconds a placement is trusted.", NULL},
    {"nbytes", (getter)Memory_get_nbytes, NULL, "Bytes held (all allocated up front).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PySequenceMethods Memory_as_sequence = {
    .sq_length = (lenfunc)Memory_len,
};

static PyTypeObject MemoryType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "gtm.routing._placement.PlacementCore",
    .tp_doc = "Block hash -> (target, time, tokens), an LRU bounded by capacity and time "
              "to live, in memory allocated when it is made.",
    .tp_basicsize = sizeof(Memory),
    .tp_itemsize = 0,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Memory_init,
    .tp_dealloc = (destructor)Memory_dealloc,
    .tp_traverse = (traverseproc)Memory_traverse,
    .tp_clear = (inquiry)Memory_clear,
    .tp_methods = Memory_methods,
    .tp_getset = Memory_getset,
    .tp_as_sequence = &Memory_as_sequence,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "gtm.routing._placement",
    .m_doc = "A tier's placement memory, allocated whole (see gtm.routing.placement).",
    .m_size = -1,
};

PyMODINIT_FUNC
PyInit__placement(void)
{
    if (PyType_Ready(&MemoryType) < 0) {
        return NULL;
    }
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) {
        return NULL;
    }
    Py_INCREF(&MemoryType);
    if (PyModule_AddObject(m, "PlacementCore", (PyObject *)&MemoryType) < 0) {
        Py_DECREF(&MemoryType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
