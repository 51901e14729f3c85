/*
 * knn_coexpr.c: bicor's transform and the pairwise-complete search
 * (knn_coexpr.h).
 *
 * Every node is first scaled by a power of two (exact) so that its largest
 * |value| is in [0.5, 1): correlations do not change, and sums of squares
 * neither overflow nor underflow. A pair's key then takes two passes over
 * the features both nodes have, in feature order: the means (bicor: the
 * medians and deviations, knn_bicor_prep), then the centred products.
 * Pearson, |Pearson| and cosine keys are computed for a row's candidates
 * only (the screen, below). Threads split the query rows (tiles of them
 * for the screen); the caller's thread polls the interrupt between blocks
 * of rows sized to take well under a second.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "knn_backend.h"
#include "knn_blas.h"
#include "knn_coexpr.h"
#include "knn_exact.h"
#include "knn_threads.h"

/* The n-th smallest (0-based) of a[0..len), a reordered so that every
 * element before position n is at most it. */
static double knn_nth(double *a, int len, int n)
{
    int lo = 0, hi = len - 1;
    while (lo < hi) {
        double pivot = a[lo + (hi - lo) / 2];
        int i = lo, j = hi;
        while (i <= j) {
            while (a[i] < pivot) i++;
            while (a[j] > pivot) j--;
            if (i <= j) {
                double t = a[i];
                a[i] = a[j];
                a[j] = t;
                i++;
                j--;
            }
        }
        if (n <= j) {
            hi = j;
        } else if (n >= i) {
            lo = i;
        } else {
            return a[n];
        }
    }
    return a[n];
}

/* The median of a[0..len), len >= 1, as R's median() gives it: the mean
 * of the two middle values for an even length. a is reordered. */
static double knn_median(double *a, int len)
{
    int half = len / 2;
    double upper = knn_nth(a, len, half);
    if (len % 2) return upper;
    double lower = a[0];
    for (int t = 1; t < half; t++) {
        if (a[t] > lower) lower = a[t];
    }
    return (lower + upper) / 2.0;
}

/* Whether feature f of x is used: present in x and, where other is not
 * NULL, in other too. */
static inline int knn_shared(const double *x, const double *other, int f)
{
    return !isnan(x[f]) && (other == NULL || !isnan(other[f]));
}


/* out (p values whose squares sum to ss) divided by its norm; all 0 where
 * ss is 0, the form undefined. Returns whether it is defined. */
static int knn_unit_or_zero(double *out, int p, double ss)
{
    if (ss == 0.0) {
        memset(out, 0, (size_t)p * sizeof(double));
        return 0;
    }
    double norm = sqrt(ss);
    for (int f = 0; f < p; f++) out[f] /= norm;
    return 1;
}
/* The Pearson form of x over its used features into out: centred, unit
 * length, 0 elsewhere. Returns 0 (out all 0) where x is constant there. */
static int knn_pearson_prep(const double *x, const double *other, int p,
                            int count, double *out)
{
    double sum = 0.0;
    for (int f = 0; f < p; f++) {
        if (knn_shared(x, other, f)) sum += x[f];
    }
    double mean = sum / count, ss = 0.0;
    for (int f = 0; f < p; f++) {
        double d = knn_shared(x, other, f) ? x[f] - mean : 0.0;
        out[f] = d;
        ss += d * d;
    }
    return knn_unit_or_zero(out, p, ss);
}

/* WGCNA's bicor form (prepareColBicor, maxPOutliers = 1, fallback to
 * Pearson for a zero MAD) of x over its used features into out, 0
 * elsewhere; work holds p doubles. Returns 0 (out all 0) where the form
 * is undefined: x constant on the used features, or none used. */
static int knn_bicor_prep(const double *x, const double *other, int p,
                          double *out, double *work)
{
    int count = 0;
    for (int f = 0; f < p; f++) {
        if (knn_shared(x, other, f)) work[count++] = x[f];
    }
    if (count == 0) {
        memset(out, 0, (size_t)p * sizeof(double));
        return 0;
    }
    double med = knn_median(work, count);
    count = 0;
    for (int f = 0; f < p; f++) {
        if (knn_shared(x, other, f)) work[count++] = fabs(x[f] - med);
    }
    double mad = knn_median(work, count);
    if (mad == 0.0) return knn_pearson_prep(x, other, p, count, out);
    double denom = 9.0 * mad, ss = 0.0;
    for (int f = 0; f < p; f++) {
        double v = 0.0;
        if (knn_shared(x, other, f)) {
            double u = (x[f] - med) / denom;
            if (fabs(u) > 1.0) u = 1.0;
            double w = 1.0 - u * u;
            v = (x[f] - med) * (w * w);
        }
        out[f] = v;
        ss += v * v;
    }
    return knn_unit_or_zero(out, p, ss);
}

/* x scaled by the power of two that brings its largest finite |value|
 * into [0.5, 1); NaN stays NaN. */
static void knn_scale_node(const double *x, int p, double *out)
{
    int e = knn_exponent(knn_max_abs(x, p));
    knn_ldexp_values(x, p, -e, knn_ldexp_factor(-e), out);
}

int knn_bicor_nodes(const double *x, int p, int n, double *out, int *bad,
                    int max_bad, int threads)
{
    int t = knn_threads(threads), failed = 0;
    char *marks = calloc((size_t)n, 1);
    if (!marks) return -1;
    #pragma omp parallel num_threads(t) reduction(| : failed)
    {
        double *work = malloc(2 * (size_t)p * sizeof(double));
        if (!work) failed = 1;
        #pragma omp for schedule(static)
        for (int j = 0; j < n; j++) {
            if (!work) continue;
            double *scaled = work + p;
            knn_scale_node(x + (size_t)j * p, p, scaled);
            marks[j] = !knn_bicor_prep(scaled, NULL, p,
                                       out + (size_t)j * p, work);
        }
        free(work);
    }
    int found = 0;
    for (int j = 0; j < n && !failed; j++) {
        if (!marks[j]) continue;
        if (found < max_bad) bad[found] = j;
        found++;
    }
    free(marks);
    return failed ? -1 : found;
}

/* Where the present values of v (scaled into [0.5, 1), NaN where
 * missing) are integers below 2^KNN_EXACT_INT_BITS times one power of two,
 * rewrites them as the smallest such integers and returns the largest
 * |integer|; else returns 0 and leaves v as it is. Correlations do not
 * change; over such integers a pair's sums are exact (knn_pw_corr). */
static double knn_pw_integers(double *v, int p)
{
    double amax = knn_max_abs(v, p);
    if (amax == 0.0) return 0.0;
    int up = KNN_EXACT_INT_BITS - knn_exponent(amax);
    unsigned long long bits = 0;
    for (int f = 0; f < p; f++) {
        if (isnan(v[f])) continue;
        double w = ldexp(v[f], up);
        if (w != floor(w)) return 0.0;
        bits |= (unsigned long long)fabs(w);
    }
    int shift = up - knn_trailing_zeros(bits);
    for (int f = 0; f < p; f++) {
        if (!isnan(v[f])) v[f] = ldexp(v[f], shift);
    }
    return ldexp(amax, shift);
}

/* Nodes of a pairwise search: scaled copies, each node's count of present
 * features, and (bicor) each node's own form over them, used for a pair
 * whose shared features are all the node has. */
typedef struct {
    int n;
    double *x;     /* p x n, scaled, NaN where missing; a node of integers
                      times one power of two holds the smallest such
                      integers (knn_pw_integers) */
    double *imax;  /* n: the largest |integer| of such a node, else 0 */
    int *present;  /* n */
    double *prep;  /* bicor: p x n, else NULL */
    char *defined; /* bicor: whether prep is defined, else NULL */
} knn_pw_nodes;

static void knn_pw_free(knn_pw_nodes *nodes)
{
    free(nodes->x);
    free(nodes->imax);
    free(nodes->present);
    free(nodes->prep);
    free(nodes->defined);
    memset(nodes, 0, sizeof *nodes);
}

static knn_status knn_pw_prepare(knn_pw_nodes *nodes, const double *x, int p,
                                 int n, int bicor, int threads)
{
    memset(nodes, 0, sizeof *nodes);
    nodes->n = n;
    nodes->x = malloc((size_t)p * n * sizeof(double));
    nodes->imax = malloc((size_t)n * sizeof(double));
    nodes->present = malloc((size_t)n * sizeof(int));
    if (bicor) {
        nodes->prep = malloc((size_t)p * n * sizeof(double));
        nodes->defined = malloc((size_t)n);
    }
    if (!nodes->x || !nodes->imax || !nodes->present ||
        (bicor && (!nodes->prep || !nodes->defined))) {
        knn_pw_free(nodes);
        return KNN_E_NOMEM;
    }
    int failed = 0;
    #pragma omp parallel num_threads(threads) reduction(| : failed)
    {
        double *work = bicor ? malloc((size_t)p * sizeof(double)) : NULL;
        if (bicor && !work) failed = 1;
        #pragma omp for schedule(static)
        for (int j = 0; j < n; j++) {
            double *v = nodes->x + (size_t)j * p;
            knn_scale_node(x + (size_t)j * p, p, v);
            int count = 0;
            for (int f = 0; f < p; f++) count += !isnan(v[f]);
            nodes->present[j] = count;
            nodes->imax[j] = bicor ? 0.0 : knn_pw_integers(v, p);
            if (bicor && work) {
                nodes->defined[j] = (char)knn_bicor_prep(
                    v, NULL, p, nodes->prep + (size_t)j * p, work);
            }
        }
        free(work);
    }
    if (failed) {
        knn_pw_free(nodes);
        return KNN_E_NOMEM;
    }
    return KNN_OK;
}

/* What one thread needs for its rows: two forms and a median buffer
 * (bicor), and the row's best k as a max-heap of (distance, index). */
typedef struct {
    double *form_a, *form_b, *work;
    double *heap_d;
    int *heap_j;
    int size;
} knn_pw_thread;

/* Whether (d1, j1) ranks after (d2, j2). */
static inline int knn_pw_worse(double d1, int j1, double d2, int j2)
{
    return d1 > d2 || (d1 == d2 && j1 > j2);
}

static void knn_pw_sift_down(knn_pw_thread *t, int at)
{
    for (;;) {
        int l = 2 * at + 1, r = l + 1, top = at;
        if (l < t->size && knn_pw_worse(t->heap_d[l], t->heap_j[l],
                                        t->heap_d[top], t->heap_j[top]))
            top = l;
        if (r < t->size && knn_pw_worse(t->heap_d[r], t->heap_j[r],
                                        t->heap_d[top], t->heap_j[top]))
            top = r;
        if (top == at) return;
        double d = t->heap_d[at];
        int j = t->heap_j[at];
        t->heap_d[at] = t->heap_d[top];
        t->heap_j[at] = t->heap_j[top];
        t->heap_d[top] = d;
        t->heap_j[top] = j;
        at = top;
    }
}

/* Offers (d, j) to the row's best k. */
static void knn_pw_offer(knn_pw_thread *t, int k, double d, int j)
{
    if (t->size < k) {
        int at = t->size++;
        t->heap_d[at] = d;
        t->heap_j[at] = j;
        while (at > 0) {
            int up = (at - 1) / 2;
            if (!knn_pw_worse(t->heap_d[at], t->heap_j[at], t->heap_d[up],
                              t->heap_j[up]))
                break;
            double td = t->heap_d[at];
            int tj = t->heap_j[at];
            t->heap_d[at] = t->heap_d[up];
            t->heap_j[at] = t->heap_j[up];
            t->heap_d[up] = td;
            t->heap_j[up] = tj;
            at = up;
        }
        return;
    }
    if (!knn_pw_worse(t->heap_d[0], t->heap_j[0], d, j)) return;
    t->heap_d[0] = d;
    t->heap_j[0] = j;
    knn_pw_sift_down(t, 0);
}

/* Pearson (centred) or cosine of two nodes of integers (largest |values|
 * ia and ib, knn_pw_integers) over their count shared features, from sums
 * that are exact: r = sign(S) sqrt(S^2 / (Ca Cb)) with S = n sxy - sx sy
 * and C = n sxx - sx^2 (cosine: sxy, sxx, syy). Where
 * p^2 ia ib < 2^26, S^2 and Ca Cb are exact too, so correlations equal in
 * exact arithmetic are equal bit for bit. NaN where undefined. */
static double knn_pw_corr_integers(const double *a, const double *b, int p,
                                   int centred)
{
    double n = 0.0, sa = 0.0, sb = 0.0, saa = 0.0, sbb = 0.0, sab = 0.0;
    for (int f = 0; f < p; f++) {
        if (isnan(a[f]) || isnan(b[f])) continue;
        n += 1.0;
        sa += a[f];
        sb += b[f];
        saa += a[f] * a[f];
        sbb += b[f] * b[f];
        sab += a[f] * b[f];
    }
    double s = centred ? n * sab - sa * sb : sab;
    double ca = centred ? n * saa - sa * sa : saa;
    double cb = centred ? n * sbb - sb * sb : sbb;
    if (ca == 0.0 || cb == 0.0) return NAN;
    double q = (s * s) / (ca * cb);
    double r = sqrt(q > 1.0 ? 1.0 : q);
    return s < 0.0 ? -r : r;
}

/* Pearson (centred) or cosine of a and b over their shared features: the
 * correlation, or NaN where it is undefined or fewer than min_shared
 * features are shared. ia, ib: the nodes' imax (knn_pw_nodes); two nodes
 * of small integers take knn_pw_corr_integers, so that exact ties stay
 * ties. */
static double knn_pw_corr(const double *a, const double *b, int p,
                          int centred, int min_shared, double ia, double ib)
{
    int count = 0;
    double sa = 0.0, sb = 0.0;
    for (int f = 0; f < p; f++) {
        if (isnan(a[f]) || isnan(b[f])) continue;
        count++;
        sa += a[f];
        sb += b[f];
    }
    if (count < min_shared || count == 0) return NAN;
    if (ia > 0.0 && ib > 0.0 && (double)p * p * ia * ib < 67108864.0) {
        return knn_pw_corr_integers(a, b, p, centred);
    }
    double ma = centred ? sa / count : 0.0, mb = centred ? sb / count : 0.0;
    double sab = 0.0, saa = 0.0, sbb = 0.0;
    for (int f = 0; f < p; f++) {
        if (isnan(a[f]) || isnan(b[f])) continue;
        double da = a[f] - ma, db = b[f] - mb;
        sab += da * db;
        saa += da * da;
        sbb += db * db;
    }
    if (saa == 0.0 || sbb == 0.0) return NAN;
    double r = sab / (sqrt(saa) * sqrt(sbb));
    return r > 1.0 ? 1.0 : r < -1.0 ? -1.0 : r;
}

/* bicor of query node qi and reference node rj over their shared
 * features (WGCNA's bicor(use = "p")): each node's own form where it has
 * no other features, else its form over the shared ones. */
static double knn_pw_bicor(const knn_pw_nodes *q, int qi,
                           const knn_pw_nodes *r, int rj, int p,
                           int min_shared, knn_pw_thread *t)
{
    const double *a = q->x + (size_t)qi * p, *b = r->x + (size_t)rj * p;
    int count = 0;
    for (int f = 0; f < p; f++) count += !isnan(a[f]) && !isnan(b[f]);
    if (count < min_shared || count == 0) return NAN;
    const double *fa = q->prep + (size_t)qi * p;
    if (count != q->present[qi]) {
        if (!knn_bicor_prep(a, b, p, t->form_a, t->work)) return NAN;
        fa = t->form_a;
    } else if (!q->defined[qi]) {
        return NAN;
    }
    const double *fb = r->prep + (size_t)rj * p;
    if (count != r->present[rj]) {
        if (!knn_bicor_prep(b, a, p, t->form_b, t->work)) return NAN;
        fb = t->form_b;
    } else if (!r->defined[rj]) {
        return NAN;
    }
    double s = 0.0;
    for (int f = 0; f < p; f++) {
        if (!isnan(a[f]) && !isnan(b[f])) s += fa[f] * fb[f];
    }
    return s > 1.0 ? 1.0 : s < -1.0 ? -1.0 : s;
}

/* Writes the row's best k (the heap, emptied) to query node qi's places
 * in order; places beyond the heap's size get KNN_NO_NODE. */
static void knn_pw_write(const knn_pairwise_request *req, knn_pw_thread *t,
                         int qi, knn_result *out, int n_query)
{
    for (int slot = req->k - 1; slot >= 0; slot--) {
        size_t at = knn_result_at(out, (size_t)n_query, req->k, (size_t)qi,
                                  slot);
        if (slot >= t->size) {
            out->index[at] = KNN_NO_NODE;
            out->distance[at] = NAN;
            out->weight[at] = NAN;
            continue;
        }
        out->index[at] = t->heap_j[0] + out->index_base;
        out->distance[at] = t->heap_d[0];
        out->weight[at] = 1.0 - t->heap_d[0];
        t->size--;
        t->heap_d[0] = t->heap_d[t->size];
        t->heap_j[0] = t->heap_j[t->size];
        knn_pw_sift_down(t, 0);
    }
}

/* One query row of bicor: every reference node's key offered. */
static void knn_pw_bicor_row(const knn_pairwise_request *req,
                             const knn_pw_nodes *q, const knn_pw_nodes *r,
                             int qi, int self, knn_pw_thread *t)
{
    t->size = 0;
    for (int rj = 0; rj < r->n; rj++) {
        if (self && rj == qi) continue;
        double v = knn_pw_bicor(q, qi, r, rj, req->p, req->min_shared, t);
        if (!isnan(v)) knn_pw_offer(t, req->k, 1.0 - v, rj);
    }
}

/* The screen of the Pearson-like measures: candidates from one matrix
 * product, exact keys for the candidates only.
 *
 * Each node is held centred by its own mean (cosine: as it is), 0 where
 * missing: a. Over the features S a pair shares, the sums the correlation
 * needs follow from the node's own sums less those over the other node's
 * missing features (few, where few values are missing): A = T_i - sum of
 * a_i over miss_j, AA = S2_i - the same of a_i^2, and the cross-product
 * sum over S is the product a_i . a_j, which is 0 off S; one float64
 * matrix product per tile gives those. Every sum's rounding is at most
 * g = gamma_(p+8) times the sum of its terms' magnitudes (any order, FMA
 * or not; the +8 covers the rounding of a's centring and the few
 * operations after), which bounds the correlation computed from them,
 * r_fast, against the true r; the canonical key (knn_pw_corr, two passes)
 * is within its own bound of the true r (its mean's error delta shifts
 * the sums by n delta_i delta_j, the rest is g again). A pair is a
 * candidate where its lower bound on the distance is at most the k-th
 * smallest upper bound of the row, or where its variances cannot be told
 * from 0 (the key decides); the true best k, ties included, are among
 * the candidates, and their exact keys rank them. The bounds are doubled
 * for safety: a wider margin costs only a few more exact keys. */
typedef struct {
    double *a;     /* p x n: centred (cosine: scaled) values, 0 if missing */
    double *t;     /* n: sum of a */
    double *s2;    /* n: sum of a^2 */
    double *l1;    /* n: sum of |a| */
    double *rs2;   /* n: sqrt of s2 */
    int *miss_at;  /* n + 1 offsets into miss */
    int *miss;     /* missing features of each node, ascending */
    int words;     /* 64-bit words of a node's mask */
    uint64_t *mask; /* words x n: bit f set where feature f is missing */
    double *at;    /* n x p, feature f's values of every node contiguous:
                      a row's sums over its own missing features, for
                      every reference node at once (reference nodes only,
                      else NULL) */
} knn_pw_screen;

static void knn_pw_screen_free(knn_pw_screen *sc)
{
    free(sc->a);
    free(sc->t);
    free(sc->s2);
    free(sc->l1);
    free(sc->rs2);
    free(sc->miss_at);
    free(sc->miss);
    free(sc->mask);
    free(sc->at);
    memset(sc, 0, sizeof *sc);
}

static knn_status knn_pw_screen_prepare(knn_pw_screen *sc,
                                        const knn_pw_nodes *nodes, int p,
                                        int centred, int is_ref)
{
    int n = nodes->n;
    size_t missing = 0;
    for (int j = 0; j < n; j++) missing += (size_t)(p - nodes->present[j]);
    memset(sc, 0, sizeof *sc);
    sc->a = malloc((size_t)p * n * sizeof(double));
    sc->t = malloc((size_t)n * sizeof(double));
    sc->s2 = malloc((size_t)n * sizeof(double));
    sc->l1 = malloc((size_t)n * sizeof(double));
    sc->rs2 = malloc((size_t)n * sizeof(double));
    sc->miss_at = malloc(((size_t)n + 1) * sizeof(int));
    sc->miss = malloc((missing + 1) * sizeof(int));
    sc->words = (p + 63) / 64;
    sc->mask = calloc((size_t)sc->words * n, sizeof(uint64_t));
    if (is_ref) sc->at = malloc((size_t)p * n * sizeof(double));
    if (!sc->a || !sc->t || !sc->s2 || !sc->l1 || !sc->rs2 || !sc->miss_at ||
        !sc->miss ||
        !sc->mask || (is_ref && !sc->at) || missing > (size_t)INT_MAX) {
        knn_pw_screen_free(sc);
        return KNN_E_NOMEM;
    }
    int at = 0;
    for (int j = 0; j < n; j++) {
        const double *v = nodes->x + (size_t)j * p;
        double *a = sc->a + (size_t)j * p;
        double sum = 0.0;
        for (int f = 0; f < p; f++) {
            if (!isnan(v[f])) sum += v[f];
        }
        double mean = centred && nodes->present[j] > 0
            ? sum / nodes->present[j] : 0.0;
        double t = 0.0, s2 = 0.0, l1 = 0.0;
        sc->miss_at[j] = at;
        for (int f = 0; f < p; f++) {
            if (isnan(v[f])) {
                a[f] = 0.0;
                sc->miss[at++] = f;
                sc->mask[(size_t)j * sc->words + f / 64] |=
                    (uint64_t)1 << (f % 64);
                continue;
            }
            a[f] = v[f] - mean;
            t += a[f];
            s2 += a[f] * a[f];
            l1 += fabs(a[f]);
        }
        sc->t[j] = t;
        sc->s2[j] = s2;
        sc->l1[j] = l1;
        sc->rs2[j] = sqrt(s2);
    }
    sc->miss_at[n] = at;
    for (int j = 0; is_ref && j < n; j++) {
        for (int f = 0; f < p; f++) {
            sc->at[(size_t)f * n + j] = sc->a[(size_t)j * p + f];
        }
    }
    return KNN_OK;
}

/* For query node i (of q): the sums of every reference node's a, and of
 * its squares, over the features i lacks, into sum and sq (n_ref each). */
static void knn_pw_row_missing_sums(const knn_pw_screen *q, int i,
                                    const knn_pw_screen *r, int n_ref,
                                    double *sum, double *sq)
{
    for (int j = 0; j < n_ref; j++) {
        sum[j] = 0.0;
        sq[j] = 0.0;
    }
    for (int t = q->miss_at[i]; t < q->miss_at[i + 1]; t++) {
        const double *v = r->at + (size_t)q->miss[t] * n_ref;
        /* Each j's sums keep their order: lanes hold different j. */
        #pragma omp simd
        for (int j = 0; j < n_ref; j++) {
            sum[j] += v[j];
            sq[j] += v[j] * v[j];
        }
    }
}

/* The scratch of one query row of the screen, n_ref doubles each. */
typedef struct {
    double *shared; /* features shared with each reference node; 0 where
                       the pair is no pair (too few, or the node itself) */
    double *sa, *qa; /* the row's a over each node's missing features:
                        sum, sum of squares */
    double *sb, *qb; /* each node's a over the row's missing features */
    double *lo, *hi; /* distance bounds: lo NaN for no pair, -Inf where
                        the variances cannot be told from 0 (hi NaN) */
    double *spare;
} knn_pw_rowbuf;

/* Bounds [lo, hi] on the distance of query node qi to every reference
 * node, from the products c and buf's sums; see the screen's note. */
static void knn_pw_bounds(const knn_pairwise_request *req,
                          const knn_pw_screen *q, int qi,
                          const knn_pw_screen *r, int n_ref, const double *c,
                          knn_pw_rowbuf *buf)
{
    int p = req->p, centred = req->measure != KNN_PAIRWISE_COSINE;
    int absolute = req->measure == KNN_PAIRWISE_ABSPEARSON;
    const double g = (p + 8) * KNN_U64 / (1.0 - (p + 8) * KNN_U64);
    const double u4 = 4.0 * KNN_U64;
    const double ti = q->t[qi], s2i = q->s2[qi], rsi = q->rs2[qi];
    const double e_ai = centred ? 2.0 * g * q->l1[qi] : 0.0;
    const double *t = r->t, *s2 = r->s2, *rs = r->rs2, *l1 = r->l1;
    const double *shared = buf->shared, *sa = buf->sa, *qa = buf->qa,
                 *sb = buf->sb, *qb = buf->qb;
    double *lo = buf->lo, *hi = buf->hi;
    for (int j = 0; j < n_ref; j++) {
        double n = shared[j];
        double ab = c[j];
        double aa = s2i - qa[j], bb = s2[j] - qb[j];
        double e_ab = g * rsi * rs[j] * (1.0 + 4.0 * g);
        double inv = centred ? 1.0 / (n > 0.0 ? n : 1.0) : 0.0;
        double a = centred ? ti - sa[j] : 0.0;
        double b = centred ? t[j] - sb[j] : 0.0;
        double e_b = centred ? 2.0 * g * l1[j] : 0.0;
        double prod = a * b * inv, a2 = a * a * inv, b2 = b * b * inv;
        double cov = ab - prod, va = aa - a2, vb = bb - b2;
        double e_cov = e_ab + (e_ai * fabs(b) + fabs(a) * e_b + e_ai * e_b) *
                       inv + u4 * (fabs(ab) + fabs(prod));
        double e_va = 3.0 * g * s2i + (2.0 * fabs(a) * e_ai + e_ai * e_ai) *
                      inv + u4 * (aa + a2);
        double e_vb = 3.0 * g * s2[j] + (2.0 * fabs(b) * e_b + e_b * e_b) *
                      inv + u4 * (bb + b2);
        double lo_a = va - e_va, lo_b = vb - e_vb;
        int known = lo_a > 0.0 && lo_b > 0.0;
        double sva = sqrt(known ? va : 1.0), svb = sqrt(known ? vb : 1.0);
        double sla = sqrt(known ? lo_a : 1.0), slb = sqrt(known ? lo_b : 1.0);
        double s_fast = sva * svb, s_lo = sla * slb;
        double rf = cov / s_fast;
        double m = e_cov / s_lo + fabs(cov) * (1.0 / s_lo - 1.0 / s_fast) +
                   u4 * (1.0 + fabs(rf));
        /* The canonical key's own distance from the true r. */
        double canon = 6.0 * g + (centred ? n * g * g * (1.0 / s_lo +
                                  1.0 / sla / sla + 1.0 / slb / slb) : 0.0);
        double margin = 2.0 * (m + canon) + 2.0 * KNN_U64;
        double d = 1.0 - (absolute ? fabs(rf) : rf);
        double l = known ? d - margin : -INFINITY;
        lo[j] = n > 0.0 ? l : NAN;
        hi[j] = n > 0.0 && known ? d + margin : NAN;
    }
}

/* One query row through the screen: c holds the row's products with every
 * reference node (n_ref). */
static void knn_pw_screen_row(const knn_pairwise_request *req,
                              const knn_pw_nodes *q, const knn_pw_screen *qs,
                              const knn_pw_nodes *r, const knn_pw_screen *rs,
                              int qi, int self, const double *c,
                              knn_pw_thread *t, knn_pw_rowbuf *buf,
                              double *candidates)
{
    int p = req->p, n_ref = r->n, certain = 0;
    int miss_q = p - q->present[qi];
    knn_pw_row_missing_sums(qs, qi, rs, n_ref, buf->sb, buf->qb);
    const double *a = qs->a + (size_t)qi * p;
    const uint64_t *mask = qs->mask + (size_t)qi * qs->words;
    for (int rj = 0; rj < n_ref; rj++) {
        double s = 0.0, s2 = 0.0;
        int both = 0;
        for (int at = rs->miss_at[rj]; at < rs->miss_at[rj + 1]; at++) {
            int f = rs->miss[at];
            double v = a[f];
            s += v;
            s2 += v * v;
            both += (int)((mask[f / 64] >> (f % 64)) & 1u);
        }
        int shared = p - miss_q - (p - r->present[rj]) + both;
        int pair = shared >= req->min_shared && shared > 0 &&
                   !(self && rj == qi);
        buf->shared[rj] = pair ? shared : 0.0;
        buf->sa[rj] = s;
        buf->qa[rj] = s2;
    }
    knn_pw_bounds(req, qs, qi, rs, n_ref, c, buf);
    for (int rj = 0; rj < n_ref; rj++) {
        if (!isnan(buf->hi[rj])) buf->spare[certain++] = buf->hi[rj];
    }
    double bound = certain >= req->k
        ? knn_nth(buf->spare, certain, req->k - 1) : INFINITY;
    t->size = 0;
    for (int rj = 0; rj < n_ref; rj++) {
        if (!(buf->lo[rj] <= bound)) continue;
        *candidates += 1.0;
        double v = knn_pw_corr(q->x + (size_t)qi * p, r->x + (size_t)rj * p,
                               p, req->measure != KNN_PAIRWISE_COSINE,
                               req->min_shared, q->imax[qi], r->imax[rj]);
        if (isnan(v)) continue;
        if (req->measure == KNN_PAIRWISE_ABSPEARSON) v = fabs(v);
        knn_pw_offer(t, req->k, 1.0 - v, rj);
    }
}

static knn_status knn_pw_fail(knn_report *report, knn_status st,
                              const char *why)
{
    snprintf(report->message, sizeof report->message, "%s", why);
    return st;
}

static int knn_has_infinite(const double *x, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        if (isinf(x[i])) return 1;
    }
    return 0;
}

/* Query rows per matrix product of the screen, and the arrays of
 * knn_pw_rowbuf. */
#define KNN_PW_TILE 32
#define KNN_PW_ROWBUF 8

/* One tile of query rows [first, last) through the screen: their products
 * with every reference node, then each row's candidates and best k. */
static void knn_pw_screen_tile(const knn_pairwise_request *req,
                               const knn_pw_nodes *q,
                               const knn_pw_screen *qs,
                               const knn_pw_nodes *r,
                               const knn_pw_screen *rs, int first, int last,
                               int self, knn_pw_thread *t, double *c,
                               double *scratch, double *candidates,
                               knn_result *out, int n_query)
{
    int p = req->p, n_ref = r->n, rows = last - first;
    knn_gemm_tn(n_ref, rows, p, rs->a, qs->a + (size_t)first * p, c);
    knn_pw_rowbuf buf;
    double **field[] = {&buf.shared, &buf.sa, &buf.qa, &buf.sb, &buf.qb,
                        &buf.lo, &buf.hi, &buf.spare};
    for (int f = 0; f < KNN_PW_ROWBUF; f++) {
        *field[f] = scratch + (size_t)f * n_ref;
    }
    for (int qi = first; qi < last; qi++) {
        knn_pw_screen_row(req, q, qs, r, rs, qi, self,
                          c + (size_t)(qi - first) * n_ref, t, &buf,
                          candidates);
        knn_pw_write(req, t, qi, out, n_query);
    }
}

knn_status knn_pairwise_search(const knn_pairwise_request *req,
                               knn_result *out, knn_report *report)
{
    memset(report, 0, sizeof *report);
    int self = req->query == NULL;
    int n_query = self ? req->n_ref : req->n_query, p = req->p;
    int n_ref = req->n_ref;
    int bicor = req->measure == KNN_PAIRWISE_BICOR;
    int centred = req->measure != KNN_PAIRWISE_COSINE;
    int threads = knn_threads(req->threads);
    double started = knn_seconds();
    if (req->k < 1 || req->k > n_ref - self || p < 1)
        return knn_pw_fail(report, KNN_E_INVALID, "k or sizes out of range");
    if (knn_has_infinite(req->ref, (size_t)p * n_ref) ||
        (!self && knn_has_infinite(req->query, (size_t)p * n_query)))
        return knn_pw_fail(report, KNN_E_NONFINITE, "infinite values");

    knn_pw_nodes ref, query;
    knn_pw_screen ref_sc, query_sc;
    memset(&query, 0, sizeof query);
    memset(&ref_sc, 0, sizeof ref_sc);
    memset(&query_sc, 0, sizeof query_sc);
    knn_status st = knn_pw_prepare(&ref, req->ref, p, n_ref, bicor,
                                   threads);
    if (st != KNN_OK) return knn_pw_fail(report, st, "out of memory");
    if (!self) st = knn_pw_prepare(&query, req->query, p, n_query, bicor,
                                   threads);
    if (st == KNN_OK && !bicor) {
        st = knn_pw_screen_prepare(&ref_sc, &ref, p, centred, 1);
        if (st == KNN_OK && !self)
            st = knn_pw_screen_prepare(&query_sc, &query, p, centred, 0);
    }
    const knn_pw_nodes *q = self ? &ref : &query;
    const knn_pw_screen *qs = self ? &ref_sc : &query_sc;

    /* Each thread's share, in doubles: bicor's forms and median buffer,
     * the heap (its indices rounded up to whole doubles), and the
     * screen's products and bounds. */
    size_t heap_ints = ((size_t)req->k * sizeof(int) + sizeof(double) - 1) /
                       sizeof(double);
    size_t per = 3 * (size_t)p + (size_t)req->k + heap_ints +
                 (bicor ? 0
                        : (size_t)(KNN_PW_TILE + KNN_PW_ROWBUF) * n_ref);
    double *scratch = st == KNN_OK
        ? malloc((size_t)threads * per * sizeof(double)) : NULL;
    knn_pw_thread *ts = calloc((size_t)threads, sizeof *ts);
    double *found = calloc((size_t)threads, sizeof(double));
    if (st == KNN_OK && (!scratch || !ts || !found)) st = KNN_E_NOMEM;
    if (st != KNN_OK) knn_pw_fail(report, st, "out of memory");
    if (st == KNN_OK) {
        st = knn_result_allocate(out, report->message,
                                 sizeof report->message);
    }
    for (int i = 0; st == KNN_OK && i < threads; i++) {
        double *base = scratch + (size_t)i * per;
        ts[i].form_a = base;
        ts[i].form_b = base + p;
        ts[i].work = base + 2 * (size_t)p;
        ts[i].heap_d = base + 3 * (size_t)p;
        ts[i].heap_j = (int *)(ts[i].heap_d + req->k);
    }
    report->seconds_prepare = knn_seconds() - started;

    /* Rows per block between polls: about 5e7 feature visits per thread
     * for bicor (each pair's forms), or a few tiles of products. */
    double visits = (double)n_ref * p;
    int unit = bicor ? 1 : KNN_PW_TILE;
    double budget = bicor ? 5e7 : 2e8;
    int per_thread = visits * unit >= budget ? 1
                   : (int)(budget / (visits * unit));
    int block = per_thread * threads * unit;
    int blas_before = bicor ? 0 : knn_blas_hold_one_thread();
    for (int first = 0; st == KNN_OK && first < n_query; first += block) {
        int last = first + block < n_query ? first + block : n_query;
        if (bicor) {
            #pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
            for (int qi = first; qi < last; qi++) {
                knn_pw_thread *t = &ts[knn_thread_number()];
                knn_pw_bicor_row(req, q, &ref, qi, self, t);
                knn_pw_write(req, t, qi, out, n_query);
            }
        } else {
            int tiles = (last - first + KNN_PW_TILE - 1) / KNN_PW_TILE;
            #pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
            for (int tile = 0; tile < tiles; tile++) {
                int id = knn_thread_number();
                knn_pw_thread *t = &ts[id];
                double *c = t->heap_d + req->k + heap_ints;
                double *lo = c + (size_t)KNN_PW_TILE * n_ref;
                int a = first + tile * KNN_PW_TILE;
                int b = a + KNN_PW_TILE < last ? a + KNN_PW_TILE : last;
                knn_pw_screen_tile(req, q, qs, &ref, &ref_sc, a, b, self, t,
                                   c, lo, &found[id], out, n_query);
            }
        }
        if (req->cb.interrupted && req->cb.interrupted(req->cb.ctx)) {
            st = knn_pw_fail(report, KNN_E_INTERRUPTED,
                             "interrupted by the user");
        } else if (req->cb.progress) {
            req->cb.progress(req->cb.ctx, last, n_query);
        }
    }
    knn_blas_release(blas_before);
    report->seconds_search = knn_seconds() - started -
                             report->seconds_prepare;
    snprintf(report->device, sizeof report->device, "cpu (%d threads)",
             threads);
    snprintf(report->precision, sizeof report->precision, "%s",
             bicor ? "fp64 pairwise-complete"
                   : "fp64 products + fp64 pairwise-complete re-rank");
    double candidates = 0.0;
    for (int i = 0; found && i < threads; i++) candidates += found[i];
    report->candidates = bicor ? n_ref - self : candidates / n_query;
    report->row_tile = block;
    report->col_tile = n_ref;
    free(scratch);
    free(ts);
    free(found);
    knn_pw_screen_free(&ref_sc);
    knn_pw_screen_free(&query_sc);
    knn_pw_free(&ref);
    knn_pw_free(&query);
    return st;
}
