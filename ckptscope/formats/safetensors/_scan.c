/* A compiled scan of the common safetensors header: the same TensorMeta objects as the Python
 * parser (reader.py: json.loads + _parse_entries), in a tenth of the time (issue 15: a 100,000-tensor
 * header spent most of ckptscope's time in json.loads and the per-entry loop).
 *
 * It accepts a strict subset of what the Python parser accepts and returns None for anything else:
 * escapes or control bytes in a string, a number that is not a plain non-negative integer below 2**53,
 * an entry with keys other than dtype/shape/data_offsets, a duplicate key, a __metadata__ that is not
 * an object of strings, a dtype code it was not given, sizes that disagree, trailing bytes other than
 * whitespace and NUL padding. The Python parser then reads the header and, where it is bad, names the
 * problem. So nothing here ever decides that a header is bad, and what it accepts it reads exactly as
 * the Python parser would (tests/test_compiled_scan.py compares the two on every header shape we know
 * and on mutated ones). Built when a C compiler is there (setup.py: optional); ckptscope works without.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define LIMIT (((uint64_t)1) << 53)
#define MAX_CODES 64
#define MAX_RANK 64

/* status of every helper: OK, NOT_SIMPLE (let the Python parser decide) or FAILED (exception set) */
enum { OK = 0, NOT_SIMPLE = 1, FAILED = -1 };

typedef struct {
    char code[16];
    Py_ssize_t code_len;
    PyObject *name; /* canonical dtype name */
    uint64_t bits;
} Code;

static Code codes[MAX_CODES];
static int n_codes = -1; /* -1: configure() not called */
static PyTypeObject *chunk_type, *meta_type;
static PyObject *raw_encoding, *zeros[9];
/* the slots of Chunk and TensorMeta, set through their member descriptors (as raw_tensor does) */
static PyObject *c_offsets, *c_shape, *c_file, *c_byte_offset, *c_byte_length, *c_encoding, *c_strides,
    *c_big_endian, *m_name, *m_dtype, *m_shape, *m_chunks, *m_attrs;

typedef struct {
    const unsigned char *p, *end;
} Cursor;

static inline void skip_ws(Cursor *c) {
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r'))
        c->p++;
}

static inline int expect(Cursor *c, unsigned char ch) {
    skip_ws(c);
    if (c->p < c->end && *c->p == ch) {
        c->p++;
        return 1;
    }
    return 0;
}

/* A JSON string without escapes or control bytes: its raw bytes in [*start, *start + *len). */
static int raw_string(Cursor *c, const unsigned char **start, Py_ssize_t *len) {
    skip_ws(c);
    if (c->p >= c->end || *c->p != '"')
        return NOT_SIMPLE;
    const unsigned char *s = ++c->p;
    while (c->p < c->end && *c->p != '"') {
        if (*c->p == '\\' || *c->p < 0x20)
            return NOT_SIMPLE;
        c->p++;
    }
    if (c->p >= c->end)
        return NOT_SIMPLE;
    *start = s;
    *len = c->p - s;
    c->p++;
    return OK;
}

/* The same string as a str; invalid UTF-8 is NOT_SIMPLE (the Python parser reports it). */
static int string_object(Cursor *c, PyObject **out) {
    const unsigned char *s;
    Py_ssize_t n;
    int st = raw_string(c, &s, &n);
    if (st != OK)
        return st;
    *out = PyUnicode_DecodeUTF8((const char *)s, n, NULL);
    if (*out == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError))
            return FAILED;
        PyErr_Clear();
        return NOT_SIMPLE;
    }
    return OK;
}

/* A non-negative JSON integer below 2**53 (no sign, fraction or exponent; no leading zero). */
static int uint_value(Cursor *c, uint64_t *out) {
    skip_ws(c);
    if (c->p >= c->end || *c->p < '0' || *c->p > '9')
        return NOT_SIMPLE;
    uint64_t v = 0;
    if (*c->p == '0') {
        c->p++;
    } else {
        while (c->p < c->end && *c->p >= '0' && *c->p <= '9') {
            v = v * 10 + (uint64_t)(*c->p - '0');
            if (v >= LIMIT)
                return NOT_SIMPLE;
            c->p++;
        }
    }
    if (c->p < c->end && ((*c->p >= '0' && *c->p <= '9') || *c->p == '.' || *c->p == 'e' || *c->p == 'E'))
        return NOT_SIMPLE;
    *out = v;
    return OK;
}

static inline int key_is(const unsigned char *s, Py_ssize_t n, const char *word) {
    return (size_t)n == strlen(word) && memcmp(s, word, (size_t)n) == 0;
}

static int set_slot(PyObject *descr, PyObject *obj, PyObject *value) {
    return Py_TYPE(descr)->tp_descr_set(descr, obj, value);
}

typedef struct {
    const Code *dtype;
    uint64_t shape[MAX_RANK];
    Py_ssize_t rank;
    uint64_t begin, end;
} Entry;

/* {"dtype": "BF16", "shape": [..], "data_offsets": [b, e]} in any key order, nothing else. */
static int entry_value(Cursor *c, Entry *e) {
    int seen = 0, st;
    if (!expect(c, '{'))
        return NOT_SIMPLE;
    for (;;) {
        const unsigned char *k;
        Py_ssize_t kn;
        if ((st = raw_string(c, &k, &kn)) != OK)
            return st;
        if (!expect(c, ':'))
            return NOT_SIMPLE;
        if (key_is(k, kn, "dtype")) {
            const unsigned char *s;
            Py_ssize_t n;
            if (seen & 1 || (st = raw_string(c, &s, &n)) != OK)
                return NOT_SIMPLE;
            e->dtype = NULL;
            for (int i = 0; i < n_codes; i++)
                if (codes[i].code_len == n && memcmp(codes[i].code, s, (size_t)n) == 0)
                    e->dtype = &codes[i];
            if (e->dtype == NULL)
                return NOT_SIMPLE;
            seen |= 1;
        } else if (key_is(k, kn, "shape")) {
            if (seen & 2 || !expect(c, '['))
                return NOT_SIMPLE;
            e->rank = 0;
            if (!expect(c, ']')) {
                for (;;) {
                    if (e->rank == MAX_RANK || uint_value(c, &e->shape[e->rank]) != OK)
                        return NOT_SIMPLE;
                    e->rank++;
                    if (expect(c, ']'))
                        break;
                    if (!expect(c, ','))
                        return NOT_SIMPLE;
                }
            }
            seen |= 2;
        } else if (key_is(k, kn, "data_offsets")) {
            if (seen & 4 || !expect(c, '[') || uint_value(c, &e->begin) != OK || !expect(c, ',') ||
                uint_value(c, &e->end) != OK || !expect(c, ']'))
                return NOT_SIMPLE;
            seen |= 4;
        } else {
            return NOT_SIMPLE;
        }
        if (expect(c, '}'))
            break;
        if (!expect(c, ','))
            return NOT_SIMPLE;
    }
    return seen == 7 ? OK : NOT_SIMPLE;
}

/* {"key": "value", ...} into a new dict. */
static int metadata_value(Cursor *c, PyObject **out) {
    int st;
    if (!expect(c, '{'))
        return NOT_SIMPLE;
    PyObject *d = PyDict_New();
    if (d == NULL)
        return FAILED;
    if (!expect(c, '}')) {
        for (;;) {
            PyObject *k = NULL, *v = NULL;
            if ((st = string_object(c, &k)) != OK)
                goto bad;
            if (!expect(c, ':')) {
                st = NOT_SIMPLE;
                goto bad_k;
            }
            if ((st = string_object(c, &v)) != OK)
                goto bad_k;
            st = PyDict_Contains(d, k);
            if (st != 0) { /* a duplicate key (or an error) */
                st = st < 0 ? FAILED : NOT_SIMPLE;
                Py_DECREF(v);
                goto bad_k;
            }
            st = PyDict_SetItem(d, k, v);
            Py_DECREF(k);
            Py_DECREF(v);
            if (st < 0) {
                st = FAILED;
                goto bad;
            }
            if (expect(c, '}'))
                break;
            if (!expect(c, ',')) {
                st = NOT_SIMPLE;
                goto bad;
            }
            continue;
        bad_k:
            Py_DECREF(k);
            goto bad;
        }
    }
    *out = d;
    return OK;
bad:
    Py_DECREF(d);
    return st;
}

static PyObject *new_uint(uint64_t v) { return PyLong_FromUnsignedLongLong((unsigned long long)v); }

/* The TensorMeta of one entry, as raw_tensor builds it. */
static PyObject *make_tensor(PyObject *name, const Entry *e, PyObject *file, uint64_t data_start) {
    PyObject *shape = PyTuple_New(e->rank), *offsets = NULL, *chunk = NULL, *meta = NULL, *tmp;
    if (shape == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < e->rank; i++) {
        if ((tmp = new_uint(e->shape[i])) == NULL)
            goto fail;
        PyTuple_SET_ITEM(shape, i, tmp);
    }
    if (e->rank < 9) {
        offsets = zeros[e->rank];
        Py_INCREF(offsets);
    } else {
        if ((offsets = PyTuple_New(e->rank)) == NULL)
            goto fail;
        for (Py_ssize_t i = 0; i < e->rank; i++) {
            if ((tmp = PyLong_FromLong(0)) == NULL)
                goto fail;
            PyTuple_SET_ITEM(offsets, i, tmp);
        }
    }
    if ((chunk = chunk_type->tp_alloc(chunk_type, 0)) == NULL)
        goto fail;
    PyObject *begin = new_uint(data_start + e->begin), *length = new_uint(e->end - e->begin);
    int st = begin == NULL || length == NULL || set_slot(c_offsets, chunk, offsets) || set_slot(c_shape, chunk, shape) ||
             set_slot(c_file, chunk, file) || set_slot(c_byte_offset, chunk, begin) ||
             set_slot(c_byte_length, chunk, length) || set_slot(c_encoding, chunk, raw_encoding) ||
             set_slot(c_strides, chunk, Py_None) || set_slot(c_big_endian, chunk, Py_False);
    Py_XDECREF(begin);
    Py_XDECREF(length);
    if (st)
        goto fail;
    if ((meta = meta_type->tp_alloc(meta_type, 0)) == NULL)
        goto fail;
    PyObject *chunks = PyTuple_Pack(1, chunk), *attrs = PyTuple_New(0);
    st = chunks == NULL || attrs == NULL || set_slot(m_name, meta, name) || set_slot(m_dtype, meta, e->dtype->name) ||
         set_slot(m_shape, meta, shape) || set_slot(m_chunks, meta, chunks) || set_slot(m_attrs, meta, attrs);
    Py_XDECREF(chunks);
    Py_XDECREF(attrs);
    if (st)
        goto fail;
    Py_DECREF(shape);
    Py_DECREF(offsets);
    Py_DECREF(chunk);
    return meta;
fail:
    Py_XDECREF(shape);
    Py_XDECREF(offsets);
    Py_XDECREF(chunk);
    Py_XDECREF(meta);
    return NULL;
}

/* scan(raw, data_start, file) -> (tensors, metadata or None, in_order, covered, last_end) or None */
static PyObject *scan(PyObject *self, PyObject *args) {
    Py_buffer raw;
    unsigned long long data_start;
    PyObject *file;
    if (!PyArg_ParseTuple(args, "y*KU", &raw, &data_start, &file))
        return NULL;
    if (n_codes < 0) {
        PyBuffer_Release(&raw);
        PyErr_SetString(PyExc_RuntimeError, "_scan.configure() was not called");
        return NULL;
    }
    Cursor c = {(const unsigned char *)raw.buf, (const unsigned char *)raw.buf + raw.len};
    PyObject *tensors = PyDict_New(), *metadata = NULL, *result = NULL;
    uint64_t previous_end = 0, covered = 0;
    int in_order = 1, st = OK;
    if (tensors == NULL)
        goto done;
    if (data_start >= LIMIT || !expect(&c, '{')) {
        st = NOT_SIMPLE;
        goto done;
    }
    if (!expect(&c, '}')) {
        for (;;) {
            const unsigned char *k;
            Py_ssize_t kn;
            Cursor at = c;
            if ((st = raw_string(&c, &k, &kn)) != OK)
                goto done;
            if (!expect(&c, ':')) {
                st = NOT_SIMPLE;
                goto done;
            }
            if (key_is(k, kn, "__metadata__")) {
                if (metadata != NULL) {
                    st = NOT_SIMPLE;
                    goto done;
                }
                if ((st = metadata_value(&c, &metadata)) != OK)
                    goto done;
            } else {
                PyObject *name;
                Entry e;
                Cursor again = at;
                uint64_t numel = 1;
                if ((st = string_object(&again, &name)) != OK)
                    goto done;
                if ((st = entry_value(&c, &e)) != OK) {
                    Py_DECREF(name);
                    goto done;
                }
                for (Py_ssize_t i = 0; i < e.rank; i++) {
                    if (e.shape[i] && numel > LIMIT / e.shape[i]) {
                        st = NOT_SIMPLE;
                        break;
                    }
                    numel *= e.shape[i];
                }
                if (st == OK && (e.end < e.begin || e.end - e.begin != (numel * e.dtype->bits + 7) / 8))
                    st = NOT_SIMPLE;
                if (st == OK) {
                    st = PyDict_Contains(tensors, name);
                    st = st < 0 ? FAILED : st ? NOT_SIMPLE : OK;
                }
                if (st == OK) {
                    PyObject *meta = make_tensor(name, &e, file, data_start);
                    st = meta == NULL || PyDict_SetItem(tensors, name, meta) < 0 ? FAILED : OK;
                    Py_XDECREF(meta);
                }
                Py_DECREF(name);
                if (st != OK)
                    goto done;
                if (e.begin < previous_end)
                    in_order = 0;
                previous_end = e.end;
                covered += e.end - e.begin;
                if (covered >= LIMIT) {
                    st = NOT_SIMPLE;
                    goto done;
                }
            }
            if (expect(&c, '}'))
                break;
            if (!expect(&c, ',')) {
                st = NOT_SIMPLE;
                goto done;
            }
        }
    }
    skip_ws(&c); /* then only the padding the Python parser strips (spaces, NULs) */
    while (c.p < c.end && (*c.p == ' ' || *c.p == '\0'))
        c.p++;
    if (c.p != c.end)
        st = NOT_SIMPLE;
done:
    PyBuffer_Release(&raw);
    if (st == OK)
        result = Py_BuildValue("(NOOKK)", tensors, metadata ? metadata : Py_None, in_order ? Py_True : Py_False,
                               (unsigned long long)covered, (unsigned long long)previous_end);
    else
        Py_XDECREF(tensors);
    Py_XDECREF(metadata);
    if (st == NOT_SIMPLE)
        Py_RETURN_NONE;
    return result;
}

static PyObject *descr(PyObject *type, const char *name) {
    PyObject *d = PyObject_GetAttrString(type, name);
    if (d != NULL && Py_TYPE(d)->tp_descr_set == NULL) {
        PyErr_Format(PyExc_TypeError, "%s is not a slot", name);
        Py_CLEAR(d);
    }
    return d;
}

/* configure(Chunk, TensorMeta, Encoding.RAW, {code: (dtype name, bits)}) */
static PyObject *configure(PyObject *self, PyObject *args) {
    PyObject *chunk, *meta, *encoding, *table, *key, *value;
    Py_ssize_t pos = 0;
    if (!PyArg_ParseTuple(args, "O!O!OO!", &PyType_Type, &chunk, &PyType_Type, &meta, &encoding, &PyDict_Type, &table))
        return NULL;
    if (PyDict_Size(table) > MAX_CODES) {
        PyErr_SetString(PyExc_ValueError, "too many dtype codes");
        return NULL;
    }
    n_codes = -1;
    int n = 0;
    while (PyDict_Next(table, &pos, &key, &value)) {
        Py_ssize_t len;
        const char *s = PyUnicode_AsUTF8AndSize(key, &len);
        PyObject *name;
        unsigned long long bits;
        if (s == NULL || !PyArg_ParseTuple(value, "UK", &name, &bits))
            return NULL;
        if (len >= (Py_ssize_t)sizeof(codes[n].code) || bits == 0 || bits > 64) {
            PyErr_Format(PyExc_ValueError, "dtype code %R", key);
            return NULL;
        }
        memcpy(codes[n].code, s, (size_t)len);
        codes[n].code_len = len;
        Py_INCREF(name);
        codes[n].name = name;
        codes[n].bits = bits;
        n++;
    }
    for (int r = 0; r < 9; r++) {
        if (zeros[r] == NULL) {
            if ((zeros[r] = PyTuple_New(r)) == NULL)
                return NULL;
            for (int i = 0; i < r; i++)
                PyTuple_SET_ITEM(zeros[r], i, PyLong_FromLong(0));
        }
    }
    Py_INCREF(chunk);
    Py_INCREF(meta);
    Py_INCREF(encoding);
    chunk_type = (PyTypeObject *)chunk;
    meta_type = (PyTypeObject *)meta;
    raw_encoding = encoding;
    if (!(c_offsets = descr(chunk, "offsets")) || !(c_shape = descr(chunk, "shape")) || !(c_file = descr(chunk, "file")) ||
        !(c_byte_offset = descr(chunk, "byte_offset")) || !(c_byte_length = descr(chunk, "byte_length")) ||
        !(c_encoding = descr(chunk, "encoding")) || !(c_strides = descr(chunk, "strides")) ||
        !(c_big_endian = descr(chunk, "big_endian")) || !(m_name = descr(meta, "name")) ||
        !(m_dtype = descr(meta, "dtype")) || !(m_shape = descr(meta, "shape")) || !(m_chunks = descr(meta, "chunks")) ||
        !(m_attrs = descr(meta, "attrs")))
        return NULL;
    n_codes = n;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"configure", configure, METH_VARARGS, "configure(Chunk, TensorMeta, Encoding.RAW, {code: (name, bits)})"},
    {"scan", scan, METH_VARARGS, "scan(raw, data_start, file) -> (tensors, metadata, in_order, covered, last_end) or None"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_scan", "Compiled scan of safetensors headers.", -1, methods};

PyMODINIT_FUNC PyInit__scan(void) { return PyModule_Create(&module); }
