/*
 * knn_search.c: the engine's front door. Checks a request once, so that
 * backends can trust it, then hands it to the chosen backend.
 */
#define _POSIX_C_SOURCE 199309L
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include "knn_backend.h"
#include "knn_exact.h"

double knn_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static knn_status knn_invalid(knn_report *report, const char *why)
{
    snprintf(report->message, sizeof report->message, "%s", why);
    return KNN_E_INVALID;
}

/* Reports the first degenerate node of ref, then of query. */
static knn_status knn_check_nodes(const knn_request *req, knn_report *report)
{
    int bad;
    if (knn_degenerate_nodes(req->metric, req->ref, req->p, req->n_ref, &bad,
                             1) > 0) {
        report->bad_node = bad;
        return knn_invalid(report, "a node is constant or all zero");
    }
    if (req->query && knn_degenerate_nodes(req->metric, req->query, req->p,
                                           req->n_query, &bad, 1) > 0) {
        report->bad_node = bad;
        report->bad_in_query = 1;
        return knn_invalid(report, "a query node is constant or all zero");
    }
    return KNN_OK;
}

knn_status knn_search(const knn_request *req, knn_backend backend,
                      knn_result *out, knn_report *report)
{
    memset(report, 0, sizeof *report);
    report->bad_node = -1;
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
    if (!out->index || !out->distance || !out->weight)
        return knn_invalid(report, "no output buffers");
    knn_status st = knn_check_nodes(req, report);
    if (st != KNN_OK) return st;
    if (backend == KNN_BACKEND_GPU) return knn_gpu_search(req, out, report);
    if (knn_nonfinite_nodes(req->ref, req->p, req->n_ref, NULL, 0) > 0 ||
        (req->query && knn_nonfinite_nodes(req->query, req->p, req->n_query,
                                           NULL, 0) > 0)) {
        snprintf(report->message, sizeof report->message,
                 "a value is NA, NaN or Inf");
        return KNN_E_NONFINITE;
    }
    return knn_cpu_search(req, out, report);
}
