/*
 * knn_symmetrize.c: the undirected graph of a self search's directed edge
 * list, in O(n k) memory beyond the lists themselves: each pair of nodes
 * once (lo < hi), carrying the edge of the better rank (the lo -> hi edge
 * on a tie, which comes first in edge order), every pair ("union") or
 * only the pairs that both ends chose ("mutual"), in (lo, hi) order.
 *
 * For each lo, the pairs come from two lists sorted by hi: its own edges
 * to larger nodes (sorted here, k at most) and the edges of larger nodes
 * to it, from reverse lists built once in edge order, hence by node.
 * The pairs' columns are written straight from the directed list's, so
 * nothing per pair is kept besides them. The interrupt callback is polled
 * every KNN_SYM_POLL_WORK edges.
 */
#include <stdlib.h>
#include "knn.h"

#define KNN_SYM_POLL_WORK 4e6

typedef struct {
    int hi, edge;
} knn_sym_cand;

static int knn_sym_cand_cmp(const void *a, const void *b)
{
    int x = ((const knn_sym_cand *)a)->hi, y = ((const knn_sym_cand *)b)->hi;
    return (x > y) - (x < y);
}

void knn_symmetry_free(knn_symmetry *s)
{
    free(s->start);
    free(s->edge);
    s->start = NULL;
    s->edge = NULL;
}

knn_status knn_symmetry_build(knn_symmetry *s, const int *to, int n, int k,
                              int base)
{
    size_t nk = (size_t)n * k;
    s->start = calloc((size_t)n + 1, sizeof(size_t));
    if (!s->start) return KNN_E_NOMEM;
    for (size_t e = 0; e < nk; e++) {
        int i = (int)(e / (size_t)k), j = to[e] - base;
        if (j < i) s->start[j + 1]++;
    }
    for (int j = 0; j < n; j++) s->start[j + 1] += s->start[j];
    s->edge = malloc((s->start[n] ? s->start[n] : 1) * sizeof(size_t));
    size_t *fill = malloc(((size_t)n ? (size_t)n : 1) * sizeof(size_t));
    if (!s->edge || !fill) {
        free(fill);
        knn_symmetry_free(s);
        return KNN_E_NOMEM;
    }
    for (int j = 0; j < n; j++) fill[j] = s->start[j];
    for (size_t e = 0; e < nk; e++) {
        int i = (int)(e / (size_t)k), j = to[e] - base;
        if (j < i) s->edge[fill[j]++] = e;
    }
    free(fill);
    return KNN_OK;
}

knn_status knn_symmetry_pairs(const knn_symmetry *s, const int *to,
                              const double *weight, const double *distance,
                              int n, int k, int base, int mutual,
                              const knn_callbacks *cb,
                              const knn_symmetry_out *out, size_t *count)
{
    knn_sym_cand *own = malloc((size_t)k * sizeof *own);
    if (!own) return KNN_E_NOMEM;
    size_t m = 0;
    double work = 0.0;
    for (int lo = 0; lo < n; lo++) {
        if (work > KNN_SYM_POLL_WORK) {
            work = 0.0;
            if (knn_interrupted(cb)) {
                free(own);
                return KNN_E_INTERRUPTED;
            }
        }
        int n_own = 0;
        for (int r = 0; r < k; r++) {
            size_t e = (size_t)lo * k + r;
            int hi = to[e] - base;
            if (hi > lo) own[n_own++] = (knn_sym_cand){hi, r};
        }
        qsort(own, (size_t)n_own, sizeof *own, knn_sym_cand_cmp);
        size_t a = 0, b = s->start[lo], b_end = s->start[lo + 1];
        work += k + (double)(b_end - b);
        while (a < (size_t)n_own || b < b_end) {
            int hi_a = a < (size_t)n_own ? own[a].hi : n;
            int hi_b = b < b_end ? (int)(s->edge[b] / (size_t)k) : n;
            int hi = hi_a < hi_b ? hi_a : hi_b;
            size_t e_a = (size_t)lo * k + (hi_a == hi ? own[a].edge : 0);
            size_t e_b = hi_b == hi ? s->edge[b] : 0;
            int both = hi_a == hi && hi_b == hi;
            size_t e = !both ? (hi_a == hi ? e_a : e_b)
                     : e_b % k < e_a % k ? e_b : e_a;
            if (hi_a == hi) a++;
            if (hi_b == hi) b++;
            if (mutual && !both) continue;
            if (out) {
                out->lo[m] = lo + base;
                out->hi[m] = hi + base;
                out->weight[m] = weight[e];
                out->distance[m] = distance[e];
                out->rank[m] = (int)(e % (size_t)k) + 1;
            }
            m++;
        }
    }
    free(own);
    *count = m;
    return KNN_OK;
}
