/*
 * knn_gpu_coexpr.cu: a pairwise-complete search (Pearson, |Pearson|,
 * cosine, bicor) on a GPU (knn_gpu_pw_*, knn_backend.h). Every pair gets its
 * float64 key on the device from knn_pw_key.h, the definition the CPU
 * engine keys its pairs with, so the answer has the CPU's bits: the keys
 * are the same and the best k of a row by (distance, index) are the same
 * whoever picks them.
 *
 * The nodes go to the device once, the reference twice: node by node (the
 * rows of a self search) and feature by feature, so that the 32 threads of
 * a warp, on 32 consecutive reference nodes, read 32 consecutive values
 * (and, for bicor, places in the nodes' orders of their values).
 * Each block of rows the engine asks for runs in chunks (knn_pw_chunk_rows
 * of the memory budget): the chunk's keys into a device panel, each row's
 * best k from it (knn_select_keys, knn_gpu_select.cu), and their transfer
 * into the engine's pinned host buffer, all queued on the context's
 * stream, whose order keeps the one panel from being overwritten before
 * its rows are chosen. The call returns at once; the engine waits in
 * slices of at most 100 ms (knn_gpu_pw_wait) and polls Ctrl-C between
 * them, and asks for the next block once it has written out this one, so
 * that an interrupted search waits for one block at most.
 *
 * A key is the bits of the pair's distance (in [0, 2], so their integer
 * order is the distance order) or KNN_KEY_NONE for a pair without one:
 * too few shared features, a measure undefined there, or a node with
 * itself.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <chrono>
#include <new>
#include <thread>
#include <vector>
#include "knn_coexpr.h"
#include "knn_gpu.cuh"
#include "knn_pw_key.h"

/* Reference nodes per block of the key kernel (one warp's width), and
 * rows of threads beside them; each thread keys KNN_PW_ROW_STEPS rows. */
#define KNN_PW_COLS 32
#define KNN_PW_ROWS 32
#define KNN_PW_ROW_STEPS 4
/* The most bytes of one chunk's key panel: more rows per chunk only save
 * launches, whose cost is small against a chunk this size. A self search
 * may keep all its keys, each pair keyed once, in up to
 * KNN_PW_WHOLE_BYTES (16384 nodes), where that halves the work. */
#define KNN_PW_PANEL_BYTES (256.0 * 1048576.0)
#define KNN_PW_WHOLE_BYTES (2048.0 * 1048576.0)

struct knn_pw_gpu {
    int device;
    knn_gpu_context *ctx;
    int p, k, n_ref, chunk;
    int bicor, centred, absolute, min_shared;
    int shared_bytes;        /* the key kernel's tile of reference values
                                in shared memory; 0: read from global */
    int whole;               /* a self search whose keys all stay on the
                                device (keys: n_ref x n_ref), each pair
                                keyed once (knn_pw_keys' mirror) */
    int next_row;            /* whole: the first row not yet asked for */
    void *block;             /* the one device allocation of: */
    double *ref;             /* p x n_ref, node by node */
    double *ref_t;           /* n_ref x p, feature by feature */
    double *ref_imax;        /* n_ref */
    int *ref_order;          /* bicor: p x n_ref, node by node */
    int *ref_order_t;        /* bicor: n_ref x p, feature by feature */
    int *ref_present;        /* bicor: n_ref */
    double *query;           /* p x n_query; NULL: the rows are reference
                                nodes */
    double *query_imax;
    int *query_order, *query_present;
    unsigned long long *keys; /* chunk x n_ref; whole: n_ref x n_ref */
    unsigned long long *pick_key; /* chunk x k: rows' best k, unordered */
    int *pick_j;
    int *best_j;             /* chunk x k: rows' best k, in order */
    double *best_d;
    knn_pw_gpu_rows host;    /* the context's pinned memory */
    cudaEvent_t done;        /* recorded after a block's last transfer */
};

/* The reference feature by feature: out[f * n + j] = in[j * p + f]. */
template <typename T>
__global__ void knn_pw_transpose(const T *in, int p, int n, T *out)
{
    size_t at = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (at >= (size_t)p * n) return;
    size_t j = at / p, f = at % p;
    out[f * n + j] = in[at];
}

/* The rows' nodes and the reference's columns as the key kernel reads
 * them. */
struct knn_pw_sides {
    const double *rows_of;   /* p x n, node by node */
    const double *row_imax;
    const int *row_order;    /* bicor: p x n, node by node */
    const int *row_present;
    const double *ref_t;     /* n_ref x p, feature by feature */
    const double *ref_imax;
    const int *ref_order_t;  /* bicor: n_ref x p */
    const int *ref_present;
};

/* The keys of rows [0, rows) of the chunk (nodes first.. of the rows'
 * side) with every reference node, into keys (rows x n_ref). Row r is
 * reference node self_first + r in a self search (self_first >= 0), which
 * has no key with itself. With SHARED, the block's KNN_PW_COLS reference
 * nodes are first copied into shared memory feature by feature (values,
 * then for bicor orders); else read from global memory.
 *
 * With mirror (a self search whose keys all stay on the device: keys is
 * n_ref x n_ref, row r of the chunk at row first + r), a row is keyed with
 * the nodes from itself on only, and each key goes to both of its places:
 * a key does not change when its two nodes trade places (every sum and
 * product in knn_pw_key.h is taken the same way for either order). The
 * chunks go in order, so a row's keys with earlier nodes are in place
 * before it is chosen from: half the work, the same bits. */
template <bool SHARED, bool BICOR>
__global__ void __launch_bounds__(KNN_PW_COLS * KNN_PW_ROWS)
knn_pw_keys(knn_pw_sides s, int first, int rows,
                            int self_first, int mirror, int n_ref, int p,
                            int centred, int absolute, int min_shared,
                            unsigned long long *keys)
{
    extern __shared__ double tile[];
    int col0 = blockIdx.x * KNN_PW_COLS;
    int r0 = blockIdx.y * (KNN_PW_ROWS * KNN_PW_ROW_STEPS);
    if (mirror && first + r0 >= col0 + KNN_PW_COLS) return;
    int j = col0 + threadIdx.x;
    const double *b = s.ref_t + j;
    const int *ord_b = BICOR ? s.ref_order_t + j : NULL;
    size_t stride = (size_t)n_ref;
    if (SHARED) {
        int cols = n_ref - col0 < KNN_PW_COLS ? n_ref - col0 : KNN_PW_COLS;
        int t = threadIdx.y * KNN_PW_COLS + threadIdx.x;
        int *tile_ord = (int *)(tile + (size_t)p * KNN_PW_COLS);
        for (int at = t; at < p * KNN_PW_COLS; at += KNN_PW_COLS *
                                                       KNN_PW_ROWS) {
            int f = at / KNN_PW_COLS, c = at % KNN_PW_COLS;
            size_t from = (size_t)f * n_ref + col0 + c;
            tile[at] = c < cols ? s.ref_t[from] : 0.0;
            if (BICOR) tile_ord[at] = c < cols ? s.ref_order_t[from] : 0;
        }
        __syncthreads();
        b = tile + threadIdx.x;
        ord_b = BICOR ? tile_ord + threadIdx.x : NULL;
        stride = KNN_PW_COLS;
    }
    if (j >= n_ref) return;
    double ib = BICOR ? 0.0 : s.ref_imax[j];
    int len_b = BICOR ? s.ref_present[j] : 0;
    for (int step = 0; step < KNN_PW_ROW_STEPS; step++) {
        int r = r0 + step * KNN_PW_ROWS + threadIdx.y;
        if (r >= rows) break;
        if (mirror && first + r > j) continue;
        unsigned long long key = KNN_KEY_NONE;
        if (self_first < 0 || self_first + r != j) {
            int qi = first + r;
            const double *a = s.rows_of + (size_t)qi * p;
            double v = BICOR
                ? knn_pw_bicor(a, 1, s.row_order + (size_t)qi * p, 1,
                               s.row_present[qi], b, stride, ord_b, stride,
                               len_b, p, min_shared)
                : knn_pw_corr(a, 1, b, stride, p, centred, min_shared,
                              s.row_imax[qi], ib);
            if (!isnan(v))
                key = (unsigned long long)__double_as_longlong(
                    knn_pw_distance(v, absolute));
        }
        size_t row = mirror ? (size_t)first + r : (size_t)r;
        keys[row * n_ref + j] = key;
        if (mirror) keys[(size_t)j * n_ref + row] = key;
    }
}

/* The GPU of the search, the first of req->devices, else the first usable
 * one, and its name in the report. */
static knn_status knn_pw_device(const knn_pw_gpu_request *req, int *device,
                                knn_report *rep)
{
    try {
        std::vector<int> ids;
        KNN_TRY(knn_usable_devices(req->devices,
                                   req->n_devices > 0 ? 1 : 0, ids, rep));
        ids.resize(1);
        knn_device_names(ids, rep);
        *device = ids[0];
        return KNN_OK;
    } catch (const std::bad_alloc &) {
        snprintf(rep->message, sizeof rep->message,
                 "out of host memory in the GPU backend");
        return KNN_E_NOMEM;
    }
}

/* Frees what gpu holds once its stream is idle: the pinned buffer and
 * the stream may still be in the middle of a block. */
static void knn_pw_free(knn_pw_gpu *gpu, knn_status status)
{
    cudaSetDevice(gpu->device);
    if (gpu->ctx) cudaStreamSynchronize(gpu->ctx->stream);
    if (gpu->done) cudaEventDestroy(gpu->done);
    knn_device_free(gpu->block);
    cudaGetLastError();
    knn_context_release(gpu->ctx, status);
    free(gpu);
}

/* The key kernel of a search. */
template <bool SHARED, bool BICOR>
static void knn_pw_launch(dim3 blocks, dim3 threads, size_t bytes,
                          cudaStream_t stream, const knn_pw_sides &sides,
                          int first, int n, int self_first,
                          const knn_pw_gpu *gpu)
{
    knn_pw_keys<SHARED, BICOR><<<blocks, threads, bytes, stream>>>(
        sides, first, n, self_first, gpu->whole, gpu->n_ref, gpu->p,
        gpu->centred, gpu->absolute, gpu->min_shared, gpu->keys);
}

/* Where the key kernel keeps its reference tile: shared memory where the
 * tile (values, and orders for bicor) fits the device's largest block
 * share, else global memory. */
static knn_status knn_pw_tile_place(knn_pw_gpu *gpu, char *message)
{
    int most = 0;
    KNN_CUDA_TRY(message,
                 cudaDeviceGetAttribute(
                     &most, cudaDevAttrMaxSharedMemoryPerBlockOptin,
                     gpu->device));
    double bytes = (gpu->bicor ? 12.0 : 8.0) * KNN_PW_COLS * gpu->p;
    gpu->shared_bytes = bytes <= most ? (int)bytes : 0;
    if (gpu->shared_bytes > 0)
        KNN_CUDA_TRY(message,
                     cudaFuncSetAttribute(
                         gpu->bicor ? knn_pw_keys<true, true>
                                    : knn_pw_keys<true, false>,
                         cudaFuncAttributeMaxDynamicSharedMemorySize,
                         most));
    return KNN_OK;
}

/* What a side's nodes carry beside their values, to the device: imax,
 * or bicor's orders and counts of present features. */
static knn_status knn_pw_node_side(int bicor, const double *imax,
                                   const int *order, const int *present,
                                   int p, int n, double *d_imax,
                                   int *d_order, int *d_present,
                                   cudaStream_t stream, char *message)
{
    if (!bicor) {
        KNN_CUDA_TRY(message, cudaMemcpyAsync(d_imax, imax,
                                              (size_t)n * sizeof(double),
                                              cudaMemcpyHostToDevice,
                                              stream));
        return KNN_OK;
    }
    KNN_CUDA_TRY(message, cudaMemcpyAsync(d_order, order,
                                          (size_t)p * n * sizeof(int),
                                          cudaMemcpyHostToDevice, stream));
    KNN_CUDA_TRY(message, cudaMemcpyAsync(d_present, present,
                                          (size_t)n * sizeof(int),
                                          cudaMemcpyHostToDevice, stream));
    return KNN_OK;
}

/* The arrays, the values' upload and the host buffer of an opened gpu;
 * on failure the caller frees it (knn_pw_free). */
static knn_status knn_pw_setup(knn_pw_gpu *gpu, const knn_pw_gpu_request *req,
                               char *message)
{
    KNN_TRY(knn_context_acquire(gpu->device, &gpu->ctx, message));
    cudaStream_t stream = gpu->ctx->stream;
    KNN_CUDA_TRY(message, cudaEventCreateWithFlags(&gpu->done,
                                                   cudaEventDisableTiming));
    KNN_TRY(knn_pw_tile_place(gpu, message));
    int p = req->p, n_ref = req->n_ref, k = req->k;
    int n_query = req->query ? req->n_query : 0;
    double budget = 0.0;
    KNN_TRY(knn_device_budget(req->memory_bytes, &budget, message));
    /* A self search whose keys fit KNN_PW_WHOLE_BYTES and the budget
     * keeps them all on the device and keys each pair once (knn_pw_keys'
     * mirror), a block of rows at a time. Else a chunk's panel stays
     * within KNN_PW_PANEL_BYTES. Either way a chunk's rows stay within the
     * key kernel's 65535 blocks of rows. */
    gpu->whole = n_query == 0 &&
                 8.0 * n_ref * n_ref <= KNN_PW_WHOLE_BYTES &&
                 knn_pw_chunk_rows(budget, p, req->bicor, n_ref, 0, k,
                                   n_ref) == n_ref;
    double chunk_rows = fmin(gpu->whole ? req->block_rows
                                        : KNN_PW_PANEL_BYTES / (8.0 * n_ref),
                             65535.0 * KNN_PW_ROWS * KNN_PW_ROW_STEPS);
    int block_rows = req->block_rows;
    if (block_rows > chunk_rows) block_rows = chunk_rows < 1 ? 1
                                                              : (int)chunk_rows;
    gpu->chunk = gpu->whole ? block_rows
                            : knn_pw_chunk_rows(budget, p, req->bicor, n_ref,
                                                n_query, k, block_rows);
    if (gpu->chunk < 1) {
        knn_pw_no_fit(message, 512, budget > 0 ? budget : 0.0, p, req->bicor,
                      n_ref, n_query, k);
        return KNN_E_NOMEM;
    }
    size_t values = (size_t)p * n_ref, picks = (size_t)gpu->chunk * k;
    size_t orders = req->bicor ? values : 0;
    size_t query_orders = req->bicor ? (size_t)p * n_query : 0;
    knn_carver carve = {NULL, 0};
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1) {
            KNN_CUDA_TRY(message,
                         knn_device_alloc(&gpu->block, carve.used, stream));
            carve.block = (char *)gpu->block;
            carve.used = 0;
        }
        gpu->ref = knn_carve<double>(&carve, values);
        gpu->ref_t = knn_carve<double>(&carve, values);
        gpu->ref_imax = knn_carve<double>(&carve, n_ref);
        gpu->ref_order = knn_carve<int>(&carve, orders);
        gpu->ref_order_t = knn_carve<int>(&carve, orders);
        gpu->ref_present = knn_carve<int>(&carve, req->bicor ? n_ref : 0);
        gpu->query = knn_carve<double>(&carve, (size_t)p * n_query);
        gpu->query_imax = knn_carve<double>(&carve, n_query);
        gpu->query_order = knn_carve<int>(&carve, query_orders);
        gpu->query_present = knn_carve<int>(&carve,
                                            req->bicor ? n_query : 0);
        gpu->keys = knn_carve<unsigned long long>(
            &carve, (size_t)(gpu->whole ? n_ref : gpu->chunk) * n_ref);
        gpu->pick_key = knn_carve<unsigned long long>(&carve, picks);
        gpu->pick_j = knn_carve<int>(&carve, picks);
        gpu->best_j = knn_carve<int>(&carve, picks);
        gpu->best_d = knn_carve<double>(&carve, picks);
    }
    if (n_query == 0) gpu->query = NULL;
    /* From the engine's pageable memory, which outlives the search: each
     * call returns once its values are staged. */
    KNN_CUDA_TRY(message, cudaMemcpyAsync(gpu->ref, req->ref,
                                          values * sizeof(double),
                                          cudaMemcpyHostToDevice, stream));
    KNN_TRY(knn_pw_node_side(req->bicor, req->ref_imax, req->ref_order,
                             req->ref_present, p, n_ref, gpu->ref_imax,
                             gpu->ref_order, gpu->ref_present, stream,
                             message));
    if (gpu->query) {
        KNN_CUDA_TRY(message,
                     cudaMemcpyAsync(gpu->query, req->query,
                                     (size_t)p * n_query * sizeof(double),
                                     cudaMemcpyHostToDevice, stream));
        KNN_TRY(knn_pw_node_side(req->bicor, req->query_imax,
                                 req->query_order, req->query_present, p,
                                 n_query, gpu->query_imax, gpu->query_order,
                                 gpu->query_present, stream, message));
    }
    unsigned grid = (unsigned)((values + 255) / 256);
    knn_pw_transpose<<<grid, 256, 0, stream>>>(gpu->ref, p, n_ref,
                                               gpu->ref_t);
    KNN_LAUNCH_TRY(message, "knn_pw_transpose");
    if (req->bicor) {
        knn_pw_transpose<<<grid, 256, 0, stream>>>(gpu->ref_order, p, n_ref,
                                                   gpu->ref_order_t);
        KNN_LAUNCH_TRY(message, "knn_pw_transpose");
    }
    size_t cells = (size_t)req->block_rows * k;
    void *host = NULL;
    KNN_TRY(knn_context_host(gpu->ctx,
                             cells * (sizeof(int) + sizeof(double)), &host,
                             message));
    gpu->host.distance = (double *)host;
    gpu->host.index = (int *)(gpu->host.distance + cells);
    return KNN_OK;
}

extern "C" knn_status knn_gpu_pw_open(const knn_pw_gpu_request *req,
                                      knn_pw_gpu **out,
                                      knn_pw_gpu_rows *host,
                                      int *chunk_rows, knn_report *report)
{
    *out = NULL;
    if (knn_gpu_claim_process(report->message, sizeof report->message) !=
        KNN_OK)
        return KNN_E_NOGPU;
    int device = 0;
    KNN_TRY(knn_pw_device(req, &device, report));
    cudaError_t e = cudaSetDevice(device);
    if (e != cudaSuccess)
        return knn_gpu_fail_cuda(report->message, e, "cudaSetDevice",
                                 __FILE__, __LINE__);
    knn_pw_gpu *gpu = (knn_pw_gpu *)calloc(1, sizeof *gpu);
    if (gpu == NULL)
        return knn_gpu_fail(report->message, KNN_E_NOMEM, "GPU keys",
                            "out of host memory", __FILE__, __LINE__);
    gpu->device = device;
    gpu->p = req->p;
    gpu->k = req->k;
    gpu->n_ref = req->n_ref;
    gpu->bicor = req->bicor;
    gpu->centred = req->centred;
    gpu->absolute = req->absolute;
    gpu->min_shared = req->min_shared;
    knn_status st = knn_pw_setup(gpu, req, report->message);
    if (st != KNN_OK) {
        knn_pw_free(gpu, st);
        return st;
    }
    *host = gpu->host;
    *chunk_rows = gpu->chunk;
    *out = gpu;
    return KNN_OK;
}

/* Queues the keys and the choice of rows [first, first + n) into chunk
 * panel rows, and their transfer to the host buffer at row `at`. */
static knn_status knn_pw_chunk(knn_pw_gpu *gpu, int first, int n, int at,
                               char *message)
{
    cudaStream_t stream = gpu->ctx->stream;
    int self = gpu->query == NULL;
    knn_pw_sides sides;
    sides.rows_of = self ? gpu->ref : gpu->query;
    sides.row_imax = self ? gpu->ref_imax : gpu->query_imax;
    sides.row_order = self ? gpu->ref_order : gpu->query_order;
    sides.row_present = self ? gpu->ref_present : gpu->query_present;
    sides.ref_t = gpu->ref_t;
    sides.ref_imax = gpu->ref_imax;
    sides.ref_order_t = gpu->ref_order_t;
    sides.ref_present = gpu->ref_present;
    int self_first = self ? first : -1;
    int per_block = KNN_PW_ROWS * KNN_PW_ROW_STEPS;
    dim3 threads(KNN_PW_COLS, KNN_PW_ROWS);
    dim3 blocks((gpu->n_ref + KNN_PW_COLS - 1) / KNN_PW_COLS,
                (n + per_block - 1) / per_block);
    size_t bytes = gpu->shared_bytes;
    if (bytes > 0 && gpu->bicor)
        knn_pw_launch<true, true>(blocks, threads, bytes, stream, sides,
                                  first, n, self_first, gpu);
    else if (bytes > 0)
        knn_pw_launch<true, false>(blocks, threads, bytes, stream, sides,
                                   first, n, self_first, gpu);
    else if (gpu->bicor)
        knn_pw_launch<false, true>(blocks, threads, 0, stream, sides, first,
                                   n, self_first, gpu);
    else
        knn_pw_launch<false, false>(blocks, threads, 0, stream, sides,
                                    first, n, self_first, gpu);
    KNN_LAUNCH_TRY(message, "knn_pw_keys");
    const unsigned long long *keys =
        gpu->whole ? gpu->keys + (size_t)first * gpu->n_ref : gpu->keys;
    KNN_TRY(knn_select_keys(keys, n, gpu->n_ref, gpu->k, gpu->pick_key,
                            gpu->pick_j, gpu->best_j, gpu->best_d, message,
                            stream));
    size_t cells = (size_t)n * gpu->k, from = (size_t)at * gpu->k;
    KNN_CUDA_TRY(message,
                 cudaMemcpyAsync(gpu->host.index + from, gpu->best_j,
                                 cells * sizeof(int), cudaMemcpyDeviceToHost,
                                 stream));
    KNN_CUDA_TRY(message,
                 cudaMemcpyAsync(gpu->host.distance + from,
                                 gpu->best_d, cells * sizeof(double),
                                 cudaMemcpyDeviceToHost, stream));
    return KNN_OK;
}

extern "C" knn_status knn_gpu_pw_start(knn_pw_gpu *gpu, int first, int rows,
                                       char *message)
{
    /* A row kept whole takes its keys with earlier nodes from the
     * mirrored writes of the rows before it: those rows must have been
     * asked for first. */
    if (gpu->whole && first != gpu->next_row)
        return knn_gpu_fail(message, KNN_E_INVALID, "GPU keys",
                            "rows asked for out of order", __FILE__,
                            __LINE__);
    KNN_CUDA_TRY(message, cudaSetDevice(gpu->device));
    for (int at = 0; at < rows; at += gpu->chunk) {
        int n = rows - at < gpu->chunk ? rows - at : gpu->chunk;
        KNN_TRY(knn_pw_chunk(gpu, first + at, n, at, message));
    }
    gpu->next_row = first + rows;
    KNN_CUDA_TRY(message, cudaEventRecord(gpu->done, gpu->ctx->stream));
    return KNN_OK;
}

extern "C" knn_status knn_gpu_pw_wait(knn_pw_gpu *gpu, int ms, int *done,
                                      char *message)
{
    *done = 0;
    KNN_CUDA_TRY(message, cudaSetDevice(gpu->device));
    auto until = std::chrono::steady_clock::now() +
                 std::chrono::milliseconds(ms);
    for (;;) {
        cudaError_t e = cudaEventQuery(gpu->done);
        if (e == cudaSuccess) {
            *done = 1;
            return KNN_OK;
        }
        if (e != cudaErrorNotReady)
            return knn_gpu_fail_cuda(message, e, "keys (cudaEventQuery)",
                                     __FILE__, __LINE__);
        if (std::chrono::steady_clock::now() >= until) {
            cudaGetLastError();
            return KNN_OK;
        }
        std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
}

extern "C" void knn_gpu_pw_close(knn_pw_gpu *gpu, knn_status status)
{
    if (gpu) knn_pw_free(gpu, status);
}
