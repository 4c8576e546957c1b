/* Laying pieces out end to end (zephon.ops.pack.build_rows), compiled: each piece's tokens and
   places in their documents copied from its chunk, its dataset written over its tokens, the
   document starts marked, and the places of a piece that continues a cut document counted from
   0 again, in one pass over the pieces. In Python that was a slice, a list entry and a
   concatenation per piece per array, about 1.6 us a piece, a fifth of a lane's own work.

   The same values as the Python it stands in for (tests/test_packing_native.py compares them).
   Built against the stable ABI (Python 3.11 and later), and optional (setup.py). */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define CACHED 16 /* chunks whose arrays are held at once: a lane mixes a few datasets */

typedef struct {
    PyObject *docs;  /* a reference held until released */
    Py_buffer tokens, positions, offsets;
} Chunk;

typedef struct {
    Chunk chunks[CACHED];
    int count, next;
} Cache;

static int get_array(PyObject *docs, const char *name, Py_ssize_t itemsize, Py_buffer *view) {
    PyObject *array = PyObject_GetAttrString(docs, name);
    if (array == NULL) return -1;
    int failed = PyObject_GetBuffer(array, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT);
    Py_DECREF(array); /* the view holds the array */
    if (failed) return -1;
    /* a signed integer of that size, by its format's letter ('i' or 'l' for int32: Windows' long) */
    const char *f = view->format && *view->format ? view->format + strlen(view->format) - 1 : "B";
    int integer = *f != '\0' && strchr("bhilqn", *f) != NULL;
    if (view->itemsize != itemsize || view->ndim != 1 || !integer) {
        PyErr_Format(PyExc_TypeError, "gather: a chunk's %s must be a flat array of %zd-byte integers", name,
                     itemsize);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static void release(Chunk *c) {
    PyBuffer_Release(&c->tokens);
    PyBuffer_Release(&c->positions);
    PyBuffer_Release(&c->offsets);
    Py_CLEAR(c->docs);
}

/* The arrays of the chunk ``docs`` (its token places made where the worker did not) */
static Chunk *chunk_of(Cache *cache, PyObject *docs) {
    for (int i = 0; i < cache->count; i++)
        if (cache->chunks[i].docs == docs) return &cache->chunks[i];
    PyObject *made = PyObject_CallMethod(docs, "token_positions", NULL);
    if (made == NULL) return NULL;
    Py_DECREF(made);
    Chunk *c;
    if (cache->count < CACHED) {
        c = &cache->chunks[cache->count++];
    } else {
        c = &cache->chunks[cache->next];
        cache->next = (cache->next + 1) % CACHED;
        release(c);
    }
    if (get_array(docs, "tokens", 4, &c->tokens) < 0) return NULL;
    if (get_array(docs, "positions", 4, &c->positions) < 0) {
        PyBuffer_Release(&c->tokens);
        return NULL;
    }
    if (get_array(docs, "offsets", 8, &c->offsets) < 0) {
        PyBuffer_Release(&c->tokens);
        PyBuffer_Release(&c->positions);
        return NULL;
    }
    Py_INCREF(docs);
    c->docs = docs;
    return c;
}

static int int_attr(PyObject *o, PyObject *name, long long *out) {
    PyObject *v = PyObject_GetAttr(o, name);
    if (v == NULL) return -1;
    *out = PyLong_AsLongLong(v);
    Py_DECREF(v);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

static int writable(PyObject *array, Py_ssize_t itemsize, Py_ssize_t n, Py_buffer *view, const char *what) {
    if (PyObject_GetBuffer(array, view, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) return -1;
    if (view->itemsize != itemsize || view->len != n * itemsize) {
        PyErr_Format(PyExc_ValueError, "gather: %s must hold %zd items of %zd bytes", what, n, itemsize);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* gather(pieces, total, tokens, positions, sources, starts): see the file's comment; the output
   arrays hold ``total`` items each (int32, int32, int16, bool), the pieces' tokens summed. */
static PyObject *gather(PyObject *self, PyObject *args) {
    PyObject *pieces, *outs[4];
    Py_ssize_t total;
    if (!PyArg_ParseTuple(args, "O!nOOOO", &PyList_Type, &pieces, &total, &outs[0], &outs[1], &outs[2],
                          &outs[3]))
        return NULL;
    static const Py_ssize_t sizes[4] = {4, 4, 2, 1};
    static const char *names[4] = {"tokens", "positions", "sources", "starts"};
    Py_buffer out[4];
    int held = 0;
    for (; held < 4; held++)
        if (writable(outs[held], sizes[held], total, &out[held], names[held]) < 0) break;
    PyObject *result = NULL;
    Cache cache = {.count = 0, .next = 0};
    PyObject *s_dataset = NULL, *s_docs = NULL, *s_doc = NULL, *s_start = NULL, *s_stop = NULL;
    if (held < 4) goto done;
    s_dataset = PyUnicode_InternFromString("dataset");
    s_docs = PyUnicode_InternFromString("docs");
    s_doc = PyUnicode_InternFromString("doc");
    s_start = PyUnicode_InternFromString("start");
    s_stop = PyUnicode_InternFromString("stop");
    if (!s_dataset || !s_docs || !s_doc || !s_start || !s_stop) goto done;
    int32_t *tokens = out[0].buf, *positions = out[1].buf;
    int16_t *sources = out[2].buf;
    uint8_t *starts = out[3].buf;
    Py_ssize_t at = 0, n = PyList_Size(pieces);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *piece = PyList_GetItem(pieces, i);
        if (piece == NULL) goto done;
        Py_INCREF(piece); /* reading its attributes may run Python code */
        long long dataset, doc, start, stop;
        int failed = int_attr(piece, s_dataset, &dataset) < 0 || int_attr(piece, s_doc, &doc) < 0 ||
                     int_attr(piece, s_start, &start) < 0 || int_attr(piece, s_stop, &stop) < 0;
        PyObject *docs = failed ? NULL : PyObject_GetAttr(piece, s_docs);
        Py_DECREF(piece);
        if (docs == NULL) goto done;
        Chunk *c = chunk_of(&cache, docs); /* the cache holds docs from here */
        Py_DECREF(docs);
        if (c == NULL) goto done;
        Py_ssize_t size = (Py_ssize_t)(stop - start), chunk_len = c->tokens.len / 4;
        if (start < 0 || size < 0 || stop > chunk_len || c->positions.len / 4 != chunk_len || doc < 0 ||
            doc >= c->offsets.len / 8 - 1 || size > total - at) {
            PyErr_SetString(PyExc_ValueError, "gather: a piece lies outside its chunk, or the pieces past total");
            goto done;
        }
        if (dataset < 0 || dataset > INT16_MAX) {
            PyErr_SetString(PyExc_ValueError, "gather: a dataset index outside int16");
            goto done;
        }
        const int32_t *from = (const int32_t *)c->positions.buf + start;
        memcpy(tokens + at, (const int32_t *)c->tokens.buf + start, (size_t)size * 4);
        for (Py_ssize_t k = 0; k < size; k++) {
            positions[at + k] = from[k];
            starts[at + k] = from[k] == 0;
            sources[at + k] = (int16_t)dataset;
        }
        if (size > 0 && from[0] != 0) { /* it continues a cut document: its places from 0 */
            long long doc_end = ((const int64_t *)c->offsets.buf)[doc + 1];
            Py_ssize_t cut = (Py_ssize_t)((stop < doc_end ? stop : doc_end) - start);
            int32_t shift = from[0];
            for (Py_ssize_t k = 0; k < cut; k++) positions[at + k] -= shift;
        }
        at += size;
    }
    if (at != total) {
        PyErr_SetString(PyExc_ValueError, "gather: the pieces hold fewer tokens than total");
        goto done;
    }
    result = Py_NewRef(Py_None);
done:
    for (int i = 0; i < cache.count; i++)
        if (cache.chunks[i].docs != NULL) release(&cache.chunks[i]);
    for (int i = 0; i < held; i++) PyBuffer_Release(&out[i]);
    Py_XDECREF(s_dataset);
    Py_XDECREF(s_docs);
    Py_XDECREF(s_doc);
    Py_XDECREF(s_start);
    Py_XDECREF(s_stop);
    return result;
}

/* count_by_dataset(sources, starts, tokens, documents): a batch's tokens and document starts by
   dataset (zephon.batch.Batch.counts_per_dataset), in one pass: for each run of one value d of
   ``sources`` (int16, C order), its length added to tokens[d] and the document starts in it
   (``starts``, bool, one a source, or None) to documents[d] (int64 arrays of one length, a
   dataset each). Padding (-1) is not counted. A source past the datasets given, or a document
   start on padding, is an error (ValueError): a batch that holds one is not what the packer
   makes. A batch's datasets come in runs (its pieces), so the pass is a comparison a token;
   numpy took a pass a dataset and a boolean index. */
static int format_is(const Py_buffer *view, Py_ssize_t itemsize, const char *letters) {
    const char *f = view->format && *view->format ? view->format + strlen(view->format) - 1 : "B";
    return view->itemsize == itemsize && *f != '\0' && strchr(letters, *f) != NULL;
}

static PyObject *count_by_dataset(PyObject *self, PyObject *args) {
    PyObject *objects[4];
    if (!PyArg_ParseTuple(args, "OOOO", &objects[0], &objects[1], &objects[2], &objects[3])) return NULL;
    Py_buffer views[4];
    int held = 0, has_starts = objects[1] != Py_None;
    PyObject *result = NULL;
    for (; held < 4; held++) {
        if (held == 1 && !has_starts) continue;
        int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (held >= 2 ? PyBUF_WRITABLE : 0);
        if (PyObject_GetBuffer(objects[held], &views[held], flags) < 0) goto done;
    }
    Py_ssize_t n = views[0].len / 2, m = views[2].len / 8;
    if (!format_is(&views[0], 2, "h") || (has_starts && (!format_is(&views[1], 1, "?bB") || views[1].len != n)) ||
        !format_is(&views[2], 8, "lq") || !format_is(&views[3], 8, "lq") || views[3].len != views[2].len) {
        PyErr_SetString(PyExc_ValueError,
                        "count_by_dataset: sources must be int16, starts bool, one a source, tokens and "
                        "documents int64 of one length");
        goto done;
    }
    const int16_t *s = views[0].buf;
    const uint8_t *b = has_starts ? views[1].buf : NULL;
    int64_t *tokens = views[2].buf, *documents = views[3].buf;
    for (Py_ssize_t i = 0, j; i < n; i = j) {
        int16_t d = s[i];
        for (j = i + 1; j < n && s[j] == d; j++) {
        }
        int64_t starts = 0;
        if (b != NULL)
            for (Py_ssize_t k = i; k < j; k++) starts += b[k] != 0;
        if (d >= m || (d < 0 && starts > 0)) {
            PyErr_Format(PyExc_ValueError,
                         d >= m ? "count_by_dataset: source %d past the %zd datasets given"
                                : "count_by_dataset: a document start on padding (source %d)",
                         (int)d, m);
            goto done;
        }
        if (d < 0) continue;
        tokens[d] += j - i;
        documents[d] += starts;
    }
    result = Py_NewRef(Py_None);
done:
    for (int i = 0; i < held; i++)
        if (i != 1 || has_starts) PyBuffer_Release(&views[i]);
    return result;
}

static PyMethodDef methods[] = {
    {"gather", gather, METH_VARARGS, "build_rows' pieces laid end to end, compiled (see zephon.ops.pack)."},
    {"count_by_dataset", count_by_dataset, METH_VARARGS,
     "A batch's tokens and document starts by dataset, compiled (see zephon.batch)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_rows", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__rows(void) { return PyModule_Create(&module); }
