/*
 * zone_agent.costs._ttft: the compiled form of the zone's predicted-TTFT cost
 * (zone_agent/costs/ttft.py holds the formula and its other forms: the scalar reference
 * and the numpy form with this kernel's signature). One pass over a model's GPUs with
 * the numpy form's IEEE operations in its order, built without contraction into FMAs
 * (setup.py): the same floats, which tests/unit/zone_agent/costs/test_ttft.py checks to
 * the bit. Built by setup.py as an optional extension; without a compiler the numpy
 * form runs.
 */
#include "_buffers.h"
#include <math.h>

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
"The predicted TTFT of every candidate into out (zone_agent/costs/ttft.py):\n"
"tokens = pending[slots] + external_queued + own, own = prompt less the cache credit\n"
"max(0, prompt - blocks*per_block) at the positions of matches (a dict position ->\n"
"blocks, or a list of (blocks, bytes of a little-endian mask of positions)) whose\n"
"streams[slot] + sequences <= ceil(scale*rate); cost = tokens *\n"
"ms_per_token (+ ceil(tokens * inv_max_batched) * step_extra_ms when decode). The\n"
"numpy form's IEEE operations in its order (built without contraction into FMAs):\n"
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
    /* Cache credit where the bounded-load cap allows it (ttft.py: credited_tokens). */
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

static PyMethodDef ttft_methods[] = {
    {"ttft_costs", ttft_costs, METH_VARARGS, ttft_costs_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef ttft_module = {
    PyModuleDef_HEAD_INIT, "zone_agent.costs._ttft",
    "The zone's predicted-TTFT cost in C (zone_agent/costs/ttft.py).", -1, ttft_methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__ttft(void)
{
    return PyModule_Create(&ttft_module);
}
