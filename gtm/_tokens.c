/*
 * gtm.tokens' pre-tokenizer on ASCII text, compiled: one pass over the characters, no
 * Python object per piece (gtm/tokens.py says why every prompt is counted, and holds
 * the rule; this file is its fast form, pinned to the regex by the hypothesis test in
 * tests/unit/gtm/test_tokens_kernel.py).
 *
 * The pieces are those of gtm.tokens._ASCII_PIECE, whose alternatives are tried in
 * order at each position (the first that matches wins, as ``re`` does):
 *
 *   '(?:[sdmt]|ll|ve|re)        a lower-case contraction
 *    ?[A-Za-z]+                 a letter run, with one leading space
 *    ?[0-9]{1,3}                up to 3 digits, with one leading space
 *    ?[^SPACE A-Za-z0-9_]+      a punctuation run (``'`` included), one leading space
 *   [SPACE]+(?![^SPACE])        whitespace up to the end or to the last one before a
 *                               non-space (that one may start the next piece)
 *   [SPACE]+                    one whitespace character before a non-space
 *
 * with SPACE = \t \n \v \f \r \x1c-\x1f and space, what ``\s`` is on ASCII. ``_``
 * starts no alternative: it is in no piece (the regex skips it, so does this scan).
 * A piece of n characters costs ceil(n / 6) tokens (CHARS_PER_PIECE_TOKEN), each chunk
 * of up to 6 characters one token whose id is its CRC-32 modulo 128000 (ORDINARY_VOCAB;
 * the table is zlib's polynomial, so ids equal zlib.crc32's).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#define CHARS_PER_PIECE_TOKEN 6
#define ORDINARY_VOCAB 128000u

enum { SKIP = 0, SPACE = 1, LETTER = 2, DIGIT = 3, PUNCT = 4 };

static unsigned char char_class[128];
static uint32_t crc_table[256];

static void init_tables(void)
{
    for (int c = 0; c < 128; c++) {
        unsigned char kind = PUNCT;
        if (c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r' || c == ' '
            || (c >= 0x1c && c <= 0x1f))
            kind = SPACE;
        else if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z'))
            kind = LETTER;
        else if (c >= '0' && c <= '9')
            kind = DIGIT;
        else if (c == '_')
            kind = SKIP;
        char_class[c] = kind;
    }
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t crc = n;
        for (int k = 0; k < 8; k++)
            crc = (crc & 1u) ? (crc >> 1) ^ 0xEDB88320u : crc >> 1;
        crc_table[n] = crc;
    }
}

/* The end of the run of ``kind`` characters starting at ``i`` (at most ``limit`` long). */
static inline Py_ssize_t run_end(const Py_UCS1 *s, Py_ssize_t i, Py_ssize_t n,
                                 unsigned char kind, Py_ssize_t limit)
{
    Py_ssize_t stop = (n - i > limit) ? i + limit : n;
    while (i < stop && char_class[s[i]] == kind)
        i++;
    return i;
}

/* The end of the letter, digit or punctuation piece whose first character of class
 * ``kind`` (after the leading space, if any) is at ``first``. */
static inline Py_ssize_t word_end(const Py_UCS1 *s, Py_ssize_t first, Py_ssize_t n,
                                  unsigned char kind)
{
    return run_end(s, first, n, kind, kind == DIGIT ? 3 : PY_SSIZE_T_MAX);
}

/* The end of the piece starting at ``i < n``, or -1 when no piece starts there (``_``). */
static inline Py_ssize_t piece_end(const Py_UCS1 *s, Py_ssize_t i, Py_ssize_t n)
{
    unsigned char kind = char_class[s[i]];
    if (kind == SKIP)
        return -1;
    if (kind == PUNCT && s[i] == '\'' && i + 1 < n) {
        Py_UCS1 next = s[i + 1];
        if (next == 's' || next == 'd' || next == 'm' || next == 't')
            return i + 2;
        if (i + 2 < n) {
            Py_UCS1 after = s[i + 2];
            if ((next == 'l' && after == 'l') || (next == 'v' && after == 'e')
                || (next == 'r' && after == 'e'))
                return i + 3;
        }
    }
    if (kind != SPACE)
        return word_end(s, i, n, kind);
    if (s[i] == ' ' && i + 1 < n) {
        unsigned char next = char_class[s[i + 1]];
        if (next != SPACE && next != SKIP)
            return word_end(s, i + 1, n, next);
    }
    Py_ssize_t end = run_end(s, i + 1, n, SPACE, PY_SSIZE_T_MAX);
    /* Before a non-space, the last whitespace character is left to the next piece. */
    return (end < n && end - i >= 2) ? end - 1 : end;
}

/* The ASCII characters of ``text``, or NULL with an exception set. */
static const Py_UCS1 *ascii_chars(PyObject *text, Py_ssize_t *length)
{
    if (!PyUnicode_Check(text)) {
        PyErr_Format(PyExc_TypeError, "expected str, got %.200s", Py_TYPE(text)->tp_name);
        return NULL;
    }
    if (!PyUnicode_IS_ASCII(text)) {
        PyErr_SetString(PyExc_ValueError, "the text is not ASCII");
        return NULL;
    }
    *length = PyUnicode_GET_LENGTH(text);
    return PyUnicode_1BYTE_DATA(text);
}

static inline uint32_t token_id(const Py_UCS1 *s, Py_ssize_t start, Py_ssize_t end)
{
    uint32_t crc = 0xFFFFFFFFu;
    for (Py_ssize_t k = start; k < end; k++)
        crc = crc_table[(crc ^ s[k]) & 0xFFu] ^ (crc >> 8);
    return (crc ^ 0xFFFFFFFFu) % ORDINARY_VOCAB;
}

/* The tokens of ``s[0:n]``; their ids written to ``ids`` too unless it is NULL. */
static Py_ssize_t scan(const Py_UCS1 *s, Py_ssize_t n, uint32_t *ids)
{
    Py_ssize_t tokens = 0;
    Py_ssize_t i = 0;
    while (i < n) {
        Py_ssize_t end = piece_end(s, i, n);
        if (end < 0) {
            i++;
            continue;
        }
        if (ids == NULL) {
            tokens += (end - i + CHARS_PER_PIECE_TOKEN - 1) / CHARS_PER_PIECE_TOKEN;
            i = end;
            continue;
        }
        for (; i < end; i += CHARS_PER_PIECE_TOKEN) {
            Py_ssize_t stop = i + CHARS_PER_PIECE_TOKEN;
            ids[tokens++] = token_id(s, i, stop < end ? stop : end);
        }
        i = end;
    }
    return tokens;
}

static PyObject *count_ascii(PyObject *module, PyObject *text)
{
    (void)module;
    Py_ssize_t n;
    const Py_UCS1 *s = ascii_chars(text, &n);
    if (s == NULL)
        return NULL;
    return PyLong_FromSsize_t(scan(s, n, NULL));
}

static PyObject *ascii_token_ids(PyObject *module, PyObject *text)
{
    (void)module;
    Py_ssize_t n;
    const Py_UCS1 *s = ascii_chars(text, &n);
    if (s == NULL)
        return NULL;
    /* Counted first, so the ids take the bytes they need and no more (a pass costs a
     * small part of the hashing that follows). */
    Py_ssize_t total = scan(s, n, NULL);
    PyObject *out = PyBytes_FromStringAndSize(NULL, total * (Py_ssize_t)sizeof(uint32_t));
    if (out == NULL)
        return NULL;
    scan(s, n, (uint32_t *)PyBytes_AS_STRING(out));
    return out;
}

static PyMethodDef methods[] = {
    {"count_ascii", count_ascii, METH_O,
     "count_ascii(text, /)\n--\n\n"
     "Tokens of an ASCII ``text`` (gtm.tokens.count_text_tokens); ValueError if it is not "
     "ASCII."},
    {"ascii_token_ids", ascii_token_ids, METH_O,
     "ascii_token_ids(text, /)\n--\n\n"
     "Token ids of an ASCII ``text`` (gtm.tokens.encode_text_ids) as native-order uint32 "
     "bytes, for array('I').frombytes; ValueError if it is not ASCII."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "gtm._tokens",
    .m_doc = "gtm.tokens' pre-tokenizer on ASCII text, compiled (gtm/_tokens.c says how).",
    .m_size = 0,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__tokens(void)
{
    init_tables();
    return PyModule_Create(&module_def);
}
