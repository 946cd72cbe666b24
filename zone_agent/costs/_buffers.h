/*
 * The zone cost kernels' one buffer reader (included by _ttft.c and _blend.c): a numpy
 * array through the buffer protocol, so the kernels need no numpy headers to build.
 *
 * Asking numpy for an array's buffer formats its dtype into a string each time, a
 * visible share of a kernel call over a few GPUs. A kernel object (``Kernel`` of each
 * module, one per model index and view) therefore holds the buffers of the arrays it
 * was last given, one per argument, and asks again only when an argument is another
 * object (``held_get``): a view's columns and the accounting's arrays are the same
 * objects decision after decision. Holding a buffer keeps its array alive and unable to
 * be resized (numpy refuses to resize an array with an exported buffer), so the held
 * pointer stays valid; the values are read at each call.
 */
#ifndef ZONE_COSTS_BUFFERS_H
#define ZONE_COSTS_BUFFERS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

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

/* A read-only buffer held between calls (``view.obj`` NULL: none). */
typedef struct {
    Py_buffer view;
} Held;

static void
held_release(Held *held)
{
    if (held->view.obj != NULL) {
        PyBuffer_Release(&held->view); /* sets view.obj to NULL */
    }
}

/* ``obj``'s buffer in ``held``: the one held when it is the object held, else a new one
 * (the old one released only once the new one is good). */
static int
held_get(Held *held, PyObject *obj, const char *what, const char *codes)
{
    if (held->view.obj == obj) {
        return 0;
    }
    Py_buffer view;
    if (get_buffer(obj, &view, what, codes) < 0) {
        return -1;
    }
    held_release(held);
    held->view = view;
    return 0;
}

static void
held_release_all(Held *held, int count)
{
    for (int k = 0; k < count; k++) held_release(&held[k]);
}

/* The kernel object of each module: ``Kernel()`` holding one buffer per input (``inputs``,
 * the module's input count), released when the object goes. Expanded once by each
 * including file, after its inputs are numbered. */
#define DEFINE_KERNEL_OBJECT(inputs)                                                       \
    typedef struct {                                                                       \
        PyObject_HEAD                                                                      \
        Held held[inputs];                                                                 \
    } Kernel;                                                                              \
                                                                                           \
    static PyObject *                                                                      \
    kernel_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)                       \
    {                                                                                      \
        if (PyTuple_GET_SIZE(args) != 0 || (kwargs != NULL && PyDict_GET_SIZE(kwargs) != 0)) { \
            PyErr_SetString(PyExc_TypeError, "Kernel() takes no arguments");               \
            return NULL;                                                                   \
        }                                                                                  \
        return type->tp_alloc(type, 0); /* zeroed: no buffer held */                       \
    }                                                                                      \
                                                                                           \
    static void                                                                            \
    kernel_dealloc(Kernel *self)                                                           \
    {                                                                                      \
        held_release_all(self->held, inputs);                                              \
        Py_TYPE(self)->tp_free((PyObject *)self);                                          \
    }

/* The module ``def`` with its kernel type added as ``Kernel`` (a module's PyInit). */
static PyObject *
module_with_kernel(struct PyModuleDef *def, PyTypeObject *kernel_type)
{
    if (PyType_Ready(kernel_type) < 0) return NULL;
    PyObject *module = PyModule_Create(def);
    if (module == NULL) return NULL;
    Py_INCREF(kernel_type);
    if (PyModule_AddObject(module, "Kernel", (PyObject *)kernel_type) < 0) {
        Py_DECREF(kernel_type);
        Py_DECREF(module);
        return NULL;
    }
    return module;
}

/* A C double from a Python number, as PyArg_ParseTuple's "d" converts it. */
static int
get_double(PyObject *obj, double *out)
{
    double value = PyFloat_AsDouble(obj);
    if (value == -1.0 && PyErr_Occurred()) return -1;
    *out = value;
    return 0;
}

#endif
