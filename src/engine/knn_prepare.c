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

typedef struct {
    double value;
    int position;
} knn_ranked;

static int knn_ranked_cmp(const void *a, const void *b)
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
            knn_ldexp_values(req->ref + (size_t)j * p, p, -space->scale_exp,
                             scaled);
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
    if (knn_is_correlation(req->metric)) return KNN_OK;

    double amax = knn_nodes_max_abs(req->ref, p, req->n_ref);
    if (req->query)
        amax = fmax(amax, knn_nodes_max_abs(req->query, p, req->n_query));
    amax = fmax(amax, req->max_abs);
    space->scale_exp = knn_exponent(amax);
    if (!knn_uses_product(req->metric)) return KNN_OK;

    space->colmean = calloc((size_t)p, sizeof(double));
    double *scaled = malloc((size_t)p * sizeof(double));
    if (!space->colmean || !scaled) {
        free(scaled);
        knn_space_free(space);
        return KNN_E_NOMEM;
    }
    for (int j = 0; j < req->n_ref; j++) {
        knn_ldexp_values(req->ref + (size_t)j * p, p, -space->scale_exp,
                         scaled);
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
    free(nodes->fast);
    free(nodes->fast32);
    free(nodes->norm2);
    memset(nodes, 0, sizeof *nodes);
}

static knn_status knn_nodes_alloc(knn_nodes *nodes, const knn_space *space,
                                  int n, int forms)
{
    size_t pn = (size_t)space->p * n;
    int corr = knn_is_correlation(space->metric);
    if (!knn_uses_product(space->metric)) forms = 0;
    memset(nodes, 0, sizeof *nodes);
    nodes->n = n;
    nodes->canon = malloc(pn * sizeof(double));
    int failed = !nodes->canon;
    if (corr) {
        nodes->sum = malloc((size_t)n * sizeof(double));
        nodes->css = malloc((size_t)n * sizeof(double));
        failed |= !nodes->sum || !nodes->css;
    }
    if (forms & KNN_FORM_FAST64) {
        nodes->fast = malloc(pn * sizeof(double));
        failed |= !nodes->fast;
    }
    if (forms & KNN_FORM_FAST32) {
        nodes->fast32 = malloc(pn * sizeof(float));
        failed |= !nodes->fast32;
    }
    if (forms && !corr) {
        nodes->norm2 = malloc((size_t)n * sizeof(double));
        failed |= !nodes->norm2;
    }
    if (failed) {
        knn_nodes_free(nodes);
        return KNN_E_NOMEM;
    }
    return KNN_OK;
}

/* Where node j's float64 fast vector goes: the nodes' array when they keep
 * one, else the thread's scratch (only its float32 rounding is kept). */
static double *knn_fast_target(const knn_nodes *nodes, int p, int j,
                               double *scratch)
{
    return nodes->fast ? nodes->fast + (size_t)j * p : scratch;
}

/* Keeps the float32 rounding of node j's fast vector v, where asked. */
static void knn_keep_fast32(knn_nodes *nodes, int p, int j, const double *v)
{
    if (!nodes->fast32) return;
    float *w = nodes->fast32 + (size_t)j * p;
    for (int f = 0; f < p; f++) w[f] = (float)v[f];
}

/* Correlation node j: canonical u, then the unit-norm centred fast vector.
 * Returns the node's cancellation p * sum(u^2) / css. */
static double knn_prepare_corr(knn_nodes *nodes, const knn_space *space,
                               const double *x, int j, double *rank2,
                               knn_ranked *scratch, double *fast_scratch)
{
    int p = space->p;
    const double *xj = x + (size_t)j * p;
    double *u = nodes->canon + (size_t)j * p;
    double *fast = knn_fast_target(nodes, p, j, fast_scratch);
    if (space->metric == KNN_SPEARMAN) {
        knn_rank2_sorted(xj, p, scratch, rank2);
        xj = rank2;
    }
    knn_canon_corr(space->metric, xj, p, u, &nodes->sum[j], &nodes->css[j]);
    double mean, scale;
    knn_fast_corr_form(space->metric, p, nodes->sum[j], nodes->css[j], &mean,
                       &scale);
    for (int f = 0; f < p; f++) fast[f] = (u[f] - mean) * scale;
    knn_keep_fast32(nodes, p, j, fast);
    return knn_corr_kappa(space->metric, u, p, nodes->css[j]);
}

/* Distance node j: scaled canonical node and its column-centred fast form.
 * Returns |fast|. */
static double knn_prepare_dist(knn_nodes *nodes, const knn_space *space,
                               const double *x, int j, double *fast_scratch)
{
    int p = space->p;
    const double *xj = x + (size_t)j * p;
    double *c = nodes->canon + (size_t)j * p;
    knn_ldexp_values(xj, p, -space->scale_exp, c);
    if (!nodes->norm2) return 0.0;
    double *v = knn_fast_target(nodes, p, j, fast_scratch);
    for (int f = 0; f < p; f++) v[f] = c[f] - space->colmean[f];
    knn_keep_fast32(nodes, p, j, v);
    nodes->norm2[j] = knn_dot(v, v, p);
    return sqrt(nodes->norm2[j]);
}

knn_status knn_nodes_prepare(knn_nodes *nodes, knn_space *space,
                             const double *x, int n, int is_ref, int forms,
                             int threads)
{
    int p = space->p;
    int corr = knn_is_correlation(space->metric);
    knn_status st = knn_nodes_alloc(nodes, space, n, forms);
    if (st != KNN_OK) return st;

    double kappa = space->kappa, norm_max = space->norm_max;
    int failed = 0;
    #pragma omp parallel num_threads(knn_threads(threads)) \
        reduction(max : kappa, norm_max) reduction(| : failed)
    {
        double *rank2 = malloc((size_t)p * sizeof(double));
        double *fast = malloc((size_t)p * sizeof(double));
        knn_ranked *scratch = malloc((size_t)p * sizeof(knn_ranked));
        if (!rank2 || !fast || !scratch) failed = 1;
        #pragma omp for schedule(static)
        for (int j = 0; j < n; j++) {
            if (failed) continue;
            if (corr) {
                kappa = fmax(kappa, knn_prepare_corr(nodes, space, x, j,
                                                     rank2, scratch, fast));
            } else {
                double norm = knn_prepare_dist(nodes, space, x, j, fast);
                if (is_ref) norm_max = fmax(norm_max, norm);
            }
        }
        free(rank2);
        free(fast);
        free(scratch);
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
    const double *a = query->canon + (size_t)qi * p;
    const double *b = ref->canon + (size_t)rj * p;
    if (!knn_is_correlation(space->metric))
        return knn_key_dist(space->metric, a, b, p);
    return knn_key_corr(space->metric, a, b, p, query->sum[qi],
                        query->css[qi], ref->sum[rj], ref->css[rj]);
}
