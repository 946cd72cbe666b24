/*
 * The lines of a Prometheus text exposition the zone agent reads, in C
 * (zone_agent/exposition.py, SampleReader._kept_python).
 *
 * Each scrape reads a worker's whole /metrics: a busy vLLM's is ~250 lines and 23 KB,
 * of which ~50 are read. The Python loop over every line (a substring test, a prefix
 * lookup, a compiled expression per kept line) was four fifths of a scrape's parsing,
 * and a zone of a thousand workers scraped four times a second spent a core on it.
 * This is the same loop, one call: the same line selection, the same grammar for the
 * lines kept (the module's expressions, written out), the same family rules. What a
 * value means (float or int, labels unescaped) stays Python's.
 *
 * kept(text, prefixes) -> list | tuple | None
 *
 *   list:  the kept samples in line order, each (name, block, token, line, several),
 *          as SampleReader._kept_python returns them;
 *   tuple: (line, reason) where the reader steps aside (the same line and reason);
 *   None:  a text outside what this form reads (not ASCII): the Python form reads it.
 *
 * Lines are split as str.splitlines splits an ASCII text (\n, \r, \r\n, \v, \f, \x1c,
 * \x1d, \x1e). tests/unit/zone_agent/test_exposition.py pins both forms together.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

typedef struct {
    const char *s;
    Py_ssize_t n;
} Span;

static int
is_line_break(char c)
{
    return c == '\n' || c == '\r' || c == '\v' || c == '\f' || c == '\x1c' || c == '\x1d'
        || c == '\x1e';
}

static int
is_alpha(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

static int
is_digit(char c)
{
    return c >= '0' && c <= '9';
}

static int
is_name_char(char c)
{
    return is_alpha(c) || is_digit(c) || c == '_' || c == ':';
}

static int
contains(const char *s, Py_ssize_t n, const char *needle, Py_ssize_t m)
{
    return memmem(s, (size_t)n, needle, (size_t)m) != NULL;
}

/* Whether the text holds a line break other than \n (then lines are split char by
 * char; else by memchr, the usual text's way). */
static int
other_breaks(const char *s, Py_ssize_t n)
{
    static const char others[] = {'\r', '\v', '\f', '\x1c', '\x1d', '\x1e'};
    for (size_t k = 0; k < sizeof(others); k++) {
        if (memchr(s, others[k], (size_t)n) != NULL) return 1;
    }
    return 0;
}

/* Whether s[0:n] starts with one of the prefixes. */
static int
starts_with_any(const Span *items, const Py_ssize_t *first, const Py_ssize_t *links,
                const char *s, Py_ssize_t n)
{
    if (n == 0) return 0;
    unsigned char c = (unsigned char)s[0];
    if (c >= 128) return 0;
    for (Py_ssize_t k = first[c]; k >= 0; k = links[k]) {
        if (items[k].n <= n && memcmp(items[k].s, s, (size_t)items[k].n) == 0) return 1;
    }
    return 0;
}

/* A label value: `"[^"\\]*(?:\\.[^"\\]*)*"` from s[i] (a quote); the index after it, or -1. */
static Py_ssize_t
label_value(const char *s, Py_ssize_t n, Py_ssize_t i)
{
    if (i >= n || s[i] != '"') return -1;
    i++;
    while (i < n) {
        char c = s[i];
        if (c == '"') return i + 1;
        if (c == '\\') {
            if (i + 1 >= n) return -1;
            i += 2;
        }
        else {
            i++;
        }
    }
    return -1;
}

/* A label name as the sample expression reads it (not starting "__"), then `=`: the
 * index of the `=`, or -1. */
static Py_ssize_t
label_name(const char *s, Py_ssize_t n, Py_ssize_t i)
{
    if (i >= n) return -1;
    if (is_alpha(s[i])) {
        i++;
    }
    else if (s[i] == '_') {
        if (i + 1 < n && (is_alpha(s[i + 1]) || is_digit(s[i + 1]))) {
            i += 2;
        }
        else {
            i++; /* the name "_" alone */
            return (i < n && s[i] == '=') ? i : -1;
        }
    }
    else {
        return -1;
    }
    while (i < n && (is_alpha(s[i]) || is_digit(s[i]) || s[i] == '_')) i++;
    return (i < n && s[i] == '=') ? i : -1;
}

/* A value: `[-+]?(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?|Inf|inf|NaN)` from
 * s[i]; the index after it, or -1. */
static Py_ssize_t
value_token(const char *s, Py_ssize_t n, Py_ssize_t i)
{
    if (i < n && (s[i] == '-' || s[i] == '+')) i++;
    if (i >= n) return -1;
    if (n - i >= 3 && (memcmp(s + i, "Inf", 3) == 0 || memcmp(s + i, "inf", 3) == 0
                       || memcmp(s + i, "NaN", 3) == 0)) {
        return i + 3;
    }
    if (is_digit(s[i])) {
        while (i < n && is_digit(s[i])) i++;
        if (i < n && s[i] == '.') i++;
        while (i < n && is_digit(s[i])) i++;
    }
    else if (s[i] == '.' && i + 1 < n && is_digit(s[i + 1])) {
        i++;
        while (i < n && is_digit(s[i])) i++;
    }
    else {
        return -1;
    }
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        Py_ssize_t j = i + 1;
        if (j < n && (s[j] == '-' || s[j] == '+')) j++;
        if (j < n && is_digit(s[j])) {
            while (j < n && is_digit(s[j])) j++;
            i = j;
        }
        /* else: the exponent is not there; what follows must still fit (it will not) */
    }
    return i;
}

/* A sample line of the usual shape (the module's _SAMPLE, matched whole). On success
 * fills the name's end, the block (start, end; start -1: no braces) and the token. */
static int
sample(const char *s, Py_ssize_t n, Py_ssize_t *name_end, Py_ssize_t *block_start,
       Py_ssize_t *block_end, Py_ssize_t *tok_start, Py_ssize_t *tok_end)
{
    Py_ssize_t i = 0;
    if (n == 0 || !(is_alpha(s[0]) || s[0] == '_' || s[0] == ':')) return 0;
    i = 1;
    while (i < n && is_name_char(s[i])) i++;
    *name_end = i;
    *block_start = -1;
    if (i < n && s[i] == '{') {
        i++;
        *block_start = i;
        if (i < n && s[i] != '}') {
            for (;;) {
                Py_ssize_t eq = label_name(s, n, i);
                if (eq < 0) return 0;
                i = label_value(s, n, eq + 1);
                if (i < 0) return 0;
                if (i < n && s[i] == ',') {
                    i++;
                    if (i < n && s[i] == '}') break;
                    continue;
                }
                break;
            }
        }
        if (i >= n || s[i] != '}') return 0;
        *block_end = i;
        i++;
    }
    if (i >= n || s[i] != ' ') return 0;
    i++;
    *tok_start = i;
    i = value_token(s, n, i);
    if (i < 0) return 0;
    *tok_end = i;
    if (i < n) {
        /* (?: -?[0-9]{1,18})? then the end */
        if (s[i] != ' ') return 0;
        i++;
        if (i < n && s[i] == '-') i++;
        Py_ssize_t digits = 0;
        while (i < n && is_digit(s[i])) {
            i++;
            digits++;
        }
        if (digits < 1 || digits > 18 || i != n) return 0;
    }
    return 1;
}

static const char *const TYPES[] = {"counter", "gauge", "histogram", "summary", "untyped",
                                    "unknown", "info", "stateset", "gaugehistogram"};

/* The module's _COMMENT, matched at the line's start: 1 and the verb (0 HELP, 1 TYPE),
 * the name and the declared type (-1: none); 0 when it does not match. */
static int
comment(const char *s, Py_ssize_t n, int *verb, Py_ssize_t *name_start, Py_ssize_t *name_end,
        int *declared)
{
    if (n < 7 || s[0] != '#' || s[1] != ' ' || s[6] != ' ') return 0;
    if (memcmp(s + 2, "HELP", 4) == 0) *verb = 0;
    else if (memcmp(s + 2, "TYPE", 4) == 0) *verb = 1;
    else return 0;
    Py_ssize_t i = 7;
    if (i >= n || !(is_alpha(s[i]) || s[i] == '_' || s[i] == ':')) return 0;
    *name_start = i;
    i++;
    while (i < n && is_name_char(s[i])) i++;
    *name_end = i;
    *declared = -1;
    if (i == n) return 1;
    if (s[i] != ' ') return 0;
    i++;
    for (int k = 0; k < (int)(sizeof(TYPES) / sizeof(TYPES[0])); k++) {
        size_t m = strlen(TYPES[k]);
        if ((size_t)(n - i) == m && memcmp(s + i, TYPES[k], m) == 0) {
            *declared = k;
            break;
        }
    }
    return 1;
}

#define T_COUNTER 0
#define T_HISTOGRAM 2
#define T_SUMMARY 3

/* Whether `name` is one of the samples the family owns (the module's `owned`). */
static int
owned(const char *fam, Py_ssize_t fn, int has_family, int kind, const char *name, Py_ssize_t nn)
{
    if (!has_family) return 0; /* ("",): no sample is named "" */
    if (nn == fn && memcmp(name, fam, (size_t)fn) == 0) {
        /* The name itself: owned unless the family is a histogram (its samples are
         * _count, _sum and _bucket only). */
        return kind != T_HISTOGRAM;
    }
    if (kind != T_HISTOGRAM && kind != T_SUMMARY) return 0;
    if (nn <= fn || memcmp(name, fam, (size_t)fn) != 0) return 0;
    const char *rest = name + fn;
    Py_ssize_t rn = nn - fn;
    if (rn == 6 && memcmp(rest, "_count", 6) == 0) return 1;
    if (rn == 4 && memcmp(rest, "_sum", 4) == 0) return 1;
    if (kind == T_HISTOGRAM && rn == 7 && memcmp(rest, "_bucket", 7) == 0) return 1;
    return 0;
}

/* A counter family ends: its samples (from `start`) gain "_total" unless the declared
 * name has it. */
static int
end_counter(PyObject *kept, const char *fam, Py_ssize_t fn, Py_ssize_t start)
{
    if (fn >= 6 && memcmp(fam + fn - 6, "_total", 6) == 0) return 0;
    Py_ssize_t size = PyList_GET_SIZE(kept);
    for (Py_ssize_t k = start; k < size; k++) {
        PyObject *item = PyList_GET_ITEM(kept, k);
        PyObject *name = PyTuple_GET_ITEM(item, 0);
        PyObject *renamed = PyUnicode_FromFormat("%U_total", name);
        if (renamed == NULL) return -1;
        PyObject *copy = PyTuple_Pack(5, renamed, PyTuple_GET_ITEM(item, 1),
                                      PyTuple_GET_ITEM(item, 2), PyTuple_GET_ITEM(item, 3),
                                      PyTuple_GET_ITEM(item, 4));
        Py_DECREF(renamed);
        if (copy == NULL) return -1;
        PyList_SET_ITEM(kept, k, copy); /* steals copy, drops the old item */
        Py_DECREF(item);
    }
    return 0;
}

/* The family the loop is in (the module's family, kind and start; `has` 0: none). */
typedef struct {
    const char *name;
    Py_ssize_t n;
    int has;
    int kind; /* an index in TYPES; -1: untyped */
    Py_ssize_t start;
} Family;

/* The family ends (a counter's samples renamed) and `name` begins, untyped, its samples
 * from `start` (NULL: no family, a sample on its own). */
static int
next_family(PyObject *kept, Family *f, const char *name, Py_ssize_t n, Py_ssize_t start)
{
    if (f->kind == T_COUNTER && end_counter(kept, f->name, f->n, f->start) < 0) return -1;
    f->name = name != NULL ? name : "";
    f->n = name != NULL ? n : 0;
    f->has = name != NULL;
    f->kind = -1;
    f->start = start;
    return 0;
}

static PyObject *
step_aside(const char *line, Py_ssize_t n, const char *reason)
{
    PyObject *text = PyUnicode_FromStringAndSize(line, n);
    if (text == NULL) return NULL;
    PyObject *why = PyUnicode_FromString(reason);
    if (why == NULL) {
        Py_DECREF(text);
        return NULL;
    }
    PyObject *out = PyTuple_Pack(2, text, why);
    Py_DECREF(text);
    Py_DECREF(why);
    return out;
}

/* The labels of a block of several, escapes not undone (dict(_LABEL_PAIR.findall)), and
 * whether a name came twice. NULL on error. */
static PyObject *
several_labels(const char *s, Py_ssize_t start, Py_ssize_t end, Py_ssize_t *pairs)
{
    PyObject *labels = PyDict_New();
    if (labels == NULL) return NULL;
    Py_ssize_t i = start;
    *pairs = 0;
    while (i < end) {
        Py_ssize_t eq = label_name(s, end, i);
        Py_ssize_t after = eq < 0 ? -1 : label_value(s, end, eq + 1);
        if (after < 0) break; /* (the block was matched: not reached) */
        PyObject *k = PyUnicode_FromStringAndSize(s + i, eq - i);
        PyObject *v = PyUnicode_FromStringAndSize(s + eq + 2, after - 1 - (eq + 2));
        if (k == NULL || v == NULL || PyDict_SetItem(labels, k, v) < 0) {
            Py_XDECREF(k);
            Py_XDECREF(v);
            Py_DECREF(labels);
            return NULL;
        }
        Py_DECREF(k);
        Py_DECREF(v);
        (*pairs)++;
        i = after;
        if (i < end && s[i] == ',') i++;
    }
    return labels;
}

static Py_ssize_t
count_label_starts(const char *s, Py_ssize_t start, Py_ssize_t end)
{
    Py_ssize_t count = 0;
    for (Py_ssize_t i = start; i + 1 < end; i++) {
        if (s[i] == '=' && s[i + 1] == '"') count++;
    }
    return count;
}

static PyObject *
kept(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyUnicode_Check(args[0]) || !PyTuple_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "kept(text: str, prefixes: tuple[str, ...])");
        return NULL;
    }
    PyObject *text = args[0];
    PyObject *prefix_tuple = args[1];
    if (!PyUnicode_IS_ASCII(text)) Py_RETURN_NONE;
    const char *all = (const char *)PyUnicode_DATA(text);
    Py_ssize_t total = PyUnicode_GET_LENGTH(text);

    Py_ssize_t np = PyTuple_GET_SIZE(prefix_tuple);
    Span *items = PyMem_Malloc(sizeof(Span) * (size_t)(np ? np : 1));
    Py_ssize_t *links = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)(np ? np : 1));
    Py_ssize_t first[128];
    PyObject *out = NULL;
    if (items == NULL || links == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (int c = 0; c < 128; c++) first[c] = -1;
    for (Py_ssize_t k = np - 1; k >= 0; k--) {
        PyObject *p = PyTuple_GET_ITEM(prefix_tuple, k);
        if (!PyUnicode_Check(p) || !PyUnicode_IS_ASCII(p) || PyUnicode_GET_LENGTH(p) == 0) {
            PyErr_SetString(PyExc_ValueError, "prefixes must be non-empty ASCII strings");
            goto done;
        }
        items[k].s = (const char *)PyUnicode_DATA(p);
        items[k].n = PyUnicode_GET_LENGTH(p);
        unsigned char c = (unsigned char)items[k].s[0];
        links[k] = first[c];
        first[c] = k;
    }

    PyObject *result = PyList_New(0);
    if (result == NULL) goto done;
    Family f = {"", 0, 0, -1, 0};

    int slow_split = other_breaks(all, total);
    Py_ssize_t pos = 0;
    while (pos < total) {
        Py_ssize_t end;
        if (slow_split) {
            end = pos;
            while (end < total && !is_line_break(all[end])) end++;
        }
        else {
            const char *nl = memchr(all + pos, '\n', (size_t)(total - pos));
            end = nl == NULL ? total : nl - all;
        }
        const char *line = all + pos;
        Py_ssize_t n = end - pos;
        /* the next line: after \r\n as one break */
        pos = end + 1;
        if (end < total && all[end] == '\r' && end + 1 < total && all[end + 1] == '\n') pos++;

        if (n > 0 && line[0] != '#') {
            /* (The prefix first: most lines fail it at their first characters.) */
            if (!starts_with_any(items, first, links, line, n)) continue;
            if (contains(line, n, "_bucket", 7) || contains(line, n, "_created", 8)) continue;
            Py_ssize_t name_end, b0, b1 = 0, t0 = 0, t1 = 0;
            if (!sample(line, n, &name_end, &b0, &b1, &t0, &t1)) {
                out = step_aside(line, n, "sample line not of the usual shape");
                Py_DECREF(result);
                goto done;
            }
            PyObject *several = Py_None;
            Py_INCREF(Py_None);
            if (b0 >= 0 && b1 > b0 && count_label_starts(line, b0, b1) > 1) {
                Py_ssize_t pairs = 0;
                Py_DECREF(Py_None);
                several = several_labels(line, b0, b1, &pairs);
                if (several == NULL) {
                    Py_DECREF(result);
                    goto done;
                }
                if (PyDict_GET_SIZE(several) != pairs) {
                    Py_DECREF(several);
                    Py_DECREF(result);
                    out = step_aside(line, n, "a label name twice");
                    goto done;
                }
            }
            if (!owned(f.name, f.n, f.has, f.kind, line, name_end)
                && next_family(result, &f, NULL, 0, PyList_GET_SIZE(result) + 1) < 0) {
                /* (the family ended; the sample is one on its own) */
                Py_DECREF(several);
                Py_DECREF(result);
                goto done;
            }
            PyObject *name = PyUnicode_FromStringAndSize(line, name_end);
            PyObject *block;
            if (b0 < 0) {
                block = Py_None;
                Py_INCREF(Py_None);
            }
            else {
                block = PyUnicode_FromStringAndSize(line + b0, b1 - b0);
            }
            PyObject *token = PyUnicode_FromStringAndSize(line + t0, t1 - t0);
            PyObject *whole = PyUnicode_FromStringAndSize(line, n);
            PyObject *item = NULL;
            if (name && block && token && whole) {
                item = PyTuple_Pack(5, name, block, token, whole, several);
            }
            Py_XDECREF(name);
            Py_XDECREF(block);
            Py_XDECREF(token);
            Py_XDECREF(whole);
            Py_DECREF(several);
            if (item == NULL || PyList_Append(result, item) < 0) {
                Py_XDECREF(item);
                Py_DECREF(result);
                goto done;
            }
            Py_DECREF(item);
            continue;
        }
        if (n == 0) continue; /* an empty line: not a comment, no prefix */
        /* A comment. */
        int verb, declared;
        Py_ssize_t c0, c1;
        if (!comment(line, n, &verb, &c0, &c1, &declared)) {
            /* Kept as `relevant` keeps comments: by the third space-separated word. */
            Py_ssize_t spaces = 0, w0 = -1, w1 = n;
            for (Py_ssize_t i = 0; i < n; i++) {
                if (line[i] == ' ') {
                    spaces++;
                    if (spaces == 2) w0 = i + 1;
                    else if (spaces == 3) {
                        w1 = i;
                        break;
                    }
                }
            }
            if (w0 >= 0 && starts_with_any(items, first, links, line + w0, w1 - w0)) {
                out = step_aside(line, n, "comment not of the usual shape");
                Py_DECREF(result);
                goto done;
            }
            continue;
        }
        const char *name = line + c0;
        Py_ssize_t nn = c1 - c0;
        if (!starts_with_any(items, first, links, name, nn)) continue;
        int same = f.has && nn == f.n && memcmp(name, f.name, (size_t)f.n) == 0;
        if (verb == 1 && declared < 0) {
            out = step_aside(line, n, "# TYPE without a type");
            Py_DECREF(result);
            goto done;
        }
        if (!same && next_family(result, &f, name, nn, PyList_GET_SIZE(result)) < 0) {
            Py_DECREF(result);
            goto done;
        }
        if (verb == 1) f.kind = declared; /* TYPE; a HELP leaves the kind as it was */
    }
    if (f.kind == T_COUNTER && end_counter(result, f.name, f.n, f.start) < 0) {
        Py_DECREF(result);
        goto done;
    }
    out = result;
done:
    PyMem_Free(items);
    PyMem_Free(links);
    return out;
}

static PyMethodDef methods[] = {
    {"kept", (PyCFunction)(void (*)(void))kept, METH_FASTCALL,
     "The kept sample lines of an exposition, (line, reason) to step aside, or None."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "zone_agent._exposition",
    "The exposition reader's line loop, compiled (zone_agent/exposition.py).", -1, methods,
};

PyMODINIT_FUNC
PyInit__exposition(void)
{
    return PyModule_Create(&module);
}
