/*
 * knn_snn.c: shared-nearest-neighbour graphs, with bluster::makeSNNGraph's
 * definitions. Each node's extended set is itself (rank 0) and its k
 * neighbours (ranks 1..k). Two nodes are joined when their extended sets
 * meet; "number" counts the shared nodes, "rank" weighs k - r / 2 with r the
 * smallest sum of the two ranks of a shared node, "jaccard" is
 * number / (2 (k + 1) - number). Weights are at least 1e-6, as in bluster.
 *
 * For each node a, the nodes b > a sharing a neighbour are found through the
 * reverse lists (which nodes list s, at which rank), so work is
 * O(n k^2) on average and memory O(n k); each a's are sorted, so the edges
 * come in (from, to) order and R sorts nothing. Offsets are 64-bit: n k
 * and the edge count may pass 2^31. The interrupt callback is polled every
 * KNN_SNN_POLL_WORK steps of that work (a few milliseconds).
 */
#include <math.h>
#include <stdlib.h>
#include "knn.h"

#define KNN_SNN_POLL_WORK 4e6

typedef struct {
    size_t *start; /* n + 1 offsets into node/rank */
    int *node;    /* nodes whose neighbour lists contain s */
    int *rank;    /* the rank of s in that list, 1..k */
} knn_reverse;

static void knn_reverse_free(knn_reverse *rev)
{
    free(rev->start);
    free(rev->node);
    free(rev->rank);
}

static int knn_reverse_build(knn_reverse *rev, const int *index, int n, int k,
                             int base)
{
    size_t nk = (size_t)n * k;
    rev->start = calloc((size_t)n + 1, sizeof(size_t));
    rev->node = malloc(nk * sizeof(int));
    rev->rank = malloc(nk * sizeof(int));
    size_t *fill = malloc((size_t)n * sizeof(size_t));
    if (!rev->start || !rev->node || !rev->rank || !fill) {
        free(fill);
        knn_reverse_free(rev);
        return -1;
    }
    for (size_t c = 0; c < nk; c++) rev->start[index[c] - base + 1]++;
    for (int s = 0; s < n; s++) rev->start[s + 1] += rev->start[s];
    for (int s = 0; s < n; s++) fill[s] = rev->start[s];
    for (int r = 0; r < k; r++)
        for (int a = 0; a < n; a++) {
            int s = index[a + (size_t)r * n] - base;
            rev->node[fill[s]] = a;
            rev->rank[fill[s]] = r + 1;
            fill[s]++;
        }
    free(fill);
    return 0;
}

typedef struct {
    int *from, *to;
    double *weight;
    size_t size, cap;
} knn_edges;

static int knn_edges_push(knn_edges *e, int from, int to, double weight)
{
    if (e->size == e->cap) {
        size_t cap = e->cap ? 2 * e->cap : 1024;
        int *f = realloc(e->from, cap * sizeof(int));
        if (f) e->from = f;
        int *t = realloc(e->to, cap * sizeof(int));
        if (t) e->to = t;
        double *w = realloc(e->weight, cap * sizeof(double));
        if (w) e->weight = w;
        if (!f || !t || !w) return -1;
        e->cap = cap;
    }
    e->from[e->size] = from;
    e->to[e->size] = to;
    e->weight[e->size] = weight;
    e->size++;
    return 0;
}

static int knn_snn_int_cmp(const void *x, const void *y)
{
    int a = *(const int *)x, b = *(const int *)y;
    return (a > b) - (a < b);
}

/* Records that node b (> a) shares a node with a at combined rank r. */
static void knn_snn_meet(int b, int r, int *best, int *count, int *touched,
                         int *n_touched)
{
    if (count[b] == 0) {
        touched[(*n_touched)++] = b;
        best[b] = r;
    } else if (r < best[b]) {
        best[b] = r;
    }
    count[b]++;
}

static double knn_snn_weight(knn_snn_type type, int k, int best, int count)
{
    double w;
    if (type == KNN_SNN_RANK) w = k - 0.5 * best;
    else if (type == KNN_SNN_NUMBER) w = count;
    else w = count / (2.0 * (k + 1) - count);
    return w > 1e-6 ? w : 1e-6;
}

knn_status knn_snn_graph(const int *index, int n, int k, int base,
                         knn_snn_type type, const knn_callbacks *cb,
                         int **from, int **to, double **weight,
                         size_t *n_edges)
{
    knn_reverse rev = {0};
    knn_edges edges = {0};
    int *best = malloc((size_t)n * sizeof(int));
    int *count = calloc((size_t)n, sizeof(int));
    int *touched = malloc((size_t)n * sizeof(int));
    knn_status st = !best || !count || !touched ||
                    knn_reverse_build(&rev, index, n, k, base) != 0
        ? KNN_E_NOMEM : KNN_OK;
    double work = 0.0;

    for (int a = 0; a < n && st == KNN_OK; a++) {
        if (work > KNN_SNN_POLL_WORK) {
            work = 0.0;
            if (knn_interrupted(cb)) {
                st = KNN_E_INTERRUPTED;
                break;
            }
        }
        int n_touched = 0;
        for (int ra = 0; ra <= k; ra++) {
            int s = ra == 0 ? a : index[a + (size_t)(ra - 1) * n] - base;
            if (s > a)
                knn_snn_meet(s, ra, best, count, touched, &n_touched);
            for (size_t c = rev.start[s]; c < rev.start[s + 1]; c++)
                if (rev.node[c] > a)
                    knn_snn_meet(rev.node[c], ra + rev.rank[c], best, count,
                                 touched, &n_touched);
            work += 1.0 + (double)(rev.start[s + 1] - rev.start[s]);
        }
        qsort(touched, (size_t)n_touched, sizeof *touched, knn_snn_int_cmp);
        work += n_touched * log2(n_touched + 1.0);
        for (int t = 0; t < n_touched; t++) {
            int b = touched[t];
            if (st == KNN_OK &&
                knn_edges_push(&edges, a + base, b + base,
                               knn_snn_weight(type, k, best[b], count[b])))
                st = KNN_E_NOMEM;
            count[b] = 0;
        }
    }
    free(best);
    free(count);
    free(touched);
    knn_reverse_free(&rev);
    if (st != KNN_OK) {
        free(edges.from);
        free(edges.to);
        free(edges.weight);
        *from = *to = NULL;
        *weight = NULL;
        *n_edges = 0;
        return st;
    }
    *from = edges.from;
    *to = edges.to;
    *weight = edges.weight;
    *n_edges = edges.size;
    return KNN_OK;
}
