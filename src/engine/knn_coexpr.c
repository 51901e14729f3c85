/*
 * knn_coexpr.c: bicor's transform and the pairwise-complete search
 * (knn_coexpr.h).
 *
 * Every node is first scaled by a power of two (exact) so that its largest
 * |value| is in [0.5, 1): correlations do not change, and sums of squares
 * neither overflow nor underflow. A pair's key then takes two passes over
 * the features both nodes have, in feature order: the means (bicor: the
 * medians and deviations, knn_bicor_prep), then the centred products.
 * Threads split the query rows; the caller's thread polls the interrupt
 * between blocks of rows sized to take well under a second.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "knn_backend.h"
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
    if (ss == 0.0) {
        memset(out, 0, (size_t)p * sizeof(double));
        return 0;
    }
    double norm = sqrt(ss);
    for (int f = 0; f < p; f++) out[f] /= norm;
    return 1;
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
    if (ss == 0.0) {
        memset(out, 0, (size_t)p * sizeof(double));
        return 0;
    }
    double norm = sqrt(ss);
    for (int f = 0; f < p; f++) out[f] /= norm;
    return 1;
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

/* Nodes of a pairwise search: scaled copies, each node's count of present
 * features, and (bicor) each node's own form over them, used for a pair
 * whose shared features are all the node has. */
typedef struct {
    int n;
    double *x;     /* p x n, scaled, NaN where missing */
    int *present;  /* n */
    double *prep;  /* bicor: p x n, else NULL */
    char *defined; /* bicor: whether prep is defined, else NULL */
} knn_pw_nodes;

static void knn_pw_free(knn_pw_nodes *nodes)
{
    free(nodes->x);
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
    nodes->present = malloc((size_t)n * sizeof(int));
    if (bicor) {
        nodes->prep = malloc((size_t)p * n * sizeof(double));
        nodes->defined = malloc((size_t)n);
    }
    if (!nodes->x || !nodes->present ||
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

/* Pearson (centred) or cosine of a and b over their shared features: the
 * correlation, or NaN where it is undefined or fewer than min_shared
 * features are shared. */
static double knn_pw_corr(const double *a, const double *b, int p,
                          int centred, int min_shared)
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

/* One query row: every reference node's key offered, then the best k
 * written in order. */
static void knn_pw_row(const knn_pairwise_request *req,
                       const knn_pw_nodes *q, const knn_pw_nodes *r, int qi,
                       int self, knn_pw_thread *t, knn_result *out,
                       int n_query)
{
    int p = req->p;
    t->size = 0;
    for (int rj = 0; rj < r->n; rj++) {
        if (self && rj == qi) continue;
        double v;
        if (req->measure == KNN_PAIRWISE_BICOR) {
            v = knn_pw_bicor(q, qi, r, rj, p, req->min_shared, t);
        } else {
            v = knn_pw_corr(q->x + (size_t)qi * p, r->x + (size_t)rj * p, p,
                            req->measure != KNN_PAIRWISE_COSINE,
                            req->min_shared);
        }
        if (isnan(v)) continue;
        if (req->measure == KNN_PAIRWISE_ABSPEARSON) v = fabs(v);
        knn_pw_offer(t, req->k, 1.0 - v, rj);
    }
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

knn_status knn_pairwise_search(const knn_pairwise_request *req,
                               knn_result *out, knn_report *report)
{
    memset(report, 0, sizeof *report);
    int self = req->query == NULL;
    int n_query = self ? req->n_ref : req->n_query, p = req->p;
    int bicor = req->measure == KNN_PAIRWISE_BICOR;
    int threads = knn_threads(req->threads);
    double started = knn_seconds();
    if (req->k < 1 || req->k > req->n_ref - self || p < 1)
        return knn_pw_fail(report, KNN_E_INVALID, "k or sizes out of range");
    if (knn_has_infinite(req->ref, (size_t)p * req->n_ref) ||
        (!self && knn_has_infinite(req->query, (size_t)p * n_query)))
        return knn_pw_fail(report, KNN_E_NONFINITE, "infinite values");

    knn_pw_nodes ref, query;
    knn_status st = knn_pw_prepare(&ref, req->ref, p, req->n_ref, bicor,
                                   threads);
    if (st == KNN_OK && !self) {
        st = knn_pw_prepare(&query, req->query, p, n_query, bicor, threads);
        if (st != KNN_OK) knn_pw_free(&ref);
    }
    if (st != KNN_OK) return knn_pw_fail(report, st, "out of memory");
    const knn_pw_nodes *q = self ? &ref : &query;

    /* Each thread's share, rounded to whole doubles. */
    size_t per = (3 * (size_t)p + (size_t)req->k) * sizeof(double) +
                 ((size_t)req->k * sizeof(int) + 7) / 8 * 8;
    char *scratch = malloc((size_t)threads * per);
    knn_pw_thread *ts = calloc((size_t)threads, sizeof *ts);
    st = knn_result_allocate(out, report->message, sizeof report->message);
    if (st == KNN_OK && (!scratch || !ts)) {
        st = knn_pw_fail(report, KNN_E_NOMEM, "out of memory");
    }
    for (int i = 0; st == KNN_OK && i < threads; i++) {
        char *base = scratch + (size_t)i * per;
        ts[i].form_a = (double *)base;
        ts[i].form_b = ts[i].form_a + p;
        ts[i].work = ts[i].form_b + p;
        ts[i].heap_d = ts[i].work + p;
        ts[i].heap_j = (int *)(ts[i].heap_d + req->k);
    }
    report->seconds_prepare = knn_seconds() - started;

    /* Rows per block: about 5e7 feature visits per thread between polls. */
    double visits = (double)req->n_ref * p;
    int per_thread = visits >= 5e7 ? 1 : (int)(5e7 / visits);
    int block = per_thread * threads;
    for (int first = 0; st == KNN_OK && first < n_query; first += block) {
        int last = first + block < n_query ? first + block : n_query;
        #pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
        for (int qi = first; qi < last; qi++) {
            knn_pw_row(req, q, &ref, qi, self, &ts[knn_thread_number()],
                       out, n_query);
        }
        if (req->cb.interrupted && req->cb.interrupted(req->cb.ctx)) {
            st = knn_pw_fail(report, KNN_E_INTERRUPTED,
                             "interrupted by the user");
        } else if (req->cb.progress) {
            req->cb.progress(req->cb.ctx, last, n_query);
        }
    }
    report->seconds_search = knn_seconds() - started -
                             report->seconds_prepare;
    snprintf(report->device, sizeof report->device, "cpu (%d threads)",
             threads);
    snprintf(report->precision, sizeof report->precision,
             "fp64 pairwise-complete");
    report->candidates = req->n_ref - self;
    report->row_tile = block;
    report->col_tile = req->n_ref;
    free(scratch);
    free(ts);
    knn_pw_free(&ref);
    if (!self) knn_pw_free(&query);
    return st;
}
