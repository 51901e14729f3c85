/*
 * knn_coexpr.c: bicor's transform and the pairwise-complete search
 * (knn_coexpr.h).
 *
 * Every node is first scaled by a power of two (exact) so that its largest
 * |value| is in [0.5, 1): correlations do not change, and sums of squares
 * neither overflow nor underflow. A pair's key then takes two passes over
 * the features both nodes have, in feature order: the means (bicor: the
 * medians and deviations, knn_pw_form_of), then the centred products
 * (knn_pw_key.h). On the CPU, Pearson, |Pearson| and cosine keys are
 * computed for a row's candidates only (the screen, below), whose float32
 * products run on the CPU's BLAS; on a GPU every pair is keyed there
 * (knn_pw_on_gpu). Threads split the query rows (tiles of them for the
 * screen); the caller's thread polls the interrupt between blocks of rows
 * sized to take well under a second, and while it waits for a GPU.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "knn_backend.h"
#include "knn_blas.h"
#include "knn_coexpr.h"
#include "knn_exact.h"
#include "knn_prepare.h"
#include "knn_pw_key.h"
#include "knn_threads.h"

/* The present features of x (p values, NaN where missing) in ascending
 * order of value into ord; returns how many. buf: scratch of p. */
static int knn_pw_order(const double *x, int p, int *ord,
                        knn_ranked *buf)
{
    int len = 0;
    for (int f = 0; f < p; f++) {
        if (isnan(x[f])) continue;
        buf[len].value = x[f];
        buf[len].position = f;
        len++;
    }
    qsort(buf, (size_t)len, sizeof *buf, knn_ranked_cmp);
    for (int i = 0; i < len; i++) ord[i] = buf[i].position;
    return len;
}

/* x scaled by the power of two that brings its largest finite |value|
 * into [0.5, 1); NaN stays NaN. */
static void knn_scale_node(const double *x, int p, double *out)
{
    int e = knn_exponent(knn_max_abs(x, p));
    knn_ldexp_values(x, p, -e, knn_ldexp_factor(-e), out);
}

/* The bicor form of x (p finite values) into out, unit length (knn_pw_form
 * over all of x's features); all 0 where it is undefined. Returns whether
 * it is defined. ord, buf: scratch of p. */
static int knn_bicor_node(const double *x, int p, double *out, int *ord,
                          knn_ranked *buf)
{
    int len = knn_pw_order(x, p, ord, buf);
    knn_pw_form form = knn_pw_form_of(x, 1, NULL, 0, ord, 1, len, p, len);
    for (int f = 0; f < p; f++) {
        out[f] = form.norm == 0.0
            ? 0.0 : knn_pw_form_value(&form, x[f]) / form.norm;
    }
    return form.norm != 0.0;
}

int knn_bicor_nodes(const double *x, int p, int n, double *out, int *bad,
                    int max_bad, int threads)
{
    int t = knn_threads(threads), failed = 0;
    char *marks = calloc((size_t)n, 1);
    if (!marks) return -1;
    #pragma omp parallel num_threads(t) reduction(| : failed)
    {
        double *scaled = malloc((size_t)p * sizeof(double));
        int *ord = malloc((size_t)p * sizeof(int));
        knn_ranked *buf = malloc((size_t)p * sizeof *buf);
        if (!scaled || !ord || !buf) failed = 1;
        #pragma omp for schedule(static)
        for (int j = 0; j < n; j++) {
            if (failed) continue;
            knn_scale_node(x + (size_t)j * p, p, scaled);
            marks[j] = !knn_bicor_node(scaled, p, out + (size_t)j * p, ord,
                                       buf);
        }
        free(scaled);
        free(ord);
        free(buf);
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
 * features and (bicor) its present features in ascending order of value
 * (knn_pw_key.h). */
typedef struct {
    int n;
    double *x;     /* p x n, scaled, NaN where missing; a node of integers
                      times one power of two holds the smallest such
                      integers (knn_pw_integers) */
    double *imax;  /* n: the largest |integer| of such a node, else 0 */
    int *present;  /* n */
    int *order;    /* bicor: p x n, each node's first present[j], else
                      NULL */
} knn_pw_nodes;

static void knn_pw_free(knn_pw_nodes *nodes)
{
    free(nodes->x);
    free(nodes->imax);
    free(nodes->present);
    free(nodes->order);
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
    if (bicor) nodes->order = malloc((size_t)p * n * sizeof(int));
    if (!nodes->x || !nodes->imax || !nodes->present ||
        (bicor && !nodes->order)) {
        knn_pw_free(nodes);
        return KNN_E_NOMEM;
    }
    int failed = 0;
    #pragma omp parallel num_threads(threads) reduction(| : failed)
    {
        knn_ranked *buf =
            bicor ? malloc((size_t)p * sizeof *buf) : NULL;
        if (bicor && !buf) failed = 1;
        #pragma omp for schedule(static)
        for (int j = 0; j < n; j++) {
            double *v = nodes->x + (size_t)j * p;
            knn_scale_node(x + (size_t)j * p, p, v);
            int count = 0;
            for (int f = 0; f < p; f++) count += !isnan(v[f]);
            nodes->present[j] = count;
            nodes->imax[j] = bicor ? 0.0 : knn_pw_integers(v, p);
            if (bicor && buf)
                knn_pw_order(v, p, nodes->order + (size_t)j * p, buf);
        }
        free(buf);
    }
    if (failed) {
        knn_pw_free(nodes);
        return KNN_E_NOMEM;
    }
    return KNN_OK;
}

/* A row's best k as a max-heap of (distance, index). */
typedef struct {
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

/* Writes reference node j (0-based; < 0: no neighbour, KNN_NO_NODE and
 * NaN) at distance d into place `at` of out. */
static void knn_pw_put(knn_result *out, size_t at, int j, double d)
{
    out->index[at] = j < 0 ? KNN_NO_NODE : j + out->index_base;
    out->distance[at] = j < 0 ? NAN : d;
    out->weight[at] = j < 0 ? NAN : 1.0 - d;
}

/* Writes the row's best k (the heap, emptied) to query node qi's places
 * in order; places beyond the heap's size get no neighbour. */
static void knn_pw_write(const knn_pairwise_request *req, knn_pw_thread *t,
                         int qi, knn_result *out, int n_query)
{
    for (int slot = req->k - 1; slot >= 0; slot--) {
        size_t at = knn_result_at(out, (size_t)n_query, req->k, (size_t)qi,
                                  slot);
        if (slot >= t->size) {
            knn_pw_put(out, at, -1, NAN);
            continue;
        }
        knn_pw_put(out, at, t->heap_j[0], t->heap_d[0]);
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
        int p = req->p;
        double v = knn_pw_bicor(q->x + (size_t)qi * p, 1,
                                q->order + (size_t)qi * p, 1, q->present[qi],
                                r->x + (size_t)rj * p, 1,
                                r->order + (size_t)rj * p, 1, r->present[rj],
                                p, req->min_shared);
        if (!isnan(v)) knn_pw_offer(t, req->k, knn_pw_distance(v, 0), rj);
    }
}

/* The screen of the Pearson-like measures: candidates from float32 matrix
 * products with proven bounds, exact keys for the candidates only.
 *
 * Each node is held centred by its own mean (cosine: as it is), 0 where
 * missing: a. Over the features S a pair (i, j) shares, the sums the
 * correlation needs are the node's own sums less those over the other
 * node's missing features: X = T_i - sum of a_i over miss_j, XX = S2_i -
 * the same of a_i^2, and the cross-product sum over S is a_i . a_j, 0 off
 * S, which one float32 matrix product per tile of rows gives. Every
 * float64 sum's rounding is at most g = gamma_(p+8) times the sum of its
 * terms' magnitudes (any order, FMA or not; the +8 covers a's centring and
 * the few operations after); the float32 product's, inputs' rounding and
 * the evaluation of a bound from it included, at most ec |a_i| |a_j| plus
 * p 2^-100 for float32's underflow (knn_pw_consts). The canonical key
 * (knn_pw_corr, two passes) is within 6g + n g^2 (1/(s_i s_j) + 1/s_i^2 +
 * 1/s_j^2) of the true r, s^2 the nodes' variances over S.
 *
 * A row takes three steps.
 *   1. Seeds: its k nodes of largest a_i . a_j / |a_j| get exact keys;
 *      the worst of them, d_w, bounds the row's k-th best distance.
 *   2. A filter of O(1) a pair: the sums over the other node's m missing
 *      features are at most the sums of the node's m largest |a| and a^2,
 *      which give X(m) >= |X| and V(m) <= the variance over S (n at least
 *      p less both nodes' missing counts). Then r <= (c + e + X_i X_j / n)
 *      / sqrt(V_i V_j), c the product, e its error; a pair whose bound is
 *      below tau = 1 - d_w - 8u - 7g ranks after the seeds' worst, since
 *      its canonical key is within 7g of r wherever V >= 3 p g (below that
 *      a pair passes). Reference nodes are ordered by their missing count,
 *      so that a run of them shares the row's X(m) and V(m); a reference
 *      node's own bounds are tabled for a few levels of m (a higher level
 *      bounds a lower m).
 *   3. A pair the filter passes gets the exact sums of the query node
 *      over the reference node's missing features and step 2's test again
 *      with them (knn_pw_below); then the reference node's exact sums,
 *      bounds on the distance from all of them (knn_pw_lower, which tries
 *      the test once more), and the exact key where the bound is at most
 *      the row's k-th best so far.
 * The true best k, ties included, are among the keyed pairs. Step 3's
 * margins are doubled for safety: a wider margin costs only a few more
 * exact keys.
 *
 * Rows go in tiles: one product per tile, steps 1 and 2 row by row, step
 * 3 by blocks of reference positions, every row of the tile in a block
 * before the next, so that the block's values are read from cache. Any
 * tiling and thread count give the same bits: which pairs are keyed may
 * change, the best k by their exact keys cannot. */

/* Levels of m at which reference nodes' bounds are tabled. */
#define KNN_PW_LEVELS 16

typedef struct {
    int p, centred, absolute;
    int max_miss;  /* the most features any node misses */
    int levels;
    int level_m[KNN_PW_LEVELS]; /* ascending, the last max_miss */
    double g;      /* gamma_(p+8) in float64 */
    double ec;     /* the float32 product's relative error bound */
    double eabs;   /* its absolute error bound (underflow) */
    double floor;  /* the least variance bound a filter relies on */
} knn_pw_consts;

static void knn_pw_consts_set(knn_pw_consts *cs, int p, int measure,
                              int max_miss)
{
    double gc = (p + 16) * KNN_U32;
    cs->p = p;
    cs->centred = measure != KNN_PAIRWISE_COSINE;
    cs->absolute = measure == KNN_PAIRWISE_ABSPEARSON;
    cs->max_miss = max_miss;
    cs->levels = max_miss + 1 < KNN_PW_LEVELS ? max_miss + 1
                                               : KNN_PW_LEVELS;
    for (int l = 0; l < cs->levels; l++) {
        cs->level_m[l] = cs->levels == 1 ? max_miss
            : (int)(((long long)l * max_miss + cs->levels - 2) /
                    (cs->levels - 1));
    }
    cs->g = (p + 8) * KNN_U64 / (1.0 - (p + 8) * KNN_U64);
    /* Past gc = 1/2 the products bound nothing: every pair passes. */
    cs->ec = gc < 0.5 ? gc / (1.0 - gc) + 8.0 * KNN_U32 : INFINITY;
    cs->eabs = p * 0x1p-100;
    cs->floor = 3.0 * p * cs->g;
}

/* The level whose m is the first at least m. */
static int knn_pw_level(const knn_pw_consts *cs, int m)
{
    int l = 0;
    while (cs->level_m[l] < m) l++;
    return l;
}

/* The filter's bounds of one node (a: p values, 0 where missing; k of
 * them missing; t, s2, l1 its sums of a, a^2, |a|) against a node missing
 * m features, for each m of ms[0..count), ascending: x[i * stride] >= |X|
 * over the shared features, v[i * stride] <= the square root of the
 * variance there, -Inf where that is below cs->floor (a filter passes the
 * pair). top: scratch of ms[count - 1] doubles. */
static void knn_pw_node_bounds(const knn_pw_consts *cs, const double *a,
                               int k, double t, double s2, double l1,
                               const int *ms, int count, double *top,
                               double *x, double *v, size_t stride)
{
    int p = cs->p, most = ms[count - 1] < p ? ms[count - 1] : p, have = 0;
    for (int f = 0; f < p && most > 0; f++) {
        double w = fabs(a[f]);
        if (have == most && !(w > top[most - 1])) continue;
        int at = have < most ? have++ : most - 1;
        while (at > 0 && top[at - 1] < w) {
            top[at] = top[at - 1];
            at--;
        }
        top[at] = w;
    }
    double g = cs->g, sum = 0.0, sq = 0.0;
    int used = 0;
    for (int i = 0; i < count; i++) {
        for (; used < ms[i] && used < have; used++) {
            sum += top[used];
            sq += top[used] * top[used];
        }
        double xb = cs->centred ? (fabs(t) + g * l1 + sum) * (1.0 + 2.0 * g)
                                : 0.0;
        int n = p - k - ms[i];
        double xx = xb * xb / (n > 1 ? n : 1);
        double var = s2 - sq - xx - 4.0 * g * (s2 + sq + xx);
        x[(size_t)i * stride] = xb;
        v[(size_t)i * stride] = var >= cs->floor
            ? sqrt(var) * (1.0 - 2.0 * KNN_U64) : -INFINITY;
    }
}

typedef struct {
    double *a;     /* p x n: centred (cosine: scaled) values, 0 if missing */
    double *t;     /* n: sum of a */
    double *s2;    /* n: sum of a^2 */
    double *l1;    /* n: sum of |a| */
    double *rs2;   /* n: sqrt of s2 */
    int *miss_at;  /* n + 1 offsets into miss */
    int *miss;     /* missing features of each node, ascending */
    unsigned char *gone; /* p x n: 1 where a feature is missing, else 0 */
    int *order;    /* n: the node at each position, by missing count then
                      number (reference nodes; NULL: positions are nodes) */
    float *a32;    /* p x n: a in float32, by position */
    /* Reference nodes only, by position: */
    int *run_at;   /* max_miss + 2: the positions of nodes missing m
                      features are [run_at[m], run_at[m + 1]) */
    double *rs;    /* n: rs2 */
    float *w;      /* n: 1 / rs2 (0 where rs2 is 0), the seeds' score */
    double *xt, *vt; /* levels x n: knn_pw_node_bounds at each level */
    double *pa;    /* p x n: a by position, for the sums over a row's
                      missing features */
    int *pmiss_at, *pmiss; /* n + 1, and the missing features: miss_at and
                              miss by position */
} knn_pw_screen;

static void knn_pw_screen_free(knn_pw_screen *sc)
{
    void *parts[] = {sc->a, sc->t, sc->s2, sc->l1, sc->rs2, sc->miss_at,
                     sc->miss, sc->gone, sc->order, sc->a32, sc->run_at,
                     sc->rs, sc->w, sc->xt, sc->vt, sc->pa, sc->pmiss_at,
                     sc->pmiss};
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
        free(parts[i]);
    }
    memset(sc, 0, sizeof *sc);
}

/* The reference's order, runs, tables and values by position
 * (knn_pw_screen), from its per-node sums. */
static knn_status knn_pw_screen_tables(knn_pw_screen *sc,
                                       const knn_pw_nodes *nodes,
                                       const knn_pw_consts *cs, int threads)
{
    int n = nodes->n, p = cs->p, most = cs->max_miss;
    size_t cells = (size_t)cs->levels * n;
    sc->order = malloc((size_t)n * sizeof(int));
    sc->run_at = calloc((size_t)most + 2, sizeof(int));
    sc->rs = malloc((size_t)n * sizeof(double));
    sc->w = malloc((size_t)n * sizeof(float));
    sc->xt = malloc(cells * sizeof(double));
    sc->vt = malloc(cells * sizeof(double));
    sc->pa = malloc((size_t)p * n * sizeof(double));
    sc->pmiss_at = malloc(((size_t)n + 1) * sizeof(int));
    sc->pmiss = malloc(((size_t)sc->miss_at[n] + 1) * sizeof(int));
    if (!sc->order || !sc->run_at || !sc->rs || !sc->w || !sc->xt ||
        !sc->vt || !sc->pa || !sc->pmiss_at || !sc->pmiss)
        return KNN_E_NOMEM;
    for (int j = 0; j < n; j++) sc->run_at[p - nodes->present[j] + 1]++;
    for (int m = 0; m <= most; m++) sc->run_at[m + 1] += sc->run_at[m];
    int *next = malloc(((size_t)most + 1) * sizeof(int));
    if (!next) return KNN_E_NOMEM;
    memcpy(next, sc->run_at, ((size_t)most + 1) * sizeof(int));
    for (int j = 0; j < n; j++) sc->order[next[p - nodes->present[j]]++] = j;
    free(next);
    sc->pmiss_at[0] = 0;
    for (int pos = 0; pos < n; pos++) {
        int j = sc->order[pos], count = sc->miss_at[j + 1] - sc->miss_at[j];
        memcpy(sc->pmiss + sc->pmiss_at[pos], sc->miss + sc->miss_at[j],
               (size_t)count * sizeof(int));
        sc->pmiss_at[pos + 1] = sc->pmiss_at[pos] + count;
    }
    int failed = 0;
    #pragma omp parallel num_threads(threads) reduction(| : failed)
    {
        double *top = malloc(((size_t)most + 1) * sizeof(double));
        if (!top) failed = 1;
        #pragma omp for schedule(static)
        for (int pos = 0; pos < n; pos++) {
            int j = sc->order[pos];
            const double *a = sc->a + (size_t)j * p;
            sc->rs[pos] = sc->rs2[j];
            memcpy(sc->pa + (size_t)pos * p, a, (size_t)p * sizeof(double));
            sc->w[pos] = sc->rs2[j] > 0.0 ? (float)(1.0 / sc->rs2[j]) : 0.0f;
            if (top) {
                knn_pw_node_bounds(cs, a, p - nodes->present[j], sc->t[j],
                                   sc->s2[j], sc->l1[j], cs->level_m,
                                   cs->levels, top, sc->xt + pos,
                                   sc->vt + pos, (size_t)n);
            }
        }
        free(top);
    }
    return failed ? KNN_E_NOMEM : KNN_OK;
}

/* The screen of nodes: their sums, missing features and float32 values;
 * a reference's order, runs and tables too (is_ref), where a query's
 * positions are its nodes. */
static knn_status knn_pw_screen_prepare(knn_pw_screen *sc,
                                        const knn_pw_nodes *nodes,
                                        const knn_pw_consts *cs, int is_ref,
                                        int threads)
{
    int n = nodes->n, p = cs->p;
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
    sc->gone = calloc((size_t)p * n, 1);
    sc->a32 = malloc((size_t)p * n * sizeof(float));
    if (!sc->a || !sc->t || !sc->s2 || !sc->l1 || !sc->rs2 || !sc->miss_at ||
        !sc->miss || !sc->gone || !sc->a32 || missing > (size_t)INT_MAX) {
        knn_pw_screen_free(sc);
        return KNN_E_NOMEM;
    }
    sc->miss_at[0] = 0;
    for (int j = 0; j < n; j++) {
        sc->miss_at[j + 1] = sc->miss_at[j] + p - nodes->present[j];
    }
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (int j = 0; j < n; j++) {
        const double *v = nodes->x + (size_t)j * p;
        double *a = sc->a + (size_t)j * p;
        int at = sc->miss_at[j];
        double sum = 0.0;
        for (int f = 0; f < p; f++) {
            if (!isnan(v[f])) sum += v[f];
        }
        double mean = cs->centred && nodes->present[j] > 0
            ? sum / nodes->present[j] : 0.0;
        double t = 0.0, s2 = 0.0, l1 = 0.0;
        for (int f = 0; f < p; f++) {
            if (isnan(v[f])) {
                a[f] = 0.0;
                sc->miss[at++] = f;
                sc->gone[(size_t)j * p + f] = 1;
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
    knn_status st = is_ref ? knn_pw_screen_tables(sc, nodes, cs, threads)
                           : KNN_OK;
    if (st != KNN_OK) {
        knn_pw_screen_free(sc);
        return st;
    }
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (int pos = 0; pos < n; pos++) {
        int j = sc->order ? sc->order[pos] : pos;
        for (int f = 0; f < p; f++) {
            sc->a32[(size_t)pos * p + f] = (float)sc->a[(size_t)j * p + f];
        }
    }
    return KNN_OK;
}

/* The lower bound of step 3 on the distance of query node qi (of q) to
 * reference node rj (of r), which share n features: from their product ab
 * (error at most e_ab) and the sums over each other's missing features
 * (sa, qa: qi's a and a^2 over rj's; sb, qb: rj's over qi's). -Inf where
 * the variances cannot be told from 0; +Inf where the bounds on the
 * covariance and variances alone put r below tau > 0 (step 2's test,
 * without a square root), as for a pair that cannot rank. */
static double knn_pw_lower(const knn_pw_consts *cs, const knn_pw_screen *q,
                           int qi, const knn_pw_screen *r, int rj, double n,
                           double ab, double e_ab, double sa, double qa,
                           double sb, double qb, double tau)
{
    int centred = cs->centred;
    const double g = cs->g, u4 = 4.0 * KNN_U64;
    const double s2i = q->s2[qi], s2j = r->s2[rj];
    const double e_a = centred ? 2.0 * g * q->l1[qi] : 0.0;
    const double e_b = centred ? 2.0 * g * r->l1[rj] : 0.0;
    double aa = s2i - qa, bb = s2j - qb;
    double inv = centred ? 1.0 / n : 0.0;
    double a = centred ? q->t[qi] - sa : 0.0;
    double b = centred ? r->t[rj] - sb : 0.0;
    double prod = a * b * inv, a2 = a * a * inv, b2 = b * b * inv;
    double cov = ab - prod, va = aa - a2, vb = bb - b2;
    double e_cov = e_ab + (e_a * fabs(b) + fabs(a) * e_b + e_a * e_b) * inv +
                   u4 * (fabs(ab) + fabs(prod));
    double e_va = 3.0 * g * s2i + (2.0 * fabs(a) * e_a + e_a * e_a) * inv +
                  u4 * (aa + a2);
    double e_vb = 3.0 * g * s2j + (2.0 * fabs(b) * e_b + e_b * e_b) * inv +
                  u4 * (bb + b2);
    double lo_a = va - e_va, lo_b = vb - e_vb;
    if (!(lo_a > 0.0 && lo_b > 0.0)) return -INFINITY;
    if (tau > 0.0 && lo_a >= cs->floor && lo_b >= cs->floor) {
        double hi = (cs->absolute ? fabs(cov) : cov) + e_cov;
        double ts = tau * (1.0 - 8.0 * KNN_U64);
        if (hi < 0.0 || hi * hi < ts * ts * lo_a * lo_b) return INFINITY;
    }
    double sla = sqrt(lo_a), slb = sqrt(lo_b);
    double s_fast = sqrt(va) * sqrt(vb), s_lo = sla * slb;
    double rf = cov / s_fast;
    double m = e_cov / s_lo + fabs(cov) * (1.0 / s_lo - 1.0 / s_fast) +
               u4 * (1.0 + fabs(rf));
    /* The canonical key's own distance from the true r. */
    double canon = 6.0 * g + (centred ? n * g * g * (1.0 / s_lo +
                              1.0 / lo_a + 1.0 / lo_b) : 0.0);
    double margin = 2.0 * (m + canon) + 2.0 * KNN_U64;
    return 1.0 - (cs->absolute ? fabs(rf) : rf) - margin;
}

/* One thread's share of the screen: a tile's products and its rows'
 * heaps and passed positions, and the work of one row at a time (seeds,
 * bounds at every m, the seeds' marks). */
typedef struct {
    float *c;           /* rows x n_ref products */
    knn_pw_thread *row; /* rows: each row's best k */
    double *heap_d;     /* rows x k, the rows' heaps */
    int *heap_j;
    int *passed;        /* rows x n_ref: positions step 2 passes, ascending */
    float *pc;          /* rows x n_ref: their products */
    int *count, *next;  /* rows: how many passed, the next to refine */
    float *seed_s;
    double *x, *v, *top;
    int *seed_at, *ms;  /* ms: 0, 1, ..., max_miss */
    char *seeded;       /* n_ref */
    unsigned char *keep; /* n_ref: step 2's verdicts */
} knn_pw_share;

/* Offers query node qi's key with reference node rj to the row; counts
 * it in keyed. */
static void knn_pw_key(const knn_pairwise_request *req,
                       const knn_pw_nodes *q, int qi, const knn_pw_nodes *r,
                       int rj, knn_pw_thread *t, double *keyed)
{
    int p = req->p;
    *keyed += 1.0;
    double v = knn_pw_corr(q->x + (size_t)qi * p, 1, r->x + (size_t)rj * p,
                           1, p, req->measure != KNN_PAIRWISE_COSINE,
                           req->min_shared, q->imax[qi], r->imax[rj]);
    if (isnan(v)) return;
    knn_pw_offer(t, req->k,
                 knn_pw_distance(v, req->measure == KNN_PAIRWISE_ABSPEARSON),
                 rj);
}

/* The k reference positions of largest score c w (|c| w for |Pearson|,
 * c: a row's products, w: the reference's 1 / |a|), skipping position
 * `skip`, into w->seed_at; returns how many. A block of positions whose
 * best score is below the k-th best so far is passed over at once. */
static int knn_pw_top(const knn_pw_consts *cs, const float *c,
                      const float *wt, int n, int k, int skip,
                      knn_pw_share *w)
{
    int have = 0, low = 0;
    float low_s = -INFINITY;
    for (int from = 0; from < n; from += 16) {
        int to = from + 16 < n ? from + 16 : n;
        float most = -INFINITY;
        if (cs->absolute) {
            #pragma omp simd reduction(max : most)
            for (int pos = from; pos < to; pos++) {
                float v = fabsf(c[pos]) * wt[pos];
                most = v > most ? v : most;
            }
        } else {
            #pragma omp simd reduction(max : most)
            for (int pos = from; pos < to; pos++) {
                float v = c[pos] * wt[pos];
                most = v > most ? v : most;
            }
        }
        if (have == k && !(most > low_s)) continue;
        for (int pos = from; pos < to; pos++) {
            float v = (cs->absolute ? fabsf(c[pos]) : c[pos]) * wt[pos];
            if ((have == k && !(v > low_s)) || pos == skip) continue;
            if (have < k) low = have++;
            w->seed_s[low] = v;
            w->seed_at[low] = pos;
            if (have < k) continue;
            for (int i = 0; i < k; i++) {
                if (w->seed_s[i] < w->seed_s[low]) low = i;
            }
            low_s = w->seed_s[low];
        }
    }
    return have;
}

/* Step 1: the k reference positions of largest score (self excluded),
 * keyed and marked in w->seeded; returns how many. */
static int knn_pw_seeds(const knn_pairwise_request *req,
                        const knn_pw_consts *cs, const knn_pw_nodes *q,
                        int qi, int qpos, const knn_pw_nodes *r,
                        const knn_pw_screen *rs, const float *c,
                        knn_pw_thread *t, knn_pw_share *w, double *keyed)
{
    int have = knn_pw_top(cs, c, rs->w, r->n, req->k, qpos, w);
    /* The seeds' values are far apart in memory: all of them are asked
     * for at once, so that their loads overlap. */
    for (int i = 0; i < have; i++) {
        const double *x = r->x + (size_t)rs->order[w->seed_at[i]] * req->p;
        for (int f = 0; f < req->p; f += 8) __builtin_prefetch(x + f);
    }
    t->size = 0;
    for (int i = 0; i < have; i++) {
        w->seeded[w->seed_at[i]] = 1;
        knn_pw_key(req, q, qi, r, rs->order[w->seed_at[i]], t, keyed);
    }
    return have;
}

/* The least r a pair may have to rank before a row's k-th best distance
 * d_w, wherever the variances' bounds are at least cs->floor (the screen's
 * note). */
static double knn_pw_tau(const knn_pw_consts *cs, double d_w)
{
    return 1.0 - d_w - 8.0 * KNN_U64 - 7.0 * cs->g;
}

/* Eight bytes of keep (each 0 or 1) as the low eight bits of a word, the
 * first byte lowest: the bytes are read as one word, first byte lowest,
 * and the multiplication adds each byte's bit into the top byte at its
 * own place (no two meet, so nothing carries). */
static inline uint64_t knn_pw_keep_bits(const unsigned char *keep)
{
    uint64_t w;
    memcpy(&w, keep, sizeof w);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    w = __builtin_bswap64(w);
#endif
    return (w * 0x0102040810204080ULL) >> 56;
}

/* Appends the positions in [from, to) whose keep is 1, and their
 * products c, to out and pc after `passed` of them; returns the new
 * count. Sixty-four positions at a time, as the set bits of one word,
 * visiting only the kept ones, so that the cost follows the positions
 * kept. */
static int knn_pw_compact(const unsigned char *keep, int from, int to,
                          const float *c, int *out, float *pc, int passed)
{
    int pos = from;
    for (; pos + 64 <= to; pos += 64) {
        uint64_t bits = 0;
        for (int b = 0; b < 8; b++) {
            bits |= knn_pw_keep_bits(keep + pos + 8 * b) << (8 * b);
        }
        for (; bits; bits &= bits - 1) {
            int l = pos + knn_trailing_zeros(bits);
            out[passed] = l;
            pc[passed] = c[l];
            passed++;
        }
    }
    for (; pos < to; pos++) {
        out[passed] = pos;
        pc[passed] = c[pos];
        passed += keep[pos];
    }
    return passed;
}

/* Step 2's test of one run of positions [from, to): keep[pos] = 1 where
 * the position is no seed and the pair's bound hi (c: products; e, xin,
 * eabs: the row's error and sums; rsj, xj: the reference's) is not below
 * ts vj, else 0. vj is -Inf where a node's variance bound is not relied
 * on, and ts > 0: such a node passes. The arrays do not overlap
 * (restrict); the seeds' bytes in the verdict also let GCC put the loop
 * on vectors, which a verdict of doubles alone does not. */
static void knn_pw_verdicts(const float *restrict c,
                            const double *restrict rsj,
                            const double *restrict xj,
                            const double *restrict vj,
                            const char *restrict seeded, int from, int to,
                            double e, double xin, double eabs, double ts,
                            int absolute, unsigned char *restrict keep)
{
    if (absolute) {
        #pragma omp simd
        for (int pos = from; pos < to; pos++) {
            double hi = fabs((double)c[pos]) + e * rsj[pos] +
                        xin * xj[pos] + eabs;
            keep[pos] = !(hi < ts * vj[pos]) & !seeded[pos];
        }
    } else {
        #pragma omp simd
        for (int pos = from; pos < to; pos++) {
            double hi = c[pos] + e * rsj[pos] + xin * xj[pos] + eabs;
            keep[pos] = !(hi < ts * vj[pos]) & !seeded[pos];
        }
    }
}

/* Step 2: the positions other than seeds (w->seeded) that the filter
 * passes, into out, ascending, and their products into pc; returns their
 * count. tau: the least r a pair may have to rank (not above 0: every
 * pair passes). */
static int knn_pw_filter(const knn_pw_consts *cs, const knn_pw_screen *qs,
                         int qi, const knn_pw_screen *rs, int n_ref,
                         double tau, const float *c, knn_pw_share *w,
                         int *out, float *pc)
{
    int p = cs->p, most = cs->max_miss;
    int ki = qs->miss_at[qi + 1] - qs->miss_at[qi];
    int filter = tau > 0.0;
    if (filter) {
        knn_pw_node_bounds(cs, qs->a + (size_t)qi * p, ki, qs->t[qi],
                           qs->s2[qi], qs->l1[qi], w->ms, most + 1, w->top,
                           w->x, w->v, 1);
    }
    size_t level = filter ? (size_t)knn_pw_level(cs, ki) * n_ref : 0;
    const double *xj = rs->xt + level, *vj = rs->vt + level;
    const double *rsj = rs->rs;
    const char *seeded = w->seeded;
    double e = cs->ec * qs->rs2[qi], eabs = cs->eabs;
    unsigned char *keep = w->keep;
    for (int m = 0; m <= most; m++) {
        int from = rs->run_at[m], to = rs->run_at[m + 1];
        if (!filter || !(w->v[m] > 0.0)) {
            for (int pos = from; pos < to; pos++) keep[pos] = !seeded[pos];
            continue;
        }
        int n = p - ki - m;
        double xin = w->x[m] / (n > 1 ? n : 1);
        double ts = tau * (1.0 - 4.0 * KNN_U64) * w->v[m];
        knn_pw_verdicts(c, rsj, xj, vj, seeded, from, to, e, xin, eabs, ts,
                        cs->absolute, keep);
    }
    return knn_pw_compact(keep, 0, n_ref, c, out, pc, 0);
}

/* Whether step 3 rules a pair out before the reference node's sums:
 * step 2's test with the query node's side exact (sa, qa over the n
 * shared features) and the reference node's tabled (xj, vj at the row's
 * level; vj -Inf: not relied on). cc: the pair's product (|product| for
 * |Pearson|), e its error. */
static int knn_pw_below(const knn_pw_consts *cs, const knn_pw_screen *qs,
                        int qi, int n, double sa, double qa, double cc,
                        double e, double xj, double vj, double tau)
{
    if (!(tau > 0.0 && vj > 0.0)) return 0;
    double g = cs->g, s2 = qs->s2[qi];
    double xi = cs->centred
        ? (fabs(qs->t[qi] - sa) + 2.0 * g * qs->l1[qi]) * (1.0 + 2.0 * g)
        : 0.0;
    double xx = xi * xi / n;
    double vi = s2 - qa - xx - 4.0 * g * (s2 + qa + xx);
    if (!(vi >= cs->floor)) return 0;
    double hi = cc + e + xi * xj / n;
    double ts = tau * (1.0 - 8.0 * KNN_U64) * vj;
    return hi < 0.0 || hi * hi < ts * ts * vi;
}

/* Step 3 for the positions a row passed below `end`, from *next on
 * (advanced past them; pc: their products): each pair's exact sums over
 * the missing features (the row's over the reference node's, first
 * tried by knn_pw_below; the reference node's from its values by
 * position), its lower bound, and its key where that bound does not rule
 * it out. */
static void knn_pw_refine(const knn_pairwise_request *req,
                          const knn_pw_consts *cs, const knn_pw_nodes *q,
                          const knn_pw_screen *qs, int qi,
                          const knn_pw_nodes *r, const knn_pw_screen *rs,
                          int self, const int *passed, const float *pc,
                          int count, int *next, int end, knn_pw_thread *t,
                          double *keyed)
{
    size_t level = (size_t)knn_pw_level(cs, qs->miss_at[qi + 1] -
                                            qs->miss_at[qi]) * r->n;
    const double *xj = rs->xt + level, *vj = rs->vt + level;
    int p = cs->p, k = req->k;
    int ki = qs->miss_at[qi + 1] - qs->miss_at[qi];
    const int *miss = qs->miss + qs->miss_at[qi];
    const double *ai = qs->a + (size_t)qi * p;
    const unsigned char *gi = qs->gone + (size_t)qi * p;
    double e = cs->ec * qs->rs2[qi];
    int i = *next;
    for (; i < count && passed[i] < end; i++) {
        int pos = passed[i], rj = rs->order[pos];
        if (self && rj == qi) continue;
        const int *mj = rs->pmiss + rs->pmiss_at[pos];
        int kj = rs->pmiss_at[pos + 1] - rs->pmiss_at[pos], both = 0;
        double sa = 0.0, qa = 0.0, sb = 0.0, qb = 0.0;
        for (int at = 0; at < kj; at++) {
            int f = mj[at];
            double v = ai[f];
            sa += v;
            qa += v * v;
            both += gi[f];
        }
        int shared = p - ki - kj + both;
        if (shared < req->min_shared || shared == 0) continue;
        double tau = t->size == k ? knn_pw_tau(cs, t->heap_d[0]) : -INFINITY;
        double e_ab = e * rs->rs[pos] + cs->eabs;
        double cc = cs->absolute ? fabs((double)pc[i]) : pc[i];
        if (knn_pw_below(cs, qs, qi, shared, sa, qa, cc, e_ab, xj[pos],
                         vj[pos], tau))
            continue;
        const double *aj = rs->pa + (size_t)pos * p;
        for (int f = 0; f < ki; f++) {
            double v = aj[miss[f]];
            sb += v;
            qb += v * v;
        }
        double lo = knn_pw_lower(cs, qs, qi, rs, rj, shared, pc[i], e_ab,
                                 sa, qa, sb, qb, tau);
        if (t->size == k && lo > t->heap_d[0]) continue;
        knn_pw_key(req, q, qi, r, rj, t, keyed);
    }
    *next = i;
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

/* Query rows per matrix product of the screen: up to 256, fewer where a
 * tile's products would pass 32 MB. */
static int knn_pw_tile_rows(int n_ref)
{
    int rows = (int)((32.0 * 1024 * 1024 / sizeof(float)) / n_ref);
    return rows > 256 ? 256 : rows < 1 ? 1 : rows;
}

/* Reference positions per block of step 3: their values by position fill
 * about 128 KB, which stay in cache while every row of the tile visits
 * them. */
static int knn_pw_block(int p)
{
    int block = (int)(128.0 * 1024 / sizeof(double) / p);
    return block < 16 ? 16 : block;
}

static void knn_pw_share_free(knn_pw_share *s)
{
    void *parts[] = {s->c, s->row, s->heap_d, s->heap_j, s->passed, s->pc,
                     s->count, s->next, s->seed_s, s->x, s->v, s->top,
                     s->seed_at, s->ms, s->seeded, s->keep};
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
        free(parts[i]);
    }
    memset(s, 0, sizeof *s);
}

static int knn_pw_share_alloc(knn_pw_share *s, int k, int most, int n_ref,
                              int rows)
{
    size_t m = (size_t)most + 1, cells = (size_t)rows * n_ref;
    s->c = malloc(cells * sizeof(float));
    s->row = calloc((size_t)rows, sizeof *s->row);
    s->heap_d = malloc((size_t)rows * k * sizeof(double));
    s->heap_j = malloc((size_t)rows * k * sizeof(int));
    s->passed = malloc(cells * sizeof(int));
    s->pc = malloc(cells * sizeof(float));
    s->count = malloc((size_t)rows * sizeof(int));
    s->next = malloc((size_t)rows * sizeof(int));
    s->seed_s = malloc((size_t)k * sizeof(float));
    s->x = malloc(m * sizeof(double));
    s->v = malloc(m * sizeof(double));
    s->top = malloc(m * sizeof(double));
    s->seed_at = malloc((size_t)k * sizeof(int));
    s->ms = malloc(m * sizeof(int));
    s->seeded = calloc((size_t)n_ref, 1);
    s->keep = malloc((size_t)n_ref);
    if (!s->c || !s->row || !s->heap_d || !s->heap_j ||
        !s->passed || !s->pc || !s->count || !s->next || !s->seed_s ||
        !s->x || !s->v || !s->top || !s->seed_at || !s->ms ||
        !s->seeded || !s->keep)
        return 0;
    for (int i = 0; i <= most; i++) s->ms[i] = i;
    for (int i = 0; i < rows; i++) {
        s->row[i].heap_d = s->heap_d + (size_t)i * k;
        s->row[i].heap_j = s->heap_j + (size_t)i * k;
    }
    return 1;
}

/* One tile of query positions [first, last) through the screen: their
 * products with every reference position (into s->c); steps 1 and 2 row
 * by row; step 3 block by block of reference positions, every row in
 * each; then each row's best k. */
static void knn_pw_screen_tile(const knn_pairwise_request *req,
                               const knn_pw_consts *cs,
                               const knn_pw_nodes *q,
                               const knn_pw_screen *qs,
                               const knn_pw_nodes *r,
                               const knn_pw_screen *rs, int first, int last,
                               int self, knn_pw_share *s, double *keyed,
                               knn_result *out, int n_query)
{
    int p = req->p, n_ref = r->n, rows = last - first;
    int block = knn_pw_block(p);
    double passes = 0.0;
    knn_sgemm_tn(n_ref, rows, p, rs->a32, qs->a32 + (size_t)first * p, s->c);
    const float *products = s->c;
    for (int i = 0; i < rows; i++) {
        int qi = qs->order ? qs->order[first + i] : first + i;
        const float *c = products + (size_t)i * n_ref;
        knn_pw_thread *t = &s->row[i];
        int seeds = knn_pw_seeds(req, cs, q, qi, self ? first + i : -1, r,
                                 rs, c, t, s, keyed);
        double tau = t->size == req->k ? knn_pw_tau(cs, t->heap_d[0])
                                       : -INFINITY;
        s->count[i] = knn_pw_filter(cs, qs, qi, rs, n_ref, tau, c, s,
                                    s->passed + (size_t)i * n_ref,
                                    s->pc + (size_t)i * n_ref);
        s->next[i] = 0;
        for (int j = 0; j < seeds; j++) s->seeded[s->seed_at[j]] = 0;
        passes += s->count[i];
    }
    /* Where the tile's rows pass fewer pairs than there are reference
     * nodes, they read a few of the values only, and streaming them all
     * costs more than it saves. */
    int stream = passes >= n_ref;
    for (int from = 0; from < n_ref; from += block) {
        int end = from + block < n_ref ? from + block : n_ref;
        /* The rows gather from all over the block: asked for in order,
         * its values come at the memory's full speed. */
        const double *values = rs->pa + (size_t)from * p;
        for (size_t at = 0; stream && at < (size_t)(end - from) * p;
             at += 8) {
            __builtin_prefetch(values + at);
        }
        for (int i = 0; i < rows; i++) {
            int qi = qs->order ? qs->order[first + i] : first + i;
            knn_pw_refine(req, cs, q, qs, qi, r, rs, self,
                          s->passed + (size_t)i * n_ref,
                          s->pc + (size_t)i * n_ref, s->count[i],
                          &s->next[i], end, &s->row[i], keyed);
        }
    }
    for (int i = 0; i < rows; i++) {
        int qi = qs->order ? qs->order[first + i] : first + i;
        knn_pw_write(req, &s->row[i], qi, out, n_query);
    }
}

/* The most features any of n nodes misses. */
static int knn_pw_max_miss(const knn_pw_nodes *nodes, int p)
{
    int most = 0;
    for (int j = 0; j < nodes->n; j++) {
        if (p - nodes->present[j] > most) most = p - nodes->present[j];
    }
    return most;
}

/* The most bytes of answers in a GPU search's host buffer (pinned, kept
 * with the device's context). */
#define KNN_PW_HOST_BYTES (64.0 * 1048576.0)

/* Pair visits (pairs times features) per block of rows on a GPU, and what
 * one visit of bicor costs against one of the other measures there
 * (inst/bench/RESULTS.md): each block takes well under a second, so that
 * Ctrl-C and the progress bar are answered between blocks. */
#define KNN_PW_GPU_VISITS 4e10
#define KNN_PW_GPU_BICOR_COST 13.0

/* Waits for the rows asked of gpu last, asking the interrupt callback
 * every 100 ms meanwhile, so that a long wait never holds Ctrl-C. */
static knn_status knn_pw_gpu_wait(knn_pw_gpu *gpu,
                                  const knn_pairwise_request *req,
                                  knn_report *report)
{
    for (;;) {
        int done = 0;
        knn_status st = knn_gpu_pw_wait(gpu, 100, &done, report->message);
        if (st != KNN_OK || done) return st;
        if (knn_interrupted(&req->cb))
            return knn_pw_fail(report, KNN_E_INTERRUPTED,
                               "interrupted by the user");
    }
}

/* Writes rows [first, last) of the query from a GPU's answers (row i's k
 * best at (i - first) * k). */
static void knn_pw_gpu_write(const knn_pairwise_request *req,
                             const knn_pw_gpu_rows *rows, int first, int last,
                             knn_result *out, int n_query)
{
    for (int qi = first; qi < last; qi++) {
        for (int slot = 0; slot < req->k; slot++) {
            size_t from = (size_t)(qi - first) * req->k + slot;
            size_t at = knn_result_at(out, (size_t)n_query, req->k,
                                      (size_t)qi, slot);
            knn_pw_put(out, at, rows->index[from], rows->distance[from]);
        }
    }
}

/* The search on a GPU: every pair keyed there and each row's best k
 * chosen there (knn_gpu_pw_*), in blocks of rows, each asked for once the
 * last is written out, so that an interrupted search waits for one block
 * at most. */
static knn_status knn_pw_on_gpu(const knn_pairwise_request *req,
                                const knn_pw_nodes *ref,
                                const knn_pw_nodes *query, int n_query,
                                knn_result *out, knn_report *report)
{
    double started = knn_seconds();
    double cost = req->measure == KNN_PAIRWISE_BICOR ? KNN_PW_GPU_BICOR_COST
                                                     : 1.0;
    int block = (int)fmin(fmax(KNN_PW_GPU_VISITS /
                               ((double)req->n_ref * req->p * cost), 1.0),
                          KNN_PW_HOST_BYTES / (12.0 * req->k));
    if (block < 1) block = 1;
    if (block > n_query) block = n_query;
    knn_pw_gpu_request g;
    memset(&g, 0, sizeof g);
    g.p = req->p;
    g.k = req->k;
    g.min_shared = req->min_shared;
    g.bicor = req->measure == KNN_PAIRWISE_BICOR;
    g.centred = req->measure != KNN_PAIRWISE_COSINE;
    g.absolute = req->measure == KNN_PAIRWISE_ABSPEARSON;
    g.ref = ref->x;
    g.ref_imax = ref->imax;
    g.ref_order = ref->order;
    g.ref_present = ref->present;
    g.n_ref = req->n_ref;
    g.query = query ? query->x : NULL;
    g.query_imax = query ? query->imax : NULL;
    g.query_order = query ? query->order : NULL;
    g.query_present = query ? query->present : NULL;
    g.n_query = query ? n_query : 0;
    g.block_rows = block;
    g.memory_bytes = req->memory_bytes;
    g.n_devices = req->n_devices;
    memcpy(g.devices, req->devices, sizeof g.devices);
    knn_pw_gpu *gpu = NULL;
    knn_pw_gpu_rows host;
    int chunk = 0;
    knn_status st = knn_gpu_pw_open(&g, &gpu, &host, &chunk, report);
    if (st == KNN_OK) st = knn_result_allocate(out, report->message,
                                               sizeof report->message);
    report->seconds_setup = knn_seconds() - started;
    for (int first = 0; st == KNN_OK && first < n_query; first += block) {
        int last = first + block < n_query ? first + block : n_query;
        st = knn_gpu_pw_start(gpu, first, last - first, report->message);
        if (st == KNN_OK) st = knn_pw_gpu_wait(gpu, req, report);
        if (st != KNN_OK) break;
        knn_pw_gpu_write(req, &host, first, last, out, n_query);
        if (knn_interrupted(&req->cb)) {
            st = knn_pw_fail(report, KNN_E_INTERRUPTED,
                             "interrupted by the user");
        } else if (req->cb.progress) {
            req->cb.progress(req->cb.ctx, last, n_query);
        }
    }
    knn_gpu_pw_close(gpu, st);
    report->seconds_search = knn_seconds() - started - report->seconds_setup;
    snprintf(report->precision, sizeof report->precision,
             "fp64 pairwise-complete keys on the GPU");
    report->candidates = req->n_ref - (query == NULL);
    report->row_tile = chunk;
    report->col_tile = req->n_ref;
    return st;
}

knn_status knn_pairwise_search(const knn_pairwise_request *req,
                               knn_result *out, knn_report *report)
{
    memset(report, 0, sizeof *report);
    int self = req->query == NULL;
    int n_query = self ? req->n_ref : req->n_query, p = req->p;
    int n_ref = req->n_ref;
    int bicor = req->measure == KNN_PAIRWISE_BICOR;
    int threads = knn_threads(req->threads);
    double started = knn_seconds();
    if (req->k < 1 || req->k > n_ref - self || p < 1)
        return knn_pw_fail(report, KNN_E_INVALID, "k or sizes out of range");
    if (knn_has_infinite(req->ref, (size_t)p * n_ref) ||
        (!self && knn_has_infinite(req->query, (size_t)p * n_query)))
        return knn_pw_fail(report, KNN_E_NONFINITE, "infinite values");

    knn_pw_nodes ref, query;
    knn_pw_screen ref_sc, query_sc;
    knn_pw_consts cs;
    memset(&query, 0, sizeof query);
    memset(&ref_sc, 0, sizeof ref_sc);
    memset(&query_sc, 0, sizeof query_sc);
    knn_status st = knn_pw_prepare(&ref, req->ref, p, n_ref, bicor,
                                   threads);
    if (st != KNN_OK) return knn_pw_fail(report, st, "out of memory");
    if (!self) st = knn_pw_prepare(&query, req->query, p, n_query, bicor,
                                   threads);
    const knn_pw_nodes *q = self ? &ref : &query;
    if (st == KNN_OK && req->backend == KNN_BACKEND_GPU) {
        report->seconds_prepare = knn_seconds() - started;
        st = knn_pw_on_gpu(req, &ref, self ? NULL : &query, n_query, out,
                           report);
        knn_pw_free(&ref);
        knn_pw_free(&query);
        return st;
    }
    int most = 0;
    if (st == KNN_OK && !bicor) {
        most = knn_pw_max_miss(&ref, p);
        if (!self && knn_pw_max_miss(&query, p) > most)
            most = knn_pw_max_miss(&query, p);
        knn_pw_consts_set(&cs, p, req->measure, most);
        st = knn_pw_screen_prepare(&ref_sc, &ref, &cs, 1, threads);
        if (st == KNN_OK && !self)
            st = knn_pw_screen_prepare(&query_sc, &query, &cs, 0, threads);
    }
    const knn_pw_screen *qs = self ? &ref_sc : &query_sc;

    /* Each thread's share: bicor's heap (its indices rounded up to whole
     * doubles); the screen's (knn_pw_share). */
    int rows = knn_pw_tile_rows(n_ref);
    size_t heap_ints = ((size_t)req->k * sizeof(int) + sizeof(double) - 1) /
                       sizeof(double);
    size_t per = (size_t)req->k + heap_ints;
    double *scratch = st == KNN_OK
        ? malloc((size_t)threads * per * sizeof(double)) : NULL;
    knn_pw_thread *ts = calloc((size_t)threads, sizeof *ts);
    knn_pw_share *shares = calloc((size_t)threads, sizeof *shares);
    double *found = calloc((size_t)threads, sizeof(double));
    if (st == KNN_OK && (!scratch || !ts || !shares || !found))
        st = KNN_E_NOMEM;
    for (int i = 0; st == KNN_OK && !bicor && i < threads; i++) {
        if (!knn_pw_share_alloc(&shares[i], req->k, most, n_ref, rows))
            st = KNN_E_NOMEM;
    }
    if (st != KNN_OK) knn_pw_fail(report, st, "out of memory");
    if (st == KNN_OK) {
        st = knn_result_allocate(out, report->message,
                                 sizeof report->message);
    }
    for (int i = 0; st == KNN_OK && i < threads; i++) {
        ts[i].heap_d = scratch + (size_t)i * per;
        ts[i].heap_j = (int *)(ts[i].heap_d + req->k);
    }
    report->seconds_prepare = knn_seconds() - started;

    /* Rows per block between polls: about 5e7 feature visits per thread
     * for bicor (each pair's forms), or a few tiles of products. */
    double visits = (double)n_ref * p;
    int unit = bicor ? 1 : rows;
    double budget = bicor ? 5e7 : 2e8;
    int per_thread = visits * unit >= budget ? 1
                   : (int)(budget / (visits * unit));
    int block = per_thread * threads * unit;
    if (block > n_query) block = n_query;
    /* One engine thread leaves the BLAS its own threads for the products,
     * as the search does (knn_cpu.c). */
    int blas_before = bicor || threads == 1 ? 0
                                            : knn_blas_hold_one_thread();
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
            int tiles = (last - first + rows - 1) / rows;
            #pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
            for (int tile = 0; tile < tiles; tile++) {
                int id = knn_thread_number();
                int a = first + tile * rows;
                int b = a + rows < last ? a + rows : last;
                knn_pw_screen_tile(req, &cs, q, qs, &ref, &ref_sc, a, b,
                                   self, &shares[id], &found[id], out,
                                   n_query);
            }
        }
        if (knn_interrupted(&req->cb)) {
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
                   : "fp32 products + fp64 pairwise-complete re-rank");
    double candidates = 0.0;
    for (int i = 0; found && i < threads; i++) candidates += found[i];
    report->candidates = bicor ? n_ref - self : candidates / n_query;
    report->row_tile = block;
    report->col_tile = n_ref;
    for (int i = 0; shares && i < threads; i++) {
        knn_pw_share_free(&shares[i]);
    }
    free(scratch);
    free(ts);
    free(shares);
    free(found);
    knn_pw_screen_free(&ref_sc);
    knn_pw_screen_free(&query_sc);
    knn_pw_free(&ref);
    knn_pw_free(&query);
    return st;
}
