/* The mixer's take by fixed shares (zephon.work.mixture.Mixer._take_by_shares), compiled.

   The same rule, the same arithmetic and the same search, step for step, as the Python it stands
   in for: a lane takes about 1,800 pieces a million tokens, and each took about 4 us of Python,
   a third of a rank process's own work. Every key is computed as Python computes it: an integer
   count (exact in int64) plus a half-count, divided by a share, in IEEE double arithmetic, with
   no fused multiply-add (built with -ffp-contract=off); comparisons of an integer bound with a
   float are exact while bounds stay under 2**53. tests/test_mixer_native.py checks both ways
   give the same pieces and state on generated mixtures.

   Built against the stable ABI (Python 3.11 and later), and optional: where it is not built,
   the mixer runs the Python, which gives the same pieces. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>

/* Where doubles are computed in wider registers (x87: 32-bit x86 without SSE2), a key could round
   otherwise than Python's: no build there (setup.py's build is optional), the Python runs. */
#if !defined(FLT_EVAL_METHOD) || FLT_EVAL_METHOD != 0
#error "zephon.work._shares needs double arithmetic rounded at every step (FLT_EVAL_METHOD 0)"
#endif
#if defined(__clang__)
#pragma clang fp contract(off)
#endif

typedef struct {
    PyObject *bounds; /* the chunk's document offsets, a list of int */
    Py_ssize_t n;     /* its length */
} Bounds;

#define LARGEST (1LL << 62) /* units used: past this, sums could leave 64 bits */

/* Only ints (and floats for shares) are read: for those the C API runs no Python code, so the
   lists and the items borrowed from them stay as they are for the whole take. */
static int item(PyObject *list, Py_ssize_t i, long long *out) {
    PyObject *o = PyList_GetItem(list, i); /* borrowed */
    if (o == NULL) return -1;
    if (!PyLong_Check(o)) {
        PyErr_SetString(PyExc_TypeError, "take_by_shares: the mixer's positions and counts must be ints");
        return -1;
    }
    long long v = PyLong_AsLongLong(o);
    if (v == -1 && PyErr_Occurred()) return -1;
    *out = v;
    return 0;
}

static int set_item(PyObject *list, Py_ssize_t i, long long v) {
    PyObject *o = PyLong_FromLongLong(v);
    if (o == NULL) return -1;
    return PyList_SetItem(list, i, o); /* steals o, also on failure */
}

/* bisect.bisect_right(b, x) over [lo, hi) of the list b */
static int bisect_right(PyObject *b, long long x, Py_ssize_t lo, Py_ssize_t hi, Py_ssize_t *out) {
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        long long v;
        if (item(b, mid, &v) < 0) return -1;
        if (x < v) hi = mid; else lo = mid + 1;
    }
    *out = lo;
    return 0;
}

/* bisect.bisect_left(b, x) over [lo, hi), for an integer x */
static int bisect_left(PyObject *b, long long x, Py_ssize_t lo, Py_ssize_t hi, Py_ssize_t *out) {
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        long long v;
        if (item(b, mid, &v) < 0) return -1;
        if (v < x) lo = mid + 1; else hi = mid;
    }
    *out = lo;
    return 0;
}

/* bisect.bisect_left(b, x) over [lo, hi), for a float x: Python compares an int with a float
   exactly, as the double of an int under 2**53 is */
static int bisect_left_f(PyObject *b, double x, Py_ssize_t lo, Py_ssize_t hi, Py_ssize_t *out) {
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        long long v;
        if (item(b, mid, &v) < 0) return -1;
        if ((double)v < x) lo = mid + 1; else hi = mid;
    }
    *out = lo;
    return 0;
}

static int share_of(PyObject *shares, Py_ssize_t e, double *out) {
    PyObject *o = PyList_GetItem(shares, e); /* borrowed */
    if (o == NULL) return -1;
    if (!PyFloat_Check(o)) {
        PyErr_SetString(PyExc_TypeError, "take_by_shares: the shares must be floats");
        return -1;
    }
    *out = PyFloat_AsDouble(o);
    return 0;
}

typedef struct {
    int lower;  /* e < d: wins a tie */
    double u;   /* its units used */
    long long rem_tokens;  /* by tokens: the tokens left in its document */
    double rem_docs;       /* by documents: half a document if its next one is not begun */
    double s;   /* its share */
} Other;

typedef struct {
    PyObject *bounds;
    long long used, begun, start, limit, first;
    double share;
    int tokens;
    Other *others;
    Py_ssize_t count;
} Run;

/* Mixer._run_end's takes(j): 1 if taken, 0 if not, -1 on an error */
static int takes(const Run *r, long long j) {
    long long here, next;
    if (item(r->bounds, (Py_ssize_t)(r->first + j), &here) < 0) return -1;
    long long space = r->limit - here + r->start;
    if (space <= 0) return 0;
    double mine;
    if (r->tokens) {
        if (item(r->bounds, (Py_ssize_t)(r->first + j + 1), &next) < 0) return -1;
        long long length = next - here;
        mine = ((double)(r->used + here - r->start) + (double)(length < space ? length : space) / 2.0) / r->share;
    } else {
        mine = ((double)(r->used + r->begun + j) + 0.5) / r->share;
    }
    for (Py_ssize_t i = 0; i < r->count; i++) {
        const Other *o = &r->others[i];
        double theirs;
        if (r->tokens) {
            long long rem = o->rem_tokens < space ? o->rem_tokens : space;
            theirs = (o->u + (double)rem / 2.0) / o->s;
        } else {
            theirs = (o->u + o->rem_docs) / o->s;
        }
        if (mine > theirs || (mine == theirs && o->lower)) return 0;
    }
    return 1;
}

/* zephon.work.mixture.first_false, probe for probe */
static int first_false(const Run *r, long long n, long long guess, long long *out) {
    long long lo, hi, step;
    int h;
    guess = guess < n ? guess : n;
    guess = guess > 0 ? guess : 0;
    h = guess < n ? takes(r, guess) : 0;
    if (h < 0) return -1;
    if (guess < n && h) {
        lo = guess, step = 1;
        hi = lo + step;
        while (hi < n) {
            if ((h = takes(r, hi)) < 0) return -1;
            if (!h) break;
            lo = hi, step *= 2;
            hi = lo + step;
        }
        hi = hi < n ? hi : n;
    } else {
        hi = guess, step = 1;
        lo = hi - step;
        while (lo >= 0) {
            if ((h = takes(r, lo)) < 0) return -1;
            if (h) break;
            hi = lo, step *= 2;
            lo = hi - step;
        }
        lo = lo > -1 ? lo : -1;
    }
    while (hi - lo > 1) {
        long long mid = (lo + hi) / 2;  /* lo + hi >= 0 here: C's division floors as // does */
        if ((h = takes(r, mid)) < 0) return -1;
        if (h) lo = mid; else hi = mid;
    }
    *out = hi;
    return 0;
}

static long long min_ll(long long a, long long b) { return a < b ? a : b; }

typedef struct {
    PyObject *bounds, *docs, *offsets, *used, *shares, *hints; /* lists, one entry per dataset */
    Py_ssize_t n;
    int tokens;
    long long *left; /* scratch: n entries */
    Other *others;   /* scratch: n entries */
} Mix;

typedef struct {
    Py_ssize_t dataset;
    long long doc, start, stop;
    int past_end; /* the dataset's position is past its chunk's last document: settle it */
} Taken;

/* One take, as Mixer._take_by_shares: the piece as numbers; docs, offsets, used and hints of
   ``m`` updated in place. 0, or -1 with an exception set (OverflowError before any change). */
static int take_one(const Mix *m, long long limit, int runs, Taken *out) {
    PyObject *bounds = m->bounds, *docs = m->docs, *offsets = m->offsets, *used = m->used;
    PyObject *shares = m->shares, *hints = m->hints;
    Py_ssize_t n = m->n;
    int tokens = m->tokens;
    long long *left = m->left;
    Other *others = m->others;
    if (limit < 1) {
        PyErr_SetString(PyExc_ValueError, "take_by_shares: a piece's limit must be at least 1 token");
        return -1;
    }
    if (limit > LARGEST) {  /* before anything changed: the caller takes it in Python */
        PyErr_SetString(PyExc_OverflowError, "take_by_shares: a limit past 2**62");
        return -1;
    }
    Py_ssize_t best = 0;
    double best_key = 0.0;
    for (Py_ssize_t e = 0; e < n; e++) {
        PyObject *b = PyList_GetItem(bounds, e);
        long long doc, off, u, lo, hi;
        if (b == NULL || item(docs, e, &doc) < 0 || item(offsets, e, &off) < 0 || item(used, e, &u) < 0)
            return -1;
        if (u > LARGEST) {  /* before anything changed: the caller takes it in Python */
            PyErr_SetString(PyExc_OverflowError, "take_by_shares: a count of units past 2**62");
            return -1;
        }
        if (!PyList_Check(b)) {
            PyErr_SetString(PyExc_TypeError, "take_by_shares: a dataset's bounds must be a list");
            return -1;
        }
        if (item(b, (Py_ssize_t)doc, &lo) < 0 || item(b, (Py_ssize_t)doc + 1, &hi) < 0) return -1;
        double share;
        if (share_of(shares, e, &share) < 0) return -1;
        long long rem = hi - lo - off;
        left[e] = rem;
        double units = tokens ? (double)min_ll(rem, limit) / 2.0 : (off == 0 ? 0.5 : 0.0);
        double key = ((double)u + units) / share;
        if (e == 0 || key < best_key) best = e, best_key = key;
    }
    Py_ssize_t d = best;
    PyObject *b = PyList_GetItem(bounds, d);
    Py_ssize_t nb = PyList_Size(b);
    long long doc, off, u, lo, stop;
    if (item(docs, d, &doc) < 0 || item(offsets, d, &off) < 0 || item(used, d, &u) < 0 ||
        item(b, (Py_ssize_t)doc, &lo) < 0 || item(b, (Py_ssize_t)doc + 1, &stop) < 0)
        return -1;
    long long start = lo + off;
    if (stop - start >= limit) {
        stop = start + limit;
    } else if (runs && doc + 2 < nb) {  /* Mixer._run_end */
        double share;
        if (share_of(shares, d, &share) < 0) return -1;
        long long first = doc + 1, here;
        if (item(b, (Py_ssize_t)first, &here) < 0) return -1;
        long long space = limit - here + start;
        double lowest = INFINITY;
        Py_ssize_t count = 0;
        for (Py_ssize_t e = 0; e < n; e++) {
            if (e == d) continue;
            long long ue, oe;
            if (item(used, e, &ue) < 0 || item(offsets, e, &oe) < 0) return -1;
            double s;
            if (share_of(shares, e, &s) < 0) return -1;
            Other *o = &others[count++];
            o->lower = e < d, o->u = (double)ue, o->s = s;
            o->rem_tokens = left[e];
            o->rem_docs = oe == 0 ? 0.5 : 0.0;
            if (tokens) {
                double key = ((double)ue + (double)min_ll(left[e], space) / 2.0) / s;
                lowest = key < lowest ? key : lowest;
            }
        }
        Run r = {b, u, off == 0, start, limit, first, share, tokens, others, count};
        long long guess, k;
        if (tokens) {
            Py_ssize_t at;
            if (bisect_left_f(b, lowest * share - (double)u + (double)start, (Py_ssize_t)first, nb, &at) < 0)
                return -1;
            guess = (long long)at - first - 1;
        } else if (item(hints, d, &guess) < 0) {
            return -1;
        }
        if (first_false(&r, nb - 1 - first, guess, &k) < 0 || set_item(hints, d, k) < 0) return -1;
        long long end;
        if (item(b, (Py_ssize_t)(first + k), &end) < 0) return -1;
        stop = end < start + limit ? end : start + limit;
    }
    Py_ssize_t last;
    if (bisect_right(b, stop, 0, nb, &last) < 0) return -1;
    last -= 1;
    if (tokens) {
        u += stop - start;
    } else {
        Py_ssize_t begun;
        if (bisect_left(b, stop, 0, nb - 1, &begun) < 0) return -1;
        u += (long long)begun - doc - (off > 0);
    }
    long long at_last;
    if (item(b, last, &at_last) < 0) return -1;
    if (set_item(used, d, u) < 0 || set_item(docs, d, last) < 0 || set_item(offsets, d, stop - at_last) < 0)
        return -1;
    out->dataset = d, out->doc = doc, out->start = start, out->stop = stop, out->past_end = last >= nb - 1;
    return 0;
}

/* The mixer's lists checked, and its scratch made: 0, or -1 with an exception set */
static int mix_of(Mix *m, PyObject *bounds, PyObject *docs, PyObject *offsets, PyObject *used,
                  PyObject *shares, PyObject *hints, int tokens) {
    Py_ssize_t n = PyList_Size(shares);
    *m = (Mix){bounds, docs, offsets, used, shares, hints, n, tokens, NULL, NULL};
    if (n < 2 || PyList_Size(bounds) != n || PyList_Size(docs) != n || PyList_Size(offsets) != n ||
        PyList_Size(used) != n || PyList_Size(hints) != n) {
        PyErr_SetString(PyExc_ValueError, "take_by_shares: one entry per dataset, two or more datasets");
        return -1;
    }
    m->left = malloc(sizeof(long long) * n);
    m->others = malloc(sizeof(Other) * n);
    if (m->left == NULL || m->others == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

static void mix_free(Mix *m) {
    free(m->left);
    free(m->others);
}

#define MIX_ARGS "O!O!O!O!O!O!"
#define MIX_PARSED &PyList_Type, &bounds, &PyList_Type, &docs, &PyList_Type, &offsets, &PyList_Type, &used, \
                   &PyList_Type, &shares, &PyList_Type, &hints

/* take_by_shares(bounds, docs, offsets, used, shares, hints, limit, runs, tokens)
   -> (dataset, doc, start, stop, past_end): Mixer._take_by_shares, the piece as numbers; docs,
   offsets, used and hints are updated in place, and past_end says the dataset's position is past
   its chunk's last document (the caller settles it). */
static PyObject *take_by_shares(PyObject *self, PyObject *args) {
    PyObject *bounds, *docs, *offsets, *used, *shares, *hints;
    long long limit;
    int runs, tokens;
    if (!PyArg_ParseTuple(args, MIX_ARGS "Lpp", MIX_PARSED, &limit, &runs, &tokens)) return NULL;
    Mix m;
    Taken t;
    PyObject *result = NULL;
    if (mix_of(&m, bounds, docs, offsets, used, shares, hints, tokens) == 0 && take_one(&m, limit, runs, &t) == 0)
        result = Py_BuildValue("nLLLO", t.dataset, t.doc, t.start, t.stop, t.past_end ? Py_True : Py_False);
    mix_free(&m);
    return result;
}

/* wrap_by_shares(bounds, docs, offsets, used, shares, hints, tokens, heads, piece, pieces, filled,
   want, row_len) -> (filled, settle): pack.wrap's loop over Mixer.take(row_len - filled % row_len,
   runs=True) while filled < want, each piece made as piece(dataset, heads[dataset], doc, start,
   stop) and appended to the list pieces; it stops early after a take that leaves a dataset past
   its chunk (settle: that dataset, else -1), for the caller to settle it and go on. An error
   (OverflowError: a count past 2**62) leaves the pieces taken so far in pieces. */
static PyObject *wrap_by_shares(PyObject *self, PyObject *args) {
    PyObject *bounds, *docs, *offsets, *used, *shares, *hints, *heads, *piece_type, *pieces;
    int tokens;
    long long filled, want, row_len;
    if (!PyArg_ParseTuple(args, MIX_ARGS "pO!OO!LLL", MIX_PARSED, &tokens, &PyList_Type, &heads, &piece_type,
                          &PyList_Type, &pieces, &filled, &want, &row_len))
        return NULL;
    if (row_len < 1) {
        PyErr_SetString(PyExc_ValueError, "wrap_by_shares: row_len must be positive");
        return NULL;
    }
    Mix m;
    PyObject *result = NULL;
    Py_ssize_t settle = -1;
    if (mix_of(&m, bounds, docs, offsets, used, shares, hints, tokens) < 0) goto done;
    while (filled < want) {
        Taken t;
        if (take_one(&m, row_len - filled % row_len, 1, &t) < 0) goto done;
        PyObject *head = PyList_GetItem(heads, t.dataset);
        if (head == NULL) goto done;
        PyObject *piece = PyObject_CallFunction(piece_type, "nOLLL", t.dataset, head, t.doc, t.start, t.stop);
        if (piece == NULL) goto done;
        int failed = PyList_Append(pieces, piece);
        Py_DECREF(piece);
        if (failed) goto done;
        filled += t.stop - t.start;
        if (t.past_end) {
            settle = t.dataset;
            break;
        }
    }
    result = Py_BuildValue("Ln", filled, settle);
done:
    mix_free(&m);
    return result;
}

static PyMethodDef methods[] = {
    {"take_by_shares", take_by_shares, METH_VARARGS,
     "Mixer._take_by_shares, compiled: (dataset, doc, start, stop, past_end)."},
    {"wrap_by_shares", wrap_by_shares, METH_VARARGS,
     "pack.wrap's takes by fixed shares, compiled: (filled, dataset to settle or -1)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_shares", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__shares(void) { return PyModule_Create(&module); }
