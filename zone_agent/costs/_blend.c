/*
 * zone_agent.costs._blend: the compiled form of the zone default's score-and-pick
 * (zone_agent/costs/blend.py holds the formulas and their other forms: the scalar
 * reference and the numpy form with this kernel's signature).
 *
 * The default profile blends the TTFT score of each GPU's cost with its KV-cache room
 * and takes the survivor of highest total. This follows the numpy form's operations in
 * their order, but its exp() is the C library's (the scalar reference's math.exp),
 * which may differ from numpy's in the last bit: so when the best two totals are within
 * NEAR_TIE of each other it returns -1 and the caller decides with numpy, as the
 * reference runner does -- unless every survivor in that band costs exactly the best
 * (an exact tie of costs, exact_tie() below), whose totals are the same bits in every
 * form. tests/unit/zone_agent/costs/test_blend.py checks the choice
 * against both other forms. Built by setup.py as an optional extension; without a
 * compiler the numpy form runs.
 */
#include "_buffers.h"
#include <math.h>

/* Totals are in [0, 2]; exp() implementations agree to a few ulps (~1e-15 here). */
#define NEAR_TIE 1e-12

/* One survivor's total (its slot already checked). */
static inline double
total_at(const double *costs, const double *kv, const long long *slots,
         const double *own_base, const double *free_base, const double *inv_total,
         Py_ssize_t p, double best, double inv_scale, double w_cost, double w_room,
         double w_sum)
{
    double score = exp((best - costs[p]) * inv_scale);
    double total = w_cost == 1.0 ? score : score * w_cost;
    double sent = kv[slots[p]] - own_base[p];
    if (!(sent > 0.0)) sent = isnan(sent) ? sent : 0.0;
    double free = free_base[p] - sent;
    if (!(free > 0.0)) free = isnan(free) ? free : 0.0;
    double room = free * inv_total[p];
    if (room > 1.0) room = 1.0;
    total += w_room == 1.0 ? room : room * w_room;
    if (w_sum != 0.0) total /= w_sum;
    return total;
}

/* Whether a near tie is one the kernel may decide itself: every survivor within
 * NEAR_TIE of the top costs exactly the best, so its TTFT score is exp(0) = 1 in every
 * form (no exp() of a nonzero number is involved) and its total is the same sequence of
 * IEEE operations in C and in numpy: the same bits. Those outside the band are more
 * than NEAR_TIE below the top in any form (exp() implementations differ by a few ulps),
 * so the first of the top is every form's choice. This is the idle zone of identical
 * GPUs, where every request would otherwise be decided by the numpy form. */
static int
exact_tie(const double *costs, const double *kv, const long long *slots,
          const double *own_base, const double *free_base, const double *inv_total,
          const long long *surv, Py_ssize_t m, double best, double inv_scale, double w_cost,
          double w_room, double w_sum, double top)
{
    for (Py_ssize_t k = 0; k < m; k++) {
        Py_ssize_t p = surv ? (Py_ssize_t)surv[k] : k;
        double total = total_at(costs, kv, slots, own_base, free_base, inv_total, p, best,
                                inv_scale, w_cost, w_room, w_sum);
        if (total >= top - NEAR_TIE && costs[p] != best) return 0;
    }
    return 1;
}

PyDoc_STRVAR(blend_choice_doc,
"blend_choice(costs, kv_blocks, slots, kv_own_base, kv_free_base, inv_total, survivors,\n"
"             inv_scale, cost_weight, room_weight, weight_sum) -> int\n\n"
"The position of highest cost_weight*exp((best - cost)*inv_scale) + room_weight*room\n"
"(divided by weight_sum unless it is 0), room = min(1, max(0, kv_free_base -\n"
"max(0, kv_blocks[slots] - kv_own_base)) * inv_total), over survivors (int64\n"
"positions, or None: all); -1 when the caller must decide (a near tie between\n"
"survivors of different costs, NaN, no finite cost).");

static PyObject *
blend_choice(PyObject *module, PyObject *args)
{
    (void)module;
    PyObject *o_costs, *o_kv, *o_slots, *o_own_base, *o_free_base, *o_inv_total, *o_surv;
    double inv_scale, w_cost, w_room, w_sum;
    if (!PyArg_ParseTuple(args, "OOOOOOOdddd", &o_costs, &o_kv, &o_slots, &o_own_base,
                          &o_free_base, &o_inv_total, &o_surv, &inv_scale, &w_cost, &w_room,
                          &w_sum)) {
        return NULL;
    }
    Py_buffer b_costs, b_kv, b_slots, b_own_base, b_free_base, b_inv_total, b_surv;
    int have_surv = o_surv != Py_None;
    long result = -1;
    if (get_buffer(o_costs, &b_costs, "costs", "d") < 0) return NULL;
    if (get_buffer(o_kv, &b_kv, "kv_blocks", "d") < 0) goto r0;
    if (get_buffer(o_slots, &b_slots, "slots", "lq") < 0) goto r1;
    if (get_buffer(o_own_base, &b_own_base, "kv_own_base", "d") < 0) goto r2;
    if (get_buffer(o_free_base, &b_free_base, "kv_free_base", "d") < 0) goto r3;
    if (get_buffer(o_inv_total, &b_inv_total, "inv_total", "d") < 0) goto r4;
    if (have_surv && get_buffer(o_surv, &b_surv, "survivors", "lq") < 0) goto r5;

    Py_ssize_t n = b_costs.shape[0];
    Py_ssize_t slot_count = b_kv.shape[0];
    if (b_slots.shape[0] != n || b_own_base.shape[0] != n || b_free_base.shape[0] != n ||
        b_inv_total.shape[0] != n) {
        PyErr_SetString(PyExc_ValueError, "blend_choice: arrays of different lengths");
        goto fail;
    }
    const double *costs = b_costs.buf, *kv = b_kv.buf, *own_base = b_own_base.buf;
    const double *free_base = b_free_base.buf, *inv_total = b_inv_total.buf;
    const long long *slots = b_slots.buf;
    const long long *surv = have_surv ? b_surv.buf : NULL;
    Py_ssize_t m = have_surv ? b_surv.shape[0] : n;
    if (m == 0) goto done;

    /* The best cost over the survivors (fmin: NaN anywhere makes it NaN). */
    double best = INFINITY;
    for (Py_ssize_t k = 0; k < m; k++) {
        Py_ssize_t p = surv ? (Py_ssize_t)surv[k] : k;
        if (p < 0 || p >= n) {
            PyErr_SetString(PyExc_IndexError, "blend_choice: survivor out of range");
            goto fail;
        }
        double c = costs[p];
        if (isnan(c)) goto done;
        if (c < best) best = c;
    }
    if (!(best < INFINITY)) goto done;

    double top = -INFINITY, second = -INFINITY;
    Py_ssize_t top_at = -1;
    for (Py_ssize_t k = 0; k < m; k++) {
        Py_ssize_t p = surv ? (Py_ssize_t)surv[k] : k;
        long long slot = slots[p];
        if (slot < 0 || slot >= slot_count) {
            PyErr_SetString(PyExc_IndexError, "blend_choice: slot out of range");
            goto fail;
        }
        double total = total_at(costs, kv, slots, own_base, free_base, inv_total, p, best,
                                inv_scale, w_cost, w_room, w_sum);
        if (isnan(total)) goto done;
        if (total > top) {
            second = top;
            top = total;
            top_at = p;
        } else if (total > second) {
            second = total;
        }
    }
    if (m > 1 && second >= top - NEAR_TIE && !exact_tie(costs, kv, slots, own_base, free_base,
                                                        inv_total, surv, m, best, inv_scale,
                                                        w_cost, w_room, w_sum, top)) {
        goto done;
    }
    result = (long)top_at;

done:
    if (have_surv) PyBuffer_Release(&b_surv);
    PyBuffer_Release(&b_inv_total);
    PyBuffer_Release(&b_free_base);
    PyBuffer_Release(&b_own_base);
    PyBuffer_Release(&b_slots);
    PyBuffer_Release(&b_kv);
    PyBuffer_Release(&b_costs);
    return PyLong_FromLong(result);

fail:
    if (have_surv) PyBuffer_Release(&b_surv);
r5:
    PyBuffer_Release(&b_inv_total);
r4:
    PyBuffer_Release(&b_free_base);
r3:
    PyBuffer_Release(&b_own_base);
r2:
    PyBuffer_Release(&b_slots);
r1:
    PyBuffer_Release(&b_kv);
r0:
    PyBuffer_Release(&b_costs);
    return NULL;
}

static PyMethodDef blend_methods[] = {
    {"blend_choice", blend_choice, METH_VARARGS, blend_choice_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef blend_module = {
    PyModuleDef_HEAD_INIT, "zone_agent.costs._blend",
    "The zone default's score-and-pick in C (zone_agent/costs/blend.py).", -1, blend_methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__blend(void)
{
    return PyModule_Create(&blend_module);
}
