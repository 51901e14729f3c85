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

/* The search on one backend as it is (the GPU, the CPU's k-d tree where
 * it suits, else its scan of products); knn_dispatch.c. knobs is never
 * NULL here (knn_search() gives the defaults). */
knn_status knn_search_on(const knn_request *req, const knn_knobs *knobs,
                         knn_backend backend, knn_result *out,
                         knn_report *report);

/* The search on one backend, streamed in blocks where its nodes do not fit
 * (knn_stream.c): always for knobs->block_nodes > 0; on the GPU when they
 * pass half of req->memory_bytes, or when the whole search ran out of
 * device memory. Same contract and bits as knn_search_on. */
knn_status knn_search_blocks(const knn_request *req, const knn_knobs *knobs,
                             knn_backend backend, knn_result *out,
                             knn_report *report);

/* Implemented in src/cuda/ when built with CUDA, else in knn_gpu_none.c. */
knn_status knn_gpu_search(const knn_request *req, const knn_knobs *knobs,
                          knn_result *out, knn_report *report);

/* The CUDA backend as its shared object (knngpu_cuda.so) hands it over:
 * its entry points, called only through this table from the package's
 * own shared object (knn_gpu_loader.c). */
typedef struct {
    knn_status (*search)(const knn_request *req, const knn_knobs *knobs,
                         knn_result *out, knn_report *report);
    void (*query)(knn_gpu_info *info);
    void (*release)(void);
} knn_gpu_backend;

/* Exported by knngpu_cuda.so, the only symbol it exports. */
typedef const knn_gpu_backend *(*knn_gpu_backend_fn)(void);
#define KNN_GPU_BACKEND_SYMBOL "knn_cuda_backend"

/* Monotonic wall clock in seconds, for report timings (knn_clock.c). */
double knn_seconds(void);

#ifdef __cplusplus
}
#endif

#endif
