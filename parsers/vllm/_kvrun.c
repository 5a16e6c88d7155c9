/* `kv_run(data, start)`: kvrun.py's `kv_run` in C, the same result for the same input
 * (tests/perf/test_scan_native.py compares them): the run of strict k/v scale warning records
 * from `start`, each recognised in one pass over its bytes, with no Python object per record. */
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

static int two(const unsigned char *p) { return (p[0] - '0') * 10 + (p[1] - '0'); }

static int is_digit(unsigned char ch) { return ch >= '0' && ch <= '9'; }

/* `layers?\.(\d{1,6}+)\.` searched in [p, end): the layer, or -1 */
static long layer_in(const unsigned char *p, const unsigned char *end) {
    for (; p + 5 <= end; p++) {
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

typedef struct {
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
    for (const unsigned char *q = s; q + 1 < e; q++) /* colour codes' "0m", "6m": not plain */
        if (q[1] == 'm' && (q[0] == '0' || q[0] == '6')) return 0;
    return 1;
}

static PyObject *kv_run(PyObject *self, PyObject *args) {
    Py_buffer buf;
    Py_ssize_t start;
    if (!PyArg_ParseTuple(args, "y*n", &buf, &start)) return NULL;
    const unsigned char *d = buf.buf, *end = d + buf.len;
    const unsigned char *s = d + (start < 0 ? 0 : start);
    Py_ssize_t count = 0, last_start = 0, last_end = 0;
    Rec first = {0}, last = {0}, r;
    char scales[2];
    int nscales = 0;
    PyObject *procs = PyList_New(0), *layers = PyDict_New(), *seen = PySet_New(NULL), *out = NULL;
    if (procs == NULL || layers == NULL || seen == NULL) goto done;
    while (s < end) {
        const unsigned char *e = s;
        while (e < end && *e != '\n' && *e != '\r') e++;
        if (!record(s, e, &r)) break;
        if (count && memcmp(r.stamp, last.stamp, 14) < 0) break;
        if (!count) first = r;
        count++;
        last = r;
        last_start = s - d;
        last_end = e - d;
        if (!(nscales > 0 && scales[0] == r.scale) && !(nscales > 1 && scales[1] == r.scale))
            scales[nscales++] = r.scale;
        PyObject *key = Py_BuildValue("(y#L)", r.name, r.name_n, r.pid);
        if (key == NULL) goto done;
        int has = PySet_Contains(seen, key);
        if (has == 0 && (PySet_Add(seen, key) < 0 || PyList_Append(procs, key) < 0)) has = -1;
        Py_DECREF(key);
        if (has < 0) goto done;
        long layer = layer_in(r.ckpt, r.ckpt + r.ckpt_n);
        if (layer < 0) layer = layer_in(r.model, r.model + r.model_n);
        if (layer >= 0) {
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
    PyObject *sc = PyList_New(nscales);
    if (sc == NULL) goto done;
    for (int i = 0; i < nscales; i++)
        PyList_SET_ITEM(sc, i, PyBytes_FromStringAndSize(&scales[i], 1));
    out = Py_BuildValue("(nnny#y#y#y#NOO)", last_end, count, last_start, first.stamp,
                        (Py_ssize_t)14, last.stamp, (Py_ssize_t)14, first.ckpt, first.ckpt_n,
                        first.model, first.model_n, sc, procs, layers);
done:
    Py_XDECREF(procs);
    Py_XDECREF(layers);
    Py_XDECREF(seen);
    PyBuffer_Release(&buf);
    return out;
}

static PyMethodDef methods[] = {
    {"kv_run", kv_run, METH_VARARGS, "kv_run(data, start) -> kvrun.py's kv_run"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, .m_name = "_kvrun", .m_size = -1, .m_methods = methods,
};

PyMODINIT_FUNC PyInit__kvrun(void) { return PyModule_Create(&module); }
