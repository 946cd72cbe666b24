/*
 * The fields of a text log line in C (gtm/logs.py, TextFormatter.info_fields).
 *
 * The access log writes a line per request, a score of fields each: the Python loop
 * over them (a type test, a memo lookup and a concatenation per field) was the larger
 * part of the line's cost. This is the same loop, one call; what a value's text is
 * stays Python's (``text_value``, called for a str not remembered and for any other
 * type than int and float), so the quoting rules have one home.
 *
 * fields_text(prefixes, values, texts, limit, text_value) -> str
 *
 * The fields ``prefix + text`` of each (prefix, value) pair, joined by one space (""
 * when none): a pair is skipped when its value is None or its prefix is empty; an
 * exact str is written when not empty, by its text remembered in ``texts`` (or
 * ``text_value(value)``, then remembered unless the prefix ends in "_id=", ``texts``
 * emptied first when it holds ``limit``); an exact int or float by ``str(value)``;
 * anything else, unless it equals "", by ``text_value(value)``. ``prefixes`` and
 * ``values`` must be as long as each other (zip(..., strict=True)): ValueError.
 * tests/unit/gtm/test_logs.py pins it to the Python loop (``_fields_text_python``).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

static int
ends_with_id(PyObject *prefix)
{
    /* prefix[-4:] == "_id=" */
    Py_ssize_t n = PyUnicode_GET_LENGTH(prefix);
    if (n < 4) return 0;
    int kind = PyUnicode_KIND(prefix);
    const void *data = PyUnicode_DATA(prefix);
    return PyUnicode_READ(kind, data, n - 4) == '_' && PyUnicode_READ(kind, data, n - 3) == 'i'
        && PyUnicode_READ(kind, data, n - 2) == 'd' && PyUnicode_READ(kind, data, n - 1) == '=';
}

/* Append prefix + text to parts (text: a new reference, consumed). */
static int
append_field(PyObject *parts, PyObject *prefix, PyObject *text)
{
    if (text == NULL) return -1;
    if (!PyUnicode_Check(text)) {
        PyErr_Format(PyExc_TypeError, "text_value must return str, not %.100s",
                     Py_TYPE(text)->tp_name);
        Py_DECREF(text);
        return -1;
    }
    PyObject *field = PyUnicode_Concat(prefix, text);
    Py_DECREF(text);
    if (field == NULL) return -1;
    int rc = PyList_Append(parts, field);
    Py_DECREF(field);
    return rc;
}

static PyObject *
fields_text(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError,
                        "fields_text(prefixes, values, texts, limit, text_value) takes 5 arguments");
        return NULL;
    }
    PyObject *texts = args[2], *text_value = args[4];
    if (!PyDict_CheckExact(texts)) {
        PyErr_SetString(PyExc_TypeError, "texts must be a dict");
        return NULL;
    }
    Py_ssize_t limit = PyLong_AsSsize_t(args[3]);
    if (limit == -1 && PyErr_Occurred()) return NULL;
    PyObject *prefixes = PySequence_Fast(args[0], "prefixes must be a sequence");
    if (prefixes == NULL) return NULL;
    PyObject *values = PySequence_Fast(args[1], "values must be a sequence");
    if (values == NULL) {
        Py_DECREF(prefixes);
        return NULL;
    }
    PyObject *parts = NULL, *empty = NULL, *result = NULL;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(prefixes);
    if (PySequence_Fast_GET_SIZE(values) != count) {
        PyErr_Format(PyExc_ValueError, "%zd prefixes for %zd values",
                     count, PySequence_Fast_GET_SIZE(values));
        goto done;
    }
    parts = PyList_New(0);
    if (parts == NULL) goto done;
    PyObject **prefix_items = PySequence_Fast_ITEMS(prefixes);
    PyObject **value_items = PySequence_Fast_ITEMS(values);
    for (Py_ssize_t k = 0; k < count; k++) {
        PyObject *prefix = prefix_items[k], *value = value_items[k];
        if (!PyUnicode_Check(prefix)) {
            PyErr_SetString(PyExc_TypeError, "a prefix must be a str");
            goto done;
        }
        if (value == Py_None || PyUnicode_GET_LENGTH(prefix) == 0) continue;
        if (PyUnicode_CheckExact(value)) {
            if (PyUnicode_GET_LENGTH(value) == 0) continue;
            PyObject *text = PyDict_GetItemWithError(texts, value); /* borrowed */
            if (text != NULL) {
                Py_INCREF(text);
            } else {
                if (PyErr_Occurred()) goto done;
                text = PyObject_CallOneArg(text_value, value);
                if (text == NULL) goto done;
                if (!ends_with_id(prefix)) {
                    if (PyDict_GET_SIZE(texts) >= limit) PyDict_Clear(texts);
                    if (PyDict_SetItem(texts, value, text) < 0) {
                        Py_DECREF(text);
                        goto done;
                    }
                }
            }
            if (append_field(parts, prefix, text) < 0) goto done;
        } else if (PyLong_CheckExact(value) || PyFloat_CheckExact(value)) {
            if (append_field(parts, prefix, PyObject_Str(value)) < 0) goto done;
        } else {
            if (empty == NULL && (empty = PyUnicode_FromStringAndSize("", 0)) == NULL) goto done;
            int differs = PyObject_RichCompareBool(value, empty, Py_NE);
            if (differs < 0) goto done;
            if (differs && append_field(parts, prefix, PyObject_CallOneArg(text_value, value)) < 0)
                goto done;
        }
    }
    {
        PyObject *space = PyUnicode_FromStringAndSize(" ", 1);
        if (space == NULL) goto done;
        result = PyUnicode_Join(space, parts);
        Py_DECREF(space);
    }
done:
    Py_XDECREF(empty);
    Py_XDECREF(parts);
    Py_DECREF(values);
    Py_DECREF(prefixes);
    return result;
}

PyDoc_STRVAR(fields_text_doc,
"fields_text(prefixes, values, texts, limit, text_value) -> str\n\n"
"A text log line's fields, ``prefix + text`` joined by spaces (gtm/_logline.c says\n"
"which are written and how).");

static PyMethodDef logline_methods[] = {
    {"fields_text", (PyCFunction)(void (*)(void))fields_text, METH_FASTCALL, fields_text_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef logline_module = {
    PyModuleDef_HEAD_INIT, "gtm._logline",
    "A text log line's fields in C (gtm/logs.py).", -1, logline_methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__logline(void)
{
    return PyModule_Create(&logline_module);
}
