/*
 * knn_input.c: the engine's view of its input: the node-contiguous layout,
 * and the nodes it cannot use (non-finite values; constant or all-zero nodes
 * for the metrics that are undefined there). The R layer names the
 * offending nodes from these indices.
 */
#include <math.h>
#include <string.h>
#include "knn_exact.h"
#include "knn_threads.h"

/* Values below which the input checks stay on one thread. */
#define KNN_PARALLEL_CHECK_MIN 131072.0

/* Nodes ahead whose first values the degenerate check asks for: it reads
 * a line or two of each node, too far apart for the hardware to guess,
 * so one miss at a time would bind it to memory latency. */
#define KNN_CHECK_AHEAD 16

/* Transposes in square blocks so both sides stay in cache, bands of
 * nodes on several threads: a large matrix (1.2 GB of log-counts) is
 * bound by memory bandwidth and by faulting in the fresh pages of `out`,
 * neither of which one core saturates. */
#define KNN_LAYOUT_BLOCK 32

static void knn_transpose(const double *x, int nrow, int ncol, double *out,
                          int threads)
{
    int nt = (double)nrow * ncol < KNN_PARALLEL_CHECK_MIN
        ? 1 : knn_threads(threads);
    (void)nt; /* read only by the pragma, absent without OpenMP */
    #pragma omp parallel for num_threads(nt) schedule(static)
    for (int r0 = 0; r0 < nrow; r0 += KNN_LAYOUT_BLOCK) {
        int r1 = r0 + KNN_LAYOUT_BLOCK < nrow ? r0 + KNN_LAYOUT_BLOCK : nrow;
        for (int c0 = 0; c0 < ncol; c0 += KNN_LAYOUT_BLOCK) {
            int c1 = c0 + KNN_LAYOUT_BLOCK < ncol ? c0 + KNN_LAYOUT_BLOCK
                                                  : ncol;
            for (int r = r0; r < r1; r++)
                for (int c = c0; c < c1; c++)
                    out[(size_t)r * ncol + c] = x[(size_t)c * nrow + r];
        }
    }
}

static int knn_all_finite(const double *x, int p)
{
    for (int f = 0; f < p; f++)
        if (!isfinite(x[f])) return 0;
    return 1;
}

void knn_layout_nodes(const double *x, int nrow, int ncol, int by_rows,
                      double *out, int threads)
{
    if (by_rows) knn_transpose(x, nrow, ncol, out, threads);
    else memcpy(out, x, (size_t)nrow * ncol * sizeof(double));
}

/* Whether every value is finite, read by several threads: the check runs
 * on every call and is bound by memory bandwidth, which one core does not
 * saturate. */
static int knn_all_nodes_finite(const double *x, int p, int n, int threads)
{
    int ok = 1;
    int nt = (double)p * n < KNN_PARALLEL_CHECK_MIN ? 1
                                                    : knn_threads(threads);
    (void)nt; /* read only by the pragma, absent without OpenMP */
    #pragma omp parallel for num_threads(nt) schedule(static) \
        reduction(&&: ok)
    for (int j = 0; j < n; j++)
        ok = ok && knn_all_finite(x + (size_t)j * p, p);
    return ok;
}

int knn_nonfinite_nodes(const double *x, int p, int n, int *bad, int max_bad,
                        int threads)
{
    if (knn_all_nodes_finite(x, p, n, threads)) return 0;
    int found = 0;
    for (int j = 0; j < n; j++) {
        if (knn_all_finite(x + (size_t)j * p, p)) continue;
        if (found < max_bad) bad[found] = j;
        found++;
    }
    return found;
}

/* Whether any node is degenerate, on several threads as
 * knn_all_nodes_finite: the check runs on every search, and a node
 * whose first values are all zero reads on. */
static int knn_any_degenerate(knn_metric metric, const double *x, int p,
                              int n, int threads)
{
    if (!knn_is_correlation(metric)) return 0;
    int any = 0;
    int nt = (double)p * n < KNN_PARALLEL_CHECK_MIN ? 1
                                                    : knn_threads(threads);
    (void)nt; /* read only by the pragma, absent without OpenMP */
    #pragma omp parallel for num_threads(nt) schedule(static) \
        reduction(||: any)
    for (int j = 0; j < n; j++) {
        if (j + KNN_CHECK_AHEAD < n)
            __builtin_prefetch(x + (size_t)(j + KNN_CHECK_AHEAD) * p);
        any = any || knn_node_degenerate(metric, x + (size_t)j * p, p);
    }
    return any;
}

int knn_degenerate_nodes(knn_metric metric, const double *x, int p, int n,
                         int *rows, int max_rows, int threads)
{
    if (!knn_any_degenerate(metric, x, p, n, threads)) return 0;
    int found = 0;
    for (int j = 0; j < n; j++) {
        if (!knn_node_degenerate(metric, x + (size_t)j * p, p)) continue;
        if (found < max_rows) rows[found] = j;
        found++;
    }
    return found;
}
