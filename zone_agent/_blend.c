/*
 * zone_agent._blend: the default zone profile's kernels, one pass over the GPUs each.
 *
 * ttft_costs: ttft-cost's predicted TTFT of every candidate (zone_agent/plugins/
 * ttft_cost.py), the numpy path's ~10 array operations in one call, in their order and
 * without FMA contraction (setup.py), so the same floats: tests/unit/zone_agent/
 * test_blend_kernel.py compares them to the bit.
 *
 * blend_choice: the score-and-pick.
 * The default profile blends the TTFT cost score with the KV-cache room score and takes
 * the survivor of highest total (zone_agent/pipeline.py, BlendPick). With numpy that is
 * about a dozen array operations of ~1 us each on 64 GPUs, a third of a decision; here
 * it is one C call. It reads the numpy arrays through the buffer protocol (no numpy
 * headers: nothing to build against) and follows the numpy path's operations in their
 * order, but its exp() is the C library's, which may differ from numpy's in the last
 * bit: so when the best two totals are within NEAR_TIE of each other it returns -1 and
 * the caller decides with numpy, as the reference runner does. tests/unit/zone_agent/
 * test_blend_kernel.py checks the choice against the numpy path on random zones.
 *
 * Built by setup.py as an optional extension; without a compiler the numpy path runs.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <string.h>

/* Totals are in [0, 2]; exp() implementations agree to a few ulps (~1e-15 here). */
#define NEAR_TIE 1e-12

/* A 1-D C-contiguous buffer of 8-byte items whose struct format code (its last
 * character: "d", "<d", "=d"...) is one of ``codes``: "d" for float64, "lq" for int64;
 * ``writable`` for an output. */
static int
get_array(PyObject *obj, Py_buffer *view, const char *what, const char *codes, int writable)
{
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) < 0) {
        return -1;
    }
    const char *format = view->format != NULL ? view->format : "B";
    size_t length = strlen(format);
    char code = length > 0 ? format[length - 1] : '\0';
    if (view->ndim != 1 || view->itemsize != 8 || code == '\0' || strchr(codes, code) == NULL) {
        PyErr_Format(PyExc_TypeError, "%s: a %s1-D array of %s is needed (got format %s)",
                     what, writable ? "writable " : "", codes[0] == 'd' ? "float64" : "int64",
                     format);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static int
get_buffer(PyObject *obj, Py_buffer *view, const char *what, const char *codes)
{
    return get_array(obj, view, what, codes, 0);
}

PyDoc_STRVAR(blend_choice_doc,
"blend_choice(costs, kv_blocks, slots, kv_own_base, kv_free_base, inv_total, survivors,\n"
"             inv_scale, cost_weight, room_weight, weight_sum) -> int\n\n"
"The position of highest cost_weight*exp((best - cost)*inv_scale) + room_weight*room\n"
"(divided by weight_sum unless it is 0), room = min(1, max(0, kv_free_base -\n"
"max(0, kv_blocks[slots] - kv_own_base)) * inv_total), over survivors (int64\n"
"positions, or None: all); -1 when the caller must decide (a near tie, NaN, no\n"
"finite cost).");

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
        double score = exp((best - costs[p]) * inv_scale);
        double total = w_cost == 1.0 ? score : score * w_cost;
        long long slot = slots[p];
        if (slot < 0 || slot >= slot_count) {
            PyErr_SetString(PyExc_IndexError, "blend_choice: slot out of range");
            goto fail;
        }
        double sent = kv[slot] - own_base[p];
        if (!(sent > 0.0)) sent = isnan(sent) ? sent : 0.0;
        double free = free_base[p] - sent;
        if (!(free > 0.0)) free = isnan(free) ? free : 0.0;
        double room = free * inv_total[p];
        if (room > 1.0) room = 1.0;
        total += w_room == 1.0 ? room : room * w_room;
        if (w_sum != 0.0) total /= w_sum;
        if (isnan(total)) goto done;
        if (total > top) {
            second = top;
            top = total;
            top_at = p;
        } else if (total > second) {
            second = total;
        }
    }
    if (m > 1 && second >= top - NEAR_TIE) goto done;
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

/* One position's cache credit, where the bounded-load cap allows it. */
static inline void
credit(double *out, const double *pending, const double *streams, const long long *slots,
       const double *external, const double *rate, Py_ssize_t p, double blocks, double prompt,
       double per_block, double sequences, double scale)
{
    long long slot = slots[p];
    if (streams[slot] + sequences <= ceil(scale * rate[p])) {
        double own = prompt - blocks * per_block;
        out[p] = (pending[slot] + external[p]) + (own > 0.0 ? own : 0.0);
    }
}

PyDoc_STRVAR(ttft_costs_doc,
"ttft_costs(out, pending, streams, slots, external_queued, rate, ms_per_token,\n"
"           inv_max_batched, step_extra_ms, matches, prompt, per_block, sequences,\n"
"           scale, decode) -> None\n\n"
"ttft-cost's predicted TTFT per candidate into out (zone_agent/plugins/ttft_cost.py):\n"
"tokens = pending[slots] + external_queued + own, own = prompt less the cache credit\n"
"max(0, prompt - blocks*per_block) at the positions of matches (a dict position ->\n"
"blocks, or a list of (blocks, bytes of a little-endian mask of positions)) whose\n"
"streams[slot] + sequences <= ceil(scale*rate); cost = tokens *\n"
"ms_per_token (+ ceil(tokens * inv_max_batched) * step_extra_ms when decode). The\n"
"numpy path's IEEE operations in its order (built without contraction into FMAs):\n"
"the same floats.");

static PyObject *
ttft_costs(PyObject *module, PyObject *args)
{
    (void)module;
    PyObject *o_out, *o_pending, *o_streams, *o_slots, *o_external, *o_rate, *o_ms;
    PyObject *o_inv_batched, *o_step, *o_matches;
    double prompt, per_block, sequences, scale;
    int decode;
    if (!PyArg_ParseTuple(args, "OOOOOOOOOOddddp", &o_out, &o_pending, &o_streams, &o_slots,
                          &o_external, &o_rate, &o_ms, &o_inv_batched, &o_step, &o_matches,
                          &prompt, &per_block, &sequences, &scale, &decode)) {
        return NULL;
    }
    if (!PyDict_Check(o_matches) && !PyList_Check(o_matches)) {
        PyErr_SetString(PyExc_TypeError, "ttft_costs: matches must be a dict or a list");
        return NULL;
    }
    Py_buffer b[10];
    int held = 0;
    PyObject *result = NULL;
    if (get_array(o_out, &b[0], "out", "d", 1) < 0) return NULL;
    held = 1;
    PyObject *inputs[9] = {o_pending, o_streams, o_slots, o_external, o_rate, o_ms,
                           o_inv_batched, o_step, NULL};
    const char *names[8] = {"pending", "streams", "slots", "external_queued", "rate",
                            "ms_per_token", "inv_max_batched", "step_extra_ms"};
    for (int k = 0; k < 8; k++) {
        if (get_buffer(inputs[k], &b[k + 1], names[k], k == 2 ? "lq" : "d") < 0) goto release;
        held++;
    }
    Py_ssize_t n = b[0].shape[0];
    Py_ssize_t slot_count = b[1].shape[0];
    if (b[2].shape[0] != slot_count || b[3].shape[0] != n || b[4].shape[0] != n ||
        b[5].shape[0] != n || b[6].shape[0] != n || b[7].shape[0] != n || b[8].shape[0] != n) {
        PyErr_SetString(PyExc_ValueError, "ttft_costs: arrays of different lengths");
        goto release;
    }
    double *out = b[0].buf;
    const double *pending = b[1].buf, *streams = b[2].buf;
    const long long *slots = b[3].buf;
    const double *external = b[4].buf, *rate = b[5].buf, *ms = b[6].buf;
    const double *inv_batched = b[7].buf, *step = b[8].buf;

    /* Queued tokens plus the whole prompt (numpy: pending[slots] + external + prompt). */
    for (Py_ssize_t p = 0; p < n; p++) {
        long long slot = slots[p];
        if (slot < 0 || slot >= slot_count) {
            PyErr_SetString(PyExc_IndexError, "ttft_costs: slot out of range");
            goto release;
        }
        out[p] = (pending[slot] + external[p]) + prompt;
    }
    /* Cache credit where the bounded-load cap allows it (TtftCost._credit). */
    if (PyDict_Check(o_matches)) {
        Py_ssize_t at = 0;
        PyObject *key, *value;
        while (PyDict_Next(o_matches, &at, &key, &value)) {
            Py_ssize_t p = PyLong_AsSsize_t(key);
            if (p == -1 && PyErr_Occurred()) goto release;
            double blocks = PyLong_AsDouble(value);
            if (blocks == -1.0 && PyErr_Occurred()) goto release;
            if (p < 0 || p >= n) {
                PyErr_SetString(PyExc_IndexError, "ttft_costs: match position out of range");
                goto release;
            }
            credit(out, pending, streams, slots, external, rate, p, blocks, prompt, per_block,
                   sequences, scale);
        }
    } else {
        /* Groups (blocks, positions as the bytes of a little-endian bit mask). */
        Py_ssize_t count = PyList_GET_SIZE(o_matches);
        for (Py_ssize_t g = 0; g < count; g++) {
            PyObject *item = PyList_GET_ITEM(o_matches, g);
            if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 2 ||
                !PyBytes_Check(PyTuple_GET_ITEM(item, 1))) {
                PyErr_SetString(PyExc_TypeError,
                                "ttft_costs: a match group is a (blocks, mask bytes) tuple");
                goto release;
            }
            double blocks = PyLong_AsDouble(PyTuple_GET_ITEM(item, 0));
            if (blocks == -1.0 && PyErr_Occurred()) goto release;
            const unsigned char *mask = (const unsigned char *)PyBytes_AS_STRING(
                PyTuple_GET_ITEM(item, 1));
            Py_ssize_t size = PyBytes_GET_SIZE(PyTuple_GET_ITEM(item, 1));
            for (Py_ssize_t k = 0; k < size; k++) {
                unsigned int byte = mask[k];
                while (byte) {
                    Py_ssize_t p = 8 * k + __builtin_ctz(byte);
                    byte &= byte - 1;
                    if (p >= n) {
                        PyErr_SetString(PyExc_IndexError,
                                        "ttft_costs: match position out of range");
                        goto release;
                    }
                    credit(out, pending, streams, slots, external, rate, p, blocks, prompt,
                           per_block, sequences, scale);
                }
            }
        }
    }
    for (Py_ssize_t p = 0; p < n; p++) {
        double tokens = out[p];
        double cost = tokens * ms[p];
        if (decode) {
            double passes = ceil(tokens * inv_batched[p]);
            cost += passes * step[p];
        }
        out[p] = cost;
    }
    Py_INCREF(Py_None);
    result = Py_None;

release:
    for (int k = held - 1; k >= 0; k--) PyBuffer_Release(&b[k]);
    return result;
}

static PyMethodDef blend_methods[] = {
    {"blend_choice", blend_choice, METH_VARARGS, blend_choice_doc},
    {"ttft_costs", ttft_costs, METH_VARARGS, ttft_costs_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef blend_module = {
    PyModuleDef_HEAD_INIT, "zone_agent._blend",
    "The default zone profile's score-and-pick in C (see _blend.c).", -1, blend_methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__blend(void)
{
    return PyModule_Create(&blend_module);
}
