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
 * Device memory: a search's arrays (its nodes, their prepared vectors, the
 * tiles' panel and slots) would each cost a cudaMalloc and a cudaFree,
 * which map and unmap their pages and synchronise the device: together
 * more than a small search's products. They come instead from a pool of
 * the device's own (CUDA's stream-ordered allocator), which keeps what a
 * successful search gives back, up to KNN_KEEP_BYTES_MAX and a
 * KNN_KEEP_FRACTION of the device, for the next search. A search that
 * fails or is interrupted gives all of it back to the device. Free memory
 * as searches and gpuInfo() count it includes what the pool keeps idle,
 * so that a search plans as if nothing were kept. An array larger than
 * the pool keeps (a large search's lists and tiles) comes from cudaMalloc
 * instead: the pool would give it back at the end all the same, and it
 * maps and unmaps such arrays several times slower than cudaMalloc and
 * cudaFree, the more so on several devices at once
 * (tools/alloc-costs.cu).
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
#include <vector>
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

/* ---- device memory kept between searches ------------------------------ */

#define KNN_KEEP_BYTES_MAX ((uint64_t)1 << 30)
#define KNN_KEEP_FRACTION 16

/* Each device's pool, made by the first search that allocates on it (or
 * shares it with another device) and destroyed with the package, and the
 * bytes it keeps. */
static std::mutex knn_pool_lock;
static cudaMemPool_t knn_pools[KNN_MAX_DEVICES];
static uint64_t knn_pool_keeps[KNN_MAX_DEVICES];

/* The arrays of knn_device_alloc that came from cudaMalloc. */
static std::mutex knn_large_lock;
static std::vector<void *> knn_large;

/* Runs f with `device` current, then makes the previous one current. */
template <typename F>
static cudaError_t knn_on_device(int device, F f)
{
    int current = -1;
    cudaGetDevice(&current);
    cudaError_t e = current == device ? cudaSuccess : cudaSetDevice(device);
    if (e == cudaSuccess) e = f();
    if (current >= 0 && current != device) cudaSetDevice(current);
    return e;
}

/* What the pool of a device of `total` bytes keeps after a search. */
static uint64_t knn_keep_bytes(size_t total)
{
    uint64_t share = (uint64_t)total / KNN_KEEP_FRACTION;
    return share < KNN_KEEP_BYTES_MAX ? share : KNN_KEEP_BYTES_MAX;
}

/* The pool of `device`, made where it has none yet, and (keep, where
 * not NULL) the bytes it keeps. */
static cudaError_t knn_pool_of(int device, cudaMemPool_t *pool,
                               uint64_t *keep_bytes = NULL)
{
    std::lock_guard<std::mutex> g(knn_pool_lock);
    if (knn_pools[device] != NULL) {
        *pool = knn_pools[device];
        if (keep_bytes) *keep_bytes = knn_pool_keeps[device];
        return cudaSuccess;
    }
    size_t free_b = 0, total_b = 0;
    cudaError_t e = knn_on_device(device, [&] {
        return cudaMemGetInfo(&free_b, &total_b);
    });
    cudaMemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device;
    cudaMemPool_t made = NULL;
    if (e == cudaSuccess) e = cudaMemPoolCreate(&made, &props);
    uint64_t keep = knn_keep_bytes(total_b);
    if (e == cudaSuccess)
        e = cudaMemPoolSetAttribute(made, cudaMemPoolAttrReleaseThreshold,
                                    &keep);
    if (e != cudaSuccess) {
        if (made) cudaMemPoolDestroy(made);
        return e;
    }
    *pool = knn_pools[device] = made;
    knn_pool_keeps[device] = keep;
    if (keep_bytes) *keep_bytes = keep;
    return cudaSuccess;
}

/* An array larger than the pool keeps, from cudaMalloc; a failure to
 * note it frees it again. */
static cudaError_t knn_large_alloc(void **ptr, size_t bytes)
{
    cudaError_t e = cudaMalloc(ptr, bytes);
    if (e != cudaSuccess) return e;
    try {
        std::lock_guard<std::mutex> g(knn_large_lock);
        knn_large.push_back(*ptr);
    } catch (...) {
        cudaFree(*ptr);
        *ptr = NULL;
        return cudaErrorMemoryAllocation;
    }
    return cudaSuccess;
}

/* Whether ptr came from knn_large_alloc; forgets it if so. */
static bool knn_large_forget(void *ptr)
{
    std::lock_guard<std::mutex> g(knn_large_lock);
    for (size_t i = 0; i < knn_large.size(); i++)
        if (knn_large[i] == ptr) {
            knn_large[i] = knn_large.back();
            knn_large.pop_back();
            return true;
        }
    return false;
}

/* The array from the pool, or from cudaMalloc where it is larger than
 * the pool keeps. */
static cudaError_t knn_device_take(void **ptr, size_t bytes,
                                   cudaMemPool_t pool, uint64_t keep,
                                   cudaStream_t stream)
{
    return bytes > keep ? knn_large_alloc(ptr, bytes)
                        : cudaMallocFromPoolAsync(ptr, bytes, pool, stream);
}

cudaError_t knn_device_alloc(void **ptr, size_t bytes, cudaStream_t stream)
{
    int device = -1;
    cudaMemPool_t pool = NULL;
    uint64_t keep = 0;
    cudaError_t e = cudaGetDevice(&device);
    if (e == cudaSuccess) e = knn_pool_of(device, &pool, &keep);
    if (e != cudaSuccess) return e;
    if (bytes == 0) bytes = 1;
    e = knn_device_take(ptr, bytes, pool, keep, stream);
    if (e == cudaErrorMemoryAllocation) {
        /* What the pool keeps may be in pieces too small, or take the
         * room: give it back to the device and try once more. */
        cudaGetLastError();
        cudaStreamSynchronize(stream);
        cudaMemPoolTrimTo(pool, 0);
        e = knn_device_take(ptr, bytes, pool, keep, stream);
    }
    /* Zeroed, as the device's fresh pages are: an array's contents never
     * depend on what an earlier search left in the pool. */
    if (e != cudaSuccess) return e;
    e = cudaMemsetAsync(*ptr, 0, bytes, stream);
    if (e != cudaSuccess) {
        cudaStreamSynchronize(stream);
        knn_device_free(*ptr);
        *ptr = NULL;
    }
    return e;
}

void knn_device_free(void *ptr)
{
    if (ptr == NULL) return;
    if (knn_large_forget(ptr)) {
        cudaFree(ptr);
        return;
    }
    cudaDeviceSynchronize();
    cudaFreeAsync(ptr, 0);
}

size_t knn_device_idle_bytes(int device)
{
    cudaMemPool_t pool = NULL;
    {
        std::lock_guard<std::mutex> g(knn_pool_lock);
        pool = knn_pools[device];
    }
    uint64_t reserved = 0, used = 0;
    if (pool == NULL ||
        cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent,
                                &reserved) != cudaSuccess ||
        cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent,
                                &used) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return reserved > used ? (size_t)(reserved - used) : 0;
}

knn_status knn_device_share(int owner, int reader, char *message)
{
    cudaMemPool_t pool = NULL;
    KNN_CUDA_TRY(message, knn_pool_of(owner, &pool));
    cudaMemAccessDesc access;
    memset(&access, 0, sizeof access);
    access.location.type = cudaMemLocationTypeDevice;
    access.location.id = reader;
    access.flags = cudaMemAccessFlagsProtReadWrite;
    KNN_CUDA_TRY(message, cudaMemPoolSetAccess(pool, &access, 1));
    return KNN_OK;
}

/* After a search on `device` has given its arrays back: a successful one
 * leaves the pool what it keeps, a failed one nothing. */
static void knn_device_settle(int device, knn_status status)
{
    cudaMemPool_t pool = NULL;
    {
        std::lock_guard<std::mutex> g(knn_pool_lock);
        pool = knn_pools[device];
    }
    if (pool == NULL) return;
    uint64_t keep = 0;
    if (status == KNN_OK)
        cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
    knn_on_device(device, [&] {
        cudaDeviceSynchronize();
        return cudaMemPoolTrimTo(pool, (size_t)keep);
    });
    cudaGetLastError();
}

/* Gives every pool's memory back (no search holds any). */
static void knn_pools_destroy(void)
{
    std::lock_guard<std::mutex> g(knn_pool_lock);
    for (int d = 0; d < KNN_MAX_DEVICES; d++) {
        if (knn_pools[d] == NULL) continue;
        knn_on_device(d, [&] {
            cudaDeviceSynchronize();
            cudaMemPoolTrimTo(knn_pools[d], 0);
            return cudaMemPoolDestroy(knn_pools[d]);
        });
        knn_pools[d] = NULL;
    }
    cudaGetLastError();
}

/* ---- the kept context ------------------------------------------------- */

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
    int device = c->device;
    if (!keep) knn_context_destroy(c);
    knn_device_settle(device, status);
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
    knn_pools_destroy();
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
