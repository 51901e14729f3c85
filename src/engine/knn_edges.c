/*
 * knn_edges.c: the parts of a directed edge list that the search does not
 * write. A graph's search writes its targets, distances and weights straight
 * in edge order (knn_result.by_row), so no n x k matrix is transposed; the
 * sources and ranks follow from the position alone.
 */
#include "knn.h"
#include "knn_threads.h"

void knn_edge_ends(int *from, int *rank, int n, int k, int base,
                   int threads)
{
    int nt = knn_threads(threads);
    (void)nt; /* read only by the pragma, absent without OpenMP */
    #pragma omp parallel for num_threads(nt) schedule(static)
    for (int i = 0; i < n; i++)
        knn_edge_ends_range(from, rank, (size_t)i * k, (size_t)(i + 1) * k,
                            k, base);
}
