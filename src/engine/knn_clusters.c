/*
 * knn_clusters.c: exact search by clusters on the CPU, for Euclidean and
 * squared Euclidean distances and for the correlations whose fast vectors
 * are unit vectors (KMKNN's pruning, with BLAS products).
 *
 * The reference nodes' fast vectors (knn_prepare.h: the frame in which
 * every product path finds candidates) are partitioned by a few rounds of
 * k-means on a sample (about sqrt(n) clusters, knn_km_seed's seeds, in
 * float64; the assignment may be any, it only costs or saves work). Each
 * node is held as its residual from its cluster's centre, and a pair's
 * fast score is assembled from the residuals' product (float32 BLAS) and
 * centre terms in float64:
 *   |f_i - f_j|^2 = |D + a_i|^2 + |b_j|^2 - 2 D.b_j - 2 a_i.b_j,
 *   D = c_A - c_B, a_i = f_i - c_A, b_j = f_j - c_B,
 * so the float32 error scales with the clusters' radii, not with the
 * nodes' norms around one global centre: dense clusters, steep principal
 * components and outliers no longer widen every row's margin. The fast
 * vectors of Pearson, Spearman and cosine are unit vectors whose product
 * is r, and their fast score -r is the same sum halved, less the two
 * vectors' squared norms halved (|f_i - f_j|^2 = |f_i|^2 + |f_j|^2 -
 * 2 f_i.f_j), so the same residual products, margins and triangle bounds
 * serve them, on distances between unit vectors. Column
 * clusters wider than the row cluster's cap (knn_km_caps) are multiplied
 * in float64, so no wide cluster widens the margins of the others.
 *
 * Pruning is exact: for a task of rows of cluster A, column clusters are
 * visited by the lower bound |c_A - c_B| - r_B of their distance, nearest
 * first, so the rows' candidate bounds (knn_pool.h) tighten early; the
 * visit stops at the first cluster whose bound, less the rows' radii,
 * exceeds every row's reach (its pool bound plus margin, as a distance).
 * Within a visited cluster, whose entries are sorted by their distance to
 * the centre, each row multiplies only the entries whose distance to the
 * centre lies within its reach of its own (the triangle inequality both
 * ways). Every bound is computed in float64 and widened by its own
 * rounding (knn_km_up, knn_km_down), so a node skipped here is one the
 * pool would have turned away: the pools, and the float64 re-rank of
 * knn_exact.h that follows, give the bits of every other path.
 *
 * Identical reference nodes (equal input values) in one cluster are one
 * point: a row is offered at most k of its nodes, the smallest indices,
 * since the others tie with them and lose on the index.
 *
 * Under KNN_ALGO_AUTO the search measures first, on the first rows of a
 * sample of clusters, what share of the pairs it multiplies; where the
 * clusters prune too little (N(0,1) in many dimensions), the product scan,
 * which uses the symmetry of a self search, is faster and takes over
 * (knn_km_pays). The search estimates that share on the k-means sample
 * before it assigns the other nodes (knn_km_sample_share), and where
 * even that estimate, which errs low, is past the limit, the scan takes
 * over at once, without the partition's cost. Memory: the
 * residuals (float64 and float32) of the reference's points and of the
 * query nodes (a self search's rows borrow their points'); fast vectors
 * are formed node by node as they are needed.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "knn_backend.h"
#include "knn_blas.h"
#include "knn_clusters.h"
#include "knn_cpu.h"
#include "knn_exact.h"
#include "knn_pool.h"
#include "knn_prepare.h"
#include "knn_threads.h"

/* Thresholds of the automatic choice, measured by inst/bench/clusters.R
 * (its header says which columns set which): from this many reference
 * nodes the partition costs less than it saves on structured data; past
 * this share of the pairs multiplied in the sample, the product scan
 * (which computes each pair once in a self search) is faster. */
#define KNN_KM_MIN_NODES 1000
#define KNN_KM_MAX_SHARE 0.25
/* Features up to which auto takes the clusters: measured to 500
 * (log-counts, inst/bench/clusters.R --kinds=logcounts); beyond, the
 * scan. */
#define KNN_KM_MAX_FEATURES 512
/* Row clusters whose first rows (at most KNN_KM_PILOT_ROWS) are
 * searched to measure the share. */
#define KNN_KM_PILOT 8
#define KNN_KM_PILOT_ROWS 32
/* Sampled nodes whose share of multiplied pairs is estimated before
 * every node is assigned (knn_km_sample_share), and the most neighbours
 * among the sample it looks for. */
#define KNN_KM_SAMPLE_ROWS 32
#define KNN_KM_SAMPLE_MAX_K 64
/* The estimate runs after this many rounds of k-means: on data the
 * clusters cannot prune the rounds after it are wasted, and on data they
 * prune its share is far below the limit already (cell types, genes at
 * many levels and log-counts estimate a tenth to a half of it). */
#define KNN_KM_ESTIMATE_ROUNDS 1
/* Rounds of k-means: later rounds move few nodes, and any partition
 * gives the same answer. They run on a sample of this many nodes per
 * cluster, spread over the node order (the centres they find are about
 * those of the whole, at a fraction of the products); then every node
 * goes to its nearest centre. */
#define KNN_KM_ROUNDS 4
#define KNN_KM_SAMPLE 24
/* Rows per task (their residuals and pools stay in the cache), columns
 * per product, nodes per assignment product. */
#define KNN_KM_ROWS 128
#define KNN_KM_COLS 512
#define KNN_KM_ASSIGN 256
/* Rows per product within a task: rows sorted by where their points
 * start share most of them. */
#define KNN_KM_GROUP 32
/* Rows between two interrupt polls: at most this many, and at most as
 * many as multiply KNN_KM_POLL_WORK values (rows x reference nodes x
 * features, as if no pair were pruned, which data the clusters do not
 * prune come close to), so that Ctrl-C waits a small part of a second on
 * any data; at least a task per thread. */
#define KNN_KM_POLL_ROWS 4096
#define KNN_KM_POLL_WORK 4e8
/* A row cluster multiplies in float32 the column clusters up to this
 * many times the median radius (or its own radius, if wider); a search
 * forced to float64 (KNN_PRECISION_FP64) multiplies every pair in
 * float64. */
#define KNN_KM_CAP_MEDIANS 4.0

/* One side of the search: rows (every query node), or the reference's
 * points (identical nodes in a cluster merged). Entries are grouped by
 * cluster; a cluster's points are sorted by their distance to the
 * centre. */
typedef struct {
    int n;          /* entries */
    int *first;     /* clusters + 1: cluster A's entries [first[A],
                       first[A + 1]) */
    int *node;      /* entry -> node (a point: its smallest node) */
    double *res;    /* p x n: fast vector less its cluster's centre */
    float *res32;   /* the same rounded to float32 */
    int *vec;       /* rows of a self search: entry -> its point, whose
                       residuals (in the points' res and res32, which
                       these borrow) are its own; else NULL (entry e's
                       are the e-th) */
    double *rad;    /* |res| as computed */
    double *sq;     /* |res|^2 as computed */
    double *norm;   /* rows: |fast vector|, for the margins */
    double *fsq;    /* correlations: |fast vector|^2 as computed, else
                       NULL */
    int *mfirst;    /* points: their nodes members[mfirst, + count) */
    int *count;
    int *members;   /* points: nodes by point, each point's ascending */
    double *radius; /* per cluster: bound of |f - c| over its entries */
} knn_km_side;

typedef struct {
    const knn_request *req;
    knn_space space;
    knn_nodes ref, query_nodes;
    const knn_nodes *query;
    int self, n_query, p, k, threads, blas_before;
    int scan_threads; /* the product scan's count (knn_cpu_threads), which
                         a hand-over keeps: counted again mid-search, a
                         count taken as this search's own threads start
                         or stop may find a core busy */
    int clusters;
    double *centre;   /* p x clusters */
    double *cdist;    /* clusters x clusters: |c_A - c_B| as computed */
    double *cap;      /* per row cluster: widest column cluster in fp32 */
    double slack;     /* relative widening of every bound (knn_km_up) */
    int corr;         /* correlation scores: -f_i.f_j (else distances) */
    double fsq_max;   /* correlations: bound of the points' |f|^2 */
    knn_km_side rows, cols;
    double pairs;     /* products taken, all tasks */
    double *pilot;    /* while the pilot runs: products its tasks have
                         taken so far, which they stop past pilot_cap
                         (knn_km_pays); else NULL */
    double pilot_cap;
    double pooled;    /* candidates re-ranked */
    int scan_pays;    /* the sample alone showed the clusters would
                         multiply past KNN_KM_MAX_SHARE of the pairs
                         (knn_km_sample_share): the setup stops there */
} knn_km;

/* A column cluster and the lower bound of its distance from a task's
 * rows. */
typedef struct {
    double lbc;
    int b;
} knn_km_near;

/* The points [from, to) of a column cluster that row i (of its task)
 * multiplies. */
typedef struct {
    int from, to, i;
} knn_km_span;

/* What one thread holds for its tasks. */
typedef struct {
    knn_pool pools[KNN_KM_ROWS];
    knn_cand *items;
    double *best;
    double *margin;   /* KNN_KM_ROWS: each row's margin */
    double *rowterm;  /* |D + a_i|^2 */
    knn_km_span *spans; /* KNN_KM_ROWS */
    void *gathered;   /* p x KNN_KM_ROWS residuals of the active rows */
    double *prod;     /* KNN_KM_COLS x KNN_KM_ROWS products */
    double *colterm;  /* a column cluster's points' centre terms */
    double *delta;    /* p */
    knn_km_near *near; /* clusters, nearest first */
    double pairs, pooled;
    int gave_up;      /* a pilot task stopped past km->pilot_cap */
} knn_km_work;

/* A bound x widened up or down by its rounding: relative slack (above
 * the float64 error of any sum of p terms here) and an absolute 2^-500
 * (square roots of sums whose terms underflow). */
#define KNN_KM_TINY 0x1p-500
static double knn_km_up(const knn_km *km, double x)
{
    return x + km->slack * fabs(x) + KNN_KM_TINY;
}

static double knn_km_down(const knn_km *km, double x)
{
    return x - km->slack * fabs(x) - KNN_KM_TINY;
}

int knn_clusters_serve(knn_metric m)
{
    knn_score_kind kind = knn_score_of(m);
    return knn_uses_product(m) &&
           (kind == KNN_SCORE_DIST || kind == KNN_SCORE_NEG);
}

/* Bytes the clusters' arrays take at most: the residuals (float64 and
 * float32) of the reference's points and of the query nodes, O(n)
 * numbers per node, the centres, their distances and the k-means sample,
 * and each thread's product tile. */
static double knn_km_bytes(const knn_request *req)
{
    double p = req->p, nr = req->n_ref;
    double nq = req->query ? req->n_query : 0.0;
    double nc = ceil(sqrt(nr));
    double fast = 12.0 * p * (nr + nq);
    double per_node = 64.0 * (nr + nq) +
                      8.0 * nc * (nc + p + KNN_KM_SAMPLE * p);
    double threads = knn_threads(req->threads);
    return fast + per_node +
           threads * 8.0 * KNN_KM_ROWS * (KNN_KM_COLS + p);
}

/* Whether the clusters' arrays fit the request's memory budget, where it
 * sets one (else they take O(n p) bytes, as the scan's fast vectors and
 * canonical forms do). */
static int knn_km_fits(const knn_request *req)
{
    return req->memory_bytes <= 0 || knn_km_bytes(req) <= req->memory_bytes;
}

int knn_clusters_suits(const knn_request *req)
{
    if (!knn_clusters_serve(req->metric)) return 0;
    if (req->algorithm == KNN_ALGO_CLUSTERS) return 1;
    /* A forced rung asks for the scan's arithmetic. */
    return req->algorithm == KNN_ALGO_AUTO &&
           req->precision == KNN_PRECISION_AUTO &&
           req->n_ref >= KNN_KM_MIN_NODES && req->p <= KNN_KM_MAX_FEATURES &&
           knn_km_fits(req);
}

static void knn_km_side_free(knn_km_side *s)
{
    free(s->first);
    free(s->node);
    if (!s->vec) {
        free(s->res);
        free(s->res32);
    }
    free(s->vec);
    free(s->rad);
    free(s->sq);
    free(s->norm);
    free(s->fsq);
    free(s->mfirst);
    free(s->count);
    free(s->members);
    free(s->radius);
    memset(s, 0, sizeof *s);
}

/* Where entry e of side s has its residuals in res and res32 (times p). */
static size_t knn_km_vec(const knn_km_side *s, int e)
{
    return (size_t)(s->vec ? s->vec[e] : e);
}

static void knn_km_free(knn_km *km)
{
    knn_km_side_free(&km->rows);
    knn_km_side_free(&km->cols);
    free(km->centre);
    free(km->cdist);
    free(km->cap);
    knn_nodes_free(&km->ref);
    knn_nodes_free(&km->query_nodes);
    knn_space_free(&km->space);
    knn_blas_release(km->blas_before);
    km->blas_before = 0;
}

/* Nearest of the first nc centres of each of n fast vectors, by float32
 * products (|c|^2 - 2 c.f), ties to the smaller centre: those of f (p x
 * n), or where f is NULL those of nodes, formed a block at a time.
 * Returns nonzero when scratch memory runs out. */
static int knn_km_assign(const knn_km *km, int nc, const double *f,
                         const knn_nodes *nodes, int n, int *assign)
{
    int p = km->p, failed = 0;
    float *c32 = malloc((size_t)p * nc * sizeof(float));
    float *cn = malloc((size_t)nc * sizeof(float));
    if (!c32 || !cn) {
        free(c32);
        free(cn);
        return 1;
    }
    for (int c = 0; c < nc; c++) {
        double s = 0.0;
        for (int t = 0; t < p; t++) {
            double v = km->centre[(size_t)c * p + t];
            c32[(size_t)c * p + t] = (float)v;
            s += v * v;
        }
        cn[c] = (float)s;
    }
    int blocks = (n + KNN_KM_ASSIGN - 1) / KNN_KM_ASSIGN;
    #pragma omp parallel num_threads(km->threads) reduction(| : failed)
    {
        float *x = malloc((size_t)p * KNN_KM_ASSIGN * sizeof(float));
        float *g = malloc((size_t)nc * KNN_KM_ASSIGN * sizeof(float));
        if (!x || !g) failed = 1;
        #pragma omp for schedule(dynamic, 1)
        for (int b = 0; b < blocks; b++) {
            if (!x || !g) continue;
            int j0 = b * KNN_KM_ASSIGN;
            int m = n - j0 < KNN_KM_ASSIGN ? n - j0 : KNN_KM_ASSIGN;
            if (f)
                for (size_t v = 0; v < (size_t)m * p; v++)
                    x[v] = (float)f[(size_t)j0 * p + v];
            else
                knn_nodes_fast(&km->space, nodes, j0, m, 1, x, 1);
            knn_sgemm_tn(nc, m, p, c32, x, g);
            for (int j = 0; j < m; j++) {
                const float *col = g + (size_t)j * nc;
                int best = 0;
                float lowest = cn[0] - 2.0f * col[0];
                for (int c = 1; c < nc; c++) {
                    float s = cn[c] - 2.0f * col[c];
                    if (s < lowest) {
                        lowest = s;
                        best = c;
                    }
                }
                assign[j0 + j] = best;
            }
        }
        free(x);
        free(g);
    }
    free(c32);
    free(cn);
    return failed;
}

/* Moves each centre to the mean of its nodes (an empty one stays). */
static int knn_km_update(knn_km *km, const double *f, int n,
                         const int *assign)
{
    int p = km->p, nc = km->clusters;
    double *sum = calloc((size_t)p * nc, sizeof(double));
    int *count = calloc((size_t)nc, sizeof(int));
    if (!sum || !count) {
        free(sum);
        free(count);
        return 1;
    }
    for (int j = 0; j < n; j++) {
        double *s = sum + (size_t)assign[j] * p;
        const double *x = f + (size_t)j * p;
        for (int t = 0; t < p; t++) s[t] += x[t];
        count[assign[j]]++;
    }
    for (int c = 0; c < nc; c++)
        if (count[c] > 0)
            for (int t = 0; t < p; t++)
                km->centre[(size_t)c * p + t] =
                    sum[(size_t)c * p + t] / count[c];
    free(sum);
    free(count);
    return 0;
}

/* Drops the clusters no node was assigned to, renumbering the rest. */
static void knn_km_drop_empty(knn_km *km, int n, int *assign)
{
    int p = km->p, nc = km->clusters, kept = 0;
    int *to = calloc((size_t)nc, sizeof(int));
    if (!to) return;
    for (int j = 0; j < n; j++) to[assign[j]] = 1;
    for (int c = 0; c < nc; c++) {
        if (!to[c]) continue;
        memmove(km->centre + (size_t)kept * p, km->centre + (size_t)c * p,
                (size_t)p * sizeof(double));
        to[c] = kept++;
    }
    for (int j = 0; j < n; j++) assign[j] = to[assign[j]];
    km->clusters = kept;
    free(to);
}

/* |x - c|^2 of fast vector x and centre c, in KNN_KM_LANES interleaved
 * sums that the compiler vectorises (one sum in feature order waits on
 * each addition's latency, and the seeds and the entries take one per
 * sampled node and seed, and per node). knn_km_entry keeps these bits as
 * the radius its cluster's points are sorted by. */
#define KNN_KM_LANES 8
static double knn_km_sq(const double *x, const double *c, int p)
{
    double lane[KNN_KM_LANES] = {0.0};
    int t = 0;
    for (; t + KNN_KM_LANES <= p; t += KNN_KM_LANES)
        for (int l = 0; l < KNN_KM_LANES; l++) {
            double r = x[t + l] - c[t + l];
            lane[l] += r * r;
        }
    double sq = 0.0;
    for (; t < p; t++) sq += (x[t] - c[t]) * (x[t] - c[t]);
    for (int l = 0; l < KNN_KM_LANES; l++) sq += lane[l];
    return sq;
}

/* a.b in float64, in KNN_KM_LANES interleaved sums that the compiler
 * vectorises: a centre term of every row and point a visit meets, whose
 * one sum in feature order would wait on each addition's latency. Its
 * error is that of any order of the sum, which the bounds' slack
 * covers. */
static double knn_km_dot(const double *a, const double *b, int p)
{
    double lane[KNN_KM_LANES] = {0.0};
    int t = 0;
    for (; t + KNN_KM_LANES <= p; t += KNN_KM_LANES)
        for (int l = 0; l < KNN_KM_LANES; l++) lane[l] += a[t + l] * b[t + l];
    double dot = 0.0;
    for (; t < p; t++) dot += a[t] * b[t];
    for (int l = 0; l < KNN_KM_LANES; l++) dot += lane[l];
    return dot;
}

/* A fixed stream of pseudo-random numbers (splitmix64): the sample and
 * the seeds do not depend on the nodes' order, whose regularities (rows
 * repeating with a period) an even stride over it would meet, and the
 * search does not depend on R's random state. Any partition gives the
 * same answer. */
#define KNN_KM_SEED 0x9e3779b97f4a7c15ULL
static uint64_t knn_km_random(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* Seeds from the ns sampled fast vectors (d2, near: ns scratch values),
 * in random order: three quarters the sampled nodes themselves, which
 * follow the nodes' density (where neighbours are close, many small
 * clusters), the rest as k-means++ draws them, each with probability
 * proportional to its squared distance from the seeds so far, so that
 * every well separated group of nodes gets seeds of its own. The
 * distances to the first seeds come from one product (knn_km_assign);
 * each draw's total is summed in one order, so the seeds do not depend
 * on the number of threads. Returns nonzero when scratch memory runs
 * out. */
static int knn_km_seed(knn_km *km, const double *sample, int ns, double *d2,
                       int *near, uint64_t *state)
{
    int p = km->p, nc = km->clusters, taken = nc - nc / 4;
    memcpy(km->centre, sample, (size_t)taken * p * sizeof(double));
    if (knn_km_assign(km, taken, sample, NULL, ns, near)) return 1;
    #pragma omp parallel for num_threads(km->threads) schedule(static)
    for (int i = 0; i < ns; i++)
        d2[i] = knn_km_sq(sample + (size_t)i * p,
                          km->centre + (size_t)near[i] * p, p);
    for (int c = taken; c < nc; c++) {
        double total = 0.0;
        for (int i = 0; i < ns; i++) total += d2[i];
        /* Where every sampled node is a seed already (few distinct
         * nodes), the next seed repeats one: its cluster stays empty. */
        double u = (double)(knn_km_random(state) >> 11) * 0x1p-53 * total;
        int next = ns - 1;
        for (int i = 0; i < ns; i++) {
            u -= d2[i];
            if (u < 0.0) {
                next = i;
                break;
            }
        }
        double *centre = km->centre + (size_t)c * p;
        memcpy(centre, sample + (size_t)next * p, (size_t)p * sizeof(double));
        #pragma omp parallel for num_threads(km->threads) schedule(static)
        for (int i = 0; i < ns; i++)
            d2[i] = fmin(d2[i], knn_km_sq(sample + (size_t)i * p, centre, p));
    }
    return 0;
}

/* The k_s-th smallest of the squared distances d2[0..ns) but entry i's
 * (best: k_s scratch values; k_s <= KNN_KM_SAMPLE_MAX_K, so an insertion
 * costs little). */
static double knn_km_kth_smallest(const double *d2, int ns, int i, int ks,
                                  double *best)
{
    for (int t = 0; t < ks; t++) best[t] = INFINITY;
    for (int j = 0; j < ns; j++) {
        if (j == i || !(d2[j] < best[ks - 1])) continue;
        int t = ks - 1;
        for (; t > 0 && best[t - 1] > d2[j]; t--) best[t] = best[t - 1];
        best[t] = d2[j];
    }
    return best[ks - 1];
}

/* Row r of `rows` of the estimate (knn_km_sample_share), its fast vector
 * into x: a sampled node for a self search, whose index in the sample it
 * returns (it is not its own neighbour), else a query node, spread over
 * the query's order (-1). */
static int knn_km_share_row(const knn_km *km, const double *sample, int ns,
                            int rows, int r, double *x)
{
    int p = km->p;
    if (!km->self) {
        int q = (int)(((double)r + 0.5) * km->n_query / rows);
        knn_nodes_fast(&km->space, km->query, q, 1, 0, x, 1);
        return -1;
    }
    int i = (int)(((double)r + 0.5) * ns / rows);
    memcpy(x, sample + (size_t)i * p, (size_t)p * sizeof(double));
    return i;
}

/* knn_km_sample_share's count over its scratch: own (each sampled
 * node's distance to its centre), norm2 (its squared norm), x (the rows'
 * vectors), g (rows x ns products), and ks + nc values a row. */
static double knn_km_share_of(const knn_km *km, const double *sample,
                              int ns, const int *assign, int ks, int rows,
                              double *own, double *norm2, double *x, double *g,
                              double *scratch)
{
    int p = km->p, nc = km->clusters, itself[KNN_KM_SAMPLE_ROWS];
    for (int j = 0; j < ns; j++) {
        const double *y = sample + (size_t)j * p;
        own[j] = sqrt(knn_km_sq(y, km->centre + (size_t)assign[j] * p, p));
        norm2[j] = knn_km_dot(y, y, p);
    }
    for (int r = 0; r < rows; r++)
        itself[r] = knn_km_share_row(km, sample, ns, rows, r,
                                     x + (size_t)r * p);
    knn_gemm_tn(ns, rows, p, sample, x, g);
    double multiplied = 0.0;
    #pragma omp parallel for num_threads(km->threads) schedule(static) \
        reduction(+ : multiplied)
    for (int r = 0; r < rows; r++) {
        const double *xr = x + (size_t)r * p;
        double *d2 = g + (size_t)r * ns, *to = scratch + (size_t)r * (ks + nc);
        double xx = knn_km_dot(xr, xr, p);
        for (int j = 0; j < ns; j++)
            d2[j] = fmax(0.0, xx + norm2[j] - 2.0 * d2[j]);
        double reach =
            sqrt(knn_km_kth_smallest(d2, ns, itself[r], ks, to + nc));
        for (int c = 0; c < nc; c++)
            to[c] = sqrt(knn_km_sq(xr, km->centre + (size_t)c * p, p));
        for (int j = 0; j < ns; j++)
            multiplied += fabs(to[assign[j]] - own[j]) <= reach;
    }
    return multiplied / ((double)rows * ns);
}

/* The share of the pairs the clusters would multiply, estimated on the
 * ns sampled fast vectors (in clusters `assign`) before any other node is
 * assigned: a row's reach (a sampled node's of a self search, else a
 * query node's) is its distance to the k_s-th nearest other sampled node,
 * k_s = floor(k ns / n) (about as far as its k-th nearest among all n
 * nodes, and no farther on average), and it would multiply the sampled
 * nodes whose distance to their centre lies within that reach of its own
 * distance to the same centre. The search multiplies at least those (its
 * reach is a pool's bound plus a margin, never less than the final
 * distance, and rows share products), so the estimate errs low, towards
 * searching by clusters. The rows' distances come from one float64
 * product (|x|^2 + |y|^2 - 2 x.y: an estimate needs no better). Returns 0
 * where it cannot tell (k_s < 1, or beyond KNN_KM_SAMPLE_MAX_K), and -1
 * when scratch memory runs out. */
static double knn_km_sample_share(const knn_km *km, const double *sample,
                                  int ns, const int *assign, int n)
{
    int p = km->p, nc = km->clusters;
    int ks = (int)floor((double)km->k * ns / n);
    if (ks > ns - 1) ks = ns - 1;
    if (ks < 1 || ks > KNN_KM_SAMPLE_MAX_K) return 0.0;
    int from = km->self ? ns : km->n_query;
    int rows = from < KNN_KM_SAMPLE_ROWS ? from : KNN_KM_SAMPLE_ROWS;
    double *own = malloc((size_t)ns * sizeof(double));
    double *norm2 = malloc((size_t)ns * sizeof(double));
    double *x = malloc((size_t)rows * p * sizeof(double));
    double *g = malloc((size_t)rows * ns * sizeof(double));
    double *scratch = malloc((size_t)rows * (ks + nc) * sizeof(double));
    double multiplied = -1.0;
    if (own && norm2 && x && g && scratch)
        multiplied = knn_km_share_of(km, sample, ns, assign, ks, rows, own,
                                     norm2, x, g, scratch);
    free(own);
    free(norm2);
    free(x);
    free(g);
    free(scratch);
    return multiplied;
}

/* k-means of the fast vectors of the n reference nodes: km->centre and
 * `assign`. Seeds are k-means++'s on a sample (KNN_KM_SAMPLE per
 * cluster), on which the rounds run. Under the automatic choice the
 * sample also tells whether the scan pays (knn_km_sample_share, which
 * needs the sample, freed here): then km->scan_pays is set and no other
 * node is assigned. */
static knn_status knn_km_partition(knn_km *km, const knn_nodes *nodes,
                                   int n, int *assign)
{
    int p = km->p, nc = (int)ceil(sqrt((double)n));
    if (nc > n) nc = n;
    km->clusters = nc;
    km->centre = malloc((size_t)p * nc * sizeof(double));
    if (!km->centre) return KNN_E_NOMEM;
    int ns = (double)KNN_KM_SAMPLE * nc < n ? KNN_KM_SAMPLE * nc : n;
    double *sample = malloc((size_t)ns * p * sizeof(double));
    double *d2 = malloc((size_t)ns * sizeof(double));
    if (!sample || !d2) {
        free(sample);
        free(d2);
        return KNN_E_NOMEM;
    }
    uint64_t state = KNN_KM_SEED;
    for (int i = 0; i < ns; i++)
        knn_nodes_fast(&km->space, nodes,
                       ns == n ? i : (int)(knn_km_random(&state) % n), 1, 0,
                       sample + (size_t)i * p, 1);
    int failed = knn_km_seed(km, sample, ns, d2, assign, &state);
    free(d2);
    knn_status st = failed ? KNN_E_NOMEM
        : knn_interrupted(&km->req->cb) ? KNN_E_INTERRUPTED : KNN_OK;
    for (int r = 0; st == KNN_OK && !km->scan_pays && r < KNN_KM_ROUNDS;
         r++) {
        if (knn_km_assign(km, km->clusters, sample, NULL, ns, assign) ||
            knn_km_update(km, sample, ns, assign))
            st = KNN_E_NOMEM;
        else if (knn_interrupted(&km->req->cb))
            st = KNN_E_INTERRUPTED;
        if (st == KNN_OK && r + 1 == KNN_KM_ESTIMATE_ROUNDS &&
            km->req->algorithm == KNN_ALGO_AUTO) {
            double share = knn_km_sample_share(km, sample, ns, assign, n);
            if (share < 0.0) st = KNN_E_NOMEM;
            km->scan_pays = share > KNN_KM_MAX_SHARE;
        }
    }
    free(sample);
    if (st != KNN_OK || km->scan_pays) return st;
    if (knn_km_assign(km, km->clusters, NULL, nodes, n, assign))
        return KNN_E_NOMEM;
    knn_km_drop_empty(km, n, assign);
    return KNN_OK;
}

/* An entry as its cluster's points are sorted: by distance to the centre,
 * then by input values (identical nodes become neighbours), then by
 * node. */
typedef struct {
    double rad;
    const double *x;
    int p, node;
} knn_km_sorted;

static int knn_km_sorted_cmp(const void *a, const void *b)
{
    const knn_km_sorted *r = a, *s = b;
    if (r->rad != s->rad) return r->rad < s->rad ? -1 : 1;
    for (int f = 0; f < r->p; f++)
        if (r->x[f] != s->x[f]) return r->x[f] < s->x[f] ? -1 : 1;
    return (r->node > s->node) - (r->node < s->node);
}

static int knn_km_same_input(const knn_km_sorted *r, const knn_km_sorted *s)
{
    for (int f = 0; f < r->p; f++)
        if (r->x[f] != s->x[f]) return 0;
    return 1;
}

static knn_status knn_km_side_alloc(knn_km_side *s, int n, int p,
                                    int clusters, int points, int corr)
{
    s->n = n;
    s->first = malloc(((size_t)clusters + 1) * sizeof(int));
    s->node = malloc((size_t)n * sizeof(int));
    s->res = malloc((size_t)n * p * sizeof(double));
    s->res32 = malloc((size_t)n * p * sizeof(float));
    s->rad = malloc((size_t)n * sizeof(double));
    s->sq = malloc((size_t)n * sizeof(double));
    s->norm = malloc((size_t)n * sizeof(double));
    s->radius = malloc((size_t)clusters * sizeof(double));
    int failed = !s->first || !s->node || !s->res || !s->res32 || !s->rad ||
                 !s->sq || !s->norm || !s->radius;
    if (corr) {
        s->fsq = malloc((size_t)n * sizeof(double));
        failed |= !s->fsq;
    }
    if (points) {
        s->mfirst = malloc((size_t)n * sizeof(int));
        s->count = malloc((size_t)n * sizeof(int));
        s->members = malloc((size_t)n * sizeof(int));
        failed |= !s->mfirst || !s->count || !s->members;
    }
    return failed ? KNN_E_NOMEM : KNN_OK;
}

/* Entry e of side s: node j of `nodes`, with fast vector x, in the
 * cluster of centre c: its residual and norms. */
static void knn_km_entry(const knn_km *km, knn_km_side *s, int e,
                         const knn_nodes *nodes, int j, const double *x,
                         const double *c)
{
    int p = km->p;
    double *r = s->res + (size_t)e * p, sq = knn_km_sq(x, c, p);
    float *r32 = s->res32 + (size_t)e * p;
    for (int t = 0; t < p; t++) {
        r[t] = x[t] - c[t];
        r32[t] = (float)r[t];
    }
    s->node[e] = j;
    s->sq[e] = sq;
    s->rad[e] = sqrt(sq);
    if (s->fsq) s->fsq[e] = knn_dot(x, x, p);
    s->norm[e] = s->fsq ? sqrt(s->fsq[e]) : sqrt(nodes->norm2[j]);
}

/* Builds side s from n nodes in clusters `assign`: every node an entry
 * (rows, points == 0), or the nodes merged into points and sorted by
 * distance to the centre (points). nodes->raw gives the input values
 * that decide identity; norm2 the fast norms. Each node's fast vector is
 * formed where it is needed (in `fast`, p values per thread), so no copy
 * of them all is held. */
static knn_status knn_km_build_side(const knn_km *km, knn_km_side *s,
                                    const knn_nodes *nodes, int n,
                                    const int *assign, int points)
{
    int p = km->p, nc = km->clusters;
    knn_status st = knn_km_side_alloc(s, n, p, nc, points, km->corr);
    knn_km_sorted *sorted = malloc((size_t)n * sizeof *sorted);
    double *fast = malloc((size_t)km->threads * p * sizeof(double));
    if (st != KNN_OK || !sorted || !fast) {
        free(sorted);
        free(fast);
        return KNN_E_NOMEM;
    }
    /* Nodes by cluster, ascending within each. */
    int *at = calloc((size_t)nc + 1, sizeof(int));
    if (!at) {
        free(sorted);
        free(fast);
        return KNN_E_NOMEM;
    }
    for (int j = 0; j < n; j++) at[assign[j] + 1]++;
    for (int c = 0; c < nc; c++) at[c + 1] += at[c];
    memcpy(s->first, at, ((size_t)nc + 1) * sizeof(int));
    for (int j = 0; j < n; j++) {
        knn_km_sorted *e = &sorted[at[assign[j]]++];
        e->node = j;
        e->x = nodes->raw + (size_t)j * p;
        e->p = p;
    }
    free(at);
    if (!points) {
        #pragma omp parallel for num_threads(km->threads) schedule(static)
        for (int e = 0; e < n; e++) {
            int j = sorted[e].node;
            double *x = fast + (size_t)knn_thread_number() * p;
            knn_nodes_fast(&km->space, nodes, j, 1, 0, x, 1);
            knn_km_entry(km, s, e, nodes, j, x,
                         km->centre + (size_t)assign[j] * p);
        }
    } else {
        /* Points in the sorted order, their residuals written there. */
        #pragma omp parallel for num_threads(km->threads) schedule(static)
        for (int e = 0; e < n; e++) {
            int j = sorted[e].node;
            double *x = fast + (size_t)knn_thread_number() * p;
            knn_nodes_fast(&km->space, nodes, j, 1, 0, x, 1);
            sorted[e].rad = sqrt(knn_km_sq(x, km->centre +
                                                  (size_t)assign[j] * p, p));
        }
        for (int c = 0; c < nc; c++)
            qsort(sorted + s->first[c],
                  (size_t)(s->first[c + 1] - s->first[c]), sizeof *sorted,
                  knn_km_sorted_cmp);
        int d = 0;
        for (int c = 0; c < nc; c++) {
            int first = d;
            for (int e = s->first[c]; e < s->first[c + 1]; e++) {
                s->members[e] = sorted[e].node;
                if (e > s->first[c] &&
                    knn_km_same_input(&sorted[e], &sorted[e - 1])) {
                    s->count[d - 1]++;
                    continue;
                }
                s->node[d] = sorted[e].node;
                s->mfirst[d] = e;
                s->count[d] = 1;
                d++;
            }
            s->first[c] = first;
        }
        s->first[nc] = d;
        s->n = d;
        #pragma omp parallel for num_threads(km->threads) schedule(static)
        for (int e = 0; e < d; e++) {
            int j = s->node[e];
            double *x = fast + (size_t)knn_thread_number() * p;
            knn_nodes_fast(&km->space, nodes, j, 1, 0, x, 1);
            knn_km_entry(km, s, e, nodes, j, x,
                         km->centre + (size_t)assign[j] * p);
        }
    }
    free(sorted);
    free(fast);
    for (int c = 0; c < nc; c++) {
        double r = 0.0;
        for (int e = s->first[c]; e < s->first[c + 1]; e++)
            r = fmax(r, knn_km_up(km, s->rad[e]));
        s->radius[c] = r;
    }
    return KNN_OK;
}

/* A row (node, point) pair, for ordering rows by node. */
typedef struct {
    int node, vec;
} knn_km_row;

static int knn_km_row_cmp(const void *x, const void *y)
{
    const knn_km_row *u = x, *v = y;
    return (u->node > v->node) - (u->node < v->node);
}

/* The rows of a self search: every node, by cluster, ascending within
 * each (as a query's rows), each with its point's residuals (identical
 * nodes have identical fast vectors, so the same residuals), which it
 * borrows. */
static knn_status knn_km_rows_of_points(knn_km *km)
{
    const knn_km_side *c = &km->cols;
    knn_km_side *s = &km->rows;
    int n = km->n_query, nc = km->clusters;
    s->n = n;
    s->first = malloc(((size_t)nc + 1) * sizeof(int));
    s->node = malloc((size_t)n * sizeof(int));
    s->vec = malloc((size_t)n * sizeof(int));
    s->rad = malloc((size_t)n * sizeof(double));
    s->sq = malloc((size_t)n * sizeof(double));
    s->norm = malloc((size_t)n * sizeof(double));
    s->radius = malloc((size_t)nc * sizeof(double));
    s->fsq = km->corr ? malloc((size_t)n * sizeof(double)) : NULL;
    knn_km_row *order = malloc((size_t)n * sizeof *order);
    if (!s->first || !s->node || !s->vec || !s->rad || !s->sq || !s->norm ||
        !s->radius || (km->corr && !s->fsq) || !order) {
        free(order);
        return KNN_E_NOMEM;
    }
    s->res = c->res;
    s->res32 = c->res32;
    for (int a = 0; a < nc; a++) {
        s->first[a] = c->first[a] < c->n ? c->mfirst[c->first[a]] : n;
        s->radius[a] = c->radius[a];
    }
    s->first[nc] = n;
    for (int d = 0; d < c->n; d++)
        for (int m = c->mfirst[d]; m < c->mfirst[d] + c->count[d]; m++) {
            order[m].node = c->members[m];
            order[m].vec = d;
        }
    for (int a = 0; a < nc; a++)
        qsort(order + s->first[a], (size_t)(s->first[a + 1] - s->first[a]),
              sizeof *order, knn_km_row_cmp);
    for (int e = 0; e < n; e++) {
        int d = order[e].vec;
        s->node[e] = order[e].node;
        s->vec[e] = d;
        s->rad[e] = c->rad[d];
        s->sq[e] = c->sq[d];
        s->norm[e] = c->norm[d];
        if (s->fsq) s->fsq[e] = c->fsq[d];
    }
    free(order);
    return KNN_OK;
}

/* Distances between centres, each row cluster's float32 cap, and the
 * bound of the points' |f|^2 of a correlation. */
static knn_status knn_km_centres(knn_km *km)
{
    int p = km->p, nc = km->clusters;
    for (int e = 0; km->corr && e < km->cols.n; e++)
        km->fsq_max = fmax(km->fsq_max, knn_km_up(km, km->cols.fsq[e]));
    km->cdist = malloc((size_t)nc * nc * sizeof(double));
    km->cap = malloc((size_t)nc * sizeof(double));
    double *radii = malloc((size_t)nc * sizeof(double));
    if (!km->cdist || !km->cap || !radii) {
        free(radii);
        return KNN_E_NOMEM;
    }
    #pragma omp parallel for num_threads(km->threads) schedule(dynamic, 16)
    for (int a = 0; a < nc; a++) {
        const double *ca = km->centre + (size_t)a * p;
        for (int b = 0; b < nc; b++) {
            const double *cb = km->centre + (size_t)b * p;
            double s = 0.0;
            for (int t = 0; t < p; t++) {
                double d = ca[t] - cb[t];
                s += d * d;
            }
            km->cdist[(size_t)a * nc + b] = sqrt(s);
        }
    }
    memcpy(radii, km->cols.radius, (size_t)nc * sizeof(double));
    int middle = nc / 2;
    for (int i = 0; i <= middle; i++) {
        int m = i;
        for (int j = i + 1; j < nc; j++)
            if (radii[j] < radii[m]) m = j;
        double t = radii[i];
        radii[i] = radii[m];
        radii[m] = t;
    }
    double median = radii[middle];
    free(radii);
    for (int a = 0; a < nc; a++)
        km->cap[a] = km->req->precision == KNN_PRECISION_FP64
            ? -1.0 : fmax(KNN_KM_CAP_MEDIANS * median,
                          fmax(km->rows.radius[a], km->cols.radius[a]));
    return KNN_OK;
}

/* Exact order value of query node qi and reference node rj, for the
 * pools' compaction of ties. */
static double knn_km_order_value(const void *ctx, int qi, int rj)
{
    const knn_km *km = ctx;
    return knn_key_distance(km->space.metric,
                            knn_nodes_key(&km->space, km->query, qi,
                                          &km->ref, rj));
}

/* Bound on |fast score - canonical key| (and on |fast score - |f_i -
 * f_j|^2|, or - f_i.f_j for correlations) of row entry e of cluster A
 * with any point: float32 products of residuals up to the cap, and the
 * float64 terms, whose magnitudes the nodes' norms bound (|D| + |a_i| +
 * |b_j| <= 5 (|f_i| + norm_max)). A correlation's score holds the
 * residuals' product once, not twice, and its fast vectors are unit
 * vectors (norms 1 up to float64 rounding): its float64 terms are the
 * distance form's with norms of 1, and its key's own error that of the
 * scan's float64 products (knn_margin_corr). */
static double knn_km_margin(const knn_km *km, int a, int e)
{
    int p = km->p;
    double rho = knn_km_up(km, km->rows.rad[e]);
    double fp32 = km->cap[a] < 0.0
        ? 0.0 : knn_margin_dist(p, KNN_U32, KNN_U32, KNN_TINY32, rho,
                                km->cap[a]);
    if (km->corr)
        return 0.5 * fp32 +
               64.0 * knn_margin_dist(p, 0.0, KNN_U64, KNN_TINY64, 1.0,
                                      1.0) +
               knn_margin_corr(p, 0.0, KNN_U64, KNN_TINY64,
                               km->space.kappa);
    double fp64 = 64.0 * knn_margin_dist(p, 0.0, KNN_U64, KNN_TINY64,
                                         km->rows.norm[e],
                                         km->space.norm_max);
    return fp32 + fp64;
}

/* How far (as a distance |f_i - f_j|) a node can be and still pass the
 * pool of row entry e: INFINITY until the pool has k scores. A
 * correlation's score s stands for -f_i.f_j, within the margin, so
 * |f_i - f_j|^2 = |f_i|^2 + |f_j|^2 + 2 (-f_i.f_j). */
static double knn_km_reach(const knn_km *km, const knn_pool *pool,
                           double margin, int e)
{
    if (!(pool->bound < INFINITY)) return INFINITY;
    double d2 = knn_km_up(km, pool->bound + margin);
    if (km->corr)
        d2 = knn_km_up(km, 2.0 * d2 + knn_km_up(km, km->rows.fsq[e] +
                                                       km->fsq_max));
    return knn_km_up(km, sqrt(knn_km_up(km, fmax(d2, 0.0))));
}

/* First point of [lo, hi) (sorted by rad) whose distance to the centre
 * may be at least x. */
static int knn_km_first_from(const knn_km *km, int lo, int hi, double x)
{
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (knn_km_up(km, km->cols.rad[mid]) >= x) hi = mid;
        else lo = mid + 1;
    }
    return lo;
}

/* First point of [lo, hi) whose distance to the centre exceeds x for
 * sure. */
static int knn_km_first_past(const knn_km *km, int lo, int hi, double x)
{
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (knn_km_down(km, km->cols.rad[mid]) > x) hi = mid;
        else lo = mid + 1;
    }
    return lo;
}

/* Offers point e at fast score s to the pool of the row whose node is
 * `itself` (-1: none): its nodes in ascending order, at most k of them. */
static int knn_km_offer_point(const knn_km *km, knn_pool *pool, double s,
                              int e, int itself)
{
    const int *nodes = km->cols.members + km->cols.mfirst[e];
    int failed = 0, offered = 0;
    for (int m = 0; m < km->cols.count[e] && offered < km->k; m++) {
        if (nodes[m] == itself) continue;
        failed |= knn_pool_offer(pool, s, nodes[m]);
        offered++;
    }
    return failed;
}

static int knn_km_span_cmp(const void *x, const void *y)
{
    const knn_km_span *u = x, *v = y;
    if (u->from != v->from) return u->from < v->from ? -1 : 1;
    return (u->i > v->i) - (u->i < v->i);
}

/* Rows spans[0..n) (of the task from r0) against the points of their
 * spans' union, whose centre terms w->colterm holds from point `first`
 * on: one product per stretch of KNN_KM_COLS points, each score offered
 * to its row's pool where the point is in the row's span. */
static int knn_km_multiply(const knn_km *km, knn_km_work *w,
                           const knn_km_span *spans, int n, int r0,
                           int first, int fp32)
{
    int p = km->p, failed = 0, lo = spans[0].from, hi = 0;
    const knn_km_side *rows = &km->rows, *cols = &km->cols;
    double twice = km->corr ? 1.0 : 2.0;
    for (int r = 0; r < n; r++) {
        size_t e = knn_km_vec(rows, r0 + spans[r].i);
        if (spans[r].to > hi) hi = spans[r].to;
        if (fp32)
            memcpy((float *)w->gathered + (size_t)r * p,
                   rows->res32 + e * p, (size_t)p * sizeof(float));
        else
            memcpy((double *)w->gathered + (size_t)r * p, rows->res + e * p,
                   (size_t)p * sizeof(double));
    }
    for (int j0 = lo; j0 < hi; j0 += KNN_KM_COLS) {
        int m = hi - j0 < KNN_KM_COLS ? hi - j0 : KNN_KM_COLS;
        const double *colterm = w->colterm + (j0 - first);
        if (fp32)
            knn_sgemm_tn(m, n, p, cols->res32 + (size_t)j0 * p,
                         w->gathered, (float *)w->prod);
        else
            knn_gemm_tn(m, n, p, cols->res + (size_t)j0 * p, w->gathered,
                        w->prod);
        w->pairs += (double)m * n;
        for (int r = 0; r < n; r++) {
            int i = spans[r].i;
            knn_pool *pool = &w->pools[i];
            int itself = km->self ? rows->node[r0 + i] : -1;
            int ja = spans[r].from > j0 ? spans[r].from - j0 : 0;
            int jb = spans[r].to - j0 < m ? spans[r].to - j0 : m;
            double base = w->rowterm[i];
            for (int j = ja; j < jb; j++) {
                double g = fp32 ? ((const float *)w->prod)[(size_t)r * m + j]
                                : w->prod[(size_t)r * m + j];
                double s = base + colterm[j] - twice * g;
                if (s <= pool->bound)
                    failed |= knn_km_offer_point(km, pool, s, j0 + j,
                                                 itself);
            }
        }
    }
    return failed;
}


/* Rows [r0, r0 + nr) of row cluster a against column cluster b (whose
 * lower bound from a is lbc, as knn_km_task computes it): the
 * rows whose reach meets b, each against the points whose distance to
 * b's centre may lie within it. Rows go in groups of KNN_KM_GROUP by
 * where their spans start, so that each group's product covers little
 * more than its rows' spans. */
static int knn_km_visit(const knn_km *km, knn_km_work *w, int a, int b,
                        double lbc, int r0, int nr)
{
    int p = km->p, failed = 0;
    const knn_km_side *rows = &km->rows, *cols = &km->cols;
    const double *ca = km->centre + (size_t)a * p;
    const double *cb = km->centre + (size_t)b * p;
    double dd = 0.0;
    for (int t = 0; t < p; t++) {
        w->delta[t] = ca[t] - cb[t];
        dd += w->delta[t] * w->delta[t];
    }
    double dn = sqrt(dd);
    int b0 = cols->first[b], b1 = cols->first[b + 1], nact = 0;
    for (int i = 0; i < nr; i++) {
        int e = r0 + i;
        /* b's bound lbc, less the row's own radius, against its reach
         * (the task's test, row by row). */
        double reach = knn_km_reach(km, &w->pools[i], w->margin[i], e);
        if (knn_km_down(km, lbc - knn_km_up(km, rows->rad[e])) > reach)
            continue;
        const double *res = rows->res + knn_km_vec(rows, e) * p;
        double dot = knn_km_dot(w->delta, res, p);
        double r = dd + rows->sq[e] + 2.0 * dot;
        w->rowterm[i] = km->corr ? 0.5 * (r - rows->fsq[e]) : r;
        int from = b0, to = b1;
        if (reach < INFINITY) {
            double scale = knn_km_up(km, dn + rows->rad[e]);
            double err = km->slack * scale * scale;
            double dlo = knn_km_down(km, sqrt(fmax(r - err, 0.0)) -
                                             km->slack * scale);
            double dhi = knn_km_up(km, sqrt(fmax(r, 0.0) + err) +
                                           km->slack * scale);
            from = knn_km_first_from(km, b0, b1,
                                     knn_km_down(km, dlo - reach));
            to = knn_km_first_past(km, from, b1, knn_km_up(km, dhi + reach));
        }
        if (from >= to) continue;
        w->spans[nact].from = from;
        w->spans[nact].to = to;
        w->spans[nact].i = i;
        nact++;
    }
    if (nact == 0) return 0;
    qsort(w->spans, (size_t)nact, sizeof *w->spans, knn_km_span_cmp);
    /* The points' centre terms |b_j|^2 - 2 D.b_j (correlations: less
     * |f_j|^2, halved), once for every group. */
    int first = w->spans[0].from, last = first;
    for (int r = 0; r < nact; r++)
        if (w->spans[r].to > last) last = w->spans[r].to;
    for (int j = first; j < last; j++) {
        const double *res = cols->res + (size_t)j * p;
        double dot = knn_km_dot(w->delta, res, p);
        double c = cols->sq[j] - 2.0 * dot;
        w->colterm[j - first] = km->corr ? 0.5 * (c - cols->fsq[j]) : c;
    }
    int fp32 = cols->radius[b] <= km->cap[a];
    for (int g0 = 0; g0 < nact && !failed; g0 += KNN_KM_GROUP) {
        int n = nact - g0 < KNN_KM_GROUP ? nact - g0 : KNN_KM_GROUP;
        failed |= knn_km_multiply(km, w, w->spans + g0, n, r0, first, fp32);
    }
    return failed;
}

/* Adds a pilot task's new products to the pilot's; whether they are now
 * past its cap. */
static int knn_km_pilot_past(const knn_km *km, double pairs)
{
    double now;
    #pragma omp atomic capture
    now = *km->pilot += pairs;
    return now > km->pilot_cap;
}

/* Column clusters by their lower bound, then number. */
static int knn_km_near_cmp(const void *x, const void *y)
{
    const knn_km_near *u = x, *v = y;
    if (u->lbc != v->lbc) return u->lbc < v->lbc ? -1 : 1;
    return (u->b > v->b) - (u->b < v->b);
}

/* The rows [r0, r1) of row cluster a: every column cluster that may hold
 * a neighbour, nearest first, then (out != NULL) the exact re-rank. */
static int knn_km_task(const knn_km *km, knn_km_work *w, int a, int r0,
                       int r1, knn_result *out)
{
    int nr = r1 - r0, nc = km->clusters, failed = 0;
    for (int i = 0; i < nr; i++) {
        w->margin[i] = knn_km_margin(km, a, r0 + i);
        knn_pool_reset(&w->pools[i], km->rows.node[r0 + i], w->margin[i],
                       knn_km_order_value, km);
    }
    const double *cd = km->cdist + (size_t)a * nc;
    for (int b = 0; b < nc; b++) {
        w->near[b].lbc = knn_km_down(km, knn_km_down(km, cd[b]) -
                                             km->cols.radius[b]);
        w->near[b].b = b;
    }
    qsort(w->near, (size_t)nc, sizeof *w->near, knn_km_near_cmp);
    for (int t = 0; t < nc && !failed; t++) {
        int b = w->near[t].b;
        double reach = 0.0;
        for (int i = 0; i < nr && reach < INFINITY; i++)
            reach = fmax(reach,
                         knn_km_up(km, knn_km_up(km, km->rows.rad[r0 + i]) +
                                           knn_km_reach(km, &w->pools[i],
                                                        w->margin[i],
                                                        r0 + i)));
        if (w->near[t].lbc > reach) break;
        double before = w->pairs;
        failed |= knn_km_visit(km, w, a, b, w->near[t].lbc, r0, nr);
        if (km->pilot && knn_km_pilot_past(km, w->pairs - before)) {
            w->gave_up = 1;
            return failed;
        }
    }
    if (failed || !out) return failed;
    for (int i = 0; i < nr; i++) {
        knn_pool *pool = &w->pools[i];
        knn_nodes_rerank(&km->space, km->query, km->rows.node[r0 + i],
                         &km->ref, pool, km->n_query, out);
        w->pooled += pool->size + pool->compacted;
    }
    return 0;
}

static void knn_km_work_free(knn_km_work *w)
{
    for (int i = 0; i < KNN_KM_ROWS; i++) knn_pool_free(&w->pools[i]);
    free(w->items);
    free(w->best);
    free(w->margin);
    free(w->rowterm);
    free(w->spans);
    free(w->gathered);
    free(w->prod);
    free(w->colterm);
    free(w->delta);
    free(w->near);
}

static int knn_km_work_init(const knn_km *km, knn_km_work *w)
{
    memset(w, 0, sizeof *w);
    int k = km->k, cap = KNN_POOL_FIRST_CAP(k);
    w->items = malloc((size_t)KNN_KM_ROWS * cap * sizeof(knn_cand));
    w->best = malloc((size_t)KNN_KM_ROWS * k * sizeof(double));
    w->margin = malloc(KNN_KM_ROWS * sizeof(double));
    w->rowterm = malloc(KNN_KM_ROWS * sizeof(double));
    w->spans = malloc(KNN_KM_ROWS * sizeof *w->spans);
    w->gathered = malloc((size_t)KNN_KM_ROWS * km->p * sizeof(double));
    w->prod = malloc((size_t)KNN_KM_ROWS * KNN_KM_COLS * sizeof(double));
    int widest = 1;
    for (int b = 0; b < km->clusters; b++)
        if (km->cols.first[b + 1] - km->cols.first[b] > widest)
            widest = km->cols.first[b + 1] - km->cols.first[b];
    w->colterm = malloc((size_t)widest * sizeof(double));
    w->delta = malloc((size_t)km->p * sizeof(double));
    w->near = malloc((size_t)km->clusters * sizeof *w->near);
    if (!w->items || !w->best || !w->margin || !w->rowterm || !w->spans ||
        !w->gathered || !w->prod || !w->colterm ||
        !w->delta || !w->near)
        return 1;
    for (int i = 0; i < KNN_KM_ROWS; i++)
        knn_pool_init(&w->pools[i], k, km->space.metric, km->space.scale_exp,
                      w->items + (size_t)i * cap, w->best + (size_t)i * k);
    return 0;
}

/* A task: rows [r0, r1) of row cluster a. */
typedef struct {
    int a, r0, r1;
} knn_km_task_rows;

/* Runs tasks[0..n) on the search's threads. */
static knn_status knn_km_run(knn_km *km, const knn_km_task_rows *tasks,
                             int n, knn_result *out)
{
    int failed = 0;
    double pairs = 0.0, pooled = 0.0;
    #pragma omp parallel num_threads(km->threads) reduction(| : failed) \
        reduction(+ : pairs, pooled)
    {
        knn_km_work w;
        if (knn_km_work_init(km, &w)) failed = 1;
        #pragma omp for schedule(dynamic, 1)
        for (int t = 0; t < n; t++) {
            if (failed) continue;
            failed |= knn_km_task(km, &w, tasks[t].a, tasks[t].r0,
                                  tasks[t].r1, out);
        }
        pairs += w.pairs;
        pooled += w.pooled;
        knn_km_work_free(&w);
    }
    km->pairs += pairs;
    km->pooled += pooled;
    return failed ? KNN_E_NOMEM : KNN_OK;
}

/* Whether the clusters prune enough to beat the product scan: the share
 * of pairs multiplied for the first task's rows of a sample of row
 * clusters (marked in `piloted`). Those rows' answers are written to out
 * as they would be later: the search then skips them, and the scan that
 * takes over where clusters do not pay rewrites them. The pilot stops as
 * soon as its products pass the share, so on data the clusters cannot
 * prune it costs about the share of its rows' products, not all of
 * them. */
static knn_status knn_km_pays(knn_km *km, knn_result *out, char *piloted,
                              int *pays)
{
    int nc = km->clusters, n = 0;
    int sample = nc < KNN_KM_PILOT ? nc : KNN_KM_PILOT;
    knn_km_task_rows tasks[KNN_KM_PILOT];
    double rows = 0.0;
    for (int s = 0; s < sample; s++) {
        int a = (int)(((double)s + 0.5) * nc / sample);
        int r0 = km->rows.first[a], r1 = km->rows.first[a + 1];
        if (r1 - r0 > KNN_KM_PILOT_ROWS) r1 = r0 + KNN_KM_PILOT_ROWS;
        if (r1 <= r0 || piloted[a]) continue;
        piloted[a] = 1;
        tasks[n].a = a;
        tasks[n].r0 = r0;
        tasks[n].r1 = r1;
        rows += r1 - r0;
        n++;
    }
    /* One task per thread at a time, polling between: a task on data
     * the clusters do not prune multiplies its rows by every node. */
    double taken = 0.0;
    km->pilot = &taken;
    km->pilot_cap = KNN_KM_MAX_SHARE * rows * km->cols.n;
    knn_status st = KNN_OK;
    for (int t = 0; st == KNN_OK && t < n && taken <= km->pilot_cap;
         t += km->threads) {
        st = knn_km_run(km, tasks + t, n - t < km->threads ? n - t
                                                           : km->threads,
                        out);
        if (st == KNN_OK && knn_interrupted(&km->req->cb))
            st = KNN_E_INTERRUPTED;
    }
    km->pilot = NULL;
    *pays = taken <= km->pilot_cap;
    return st;
}

static knn_status knn_km_setup(knn_km *km, const knn_request *req)
{
    km->req = req;
    km->self = req->query == NULL;
    km->n_query = km->self ? req->n_ref : req->n_query;
    km->p = req->p;
    km->k = req->k;
    km->threads = km->scan_threads = knn_cpu_threads(req);
    km->slack = fmax(0x1p-40, (8.0 * req->p + 64.0) * KNN_U64);
    km->corr = knn_is_correlation(req->metric);
    /* The products are small: BLAS threads of their own would only wait
     * on each other between them, also beside one thread of ours. */
    km->blas_before = knn_blas_hold_one_thread();
    if (km->blas_before == 0) km->threads = 1;
    knn_status st = knn_cpu_prepare_nodes(req, km->threads, &km->space,
                                          &km->ref, &km->query_nodes);
    if (st != KNN_OK) return st;
    km->query = km->self ? &km->ref : &km->query_nodes;

    int n = req->n_ref;
    int *assign = malloc((size_t)n * sizeof(int));
    st = assign ? KNN_OK : KNN_E_NOMEM;
    /* OpenBLAS retries a buffer that an address-space limit refuses for
     * ever: the threads' buffers must fit before the first product. */
    if (st == KNN_OK && !knn_threads_reserve_fits(km->threads, 1))
        st = KNN_E_NOMEM;
    if (st == KNN_OK) st = knn_km_partition(km, &km->ref, n, assign);
    if (st == KNN_OK && knn_interrupted(&req->cb)) st = KNN_E_INTERRUPTED;
    if (st == KNN_OK && km->scan_pays) {
        free(assign);
        return KNN_OK;
    }
    if (st == KNN_OK)
        st = knn_km_build_side(km, &km->cols, &km->ref, n, assign, 1);
    if (st == KNN_OK && knn_interrupted(&req->cb)) st = KNN_E_INTERRUPTED;
    if (st == KNN_OK && km->self) st = knn_km_rows_of_points(km);
    if (st == KNN_OK && !km->self) {
        int nq = req->n_query;
        free(assign);
        assign = malloc((size_t)nq * sizeof(int));
        st = assign ? KNN_OK : KNN_E_NOMEM;
        if (st == KNN_OK)
            st = knn_km_assign(km, km->clusters, NULL, &km->query_nodes, nq,
                               assign)
                ? KNN_E_NOMEM : KNN_OK;
        if (st == KNN_OK)
            st = knn_km_build_side(km, &km->rows, &km->query_nodes, nq,
                                   assign, 0);
    }
    free(assign);
    if (st == KNN_OK) st = knn_km_centres(km);
    return st;
}

/* Hands the search to the product scan with the nodes the clusters
 * prepared (knn_cpu_prepare_nodes, as the scan would), once the clusters'
 * other arrays are freed. */
static knn_status knn_km_hand_over(knn_km *km, knn_result *out,
                                   knn_report *report)
{
    static const knn_space no_space;
    static const knn_nodes no_nodes;
    const knn_request *req = km->req;
    int threads = km->scan_threads;
    knn_space space = km->space;
    knn_nodes ref = km->ref, query = km->query_nodes;
    km->space = no_space;
    km->ref = km->query_nodes = no_nodes;
    knn_km_free(km);
    return knn_cpu_search_prepared(req, threads, space, ref, query, out,
                                   report);
}

/* Rows of row cluster a that the pilot searched (knn_km_pays). */
static int knn_km_piloted(const knn_km *km, const char *piloted, int a)
{
    int rows = km->rows.first[a + 1] - km->rows.first[a];
    return !piloted[a] ? 0 : rows < KNN_KM_PILOT_ROWS ? rows
                                                      : KNN_KM_PILOT_ROWS;
}

/* Every row's task, in cluster order, up to KNN_KM_ROWS rows each, but
 * the rows the pilot searched. */
static knn_km_task_rows *knn_km_tasks(const knn_km *km,
                                      const char *piloted, int *n)
{
    int nc = km->clusters, count = 0;
    for (int a = 0; a < nc; a++) {
        int rows = km->rows.first[a + 1] - km->rows.first[a];
        count += (rows + KNN_KM_ROWS - 1) / KNN_KM_ROWS;
    }
    knn_km_task_rows *tasks = malloc((size_t)(count > 0 ? count : 1) *
                                     sizeof *tasks);
    if (!tasks) return NULL;
    *n = 0;
    for (int a = 0; a < nc; a++)
        for (int r0 = km->rows.first[a] + knn_km_piloted(km, piloted, a);
             r0 < km->rows.first[a + 1]; r0 += KNN_KM_ROWS) {
            int r1 = km->rows.first[a + 1] - r0 < KNN_KM_ROWS
                ? km->rows.first[a + 1] : r0 + KNN_KM_ROWS;
            tasks[*n].a = a;
            tasks[*n].r0 = r0;
            tasks[*n].r1 = r1;
            (*n)++;
        }
    return tasks;
}

knn_status knn_clusters_search(const knn_request *req, knn_result *out,
                               knn_report *report)
{
    knn_km km = {0};
    double t0 = knn_seconds();
    if (!knn_km_fits(req)) {
        snprintf(report->message, sizeof report->message,
                 "the clusters need %.0f MB, beyond "
                 "options(knngpu.cpu.memory) of %.0f MB: raise it, or "
                 "leave the algorithm to knngpu",
                 knn_km_bytes(req) / 1048576.0, req->memory_bytes / 1048576.0);
        return KNN_E_NOMEM;
    }
    knn_status st = knn_km_setup(&km, req);
    char *piloted = st == KNN_OK ? calloc((size_t)km.clusters, 1) : NULL;
    if (st == KNN_OK && !piloted) st = KNN_E_NOMEM;
    int pays = !km.scan_pays;
    if (st == KNN_OK && pays && req->algorithm == KNN_ALGO_AUTO)
        st = knn_km_pays(&km, out, piloted, &pays);
    if (st == KNN_OK && !pays) {
        free(piloted);
        return knn_km_hand_over(&km, out, report);
    }
    double t1 = knn_seconds();
    int n_tasks = 0, done = 0;
    knn_km_task_rows *tasks = st == KNN_OK
        ? knn_km_tasks(&km, piloted, &n_tasks) : NULL;
    if (st == KNN_OK && !tasks) st = KNN_E_NOMEM;
    for (int a = 0; piloted && a < km.clusters; a++)
        done += knn_km_piloted(&km, piloted, a);
    free(piloted);
    double poll_rows = fmin(KNN_KM_POLL_ROWS,
                            KNN_KM_POLL_WORK / ((double)km.cols.n * req->p));
    if (poll_rows < (double)KNN_KM_ROWS * km.threads)
        poll_rows = (double)KNN_KM_ROWS * km.threads;
    for (int u = 0, v; st == KNN_OK && u < n_tasks; u = v) {
        int rows = 0;
        for (v = u; v < n_tasks && rows < poll_rows; v++)
            rows += tasks[v].r1 - tasks[v].r0;
        st = knn_km_run(&km, tasks + u, v - u, out);
        done += rows;
        if (st == KNN_OK && knn_interrupted(&req->cb)) st = KNN_E_INTERRUPTED;
        if (st == KNN_OK && req->cb.progress)
            req->cb.progress(req->cb.ctx, done, km.n_query);
    }
    free(tasks);
    if (st == KNN_OK) {
        snprintf(report->device, sizeof report->device,
                 "cpu (%d threads, %d clusters)", km.threads, km.clusters);
        snprintf(report->precision, sizeof report->precision,
                 "%s BLAS residual candidates (%.3g%% of pairs) + fp64 "
                 "exact re-rank",
                 req->precision == KNN_PRECISION_FP64 ? "fp64" : "fp32",
                 100.0 * km.pairs / ((double)km.n_query * km.cols.n));
        report->seconds_prepare = t1 - t0;
        report->seconds_search = knn_seconds() - t1;
        report->candidates = km.pooled / km.n_query;
        report->row_tile = KNN_KM_ROWS;
        report->col_tile = km.clusters;
    } else if (st == KNN_E_NOMEM) {
        snprintf(report->message, sizeof report->message,
                 "out of memory on the CPU partitioning %d nodes into "
                 "clusters with %d threads: lower 'threads' or "
                 "options(knngpu.cpu.memory)", req->n_ref, km.threads);
    } else if (st == KNN_E_INTERRUPTED && !report->message[0]) {
        snprintf(report->message, sizeof report->message,
                 "stopped between row clusters; all memory released");
    }
    knn_km_free(&km);
    return st;
}
