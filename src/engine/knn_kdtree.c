/*
 * knn_kdtree.c: exact search for distance metrics in few dimensions, on the
 * CPU. At one to a few features the n x n scan is the wrong exact
 * algorithm: 200000 x 1 took over a minute that way. A k-d tree over the
 * reference nodes visits O(k + log n) leaves per query instead.
 *
 * Exactness: every distance is the canonical key of knn_exact.h computed
 * from the nodes as given, as the product path does (knn_nodes_key), and each
 * query keeps its k best by (reported distance, index) in a heap, so the
 * answer is the same bits as the product path's. A subtree is skipped only
 * when a lower bound on every key inside it, shrunk by the bound's own
 * rounding, cannot beat the heap's worst entry: its distance is larger, or
 * equal while every node below has a larger index.
 *
 * Layout: identical reference nodes are one point of the tree (thousands
 * of duplicates, as log-counts have, would otherwise be visited one by
 * one), named by its smallest node index and listing its nodes in
 * ascending order. Tree nodes hold a permutation of these points, copied
 * in tree order (p values each, contiguous), with their tight bounding box
 * and smallest node index.
 * Queries run in parallel in chunks; the interrupt callback is polled and
 * progress reported between chunks, and polled while the tree is built.
 * Memory is O(n p + n k).
 */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "knn_backend.h"
#include "knn_exact.h"
#include "knn_kdtree.h"
#include "knn_prepare.h"
#include "knn_threads.h"

/* Points per leaf: small enough that a leaf's scan stays cheap, large
 * enough that boxes and recursion cost little per point. */
#define KNN_KD_LEAF 24
/* Queries between two interrupt polls: about 10 ms of work at p = 3. */
#define KNN_KD_CHUNK 16384
/* The build polls too (millions of points take long): its sort, in runs
 * of this many rows merged a pass at a time, and its recursion, every
 * this many points placed (a few milliseconds each). */
#define KNN_KD_SORT_RUN 65536
#define KNN_KD_BUILD_POLL 1e6
/* Deepest tree: log2(2^31 / KNN_KD_LEAF) levels, with room to spare. */
#define KNN_KD_STACK 96

typedef struct {
    int lo, hi;        /* its points: [lo, hi) in tree order */
    int left, right;   /* children, or -1 for a leaf */
    int min_index;     /* smallest reference node index among its points */
} knn_kd_node;

typedef struct {
    int p;
    knn_kd_node *nodes;
    int n_nodes;
    double *box;       /* per tree node: p lower then p upper bounds */
    int n_points;      /* distinct points */
    int *order;        /* tree position -> the point's smallest node */
    double *points;    /* the points in tree order, p x n_points */
    int *first, *count; /* tree position -> its nodes in `members` */
    int *members;      /* reference nodes by point in tree order, each
                          point's ascending */
    const knn_callbacks *cb; /* polled while building */
    double unpolled;   /* points placed since the last poll */
    int stopped;       /* the callback asked to stop the build */
} knn_kd_tree;

/* Whether the build is to stop: polls cb after KNN_KD_BUILD_POLL points
 * (`placed` more now). */
static int knn_kd_stop(knn_kd_tree *t, double placed)
{
    if (t->stopped) return 1;
    t->unpolled += placed;
    if (t->unpolled < KNN_KD_BUILD_POLL) return 0;
    t->unpolled = 0.0;
    if (knn_interrupted(t->cb))
        t->stopped = 1;
    return t->stopped;
}

int knn_kdtree_suits(const knn_request *req)
{
    if (knn_is_correlation(req->metric)) return 0;
    if (req->algorithm == KNN_ALGO_TREE) return 1;
    if (req->algorithm != KNN_ALGO_AUTO) return 0;
    return (req->p <= KNN_KD_MAX_FEATURES && req->n_ref >= KNN_KD_MIN_NODES)
        || (req->p <= KNN_KD_WIDE_FEATURES &&
            req->n_ref >= KNN_KD_WIDE_MIN_NODES);
}

static void knn_kd_free(knn_kd_tree *t)
{
    free(t->nodes);
    free(t->box);
    free(t->order);
    free(t->points);
    free(t->first);
    free(t->count);
    free(t->members);
    memset(t, 0, sizeof *t);
}

typedef struct {
    const double *x;
    int p, index;
} knn_kd_row;

/* Lexicographic order of the rows' values, then of their indices. */
static int knn_kd_row_cmp(const void *a, const void *b)
{
    const knn_kd_row *r = a, *s = b;
    for (int f = 0; f < r->p; f++)
        if (r->x[f] != s->x[f]) return r->x[f] < s->x[f] ? -1 : 1;
    return (r->index > s->index) - (r->index < s->index);
}

/* Sorts rows[0..n) by knn_kd_row_cmp: runs of KNN_KD_SORT_RUN rows by
 * qsort, then passes that merge pairs of runs (a stable merge of a total
 * order, so the result is qsort's), polling between them. Returns
 * KNN_E_NOMEM or KNN_E_INTERRUPTED (rows then in some order). */
static knn_status knn_kd_sort_rows(knn_kd_tree *t, knn_kd_row *rows, int n)
{
    for (int a = 0; a < n; a += KNN_KD_SORT_RUN) {
        int m = n - a < KNN_KD_SORT_RUN ? n - a : KNN_KD_SORT_RUN;
        qsort(rows + a, (size_t)m, sizeof *rows, knn_kd_row_cmp);
        if (knn_kd_stop(t, 16.0 * m)) return KNN_E_INTERRUPTED;
    }
    if (n <= KNN_KD_SORT_RUN) return KNN_OK;
    knn_kd_row *tmp = malloc((size_t)n * sizeof *tmp);
    if (!tmp) return KNN_E_NOMEM;
    knn_kd_row *src = rows, *dst = tmp;
    for (size_t run = KNN_KD_SORT_RUN; run < (size_t)n; run *= 2) {
        for (size_t a = 0; a < (size_t)n; a += 2 * run) {
            size_t mid = a + run < (size_t)n ? a + run : (size_t)n;
            size_t end = a + 2 * run < (size_t)n ? a + 2 * run : (size_t)n;
            size_t i = a, j = mid, o = a;
            while (i < mid && j < end)
                dst[o++] = knn_kd_row_cmp(&src[j], &src[i]) < 0 ? src[j++]
                                                                : src[i++];
            while (i < mid) dst[o++] = src[i++];
            while (j < end) dst[o++] = src[j++];
            if (knn_kd_stop(t, 2.0 * (end - a))) {
                free(tmp);
                return KNN_E_INTERRUPTED;
            }
        }
        knn_kd_row *swap = src;
        src = dst;
        dst = swap;
    }
    if (src != rows) memcpy(rows, src, (size_t)n * sizeof *rows);
    free(tmp);
    return KNN_OK;
}

static int knn_kd_same_point(const knn_kd_row *r, const knn_kd_row *s)
{
    for (int f = 0; f < r->p; f++)
        if (r->x[f] != s->x[f]) return 0;
    return 1;
}

/* Groups the n reference nodes by point: fills t->members (grouped,
 * ascending within a group), t->order with each point's smallest node,
 * and group_at[node] = its group for those nodes, *starts (n_points + 1
 * offsets into members, allocated here). Returns KNN_E_NOMEM or
 * KNN_E_INTERRUPTED. */
static knn_status knn_kd_group(knn_kd_tree *t, const knn_nodes *ref,
                               int *group_at, int **starts)
{
    int n = ref->n, p = t->p;
    knn_kd_row *rows = malloc((size_t)n * sizeof *rows);
    *starts = malloc(((size_t)n + 1) * sizeof(int));
    if (!rows || !*starts) {
        free(rows);
        return KNN_E_NOMEM;
    }
    for (int i = 0; i < n; i++) {
        rows[i].x = ref->raw + (size_t)i * p;
        rows[i].p = p;
        rows[i].index = i;
    }
    knn_status st = knn_kd_sort_rows(t, rows, n);
    if (st != KNN_OK) {
        free(rows);
        return st;
    }
    int g = 0;
    for (int i = 0; i < n; i++) {
        t->members[i] = rows[i].index;
        if (i > 0 && knn_kd_same_point(&rows[i], &rows[i - 1])) continue;
        (*starts)[g] = i;
        t->order[g] = rows[i].index;
        group_at[rows[i].index] = g;
        g++;
    }
    (*starts)[g] = n;
    t->n_points = g;
    free(rows);
    return KNN_OK;
}

/* Tight box of points order[lo..hi) into box (p lower, p upper). */
static void knn_kd_fit_box(const knn_kd_tree *t, const double *canon, int lo,
                           int hi, double *box)
{
    int p = t->p;
    for (int f = 0; f < p; f++) {
        box[f] = INFINITY;
        box[p + f] = -INFINITY;
    }
    for (int i = lo; i < hi; i++) {
        const double *x = canon + (size_t)t->order[i] * p;
        for (int f = 0; f < p; f++) {
            if (x[f] < box[f]) box[f] = x[f];
            if (x[f] > box[p + f]) box[p + f] = x[f];
        }
    }
}

/* Whether node a sorts before node b on feature f: by value, then index,
 * so that identical values split by index and a query meets the smaller
 * indices of a tie first (the subtree bound then turns the rest away). */
static int knn_kd_before(const double *canon, int p, int f, int a, int b)
{
    double x = canon[(size_t)a * p + f], y = canon[(size_t)b * p + f];
    return x < y || (x == y && a < b);
}

/* Reorders order[lo..hi) so that position mid holds the node that would
 * sit there sorted by knn_kd_before, those before it in front. */
static void knn_kd_select(int *order, const double *canon, int p, int f,
                          int lo, int hi, int mid)
{
    while (hi - lo > 1) {
        int pivot = order[lo + (hi - lo) / 2];
        int lt = lo, i = lo, gt = hi;
        while (i < gt) {
            int v = order[i];
            if (knn_kd_before(canon, p, f, v, pivot)) {
                order[i++] = order[lt];
                order[lt++] = v;
            } else if (v != pivot) {
                order[i] = order[--gt];
                order[gt] = v;
            } else {
                i++;
            }
        }
        if (mid < lt) hi = lt;
        else if (mid >= gt) lo = gt;
        else return;
    }
}

/* Builds the subtree of points order[lo..hi); returns its node number.
 * Once the build is to stop (knn_kd_stop) it leaves subtrees unbuilt. */
static int knn_kd_build_node(knn_kd_tree *t, const double *canon, int lo,
                             int hi)
{
    int p = t->p, id = t->n_nodes++;
    knn_kd_stop(t, hi - lo);
    knn_kd_node *nd = &t->nodes[id];
    double *box = t->box + (size_t)id * 2 * p;
    knn_kd_fit_box(t, canon, lo, hi, box);
    nd->lo = lo;
    nd->hi = hi;
    nd->left = nd->right = -1;
    int widest = 0;
    for (int f = 1; f < p; f++)
        if (box[p + f] - box[f] > box[p + widest] - box[widest]) widest = f;
    if (hi - lo <= KNN_KD_LEAF || t->stopped) {
        nd->min_index = t->order[lo];
        for (int i = lo + 1; i < hi; i++)
            if (t->order[i] < nd->min_index) nd->min_index = t->order[i];
        return id;
    }
    /* Identical points split too, by index (knn_kd_before): one leaf of
     * thousands of duplicates would be scanned whole by every query. */
    int mid = lo + (hi - lo) / 2;
    knn_kd_select(t->order, canon, p, widest, lo, hi, mid);
    int left = knn_kd_build_node(t, canon, lo, mid);
    int right = knn_kd_build_node(t, canon, mid, hi);
    nd = &t->nodes[id];
    nd->left = left;
    nd->right = right;
    int a = t->nodes[left].min_index, b = t->nodes[right].min_index;
    nd->min_index = a < b ? a : b;
    return id;
}

static knn_status knn_kd_build(knn_kd_tree *t, const knn_nodes *ref, int p,
                               const knn_callbacks *cb)
{
    int n = ref->n;
    memset(t, 0, sizeof *t);
    t->p = p;
    t->cb = cb;
    int cap = 2 * (n / (KNN_KD_LEAF / 2) + 1);
    int *group_at = malloc((size_t)n * sizeof(int)), *starts = NULL;
    t->nodes = malloc((size_t)cap * sizeof *t->nodes);
    t->box = malloc((size_t)cap * 2 * p * sizeof(double));
    t->order = malloc((size_t)n * sizeof(int));
    t->members = malloc((size_t)n * sizeof(int));
    knn_status st = KNN_E_NOMEM;
    if (group_at && t->nodes && t->box && t->order && t->members)
        st = knn_kd_group(t, ref, group_at, &starts);
    int d = t->n_points;
    if (st == KNN_OK) {
        t->points = malloc((size_t)d * p * sizeof(double));
        t->first = malloc((size_t)d * sizeof(int));
        t->count = malloc((size_t)d * sizeof(int));
        if (!t->points || !t->first || !t->count) st = KNN_E_NOMEM;
    }
    int *grouped = st == KNN_OK ? malloc((size_t)n * sizeof(int)) : NULL;
    if (st == KNN_OK && !grouped) st = KNN_E_NOMEM;
    if (st == KNN_OK) {
        knn_kd_build_node(t, ref->raw, 0, d);
        if (t->stopped) st = KNN_E_INTERRUPTED;
    }
    if (st == KNN_OK) {
        /* Points and their nodes in tree order: a leaf's scan then reads
         * both in sequence (in the grouping's order, each accepted point
         * cost a cache miss: 1.7 times the search time at 200000 x 3). */
        int at = 0;
        for (int i = 0; i < d; i++) {
            int g = group_at[t->order[i]];
            memcpy(t->points + (size_t)i * p,
                   ref->raw + (size_t)t->order[i] * p, p * sizeof(double));
            t->first[i] = at;
            t->count[i] = starts[g + 1] - starts[g];
            memcpy(grouped + at, t->members + starts[g],
                   (size_t)t->count[i] * sizeof(int));
            at += t->count[i];
        }
        free(t->members);
        t->members = grouped;
    }
    free(group_at);
    free(starts);
    if (st != KNN_OK) {
        free(grouped);
        knn_kd_free(t);
    }
    return st;
}

/* A query's k best so far: a max-heap by (distance, index), worst on top.
 * A distance metric's key is the distance it reports (knn_key_dist). */
typedef struct {
    double dist;
    int index;
} knn_kd_item;

typedef struct {
    knn_kd_item *items;
    int size, k;
} knn_kd_heap;

static int knn_kd_worse(const knn_kd_item *a, const knn_kd_item *b)
{
    return a->dist > b->dist || (a->dist == b->dist && a->index > b->index);
}

/* Sifts x down from the top of a full heap. */
static void knn_kd_heap_replace_top(knn_kd_heap *h, const knn_kd_item *x)
{
    int c = 0;
    for (;;) {
        int l = 2 * c + 1, r = l + 1;
        const knn_kd_item *top = x;
        int at = c;
        if (l < h->size && knn_kd_worse(&h->items[l], top)) {
            top = &h->items[l];
            at = l;
        }
        if (r < h->size && knn_kd_worse(&h->items[r], top)) at = r;
        if (at == c) break;
        h->items[c] = h->items[at];
        c = at;
    }
    h->items[c] = *x;
}

/* Offers node j at distance dist; returns whether the heap took it. */
static int knn_kd_heap_offer(knn_kd_heap *h, double dist, int j)
{
    knn_kd_item x = {dist, j};
    if (h->size == h->k) {
        if (!knn_kd_worse(&h->items[0], &x)) return 0;
        knn_kd_heap_replace_top(h, &x);
        return 1;
    }
    int c = h->size++;
    while (c > 0) {
        int up = (c - 1) / 2;
        if (knn_kd_worse(&h->items[up], &x)) break;
        h->items[c] = h->items[up];
        c = up;
    }
    h->items[c] = x;
    return 1;
}

/* Offers the nodes of tree position i, at `dist` from the query, in
 * ascending index: once one is turned away, the rest (same distance,
 * larger index) would be too. */
static void knn_kd_offer_point(const knn_kd_tree *t, int i, double dist,
                               int itself, knn_kd_heap *h)
{
    const int *nodes = t->members + t->first[i];
    for (int m = 0; m < t->count[i]; m++) {
        if (nodes[m] == itself) continue;
        if (!knn_kd_heap_offer(h, dist, nodes[m])) return;
    }
}

/* The point of [lo, hi] nearest to v. */
static inline double knn_kd_clamp(double v, double lo, double hi)
{
    return v < lo ? lo : v > hi ? hi : v;
}

/* A lower bound on the distance of any point in the box from q: the key
 * of the box's nearest point (knn_key_dist, whose plain and scaled sums
 * each grow with the differences and lie within relative (p + 2) units of
 * the exact distance), shrunk by that rounding (relative 2(p + 2) units
 * for the bound and as much for a point's key, plus as many of the
 * smallest subnormal where the result underflows). */
static double knn_kd_box_key(const knn_space *sp, const double *q,
                             const double *box)
{
    int p = sp->p;
    knn_dist_acc plain = {0.0};
    for (int f = 0; f < p; f++) {
        double c = knn_kd_clamp(q[f], box[f], box[p + f]);
        knn_key_dist_more(sp->metric, &c, q + f, 1, &plain);
    }
    double s = plain.s;
    if (knn_key_dist_plain(s)) {
        if (sp->metric == KNN_EUCLIDEAN) s = sqrt(s);
    } else {
        knn_dist_sum acc;
        knn_dist_sum_init(&acc);
        for (int f = 0; f < p; f++)
            knn_dist_sum_add(&acc, sp->metric,
                             knn_kd_clamp(q[f], box[f], box[p + f]), q[f]);
        s = knn_dist_sum_value(sp->metric, &acc);
    }
    double slack = 4.0 * (p + 4.0);
    s = s * (1.0 - slack * KNN_U64) - slack * DBL_TRUE_MIN;
    return s > 0.0 ? s : 0.0;
}

/* Whether a subtree whose distances are at least `bound` can hold a node
 * that beats the heap's worst entry: a smaller distance, or the same one
 * with a smaller index. */
static int knn_kd_may_improve(const knn_kd_heap *h, double bound,
                              int min_index)
{
    if (h->size < h->k) return 1;
    if (bound > h->items[0].dist) return 0;
    if (min_index < h->items[0].index) return 1;
    return bound < h->items[0].dist;
}

/* The k nearest reference nodes of query node qi (skipping `itself`). */
static void knn_kd_query(const knn_kd_tree *t, const knn_space *sp,
                         const knn_nodes *query, int qi, int itself,
                         knn_kd_heap *h)
{
    int p = sp->p;
    const double *q = query->raw + (size_t)qi * p;
    int stack[KNN_KD_STACK];
    double bounds[KNN_KD_STACK];
    int top = 0;
    stack[top] = 0;
    bounds[top++] = 0.0;
    h->size = 0;
    while (top > 0) {
        top--;
        const knn_kd_node *nd = &t->nodes[stack[top]];
        if (!knn_kd_may_improve(h, bounds[top], nd->min_index))
            continue;
        if (nd->left < 0) {
            for (int i = nd->lo; i < nd->hi; i++) {
                double dist = knn_key_dist(sp->metric, q,
                                           t->points + (size_t)i * p, p);
                if (h->size < h->k || dist <= h->items[0].dist)
                    knn_kd_offer_point(t, i, dist, itself, h);
            }
            continue;
        }
        int child[2] = {nd->left, nd->right};
        double b[2];
        for (int c = 0; c < 2; c++)
            b[c] = knn_kd_box_key(sp, q, t->box + (size_t)child[c] * 2 * p);
        /* The nearer child goes on top, to be visited first. */
        int nearer = b[1] < b[0];
        stack[top] = child[!nearer];
        bounds[top++] = b[!nearer];
        stack[top] = child[nearer];
        bounds[top++] = b[nearer];
    }
}

static int knn_kd_item_cmp(const void *a, const void *b)
{
    const knn_kd_item *x = a, *y = b;
    return knn_kd_worse(x, y) - knn_kd_worse(y, x);
}

/* Writes query qi's k best, sorted, into row qi of the result. */
static void knn_kd_emit(knn_kd_heap *h, const knn_space *sp, int qi, int nq,
                        knn_result *out)
{
    int k = h->k;
    qsort(h->items, (size_t)k, sizeof(knn_kd_item), knn_kd_item_cmp);
    for (int r = 0; r < k; r++) {
        const knn_kd_item *x = &h->items[r];
        size_t at = knn_result_at(out, (size_t)nq, k, (size_t)qi, r);
        out->index[at] = x->index + out->index_base;
        knn_key_output(sp->metric, x->dist, &out->distance[at],
                       &out->weight[at]);
    }
}

/* Queries [q0, q1) on `threads` threads. Returns KNN_E_NOMEM when a
 * thread's heap cannot be had. */
static knn_status knn_kd_query_range(const knn_kd_tree *t,
                                     const knn_space *sp,
                                     const knn_nodes *query, int self,
                                     int q0, int q1, int nq, int k,
                                     int threads, knn_result *out)
{
    int failed = 0;
    #pragma omp parallel num_threads(threads) reduction(| : failed)
    {
        knn_kd_heap h = {malloc((size_t)k * sizeof(knn_kd_item)), 0, k};
        if (!h.items) failed = 1;
        #pragma omp for schedule(dynamic, 256)
        for (int qi = q0; qi < q1; qi++) {
            if (!h.items) continue;
            knn_kd_query(t, sp, query, qi, self ? qi : -1, &h);
            knn_kd_emit(&h, sp, qi, nq, out);
        }
        free(h.items);
    }
    return failed ? KNN_E_NOMEM : KNN_OK;
}

knn_status knn_kdtree_search(const knn_request *req, knn_result *out,
                             knn_report *report)
{
    double t0 = knn_seconds();
    int self = req->query == NULL, nq = self ? req->n_ref : req->n_query;
    int threads = knn_threads(req->threads);
    knn_space space;
    knn_nodes ref = {0}, query_nodes = {0};
    knn_kd_tree tree = {0};
    knn_status st = knn_space_init(&space, req);
    if (st == KNN_OK)
        st = knn_nodes_prepare(&ref, &space, req->ref, req->n_ref, 1, 0,
                               threads, &req->cb);
    if (st == KNN_OK && !self)
        st = knn_nodes_prepare(&query_nodes, &space, req->query,
                               req->n_query, 0, 0, threads, &req->cb);
    if (st == KNN_OK) st = knn_kd_build(&tree, &ref, req->p, &req->cb);
    const knn_nodes *query = self ? &ref : &query_nodes;
    double t1 = knn_seconds();
    for (int q0 = 0; st == KNN_OK && q0 < nq; q0 += KNN_KD_CHUNK) {
        int q1 = nq - q0 < KNN_KD_CHUNK ? nq : q0 + KNN_KD_CHUNK;
        st = knn_kd_query_range(&tree, &space, query, self, q0, q1, nq,
                                req->k, threads, out);
        if (st == KNN_OK && knn_interrupted(&req->cb)) st = KNN_E_INTERRUPTED;
        if (st == KNN_OK && req->cb.progress)
            req->cb.progress(req->cb.ctx, q1, nq);
    }
    if (st == KNN_OK) {
        snprintf(report->device, sizeof report->device,
                 "cpu (%d threads, k-d tree)", threads);
        snprintf(report->precision, sizeof report->precision,
                 "fp64 exact k-d tree");
        report->seconds_prepare = t1 - t0;
        report->seconds_search = knn_seconds() - t1;
        report->candidates = req->k;
        report->row_tile = KNN_KD_CHUNK;
        report->col_tile = tree.n_points;
    } else if (st == KNN_E_NOMEM) {
        snprintf(report->message, sizeof report->message,
                 "out of memory on the CPU building a k-d tree of %d nodes "
                 "with %d threads: lower 'threads', or search fewer nodes "
                 "at a time", req->n_ref, threads);
    } else if (st == KNN_E_INTERRUPTED) {
        snprintf(report->message, sizeof report->message,
                 "stopped by the user; all memory released");
    }
    knn_kd_free(&tree);
    knn_nodes_free(&ref);
    knn_nodes_free(&query_nodes);
    knn_space_free(&space);
    return st;
}
