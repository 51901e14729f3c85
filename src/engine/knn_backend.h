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

/* A pairwise-complete search on a GPU (knn_coexpr.c asks,
 * src/cuda/knn_gpu_coexpr.cu computes): every pair's float64 key from
 * knn_pw_key.h, the CPU's own definition, and each row's best k, so its
 * bits are the CPU's. Nodes as knn_coexpr.c prepares them: p x n,
 * column-major (node-contiguous), NaN where missing, with each node's
 * imax or, for bicor, its present features in ascending order of value
 * (p x n, the first `present` of each node's p). */
typedef struct {
    int p, k, min_shared;
    int bicor;              /* else Pearson, |Pearson| or cosine: */
    int centred, absolute;  /* Pearson: 1, 0; |Pearson|: 1, 1; cosine: 0, 0 */
    const double *ref;      /* p x n_ref, read only; goes to the device once */
    const double *ref_imax; /* n_ref (not bicor) */
    const int *ref_order;   /* p x n_ref (bicor) */
    const int *ref_present; /* n_ref (bicor) */
    int n_ref;
    const double *query;    /* p x n_query, read only; NULL: the rows asked
                               for are reference nodes (a self search) */
    const double *query_imax;
    const int *query_order;
    const int *query_present;
    int n_query;
    int block_rows;         /* the most rows one knn_gpu_pw_start asks for */
    double memory_bytes;    /* device memory to use; <= 0: what is free */
    int n_devices;          /* the first of devices runs it; 0: the first
                               usable GPU */
    int devices[KNN_MAX_DEVICES];
} knn_pw_gpu_request;

/* One block's answers in pinned host memory: row i's k best at i * k, in
 * order. */
typedef struct {
    int *index;        /* 0-based reference node; -1: no neighbour */
    double *distance;  /* NaN for no neighbour */
} knn_pw_gpu_rows;

/* One pairwise-complete search's state on its device; opaque. */
typedef struct knn_pw_gpu knn_pw_gpu;

/* Opens a search on a device: its context, the nodes there, and a host
 * buffer of block_rows x k answers (*host, owned by the device's context:
 * valid until knn_gpu_pw_close). Writes the rows of one
 * device chunk (*chunk_rows, knn_pw_chunk_rows of the budget) and
 * report->device. Returns KNN_OK; else KNN_E_NOGPU, KNN_E_INVALID (no
 * such GPU), KNN_E_NOMEM (the nodes do not fit the budget) or
 * KNN_E_DEVICE, report->message set and nothing left allocated. */
knn_status knn_gpu_pw_open(const knn_pw_gpu_request *req, knn_pw_gpu **gpu,
                           knn_pw_gpu_rows *host, int *chunk_rows,
                           knn_report *report);
/* Queues the best k of rows [first, first + rows) (query nodes, or
 * reference nodes for a NULL query) into the host buffer. A self search
 * asks for its rows in order, from row 0, each once (a device that keeps
 * all its keys fills a row's keys with earlier nodes while keying those
 * nodes' rows; KNN_E_INVALID otherwise). Returns at once; KNN_OK, or an
 * error with message (512 bytes) set. */
knn_status knn_gpu_pw_start(knn_pw_gpu *gpu, int first, int rows,
                            char *message);
/* Waits up to ms milliseconds for the rows queued last: *done is 1 once
 * they are in the host buffer. Returns KNN_OK, or an error with message
 * set. */
knn_status knn_gpu_pw_wait(knn_pw_gpu *gpu, int ms, int *done,
                           char *message);
/* Frees what knn_gpu_pw_open took once the device is idle, given how the
 * search ended (status); nothing for NULL. Never fails. */
void knn_gpu_pw_close(knn_pw_gpu *gpu, knn_status status);

/* The CUDA backend as its shared object (knngpu_cuda.so) hands it over:
 * its entry points, called only through this table from the package's
 * own shared object (knn_gpu_loader.c). */
typedef struct {
    knn_status (*search)(const knn_request *req, const knn_knobs *knobs,
                         knn_result *out, knn_report *report);
    void (*query)(knn_gpu_info *info);
    void (*release)(void);
    knn_status (*pw_open)(const knn_pw_gpu_request *req, knn_pw_gpu **gpu,
                          knn_pw_gpu_rows *host, int *chunk_rows,
                          knn_report *report);
    knn_status (*pw_start)(knn_pw_gpu *gpu, int first, int rows,
                           char *message);
    knn_status (*pw_wait)(knn_pw_gpu *gpu, int ms, int *done,
                          char *message);
    void (*pw_close)(knn_pw_gpu *gpu, knn_status status);
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
