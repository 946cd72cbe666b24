/*
 * The one open-addressing table of gtm's compiled structures (zone_agent/_prefix.c,
 * gtm/routing/_placement.c): 64-bit block hash -> node index, over a power-of-two array
 * of int32 node indices at most half full, linear probing, deletion by backward shift
 * (Knuth, TAOCP vol. 3, 6.4, algorithm R; gpusim's BlockPool is the same table in
 * Python). A node array is any array of structs whose first member is the uint64_t key;
 * ``stride`` is the struct's size.
 */
#ifndef GTM_OPEN_ADDRESSING_H
#define GTM_OPEN_ADDRESSING_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#define OA_NONE (-1)

static inline uint64_t
oa_mix(uint64_t x)
{
    /* splitmix64's finaliser: callers and tests may use small consecutive ints. */
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    x ^= x >> 31;
    return x;
}

static inline uint64_t
oa_key(const void *nodes, size_t stride, int32_t n)
{
    return *(const uint64_t *)((const char *)nodes + (size_t)n * stride);
}

/* The position holding ``key``, or -1 - (the empty position to put it in). */
static inline int64_t
oa_find(const int32_t *table, uint64_t mask, const void *nodes, size_t stride, uint64_t key)
{
    uint64_t at = oa_mix(key) & mask;
    for (;;) {
        int32_t n = table[at];
        if (n == OA_NONE) {
            return -1 - (int64_t)at;
        }
        if (oa_key(nodes, stride, n) == key) {
            return (int64_t)at;
        }
        at = (at + 1) & mask;
    }
}

/* Empty position ``at``, moving up any later entry of its probe run whose home is not
 * cyclically in (hole, its position], so every lookup still finds it. */
static inline void
oa_delete(int32_t *table, uint64_t mask, const void *nodes, size_t stride, uint64_t at)
{
    uint64_t hole = at;
    uint64_t slot = (at + 1) & mask;
    while (table[slot] != OA_NONE) {
        uint64_t home = oa_mix(oa_key(nodes, stride, table[slot])) & mask;
        if (((slot - home) & mask) >= ((slot - hole) & mask)) {
            table[hole] = table[slot];
            hole = slot;
        }
        slot = (slot + 1) & mask;
    }
    table[hole] = OA_NONE;
}

/* A block hash from Python: any int, taken modulo 2**64. */
static inline int
oa_as_key(PyObject *obj, uint64_t *key)
{
    if (!PyLong_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "prefix blocks are ints, got %.100s", Py_TYPE(obj)->tp_name);
        return -1;
    }
    *key = (uint64_t)PyLong_AsUnsignedLongLongMask(obj);
    return (*key == (uint64_t)-1 && PyErr_Occurred()) ? -1 : 0;
}

#endif
