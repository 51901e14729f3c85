/*
 * knn_gpu_context.cu: what a device keeps from one search to the next, and
 * the upload of the float64 input through it.
 *
 * A search of a few milliseconds would otherwise spend a good share of them
 * creating and destroying its stream and cuBLAS handle and pinning host
 * memory for its upload (tools/cuda-call-costs.cu measures each). So each
 * device keeps one context: a stream, a cuBLAS handle, a pinned staging
 * ring and pinned result slots, made by the first search that succeeds
 * on it and freed when the package is unloaded (knn_gpu_release). Device
 * memory after a failed or interrupted search is still what it was before:
 * a context made by such a search is destroyed with it, and one that
 * existed before is kept (unless the device faulted).
 *
 * The upload: R's memory is pageable, which the driver copies through its
 * own staging on one thread. Up to 8 OpenMP threads instead copy 1 MB
 * parts into the ring's pinned slots and queue each slot's transfer as
 * soon as it is filled, two to three times as fast
 * (tools/upload-costs.cu), checking on the way that every value is finite.
 * Part i uses slot i % KNN_STAGE_SLOTS and is filled
 * by thread i % workers; workers divides the slot count, so a slot is
 * always refilled by the thread that filled it last, which waits for the
 * slot's event (its previous transfer) first.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <mutex>
#include "knn_gpu.cuh"
#ifdef _OPENMP
#include <omp.h>
#endif

#define KNN_STAGE_PART ((size_t)1 << 17) /* doubles: 1 MB per slot */
#define KNN_UPLOAD_WORKERS_MAX 8         /* divides KNN_STAGE_SLOTS */

/* The kept context of each device, and whether a search holds it (or is
 * making the one it may keep). */
static std::mutex knn_context_lock;
static knn_gpu_context *knn_kept[KNN_MAX_DEVICES];
static bool knn_kept_busy[KNN_MAX_DEVICES];

static void knn_context_destroy(knn_gpu_context *c)
{
    cudaSetDevice(c->device);
    if (c->stream) cudaStreamSynchronize(c->stream);
    if (c->copy_stream) cudaStreamSynchronize(c->copy_stream);
    for (int s = 0; s < KNN_STAGE_SLOTS; s++)
        if (c->stage_free[s]) cudaEventDestroy(c->stage_free[s]);
    if (c->stage) cudaFreeHost(c->stage);
    if (c->host) cudaFreeHost(c->host);
    if (c->blas) cublasDestroy(c->blas);
    if (c->stream) cudaStreamDestroy(c->stream);
    if (c->copy_stream) cudaStreamDestroy(c->copy_stream);
    cudaGetLastError();
    free(c);
}

static knn_status knn_context_open(knn_gpu_context *c, char *message)
{
    KNN_CUDA_TRY(message,
                 cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
    KNN_CUDA_TRY(message, cudaStreamCreateWithFlags(&c->copy_stream,
                                                    cudaStreamNonBlocking));
    KNN_BLAS_TRY(message, cublasCreate(&c->blas));
    KNN_BLAS_TRY(message, cublasSetStream(c->blas, c->stream));
    return KNN_OK;
}

knn_status knn_context_acquire(int device, knn_gpu_context **ctx,
                               char *message)
{
    *ctx = NULL;
    bool keepable;
    {
        std::lock_guard<std::mutex> g(knn_context_lock);
        if (knn_kept[device] != NULL && !knn_kept_busy[device]) {
            knn_kept_busy[device] = true;
            *ctx = knn_kept[device];
            return KNN_OK;
        }
        /* Busy: the same device runs a second row block (C tests), which
         * gets a context of its own for this search only. */
        keepable = !knn_kept_busy[device];
        if (keepable) knn_kept_busy[device] = true;
    }
    knn_gpu_context *c = (knn_gpu_context *)calloc(1, sizeof *c);
    knn_status st = c == NULL
        ? knn_gpu_fail(message, KNN_E_NOMEM, "GPU context",
                       "out of host memory", __FILE__, __LINE__)
        : KNN_OK;
    if (st == KNN_OK) {
        c->device = device;
        c->keepable = keepable;
        c->fresh = 1;
        st = knn_context_open(c, message);
    }
    if (st == KNN_OK) {
        *ctx = c;
        return KNN_OK;
    }
    if (c != NULL) knn_context_destroy(c);
    if (keepable) {
        std::lock_guard<std::mutex> g(knn_context_lock);
        knn_kept_busy[device] = false;
    }
    return st;
}

void knn_context_release(knn_gpu_context *c, knn_status status)
{
    if (c == NULL) return;
    bool keep = c->keepable &&
        (c->fresh ? status == KNN_OK : status != KNN_E_DEVICE);
    if (c->keepable) {
        std::lock_guard<std::mutex> g(knn_context_lock);
        knn_kept[c->device] = keep ? c : NULL;
        knn_kept_busy[c->device] = false;
    }
    c->fresh = 0;
    if (!keep) knn_context_destroy(c);
}

extern "C" void knn_gpu_release(void)
{
    /* A forked child inherits the pointers but must not touch CUDA. */
    if (!knn_gpu_owns_process()) return;
    std::lock_guard<std::mutex> g(knn_context_lock);
    for (int d = 0; d < KNN_MAX_DEVICES; d++) {
        if (knn_kept[d] == NULL || knn_kept_busy[d]) continue;
        knn_context_destroy(knn_kept[d]);
        knn_kept[d] = NULL;
    }
}

knn_status knn_context_host(knn_gpu_context *c, size_t bytes, void **block,
                            char *message)
{
    if (c->host_bytes < bytes) {
        if (c->host) cudaFreeHost(c->host);
        c->host = NULL;
        c->host_bytes = 0;
        KNN_CUDA_TRY(message, cudaHostAlloc(&c->host, bytes,
                                            cudaHostAllocPortable));
        c->host_bytes = bytes;
    }
    *block = c->host;
    return KNN_OK;
}

/* ---- upload ----------------------------------------------------------- */

typedef struct {
    knn_gpu_context *ctx;
    const knn_upload_part *parts;
    int n_parts;
    size_t n_chunks;
    int workers;
    const std::atomic<int> *stop;
    cudaError_t error[KNN_UPLOAD_WORKERS_MAX];
    int nonfinite[KNN_UPLOAD_WORKERS_MAX];
} knn_upload_job;

static size_t knn_chunks_of(size_t n)
{
    return (n + KNN_STAGE_PART - 1) / KNN_STAGE_PART;
}

/* Chunk i of the job: its part and its first element there. */
static const knn_upload_part *knn_chunk_at(const knn_upload_job *job,
                                           size_t i, size_t *offset)
{
    int p = 0;
    while (i >= knn_chunks_of(job->parts[p].n)) {
        i -= knn_chunks_of(job->parts[p].n);
        p++;
    }
    *offset = i * KNN_STAGE_PART;
    return &job->parts[p];
}

/* Copies n doubles and says whether all of them are finite: the check
 * rides on the copy's one read of the source (as fast as memcpy on the
 * hosts tried), so R need not read the input once more beforehand. */
static bool knn_copy_finite(double *__restrict__ dst,
                            const double *__restrict__ src, size_t n)
{
    const uint64_t exponent = 0x7ff0000000000000ull;
    uint64_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        double v = src[i];
        uint64_t bits;
        memcpy(&bits, &v, sizeof bits);
        dst[i] = v;
        bad |= (bits & exponent) == exponent;
    }
    return bad == 0;
}

static void knn_upload_worker(knn_upload_job *job, int w)
{
    knn_gpu_context *c = job->ctx;
    int current = -1;
    cudaError_t e = cudaGetDevice(&current);
    if (e == cudaSuccess && current != c->device) e = cudaSetDevice(c->device);
    for (size_t i = w; e == cudaSuccess && i < job->n_chunks;
         i += job->workers) {
        if (*job->stop) break;
        size_t off;
        const knn_upload_part *part = knn_chunk_at(job, i, &off);
        size_t len = part->n - off < KNN_STAGE_PART ? part->n - off
                                                    : KNN_STAGE_PART;
        int slot = (int)(i % KNN_STAGE_SLOTS);
        double *stage = c->stage + (size_t)slot * KNN_STAGE_PART;
        e = cudaEventSynchronize(c->stage_free[slot]);
        if (e != cudaSuccess) break;
        if (!knn_copy_finite(stage, part->src + off, len))
            job->nonfinite[w] = 1;
        e = cudaMemcpyAsync(part->dst + off, stage, len * sizeof(double),
                            cudaMemcpyHostToDevice, c->stream);
        if (e == cudaSuccess)
            e = cudaEventRecord(c->stage_free[slot], c->stream);
    }
    job->error[w] = e;
}

static knn_status knn_stage_alloc(knn_gpu_context *c, char *message)
{
    if (c->stage != NULL) return KNN_OK;
    KNN_CUDA_TRY(message,
                 cudaHostAlloc((void **)&c->stage,
                               KNN_STAGE_SLOTS * KNN_STAGE_PART *
                                   sizeof(double),
                               cudaHostAllocPortable));
    for (int s = 0; s < KNN_STAGE_SLOTS; s++)
        KNN_CUDA_TRY(message, cudaEventCreateWithFlags(&c->stage_free[s],
                                                       cudaEventDisableTiming));
    return KNN_OK;
}

/* Upload threads: the largest power of two within the request's threads,
 * the chunks and KNN_UPLOAD_WORKERS_MAX. */
static int knn_upload_workers(int threads, size_t chunks)
{
    int w = 1;
    while (w * 2 <= KNN_UPLOAD_WORKERS_MAX && (size_t)w * 2 <= chunks &&
           w * 2 <= threads)
        w *= 2;
    return w;
}

knn_status knn_context_upload(knn_gpu_context *ctx,
                              const knn_upload_part *parts, int n_parts,
                              int threads, const std::atomic<int> *stop,
                              char *message)
{
    KNN_TRY(knn_stage_alloc(ctx, message));
    knn_upload_job job;
    memset((void *)&job, 0, sizeof job);
    job.ctx = ctx;
    job.parts = parts;
    job.n_parts = n_parts;
    for (int p = 0; p < n_parts; p++) job.n_chunks += knn_chunks_of(parts[p].n);
    job.stop = stop;
#ifdef _OPENMP
    /* OpenMP's threads, not threads of our own: right after R's input
     * checks its pool is still spinning, and other threads would compete
     * with it for the cores (4 times slower, tools/upload-costs.cu). A
     * smaller team than asked for runs the missing workers' shares in
     * turn, each on one thread, so a slot keeps its one filler. */
    job.workers = knn_upload_workers(threads, job.n_chunks);
    #pragma omp parallel num_threads(job.workers) if (job.workers > 1)
    {
        int team = omp_get_num_threads();
        for (int w = omp_get_thread_num(); w < job.workers; w += team)
            knn_upload_worker(&job, w);
    }
#else
    (void)threads;
    job.workers = 1;
    knn_upload_worker(&job, 0);
#endif
    for (int w = 0; w < job.workers; w++)
        if (job.error[w] != cudaSuccess)
            return knn_gpu_fail_cuda(message, job.error[w],
                                     "staged upload (cudaMemcpyAsync)",
                                     __FILE__, __LINE__);
    if (*stop) return KNN_E_INTERRUPTED;
    for (int w = 0; w < job.workers; w++)
        if (job.nonfinite[w])
            return knn_gpu_fail(message, KNN_E_NONFINITE, "upload",
                                "a value is NA, NaN or Inf", __FILE__,
                                __LINE__);
    return KNN_OK;
}
