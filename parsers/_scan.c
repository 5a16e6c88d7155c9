/* The chunk scanner's search for candidate records: one C pass over a chunk for all anchors.
 *
 * `candidates(data, pos, groups, quiet_ok)` returns what `scan.ChunkScanner._candidates_py`
 * returns for the same input: the records from `pos` that hold a needle of the mode, as sorted
 * (start, end, text) triples (the text decoded as UTF-8, errors replaced), and apart from them the quiet ones as runs between those (`scan.QuietRun`:
 * start of the first, count, end of the last, header time of the last). A record
 * is a maximal run of bytes without `\n` or `\r`. `groups` is the mode's plan: a tuple of
 * (anchor, needles or None, level) as scan.plan builds it. Both functions are kept equal by
 * tests/perf/test_scan_native.py; scan.py falls back to the Python one when this module is not
 * built.
 *
 * `count_records(data)` counts the records ended in `data`: every `\n`, and every `\r` not
 * followed by `\n`.
 *
 * `long_record(data, cap, cr)` is whether `data` holds a run of at least `cap` bytes with no
 * `\n` (nor `\r` when `cr`): a record that long, the unterminated end counted as one.
 *
 * `count_lines(data, start, end)` counts the `\n` in `data[start:end]` (sixteen bytes at a time:
 * several times faster than `bytes.count` of one byte, or memchr once per line).
 *
 * `nibbles(on)` turns the AVX2 search of a few anchors (`nibble_pass`) on or off, for the tests
 * that run both of its passes; it is on wherever the CPU has AVX2.
 *
 * `fill(cls, slots, values, *more)` is a new event of `cls` (a class of slotted fields, whose
 * instances `object.__new__` makes) with the slots (its member descriptors, in order) set to
 * `values` and then `more`, as `object.__setattr__` of each would set them; a load builds one
 * such event per record, and this is a third of the cost of that in Python (events.py's `filler`
 * is the Python equal).
 *
 * `prefixes(data, most)` lists the distinct process prefixes in `data`, as
 * `dict.fromkeys(lines._PREFIX_WHOLE.findall(data))` does (lines.ProcessNames, which holds the
 * Python equal), at most `most` of them.
 */
#define PY_SSIZE_T_CLEAN
#define _GNU_SOURCE
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    Py_ssize_t start;
    Py_ssize_t end;
    Py_ssize_t stamp; /* a quiet record's header time begins here; -1: not quiet; -2: a
                       * non-level needle hit it, a candidate whatever else does */
} Hit;

typedef struct {
    Hit *items;
    Py_ssize_t len;
    Py_ssize_t cap;
} Hits;

static int hits_push(Hits *h, Py_ssize_t start, Py_ssize_t end, Py_ssize_t stamp) {
    if (h->len == h->cap) {
        Py_ssize_t cap = h->cap ? h->cap * 2 : 64;
        Hit *items = PyMem_RawRealloc(h->items, (size_t)cap * sizeof(Hit));
        if (items == NULL) return -1;
        h->items = items;
        h->cap = cap;
    }
    h->items[h->len].start = start;
    h->items[h->len].end = end;
    h->items[h->len].stamp = stamp;
    h->len++;
    return 0;
}

static int by_start(const void *a, const void *b) {
    Py_ssize_t x = ((const Hit *)a)->start, y = ((const Hit *)b)->start;
    return (x > y) - (x < y);
}

static const char *find(const char *d, Py_ssize_t from, Py_ssize_t to, const char *needle,
                        Py_ssize_t len) {
    if (to - from < len) return NULL;
    return memmem(d + from, (size_t)(to - from), needle, (size_t)len);
}

/* -- the quiet header: scan._QUIET, matched by hand ------------------------------------------
 * Every repetition in that pattern is followed by a byte its class excludes, so matching
 * greedily and then checking the next byte is what the regex engine's backtracking amounts to. */

static int is_digit(unsigned char c) { return c >= '0' && c <= '9'; }
static int is_upper(unsigned char c) { return c >= 'A' && c <= 'Z'; }
static int is_alpha(unsigned char c) { return is_upper(c) || (c >= 'a' && c <= 'z'); }
static int is_name(unsigned char c) { return is_alpha(c) || is_digit(c) || c == '_' || c == '-'; }
static int is_hex(unsigned char c) {
    return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}
static int is_ip(unsigned char c) { return is_hex(c) || c == '.' || c == ':'; }
static int is_src(unsigned char c) { return c >= 0x21 && c <= 0x7e && c != 0x5d; }

/* Up to `most` bytes of a class from p; returns how many (0 when fewer than one). */
static Py_ssize_t run(const unsigned char *d, Py_ssize_t p, Py_ssize_t e, int (*cls)(unsigned char),
                      Py_ssize_t most) {
    Py_ssize_t k = 0;
    while (k < most && p + k < e && cls(d[p + k])) k++;
    return k;
}

static int lit(const unsigned char *d, Py_ssize_t p, Py_ssize_t e, const char *s) {
    Py_ssize_t n = (Py_ssize_t)strlen(s);
    return e - p >= n && memcmp(d + p, s, (size_t)n) == 0;
}

/* `(?:_?[A-Z]{1,8}[0-9]{1,6})`: returns the new position, or -1. */
static Py_ssize_t rank_word(const unsigned char *d, Py_ssize_t p, Py_ssize_t e) {
    Py_ssize_t k = run(d, p, e, is_upper, 8);
    if (k == 0) return -1;
    p += k;
    k = run(d, p, e, is_digit, 6);
    if (k == 0) return -1;
    return p + k;
}

/* The process prefix `\(NAME( rank=N)?( W1(_W2){0,7})? pid=N(, ip=X)?\) ?`: the position after
 * it, or -1 when there is none of that shape at p. */
static Py_ssize_t prefix(const unsigned char *d, Py_ssize_t p, Py_ssize_t e) {
    if (p >= e || d[p] != '(') return -1;
    p++;
    if (p >= e || !is_alpha(d[p])) return -1;
    p += 1 + run(d, p + 1, e, is_name, 63);
    if (lit(d, p, e, " rank=")) {
        Py_ssize_t k = run(d, p + 6, e, is_digit, 6);
        if (k == 0) return -1;
        p += 6 + k;
    }
    if (p + 1 < e && d[p] == ' ' && is_upper(d[p + 1])) {
        Py_ssize_t q = rank_word(d, p + 1, e);
        if (q < 0) return -1;
        for (int i = 0; i < 7 && q < e && d[q] == '_'; i++) {
            q = rank_word(d, q + 1, e);
            if (q < 0) return -1;
        }
        p = q;
    }
    if (!lit(d, p, e, " pid=")) return -1;
    Py_ssize_t k = run(d, p + 5, e, is_digit, 10);
    if (k == 0) return -1;
    p += 5 + k;
    if (lit(d, p, e, ", ip=")) {
        k = run(d, p + 5, e, is_ip, 64);
        if (k == 0) return -1;
        p += 5 + k;
    }
    if (p >= e || d[p] != ')') return -1;
    p++;
    if (p < e && d[p] == ' ') p++;
    return p;
}

/* Where the header time of a quiet record [s, e) begins, or -1 (see scan.quiet_record). */
static Py_ssize_t quiet_stamp(const unsigned char *d, Py_ssize_t s, Py_ssize_t e) {
    Py_ssize_t p = s;
    if (p < e && d[p] == '(') {
        p = prefix(d, p, e);
        if (p < 0) return -1;
    }
    if (lit(d, p, e, "INFO "))
        p += 5;
    else if (lit(d, p, e, "DEBUG "))
        p += 6;
    else
        return -1;
    Py_ssize_t stamp = p;
    static const char shape[] = "00-00 00:00:00";
    if (e - p < 14) return -1;
    for (int i = 0; i < 14; i++) {
        unsigned char c = d[p + i];
        if (shape[i] == '0' ? !is_digit(c) : c != (unsigned char)shape[i]) return -1;
    }
    p += 14;
    if (p < e && (d[p] == '.' || d[p] == ',')) {
        Py_ssize_t k = run(d, p + 1, e, is_digit, 6);
        if (k == 0) return -1;
        p += 1 + k;
    }
    if (!lit(d, p, e, " [")) return -1;
    p += 2;
    Py_ssize_t k = run(d, p, e, is_src, 200);
    if (k == 0) return -1;
    p += k;
    if (p >= e || d[p] != ']') return -1;
    /* the checks scan.quiet_record adds: no second process prefix, no colour codes. Each looks
     * for one byte with memchr (a record is short: memmem's set-up would cost more) */
    if (memchr(d + s, 0x1b, (size_t)(e - s))) return -1;
    for (const unsigned char *m = d + s + 1; (m = memchr(m, 'm', (size_t)(d + e - m))); m++)
        if (m[-1] == '0' || m[-1] == '6') return -1;
    for (const unsigned char *q = d + stamp + 4; (q = memchr(q, '=', (size_t)(d + e - q))); q++)
        if (memcmp(q - 4, " pid", 4) == 0) return -1;
    return stamp;
}

/* -- candidates -------------------------------------------------------------------------------- */

typedef struct {
    const char *anchor;
    Py_ssize_t anchor_len;
    const char **needles; /* NULL: the anchor is the needle */
    Py_ssize_t *lens;
    Py_ssize_t count;
    int level;
} Group;

static void free_groups(Group *groups, Py_ssize_t n) {
    if (groups == NULL) return;
    for (Py_ssize_t g = 0; g < n; g++) {
        PyMem_Free((void *)groups[g].needles);
        PyMem_Free(groups[g].lens);
    }
    PyMem_Free(groups);
}

static int record_bounds(const char *d, Py_ssize_t n, Py_ssize_t i, Py_ssize_t len, int cr,
                         Py_ssize_t *s_out, Py_ssize_t *e_out) {
    const char *lf = memrchr(d, '\n', (size_t)i);
    Py_ssize_t s = lf ? lf - d + 1 : 0;
    const char *nl = memchr(d + i + len, '\n', (size_t)(n - i - len));
    Py_ssize_t e = nl ? nl - d : n;
    if (cr) {
        const char *c = memrchr(d + s, '\r', (size_t)(i - s));
        if (c) s = c - d + 1;
        c = memchr(d + i, '\r', (size_t)(e - i));
        if (c) e = c - d;
    }
    *s_out = s;
    *e_out = e;
    return 0;
}

/* The record [s, e) holds group gr's anchor: note it when it holds one of the group's needles.
 * `stamp` caches the record's quiet_stamp (-3: not computed yet). Returns 1 when the record is
 * now a candidate whatever else it holds (nothing more in it can change the result), 0 when
 * not yet, -1 when out of memory. */
static int check(const char *d, Py_ssize_t s, Py_ssize_t e, const Group *gr, Py_ssize_t *stamp,
                 Hits *hits) {
    int hit = gr->needles == NULL;
    for (Py_ssize_t k = 0; !hit && k < gr->count; k++)
        hit = find(d, s, e, gr->needles[k], gr->lens[k]) != NULL;
    if (!hit) return 0;
    if (!gr->level) /* -2: a non-level needle hit it, so it is a candidate whatever else does */
        return hits_push(hits, s, e, -2) < 0 ? -1 : 1;
    if (*stamp == -3) *stamp = quiet_stamp((const unsigned char *)d, s, e);
    if (hits_push(hits, s, e, *stamp) < 0) return -1;
    return *stamp < 0; /* not quiet: a candidate whatever else it holds */
}

static inline uint32_t hash_bits(uint32_t x) { return (x * 0x9E3779B1u) >> 16; }

/* The state of one pass: the anchors' first four bytes, and the record of the last hit with the
 * groups checked in it and its quiet_stamp (-3: not computed yet). */
typedef struct {
    const char *d;
    Py_ssize_t n, pos;
    int cr;
    const Group *groups;
    Py_ssize_t ngroups;
    Hits *hits;
    uint32_t first[64];
    Py_ssize_t rs, re, stamp;
    uint64_t done;
    Py_ssize_t skip; /* a candidate whatever else it holds ends before here: look on from it */
} Pass;

/* Does an anchor start at `st`? Each group that has one there is checked once per record. */
static int at(Pass *p, Py_ssize_t st) {
    if (st < p->pos || st + 4 > p->n) return 0;
    uint32_t x;
    memcpy(&x, p->d + st, 4);
    for (Py_ssize_t g = 0; g < p->ngroups; g++) {
        const Group *gr = &p->groups[g];
        if (gr->anchor_len < 4 || p->first[g] != x || st + gr->anchor_len > p->n ||
            memcmp(p->d + st + 4, gr->anchor + 4, (size_t)(gr->anchor_len - 4)) != 0)
            continue;
        if (st >= p->re) { /* past the last record: a new one (an anchor holds no terminator) */
            record_bounds(p->d, p->n, st, gr->anchor_len, p->cr, &p->rs, &p->re);
            p->done = 0;
            p->stamp = -3;
        }
        if (p->done & (1ull << g)) continue;
        p->done |= 1ull << g;
        int decided = check(p->d, p->rs, p->re, gr, &p->stamp, p->hits);
        if (decided < 0) return -1;
        if (decided) {
            p->skip = p->re + 1;
            return 0;
        }
    }
    return 0;
}

#define BIT(table, x) ((table[hash_bits(x) >> 6] >> (hash_bits(x) & 63)) & 1)

/* -- the pair pass: 16 bytes at a time --------------------------------------------------------
 * Each anchor is looked for by two adjacent bytes of it: of its pairs, the one least seen in the
 * data's first bytes (a serving log's `None` and `True` make `No` and `Tr` poor choices, which no
 * fixed choice would know). Sixteen positions are compared with every pair at once, in the
 * compiler's portable vectors (SSE2 on x86-64, NEON on arm64), and only a position where a pair
 * matches is looked at (`at`, for the anchor that pair stands for). With few anchors (a serving
 * log's 9) most blocks of a log hold no pair: about twice as fast as hashing their first bytes
 * (one_pass). With many (a start's 36) pairs match too often, and hashing is faster. */

#if defined(__GNUC__) || defined(__clang__)
#define PAIR_PASS 1
typedef unsigned char v16 __attribute__((vector_size(16)));
#else
#define PAIR_PASS 0
#endif
#define MOST_PAIRS 16
#define SAMPLE_BYTES 1024 /* the first bytes of the data, where pairs are counted */

#if PAIR_PASS
/* Bit q set where lane q of a comparison's result is set. */
static inline unsigned lanes(v16 hit) {
#if defined(__SSE2__)
    return (unsigned)__builtin_ia32_pmovmskb128((__attribute__((vector_size(16))) char)hit);
#else
    unsigned char bytes[16];
    unsigned mask = 0;
    memcpy(bytes, &hit, 16);
    for (int q = 0; q < 16; q++) mask |= (unsigned)(bytes[q] != 0) << q;
    return mask;
#endif
}
#endif

/* The offset in each of `n` anchors (`lens[a]` bytes; shorter than two: left out, offset 0) of
 * its pair least seen in `sample`, the first bytes of the data (a log repeats its shapes, so what
 * is rare there is rare on; ties go to the first pair). Every pair of every anchor is counted
 * there through a small open-addressed table of them. */
#define PAIR_SLOTS 4096 /* a power of two, well over the pairs of 16 anchors */
static uint32_t pair_slot(const uint16_t *keys, unsigned v) {
    uint32_t h = hash_bits(v) & (PAIR_SLOTS - 1);
    while (keys[h] && keys[h] != v + 1) h = (h + 1) & (PAIR_SLOTS - 1);
    return h;
}

static unsigned pair_at(const char *s, Py_ssize_t k) {
    return (unsigned char)s[k] << 8 | (unsigned char)s[k + 1];
}

static void rarest_pairs(const char *const *anchors, const Py_ssize_t *lens, Py_ssize_t n,
                         const char *sample, Py_ssize_t len, Py_ssize_t *off) {
    uint16_t keys[PAIR_SLOTS]; /* 1 + the pair; 0: empty. (1 + 0xFFFF does not fit: that pair,
                                * two 0xFF bytes, is not counted; the choice only decides speed) */
    uint32_t count[PAIR_SLOTS];
    memset(keys, 0, sizeof keys);
    int pairs = 0;
    for (Py_ssize_t a = 0; a < n; a++) {
        for (Py_ssize_t k = 0; k + 1 < lens[a]; k++) {
            unsigned v = pair_at(anchors[a], k);
            if (v == 0xFFFF || pairs >= PAIR_SLOTS / 2) continue;
            uint32_t h = pair_slot(keys, v);
            if (!keys[h]) keys[h] = (uint16_t)(v + 1), count[h] = 0, pairs++;
        }
    }
    for (Py_ssize_t i = 0; i + 1 < len; i++) {
        unsigned v = pair_at(sample, i);
        uint32_t h = hash_bits(v) & (PAIR_SLOTS - 1);
        if (keys[h] == v + 1 || (keys[h] && keys[(h = pair_slot(keys, v))])) count[h]++;
    }
    for (Py_ssize_t a = 0; a < n; a++) {
        off[a] = 0;
        uint32_t best = UINT32_MAX;
        for (Py_ssize_t k = 0; k + 1 < lens[a]; k++) {
            unsigned v = pair_at(anchors[a], k);
            uint32_t h = v == 0xFFFF ? 0 : pair_slot(keys, v);
            if (v != 0xFFFF && keys[h] && count[h] < best) best = count[h], off[a] = k;
        }
    }
}

#if PAIR_PASS
/* The anchors found through a pair at position j (the pair of group g at offset off[g]). */
static int at_pair(Pass *p, Py_ssize_t j, const Py_ssize_t *off) {
    for (Py_ssize_t g = 0; g < p->ngroups; g++) {
        const Group *gr = &p->groups[g];
        if (gr->anchor_len < 4 || j < off[g]) continue;
        if (p->d[j] != gr->anchor[off[g]] || p->d[j + 1] != gr->anchor[off[g] + 1]) continue;
        if (at(p, j - off[g]) < 0) return -1;
        if (p->skip > j) return 0;
    }
    return 0;
}

/* The positions a block's `mask` marks (bit q: position j + q), each looked at by `at_pair` in
 * order: where the search goes on (`next`, or past a record found a candidate whatever else it
 * holds), or -1 (out of memory). */
static Py_ssize_t at_mask(Pass *p, Py_ssize_t j, unsigned mask, Py_ssize_t next,
                          const Py_ssize_t *off) {
    for (; mask; mask &= mask - 1) {
        int q = __builtin_ctz(mask);
        if (at_pair(p, j + q, off) < 0) return -1;
        if (p->skip > j + q) return p->skip;
    }
    return next;
}

/* The positions from `j` on, fewer than a block, one at a time. */
static int at_tail(Pass *p, Py_ssize_t j, const Py_ssize_t *off) {
    for (; j + 1 < p->n; j++) {
        if (at_pair(p, j, off) < 0) return -1;
        if (p->skip > j + 1) j = p->skip - 1;
    }
    return 0;
}
#endif

/* -- the nibble pass: 32 bytes at a time, where the CPU has AVX2 --------------------------------
 * The pair pass's question asked of all pairs at once. Each pair is one of eight buckets (a bit
 * of a byte; pairs past the eighth share them), and four tables of sixteen bytes give, for each
 * value of a nibble, the buckets whose pair's first (second) byte has that low (high) nibble.
 * Looking up the four nibbles of two adjacent bytes (a byte shuffle each) and ANDing the results
 * leaves at each position the buckets whose pair may start there: exactly those pairs when a
 * bucket holds one pair; with more, some positions only look like one, and `at_pair` tells. Its
 * cost does not grow with the pairs: on a serving log's nine, a third less than the pair pass. */
#if PAIR_PASS && defined(__x86_64__)
#include <immintrin.h>
#define NIBBLE_PASS 1
static int nibbles_on = -1; /* -1: ask the CPU once; `nibbles()` sets it for the tests */

static int has_avx2(void) {
    __builtin_cpu_init(); /* (what a constructor did already, unless this runs before them) */
    return __builtin_cpu_supports("avx2") != 0;
}

__attribute__((target("avx2"))) static int nibble_pass(Pass *p, const Py_ssize_t *off,
                                                       const unsigned char *first,
                                                       const unsigned char *second, int pairs) {
    unsigned char t[4][32]; /* each table twice: a shuffle looks up within each 16-byte half */
    memset(t, 0, sizeof t);
    for (int k = 0; k < pairs; k++) {
        unsigned char bit = (unsigned char)(1u << (k & 7));
        for (int half = 0; half < 32; half += 16) {
            t[0][half + (first[k] & 15)] |= bit;
            t[1][half + (first[k] >> 4)] |= bit;
            t[2][half + (second[k] & 15)] |= bit;
            t[3][half + (second[k] >> 4)] |= bit;
        }
    }
    __m256i lo1 = _mm256_loadu_si256((const __m256i *)t[0]);
    __m256i hi1 = _mm256_loadu_si256((const __m256i *)t[1]);
    __m256i lo2 = _mm256_loadu_si256((const __m256i *)t[2]);
    __m256i hi2 = _mm256_loadu_si256((const __m256i *)t[3]);
    __m256i low = _mm256_set1_epi8(15), zero = _mm256_setzero_si256();
    const char *d = p->d;
    Py_ssize_t n = p->n, j = p->pos;
    while (j + 33 <= n) {
        __m256i x = _mm256_loadu_si256((const __m256i *)(d + j));
        __m256i y = _mm256_loadu_si256((const __m256i *)(d + j + 1));
        __m256i a = _mm256_and_si256(
            _mm256_shuffle_epi8(lo1, _mm256_and_si256(x, low)),
            _mm256_shuffle_epi8(hi1, _mm256_and_si256(_mm256_srli_epi16(x, 4), low)));
        __m256i b = _mm256_and_si256(
            _mm256_shuffle_epi8(lo2, _mm256_and_si256(y, low)),
            _mm256_shuffle_epi8(hi2, _mm256_and_si256(_mm256_srli_epi16(y, 4), low)));
        unsigned mask =
            ~(unsigned)_mm256_movemask_epi8(_mm256_cmpeq_epi8(_mm256_and_si256(a, b), zero));
        j = mask ? at_mask(p, j, mask, j + 32, off) : j + 32;
        if (j < 0) return -1;
    }
    return at_tail(p, j, off);
}
#else
#define NIBBLE_PASS 0
#endif

/* one_pass by pairs, for at most MOST_PAIRS anchors; returns 0 (done), -1 (out of memory), 1
 * (not taken: no vectors with this compiler). */
static int pair_pass(Pass *p) {
#if PAIR_PASS
    Py_ssize_t off[64];
    unsigned char first[MOST_PAIRS], second[MOST_PAIRS];
    int pairs = 0;
    const char *anchors[64];
    Py_ssize_t lens[64];
    for (Py_ssize_t g = 0; g < p->ngroups; g++) {
        anchors[g] = p->groups[g].anchor;
        lens[g] = p->groups[g].anchor_len >= 4 ? p->groups[g].anchor_len : 0;
    }
    Py_ssize_t sample = p->n - p->pos < SAMPLE_BYTES ? p->n - p->pos : SAMPLE_BYTES;
    rarest_pairs(anchors, lens, p->ngroups, p->d + p->pos, sample, off);
    for (Py_ssize_t g = 0; g < p->ngroups; g++) {
        const Group *gr = &p->groups[g];
        if (gr->anchor_len < 4) continue;
        unsigned char a = (unsigned char)gr->anchor[off[g]], b = (unsigned char)gr->anchor[off[g] + 1];
        int known = 0;
        for (int k = 0; k < pairs && !known; k++) known = first[k] == a && second[k] == b;
        if (known) continue;
        first[pairs] = a, second[pairs] = b, pairs++;
    }
#if NIBBLE_PASS
    if (nibbles_on < 0) nibbles_on = has_avx2();
    if (nibbles_on) return nibble_pass(p, off, first, second, pairs);
#endif
    v16 va[MOST_PAIRS], vb[MOST_PAIRS];
    for (int k = 0; k < pairs; k++) {
        for (int q = 0; q < 16; q++) va[k][q] = first[k], vb[k][q] = second[k];
    }
    const char *d = p->d;
    Py_ssize_t n = p->n, j = p->pos;
    while (j + 17 <= n) {
        v16 x, y, hit = {0};
        memcpy(&x, d + j, 16);
        memcpy(&y, d + j + 1, 16);
        for (int k = 0; k < pairs; k++) hit |= (v16)(x == va[k]) & (v16)(y == vb[k]);
        uint64_t halves[2];
        memcpy(halves, &hit, 16);
        j = halves[0] | halves[1] ? at_mask(p, j, lanes(hit), j + 16, off) : j + 16;
        if (j < 0) return -1;
    }
    return at_tail(p, j, off);
#else
    (void)p;
    return 1;
#endif
}

/* The first position from `from` where the bytes a, b stand side by side, or -1: sixteen
 * positions at a time, as the pair pass compares them. */
static Py_ssize_t find_pair(const char *d, Py_ssize_t from, Py_ssize_t n, unsigned char a,
                            unsigned char b) {
#if PAIR_PASS
    v16 va, vb;
    for (int q = 0; q < 16; q++) va[q] = a, vb[q] = b;
    for (; from + 17 <= n; from += 16) {
        v16 x, y;
        memcpy(&x, d + from, 16);
        memcpy(&y, d + from + 1, 16);
        unsigned mask = lanes((v16)(x == va) & (v16)(y == vb));
        if (mask) return from + __builtin_ctz(mask);
    }
#endif
    for (; from + 1 < n; from++)
        if ((unsigned char)d[from] == a && (unsigned char)d[from + 1] == b) return from;
    return -1;
}

/* one_pass reads the bytes at i + q as the low bits of an 8-byte load shifted by 8 * q, which
 * holds on little-endian machines (x86-64, arm64); elsewhere each anchor gets a memmem pass. */
static int one_pass_takes(Py_ssize_t ngroups) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    return ngroups <= 64;
#else
    (void)ngroups;
    return 0;
#endif
}

/* Every anchor of four bytes or more (of at most 64 groups) in one pass over data[pos:]. With
 * few anchors (a serving log's 9) that is the pair pass above. With many (a start's 36) pairs
 * would match too often: bytes are hashed into a 64 Kbit table built from the anchors' first four
 * bytes, and only positions whose bit is set are compared; eight bytes are loaded at a time and
 * one branch tests four positions. On the benchmarks' logs this is two to three times faster
 * than one memmem pass per anchor. Once a record is a candidate whatever else it holds (a needle
 * other than a level word, or a level word in a record that is not quiet), the rest of it is not
 * looked at: in a log where nearly every record is a candidate (a load's per-layer warnings)
 * that is most of the bytes. */
static int one_pass(const char *d, Py_ssize_t n, Py_ssize_t pos, int cr, const Group *groups,
                    Py_ssize_t ngroups, Hits *hits) {
    if (!one_pass_takes(ngroups)) return 0;
    Pass p = {d, n, pos, cr, groups, ngroups, hits, {0}, -1, -1, -3, 0, 0};
    uint64_t bits[1024];
    memset(bits, 0, sizeof bits);
    Py_ssize_t anchors = 0;
    for (Py_ssize_t g = 0; g < ngroups; g++) {
        if (groups[g].anchor_len < 4) continue;
        anchors++;
        memcpy(&p.first[g], groups[g].anchor, 4);
        uint32_t x;
        memcpy(&x, groups[g].anchor, 4);
        uint32_t h = hash_bits(x);
        bits[h >> 6] |= 1ull << (h & 63);
    }
    if (anchors == 0) return 0;
    if (anchors <= MOST_PAIRS) {
        int taken = pair_pass(&p);
        if (taken <= 0) return taken;
    }
    Py_ssize_t i = pos;
    for (; i + 8 <= n;) {
        uint64_t x;
        memcpy(&x, d + i, 8);
        Py_ssize_t next = i + 4;
        if (BIT(bits, (uint32_t)x) | BIT(bits, (uint32_t)(x >> 8)) |
            BIT(bits, (uint32_t)(x >> 16)) | BIT(bits, (uint32_t)(x >> 24))) {
            for (int q = 0; q < 4; q++) {
                if (BIT(bits, (uint32_t)(x >> (8 * q))) && at(&p, i + q) < 0) return -1;
                if (p.skip > i + q) {
                    next = p.skip;
                    break;
                }
            }
        }
        i = next;
    }
    for (; i < n; i++)
        if (at(&p, i) < 0) return -1;
    return 0;
}

/* A candidate record as the scanner takes it: (start, end, its text as
   `bytes.decode("utf-8", "replace")` gives it). Made directly: Py_BuildValue would read its
   format string again for each of a chunk's thousands of candidates. */
static PyObject *candidate(const char *d, Py_ssize_t s, Py_ssize_t e)
{
    PyObject *item = PyTuple_New(3);
    if (item == NULL) return NULL;
    PyObject *start = PyLong_FromSsize_t(s), *end = PyLong_FromSsize_t(e);
    PyObject *text = PyUnicode_DecodeUTF8(d + s, e - s, "replace");
    /* (a NULL slot is fine for Py_DECREF of the tuple: tupledealloc skips it) */
    PyTuple_SET_ITEM(item, 0, start);
    PyTuple_SET_ITEM(item, 1, end);
    PyTuple_SET_ITEM(item, 2, text);
    if (start == NULL || end == NULL || text == NULL) {
        Py_DECREF(item);
        return NULL;
    }
    return item;
}

static PyObject *candidates(PyObject *self, PyObject *args) {
    Py_buffer buf;
    Py_ssize_t pos;
    PyObject *groups_obj;
    int quiet_ok;
    if (!PyArg_ParseTuple(args, "y*nO!p", &buf, &pos, &PyTuple_Type, &groups_obj, &quiet_ok))
        return NULL;
    const char *d = buf.buf;
    Py_ssize_t n = buf.len;
    PyObject *found = NULL, *quiet = NULL, *result = NULL;
    Hits hits = {NULL, 0, 0};
    Py_ssize_t ngroups = PyTuple_GET_SIZE(groups_obj);
    Group *groups = PyMem_Calloc((size_t)(ngroups ? ngroups : 1), sizeof(Group));
    if (groups == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t g = 0; g < ngroups; g++) {
        PyObject *t = PyTuple_GET_ITEM(groups_obj, g);
        if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 3 ||
            !PyBytes_Check(PyTuple_GET_ITEM(t, 0)) || PyBytes_GET_SIZE(PyTuple_GET_ITEM(t, 0)) == 0) {
            PyErr_SetString(PyExc_TypeError, "groups: (anchor, needles | None, level) tuples");
            goto done;
        }
        PyObject *needles = PyTuple_GET_ITEM(t, 1);
        if (needles != Py_None) {
            if (!PyTuple_Check(needles)) {
                PyErr_SetString(PyExc_TypeError, "groups: needles must be a tuple of bytes");
                goto done;
            }
            for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(needles); k++) {
                if (!PyBytes_Check(PyTuple_GET_ITEM(needles, k))) {
                    PyErr_SetString(PyExc_TypeError, "groups: needles must be a tuple of bytes");
                    goto done;
                }
            }
        }
        groups[g].anchor = PyBytes_AS_STRING(PyTuple_GET_ITEM(t, 0));
        groups[g].anchor_len = PyBytes_GET_SIZE(PyTuple_GET_ITEM(t, 0));
        if (needles != Py_None) {
            Py_ssize_t count = PyTuple_GET_SIZE(needles);
            groups[g].needles = PyMem_Calloc((size_t)count + 1, sizeof(char *));
            groups[g].lens = PyMem_Calloc((size_t)count + 1, sizeof(Py_ssize_t));
            if (groups[g].needles == NULL || groups[g].lens == NULL) {
                PyErr_NoMemory();
                goto done;
            }
            for (Py_ssize_t k = 0; k < count; k++) {
                groups[g].needles[k] = PyBytes_AS_STRING(PyTuple_GET_ITEM(needles, k));
                groups[g].lens[k] = PyBytes_GET_SIZE(PyTuple_GET_ITEM(needles, k));
            }
            groups[g].count = count;
        }
        int level = PyObject_IsTrue(PyTuple_GET_ITEM(t, 2));
        if (level < 0) goto done;
        groups[g].level = quiet_ok && level;
    }
    if (pos < 0) pos = 0;
    int cr = pos < n && memchr(d, '\r', (size_t)n) != NULL;

    int failed = 0;
    Py_BEGIN_ALLOW_THREADS /* plain bytes from here: the daemon's other threads go on */
    failed = one_pass(d, n, pos, cr, groups, ngroups, &hits) < 0;
    for (Py_ssize_t g = 0; g < ngroups && !failed; g++) {
        if (groups[g].anchor_len >= 4 && one_pass_takes(ngroups)) continue; /* one_pass did */
        const Group *gr = &groups[g];
        const char *at = find(d, pos, n, gr->anchor, gr->anchor_len);
        while (at) {
            Py_ssize_t s, e;
            record_bounds(d, n, at - d, gr->anchor_len, cr, &s, &e);
            Py_ssize_t stamp = -3;
            if (check(d, s, e, gr, &stamp, &hits) < 0) {
                failed = 1;
                break;
            }
            at = find(d, e + 1, n, gr->anchor, gr->anchor_len);
        }
    }
    if (!failed) qsort(hits.items, (size_t)hits.len, sizeof(Hit), by_start);
    Py_END_ALLOW_THREADS
    if (failed) {
        PyErr_NoMemory();
        goto done;
    }
    found = PyList_New(0);
    quiet = PyList_New(0);
    if (found == NULL || quiet == NULL) goto done;
    /* the open run of quiet records: its first start, count, last end and header time */
    Py_ssize_t run_first = -1, run_count = 0, run_end = 0, run_stamp = 0;
    for (Py_ssize_t k = 0; k <= hits.len;) {
        Py_ssize_t s = -1, e = 0, stamp = -2;
        if (k < hits.len) {
            s = hits.items[k].start, e = hits.items[k].end, stamp = hits.items[k].stamp;
            for (k++; k < hits.len && hits.items[k].start == s; k++) {
                if (hits.items[k].stamp == -2) stamp = -2;
            }
        } else {
            k++; /* past the end: close the open run */
        }
        if (stamp >= 0) {
            if (run_count == 0) run_first = s;
            run_count++, run_end = e, run_stamp = stamp;
            continue;
        }
        if (run_count) {
            PyObject *run = Py_BuildValue("(nnny#)", run_first, run_count, run_end, d + run_stamp,
                                          (Py_ssize_t)14);
            int rc = run == NULL ? -1 : PyList_Append(quiet, run);
            Py_XDECREF(run);
            if (rc < 0) goto done;
            run_count = 0;
        }
        if (s < 0) continue;
        PyObject *item = candidate(d, s, e);
        int rc = item == NULL ? -1 : PyList_Append(found, item);
        Py_XDECREF(item);
        if (rc < 0) goto done;
    }
    result = PyTuple_Pack(2, found, quiet);
done:
    Py_XDECREF(found);
    Py_XDECREF(quiet);
    PyMem_RawFree(hits.items);
    free_groups(groups, ngroups);
    PyBuffer_Release(&buf);
    return result;
}

/* The bytes equal to `c` in d[0:n]. A log line is short, so memchr once per line is mostly the
 * cost of its call: sixteen bytes are compared at a time instead (each lane of `acc` counts up to
 * 255 matches before it is added up). */
static Py_ssize_t count_byte(const unsigned char *d, Py_ssize_t n, unsigned char c) {
    Py_ssize_t count = 0, i = 0;
#if PAIR_PASS
    v16 want;
    memset(&want, c, sizeof want);
    while (n - i >= 16) {
        Py_ssize_t blocks = (n - i) / 16;
        if (blocks > 255) blocks = 255;
        v16 acc = {0};
        for (Py_ssize_t b = 0; b < blocks; b++, i += 16) {
            v16 x;
            memcpy(&x, d + i, 16);
            acc -= (v16)(x == want); /* a match is all ones: minus it adds one */
        }
        for (int q = 0; q < 16; q++) count += acc[q];
    }
#endif
    for (; i < n; i++) count += d[i] == c;
    return count;
}

static PyObject *count_records(PyObject *self, PyObject *arg) {
    Py_buffer buf;
    if (PyObject_GetBuffer(arg, &buf, PyBUF_SIMPLE) < 0) return NULL;
    const char *d = buf.buf, *end = d + buf.len, *p;
    Py_ssize_t count = count_byte(buf.buf, buf.len, '\n');
    for (p = d; (p = memchr(p, '\r', (size_t)(end - p))) != NULL; p++) {
        if (p + 1 == end || p[1] != '\n') count++;
    }
    PyBuffer_Release(&buf);
    return PyLong_FromSsize_t(count);
}

/* Whether `data` holds a run of at least `cap` bytes with no `\n` (nor `\r` when `cr`): a
 * record that long, an unterminated end counted as one. Each window of `cap` bytes from the
 * start of a record is looked at from its end back to its last terminator, where the next
 * window starts: with short lines a few bytes are read per window, not every line's end.
 * (A window whose last terminator is near its start leaves a next window with none but near its
 * end, so no byte is read more than twice.) */
static PyObject *long_record(PyObject *self, PyObject *args) {
    Py_buffer buf;
    Py_ssize_t cap;
    int cr;
    if (!PyArg_ParseTuple(args, "y*np", &buf, &cap, &cr)) return NULL;
    const unsigned char *d = buf.buf;
    Py_ssize_t n = buf.len, start = 0;
    int found = cap <= 0;
    while (!found && n - start >= cap) {
        Py_ssize_t t = start + cap - 1;
        while (t >= start && d[t] != '\n' && !(cr && d[t] == '\r')) t--;
        if (t < start) {
            found = 1;
        } else {
            start = t + 1;
        }
    }
    PyBuffer_Release(&buf);
    return PyBool_FromLong(found);
}

static PyObject *count_lines(PyObject *self, PyObject *args) {
    Py_buffer buf;
    Py_ssize_t start, end;
    if (!PyArg_ParseTuple(args, "y*nn", &buf, &start, &end)) return NULL;
    if (start < 0) start = 0;
    if (end > buf.len) end = buf.len;
    Py_ssize_t count = 0;
    if (start < end) count = count_byte((const unsigned char *)buf.buf + start, end - start, '\n');
    PyBuffer_Release(&buf);
    return PyLong_FromSsize_t(count);
}

/* -- prefixes ---------------------------------------------------------------------------------
 * Every prefix holds one " pid=" and no '(' after its first byte, and no two overlap: each one is
 * found from its " pid=" (memmem), back to the nearest '(', and read there by `prefix`. A log
 * repeats a few prefixes on nearly every line, so the bytes around a " pid=" are first compared
 * with the last few prefixes found (no parse, no Python object for those). */

#define PREFIX_BACK 256 /* a prefix's '(' stands at most this far before its " pid=" */
#define RECENT 16

typedef struct {
    Py_ssize_t start, len, marker; /* the prefix's bytes, its " pid=" at `marker` in them */
} Seen;

static PyObject *prefixes(PyObject *self, PyObject *args) {
    Py_buffer buf;
    Py_ssize_t most;
    if (!PyArg_ParseTuple(args, "y*n", &buf, &most)) return NULL;
    const unsigned char *d = buf.buf;
    Py_ssize_t n = buf.len;
    PyObject *out = PyList_New(0), *distinct = PySet_New(NULL), *result = NULL;
    if (out == NULL || distinct == NULL) goto done;
    Seen recent[RECENT];
    int nrecent = 0, next = 0;
    /* " pid=" is looked for by its pair least seen in the first bytes (find_pair), then checked */
    static const char marker[] = " pid=";
    const char *anchors[1] = {marker};
    Py_ssize_t lens[1] = {5}, off;
    rarest_pairs(anchors, lens, 1, (const char *)d, n < SAMPLE_BYTES ? n : SAMPLE_BYTES, &off);
    for (Py_ssize_t j = find_pair((const char *)d, off, n, marker[off], marker[off + 1]);
         j >= 0 && PyList_GET_SIZE(out) < most;) {
        Py_ssize_t i = j - off;
        if (i + 5 > n || memcmp(d + i, marker, 5) != 0) {
            j = find_pair((const char *)d, j + 1, n, marker[off], marker[off + 1]);
            continue;
        }
        j = find_pair((const char *)d, i + 5 + off, n, marker[off], marker[off + 1]);
        int known = 0;
        for (int r = 0; r < nrecent && !known; r++) {
            Py_ssize_t o = i - recent[r].marker;
            known = o >= 0 && o + recent[r].len <= n &&
                    memcmp(d + o, d + recent[r].start, (size_t)recent[r].len) == 0;
        }
        if (known) continue;
        Py_ssize_t lo = i > PREFIX_BACK ? i - PREFIX_BACK : 0, o = i - 1;
        while (o >= lo && d[o] != '(' && d[o] != '\n' && d[o] != '\r') o--;
        if (o < lo || d[o] != '(') continue;
        Py_ssize_t e = prefix(d, o, n);
        if (e <= i) continue; /* none there, or one that ends before this " pid=" */
        if (d[e - 1] == ' ') e--; /* (`prefix` takes the space after it) */
        recent[next] = (Seen){o, e - o, i - o};
        next = (next + 1) % RECENT;
        if (nrecent < RECENT) nrecent++;
        PyObject *b = PyBytes_FromStringAndSize((const char *)d + o, e - o);
        if (b == NULL) goto done;
        int had = PySet_Contains(distinct, b);
        int rc = had < 0 ? -1 : had ? 0 : (PySet_Add(distinct, b) < 0 ? -1 : PyList_Append(out, b));
        Py_DECREF(b);
        if (rc < 0) goto done;
    }
    result = out;
    out = NULL;
done:
    Py_XDECREF(out);
    Py_XDECREF(distinct);
    PyBuffer_Release(&buf);
    return result;
}

static PyObject *fill(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs < 3 || !PyType_Check(args[0]) || !PyTuple_Check(args[1]) || !PyTuple_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "fill(cls, slots, values, *more): a class, two tuples");
        return NULL;
    }
    PyTypeObject *cls = (PyTypeObject *)args[0];
    PyObject *slots = args[1], *values = args[2];
    Py_ssize_t nv = PyTuple_GET_SIZE(values), ns = PyTuple_GET_SIZE(slots);
    if (ns != nv + nargs - 3) {
        PyErr_SetString(PyExc_TypeError, "fill: as many slots as values");
        return NULL;
    }
    /* a class statement's class that object.__new__ makes: what `object.__new__(cls)` is */
    if (!(cls->tp_flags & Py_TPFLAGS_HEAPTYPE) || cls->tp_new != PyBaseObject_Type.tp_new) {
        PyErr_SetString(PyExc_TypeError, "fill: a class that object.__new__ makes");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < ns; i++) {
        if (!Py_IS_TYPE(PyTuple_GET_ITEM(slots, i), &PyMemberDescr_Type)) {
            PyErr_SetString(PyExc_TypeError, "fill: slots are member descriptors");
            return NULL;
        }
    }
    PyObject *obj = cls->tp_alloc(cls, 0);
    if (obj == NULL) return NULL;
    for (Py_ssize_t i = 0; i < ns; i++) {
        PyObject *slot = PyTuple_GET_ITEM(slots, i);
        PyObject *value = i < nv ? PyTuple_GET_ITEM(values, i) : args[3 + i - nv];
        /* (the descriptor checks that `obj` is of its class) */
        if (Py_TYPE(slot)->tp_descr_set(slot, obj, value) < 0) {
            Py_DECREF(obj);
            return NULL;
        }
    }
    return obj;
}

/* nibbles(on): whether the nibble pass is taken where the CPU has AVX2 (the tests run both
 * passes); returns whether it was before, or None where it is not built. */
static PyObject *nibbles(PyObject *self, PyObject *on) {
#if NIBBLE_PASS
    if (nibbles_on < 0) nibbles_on = has_avx2();
    int was = nibbles_on;
    int want = PyObject_IsTrue(on);
    if (want < 0) return NULL;
    nibbles_on = want && has_avx2();
    return PyBool_FromLong(was);
#else
    (void)on;
    Py_RETURN_NONE;
#endif
}

static PyMethodDef methods[] = {
    {"candidates", candidates, METH_VARARGS,
     "candidates(data, pos, groups, quiet_ok) -> ([(start, end)], [(first, count, end, time)])"},
    {"fill", (PyCFunction)(void (*)(void))fill, METH_FASTCALL,
     "fill(cls, slots, values, *more) -> a new cls, its slots set to values then more"},
    {"nibbles", nibbles, METH_O, "nibbles(on) -> whether the AVX2 nibble pass was on"},
    {"count_records", count_records, METH_O, "count_records(data) -> records ended in data"},
    {"long_record", long_record, METH_VARARGS, "long_record(data, cap, cr) -> a record >= cap"},
    {"count_lines", count_lines, METH_VARARGS, "count_lines(data, start, end) -> newlines"},
    {"prefixes", prefixes, METH_VARARGS, "prefixes(data, most) -> distinct process prefixes"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, .m_name = "_scan", .m_size = -1, .m_methods = methods,
};

PyMODINIT_FUNC PyInit__scan(void) { return PyModule_Create(&module); }
