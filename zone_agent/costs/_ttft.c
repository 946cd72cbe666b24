/*
 * zone_agent.costs._ttft: the compiled form of the zone's predicted-TTFT cost
 * (zone_agent/costs/ttft.py holds the formula and its other forms: the scalar reference
 * and the numpy form with this kernel's signature). One pass over a model's GPUs with
 * the numpy form's IEEE operations in its order, built without contraction into FMAs
 * (setup.py): the same floats, which tests/unit/zone_agent/costs/test_ttft.py checks to
 * the bit. A Kernel object (one per model index: ttft.py's new_form) holds its input
 * arrays' buffers between calls (_buffers.h says why). Built by setup.py as an optional
 * extension; without a compiler the numpy form runs.
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

/* The input arrays after ``out``, in argument order. */
enum { PENDING, STREAMS, SLOTS, EXTERNAL, RATE, MS, INV_BATCHED, STEP, INPUTS };
static const char *const input_names[INPUTS] = {
    "pending", "streams", "slots", "external_queued", "rate", "ms_per_token",
    "inv_max_batched", "step_extra_ms",
};
#define ARGS 15

/* ttft_costs over ``args``; ``held``: the buffers of the input arrays last given (a
 * kernel object's) or none yet (released by the caller). */
static PyObject *
ttft_run(Held *held, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != ARGS) {
        PyErr_Format(PyExc_TypeError, "ttft_costs expected %d arguments, got %zd", ARGS, nargs);
        return NULL;
    }
    PyObject *o_matches = args[9];
    double prompt, per_block, sequences, scale;
    if (get_double(args[10], &prompt) < 0 || get_double(args[11], &per_block) < 0 ||
        get_double(args[12], &sequences) < 0 || get_double(args[13], &scale) < 0) {
        return NULL;
    }
    int decode = PyObject_IsTrue(args[14]);
    if (decode < 0) return NULL;
    if (!PyDict_Check(o_matches) && !PyList_Check(o_matches)) {
        PyErr_SetString(PyExc_TypeError, "ttft_costs: matches must be a dict or a list");
        return NULL;
    }
    /* No Python code runs from here on (the matches' keys and values are read only as
     * exact ints), so the held buffers stay as they are for the whole call. */
    Py_buffer b_out;
    if (get_array(args[0], &b_out, "out", "d", 1) < 0) return NULL;
    PyObject *result = NULL;
    for (int k = 0; k < INPUTS; k++) {
        if (held_get(&held[k], args[k + 1], input_names[k], k == SLOTS ? "lq" : "d") < 0) {
            goto release;
        }
    }
    Py_ssize_t n = b_out.shape[0];
    Py_ssize_t slot_count = held[PENDING].view.shape[0];
    if (held[STREAMS].view.shape[0] != slot_count || held[SLOTS].view.shape[0] != n ||
        held[EXTERNAL].view.shape[0] != n || held[RATE].view.shape[0] != n ||
        held[MS].view.shape[0] != n || held[INV_BATCHED].view.shape[0] != n ||
        held[STEP].view.shape[0] != n) {
        PyErr_SetString(PyExc_ValueError, "ttft_costs: arrays of different lengths");
        goto release;
    }
    double *out = b_out.buf;
    const double *pending = held[PENDING].view.buf, *streams = held[STREAMS].view.buf;
    const long long *slots = held[SLOTS].view.buf;
    const double *external = held[EXTERNAL].view.buf, *rate = held[RATE].view.buf;
    const double *ms = held[MS].view.buf, *inv_batched = held[INV_BATCHED].view.buf;
    const double *step = held[STEP].view.buf;

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
    PyBuffer_Release(&b_out);
    return result;
}

static PyObject *
ttft_costs(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    Held held[INPUTS];
    memset(held, 0, sizeof held);
    PyObject *result = ttft_run(held, args, nargs);
    held_release_all(held, INPUTS);
    return result;
}

/* ---------------------------------------------------------------- the kernel object */

DEFINE_KERNEL_OBJECT(INPUTS)

static PyObject *
kernel_ttft_costs(Kernel *self, PyObject *const *args, Py_ssize_t nargs)
{
    return ttft_run(self->held, args, nargs);
}

PyDoc_STRVAR(kernel_ttft_costs_doc,
"ttft_costs(out, pending, streams, slots, ...) -> None\n\n"
"The module's ttft_costs, holding the input arrays' buffers until it is given other\n"
"arrays (the same arrays call after call ask numpy for no buffer).");

static PyMethodDef kernel_methods[] = {
    {"ttft_costs", (PyCFunction)(void (*)(void))kernel_ttft_costs, METH_FASTCALL,
     kernel_ttft_costs_doc},
    {NULL, NULL, 0, NULL},
};

PyDoc_STRVAR(kernel_doc,
"Kernel()\n\n"
"ttft_costs for one model index's decisions: holds the buffers of the arrays it was\n"
"last given (a view's columns and the accounting's arrays, the same objects call after\n"
"call) instead of asking numpy for them on every call.");

static PyTypeObject KernelType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "zone_agent.costs._ttft.Kernel",
    .tp_basicsize = sizeof(Kernel),
    .tp_dealloc = (destructor)kernel_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = kernel_doc,
    .tp_methods = kernel_methods,
    .tp_new = kernel_new,
};

static PyMethodDef ttft_methods[] = {
    {"ttft_costs", (PyCFunction)(void (*)(void))ttft_costs, METH_FASTCALL, ttft_costs_doc},
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
    return module_with_kernel(&ttft_module, &KernelType);
}
