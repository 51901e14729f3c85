/*
 * knn_backend.h: what knn_search() (knn_search.c) asks of each backend.
 *
 * A backend receives a request that knn_search() has already validated
 * (metric known, 1 <= k <= available candidates, no degenerate nodes; for
 * the CPU backend finite values, which the GPU backend checks itself while
 * it uploads them, returning KNN_E_NONFINITE) and must fill `out` with
 * exactly the answer of knn_exact.h, or return an error with
 * report->message set after freeing everything it took.
 * Backends fill report->device, ->precision, timings and ->candidates.
 */
#ifndef KNN_BACKEND_H
#define KNN_BACKEND_H

#include "knn.h"

#ifdef __cplusplus
extern "C" {
#endif

knn_status knn_cpu_search(const knn_request *req, knn_result *out,
                          knn_report *report);

/* Implemented in src/cuda/ when built with CUDA, else in knn_gpu_none.c. */
knn_status knn_gpu_search(const knn_request *req, knn_result *out,
                          knn_report *report);

/* Monotonic wall clock in seconds, for report timings. */
double knn_seconds(void);

#ifdef __cplusplus
}
#endif

#endif
