/* `kv_run(data, start)` and `load_run(data, start)`: kvrun.py's in C, the same result for the
 * same input (tests/perf/test_scan_native.py compares them): the run of strict k/v scale warning
 * records from `start`, and that run going on across a loader's bar records, each recognised in
 * one pass over its bytes, with no Python object per warning record. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

static const int DAYS[13] = {0, 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};

typedef struct {
    const unsigned char *p, *end;
} Cur;

static int lit(Cur *c, const char *s) {
    size_t n = strlen(s);
    if ((size_t)(c->end - c->p) < n || memcmp(c->p, s, n) != 0) return 0;
    c->p += n;
    return 1;
}

static int digits(Cur *c, int lo, int hi) { /* [0-9]{lo,hi}, greedy */
    int k = 0;
    while (k < hi && c->p < c->end && *c->p >= '0' && *c->p <= '9') c->p++, k++;
    return k >= lo;
}

/* The end of the record from `s`: the first `\n` or `\r`, or `end`. */
static const unsigned char *record_end(const unsigned char *s, const unsigned char *end) {
    const unsigned char *lf = memchr(s, '\n', end - s);
    if (lf == NULL) lf = end;
    const unsigned char *cr = memchr(s, '\r', lf - s);
    return cr != NULL ? cr : lf;
}

/* Whether [s, e) holds a colour code's "0m" or "6m" (then it is no plain record). */
static int coloured(const unsigned char *s, const unsigned char *e) {
    for (const unsigned char *q = s; q < e && (q = memchr(q, 'm', e - q)) != NULL; q++)
        if (q > s && (q[-1] == '0' || q[-1] == '6')) return 1;
    return 0;
}

static int two(const unsigned char *p) { return (p[0] - '0') * 10 + (p[1] - '0'); }

static int is_digit(unsigned char ch) { return ch >= '0' && ch <= '9'; }

/* `layers?\.(\d{1,6}+)\.` searched in [p, end): the layer, or -1 */
static long layer_in(const unsigned char *p, const unsigned char *end) {
    for (; p + 5 <= end && (p = memchr(p, 'l', end - p - 4)) != NULL; p++) {
        if (memcmp(p, "layer", 5) != 0) continue;
        const unsigned char *q = p + 5;
        if (q < end && *q == 's') q++;
        if (q >= end || *q != '.') continue;
        q++;
        const unsigned char *d = q;
        while (q < end && q - d < 6 && is_digit(*q)) q++;
        if (q == d || q >= end || *q != '.') continue;
        long v = 0;
        for (; d < q; d++) v = v * 10 + (*d - '0');
        return v;
    }
    return -1;
}

typedef struct Rec {
    const unsigned char *name, *stamp, *ckpt, *model;
    Py_ssize_t name_n, ckpt_n, model_n;
    long long pid;
    char scale;
} Rec;

static int names(Cur *c, const unsigned char **at, Py_ssize_t *n) { /* [\x21-\x27\x2a-\x7e]{0,400} */
    *at = c->p;
    while (c->p < c->end && c->p - *at < 400 && *c->p >= 0x21 && *c->p <= 0x7e && *c->p != '(' &&
           *c->p != ')')
        c->p++;
    *n = c->p - *at;
    return 1;
}

/* The catalog's loggers of the k/v scale warning (catalog_load.py warn.kv_scale_missing): the
 * header's file name, after any DEBUG path, before its ":line". */
static int kv_logger(const unsigned char *src, const unsigned char *end) {
    const unsigned char *colon = end, *name = src;
    for (const unsigned char *p = src; p < end; p++) {
        if (*p == '/') name = p + 1;
        if (*p == ':') { colon = p; break; }
    }
    static const char *const loggers[] = {"weight_utils.py", "utils.py", "kv_cache.py"};
    for (int i = 0; i < 3; i++) {
        size_t n = strlen(loggers[i]);
        if ((size_t)(colon - name) == n && memcmp(name, loggers[i], n) == 0) return 1;
    }
    return 0;
}

static int record(const unsigned char *s, const unsigned char *e, Rec *r) {
    Cur c = {s, e};
    if (!lit(&c, "(")) return 0;
    r->name = c.p;
    if (c.p >= e || !((*c.p | 0x20) >= 'a' && (*c.p | 0x20) <= 'z')) return 0;
    c.p++;
    while (c.p < e && c.p - r->name < 64 &&
           (is_digit(*c.p) || ((*c.p | 0x20) >= 'a' && (*c.p | 0x20) <= 'z') || *c.p == '_'))
        c.p++;
    r->name_n = c.p - r->name;
    if (!lit(&c, " pid=")) return 0;
    const unsigned char *d = c.p;
    if (!digits(&c, 1, 10)) return 0;
    r->pid = 0;
    for (; d < c.p; d++) r->pid = r->pid * 10 + (*d - '0');
    if (!lit(&c, ") WARNING ")) return 0;
    if (e - c.p < 14) return 0;
    const unsigned char *t = c.p;
    static const char shape[] = "00-00 00:00:00";
    for (int i = 0; i < 14; i++) {
        if (shape[i] == '0' ? !is_digit(t[i]) : t[i] != shape[i]) return 0;
    }
    int mon = two(t), day = two(t + 3);
    if (mon < 1 || mon > 12 || day < 1 || day > DAYS[mon] || two(t + 6) > 23 || two(t + 9) > 59 ||
        two(t + 12) > 59)
        return 0;
    r->stamp = t;
    c.p += 14;
    if (!lit(&c, " [")) return 0;
    const unsigned char *src = c.p;
    while (c.p < e && c.p - src < 200 && *c.p >= 0x21 && *c.p <= 0x7e && *c.p != ']') c.p++;
    if (c.p == src) return 0;
    const unsigned char *src_end = c.p;
    if (!kv_logger(src, src_end)) return 0;
    if (!lit(&c, "] Found ")) return 0;
    if (c.p >= e || (*c.p != 'k' && *c.p != 'v')) return 0;
    r->scale = (char)*c.p++;
    if (!lit(&c, "_scale in the checkpoint (e.g. ")) return 0;
    names(&c, &r->ckpt, &r->ckpt_n);
    if (!lit(&c, "), but not found the expected name in the model (e.g. ")) return 0;
    names(&c, &r->model, &r->model_n);
    if (!lit(&c, ")")) return 0;
    if (c.p < e) {
        if (!lit(&c, ". ") || c.p >= e || (*c.p != 'k' && *c.p != 'v')) return 0;
        c.p++;
        if (!lit(&c, "_scale is not loaded.") || c.p != e) return 0;
    }
    /* A colour code's "0m" or "6m" can only be within the parts that vary: the literals hold
     * none, and none ends in a digit before a part or starts with "m" after one. */
    return !(coloured(r->name, r->name + r->name_n) || coloured(src, src_end) ||
             coloured(r->ckpt, r->ckpt + r->ckpt_n) || coloured(r->model, r->model + r->model_n));
}

static int by_value(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }

/* kvrun.py's `kv_run` result of a run tallied in C: names decoded, layers in layer order (those
 * counted in `counts` first, then the rare higher ones of `high`). */
static PyObject *result(Py_ssize_t count, Py_ssize_t last_start, Py_ssize_t last_end,
                        const struct Rec *first, const struct Rec *last, const char *scales,
                        int nscales, const struct Rec *procs, int nprocs, const int *counts,
                        int *order, int nlayers, PyObject *high);

#define MAX_PROCS 64     /* kvrun.py's MAX_RUN_PROCESSES: a run ends before a 65th process */
#define DENSE_LAYERS 1024 /* layers counted in an array; higher ones (none known) in the dict */

/* The run of k/v warning records from `start`: kvrun.py's `kv_run` result, or None. Processes
 * and layers are tallied in C arrays, so a record costs no Python object. */
static PyObject *stretch(const unsigned char *d, const unsigned char *end, Py_ssize_t start) {
    const unsigned char *s = d + (start < 0 ? 0 : start);
    Py_ssize_t count = 0, last_start = 0, last_end = 0;
    Rec first = {0}, last = {0}, r;
    char scales[2];
    int nscales = 0, nprocs = 0, nlayers = 0;
    Rec procs[MAX_PROCS];
    int counts[DENSE_LAYERS], order[DENSE_LAYERS];
    memset(counts, 0, sizeof counts);
    PyObject *layers = PyDict_New(), *out = NULL;
    if (layers == NULL) goto done;
    while (s < end) {
        const unsigned char *e = record_end(s, end);
        if (!record(s, e, &r)) break;
        if (count && memcmp(r.stamp, last.stamp, 14) < 0) break;
        int p = 0;
        while (p < nprocs && !(procs[p].pid == r.pid && procs[p].name_n == r.name_n &&
                               memcmp(procs[p].name, r.name, r.name_n) == 0))
            p++;
        if (p == nprocs) {
            if (nprocs == MAX_PROCS) break;
            procs[nprocs++] = r;
        }
        if (!count) first = r;
        count++;
        last = r;
        last_start = s - d;
        last_end = e - d;
        if (!(nscales > 0 && scales[0] == r.scale) && !(nscales > 1 && scales[1] == r.scale))
            scales[nscales++] = r.scale;
        long layer = layer_in(r.ckpt, r.ckpt + r.ckpt_n);
        if (layer < 0) layer = layer_in(r.model, r.model + r.model_n);
        if (layer >= 0 && layer < DENSE_LAYERS) {
            if (counts[layer]++ == 0) order[nlayers++] = (int)layer;
        } else if (layer >= 0) {
            PyObject *k = PyLong_FromLong(layer);
            if (k == NULL) goto done;
            PyObject *v = PyDict_GetItemWithError(layers, k);
            long n = v == NULL ? 0 : PyLong_AsLong(v);
            PyObject *nv = PyLong_FromLong(n + 1);
            int bad = nv == NULL || PyDict_SetItem(layers, k, nv) < 0;
            Py_DECREF(k);
            Py_XDECREF(nv);
            if (bad) goto done;
        }
        s = e;
        while (s < end && (*s == '\n' || *s == '\r')) s++;
    }
    if (!count) {
        out = Py_NewRef(Py_None);
        goto done;
    }
    out = result(count, last_start, last_end, &first, &last, scales, nscales, procs, nprocs, counts,
                 order, nlayers, layers);
done:
    Py_XDECREF(layers);
    return out;
}

static PyObject *result(Py_ssize_t count, Py_ssize_t last_start, Py_ssize_t last_end,
                        const struct Rec *first, const struct Rec *last, const char *scales,
                        int nscales, const struct Rec *procs, int nprocs, const int *counts,
                        int *order, int nlayers, PyObject *high) {
    PyObject *sc = NULL, *pt = NULL, *lt = NULL, *items = NULL, *out = NULL;
    qsort(order, nlayers, sizeof *order, by_value);
    items = PyDict_Items(high);
    if (items == NULL || PyList_Sort(items) < 0) goto done;
    Py_ssize_t nhigh = PyList_GET_SIZE(items);
    lt = PyTuple_New(nlayers + nhigh);
    sc = PyTuple_New(nscales);
    pt = PyTuple_New(nprocs);
    if (lt == NULL || sc == NULL || pt == NULL) goto done;
    for (int i = 0; i < nlayers; i++) {
        PyObject *pair = Py_BuildValue("(ii)", order[i], counts[order[i]]);
        if (pair == NULL) goto done;
        PyTuple_SET_ITEM(lt, i, pair);
    }
    for (Py_ssize_t i = 0; i < nhigh; i++)
        PyTuple_SET_ITEM(lt, nlayers + i, Py_NewRef(PyList_GET_ITEM(items, i)));
    for (int i = 0; i < nscales; i++) {
        PyObject *x = PyUnicode_FromStringAndSize(&scales[i], 1);
        if (x == NULL) goto done;
        PyTuple_SET_ITEM(sc, i, x);
    }
    for (int i = 0; i < nprocs; i++) {
        PyObject *x = Py_BuildValue("(s#L)", procs[i].name, procs[i].name_n, procs[i].pid);
        if (x == NULL) goto done;
        PyTuple_SET_ITEM(pt, i, x);
    }
    out = Py_BuildValue("(nnny#y#s#s#OOO)", last_end, count, last_start, first->stamp,
                        (Py_ssize_t)14, last->stamp, (Py_ssize_t)14, first->ckpt, first->ckpt_n,
                        first->model, first->model_n, sc, pt, lt);
done:
    Py_XDECREF(sc);
    Py_XDECREF(pt);
    Py_XDECREF(lt);
    Py_XDECREF(items);
    return out;
}

static PyObject *kv_run(PyObject *self, PyObject *args) {
    Py_buffer buf;
    Py_ssize_t start;
    if (!PyArg_ParseTuple(args, "y*n", &buf, &start)) return NULL;
    if (start > buf.len) start = buf.len;
    PyObject *out = stretch(buf.buf, (const unsigned char *)buf.buf + buf.len, start);
    PyBuffer_Release(&buf);
    return out;
}

static int in_desc(unsigned char ch) { /* printable ASCII but ( ) : [ ] | */
    return ch >= 0x20 && ch <= 0x7e && ch != '(' && ch != ')' && ch != ':' && ch != '[' &&
           ch != ']' && ch != '|';
}

static int spaces(Cur *c, int hi) { /* " {0,hi}" */
    int k = 0;
    while (k < hi && c->p < c->end && *c->p == ' ') c->p++, k++;
    return 1;
}

static int number(Cur *c, long long *v) { /* [0-9]{1,9} as a number */
    const unsigned char *d = c->p;
    if (!digits(c, 1, 9)) return 0;
    *v = 0;
    for (; d < c->p; d++) *v = *v * 10 + (*d - '0');
    return 1;
}

static int span(Cur *c, const char *set, int hi, const unsigned char **at, Py_ssize_t *n) {
    *at = c->p; /* [set]{1,hi}: digits and the characters of `set` */
    while (c->p < c->end && c->p - *at < hi && (is_digit(*c->p) || strchr(set, *c->p) != NULL) &&
           *c->p != 0)
        c->p++;
    *n = c->p - *at;
    return *n > 0;
}

/* builders.py's `hms_seconds`: tqdm's `MM:SS` / `H:MM:SS` to seconds; None with a `?` or an
 * empty part. */
static PyObject *hms(const unsigned char *p, Py_ssize_t n) {
    long long total = 0, part = 0;
    int nd = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (p[i] == ':') {
            if (!nd) Py_RETURN_NONE;
            total = total * 60 + part, part = 0, nd = 0;
        } else if (is_digit(p[i])) {
            part = part * 10 + (p[i] - '0'), nd++;
        } else {
            Py_RETURN_NONE;
        }
    }
    if (!nd) Py_RETURN_NONE;
    return PyFloat_FromDouble((double)(total * 60 + part));
}

/* builders.py's `_rate`: items per second of `?it/s`, `N.Nit/s` or `N.Ns/it`, or None. */
static PyObject *rate_of(const unsigned char *p, Py_ssize_t n) {
    char num[32];
    if (n < 5 || n - 4 >= (Py_ssize_t)sizeof num || p[0] == '?') Py_RETURN_NONE;
    memcpy(num, p, n - 4);
    num[n - 4] = 0;
    double v = PyOS_string_to_double(num, NULL, NULL);
    if (v == -1.0 && PyErr_Occurred()) return NULL;
    if (memcmp(p + n - 4, "s/it", 4) == 0) {
        if (v == 0.0) Py_RETURN_NONE;
        v = 1.0 / v;
    }
    return PyFloat_FromDouble(v);
}

/* kvrun.py's `bar_pair`: the prefix record at `s`, `\r`, the strict bar record after it. */
static PyObject *bar_pair(const unsigned char *d, const unsigned char *end, const unsigned char *s) {
    Cur c = {s, end};
    if (!lit(&c, "(") || c.p >= end || !((*c.p | 0x20) >= 'a' && (*c.p | 0x20) <= 'z')) return NULL;
    const unsigned char *name = c.p++;
    while (c.p < end && c.p - name < 64 &&
           (is_digit(*c.p) || ((*c.p | 0x20) >= 'a' && (*c.p | 0x20) <= 'z') || *c.p == '_'))
        c.p++;
    if (!lit(&c, " pid=") || !digits(&c, 1, 10) || !lit(&c, ") \r")) return NULL;
    const unsigned char *b = c.p, *e = record_end(b, end);
    c.end = e;
    const unsigned char *desc = c.p;
    if (c.p >= e || !((*c.p | 0x20) >= 'a' && (*c.p | 0x20) <= 'z')) return NULL;
    c.p++;
    while (c.p < e && c.p - desc < 200 && in_desc(*c.p)) c.p++;
    Py_ssize_t desc_n = c.p - desc;
    long long done, total;
    const unsigned char *el, *rem, *rate;
    Py_ssize_t el_n, rem_n, rate_n;
    if (!lit(&c, ":") || !spaces(&c, 8) || !digits(&c, 1, 3) || !lit(&c, "% Completed | ") ||
        !number(&c, &done) || !lit(&c, "/") || !number(&c, &total) || !lit(&c, " [") ||
        !span(&c, ":", 12, &el, &el_n) || !lit(&c, "<") || !span(&c, ":?", 12, &rem, &rem_n) ||
        !lit(&c, ",") || !spaces(&c, 8))
        return NULL;
    rate = c.p;
    if (!lit(&c, "?it/s")) {
        if (!digits(&c, 1, 9)) return NULL;
        if (c.p < e && *c.p == '.') {
            c.p++;
            if (!digits(&c, 1, 9)) return NULL;
        }
        if (!lit(&c, "it/s") && !lit(&c, "s/it")) return NULL;
    }
    rate_n = c.p - rate;
    if (!lit(&c, "]") || c.p != e) return NULL;
    if (coloured(b, e)) return NULL;
    return Py_BuildValue("(nnny#LLNNN)", s - d, b - d, e - d, desc, desc_n, done, total,
                         hms(el, el_n), hms(rem, rem_n), rate_of(rate, rate_n));
}

/* kvrun.py's `load_run`: k/v warning runs and bar pairs from `start`, in order. */
static PyObject *load_run(PyObject *self, PyObject *args) {
    Py_buffer buf;
    Py_ssize_t start;
    if (!PyArg_ParseTuple(args, "y*n", &buf, &start)) return NULL;
    const unsigned char *d = buf.buf, *end = d + buf.len;
    if (start < 0) start = 0;
    if (start > buf.len) start = buf.len;
    const unsigned char *s = d + start;
    Py_ssize_t last_end = start;
    PyObject *pieces = PyList_New(0), *out = NULL;
    if (pieces == NULL) goto done;
    while (s < end) {
        PyObject *got = stretch(d, end, s - d), *piece;
        if (got == NULL) goto done;
        if (got != Py_None) {
            last_end = PyLong_AsSsize_t(PyTuple_GET_ITEM(got, 0));
            piece = Py_BuildValue("(nN)", s - d, got);
        } else {
            Py_DECREF(got);
            if (PyList_GET_SIZE(pieces) == 0) break;
            piece = bar_pair(d, end, s);
            if (piece == NULL) {
                if (PyErr_Occurred()) goto done;
                break;
            }
            last_end = PyLong_AsSsize_t(PyTuple_GET_ITEM(piece, 2));
        }
        if (piece == NULL) goto done;
        int bad = PyList_Append(pieces, piece) < 0;
        Py_DECREF(piece);
        if (bad) goto done;
        s = d + last_end;
        while (s < end && (*s == '\n' || *s == '\r')) s++;
    }
    if (PyList_GET_SIZE(pieces) == 0)
        out = Py_NewRef(Py_None);
    else
        out = Py_BuildValue("(nO)", last_end, pieces);
done:
    Py_XDECREF(pieces);
    PyBuffer_Release(&buf);
    return out;
}

/* `build(cls, names, values)`: `object.__new__(cls)` with each of `names` set to its value as
 * `object.__setattr__` sets it (a frozen dataclass's own `__setattr__` is not called): how the
 * stream makes the events of a run, the fields given in one call. */
static PyObject *build(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyType_Check(args[0]) || !PyTuple_Check(args[1]) || !PyTuple_Check(args[2]) ||
        PyTuple_GET_SIZE(args[1]) != PyTuple_GET_SIZE(args[2])) {
        PyErr_SetString(PyExc_TypeError, "build(cls, names, values): a type and two tuples");
        return NULL;
    }
    PyTypeObject *cls = (PyTypeObject *)args[0];
    PyObject *obj = cls->tp_alloc(cls, 0);
    if (obj == NULL) return NULL;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(args[1]); i++) {
        if (PyObject_GenericSetAttr(obj, PyTuple_GET_ITEM(args[1], i),
                                    PyTuple_GET_ITEM(args[2], i)) < 0) {
            Py_DECREF(obj);
            return NULL;
        }
    }
    return obj;
}

static PyMethodDef methods[] = {
    {"build", (PyCFunction)(void (*)(void))build, METH_FASTCALL, "build(cls, names, values)"},
    {"kv_run", kv_run, METH_VARARGS, "kv_run(data, start) -> kvrun.py's kv_run"},
    {"load_run", load_run, METH_VARARGS, "load_run(data, start) -> kvrun.py's load_run"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, .m_name = "_kvrun", .m_size = -1, .m_methods = methods,
};

PyMODINIT_FUNC PyInit__kvrun(void) { return PyModule_Create(&module); }
