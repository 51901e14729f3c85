/*
 * knn_dispatch.c: which search runs on a backend: the GPU's, else the
 * CPU's k-d tree where it suits the request, else its clusters where they
 * suit it (which hand over to the scan where they do not prune), else the
 * CPU's scan of products. Called by knn_stream.c for the whole search or
 * each block.
 */
#include "knn_backend.h"
#include "knn_clusters.h"
#include "knn_kdtree.h"

knn_status knn_search_on(const knn_request *req, const knn_knobs *knobs,
                         knn_backend backend, knn_result *out,
                         knn_report *report)
{
    if (backend == KNN_BACKEND_GPU)
        return knn_gpu_search(req, knobs, out, report);
    if (knn_kdtree_suits(req)) return knn_kdtree_search(req, out, report);
    if (knn_clusters_suits(req))
        return knn_clusters_search(req, out, report);
    return knn_cpu_search(req, out, report);
}
