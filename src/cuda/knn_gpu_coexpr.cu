/*
 * knn_gpu_coexpr.cu: the float32 products of a pairwise-complete search's
 * screen (knn_gpu_pw_*, knn_backend.h). The engine (knn_coexpr.c) does the
 * rest on the CPU: its filter and exact float64 keys are the CPU search's
 * own, so the bits are the CPU's whatever computed the products.
 *
 * The nodes' float32 values go to the device once. Each block of rows the
 * engine asks for runs in chunks (knn_pw_chunk_rows, the engine's tiling,
 * from the memory budget): per chunk one GEMM into a device panel, then
 * the panel's transfer into the engine's pinned host buffer, all queued
 * on the context's stream, whose order keeps the one panel from being
 * overwritten before it has left. The call returns at once, so the device
 * computes the next block while the CPU screens this one; the engine
 * waits in slices of at most 100 ms (knn_gpu_pw_wait) and polls Ctrl-C
 * between them.
 *
 * Products, all column-major as cuBLAS reads them: the reference is A,
 * p x n_ref (lda = p, a node's p values contiguous); a chunk's rows are B,
 * p x rows (ldb = p), the query's nodes or, in a self search, the
 * reference's own from position `first`; C = t(A) B is n_ref x rows
 * (ldc = n_ref), so row i's n_ref products lie at i * n_ref, the layout
 * the engine's tiles read.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <chrono>
#include <new>
#include <thread>
#include "knn_coexpr.h"
#include <vector>
#include "knn_gpu.cuh"

struct knn_pw_gpu {
    int device;
    knn_gpu_context *ctx;
    int p, n_ref, chunk;
    void *block;             /* the one device allocation of: */
    float *ref;              /* p x n_ref */
    float *query;            /* p x n_query; NULL: the rows are
                                reference positions */
    float *panel;            /* n_ref x chunk */
    float *host[2];          /* the context's pinned memory */
    cudaEvent_t done;        /* recorded after a block's last transfer */
};

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

/* Frees what gpu holds once its stream is idle: the pinned buffers and
 * the stream may still be in the middle of a block. */
static void knn_pw_free(knn_pw_gpu *gpu, knn_status status)
{
    cudaSetDevice(gpu->device);
    if (gpu->ctx) cudaStreamSynchronize(gpu->ctx->stream);
    if (gpu->done) cudaEventDestroy(gpu->done);
    if (gpu->block) cudaFree(gpu->block);
    cudaGetLastError();
    knn_context_release(gpu->ctx, status);
    free(gpu);
}

/* The arrays, the values' upload and the host buffers of an opened gpu;
 * on failure the caller frees it (knn_pw_free). */
static knn_status knn_pw_setup(knn_pw_gpu *gpu, const knn_pw_gpu_request *req,
                               char *message)
{
    KNN_TRY(knn_context_acquire(gpu->device, &gpu->ctx, message));
    cudaStream_t stream = gpu->ctx->stream;
    /* The products must be true float32 (inputs rounded to 24 bits, sums
     * rounded to float32): the screen's bounds (knn_coexpr.c, cs->ec =
     * gamma_(p+16) in 2^-24) hold for such a product in any summation
     * order, and not for TF32's inputs, rounded 2^13 times as coarsely,
     * which would drop true neighbours unseen. The
     * pedantic compute type of the GEMM below forbids TF32, BF16 emulation
     * and any other reduced arithmetic whatever the handle's math mode or
     * NVIDIA_TF32_OVERRIDE and CUBLAS_EMULATION_STRATEGY say; the
     * handle's mode says the same for any call that reads it. */
    KNN_BLAS_TRY(message,
                 cublasSetMathMode(gpu->ctx->blas, CUBLAS_PEDANTIC_MATH));
    KNN_CUDA_TRY(message, cudaEventCreateWithFlags(&gpu->done,
                                                   cudaEventDisableTiming));
    int n_query = req->query ? req->n_query : 0;
    double budget = 0.0;
    KNN_TRY(knn_device_budget(req->memory_bytes, &budget, message));
    gpu->chunk = knn_pw_chunk_rows(budget, req->p, req->n_ref, n_query,
                                   req->block_rows);
    if (gpu->chunk < 1) {
        knn_pw_no_fit(message, 512, budget > 0 ? budget : 0.0, req->p,
                      req->n_ref, n_query);
        return KNN_E_NOMEM;
    }
    knn_carver carve = {NULL, 0};
    knn_carve<float>(&carve, (size_t)req->p * req->n_ref);
    knn_carve<float>(&carve, (size_t)req->p * n_query);
    knn_carve<float>(&carve, (size_t)req->n_ref * gpu->chunk);
    KNN_CUDA_TRY(message, cudaMalloc(&gpu->block, carve.used));
    carve.block = (char *)gpu->block;
    carve.used = 0;
    gpu->ref = knn_carve<float>(&carve, (size_t)req->p * req->n_ref);
    gpu->query = knn_carve<float>(&carve, (size_t)req->p * n_query);
    gpu->panel = knn_carve<float>(&carve, (size_t)req->n_ref * gpu->chunk);
    if (n_query == 0) gpu->query = NULL;
    /* From the engine's pageable memory, which outlives the search: each
     * call returns once its values are staged. */
    KNN_CUDA_TRY(message,
                 cudaMemcpyAsync(gpu->ref, req->ref,
                                 (size_t)req->p * req->n_ref * sizeof(float),
                                 cudaMemcpyHostToDevice, stream));
    if (gpu->query)
        KNN_CUDA_TRY(message,
                     cudaMemcpyAsync(gpu->query, req->query,
                                     (size_t)req->p * n_query *
                                         sizeof(float),
                                     cudaMemcpyHostToDevice, stream));
    size_t cells = (size_t)req->block_rows * req->n_ref;
    void *host = NULL;
    KNN_TRY(knn_context_host(gpu->ctx, 2 * cells * sizeof(float), &host,
                             message));
    gpu->host[0] = (float *)host;
    gpu->host[1] = (float *)host + cells;
    return KNN_OK;
}

extern "C" knn_status knn_gpu_pw_open(const knn_pw_gpu_request *req,
                                      knn_pw_gpu **out, float *host[2],
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
        return knn_gpu_fail(report->message, KNN_E_NOMEM, "GPU products",
                            "out of host memory", __FILE__, __LINE__);
    gpu->device = device;
    gpu->p = req->p;
    gpu->n_ref = req->n_ref;
    knn_status st = knn_pw_setup(gpu, req, report->message);
    if (st != KNN_OK) {
        knn_pw_free(gpu, st);
        return st;
    }
    host[0] = gpu->host[0];
    host[1] = gpu->host[1];
    *chunk_rows = gpu->chunk;
    *out = gpu;
    return KNN_OK;
}

extern "C" knn_status knn_gpu_pw_start(knn_pw_gpu *gpu, int first, int rows,
                                       int buffer, char *message)
{
    KNN_CUDA_TRY(message, cudaSetDevice(gpu->device));
    cudaStream_t stream = gpu->ctx->stream;
    const float one = 1.0f, zero = 0.0f;
    const float *rows_of = gpu->query ? gpu->query : gpu->ref;
    for (int at = 0; at < rows; at += gpu->chunk) {
        int n = rows - at < gpu->chunk ? rows - at : gpu->chunk;
        KNN_BLAS_TRY(message,
                     cublasGemmEx(gpu->ctx->blas, CUBLAS_OP_T, CUBLAS_OP_N,
                                  gpu->n_ref, n, gpu->p, &one, gpu->ref,
                                  CUDA_R_32F, gpu->p,
                                  rows_of + (size_t)(first + at) * gpu->p,
                                  CUDA_R_32F, gpu->p, &zero, gpu->panel,
                                  CUDA_R_32F, gpu->n_ref,
                                  CUBLAS_COMPUTE_32F_PEDANTIC,
                                  CUBLAS_GEMM_DEFAULT));
        KNN_CUDA_TRY(message,
                     cudaMemcpyAsync(gpu->host[buffer] +
                                         (size_t)at * gpu->n_ref,
                                     gpu->panel,
                                     (size_t)n * gpu->n_ref * sizeof(float),
                                     cudaMemcpyDeviceToHost, stream));
    }
    KNN_CUDA_TRY(message, cudaEventRecord(gpu->done, stream));
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
            return knn_gpu_fail_cuda(message, e,
                                     "products (cudaEventQuery)", __FILE__,
                                     __LINE__);
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
