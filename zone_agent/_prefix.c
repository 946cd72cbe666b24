/*
 * The zone agent's prefix index in memory allocated whole, the compiled form of
 * zone_agent.prefix.DictPrefixIndex (same methods, same results: the hypothesis test in
 * tests/unit/zone_agent/test_prefix.py runs both on the same inserts and queries).
 *
 * Why: the dict form costs a dict entry, an OrderedDict node and one or two int objects
 * per (GPU, block) it remembers, allocated as the index fills. Each GPU's share is
 * bounded by its KV cache, but a busy zone takes hours to fill it, so the agent's
 * memory rose for hours (the soak's zone-agent growth, issue 25). Here every structure
 * is sized by the GPUs' capacities when a GPU first appears (or its capacity grows),
 * and never grows with traffic:
 *
 *   nodes   one per (slot, block) the slots may hold: each slot owns a range of
 *           ``capacity`` nodes; a slot's nodes form its LRU (a doubly linked list,
 *           oldest first) and its free list; a node also links to the next holder of
 *           the same block (the block's "holder chain").
 *   table   block -> the first node of its holder chain: open addressing over a
 *           power-of-two array at most half full, linear probing, deletion by backward
 *           shift (Knuth, TAOCP vol. 3, 6.4, algorithm R), as gpusim's BlockPool.
 *
 * A block's holders are the slots on its chain, so matching a prompt walks its blocks
 * once and, at each, the chain of holders, keeping a bitmap of the slots still matching:
 * O(matched blocks x holders), no allocation but the result.
 *
 * Blocks are 64-bit (gtm.fingerprint); any other int is taken modulo 2**64.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "gtm/routing/_open_addressing.h"

/* Most blocks one slot may hold: a capacity above is taken as this (node indices are
 * 32-bit; a GPU with 2**22 blocks of 256 bytes would cache a billion bytes of text). */
#define MAX_SLOT_BLOCKS (1 << 22)
#define NONE OA_NONE

typedef struct {
    uint64_t key;
    int32_t slot;
    int32_t older;  /* LRU neighbours; on the free list, ``newer`` is the next free */
    int32_t newer;
    int32_t next_holder;
} Node;

typedef struct {
    int64_t reserved; /* nodes owned: [base, base + reserved) */
    int64_t base;
    int64_t limit;    /* the capacity last given */
    int64_t used;     /* nodes of the range handed out at least once */
    int64_t count;    /* blocks held */
    int32_t oldest, newest, free;
} Slot;

typedef struct {
    PyObject_HEAD
    Node *nodes;
    int64_t node_count;    /* nodes given to slots' ranges */
    int64_t node_capacity; /* nodes allocated */
    Slot *slots;
    int64_t slot_count;
    int32_t *table;
    uint64_t table_mask;
    int64_t distinct;
    uint64_t *alive; /* match scratch: one bit per slot */
    uint64_t *still;
    int64_t words;
} Index;

/* The position holding ``key``'s chain, or -1 - (the empty position to use). */
static inline int64_t
find(const Index *ix, uint64_t key)
{
    return oa_find(ix->table, ix->table_mask, ix->nodes, sizeof(Node), key);
}

static void
table_delete(Index *ix, uint64_t at)
{
    oa_delete(ix->table, ix->table_mask, ix->nodes, sizeof(Node), at);
    ix->distinct -= 1;
}

/* Take node ``n`` off its block's holder chain (dropping the block when it was the last). */
static void
unhold(Index *ix, int32_t n)
{
    Node *nodes = ix->nodes;
    int64_t at = find(ix, nodes[n].key);
    if (at < 0) {
        return; /* not reachable: every held node is on its chain */
    }
    int32_t cursor = ix->table[at];
    if (cursor == n) {
        if (nodes[n].next_holder == NONE) {
            table_delete(ix, (uint64_t)at);
        } else {
            ix->table[at] = nodes[n].next_holder;
        }
        return;
    }
    while (nodes[cursor].next_holder != NONE && nodes[cursor].next_holder != n) {
        cursor = nodes[cursor].next_holder;
    }
    if (nodes[cursor].next_holder == n) {
        nodes[cursor].next_holder = nodes[n].next_holder;
    }
}

static void
lru_unlink(Index *ix, Slot *s, int32_t n)
{
    Node *nodes = ix->nodes;
    int32_t older = nodes[n].older, newer = nodes[n].newer;
    if (older == NONE) {
        s->oldest = newer;
    } else {
        nodes[older].newer = newer;
    }
    if (newer == NONE) {
        s->newest = older;
    } else {
        nodes[newer].older = older;
    }
}

static void
lru_append(Index *ix, Slot *s, int32_t n)
{
    Node *nodes = ix->nodes;
    nodes[n].older = s->newest;
    nodes[n].newer = NONE;
    if (s->newest == NONE) {
        s->oldest = n;
    } else {
        nodes[s->newest].newer = n;
    }
    s->newest = n;
}

static void
evict_oldest(Index *ix, Slot *s)
{
    int32_t n = s->oldest;
    lru_unlink(ix, s, n);
    unhold(ix, n);
    ix->nodes[n].newer = s->free;
    s->free = n;
    s->count -= 1;
}

/* Record that slot ``slot`` (whose range has room) holds ``key`` now. */
static void
hold(Index *ix, int64_t slot, uint64_t key)
{
    Slot *s = &ix->slots[slot];
    Node *nodes = ix->nodes;
    int64_t at = find(ix, key);
    if (at >= 0) {
        for (int32_t h = ix->table[at]; h != NONE; h = nodes[h].next_holder) {
            if (nodes[h].slot == slot) {
                if (h != s->newest) {
                    lru_unlink(ix, s, h);
                    lru_append(ix, s, h);
                }
                return;
            }
        }
    }
    if (s->count >= s->limit) {
        evict_oldest(ix, s);
        at = find(ix, key); /* the eviction may have moved or dropped the chain */
    }
    int32_t n;
    if (s->free != NONE) {
        n = s->free;
        s->free = nodes[n].newer;
    } else {
        n = (int32_t)(s->base + s->used);
        s->used += 1;
    }
    nodes[n].key = key;
    nodes[n].slot = (int32_t)slot;
    lru_append(ix, s, n);
    s->count += 1;
    if (at >= 0) {
        nodes[n].next_holder = ix->table[at];
        ix->table[at] = n;
    } else {
        nodes[n].next_holder = NONE;
        ix->table[-1 - at] = n;
        ix->distinct += 1;
    }
}

/* Room for slot ``slot``: the slot array (and the match scratch, a bit per slot) grows
 * geometrically; new slots own no nodes yet. */
static int
ensure_slot(Index *ix, int64_t slot)
{
    if (slot < ix->slot_count) {
        return 0;
    }
    int64_t count = ix->slot_count ? ix->slot_count : 8;
    while (count <= slot) {
        count *= 2;
    }
    Slot *slots = PyMem_Realloc(ix->slots, (size_t)count * sizeof(Slot));
    if (slots == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    ix->slots = slots;
    for (int64_t i = ix->slot_count; i < count; i++) {
        memset(&slots[i], 0, sizeof(Slot));
        slots[i].oldest = slots[i].newest = slots[i].free = NONE;
    }
    ix->slot_count = count;
    int64_t words = (count + 63) / 64;
    uint64_t *alive = PyMem_Realloc(ix->alive, (size_t)words * sizeof(uint64_t));
    if (alive == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    ix->alive = alive;
    uint64_t *still = PyMem_Realloc(ix->still, (size_t)words * sizeof(uint64_t));
    if (still == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    ix->still = still;
    ix->words = words;
    return 0;
}

/* A table of ``size`` positions (a power of two) holding every chain of the current one. */
static int
rehash(Index *ix, uint64_t size)
{
    int32_t *table = PyMem_Malloc(size * sizeof(int32_t));
    if (table == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    memset(table, 0xff, size * sizeof(int32_t)); /* NONE everywhere, and every page touched */
    uint64_t mask = size - 1;
    if (ix->table != NULL) {
        for (uint64_t i = 0; i <= ix->table_mask; i++) {
            int32_t head = ix->table[i];
            if (head == NONE) {
                continue;
            }
            uint64_t at = oa_mix(ix->nodes[head].key) & mask;
            while (table[at] != NONE) {
                at = (at + 1) & mask;
            }
            table[at] = head;
        }
        PyMem_Free(ix->table);
    }
    ix->table = table;
    ix->table_mask = mask;
    return 0;
}

/* Give slot ``slot`` a range of ``reserve`` nodes at the end of the pool (its blocks,
 * if any, are held again there, oldest first, so its LRU order is kept). The pool and
 * the table grow geometrically; the range is written whole, so its pages are resident
 * from now on rather than as the slot fills. A slot's old range is left unused. */
static int
reserve_nodes(Index *ix, int64_t slot, int64_t reserve)
{
    Slot *s = &ix->slots[slot];
    uint64_t *keys = NULL;
    int64_t held = s->count;
    if (held > 0) {
        keys = PyMem_Malloc((size_t)held * sizeof(uint64_t));
        if (keys == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        int64_t k = 0;
        for (int32_t n = s->oldest; n != NONE; n = ix->nodes[n].newer) {
            keys[k++] = ix->nodes[n].key;
        }
    }
    int64_t need = ix->node_count + reserve;
    if (need > INT32_MAX) {
        PyMem_Free(keys);
        PyErr_SetString(PyExc_OverflowError, "prefix index: more than 2**31 blocks in all");
        return -1;
    }
    if (need > ix->node_capacity) {
        int64_t capacity = ix->node_capacity ? ix->node_capacity : 64;
        while (capacity < need) {
            capacity *= 2;
        }
        if (capacity > INT32_MAX) {
            capacity = INT32_MAX;
        }
        Node *nodes = PyMem_Realloc(ix->nodes, (size_t)capacity * sizeof(Node));
        if (nodes == NULL) {
            PyMem_Free(keys);
            PyErr_NoMemory();
            return -1;
        }
        ix->nodes = nodes;
        ix->node_capacity = capacity;
    }
    uint64_t size = ix->table_mask + 1;
    while (size < 2 * (uint64_t)need) {
        size <<= 1;
    }
    if (ix->table == NULL || size != ix->table_mask + 1) {
        if (rehash(ix, size) < 0) {
            PyMem_Free(keys);
            return -1;
        }
    }
    for (int32_t n = s->oldest; n != NONE; n = ix->nodes[n].newer) {
        unhold(ix, n);
    }
    memset(&ix->nodes[ix->node_count], 0, (size_t)reserve * sizeof(Node));
    s->base = ix->node_count;
    s->reserved = reserve;
    s->used = 0;
    s->count = 0;
    s->oldest = s->newest = s->free = NONE;
    ix->node_count = need;
    for (int64_t k = 0; k < held; k++) {
        hold(ix, slot, keys[k]);
    }
    PyMem_Free(keys);
    return 0;
}

static PyObject *
Index_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    Index *self = (Index *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    if (rehash(self, 8) < 0) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static int
Index_init(Index *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {NULL};
    return PyArg_ParseTupleAndKeywords(args, kwds, "", kwlist) ? 0 : -1;
}

static void
Index_dealloc(Index *self)
{
    PyMem_Free(self->nodes);
    PyMem_Free(self->slots);
    PyMem_Free(self->table);
    PyMem_Free(self->alive);
    PyMem_Free(self->still);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static Py_ssize_t
Index_len(Index *self)
{
    return (Py_ssize_t)self->distinct;
}

static int
as_slot(PyObject *obj, int64_t *slot)
{
    long long value = PyLong_AsLongLong(obj);
    if (value == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (value < 0 || value >= INT32_MAX) {
        PyErr_Format(PyExc_ValueError, "slot must be in [0, 2**31 - 1), got %lld", value);
        return -1;
    }
    *slot = value;
    return 0;
}

static PyObject *
Index_insert(Index *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"slot", "hashes", "capacity", NULL};
    PyObject *slot_obj, *hashes;
    long long capacity;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOL", kwlist, &slot_obj, &hashes, &capacity)) {
        return NULL;
    }
    int64_t slot;
    if (as_slot(slot_obj, &slot) < 0) {
        return NULL;
    }
    PyObject *seq = PySequence_Fast(hashes, "hashes must be a sequence of ints");
    if (seq == NULL) {
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    /* Read every key first: a bad one changes nothing. */
    uint64_t stack[64];
    uint64_t *keys = n <= 64 ? stack : PyMem_Malloc((size_t)n * sizeof(uint64_t));
    if (keys == NULL) {
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (oa_as_key(items[i], &keys[i]) < 0) {
            goto fail;
        }
    }
    int64_t limit = capacity < 0 ? 0 : (capacity > MAX_SLOT_BLOCKS ? MAX_SLOT_BLOCKS : capacity);
    if (ensure_slot(self, slot) < 0) {
        goto fail;
    }
    Slot *grown = &self->slots[slot];
    if (limit > grown->reserved) {
        /* A slot's first range is its capacity; a later, larger capacity (rare: the GPU's
         * KV geometry changed) takes at least twice the old range, so ranges left
         * behind add up to less than the slot's range. */
        int64_t reserve = grown->reserved == 0 ? limit : 2 * grown->reserved;
        if (reserve < limit) {
            reserve = limit;
        }
        if (reserve > MAX_SLOT_BLOCKS) {
            reserve = MAX_SLOT_BLOCKS;
        }
        if (reserve_nodes(self, slot, reserve) < 0) {
            goto fail;
        }
    }
    Slot *s = &self->slots[slot];
    s->limit = limit;
    while (s->count > limit) {
        evict_oldest(self, s);
    }
    if (limit > 0) {
        for (Py_ssize_t i = 0; i < n; i++) {
            hold(self, slot, keys[i]);
        }
    }
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
Index_forget(Index *self, PyObject *slot_obj)
{
    int64_t slot;
    if (as_slot(slot_obj, &slot) < 0) {
        return NULL;
    }
    if (slot < self->slot_count) {
        Slot *s = &self->slots[slot];
        for (int32_t n = s->oldest; n != NONE; n = self->nodes[n].newer) {
            unhold(self, n);
        }
        s->oldest = s->newest = s->free = NONE;
        s->used = 0;
        s->count = 0;
    }
    Py_RETURN_NONE;
}

static PyObject *
Index_blocks(Index *self, PyObject *slot_obj)
{
    int64_t slot;
    if (as_slot(slot_obj, &slot) < 0) {
        return NULL;
    }
    return PyLong_FromLongLong(slot < self->slot_count ? self->slots[slot].count : 0);
}

/* A bitmap of ``words`` words as a non-negative int (bit i: slot i). */
static PyObject *
bitmap_int(const uint64_t *bits, int64_t words)
{
    int64_t top = words;
    while (top > 0 && bits[top - 1] == 0) {
        top--;
    }
    if (top <= 1) {
        return PyLong_FromUnsignedLongLong(top == 0 ? 0 : bits[0]);
    }
    unsigned char *bytes = PyMem_Malloc((size_t)top * 8);
    if (bytes == NULL) {
        return PyErr_NoMemory();
    }
    for (int64_t w = 0; w < top; w++) {
        for (int b = 0; b < 8; b++) {
            bytes[w * 8 + b] = (unsigned char)(bits[w] >> (8 * b));
        }
    }
    PyObject *out = _PyLong_FromByteArray(bytes, (size_t)top * 8, 1, 0);
    PyMem_Free(bytes);
    return out;
}

/* Set in ``out`` the holders of ``key`` that are set in ``within`` (all when NULL);
 * return whether any is. ``out`` must be clear. */
static int
holders_into(const Index *ix, uint64_t key, const uint64_t *within, uint64_t *out)
{
    int64_t at = find(ix, key);
    if (at < 0) {
        return 0;
    }
    int any = 0;
    for (int32_t h = ix->table[at]; h != NONE; h = ix->nodes[h].next_holder) {
        int32_t slot = ix->nodes[h].slot;
        uint64_t bit = 1ULL << (slot & 63);
        if (within == NULL || (within[slot >> 6] & bit)) {
            out[slot >> 6] |= bit;
            any = 1;
        }
    }
    return any;
}

static PyObject *
Index_holders(Index *self, PyObject *block)
{
    uint64_t key;
    if (oa_as_key(block, &key) < 0) {
        return NULL;
    }
    memset(self->alive, 0, (size_t)self->words * sizeof(uint64_t));
    holders_into(self, key, NULL, self->alive);
    return bitmap_int(self->alive, self->words);
}

static PyObject *
Index_match_groups(Index *self, PyObject *hashes)
{
    PyObject *seq = PySequence_Fast(hashes, "hashes must be a sequence of ints");
    if (seq == NULL) {
        return NULL;
    }
    Py_ssize_t end = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    PyObject *groups = PyList_New(0);
    if (groups == NULL || end == 0) {
        Py_DECREF(seq);
        return groups;
    }
    int64_t words = self->words;
    uint64_t *alive = self->alive, *still = self->still;
    size_t span = (size_t)words * sizeof(uint64_t);
    uint64_t key;
    if (oa_as_key(items[0], &key) < 0) {
        goto fail;
    }
    memset(alive, 0, span);
    int live = holders_into(self, key, NULL, alive);
    Py_ssize_t depth = 1;
    while (live) {
        memset(still, 0, span);
        live = 0;
        if (depth < end) {
            if (oa_as_key(items[depth], &key) < 0) {
                goto fail;
            }
            live = holders_into(self, key, alive, still);
        }
        int gone = 0;
        for (int64_t w = 0; w < words; w++) {
            alive[w] &= ~still[w];
            gone |= alive[w] != 0;
        }
        if (gone) {
            PyObject *mask = bitmap_int(alive, words);
            if (mask == NULL) {
                goto fail;
            }
            PyObject *pair = Py_BuildValue("(nN)", depth, mask);
            if (pair == NULL || PyList_Append(groups, pair) < 0) {
                Py_XDECREF(pair);
                goto fail;
            }
            Py_DECREF(pair);
        }
        uint64_t *swap = alive;
        alive = still;
        still = swap;
        depth++;
    }
    Py_DECREF(seq);
    return groups;
fail:
    Py_DECREF(seq);
    Py_DECREF(groups);
    return NULL;
}

static PyObject *
Index_nbytes(Index *self, void *closure)
{
    (void)closure;
    size_t bytes = (size_t)self->node_capacity * sizeof(Node)
        + (size_t)self->slot_count * sizeof(Slot)
        + (size_t)(self->table_mask + 1) * sizeof(int32_t)
        + 2 * (size_t)self->words * sizeof(uint64_t);
    return PyLong_FromSize_t(bytes);
}

static PyMethodDef Index_methods[] = {
    {"insert", (PyCFunction)(void (*)(void))Index_insert, METH_VARARGS | METH_KEYWORDS,
     "insert(slot, hashes, capacity): record that slot got these blocks; evict its least "
     "recent beyond capacity."},
    {"forget", (PyCFunction)Index_forget, METH_O, "forget(slot): drop everything slot holds."},
    {"blocks", (PyCFunction)Index_blocks, METH_O, "blocks(slot): how many blocks slot holds."},
    {"holders", (PyCFunction)Index_holders, METH_O,
     "holders(block): bit mask of the slots holding block."},
    {"match_groups", (PyCFunction)Index_match_groups, METH_O,
     "match_groups(hashes): (leading blocks, mask of the slots holding exactly that many), "
     "shallowest first."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Index_getset[] = {
    {"nbytes", (getter)Index_nbytes, NULL, "Bytes the index holds (all allocated up front).",
     NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PySequenceMethods Index_as_sequence = {
    .sq_length = (lenfunc)Index_len,
};

static PyTypeObject IndexType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "zone_agent._prefix.PrefixIndex",
    .tp_doc = "Block hash -> GPU slots that recently received it; per-slot LRU with a "
              "capacity, in memory allocated when a slot appears.",
    .tp_basicsize = sizeof(Index),
    .tp_itemsize = 0,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_new = Index_new,
    .tp_init = (initproc)Index_init,
    .tp_dealloc = (destructor)Index_dealloc,
    .tp_methods = Index_methods,
    .tp_getset = Index_getset,
    .tp_as_sequence = &Index_as_sequence,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "zone_agent._prefix",
    .m_doc = "The zone agent's prefix index, allocated whole (see zone_agent.prefix).",
    .m_size = -1,
};

PyMODINIT_FUNC
PyInit__prefix(void)
{
    if (PyType_Ready(&IndexType) < 0) {
        return NULL;
    }
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) {
        return NULL;
    }
    Py_INCREF(&IndexType);
    if (PyModule_AddObject(m, "PrefixIndex", (PyObject *)&IndexType) < 0) {
        Py_DECREF(&IndexType);
        Py_DECREF(m);
        return NULL;
    }
    PyObject *limit = PyLong_FromLong(MAX_SLOT_BLOCKS);
    if (limit == NULL || PyModule_AddObject(m, "MAX_SLOT_BLOCKS", limit) < 0) {
        Py_XDECREF(limit);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
