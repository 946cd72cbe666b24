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
 * against both other forms. A Kernel object (one per model index: blend.py's new_form)
 * holds its input arrays' buffers between calls (_buffers.h says why). Built by setup.py
 * as an optional extension; without a compiler the numpy form runs.
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

/* The input arrays after ``costs``, in argument order (survivors: None or an array). */
enum { KV, SLOTS, OWN_BASE, FREE_BASE, INV_TOTAL, SURVIVORS, INPUTS };
static const char *const input_names[INPUTS] = {
    "kv_blocks", "slots", "kv_own_base", "kv_free_base", "inv_total", "survivors",
};
#define ARGS 11

/* blend_choice over ``args``; ``held``: the buffers of the input arrays last given (a
 * kernel object's) or none yet (released by the caller). */
static PyObject *
blend_run(Held *held, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != ARGS) {
        PyErr_Format(PyExc_TypeError, "blend_choice expected %d arguments, got %zd", ARGS,
                     nargs);
        return NULL;
    }
    double inv_scale, w_cost, w_room, w_sum;
    if (get_double(args[7], &inv_scale) < 0 || get_double(args[8], &w_cost) < 0 ||
        get_double(args[9], &w_room) < 0 || get_double(args[10], &w_sum) < 0) {
        return NULL;
    }
    PyObject *o_surv = args[6];
    int have_surv = o_surv != Py_None;
    Py_buffer b_costs;
    if (get_buffer(args[0], &b_costs, "costs", "d") < 0) return NULL;
    long result = -1;
    for (int k = 0; k < INPUTS; k++) {
        if (k == SURVIVORS && !have_surv) break;
        if (held_get(&held[k], args[k + 1], input_names[k], k == SLOTS || k == SURVIVORS
                                                                   ? "lq" : "d") < 0) {
            goto fail;
        }
    }

    Py_ssize_t n = b_costs.shape[0];
    Py_ssize_t slot_count = held[KV].view.shape[0];
    if (held[SLOTS].view.shape[0] != n || held[OWN_BASE].view.shape[0] != n ||
        held[FREE_BASE].view.shape[0] != n || held[INV_TOTAL].view.shape[0] != n) {
        PyErr_SetString(PyExc_ValueError, "blend_choice: arrays of different lengths");
        goto fail;
    }
    const double *costs = b_costs.buf, *kv = held[KV].view.buf;
    const double *own_base = held[OWN_BASE].view.buf, *free_base = held[FREE_BASE].view.buf;
    const double *inv_total = held[INV_TOTAL].view.buf;
    const long long *slots = held[SLOTS].view.buf;
    const long long *surv = have_surv ? held[SURVIVORS].view.buf : NULL;
    Py_ssize_t m = have_surv ? held[SURVIVORS].view.shape[0] : n;
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
    PyBuffer_Release(&b_costs);
    return PyLong_FromLong(result);

fail:
    PyBuffer_Release(&b_costs);
    return NULL;
}

static PyObject *
blend_choice(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    Held held[INPUTS];
    memset(held, 0, sizeof held);
    PyObject *result = blend_run(held, args, nargs);
    held_release_all(held, INPUTS);
    return result;
}

/* ---------------------------------------------------------------- the kernel object */

DEFINE_KERNEL_OBJECT(INPUTS)

static PyObject *
kernel_blend_choice(Kernel *self, PyObject *const *args, Py_ssize_t nargs)
{
    return blend_run(self->held, args, nargs);
}

/* min over positions of kv_free_base - kv_blocks[slots] (NaN if any is NaN). */
static PyObject *
kernel_kv_floor(Kernel *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "kv_floor expected 3 arguments, got %zd", nargs);
        return NULL;
    }
    Held *held = self->held;
    if (held_get(&held[KV], args[0], "kv_blocks", "d") < 0 ||
        held_get(&held[SLOTS], args[1], "slots", "lq") < 0 ||
        held_get(&held[FREE_BASE], args[2], "kv_free_base", "d") < 0) {
        return NULL;
    }
    Py_ssize_t n = held[SLOTS].view.shape[0];
    Py_ssize_t slot_count = held[KV].view.shape[0];
    if (held[FREE_BASE].view.shape[0] != n) {
        PyErr_SetString(PyExc_ValueError, "kv_floor: arrays of different lengths");
        return NULL;
    }
    if (n == 0) {
        PyErr_SetString(PyExc_ValueError, "kv_floor: no position");
        return NULL;
    }
    const double *kv = held[KV].view.buf, *free_base = held[FREE_BASE].view.buf;
    const long long *slots = held[SLOTS].view.buf;
    double floor = INFINITY;
    for (Py_ssize_t p = 0; p < n; p++) {
        long long slot = slots[p];
        if (slot < 0 || slot >= slot_count) {
            PyErr_SetString(PyExc_IndexError, "kv_floor: slot out of range");
            return NULL;
        }
        double value = free_base[p] - kv[slot];
        if (isnan(value)) return PyFloat_FromDouble(value);
        if (p == 0 || value < floor) floor = value;
    }
    return PyFloat_FromDouble(floor);
}

PyDoc_STRVAR(kernel_kv_floor_doc,
"kv_floor(kv_blocks, slots, kv_free_base) -> float\n\n"
"min(kv_free_base - kv_blocks[slots]) (NaN if any is NaN): free KV blocks are at least\n"
"this everywhere (blend.py: kv_floor_numpy, the fits filter's cheap test).");

PyDoc_STRVAR(kernel_blend_choice_doc,
"blend_choice(costs, kv_blocks, slots, ...) -> int\n\n"
"The module's blend_choice, holding the input arrays' buffers (all but costs) until it\n"
"is given other arrays (the same arrays call after call ask numpy for no buffer).");

static PyMethodDef kernel_methods[] = {
    {"blend_choice", (PyCFunction)(void (*)(void))kernel_blend_choice, METH_FASTCALL,
     kernel_blend_choice_doc},
    {"kv_floor", (PyCFunction)(void (*)(void))kernel_kv_floor, METH_FASTCALL,
     kernel_kv_floor_doc},
    {NULL, NULL, 0, NULL},
};

PyDoc_STRVAR(kernel_doc,
"Kernel()\n\n"
"blend_choice for one model index's decisions: holds the buffers of the arrays it was\n"
"last given (a view's columns, the accounting's KV charges, the survivors of a view)\n"
"instead of asking numpy for them on every call.");

static PyTypeObject KernelType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "zone_agent.costs._blend.Kernel",
    .tp_basicsize = sizeof(Kernel),
    .tp_dealloc = (destructor)kernel_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = kernel_doc,
    .tp_methods = kernel_methods,
    .tp_new = kernel_new,
};

static PyMethodDef blend_methods[] = {
    {"blend_choice", (PyCFunction)(void (*)(void))blend_choice, METH_FASTCALL,
     blend_choice_doc},
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
    return module_with_kernel(&blend_module, &KernelType);
}
