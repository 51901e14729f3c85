/*
 * knn_search.c: the engine's front door. Checks a request once, so that
 * backends can trust it, then hands it to the chosen backend (in blocks,
 * knn_stream.c, where its nodes do not fit; knn_dispatch.c picks the
 * backend's search), through knn_dedup.c where the reference holds many
 * exact copies.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "knn_backend.h"
#include "knn_clusters.h"
#include "knn_dedup.h"
#include "knn_exact.h"

static knn_status knn_invalid(knn_report *report, const char *why)
{
    snprintf(report->message, sizeof report->message, "%s", why);
    return KNN_E_INVALID;
}

/* Whether ref or query holds a node the metric cannot use. */
static int knn_has_degenerate(const knn_request *req)
{
    return knn_degenerate_nodes(req->metric, req->ref, req->p, req->n_ref,
                                NULL, 0, req->threads) > 0 ||
           (req->query && knn_degenerate_nodes(req->metric, req->query,
                                               req->p, req->n_query, NULL,
                                               0, req->threads) > 0);
}

static int knn_has_nonfinite(const knn_request *req)
{
    return knn_nonfinite_nodes(req->ref, req->p, req->n_ref, NULL, 0,
                               req->threads) > 0 ||
           (req->query && knn_nonfinite_nodes(req->query, req->p,
                                              req->n_query, NULL, 0,
                                              req->threads) > 0);
}

knn_status knn_search(const knn_request *req, const knn_knobs *knobs,
                      knn_backend backend, knn_result *out,
                      knn_report *report)
{
    static const knn_knobs defaults;
    if (!knobs) knobs = &defaults;
    memset(report, 0, sizeof *report);
    if ((int)req->metric < 0 || req->metric >= KNN_N_METRICS)
        return knn_invalid(report, "unknown metric");
    if (req->p < 1 || !req->ref || req->n_ref < 1)
        return knn_invalid(report, "no reference nodes or no features");
    int available = req->query ? req->n_ref : req->n_ref - 1;
    if (req->query && req->n_query < 1)
        return knn_invalid(report, "no query nodes");
    if (req->k < 1 || req->k > available)
        return knn_invalid(report, "k must be in 1..(reference nodes, "
                                   "less one in a self search)");
    if (!out->allocate && (!out->index || !out->distance || !out->weight))
        return knn_invalid(report, "no output buffers");
    if (backend == KNN_BACKEND_CPU &&
        (req->precision == KNN_PRECISION_TF32 ||
         req->precision == KNN_PRECISION_TF32X3))
        return knn_invalid(report, "tf32 and tf32x3 products exist on the "
                                   "GPU only");
    if (req->algorithm == KNN_ALGO_TREE && knn_is_correlation(req->metric))
        return knn_invalid(report, "the k-d tree serves the distance "
                                   "metrics only");
    if (req->algorithm == KNN_ALGO_CLUSTERS &&
        !knn_clusters_serve(req->metric))
        return knn_invalid(report, "clusters serve the Euclidean, squared "
                                   "Euclidean, Pearson, Spearman and cosine "
                                   "metrics only");
    /* The GPU backend finds non-finite values while it uploads them and
     * degenerate nodes while it prepares them (knn_gpu_prepare.cu), as it
     * reads every value anyway; a non-finite node is never degenerate, so
     * either order finds both. */
    if (backend == KNN_BACKEND_CPU && knn_has_nonfinite(req)) {
        snprintf(report->message, sizeof report->message,
                 "a value is NA, NaN or Inf");
        return KNN_E_NONFINITE;
    }
    if (backend == KNN_BACKEND_CPU && knn_has_degenerate(req)) {
        snprintf(report->message, sizeof report->message,
                 "a node is constant (or all zero, for cosine)");
        return KNN_E_DEGENERATE;
    }
    int done = 0;
    knn_status st = KNN_OK;
    if (knn_dedup_suits(req, knobs))
        st = knn_dedup_search(req, knobs, backend, out, report, &done);
    if (st == KNN_OK && !done)
        st = knn_search_blocks(req, knobs, backend, out, report);
    if (st == KNN_OK && out->from && !out->ends_written)
        knn_edge_ends(out->from, out->rank,
                      req->query ? req->n_query : req->n_ref, req->k,
                      out->index_base, req->threads);
    return st;
}
