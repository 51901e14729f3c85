/*
 * knn_gpu_pages.cu: the caller's result arrays made resident while the
 * devices search.
 *
 * R allocates a large vector fresh from the kernel, so the first write to
 * each of its pages faults. A copy-out after the last tile would take
 * those faults with the device idle, a few percent of a large graph's
 * time (inst/bench/gpu_phases.R). A thread of its own
 * takes those faults during the search instead, through Linux's
 * MADV_POPULATE_WRITE (5.14 and newer: the faults without the writes, so
 * the contents stay as they are and it races with no copy). Elsewhere, or
 * on an older kernel, madvise refuses it and nothing changes. A graph's
 * sources and ranks (knn_result.from, .rank) follow from the position
 * alone, so the threads write them, faults and all, where knn_search()
 * would write them after the search.
 *
 * It waits until a device has finished a tile: faults hold the process's
 * address space for reading, and what maps memory meanwhile waits for
 * them: CUDA's allocations for the upload and the plan, and the loading
 * of a kernel's code at its first launch; started earlier, it would slow
 * the upload, the plan and a first search's kernels down. It goes in
 * small pieces for the same reason, for a search that changes its plan
 * midway.
 *
 * Several threads share the pieces where the host has the cores: one
 * alone may not finish a large graph's pages within the search, and then
 * the frees of device memory at the end (which unmap, so wait for the
 * faults) wait for it too.
 */
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>
#include <algorithm>
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

/* A graph's ends are written in pieces of this many edges. */
#define KNN_PAGES_ENDS_PIECE (KNN_PAGES_PIECE / sizeof(int))

/* Appends [p, p + bytes)'s whole pages to the job's pieces, in pieces of
 * at most KNN_PAGES_PIECE bytes. */
static void knn_pages_add(knn_pages *job, const void *p, size_t bytes)
{
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t a = ((uintptr_t)p + page - 1) & ~(page - 1);
    uintptr_t end = ((uintptr_t)p + bytes) & ~(page - 1);
    for (; a < end; a += KNN_PAGES_PIECE)
        job->pieces.emplace_back(
            (char *)a, std::min((size_t)(end - a), KNN_PAGES_PIECE));
}

/* Makes piece i resident, while madvise takes MADV_POPULATE_WRITE. */
static void knn_pages_touch(knn_pages *job, size_t i)
{
#ifdef MADV_POPULATE_WRITE
    if (job->populate &&
        madvise(job->pieces[i].first, job->pieces[i].second,
                MADV_POPULATE_WRITE) != 0)
        job->populate = 0;
#else
    (void)job;
    (void)i;
#endif
}

/* Writes piece i of the graph's ends. */
static void knn_pages_ends(knn_pages *job, size_t i)
{
    size_t a = i * KNN_PAGES_ENDS_PIECE;
    size_t b = std::min(a + KNN_PAGES_ENDS_PIECE, job->entries);
    knn_edge_ends_range(job->from, job->rank, a, b, job->k, job->base);
    job->ends_done++;
}

/* One thread's share: the pieces no other thread has taken, once a
 * device has finished a tile; the ends' pieces count after the others. */
static void knn_populate(knn_pages *job, knn_gpu_shared *shared)
{
    knn_meet_wait(shared, &shared->tile_done, 1, KNN_ENDS_ON_STOP, NULL);
    size_t n = job->pieces.size();
    for (size_t i = job->next++; i < n + job->end_pieces && !shared->stop;
         i = job->next++) {
        if (i < n) knn_pages_touch(job, i);
        else knn_pages_ends(job, i - n);
    }
}

/* Threads for the pieces: half the host's cores, at most
 * KNN_PAGES_THREADS_MAX, and one where there are two cores or fewer. */
static int knn_pages_threads(size_t pieces)
{
    int n = (int)std::thread::hardware_concurrency() / 2;
    n = std::min(n, KNN_PAGES_THREADS_MAX);
    if ((size_t)n > pieces) n = (int)pieces;
    return n < 1 ? 1 : n;
}

void knn_pages_start(knn_pages *job, const knn_result *out, size_t entries,
                     int k, knn_gpu_shared *shared)
{
    double bytes = (double)entries * (sizeof *out->index +
                                      sizeof *out->distance +
                                      sizeof *out->weight);
    if (bytes < KNN_PAGES_MIN_BYTES) return;
    try {
        knn_pages_add(job, out->index, entries * sizeof *out->index);
        knn_pages_add(job, out->distance, entries * sizeof *out->distance);
        knn_pages_add(job, out->weight, entries * sizeof *out->weight);
        if (out->from) {
            job->from = out->from;
            job->rank = out->rank;
            job->entries = entries;
            job->k = k;
            job->base = out->index_base;
            job->end_pieces = (entries + KNN_PAGES_ENDS_PIECE - 1) /
                              KNN_PAGES_ENDS_PIECE;
        }
        job->next = 0;
        int n = knn_pages_threads(job->pieces.size() + job->end_pieces);
        for (int i = 0; i < n; i++)
            job->thread[i] = std::thread(knn_populate, job, shared);
    } catch (...) {
        /* No thread, or fewer: the copy-out takes the faults the threads
         * leave, as without them, and knn_search() writes the ends where
         * they did not. */
    }
}

void knn_pages_join(knn_pages *job)
{
    for (std::thread &t : job->thread)
        if (t.joinable()) t.join();
}

int knn_pages_wrote_ends(const knn_pages *job)
{
    return job->end_pieces > 0 && job->ends_done == job->end_pieces;
}
