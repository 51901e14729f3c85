/*
 * knn_gpu_pages.cu: the caller's result arrays made resident while the
 * devices search.
 *
 * R allocates a large vector fresh from the kernel, so the first write to
 * each of its pages faults. A search's copy-out wrote them after the last
 * tile had run: for the 1M x 50 graph (k = 15, 300 MB of targets,
 * distances and weights) that was 40 to 75 ms of the search's 0.9 to
 * 1.0 s on the H200's host, with the device idle. A thread of its own
 * takes those faults during the search instead, through Linux's
 * MADV_POPULATE_WRITE (5.14 and newer: the faults without the writes, so
 * the contents stay as they are and it races with no copy). Elsewhere, or
 * on an older kernel, madvise refuses it and nothing changes. A graph's
 * sources and ranks (knn_result.from, .rank), which knn_search() writes
 * after the search, take their faults here too.
 *
 * It waits until a device has finished a tile: faults hold the process's
 * address space for reading, and what maps memory meanwhile waits for
 * them: CUDA's allocations for the upload and the plan, and the loading
 * of a kernel's code at its first launch. Started with the devices, it
 * took the 1M graph's prepare phase from 20 to 115 ms; started after the
 * plan, the first such search's search phase from 808 to 890 ms. It goes
 * in small pieces for the same reason, for a search that changes its plan
 * midway.
 */
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>
#include <algorithm>
#include <chrono>
#include "knn_gpu_tiles.cuh"

#if defined(__linux__) && !defined(MADV_POPULATE_WRITE)
#define MADV_POPULATE_WRITE 23 /* <linux/mman.h>, Linux 5.14 */
#endif

/* Results smaller than this keep their faults: a thread costs more. */
#define KNN_PAGES_MIN_BYTES (64.0 * 1048576.0)
/* Pages are populated in pieces of this many bytes, the stop flag read
 * between them, so that an interrupted search does not wait for the
 * whole result. */
#define KNN_PAGES_PIECE ((size_t)8 << 20)
#define KNN_PAGES_WAIT_MS 1

static void knn_populate(const void *p, size_t bytes,
                         const knn_gpu_shared *shared)
{
#ifdef MADV_POPULATE_WRITE
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t a = ((uintptr_t)p + page - 1) & ~(page - 1);
    uintptr_t end = ((uintptr_t)p + bytes) & ~(page - 1);
    while (a < end && !shared->stop) {
        size_t piece = std::min((size_t)(end - a), KNN_PAGES_PIECE);
        if (madvise((void *)a, piece, MADV_POPULATE_WRITE) != 0) return;
        a += piece;
    }
#else
    (void)p;
    (void)bytes;
    (void)shared;
#endif
}

static void knn_populate_result(const knn_result *out, size_t entries,
                                const knn_gpu_shared *shared)
{
    while (shared->rows_done == 0 && !shared->stop)
        std::this_thread::sleep_for(
            std::chrono::milliseconds(KNN_PAGES_WAIT_MS));
    knn_populate(out->index, entries * sizeof *out->index, shared);
    knn_populate(out->distance, entries * sizeof *out->distance, shared);
    knn_populate(out->weight, entries * sizeof *out->weight, shared);
    if (out->from) {
        knn_populate(out->from, entries * sizeof *out->from, shared);
        knn_populate(out->rank, entries * sizeof *out->rank, shared);
    }
}

void knn_pages_start(knn_pages *job, const knn_result *out, size_t entries,
                     const knn_gpu_shared *shared)
{
    double bytes = (double)entries * (sizeof *out->index +
                                      sizeof *out->distance +
                                      sizeof *out->weight);
    if (bytes < KNN_PAGES_MIN_BYTES) return;
    try {
        job->thread = std::thread(knn_populate_result, out, entries, shared);
    } catch (...) {
        /* No thread: the copy-out takes the faults, as without one. */
    }
}

void knn_pages_join(knn_pages *job)
{
    if (job->thread.joinable()) job->thread.join();
}
