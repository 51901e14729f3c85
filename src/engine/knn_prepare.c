/*
 * knn_prepare.c: canonical and fast forms of nodes for the CPU backend (see
 * knn_prepare.h). The canonical arithmetic itself lives in knn_exact.h so
 * that the CUDA backend prepares nodes with the very same operations.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "knn_exact.h"
#include "knn_prepare.h"
#include "knn_threads.h"

int knn_ranked_cmp(const void *a, const void *b)
{
    double x = ((const knn_ranked *)a)->value;
    double y = ((const knn_ranked *)b)->value;
    return (x > y) - (x < y);
}

/* Writes twice the average ranks of x into rank2: the numbers knn_rank2()
 * defines, found by sorting instead of counting so a node costs p log p. */
static void knn_rank2_sorted(const double *x, int p, knn_ranked *scratch,
                             double *rank2)
{
    for (int f = 0; f < p; f++) {
        scratch[f].value = x[f];
        scratch[f].position = f;
    }
    qsort(scratch, (size_t)p, sizeof *scratch, knn_ranked_cmp);
    for (int s = 0; s < p;) {
        int e = s;
        while (e < p && scratch[e].value == scratch[s].value) e++;
        for (int t = s; t < e; t++)
            rank2[scratch[t].position] = 2.0 * s + (e - s) + 1.0;
        s = e;
    }
}

/* Values x[0..n) of a distance node divided by 2^scale_exp: its canonical
 * values (knn_exact.h). */
static void knn_space_scale(const knn_space *space, const double *x, int n,
                            double *out)
{
    knn_ldexp_values(x, n, -space->scale_exp, space->scale_factor, out);
}

/* Whether the reference nodes' fast vectors are better left at the origin
 * than centred on space->colmean (knn_translation_term), on the request's
 * threads: a pass over every value, as long as preparing the nodes. Where
 * scratch memory runs out the mean is kept (the bits do not depend on the
 * choice, only the candidates' count). */
static int knn_origin_is_closer(const knn_space *space,
                                const knn_request *req)
{
    int p = space->p, failed = 0;
    double centred = 0.0, origin = 0.0;
    #pragma omp parallel num_threads(knn_threads(req->threads)) \
        reduction(+ : centred, origin) reduction(| : failed)
    {
        double *scaled = malloc((size_t)p * sizeof(double));
        failed = !scaled;
        #pragma omp for schedule(static)
        for (int j = 0; j < req->n_ref; j++) {
            if (!scaled) continue;
            knn_space_scale(space, req->ref + (size_t)j * p, p, scaled);
            centred += knn_translation_term(scaled, space->colmean, p);
            origin += knn_translation_term(scaled, NULL, p);
        }
        free(scaled);
    }
    return !failed && origin < centred;
}

knn_status knn_space_init(knn_space *space, const knn_request *req)
{
    int p = req->p;
    memset(space, 0, sizeof *space);
    space->metric = req->metric;
    space->p = p;
    space->kappa = 1.0;
    if (!knn_uses_product(req->metric) || knn_is_correlation(req->metric))
        return KNN_OK;

    double amax = knn_nodes_max_abs(req->ref, p, req->n_ref);
    if (req->query)
        amax = fmax(amax, knn_nodes_max_abs(req->query, p, req->n_query));
    amax = fmax(amax, req->max_abs);
    space->scale_exp = knn_exponent(amax);
    space->scale_factor = knn_ldexp_factor(-space->scale_exp);

    space->colmean = calloc((size_t)p, sizeof(double));
    double *scaled = malloc((size_t)p * sizeof(double));
    if (!space->colmean || !scaled) {
        free(scaled);
        knn_space_free(space);
        return KNN_E_NOMEM;
    }
    for (int j = 0; j < req->n_ref; j++) {
        knn_space_scale(space, req->ref + (size_t)j * p, p, scaled);
        for (int f = 0; f < p; f++) space->colmean[f] += scaled[f];
    }
    free(scaled);
    for (int f = 0; f < p; f++) space->colmean[f] /= req->n_ref;
    if (knn_origin_is_closer(space, req))
        memset(space->colmean, 0, (size_t)p * sizeof(double));
    return KNN_OK;
}

void knn_space_free(knn_space *space)
{
    free(space->colmean);
    space->colmean = NULL;
}

void knn_nodes_free(knn_nodes *nodes)
{
    free(nodes->canon);
    free(nodes->sum);
    free(nodes->css);
    free(nodes->norm2);
    memset(nodes, 0, sizeof *nodes);
}

static knn_status knn_nodes_alloc(knn_nodes *nodes, const knn_space *space,
                                  const double *x, int n, int products)
{
    int corr = knn_is_correlation(space->metric);
    memset(nodes, 0, sizeof *nodes);
    nodes->n = n;
    nodes->raw = x;
    int failed = 0;
    if (corr) {
        nodes->canon = malloc((size_t)space->p * n * sizeof(double));
        failed |= !nodes->canon;
    }
    if (corr) {
        nodes->sum = malloc((size_t)n * sizeof(double));
        nodes->css = malloc((size_t)n * sizeof(double));
        failed |= !nodes->sum || !nodes->css;
    } else if (products) {
        nodes->norm2 = malloc((size_t)n * sizeof(double));
        failed |= !nodes->norm2;
    }
    if (failed) {
        knn_nodes_free(nodes);
        return KNN_E_NOMEM;
    }
    return KNN_OK;
}

/* Node vectors are formed in pieces of this many features, on the stack,
 * where a scale of extreme exponent takes ldexp itself. */
#define KNN_PIECE 64

/* Features [f0, f0 + n) of distance node j scaled into the frame of the
 * fast vectors. */
static void knn_dist_scaled(const knn_space *space, const knn_nodes *nodes,
                            int j, int f0, int n, double *out)
{
    knn_space_scale(space, nodes->raw + (size_t)j * space->p + f0, n, out);
}

/* Stores the p values of a fast vector as float64 or float32. */
#define KNN_STORE_FAST(out, fp32, p, expr)                              \
    do {                                                                \
        if (fp32) {                                                     \
            float *w_ = (float *)(out);                                 \
            for (int f = 0; f < (p); f++) w_[f] = (float)(expr);        \
        } else {                                                        \
            double *w_ = (double *)(out);                               \
            for (int f = 0; f < (p); f++) w_[f] = (expr);               \
        }                                                               \
    } while (0)

/* Node j's fast vector into out (p values), float64 or float32: one pass
 * the compiler vectorises, the same operations as the canonical form
 * followed by the translation (a distance node's scale is a multiplication
 * by space->scale_factor where that has ldexp's bits). Only searches that
 * multiply ask, so a distance node has no canonical copy here. */
static void knn_node_fast(const knn_space *space, const knn_nodes *nodes,
                          int j, int fp32, void *out)
{
    int p = space->p;
    const double *c = space->colmean;
    if (knn_is_correlation(space->metric)) {
        double mean, scale;
        knn_fast_corr_form(space->metric, p, nodes->sum[j], nodes->css[j],
                           &mean, &scale);
        const double *u = nodes->canon + (size_t)j * p;
        KNN_STORE_FAST(out, fp32, p, (u[f] - mean) * scale);
    } else if (space->scale_factor != 0.0) {
        const double *x = nodes->raw + (size_t)j * p;
        double m = space->scale_factor;
        KNN_STORE_FAST(out, fp32, p, x[f] * m - c[f]);
    } else {
        double v[KNN_PIECE];
        for (int f0 = 0; f0 < p; f0 += KNN_PIECE) {
            int n = p - f0 < KNN_PIECE ? p - f0 : KNN_PIECE;
            knn_dist_scaled(space, nodes, j, f0, n, v);
            size_t size = fp32 ? sizeof(float) : sizeof(double);
            KNN_STORE_FAST((char *)out + f0 * size, fp32, n, v[f] - c[f0 + f]);
        }
    }
}

void knn_nodes_fast(const knn_space *space, const knn_nodes *nodes,
                    int first, int count, int fp32, void *out, int threads)
{
    size_t width = (size_t)space->p * (fp32 ? sizeof(float)
                                             : sizeof(double));
    /* One node, often asked from within a parallel loop, needs no team. */
    if (count == 1) {
        knn_node_fast(space, nodes, first, fp32, out);
        return;
    }
    #pragma omp parallel for num_threads(knn_threads(threads)) \
        schedule(static)
    for (int i = 0; i < count; i++)
        knn_node_fast(space, nodes, first + i, fp32,
                      (char *)out + (size_t)i * width);
}

/* Correlation node j: canonical u, sum and css. Returns the node's
 * cancellation p * sum(u^2) / css. */
static double knn_prepare_corr(knn_nodes *nodes, const knn_space *space,
                               const double *x, int j, double *rank2,
                               knn_ranked *scratch)
{
    int p = space->p;
    const double *xj = x + (size_t)j * p;
    double *u = nodes->canon + (size_t)j * p;
    if (space->metric == KNN_SPEARMAN) {
        knn_rank2_sorted(xj, p, scratch, rank2);
        xj = rank2;
    }
    knn_canon_corr(space->metric, xj, p, u, &nodes->sum[j], &nodes->css[j]);
    return knn_corr_kappa(space->metric, u, p, nodes->css[j]);
}

/* Distance node j: the squared norm of its fast vector where the search
 * multiplies (fast: p scratch values). Returns |fast|. */
static double knn_prepare_dist(knn_nodes *nodes, const knn_space *space,
                               int j, double *fast)
{
    int p = space->p;
    if (!nodes->norm2) return 0.0;
    knn_node_fast(space, nodes, j, 0, fast);
    nodes->norm2[j] = knn_dot(fast, fast, p);
    return sqrt(nodes->norm2[j]);
}

/* Nodes are prepared in parts of about this much work per thread (a
 * value costs one step, a Spearman rank log2(p) more), between which
 * Ctrl-C is polled: ranking thousands of nodes of 20000 values is long. */
#define KNN_PREPARE_WORK 2e7

knn_status knn_nodes_prepare(knn_nodes *nodes, knn_space *space,
                             const double *x, int n, int is_ref, int products,
                             int threads, const knn_callbacks *cb)
{
    int p = space->p;
    int corr = knn_is_correlation(space->metric);
    knn_status st = knn_nodes_alloc(nodes, space, x, n,
                                    products && knn_uses_product(
                                                    space->metric));
    if (st != KNN_OK) return st;

    int nt = knn_threads(threads);
    double per_node = p * (space->metric == KNN_SPEARMAN
                           ? 2.0 + log2(p + 1.0) : 2.0);
    double part = KNN_PREPARE_WORK * nt / per_node;
    int step = part < 1.0 ? 1 : part < n ? (int)part : n;
    double kappa = space->kappa, norm_max = space->norm_max;
    int failed = 0;
    for (int j0 = 0; j0 < n && !failed; j0 += step) {
        int j1 = n - j0 < step ? n : j0 + step;
        #pragma omp parallel num_threads(nt) \
            reduction(max : kappa, norm_max) reduction(| : failed)
        {
            double *rank2 = malloc((size_t)p * sizeof(double));
            double *fast = malloc((size_t)p * sizeof(double));
            knn_ranked *scratch = malloc((size_t)p * sizeof(knn_ranked));
            if (!rank2 || !fast || !scratch) failed = 1;
            #pragma omp for schedule(static)
            for (int j = j0; j < j1; j++) {
                if (failed) continue;
                if (corr) {
                    kappa = fmax(kappa, knn_prepare_corr(nodes, space, x, j,
                                                         rank2, scratch));
                } else {
                    double norm = knn_prepare_dist(nodes, space, j, fast);
                    if (is_ref) norm_max = fmax(norm_max, norm);
                }
            }
            free(rank2);
            free(fast);
            free(scratch);
        }
        if (!failed && j1 < n && knn_interrupted(cb)) {
            knn_nodes_free(nodes);
            return KNN_E_INTERRUPTED;
        }
    }
    if (failed) {
        knn_nodes_free(nodes);
        return KNN_E_NOMEM;
    }
    space->kappa = kappa;
    space->norm_max = norm_max;
    return KNN_OK;
}

double knn_nodes_key(const knn_space *space, const knn_nodes *query, int qi,
                     const knn_nodes *ref, int rj)
{
    int p = space->p;
    if (!knn_is_correlation(space->metric))
        return knn_key_dist(space->metric, query->raw + (size_t)qi * p,
                            ref->raw + (size_t)rj * p, p);
    return knn_key_corr(space->metric, query->canon + (size_t)qi * p,
                        ref->canon + (size_t)rj * p, p, query->sum[qi],
                        query->css[qi], ref->sum[rj], ref->css[rj]);
}

/* KNN_KEYS canonical dot products of node a with nodes b[0..KNN_KEYS),
 * each of knn_exact.h's terms in feature order. The sums are named, not an
 * array, so that they stay in registers. */
#if KNN_KEYS != 4
#error "knn_canonical_sums keeps four sums"
#endif
static void knn_canonical_sums(const double *a, const double *const *b,
                               int p, double *sums)
{
    const double *b0 = b[0], *b1 = b[1], *b2 = b[2], *b3 = b[3];
    double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
    for (int f = 0; f < p; f++) {
        s0 = knn_dot_term(s0, a[f], b0[f]);
        s1 = knn_dot_term(s1, a[f], b1[f]);
        s2 = knn_dot_term(s2, a[f], b2[f]);
        s3 = knn_dot_term(s3, a[f], b3[f]);
    }
    sums[0] = s0;
    sums[1] = s1;
    sums[2] = s2;
    sums[3] = s3;
}

/* The squared-distance keys of node a with nodes b[0..KNN_KEYS): their
 * plain sums (knn_key_dist_more's, named to stay in registers), each
 * finished by knn_key_dist_finish. */
static void knn_squares_keys(knn_metric m, const double *a,
                             const double *const *b, int p, double *keys)
{
    const double *b0 = b[0], *b1 = b[1], *b2 = b[2], *b3 = b[3];
    double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
    for (int f = 0; f < p; f++) {
        s0 = knn_sqdiff_term(s0, a[f], b0[f]);
        s1 = knn_sqdiff_term(s1, a[f], b1[f]);
        s2 = knn_sqdiff_term(s2, a[f], b2[f]);
        s3 = knn_sqdiff_term(s3, a[f], b3[f]);
    }
    double sums[KNN_KEYS] = {s0, s1, s2, s3};
    for (int q = 0; q < KNN_KEYS; q++)
        keys[q] = knn_key_dist_finish(m, sums[q], a, b[q], p);
}

void knn_nodes_keys(const knn_space *space, const knn_nodes *query, int qi,
                    const knn_nodes *ref, const int *rj, double *keys)
{
    int p = space->p, correlation = knn_is_correlation(space->metric);
    if (!correlation) {
        if (space->metric == KNN_MANHATTAN) {
            for (int q = 0; q < KNN_KEYS; q++)
                keys[q] = knn_nodes_key(space, query, qi, ref, rj[q]);
            return;
        }
        const double *b[KNN_KEYS];
        for (int q = 0; q < KNN_KEYS; q++)
            b[q] = ref->raw + (size_t)rj[q] * p;
        knn_squares_keys(space->metric, query->raw + (size_t)qi * p, b, p,
                         keys);
        return;
    }
    const double *b[KNN_KEYS];
    for (int q = 0; q < KNN_KEYS; q++) b[q] = ref->canon + (size_t)rj[q] * p;
    knn_canonical_sums(query->canon + (size_t)qi * p, b, p, keys);
    for (int q = 0; q < KNN_KEYS; q++)
        keys[q] = knn_key_corr_of_dot(space->metric, keys[q], p,
                                      query->sum[qi], query->css[qi],
                                      ref->sum[rj[q]], ref->css[rj[q]]);
}

/* The keys of query node qi with the nodes of items[0..n), KNN_KEYS at a
 * time (knn_nodes_keys). */
static void knn_rerank_keys(const knn_space *space, const knn_nodes *query,
                            int qi, const knn_nodes *ref,
                            const knn_cand *items, int n, double *keys)
{
    int c = 0;
    for (; c + KNN_KEYS <= n; c += KNN_KEYS) {
        int rj[KNN_KEYS];
        for (int q = 0; q < KNN_KEYS; q++) rj[q] = items[c + q].index;
        knn_nodes_keys(space, query, qi, ref, rj, keys + c);
    }
    for (; c < n; c++)
        keys[c] = knn_nodes_key(space, query, qi, ref, items[c].index);
}

/* Puts items[0..n), sorted by (key, index), in (reported distance,
 * index) order as far as the first k: distinct keys can report one
 * distance (knn_key_distance), and each run of those goes in index
 * order. */
static void knn_rerank_order_ties(const knn_space *sp, knn_cand *items,
                                  int n, int k)
{
    for (int a = 0; a < k && a < n;) {
        double d = knn_key_distance(sp->metric, items[a].score);
        int b = a + 1;
        while (b < n && knn_key_distance(sp->metric, items[b].score) == d)
            b++;
        for (int i = a + 1; i < b; i++)
            for (int j = i; j > a && items[j].index < items[j - 1].index;
                 j--) {
                knn_cand t = items[j];
                items[j] = items[j - 1];
                items[j - 1] = t;
            }
        a = b;
    }
}

void knn_nodes_rerank(const knn_space *space, const knn_nodes *query, int qi,
                      const knn_nodes *ref, knn_pool *pool, int n_query,
                      knn_result *out)
{
    int k = pool->k;
    double keys[4 * KNN_KEYS];
    knn_pool_prune(pool);
    for (int c0 = 0; c0 < pool->size; c0 += 4 * KNN_KEYS) {
        int n = pool->size - c0 < 4 * KNN_KEYS ? pool->size - c0
                                               : 4 * KNN_KEYS;
        knn_rerank_keys(space, query, qi, ref, pool->items + c0, n, keys);
        for (int c = 0; c < n; c++) pool->items[c0 + c].score = keys[c];
    }
    knn_pool_sort(pool);
    knn_rerank_order_ties(space, pool->items, pool->size, k);
    for (int r = 0; r < k; r++) {
        size_t at = knn_result_at(out, (size_t)n_query, k, (size_t)qi, r);
        out->index[at] = pool->items[r].index + out->index_base;
        knn_key_output(space->metric, pool->items[r].score,
                       &out->distance[at], &out->weight[at]);
    }
}
