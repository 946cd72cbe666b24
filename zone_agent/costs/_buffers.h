/*
 * The zone cost kernels' one buffer reader (included by _ttft.c and _blend.c): a numpy
 * array through the buffer protocol, so the kernels need no numpy headers to build.
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

#endif
